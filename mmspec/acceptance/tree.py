"""Lossless verification of a draft tree (``mmspec.tree``): greedy and exact sampling.

Terms as in ``mmspec.types`` and ``mmspec.tree``; per row, ``p_i`` is the target's processed
distribution at node i (after the node's path), ``x_i`` the node's token and ``q_i`` the
distribution it was drawn from, *given its path and its earlier siblings* (None: a point
mass, q_i = one-hot(x_i), as for deterministic top-k children).

Exact (multi-round rejection over siblings, SpecInfer / recursive rejection sampling): at the
current node, with running target r = p_node, try its children c_1 .. c_m in order:

    accept c_j with probability min(1, r(x_j) / q_j(x_j));
    on rejection r <- norm(max(0, r - q_j)) and try c_{j+1}.

An accepted child becomes the current node (r = p_child); when every child is rejected (or
the node has none) the row emits one token drawn from r and stops. Per step a row emits
``num_accepted + 1`` tokens: the accepted path's drafts and that last token.

Lossless. Claim: at a node with target r and m children whose draws are x_j ~ q_j(. | x_<j),
the first token emitted is distributed as r, for any m and any such proposals. Induction on
m: m = 0 draws from r. For m >= 1, token y is emitted by accepting c_1 with probability
q_1(y) min(1, r(y) / q_1(y)) = min(r(y), q_1(y)); c_1 is rejected with probability
sum_y (r(y) - q_1(y))^+ = |r - q_1|_TV, after which the remaining m - 1 children see the
target r' = norm(max(0, r - q_1)), which does not depend on x_1, so by induction they emit
r' whatever x_1 was. Total: min(r, q_1) + (r - q_1)^+ = r. An accepted child's path is the
emitted prefix and its own children were drafted given that path, so the argument repeats
at every depth: the emitted tokens are distributed as the target's, token after token. Point
masses are the case q_j = one-hot(x_j) (the residual drops x_j from r), so deterministic
children (top-k of a draft, any pruning that does not look at the target) are lossless too;
sampled children must be drawn given only their path and earlier siblings (a tree whose
shape depends on the sampled values of other nodes is not covered).

Relaxed rules (``Relaxed``: LANTERN, LANTERN++, GSD, annealed) run the same walk with their own
acceptance against the running target r and the exact residual on rejection. Their bound per
emitted token (proof in ``Relaxed``): at a node whose children are tried with targets
r_1 = p, r_2, ..., r_m, TV(o, p) <= sum_j E_j, where E_j = sum_y (q_j(y) a_j(y) - r_j(y))^+ is
the chain's quantity for that round, bounded by ``tv_bound(r_j, q_j)``: at most m times the
chain's bound (``Relaxed.node_tv_bound``).

Greedy: walk while some child's token equals the argmax of the current node's p (the first
such child in node order), then emit that argmax: the target's greedy chain for any tree.

Both walk all rows at once, ``max_depth x max_children`` rounds of a few kernels each, with
no host synchronisation; ``tests/core/test_tree.py`` checks exact in float64 by enumeration over
tree shapes and by Monte Carlo end to end.
"""

from __future__ import annotations

import torch

from ..sampling import residual, sample
from ..tree import Tree
from ..types import PAD, VerifyOutput
from .base import Rule


def sibling_round(target: torch.Tensor, x: torch.Tensor, q: torch.Tensor | None,
                  accept=None, depth: int = 0):
    """One round at a node: target [..., V] (the running r), x [...] the child's token, q
    [..., V] or None (point mass) -> (acceptance probability [...], r after a rejection
    [..., V]). ``accept(x, r, q, depth)``: a relaxed rule's acceptance (``Relaxed.node_accept``,
    never below the exact one) instead of min(1, r(x) / q(x)); ``depth``: the node's (0 the
    root), the child's draft position."""
    if accept is None:
        qx = Rule.draft_mass(x, q, target)
        a = Rule.ratio(target.gather(-1, x[..., None]).squeeze(-1), qx)
    else:
        a = accept(x, target, q, depth)
    return a, residual(target, Rule.dense_q(x, q, target))


def _emitted(tree_tokens: torch.Tensor, path: torch.Tensor, n: torch.Tensor,
             last: torch.Tensor) -> VerifyOutput:
    """The path's drafts, then ``last``; PAD after. tree_tokens [B, K]."""
    b = tree_tokens.shape[0]
    rows = torch.arange(b, device=path.device)
    nodes = torch.cat([tree_tokens.new_full((b, 1), PAD), tree_tokens], 1)
    tokens = torch.cat([nodes.gather(1, path[:, 1:]), nodes.new_full((b, 1), PAD)], 1)
    cols = torch.arange(tokens.shape[1], device=path.device)
    tokens = torch.where(cols[None] < n[:, None], tokens, PAD)
    tokens[rows, n] = last
    return VerifyOutput(tokens=tokens, num_accepted=n, path=path)


