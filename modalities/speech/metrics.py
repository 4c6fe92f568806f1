"""Speech metrics that need no pretrained weights: mel cepstral distortion with DTW
alignment, log-F0 RMSE and duration ratio (used by the evaluation, the demo and the training
recipes' model cards)."""

from __future__ import annotations

import math

import numpy as np


def mel_cepstral_distortion(a: np.ndarray, b: np.ndarray, sample_rate: int = 16000,
                            n_mfcc: int = 13) -> float:
    """MCD in dB between two waveforms, frames aligned by DTW (c0 excluded).

    Cepstra: DCT of natural-log mel magnitudes (40 bins, 10 ms hop, floored 160 dB under the
    loudest bin), 13 coefficients; MCD = 10 / ln 10 * sqrt(2 * sum (c_a - c_b)^2) averaged
    along the path. Values compare within this package, not with SPTK mcep-based figures."""
    import torch
    import torchaudio

    mel = torchaudio.transforms.MelSpectrogram(sample_rate=sample_rate, n_fft=512, hop_length=160,
                                               n_mels=40, power=1.0)
    dct = torchaudio.functional.create_dct(n_mfcc + 1, 40, norm="ortho")

    def cep(x):   # natural-log mel cepstrum, floored under the loudest bin
        x = np.asarray(x, np.float32)
        if len(x) < 512:        # empty or very short output: compared as silence
            x = np.pad(x, (0, 512 - len(x)))
        m = mel(torch.as_tensor(x))
        m = m.clamp_min(m.max() * 1e-8 + 1e-12)
        return (torch.log(m).T @ dct)[:, 1:].numpy()

    ca, cb = cep(a), cep(b)
    d = np.sqrt(((ca[:, None] - cb[None]) ** 2).sum(-1))
    path_cost = dtw(d)
    k = 10 / math.log(10) * math.sqrt(2)
    return float(k * path_cost)


def dtw(cost: np.ndarray) -> float:
    """Mean cost along the optimal DTW path of a [N, M] cost matrix."""
    n, m = cost.shape
    acc = np.full((n + 1, m + 1), np.inf)
    steps = np.zeros((n + 1, m + 1))
    acc[0, 0] = 0
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            choices = (acc[i - 1, j], acc[i, j - 1], acc[i - 1, j - 1])
            k = int(np.argmin(choices))
            prev = [(i - 1, j), (i, j - 1), (i - 1, j - 1)][k]
            acc[i, j] = cost[i - 1, j - 1] + choices[k]
            steps[i, j] = steps[prev] + 1
    return float(acc[n, m] / max(steps[n, m], 1))


def dtw_path(cost: np.ndarray) -> list[tuple[int, int]]:
    """The optimal DTW alignment of a [N, M] cost matrix as (i, j) pairs, start to end."""
    n, m = cost.shape
    acc = np.full((n + 1, m + 1), np.inf)
    acc[0, 0] = 0
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            acc[i, j] = cost[i - 1, j - 1] + min(acc[i - 1, j], acc[i, j - 1], acc[i - 1, j - 1])
    i, j, path = n, m, []
    while i > 0 and j > 0:
        path.append((i - 1, j - 1))
        k = int(np.argmin((acc[i - 1, j - 1], acc[i - 1, j], acc[i, j - 1])))
        i, j = (i - 1, j - 1) if k == 0 else ((i - 1, j) if k == 1 else (i, j - 1))
    return path[::-1]


def f0_track(x: np.ndarray, sample_rate: int = 16000, hop: int = 160, window: int = 640,
             fmin: float = 60.0, fmax: float = 400.0, threshold: float = 0.3) -> np.ndarray:
    """F0 in Hz per 10 ms frame (0 = unvoiced) by YIN's cumulative mean normalised difference:
    the first lag whose normalised difference dips under ``threshold`` (parabolic refinement);
    frames under 1% of the loudest frame's energy are unvoiced."""
    x = np.asarray(x, np.float64)
    lo, hi = int(sample_rate / fmax), int(sample_rate / fmin)
    if len(x) < window + hi:
        x = np.pad(x, (0, window + hi - len(x)))
    starts = range(0, len(x) - window - hi + 1, hop)
    energy = np.array([np.sum(x[s:s + window] ** 2) for s in starts])
    floor = 0.01 * energy.max() if energy.size and energy.max() > 0 else np.inf
    out = np.zeros(len(energy))
    for n, s in enumerate(starts):
        if energy[n] < floor:
            continue
        frame = x[s:s + window + hi]
        d = np.array([np.sum((frame[:window] - frame[tau:tau + window]) ** 2) for tau in range(hi + 1)])
        cmnd = np.ones_like(d)
        cmnd[1:] = d[1:] * np.arange(1, hi + 1) / np.maximum(np.cumsum(d[1:]), 1e-12)
        below = np.nonzero(cmnd[lo:hi] < threshold)[0]
        if below.size == 0:
            continue
        tau = lo + below[0]
        while tau + 1 < hi and cmnd[tau + 1] < cmnd[tau]:
            tau += 1
        a, b, c = cmnd[tau - 1], cmnd[tau], cmnd[tau + 1] if tau + 1 <= hi else cmnd[tau]
        den = a - 2 * b + c
        shift = 0.5 * (a - c) / den if abs(den) > 1e-12 else 0.0
        out[n] = sample_rate / (tau + shift)
    return out


def log_f0_rmse(a: np.ndarray, b: np.ndarray, sample_rate: int = 16000) -> float:
    """RMSE of natural-log F0 between two waveforms over frames voiced in both, frames aligned
    by DTW on mel cepstra (as in ``mel_cepstral_distortion``); NaN when no frame pair is
    voiced in both."""
    fa, fb = f0_track(a, sample_rate), f0_track(b, sample_rate)
    ca, cb = _cepstra(a, sample_rate), _cepstra(b, sample_rate)
    n = min(len(fa), len(ca))
    m = min(len(fb), len(cb))
    cost = np.sqrt(((ca[:n, None] - cb[None, :m]) ** 2).sum(-1))
    pairs = [(i, j) for i, j in dtw_path(cost) if fa[i] > 0 and fb[j] > 0]
    if not pairs:
        return float("nan")
    d = np.array([math.log(fa[i]) - math.log(fb[j]) for i, j in pairs])
    return float(np.sqrt(np.mean(d ** 2)))


def _cepstra(x, sample_rate: int = 16000, n_mfcc: int = 13) -> np.ndarray:
    import torch
    import torchaudio

    mel = torchaudio.transforms.MelSpectrogram(sample_rate=sample_rate, n_fft=512, hop_length=160,
                                               n_mels=40, power=1.0)
    dct = torchaudio.functional.create_dct(n_mfcc + 1, 40, norm="ortho")
    x = np.asarray(x, np.float32)
    if len(x) < 512:
        x = np.pad(x, (0, 512 - len(x)))
    m = mel(torch.as_tensor(x))
    m = m.clamp_min(m.max() * 1e-8 + 1e-12)
    return (torch.log(m).T @ dct)[:, 1:].numpy()


def duration_ratio(a: np.ndarray, b: np.ndarray) -> float:
    """len(a) / len(b) of two waveforms at one sample rate (generated over reference)."""
    return float(len(a) / max(len(b), 1))
