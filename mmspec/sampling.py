"""Logits -> processed probabilities, residuals, and sampling without host synchronisation.

Draft and target go through the same processing (``SamplingParams.probs``), so that "lossless"
means lossless with respect to the processed target distribution (docs/METHODS.md section 1):
guidance first (on logits, ``u + s (c - u)``), then temperature, then top-k, top-p and min-p.
Temperature 0 means greedy: the processed distribution is one-hot at the argmax (ties go to
the lowest id, as ``torch.argmax``), so every rule of this package reduces to greedy
verification and plain sampling reduces to greedy decoding.

Defaults differ from ``model.generate``'s: mmspec samples at temperature 1 with no
truncation unless told, while transformers 5 decodes greedily unless ``do_sample`` and, when
sampling, fills an unset top-k with 50. ``SamplingParams.from_generation_config`` (the front
doors' ``generation_config=``) gives a GenerationConfig's processing exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .distributed import shared_seed


def _check_range(name: str, value, ok: bool, accepted: str) -> None:
    if not ok:
        raise ValueError(f"{name}={value!r} is out of range: accepted {accepted}")


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


@dataclass(frozen=True)
class SamplingParams:
    """How logits become the distributions that drafts and targets are sampled from.

    temperature: >= 0; 0 = greedy (one-hot argmax).
    top_k:       None or >= 1: keep the k most likely ids.
    top_p:       None or in (0, 1]: keep the smallest set whose mass reaches top_p.
    min_p:       None or in [0, 1]: drop ids below min_p * max probability.
    """

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None

    def __post_init__(self) -> None:
        t = self.temperature
        _check_range("temperature", t, _number(t) and t >= 0, "a finite float >= 0 (0 = greedy)")
        if self.top_k is not None:
            _check_range("top_k", self.top_k, isinstance(self.top_k, int)
                         and not isinstance(self.top_k, bool) and self.top_k >= 1,
                         "None or an integer >= 1")
        if self.top_p is not None:
            _check_range("top_p", self.top_p, _number(self.top_p) and 0 < self.top_p <= 1,
                         "None or a float in (0, 1]")
        if self.min_p is not None:
            _check_range("min_p", self.min_p, _number(self.min_p) and 0 <= self.min_p <= 1,
                         "None or a float in [0, 1]")

    @property
    def greedy(self) -> bool:
        """Temperature 0: the distributions are one-hot at the argmax."""
        return self.temperature == 0

    @classmethod
    def from_generation_config(cls, config, **given) -> "SamplingParams":
        """The processing ``model.generate`` applies for a transformers GenerationConfig:
        greedy unless ``do_sample``; else its temperature (unset: 1), top-k (unset: 50, as
        transformers fills it; 0: off), top-p (1: off) and min-p. ``given`` values that are
        not None win (the caller's explicit arguments)."""
        if not config.do_sample:
            values = dict(temperature=0.0)
        else:
            top_k = 50 if config.top_k is None else (config.top_k or None)
            top_p = None if config.top_p in (None, 1.0) else config.top_p
            values = dict(temperature=1.0 if config.temperature is None else config.temperature,
                          top_k=top_k, top_p=top_p, min_p=config.min_p)
        values.update({k: v for k, v in given.items() if v is not None})
        return cls(**values)

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """[..., V] logits -> [..., V] float32 (or float64 if given) probabilities."""
        return process_logits(logits, self)


def sampling_params(model, generation_config, **given) -> SamplingParams:
    """The call's processing: the given arguments over ``generation_config`` (``"model"``:
    the model's own), or over mmspec's defaults (temperature 1, no truncation)."""
    if generation_config is None:
        given["temperature"] = 1.0 if given["temperature"] is None else given["temperature"]
        return SamplingParams(**given)
    if isinstance(generation_config, str):
        if generation_config != "model":
            raise ValueError(f"generation_config={generation_config!r}: accepted a "
                             "GenerationConfig, 'model' or None")
        generation_config = model.generation_config
    return SamplingParams.from_generation_config(generation_config, **given)


def guide(cond: torch.Tensor, uncond: torch.Tensor, scale: float) -> torch.Tensor:
    """Classifier-free guidance on logits: ``u + s (c - u)`` (s = 1 returns ``cond``). An id
    masked (-inf) in either branch stays masked, where the formula would give NaN
    (-inf - -inf) or an unbounded logit."""
    out = uncond + scale * (cond - uncond)
    return torch.where(torch.isneginf(cond) | torch.isneginf(uncond), float("-inf"), out)


def process_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, top-k, top-p, min-p, softmax. Works on any leading shape.

    -inf logits are allowed (masked ids); a row with no finite logit gives NaN probabilities,
    which the loop reports as an error naming the logits.
    """
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    if params.greedy:
        # One-hot at the argmax (taken in the model's dtype: the same index). Its entry is NaN
        # where the row's top logit is NaN or inf (an all -inf row included), so the loop's
        # finiteness check reports bad logits under greedy decoding too (max propagates NaN).
        top, idx = logits.max(dim=-1, keepdim=True)
        one = (top - top).add_(1).to(dtype)
        return torch.zeros(logits.shape, dtype=dtype, device=logits.device).scatter_(-1, idx, one)
    logits = logits.to(dtype)
    logits = logits / params.temperature
    if params.top_k is not None and params.top_k < logits.shape[-1]:
        kth = logits.topk(params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, -math.inf)
    probs = torch.softmax(logits, dim=-1)
    if params.top_p is not None and params.top_p < 1:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        mass_before = sorted_p.cumsum(-1) - sorted_p
        drop_sorted = mass_before >= params.top_p  # always keeps the first id
        drop = torch.zeros_like(drop_sorted).scatter_(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    if params.min_p is not None and params.min_p > 0:
        floor = params.min_p * probs.amax(-1, keepdim=True)
        probs = probs.masked_fill(probs < floor, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)) over the last dimension.

    Where p == q (no positive mass left) the residual is undefined; a rejection there has
    probability zero, so p is returned for those rows (it only matters under rounding).
    """
    r = (p - q).clamp_min_(0)
    mass = r.sum(-1, keepdim=True)
    ok = mass > 0
    return torch.where(ok, r / torch.where(ok, mass, torch.ones_like(mass)), p)


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One id per row from [..., V] probabilities, without a host synchronisation.

    Exponential race: argmax_i p_i / E_i with E_i ~ Exp(1) i.i.d. picks i with probability
    p_i (the same trick as vLLM's sampler). Zero-probability ids are never picked.
    """
    e = torch.empty_like(probs).exponential_(generator=generator)
    # Exp(1) can round to 0 in float32; 0/0 would be NaN, which argmax treats as the max.
    e.clamp_min_(torch.finfo(e.dtype).tiny)
    return (probs / e).argmax(dim=-1)


def uniform(shape, *, like: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """U[0, 1) samples of the given shape on ``like``'s device and dtype."""
    return torch.rand(shape, generator=generator, device=like.device, dtype=like.dtype)


def make_generator(seed: int | None, device: torch.device | str,
                   group=None) -> torch.Generator | None:
    """A seeded generator on ``device`` (None when seed is None: global RNG). ``group``: the
    processes a tensor-parallel target is split over (``distributed.split_group``), whose
    draws must agree: a call without a seed gets one shared by them (``shared_seed``)."""
    if seed is None and group is not None:
        seed = shared_seed(group)
    if seed is None:
        return None
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**63:
        raise ValueError(f"seed={seed!r}: accepted None or an integer in [0, 2**63)")
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


def check_probs(name: str, probs: torch.Tensor) -> None:
    """Raise ValueError if ``probs`` has NaN/inf or negative entries (one host sync)."""
    if not bool(torch.isfinite(probs).all()):
        raise ValueError(
            f"{name} contains NaN or inf: accepted finite probabilities (check the model's "
            "logits; a row whose logits are all -inf has no distribution)"
        )
    if bool((probs < 0).any()):
        raise ValueError(f"{name} has negative entries: accepted probabilities in [0, 1]")
