"""LANTERN relaxed acceptance (Jang et al., ICLR 2025) and LANTERN++ (arXiv 2502.06352).

For a draft token x with k nearest neighbours n_1..n_k in an embedding table (a VQ
codebook's latent space; L2, x excluded), C_m = sum_{j<=m} p(n_j) and m* is the largest m
with C_m <= delta (LANTERN) or C_m <= (lam - 1) p(x) (LANTERN++). The relaxed probability is
p~(x) = p(x) + C_{m*} and x is accepted with min(1, p~(x) / q(x)).

Residual: norm(max(0, p - q)), the TV-optimal one for a relaxation that only raises
acceptance (``Relaxed``). LANTERN's released code instead zeroes p on x and its neighbours;
that residual can only move the output further from p, so it is not used.

Declared bound (per emitted token, from ``Relaxed``): TV(o, p) = sum_y min(C(y),
(q(y) - p(y))^+), hence
- LANTERN:   TV(o, p) <= min(TV(p, q), delta * #{y : q(y) > p(y)}); a point-mass draft
             (one y with q > p) gives TV <= delta.
- LANTERN++: TV(o, p) <= min(TV(p, q), (lam - 1) * sum_{y : q(y) > p(y)} p(y)) <= lam - 1.
delta = 0, k = 0 or lam = 1 reproduce the exact rule bit for bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from .geometry import check_table, knn_index
from .relaxed import Relaxed


@dataclass(frozen=True, repr=False, eq=False)
class Lantern(Relaxed):
    """``Lantern(embeddings, k=1000, delta=0.1)`` or ``Lantern(embeddings, k, lam=2.0)``.

    embeddings: [V, d] table whose rows are the token ids' latent vectors.
    k:          neighbours considered per token (0 <= k <= V - 1).
    delta:      additive TV budget per token, in [0, 1] (default 0.1 when lam is None).
    lam:        LANTERN++ multiplicative bound, >= 1 (exclusive with delta).
    """

    embeddings: torch.Tensor
    k: int = 1000
    delta: float | None = None
    lam: float | None = None
    _index: torch.Tensor = field(default=None, init=False)

    name = "lantern"
    exact_at = {"delta": 0.0}

    @classmethod
    def from_params(cls, params, context):
        """Method defaults: k = min(1000, V - 1); ``lam`` alone is LANTERN++."""
        kw = dict(params)
        if "lam" in kw:
            kw.setdefault("delta", None)
        if "k" not in kw and context.embeddings is not None and kw.get("embeddings") is None:
            kw["k"] = min(1000, context.embeddings.shape[0] - 1)
        return super().from_params(kw, context)

    def __post_init__(self):
        check_table(self.embeddings)
        v = self.embeddings.shape[0]
        if not isinstance(self.k, int) or not 0 <= self.k <= v - 1:
            raise ValueError(f"k={self.k!r}: accepted an integer in [0, {v - 1}] (V - 1 for a "
                             f"{v}-row embedding table)")
        if self.lam is not None and self.delta is not None:
            raise ValueError("give delta (LANTERN) or lam (LANTERN++), not both")
        if self.lam is None:
            d = 0.1 if self.delta is None else self.delta
            if not (isinstance(d, (int, float)) and 0 <= d <= 1):
                raise ValueError(f"delta={d!r}: accepted a float in [0, 1]")
            object.__setattr__(self, "delta", float(d))
        elif not (isinstance(self.lam, (int, float)) and math.isfinite(self.lam) and self.lam >= 1):
            raise ValueError(f"lam={self.lam!r}: accepted a finite float >= 1")
        object.__setattr__(self, "_index", knn_index(self.embeddings, self.k))

    @property
    def neighbours(self) -> torch.Tensor:
        """[V, k] neighbour ids (int32), nearest first."""
        return self._index

    def _check_vocab(self, v: int) -> None:
        if v != self.embeddings.shape[0]:
            raise ValueError(f"embeddings has {self.embeddings.shape[0]} rows but the "
                             f"distributions have V = {v}: accepted one row per token id")

    def proximity_mass(self, x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        """C_{m*}(x): x [...], p [..., V] -> [...] (vectorised, no loop over candidates)."""
        self._check_vocab(p.shape[-1])
        if self.k == 0:
            return torch.zeros(x.shape, dtype=p.dtype, device=p.device)
        nbr = self._index.to(p.device)[x].long()                              # [..., k]
        pn = p.gather(-1, nbr)                                                # [..., k]
        csum = pn.cumsum(-1)
        if self.lam is None:
            budget = torch.as_tensor(self.delta, dtype=p.dtype, device=p.device)
        else:
            budget = (self.lam - 1) * p.gather(-1, x[..., None])
        return (pn * (csum <= budget)).sum(-1)     # C nondecreasing: the kept set is a prefix

    def accept_prob(self, x, p, q):
        px = p.gather(-1, x[..., None]).squeeze(-1)
        return self.ratio(px + self.proximity_mass(x, p), self.draft_mass(x, q, p))

    def tv_bound(self, p, q, pos=0):
        qd = q if q is not None else None
        if qd is None:  # point mass: at most one y has q > p
            over = torch.ones(p.shape[:-1], dtype=p.dtype, device=p.device)
            tv_pq = None
        else:
            over = (qd > p).to(p.dtype)
            tv_pq = 0.5 * (p - qd).abs().sum(-1)
        if self.lam is None:
            b = self.delta * over.sum(-1) if over.dim() == p.dim() else self.delta * over
        else:
            mass = (p * over).sum(-1) if over.dim() == p.dim() else torch.ones_like(over)
            b = (self.lam - 1) * mass
        return b if tv_pq is None else torch.minimum(b, tv_pq)