def check_tree(tree: Tree, tokens: torch.Tensor, probs, target_probs: torch.Tensor) -> None:
    """Shapes only (no host sync): tokens [B, K], probs None or [B, K, V], p [B, K + 1, V]."""
    b, k = tokens.shape
    if tuple(tree.parents.shape) != (b, k):
        raise ValueError(f"tree.parents must be [B, K] = [{b}, {k}] (one parent per draft), "
                         f"got {tuple(tree.parents.shape)}")
    if target_probs.shape[:2] != (b, k + 1):
        raise ValueError(f"target_probs must be [B, K+1, V] = [{b}, {k + 1}, V], got "
                         f"{tuple(target_probs.shape)}")
    if probs is not None and probs.shape != (b, k, target_probs.shape[-1]):
        raise ValueError(f"draft_probs must be None or [B, K, V] = [{b}, {k}, "
                         f"{target_probs.shape[-1]}], got {tuple(probs.shape)}")


def exact_tree(tree: Tree, tokens: torch.Tensor, probs: torch.Tensor | None,
               target_probs: torch.Tensor, generator=None, accept=None) -> VerifyOutput:
    """Exact verification of a tree (module docstring): tokens [B, K], probs [B, K, V] or
    None, target_probs [B, K + 1, V] -> the emitted tokens, counts and ``path``. With
    ``accept`` (``Relaxed.node_accept``) the rounds accept as that relaxed rule does."""
    check_tree(tree, tokens, probs, target_probs)
    p = target_probs
    b, dev = tokens.shape[0], p.device
    rows = torch.arange(b, device=dev)
    kids = tree.children()
    depth, width = tree.max_depth, tree.max_children
    u = torch.rand((depth, width, b), generator=generator, device=dev, dtype=p.dtype)
    cur = torch.zeros(b, dtype=torch.long, device=dev)
    r, walking = p[:, 0], torch.ones(b, dtype=torch.bool, device=dev)
    path = torch.zeros(b, depth + 1, dtype=torch.long, device=dev)
    n = torch.zeros(b, dtype=torch.long, device=dev)
    for d in range(depth):
        moved = torch.zeros_like(walking)
        for m in range(width):
            child = kids[rows, cur, m]
            trying = walking & ~moved & (child > 0)
            i = (child - 1).clamp(min=0)
            a, rejected = sibling_round(r, tokens[rows, i], None if probs is None else probs[rows, i],
                                        accept, d)
            took = trying & (u[d, m] < a)
            r = torch.where((trying & ~took)[:, None], rejected, r)
            r = torch.where(took[:, None], p[rows, child.clamp(min=0)], r)
            cur = torch.where(took, child, cur)
            moved = moved | took
        walking = walking & moved
        n = n + moved.long()
        path[:, d + 1] = torch.where(moved, cur, 0)
    return _emitted(tokens, path, n, sample(r, generator))


def greedy_tree(tree: Tree, tokens: torch.Tensor, probs, target_probs: torch.Tensor,
                generator=None) -> VerifyOutput:
    """Greedy verification of a tree: follow the child equal to the argmax (deterministic;
    the generator is untouched)."""
    check_tree(tree, tokens, probs, target_probs)
    best = target_probs.argmax(-1)                                              # [B, K + 1]
    b, dev = tokens.shape[0], best.device
    rows = torch.arange(b, device=dev)
    kids = tree.children()
    node_tokens = torch.cat([tokens.new_full((b, 1), PAD), tokens], 1)
    cur = torch.zeros(b, dtype=torch.long, device=dev)
    walking = torch.ones(b, dtype=torch.bool, device=dev)
    path = torch.zeros(b, tree.max_depth + 1, dtype=torch.long, device=dev)
    n = torch.zeros(b, dtype=torch.long, device=dev)
    for d in range(tree.max_depth):
        cand = kids[rows, cur]                                                  # [B, M]
        hit = (cand > 0) & (node_tokens.gather(1, cand.clamp(min=0)) == best[rows, cur][:, None])
        moved = walking & hit.any(1)
        cur = torch.where(moved, cand.gather(1, hit.long().argmax(1, keepdim=True))[:, 0], cur)
        walking = moved
        n = n + moved.long()
        path[:, d + 1] = torch.where(moved, cur, 0)
    return _emitted(tokens, path, n, best[rows, cur])
