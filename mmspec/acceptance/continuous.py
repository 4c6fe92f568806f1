"""Continuous speculative decoding, CSpD (Wang et al., arXiv 2411.11925): tokens are vectors
and distributions are densities.

Accept a draft x ~ q with probability min(1, p(x) / q(x)), computed in log space. At the
first rejection the recovered token is drawn from norm(max(0, p - q)) by acceptance-rejection:
propose y ~ p and keep it with probability max(0, 1 - q(y) / p(y)) (a proposal is kept with
probability TV(p, q) overall). All rows and up to ``max_proposals`` proposals are drawn at once.

Bounded proposals: if none of the ``max_proposals`` proposals is kept (probability
(1 - TV(p, q))^max_proposals), the rule does not invent a vector: it draws the token from p
itself and counts the event in ``VerifyOutput.fallbacks`` (the loop adds them to
``stats.extra["residual_fallbacks"]``). Effect on the distribution: a rejected step emits a
draw from p instead of the residual with that probability, so the emitted token's total
variation from p is at most P(reject) * (1 - TV(p, q))^max_proposals (< 1e-4 of the rejected
steps at TV = 0.1 and 100 proposals). Nothing else is approximated: with exact densities the
rule is lossless up to that bound (``lossless = True`` is declared for the limit; the bound is
reported per run). Unlike the reference code there is no constant in the exponent, no zero
vector, and after a rejection the later drafts are discarded.

The rule sees only density objects (``log_prob(x) -> [..]``, ``sample(generator) -> [.., D]``,
indexing over batch positions); never a model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..types import VerifyOutput
from .base import Rule


@dataclass(frozen=True, repr=False)
class ContinuousExact(Rule):
    """``ContinuousExact(max_proposals=100)``."""

    max_proposals: int = 100
    lossless = True
    name = "continuous"
    event = "vector"

    def __post_init__(self):
        if not isinstance(self.max_proposals, int) or self.max_proposals < 1:
            raise ValueError(f"max_proposals={self.max_proposals!r}: accepted an integer >= 1")

    def validate(self, draft_tokens, draft_probs, target_probs, values: bool = True) -> None:
        if draft_tokens.dim() != 3 or not draft_tokens.is_floating_point():
            raise ValueError(f"draft_tokens must be a float [B, K, D] tensor of vectors, got "
                             f"{tuple(draft_tokens.shape)} {draft_tokens.dtype}")
        b, k, d = draft_tokens.shape
        if tuple(target_probs.batch_shape) != (b, k + 1):
            raise ValueError(f"target density batch shape must be [B, K+1] = [{b}, {k + 1}], got "
                             f"{tuple(target_probs.batch_shape)}")
        if target_probs.dim != d:
            raise ValueError(f"latent dimension mismatch: draft tokens have D = {d}, the target "
                             f"density {target_probs.dim}")
        if k and draft_probs is None:
            raise ValueError("continuous drafts need their density (a point mass has no density)")
        if k and tuple(draft_probs.batch_shape) != (b, k):
            raise ValueError(f"draft density batch shape must be [B, K] = [{b}, {k}], got "
                             f"{tuple(draft_probs.batch_shape)}")
        if values and not bool(torch.isfinite(draft_tokens).all()):
            raise ValueError("draft_tokens contains NaN or inf: accepted finite vectors")

    def residual_sample(self, p, q, generator=None):
        """[N] densities -> (y [N, D], fallback [N] bool, proposals used [N]) by bounded
        acceptance-rejection."""
        t = self.max_proposals
        ys = p.sample(generator, (t,))                                       # [T, N, D]
        lp, lq = p.log_prob(ys), q.log_prob(ys)                               # [T, N]
        keep_prob = (1 - torch.exp(torch.clamp(lq - lp, max=0.0))).clamp(0, 1)
        keep_prob = torch.where(lq > lp, torch.zeros_like(keep_prob), keep_prob)
        u = torch.rand(keep_prob.shape, generator=generator, device=keep_prob.device,
                       dtype=keep_prob.dtype)
        kept = u < keep_prob                                                  # [T, N]
        first = torch.where(kept, torch.arange(t, device=kept.device)[:, None], t).amin(0)
        fallback = first == t
        idx = first.clamp(max=t - 1)
        y = ys[idx, torch.arange(ys.shape[1], device=ys.device)]              # [N, D]
        fresh = p.sample(generator)                                           # the documented fallback
        return torch.where(fallback[:, None], fresh, y), fallback, torch.where(fallback, t, first + 1)

    def __call__(self, draft_tokens, draft_probs, target_probs, generator=None, *, validate=True):
        self.validate(draft_tokens, draft_probs, target_probs, values=validate)
        b, k, d = draft_tokens.shape
        p = target_probs
        rows = torch.arange(b, device=draft_tokens.device)
        if k == 0:
            tok = p[:, 0].sample(generator)
            return VerifyOutput(tokens=tok[:, None], num_accepted=torch.zeros(b, dtype=torch.long,
                                                                               device=tok.device))
        log_a = torch.clamp(p[:, :k].log_prob(draft_tokens) - draft_probs.log_prob(draft_tokens),
                            max=0.0)                                          # [B, K]
        u = torch.rand(log_a.shape, generator=generator, device=log_a.device, dtype=log_a.dtype)
        ok = torch.log(u.clamp_min(torch.finfo(u.dtype).tiny)) < log_a
        n = ok.long().cumprod(1).sum(1)
        j = n.clamp(max=k - 1)
        y_res, fallback, used = self.residual_sample(p.select(rows, j), draft_probs.select(rows, j), generator)
        bonus = p[:, k].sample(generator)
        last = torch.where((n < k)[:, None], y_res, bonus)
        tokens = torch.cat([draft_tokens, torch.full_like(draft_tokens[:, :1], float("nan"))], 1)
        cols = torch.arange(k + 1, device=tokens.device)
        tokens = torch.where((cols[None] < n[:, None])[..., None], tokens, float("nan"))
        tokens[rows, n] = last.to(tokens.dtype)
        rejected = n < k
        return VerifyOutput(tokens=tokens, num_accepted=n, fallbacks=fallback & rejected,
                            residual_proposals=torch.where(rejected, used, 0))
