"""Frame-level exactness for multi-codebook events: analytic (float64 enumeration) and
Monte Carlo through Frame.__call__."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from mmspec.acceptance import Exact, Frame
from stats_util import chi_square_pvalue


def rand(shape, g, zeros=False):
    w = torch.rand(*shape, generator=g, dtype=torch.float64) ** 2
    if zeros:
        w = w * (torch.rand(*shape, generator=g, dtype=torch.float64) > 0.3)
        w[..., 0] += 1e-3
    return w / w.sum(-1, keepdim=True)


@pytest.mark.parametrize("codebooks,v,zeros", [(2, 5, False), (3, 4, False), (2, 6, True)])
def test_frame_emitted_distribution_is_exact(codebooks, v, zeros):
    """One draft frame (K = 1): enumerate the draft frame, which codebook rejects first, and
    every recovered / fresh / bonus value; the first emitted frame must be prod_c p_c."""
    g = torch.Generator().manual_seed(codebooks * 10 + v)
    p = rand((1, 2, codebooks, v), g, zeros)
    q = rand((1, 1, codebooks, v), g, zeros)
    rule = Frame()
    frames = list(itertools.product(range(v), repeat=codebooks))
    x = torch.tensor(frames)[:, None, :]                                    # [F, 1, C]
    a = rule.accept_probs(x, p[:, :1].expand(len(frames), -1, -1, -1),
                          q.expand(len(frames), -1, -1, -1))[:, 0]          # [F, C]
    res = rule.residuals(x[:, 0], p[:, 0].expand(len(frames), -1, -1),
                         q[:, 0].expand(len(frames), -1, -1), torch.zeros(len(frames), dtype=torch.long))
    out = np.zeros((v,) * codebooks)
    for f, frame in enumerate(frames):
        wq = float(np.prod([q[0, 0, c, frame[c]] for c in range(codebooks)]))
        if wq == 0:
            continue
        out[frame] += wq * float(a[f].prod())                               # accepted
        for cs in range(codebooks):                                         # first rejection at cs
            w = wq * float(a[f, :cs].prod()) * (1 - float(a[f, cs]))
            if w == 0:
                continue
            for y in itertools.product(range(v), repeat=codebooks - cs):
                val = w * float(res[f, cs, y[0]])
                for i, yc in enumerate(y[1:]):
                    val *= float(p[0, 0, cs + 1 + i, yc])
                out[tuple(frame[:cs]) + y] += val
    want = np.ones((v,) * codebooks)
    for c in range(codebooks):
        shape = [1] * codebooks
        shape[c] = v
        want = want * p[0, 0, c].numpy().reshape(shape)
    assert np.abs(out - want).max() < 1e-12


def test_frame_call_monte_carlo():
    g = torch.Generator().manual_seed(0)
    c, v, n = 2, 4, 100_000
    p = rand((1, 3, c, v), g)
    q = rand((1, 2, c, v), g)
    x = torch.stack([torch.multinomial(q[0, :, i], n, replacement=True, generator=g).T
                     for i in range(c)], -1)                               # [n, 2, C]
    out = Frame()(x, q.expand(n, -1, -1, -1), p.expand(n, -1, -1, -1), g)
    first = out.tokens[:, 0]                                                 # [n, C]
    code = (first[:, 0] * v + first[:, 1]).numpy()
    counts = np.bincount(code, minlength=v * v).astype(float)
    want = (p[0, 0, 0][:, None] * p[0, 0, 1][None]).reshape(-1).numpy()
    assert chi_square_pvalue(counts, want) > 1e-4
    # and it fails for a broken residual (fresh draw from p instead)

    class Broken(Exact):
        def residual(self, x, p, q, pos):
            return p
    bad = Frame(rules=[Broken()])(x, q.expand(n, -1, -1, -1), p.expand(n, -1, -1, -1),
                                  torch.Generator().manual_seed(1))
    bc = bad.tokens[:, 0]
    counts = np.bincount((bc[:, 0] * v + bc[:, 1]).numpy(), minlength=v * v).astype(float)
    assert chi_square_pvalue(counts, want) < 1e-4


def test_frame_shape_errors():
    with pytest.raises(ValueError, match=r"\[B, K, C\]"):
        Frame()(torch.zeros(1, 2, dtype=torch.long), None, torch.full((1, 3, 4), 0.25))
    with pytest.raises(ValueError, match="2 rules for 3 codebooks"):
        Frame(rules=[Exact(), Exact()])(torch.zeros(1, 1, 3, dtype=torch.long), None,
                                        torch.full((1, 2, 3, 4), 0.25))
