"""Densities for continuous tokens: what continuous rules and drafters see.

``GaussianMixture`` holds a batch of diagonal Gaussian mixtures: logits [..., M], means
[..., M, D], log_scales [..., M, D]; batch shape [...] is indexed like a tensor
(``d[:, :K]``, ``d[:, K]``, ``d.select(rows, cols)``). ``log_prob(x)`` takes x [..., D] (or
[T, ..., D] for T samples at once) and ``sample(generator, (T,))`` draws. A single Gaussian is
a mixture of one component.
"""

from __future__ import annotations

import math

import torch

from .distributions import Distribution


class GaussianMixture(Distribution):
    def __init__(self, logits: torch.Tensor, means: torch.Tensor, log_scales: torch.Tensor,
                 validate: bool = True):
        if means.shape != log_scales.shape or means.shape[:-1] != logits.shape:
            raise ValueError(f"mixture parameters disagree: logits {tuple(logits.shape)}, means "
                             f"{tuple(means.shape)}, log_scales {tuple(log_scales.shape)}: accepted "
                             "[..., M], [..., M, D], [..., M, D]")
        if validate:
            for name, t in (("logits", logits), ("means", means), ("log_scales", log_scales)):
                if not bool(torch.isfinite(t).all()):
                    raise ValueError(f"mixture {name} contain NaN or inf: accepted finite head outputs")
        self.logits, self.means, self.log_scales = logits, means, log_scales

    @classmethod
    def gaussian(cls, mean: torch.Tensor, log_scale: torch.Tensor) -> "GaussianMixture":
        return cls(torch.zeros(mean.shape[:-1] + (1,), dtype=mean.dtype, device=mean.device),
                   mean[..., None, :], log_scale[..., None, :])

    @property
    def batch_shape(self) -> torch.Size:
        return self.logits.shape[:-1]

    @property
    def dim(self) -> int:
        return int(self.means.shape[-1])

    def __getitem__(self, idx) -> "GaussianMixture":
        if not isinstance(idx, tuple):
            idx = (idx,)
        return GaussianMixture(self.logits[idx], self.means[idx], self.log_scales[idx], validate=False)

    def select(self, rows: torch.Tensor, cols: torch.Tensor) -> "GaussianMixture":
        return GaussianMixture(self.logits[rows, cols], self.means[rows, cols],
                               self.log_scales[rows, cols], validate=False)

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        z = (x[..., None, :] - self.means) * torch.exp(-self.log_scales)          # [..., M, D]
        comp = -0.5 * (z * z).sum(-1) - self.log_scales.sum(-1) - 0.5 * self.dim * math.log(2 * math.pi)
        return torch.logsumexp(torch.log_softmax(self.logits, -1) + comp, -1)

    def sample(self, generator=None, sample_shape=()) -> torch.Tensor:
        shape = tuple(sample_shape) + tuple(self.logits.shape)
        e = torch.empty(shape, dtype=self.logits.dtype, device=self.logits.device).exponential_(
            generator=generator).clamp_min(torch.finfo(self.logits.dtype).tiny)
        k = (torch.log_softmax(self.logits, -1) - torch.log(e)).argmax(-1)            # Gumbel race
        idx = k[..., None, None].expand(*k.shape, 1, self.dim)
        mu = self.means.expand(shape + (self.dim,)).gather(-2, idx).squeeze(-2)
        ls = self.log_scales.expand(shape + (self.dim,)).gather(-2, idx).squeeze(-2)
        noise = torch.randn(mu.shape, generator=generator, dtype=mu.dtype, device=mu.device)
        return mu + torch.exp(ls) * noise

    @staticmethod
    def cat(parts: list["GaussianMixture"], dim: int = 1) -> "GaussianMixture":
        return GaussianMixture(torch.cat([p.logits for p in parts], dim),
                               torch.cat([p.means for p in parts], dim),
                               torch.cat([p.log_scales for p in parts], dim), validate=False)

    def draw(self, generator=None) -> tuple[torch.Tensor, "GaussianMixture"]:
        return self.sample(generator), self

    @classmethod
    def stack(cls, parts: list["GaussianMixture"], dim: int = 1) -> "GaussianMixture":
        return GaussianMixture(torch.stack([p.logits for p in parts], dim),
                               torch.stack([p.means for p in parts], dim),
                               torch.stack([p.log_scales for p in parts], dim), validate=False)
