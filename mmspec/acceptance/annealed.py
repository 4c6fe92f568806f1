"""Annealed relaxation, Cool-SD (AAAI 2026): relax early draft positions more.

At 0-based draft position i the weight is w_i = max(1, delta * exp(-nu * i - mu)) and x is
accepted with min(1, w_i p(x) / q(x)). The residual is the TV-optimal one for that acceptance
(Cool-SD's "optimal resampling"), norm(max(0, p - min(q, w_i p))); for w_i >= 1 it equals
norm(max(0, p - q)).

Weights below 1 are raised to 1: with the optimal residual a weight w <= 1 makes the step
exact again while accepting less than the exact rule, so it only costs speed.

Declared bound (``Relaxed``): TV(o_i, p_i) = sum_y min((w_i - 1) p(y), (q(y) - p(y))^+)
<= min(TV(p, q), w_i - 1). delta = 1, nu = mu = 0 (w = 1) reproduces the exact rule bit for
bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..sampling import residual as _residual
from .relaxed import Relaxed


@dataclass(frozen=True, repr=False, eq=False)
class Annealed(Relaxed):
    """``Annealed(delta=2.0, nu=0.7, mu=0.0)``; the default delta is mmspec's choice."""

    delta: float = 2.0
    nu: float = 0.7
    mu: float = 0.0

    name = "annealed"
    exact_at = {"delta": 1.0, "nu": 0.0, "mu": 0.0}

    def __post_init__(self):
        if not (isinstance(self.delta, (int, float)) and math.isfinite(self.delta) and self.delta > 0):
            raise ValueError(f"delta={self.delta!r}: accepted a finite float > 0")
        if not (isinstance(self.nu, (int, float)) and math.isfinite(self.nu) and self.nu >= 0):
            raise ValueError(f"nu={self.nu!r}: accepted a finite float >= 0")
        if not (isinstance(self.mu, (int, float)) and math.isfinite(self.mu)):
            raise ValueError(f"mu={self.mu!r}: accepted a finite float")

    def weight(self, pos: torch.Tensor | int, like: torch.Tensor) -> torch.Tensor:
        """The acceptance weight w_i = max(1, delta exp(-nu i - mu)) at draft positions ``pos``, in
        ``like``'s dtype and device."""
        pos = torch.as_tensor(pos, dtype=like.dtype, device=like.device)
        return (self.delta * torch.exp(-self.nu * pos - self.mu)).clamp_min(1.0)

    def accept_prob(self, x, p, q):
        return self.node_accept(x, p, q, torch.arange(x.shape[-1], device=p.device))

    def node_accept(self, x, r, q, depth=0):
        """min(1, w r(x) / q(x)) with the weight of ``depth`` (an int, or positions
        broadcasting against x)."""
        w = self.weight(depth, r)
        return self.ratio(w * r.gather(-1, x[..., None]).squeeze(-1), self.draft_mass(x, q, r))

    def residual(self, x, p, q, pos):
        w = self.weight(pos, p)[..., None]
        return _residual(p, torch.minimum(self.dense_q(x, q, p), w * p))

    def tv_bound(self, p, q, pos=0):
        w = float(self.weight(pos, p))
        b = torch.full(p.shape[:-1], w - 1, dtype=p.dtype, device=p.device)
        if q is None:
            return b
        return torch.minimum(b, 0.5 * (p - q).abs().sum(-1))
