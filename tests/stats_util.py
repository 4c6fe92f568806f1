"""Statistical helpers for distribution tests (thresholds derived from the sample size)."""

from __future__ import annotations

import itertools
import math

import numpy as np
from scipy import stats


def chi_square_pvalue(counts: np.ndarray, probs: np.ndarray, min_expected: float = 5.0) -> float:
    """Pearson chi-square goodness of fit; categories with small expectation are pooled."""
    n = counts.sum()
    expected = probs * n
    order = np.argsort(expected)
    obs_b, exp_b = [], []
    acc_o = acc_e = 0.0
    for i in order:
        acc_o += counts[i]
        acc_e += expected[i]
        if acc_e >= min_expected:
            obs_b.append(acc_o)
            exp_b.append(acc_e)
            acc_o = acc_e = 0.0
    if acc_e > 0 and exp_b:
        obs_b[-1] += acc_o
        exp_b[-1] += acc_e
    obs_b, exp_b = np.array(obs_b), np.array(exp_b)
    exp_b *= obs_b.sum() / exp_b.sum()
    return float(stats.chisquare(obs_b, exp_b).pvalue)


def tv_threshold(probs: np.ndarray, n: int, delta: float = 1e-6) -> float:
    """An upper bound for the TV between an n-sample histogram and ``probs``.

    E[TV] <= 0.5 * sum_i sqrt(p_i (1 - p_i) / n) (Jensen), plus the McDiarmid deviation
    sqrt(log(1/delta) / (2n)) since one sample moves the TV by at most 1/n.
    """
    mean = 0.5 * np.sum(np.sqrt(probs * (1 - probs) / n))
    return float(mean + math.sqrt(math.log(1 / delta) / (2 * n)))


def tv_two_sample_threshold(probs: np.ndarray, n: int, delta: float = 1e-6) -> float:
    """Threshold for the TV between two independent n-sample histograms of ``probs``."""
    mean = 0.5 * np.sum(np.sqrt(2 * probs * (1 - probs) / n))
    return float(mean + math.sqrt(math.log(1 / delta) / n))


def tv(a: np.ndarray, b: np.ndarray) -> float:
    return float(0.5 * np.abs(a - b).sum())


def energy_test_pvalue(x, y, permutations: int = 400, seed: int = 0) -> float:
    """Two-sample energy-distance permutation test (Szekely & Rizzo): the p-value of
    E = 2 E|X-Y| - E|X-X'| - E|Y-Y'| among ``permutations`` relabellings of the pooled sample.
    The smallest attainable p-value is 1 / (permutations + 1)."""
    import torch

    x = torch.as_tensor(np.asarray(x), dtype=torch.float64).reshape(len(x), -1)
    y = torch.as_tensor(np.asarray(y), dtype=torch.float64).reshape(len(y), -1)
    z = torch.cat([x, y])
    d = torch.cdist(z, z)
    n, m = len(x), len(y)
    g = torch.Generator().manual_seed(seed)
    labels = [torch.cat([torch.ones(n), torch.zeros(m)]).double()]
    for _ in range(permutations):
        labels.append(labels[0][torch.randperm(n + m, generator=g)])
    u = torch.stack(labels, 1)                                   # [N, P+1] membership of X
    v = 1 - u
    du, dv = d @ u, d @ v
    xy = (u * dv).sum(0) / (n * m)
    xx = (u * du).sum(0) / (n * n)
    yy = (v * dv).sum(0) / (m * m)
    stat = 2 * xy - xx - yy
    return float(((stat[1:] >= stat[0]).sum() + 1) / (permutations + 1))


def continuation_distribution(model, prompt: list[int], m: int, temperature: float):
    """Exact distribution of the m-token continuation, by enumerating all V^m sequences."""
    import torch

    v = model.config.vocab_size
    seqs = torch.tensor(list(itertools.product(range(v), repeat=m)))
    ids = torch.cat([torch.tensor(prompt).expand(len(seqs), -1), seqs], 1)
    with torch.no_grad():
        logits = model(ids).logits.double()[:, len(prompt) - 1 : -1] / temperature
    logp = torch.log_softmax(logits, -1).gather(-1, seqs[..., None]).squeeze(-1).sum(-1)
    return logp.exp().numpy()
