"""Grouped speculative decoding, GSD (So et al., ICCV 2025; code junhyukso/GSD).

For a draft token x at rank r in the target's probability ranking, the candidate group is the
``group_size`` tokens nearest x in that ranking (a window of ranks around r, shifted to stay
inside [0, V): the released code's ``[r-7 : r+7]`` slice wraps around for r < 7, which is a
bug and is not copied). A candidate y stays in the group G(x) only if |p(y) - p(x)| <
``p_threshold`` and its embedding is close: 1 - cos(E_x, E_y) < ``embed_threshold`` (cosine
distance, so the threshold does not depend on the table's scale); x is always a member.
x is accepted with min(1, sum_{G} p / sum_{G} q); the residual is norm(max(0, p - q)).

``monotone=True`` (default) accepts with max(exact, group) probability: the paper's group
ratio can fall below p(x)/q(x) when a neighbour has much more draft than target mass, which
only loses acceptance. With it the rule is a ``Relaxed`` rule and its declared bound is the
generic one, TV(o, p) = sum_y (q(y) a(y) - p(y))^+ <= TV(p, q). ``monotone=False`` is the
paper's rule as published. group_size = 1 reproduces the exact rule bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .geometry import check_table
from .relaxed import Relaxed


@dataclass(frozen=True, repr=False, eq=False)
class Grouped(Relaxed):
    """``Grouped(embeddings=None, group_size=14, p_threshold=0.15, embed_threshold=0.5)``.

    embeddings: [V, d] table for the distance filter (None: no embedding filter).
    """

    embeddings: torch.Tensor | None = None
    group_size: int = 14
    p_threshold: float = 0.15
    embed_threshold: float = 0.5
    monotone: bool = True
    _unit: torch.Tensor | None = field(default=None, init=False)

    name = "gsd"
    exact_at = {"group_size": 1}

    def __post_init__(self):
        if not isinstance(self.group_size, int) or self.group_size < 1:
            raise ValueError(f"group_size={self.group_size!r}: accepted an integer >= 1")
        if not 0 < self.p_threshold <= 1:
            raise ValueError(f"p_threshold={self.p_threshold!r}: accepted a float in (0, 1]")
        if not 0 < self.embed_threshold <= 2:
            raise ValueError(f"embed_threshold={self.embed_threshold!r}: accepted a cosine "
                             "distance in (0, 2]")
        if self.embeddings is not None:
            check_table(self.embeddings)
            e = self.embeddings.detach().float()
            object.__setattr__(self, "_unit", e / e.norm(dim=-1, keepdim=True).clamp_min(1e-12))

    def groups(self, x: torch.Tensor, p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Members and mask of G(x): x [...], p [..., V] -> ids [..., G], mask [..., G] bool."""
        v = p.shape[-1]
        g = self.group_size
        if g > v:
            raise ValueError(f"group_size={g}: accepted at most the vocabulary size {v}")
        if self._unit is not None and self._unit.shape[0] != v:
            raise ValueError(f"embeddings has {self._unit.shape[0]} rows but the "
                             f"distributions have V = {v}: accepted one row per token id")
        order = p.argsort(dim=-1, descending=True, stable=True)                 # [..., V]
        rank = torch.empty_like(order).scatter_(
            -1, order, torch.arange(v, device=p.device).expand_as(order))
        r = rank.gather(-1, x[..., None])                                        # [..., 1]
        start = (r - g // 2).clamp(0, v - g)
        ids = order.gather(-1, start + torch.arange(g, device=p.device))         # [..., G]
        px = p.gather(-1, x[..., None])
        keep = (p.gather(-1, ids) - px).abs() < self.p_threshold
        if self._unit is not None:
            u = self._unit.to(p.device)
            cos = (u[ids] * u[x][..., None, :]).sum(-1)
            keep &= (1 - cos) < self.embed_threshold
        keep |= ids == x[..., None]
        return ids, keep

    def accept_prob(self, x, p, q):
        ids, keep = self.groups(x, p)
        w = keep.to(p.dtype)
        pg = (p.gather(-1, ids) * w).sum(-1)
        if q is None:
            qg = torch.ones_like(pg)       # a point mass puts all draft mass on x
        else:
            qg = (q.gather(-1, ids) * w).sum(-1)
        a = self.ratio(pg, qg)
        return torch.maximum(a, self.exact_accept_prob(x, p, q)) if self.monotone else a

    @property
    def trees(self) -> bool:
        """Trees need acceptance never below the exact rule's: ``monotone`` only."""
        return self.monotone

    def tv_bound(self, p, q, pos=0):
        if q is None:
            return torch.ones(p.shape[:-1], dtype=p.dtype, device=p.device)
        return 0.5 * (p - q).abs().sum(-1)
