"""What a session's step returns, as one protocol: categorical, density or frame distributions.

A step returns the target's (or draft's) distributions over [B, n] positions, as either

- a probability tensor [B, n, V] (or [B, n, *event, V] for events of several ids): a
  categorical distribution over ids, what every rule of ``mmspec.acceptance`` reads; or
- a ``Distribution``: what a target scores that is not a table of ids, indexed over its batch
  positions like a tensor (``d[:, -1]``): ``GaussianMixture`` densities over vectors
  (continuous tokens), ``FrameDistribution`` over the frames of a depth decoder (CSM).

Drafters and the loop go through the three functions below, so they never ask which kind
they hold:

    draw(q, generator, greedy) -> (x, q_x)   one draw per row and what the rule reads for it
    stack(qs)                                 K per-step distributions -> [B, K, ...]
    nonfinite(p, q)                           a device flag of NaN/inf, or None (validated)
"""

from __future__ import annotations

import torch

from .sampling import sample


class Distribution:
    """Base of the non-tabular distributions a session may return (batch shape [B, n] or [B])."""

    @property
    def batch_shape(self) -> torch.Size:
        raise NotImplementedError

    def __getitem__(self, idx) -> "Distribution":
        raise NotImplementedError

    def draw(self, generator: torch.Generator | None = None) -> tuple[torch.Tensor, object]:
        """Batch [B]: one draw per row [B, ...] and the distribution the rule reads for it
        (itself for densities; the conditionals along the drawn frame for frames)."""
        raise NotImplementedError

    @classmethod
    def stack(cls, parts: list, dim: int = 1):
        raise NotImplementedError

    def nonfinite(self) -> torch.Tensor | None:
        """A device bool flag of NaN/inf values, or None where construction validated them."""
        return None


def draw(q, generator: torch.Generator | None = None, greedy: bool = False):
    """(x [B, ...], q_x) for distributions q of batch [B]: the argmax under greedy
    processing (one-hot q: the same token without a draw), else a sample."""
    if isinstance(q, Distribution):
        return q.draw(generator)
    return (q.argmax(-1) if greedy else sample(q, generator)), q


def stack(parts: list):
    """Per-step distributions of batch [B] -> [B, K, ...] (the draft's q for K steps)."""
    if isinstance(parts[0], Distribution):
        return type(parts[0]).stack(parts, 1)
    return torch.stack(parts, 1)


def nonfinite(*dists) -> torch.Tensor | None:
    """A device bool flag: does any of ``dists`` (None entries skipped) hold NaN or inf
    (None: every one validated itself, as densities do)."""
    flags = [d.nonfinite() if isinstance(d, Distribution) else ~torch.isfinite(d).all()
             for d in dists if d is not None]
    out = None
    for f in flags:
        out = f if out is None else (out if f is None else out | f)
    return out
