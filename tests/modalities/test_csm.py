"""Depth-decoder frames (CSM): the DepthFrame rule analytically and by Monte Carlo on tabulated
conditionals, and end to end on a tiny CsmForConditionalGeneration."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from mmspec.acceptance import DepthFrame
from modalities.speech import TextToSpeech
from modalities.speech.csm import CsmAdapter
from stats_util import chi_square_pvalue
from tiny_csm import tiny_csm


def rand(shape, g):
    w = torch.rand(*shape, generator=g, dtype=torch.float64) ** 2 + 0.02
    return w / w.sum(-1, keepdim=True)


class Tables:
    """Autoregressive frame conditionals from tables (the same at every position):
    cond[c] has shape [V]*c + [V]: p(x_c | x_<c)."""

    def __init__(self, cond, batch_shape):
        self.cond, self.codebooks = cond, len(cond)
        self.batch_shape = torch.Size(batch_shape)

    def probs(self, prefix):
        return self.cond[len(prefix)][tuple(prefix)] if prefix else self.cond[0]

    def along(self, x):
        b, k, c = x.shape
        out = torch.empty(b, k, c, self.cond[0].shape[-1], dtype=torch.float64)
        for i, j in itertools.product(range(b), range(k)):
            for cc in range(c):
                out[i, j, cc] = self.probs(x[i, j, :cc].tolist())
        return out

    def complete(self, pos, frame, first_free, generator=None):
        frame = frame.clone()
        for i in range(frame.shape[0]):
            for cc in range(self.codebooks):
                if cc >= int(first_free[i]):
                    p = self.probs(frame[i, :cc].tolist())
                    frame[i, cc] = torch.multinomial(p, 1, generator=generator)[0]
        return frame

    def joint(self):
        v = self.cond[0].shape[-1]
        out = np.zeros((v,) * self.codebooks)
        for y in itertools.product(range(v), repeat=self.codebooks):
            out[y] = np.prod([float(self.probs(list(y[:c]))[y[c]]) for c in range(self.codebooks)])
        return out


def tables(c, v, g):
    return [rand((v,) * i + (v,), g) for i in range(c)]


@pytest.mark.parametrize("codebooks,v", [(2, 4), (3, 3)])
def test_depth_frame_emitted_distribution_is_exact_analytically(codebooks, v):
    """One draft frame: enumerate the draft frame (q's joint), the first rejected codebook and
    the residual / fresh values; the emitted frame must have the target's joint, float64."""
    g = torch.Generator().manual_seed(codebooks * 7 + v)
    p, q = Tables(tables(codebooks, v, g), (1, 2)), Tables(tables(codebooks, v, g), (1, 1))
    rule = DepthFrame()
    out = np.zeros((v,) * codebooks)
    for x in itertools.product(range(v), repeat=codebooks):
        xt = torch.tensor(x)[None, None]
        pa, qa = p.along(xt), q.along(xt)                                   # [1, 1, C, V]
        a = rule.accept_probs(xt, pa, qa)[0, 0]                             # [C]
        res = rule.residuals(xt[:, 0], pa[:, 0], qa[:, 0], torch.zeros(1, dtype=torch.long))[0]
        wq = float(np.prod([float(qa[0, 0, c, x[c]]) for c in range(codebooks)]))
        out[x] += wq * float(a.prod())
        for cs in range(codebooks):
            w = wq * float(a[:cs].prod()) * (1 - float(a[cs]))
            if w == 0:
                continue
            for y in itertools.product(range(v), repeat=codebooks - cs):
                frame = list(x[:cs]) + list(y)
                val = w * float(res[cs, y[0]])
                for c2 in range(cs + 1, codebooks):                        # fresh, given the new prefix
                    val *= float(p.probs(frame[:c2])[frame[c2]])
                out[tuple(frame)] += val
    assert np.abs(out - p.joint()).max() < 1e-12


def test_depth_frame_monte_carlo_through_the_rule():
    g = torch.Generator().manual_seed(3)
    c, v, k, n = 2, 3, 2, 6000
    pt, qt = tables(c, v, g), tables(c, v, g)
    p, q = Tables(pt, (n, k + 1)), Tables(qt, (1, 1))
    drafts = torch.zeros(n, k, c, dtype=torch.long)
    for i in range(n):
        for j in range(k):
            drafts[i, j] = q.complete(torch.zeros(1, dtype=torch.long), torch.zeros(1, c, dtype=torch.long),
                                      torch.zeros(1, dtype=torch.long), g)[0]
    qprobs = Tables(qt, (n, k)).along(drafts)
    out = DepthFrame()(drafts, qprobs, p, g)
    first = out.tokens[:, 0]
    codes = (first[:, 0] * v + first[:, 1]).numpy()
    counts = np.bincount(codes, minlength=v * v)
    assert chi_square_pvalue(counts, p.joint().reshape(-1)) > 1e-3
    assert 0 < out.num_accepted.float().mean() < k


@pytest.fixture(scope="module")
def csm_pair():
    target = tiny_csm(scale=3.0)
    draft = tiny_csm(scale=3.0)                          # a perturbed copy: acceptance in (0, 1)
    with torch.no_grad():
        for prm in draft.parameters():
            prm.add_(0.3 * torch.randn_like(prm) * prm.abs().mean())
    return target, draft


TEXTS = [[4, 5, 6, 7, 8], [9, 10]]


def test_csm_speculative_greedy_equals_plain_greedy(csm_pair):
    target, draft = csm_pair
    tts = TextToSpeech(CsmAdapter(target, max_frames=10), CsmAdapter(draft, max_frames=10))
    plain = tts(TEXTS, temperature=0, progress=False)
    for k in (1, 3):
        spec = tts(TEXTS, method="exact", temperature=0, num_draft_tokens=k, progress=False)
        assert all(torch.equal(a, b) for a, b in zip(plain.codes, spec.codes))
    assert 0 < spec.stats.accepted and spec.stats.steps < plain.stats.steps
    self_tts = TextToSpeech(CsmAdapter(target, max_frames=10), CsmAdapter(target, max_frames=10))
    same = self_tts(TEXTS, method="exact", temperature=0, num_draft_tokens=3, progress=False)
    assert same.stats.acceptance_rate == 1.0
    assert all(torch.equal(a, b) for a, b in zip(plain.codes, same.codes))
    assert plain.sample_rate == 24000 and all(len(w) > 0 for w in plain.waveforms)


def test_csm_static_caches_give_the_dynamic_frames(csm_pair):
    """The backbone on a static cache (what compile=True captures), draft steps synchronised
    and queued ahead: the dynamic-cache frames under greedy decoding."""
    target, draft = csm_pair
    tts = TextToSpeech(CsmAdapter(target, max_frames=10), CsmAdapter(draft, max_frames=10))
    plain = tts(TEXTS, temperature=0, progress=False)
    assert all(torch.equal(a, b) for a, b in
               zip(plain.codes, tts(TEXTS, temperature=0, progress=False, static_cache=True).codes))
    for k in (1, 3):
        for pipeline in (None, True):
            spec = tts(TEXTS, method="exact", temperature=0, num_draft_tokens=k, progress=False,
                       static_cache=True, pipeline=pipeline)
            assert all(torch.equal(a, b) for a, b in zip(plain.codes, spec.codes)), (k, pipeline)


def test_csm_exact_sampling_matches_the_target_frame_distribution():
    target = tiny_csm(codebooks=2, vocab=4, scale=2.0)
    draft = tiny_csm(seed=1, codebooks=2, vocab=4, hidden=8, scale=2.0)
    n = 3000
    tts = TextToSpeech(CsmAdapter(target, max_frames=3), CsmAdapter(draft, max_frames=3))
    out = tts([[4, 5, 6]] * n, method="exact", num_draft_tokens=2, seed=0, progress=False,
              decode=False)
    assert out.stats.accepted > 0 and out.stats.accepted < out.stats.drafted
    # Exact joint of the first frame: the target's conditionals at the prompt, enumerated.
    from mmspec.sampling import SamplingParams
    from modalities.speech.csm import CsmSession

    s = CsmSession(target, SamplingParams(temperature=1.0))
    ids = torch.tensor([[4, 5, 6]])
    s.prefill(ids, torch.ones_like(ids))
    f = s.step(torch.zeros(1, 1, 2, dtype=torch.long))
    frames = torch.tensor(list(itertools.product(range(4), repeat=2)))
    with torch.no_grad():
        fd = type(f)(target, f.h.expand(len(frames), 1, -1), f.params)
        pa = fd.along(frames[:, None])[:, 0]                                   # [16, 2, V]
    want = pa.gather(-1, frames[..., None]).squeeze(-1).prod(-1).double().numpy()
    firsts = [tuple(c[0].tolist()) for c in out.codes if len(c)]
    # A first frame whose codebooks but the last are end-of-audio (0, b) ends its row before
    # any code is returned: those frames are one category.
    counts = np.zeros(16)
    for a, b in firsts:
        counts[a * 4 + b] += 1
    counts[0] += n - len(firsts)
    want = want / want.sum()
    want[0] = want[:4].sum()
    keep = [0] + list(range(4, 16))
    assert chi_square_pvalue(counts[keep], want[keep]) > 1e-3


def test_csm_bad_input(csm_pair):
    target, _ = csm_pair
    with pytest.raises(ValueError, match="codebooks"):
        TextToSpeech(CsmAdapter(target), CsmAdapter(tiny_csm(codebooks=2)))
    tts = TextToSpeech(CsmAdapter(target))
    with pytest.raises(ValueError, match="guidance_scale"):
        tts(TEXTS, guidance_scale=2.0, progress=False)
    with pytest.raises(ValueError, match="Jacobi windows over depth-decoder frames"):
        tts(TEXTS, method="sjd", progress=False)
    with pytest.raises(ValueError, match="non-empty"):
        tts([[]], progress=False)


def test_csm_rows_stop_at_their_first_end_of_audio_frame():
    model = tiny_csm()
    bump = lambda mod, inp, out: out + torch.nn.functional.one_hot(  # noqa: E731
        torch.tensor(0), out.shape[-1]).to(out.dtype) * 50.0
    model.lm_head.register_forward_hook(bump)
    model.depth_decoder.codebooks_head.register_forward_hook(bump)
    tts = TextToSpeech(CsmAdapter(model, max_frames=10), CsmAdapter(model, max_frames=10))
    for method in ("plain", "exact"):
        out = tts(TEXTS, method=method, temperature=0, progress=False)
        assert out.stats.steps == 1                       # the first frame is all end-of-audio
        assert all(len(c) == 0 for c in out.codes)


def test_incremental_depth_walk_matches_teacher_forced_conditionals():
    """The draft's frame walk (depth decoder on its cache) and the rule's teacher-forced
    pass give the same conditionals along the same frame."""
    from mmspec.sampling import SamplingParams
    from modalities.speech.csm import FrameDistribution

    model = tiny_csm(codebooks=4, scale=2.0)
    h = torch.randn(5, 1, model.config.hidden_size)
    fd = FrameDistribution(model, h, SamplingParams(temperature=1.0))
    with torch.no_grad():
        frame, probs = fd[:, 0].draw(torch.Generator().manual_seed(0))
        forced = fd.along(frame[:, None])[:, 0]
    assert torch.allclose(probs, forced, atol=1e-5)
