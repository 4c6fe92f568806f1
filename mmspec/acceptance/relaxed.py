"""Relaxed rules: acceptance never below the exact rule's, a declared bound on how far the
emitted tokens move from the target (chains and draft trees; proofs in ``Relaxed``)."""

from __future__ import annotations

import torch

from ..sampling import residual as _residual
from .base import Rule
from .tree import exact_tree


class Relaxed(Rule):
    """A rule whose acceptance never falls below the exact rule's, per token:
    a(x) >= min(1, p(x) / q(x)).

    For every such rule the residual that minimises the total variation of the emitted token
    from p is the exact one, norm(max(0, p - q)), and then, exactly,

        TV(o, p) = sum_y (q(y) a(y) - p(y))^+  <=  TV(p, q)

    (o is the emitted token's distribution). Proof: o(y) >= q(y) a(y) for any residual, so
    TV(o, p) = sum_y (o(y) - p(y))^+ >= sum_y (q(y) a(y) - p(y))^+; with the exact residual
    the rejected mass only fills the deficits p(y) - q(y) a(y) > 0, which meets that bound.
    Each subclass states a bound on this quantity in terms of its parameter (``tv_bound``).

    Trees (``verify_tree``): at a node with target p the children c_1..c_m are tried in turn
    against the running target r_j (r_1 = p, r_{j+1} = norm(max(0, r_j - q_j))), accepting
    with the rule's a_j = a(x_j; r_j, q_j), so that E_j = sum_y (q_j(y) a_j(y) - r_j(y))^+ is
    the chain quantity above for round j. Then TV(o, p) <= E_1 + E_2 + ... + E_m for the
    token emitted at the node. Proof by induction on m (m = 0: o = p). Let e = q_1 a_1 -
    min(q_1, p) >= 0 (as a_1 >= min(1, p / q_1)), so sum e = E_1; c_1 is rejected with
    probability R_1 = TV(p, q_1) - E_1 and then the rest emit o_2 with TV(o_2, r_2) <=
    E_2 + ... + E_m (r_2 does not depend on x_1). With p = min(q_1, p) + TV(p, q_1) r_2:
    o - p = e + R_1 (o_2 - r_2) - E_1 r_2, whose half L1 norm is at most E_1 / 2 + R_1
    TV(o_2, r_2) + E_1 / 2. The bound is ``node_tv_bound``: m times the chain's at most.
    """

    lossless = False
    name = None

    @property
    def trees(self) -> bool:
        """Relaxed rules verify trees (bound above)."""
        return True

    def node_accept(self, x: torch.Tensor, r: torch.Tensor, q: torch.Tensor | None,
                    depth: int = 0) -> torch.Tensor:
        """The acceptance of a tree node's child: x [...], r [..., V] (the running target), q
        [..., V] or None -> [...]. ``depth``: the node's (the child's draft position)."""
        v = r.shape[-1]
        a = self.accept_prob(x.reshape(-1, 1), r.reshape(-1, 1, v),
                             None if q is None else q.reshape(-1, 1, v))
        return a.reshape(x.shape)

    def verify_tree(self, tree, draft_tokens, draft_probs, target_probs, generator=None):
        return exact_tree(tree, draft_tokens, draft_probs, target_probs, generator,
                          accept=self.node_accept)

    def node_tv_bound(self, p: torch.Tensor, qs: list, depth: int = 0) -> torch.Tensor:
        """The declared bound on TV(o, p) for the token emitted at a tree node with target p
        [N, V] whose children are drawn from ``qs`` (each [N, V]; a point mass as its
        one-hot): sum_j tv_bound(r_j, q_j)."""
        total = torch.zeros(p.shape[:-1], dtype=p.dtype, device=p.device)
        r = p
        for q in qs:
            total = total + self.tv_bound(r, q, depth)
            r = _residual(r, q)
        return total

    def residual(self, x, p, q, pos):
        return _residual(p, self.dense_q(x, q, p))

    def exact_accept_prob(self, x, p, q):
        """The exact rule's acceptance probability min(1, p(x) / q(x)) at the drafted tokens
        (relaxed rules compare theirs to it)."""
        px = p.gather(-1, x[..., None]).squeeze(-1)
        return self.ratio(px, self.draft_mass(x, q, p))

    def tv_bound(self, p: torch.Tensor, q: torch.Tensor | None, pos: int = 0) -> torch.Tensor:
        """Declared bound on TV(o, p) for one position: [N, V] p and q -> [N]."""
        raise NotImplementedError
