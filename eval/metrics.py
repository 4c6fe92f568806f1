"""Metrics that need no pretrained weights, and the statistics the report uses.

- ``fid(a, b)``: Frechet distance between two feature sets (features from the shapes-world
  network trained here, modalities/shapes_features.py); identical sets give 0.
- ``bootstrap_ci``: percentile bootstrap confidence interval of a statistic.
- ``paired_delta_ci``: mean difference of paired per-prompt values with a bootstrap CI.
- ``token_tv_test``: is a method's token distribution the plain one? A permutation test on
  per-sample token histograms (samples, not tokens, are exchangeable), so correlation
  inside an image or sentence does not inflate significance.
- speech (``modalities.speech.metrics``, re-exported here): ``mel_cepstral_distortion``
  (MCD with DTW alignment), ``log_f0_rmse``, ``duration_ratio``.
- ``analytic_speedup``: the bound implied by measured tokens per step and measured costs.
"""

from __future__ import annotations


import numpy as np
from scipy import linalg

from modalities.speech.metrics import (dtw, dtw_path, duration_ratio, f0_track,  # noqa: F401
                                       log_f0_rmse, mel_cepstral_distortion)


def fid(a: np.ndarray, b: np.ndarray) -> float:
    """Frechet distance between Gaussians fitted to feature sets a [N, d] and b [M, d]."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1] or len(a) < 2 or len(b) < 2:
        raise ValueError("fid needs two [N, d] feature sets with N >= 2 and the same d")
    mu_a, mu_b = a.mean(0), b.mean(0)
    ca, cb = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    covmean = linalg.sqrtm(ca @ cb)
    covmean = (covmean[0] if isinstance(covmean, tuple) else covmean).real
    val = float(((mu_a - mu_b) ** 2).sum() + np.trace(ca + cb - 2 * covmean))
    return max(val, 0.0)


def bootstrap_ci(values, stat=np.mean, n: int = 1000, alpha: float = 0.05, seed: int = 0):
    """(estimate, low, high) of ``stat`` over ``values`` (resampled with replacement)."""
    v = np.asarray(values, float)
    if len(v) == 0:
        return float("nan"), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    boots = [stat(v[rng.integers(0, len(v), len(v))]) for _ in range(n)]
    return float(stat(v)), float(np.quantile(boots, alpha / 2)), float(np.quantile(boots, 1 - alpha / 2))


def paired_delta_ci(x, y, n: int = 1000, alpha: float = 0.05, seed: int = 0):
    """mean(x - y) over paired values, with a bootstrap CI over pairs."""
    d = np.asarray(x, float) - np.asarray(y, float)
    return bootstrap_ci(d, np.mean, n, alpha, seed)


def fid_delta_ci(a, b, ref, n: int = 200, alpha: float = 0.05, seed: int = 0):
    """FID(a, ref) - FID(b, ref) with a bootstrap CI (a and b resampled independently)."""
    a, b, ref = map(np.asarray, (a, b, ref))
    est = fid(a, ref) - fid(b, ref)
    rng = np.random.default_rng(seed)
    boots = []
    for _ in range(n):
        ia, ib = rng.integers(0, len(a), len(a)), rng.integers(0, len(b), len(b))
        boots.append(fid(a[ia], ref) - fid(b[ib], ref))
    return est, float(np.quantile(boots, alpha / 2)), float(np.quantile(boots, 1 - alpha / 2))


def token_histograms(samples: list[list[int]], vocab: int) -> np.ndarray:
    """[S, V] normalised token counts per sample (multi-id events, e.g. codec frames given as
    lists of ids, count each of their ids)."""
    h = np.zeros((len(samples), vocab))
    for i, s in enumerate(samples):
        ids = np.asarray(s, int).reshape(-1)
        if len(ids):
            h[i] = np.bincount(ids, minlength=vocab)[:vocab] / len(ids)
    return h


def token_tv_test(a: list[list[int]], b: list[list[int]], vocab: int, permutations: int = 200,
                  seed: int = 0) -> dict:
    """TV between the pooled token distributions of two sample sets, and its permutation
    p-value (labels of whole samples shuffled). A lossless method should not be rejected."""
    ha, hb = token_histograms(a, vocab), token_histograms(b, vocab)
    both = np.concatenate([ha, hb])
    n = len(ha)

    def tv(x, y):
        return 0.5 * np.abs(x.mean(0) - y.mean(0)).sum()

    observed = tv(ha, hb)
    rng = np.random.default_rng(seed)
    null = []
    for _ in range(permutations):
        p = rng.permutation(len(both))
        null.append(tv(both[p[:n]], both[p[n:]]))
    pval = (1 + sum(x >= observed for x in null)) / (1 + permutations)
    return dict(tv=float(observed), threshold=float(np.quantile(null, 0.99)), p_value=float(pval),
                passed=bool(pval > 0.01))


def analytic_speedup(tokens_per_step: float, t_plain_step: float, t_step: float) -> float:
    """Speedup bound from measured tokens per step and measured per-step costs: a method step
    (draft + verify) of cost t_step emits tokens_per_step tokens where plain decoding emits one
    per t_plain_step. For a draft model this is docs/METHODS.md's (1 - a^(K+1)) / ((1 - a)(K c + 1))
    with the measured acceptance and cost ratio."""
    if t_step <= 0:
        return float("nan")
    return tokens_per_step * t_plain_step / t_step


def leviathan_bound(alpha: float, k: int, c: float) -> float:
    """(1 - a^(K+1)) / ((1 - a)(K c + 1)) (docs/METHODS.md section 1)."""
    if alpha >= 1:
        return (k + 1) / (k * c + 1)
    return (1 - alpha ** (k + 1)) / ((1 - alpha) * (k * c + 1))
