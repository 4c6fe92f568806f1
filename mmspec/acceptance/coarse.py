"""Coarse-grained acceptance, PCG (Apple, arXiv 2511.13732): exact at group level.

Groups over an embedding table: G(k) = {k} u {t : cos(E_k, E_t) > theta}; a token t lies in
the groups S(t) = {g : t in G(g)} (= G(t), the relation is symmetric) with overlap weight
1 / |S(t)|. Coarse distributions: P_c(g) = sum_{t in G(g)} p(t) / |S(t)|, Q_c likewise.

A draft x ~ q with an owner group g drawn uniformly from S(x) is a draw g ~ Q_c; accepting
with min(1, P_c(g) / Q_c(g)) and, on rejection, drawing g' ~ norm(max(0, P_c - Q_c)) and a
member t of g' with probability p(t) / |S(t)| / P_c(g') is exact speculative sampling over
groups: **the emitted group is distributed exactly as P_c** (declared ``group_lossless``).
On acceptance the emitted token is the draft x itself, so within a group the token follows
the draft: the rule is not lossless at token level (``lossless = False``).

The owner draw is marginalised (the contract's acceptance probability is per token):
a(x) = mean_{g in S(x)} min(1, P_c(g) / Q_c(g)), which has the same law. Expected acceptance
is 1 - TV(P_c, Q_c) >= 1 - TV(p, q) (coarse-graining never increases TV), so it never falls
below the exact rule's on average. theta = 1 makes every group a singleton: the exact rule,
bit for bit (that case runs the exact rule's code).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..sampling import residual as _residual
from .base import Rule
from .geometry import CosineGroups, check_table, cosine_groups


@dataclass(frozen=True, repr=False, eq=False)
class CoarseGrained(Rule):
    """``CoarseGrained(embeddings, theta=0.45)``; theta in [-1, 1]."""

    embeddings: torch.Tensor
    theta: float = 0.45
    _groups: CosineGroups = field(default=None, init=False)

    lossless = False
    group_lossless = True
    name = "pcg"
    exact_at = {"theta": 1.0}

    def __post_init__(self):
        check_table(self.embeddings)
        if not (isinstance(self.theta, (int, float)) and not isinstance(self.theta, bool)
                and -1 <= self.theta <= 1):
            raise ValueError(f"theta={self.theta!r}: accepted a cosine threshold in [-1, 1]")
        object.__setattr__(self, "_groups", cosine_groups(self.embeddings, self.theta))

    @property
    def groups(self) -> CosineGroups:
        """The cosine groups of the token embeddings (``theta``): which ids count as one coarse
        token."""
        return self._groups

    def _check(self, v: int) -> None:
        if v != self._groups.num_tokens:
            raise ValueError(f"embeddings has {self._groups.num_tokens} rows but the "
                             f"distributions have V = {v}: accepted one row per token id")

    def coarse(self, probs: torch.Tensor) -> torch.Tensor:
        """[..., V] token distribution -> [..., V] group distribution (P_c or Q_c)."""
        self._check(probs.shape[-1])
        flat = probs.reshape(-1, probs.shape[-1])
        return self._groups.apply(flat).reshape(probs.shape)

    def group_accept(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """min(1, P_c(g) / Q_c(g)) for every group g: [..., V] -> [..., V]."""
        return self.ratio(self.coarse(p), self.coarse(q))

    def accept_prob(self, x, p, q):
        qd = self.dense_q(x, q, p)
        if self._groups.singleton:
            return self.ratio(p.gather(-1, x[..., None]).squeeze(-1), self.draft_mass(x, q, p))
        r = self.group_accept(p, qd)
        flat = r.reshape(-1, r.shape[-1])
        per_token = self._groups.apply(flat, transpose=True).reshape(r.shape)  # mean over S(t)
        return per_token.gather(-1, x[..., None]).squeeze(-1)

    def coarse_residual(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """The residual over groups: norm(max(0, P - Q)) of the group masses [..., G]."""
        return _residual(self.coarse(p), self.coarse(q))

    def residual(self, x, p, q, pos):
        qd = self.dense_q(x, q, p)
        if self._groups.singleton:
            return _residual(p, qd)
        pc = self.coarse(p)
        rc = _residual(pc, self.coarse(qd))
        ratio = torch.where(pc > 0, rc / torch.where(pc > 0, pc, torch.ones_like(pc)),
                            torch.zeros_like(pc))
        out = p * self._groups.apply(ratio, transpose=True)
        return out / out.sum(-1, keepdim=True)
