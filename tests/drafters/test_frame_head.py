"""Frame heads (``mmspec.drafters.frame``): a draft head over a delay-pattern decoder's
frames, through TextToSpeech's method ``head``."""

from __future__ import annotations

import pytest
import torch
from tiny_speech import tiny_musicgen

from mmspec.drafters import DraftHead, FrameDrafter, FrameHead
from modalities.speech import TextToSpeech

TEXTS = [[3, 4, 5, 6, 7], [8, 9]]


@pytest.mark.parametrize("pad_outside", [False, True])
@pytest.mark.parametrize("guidance", [None, 3.0])
def test_frame_head_greedy_equals_plain(pad_outside, guidance):
    """An untrained frame head, chains of 1 and 3 frames: plain greedy's codes (both pad
    layouts, with and without guidance)."""
    target = tiny_musicgen(pad_outside=pad_outside)
    torch.manual_seed(0)
    tts = TextToSpeech.from_pretrained(target, head=FrameHead.for_target(target))
    kw = dict(temperature=0, max_frames=12, progress=False, guidance_scale=guidance)
    plain = tts(TEXTS, method="plain", **kw)
    for depth in (1, 3):
        out = tts(TEXTS, method="head", tree_depth=depth, **kw)
        assert all(torch.equal(a, b) for a, b in zip(out.codes, plain.codes)), depth
        assert out.stats.drafted > 0


def test_frame_head_sampling_is_the_targets_distribution():
    """Monte Carlo end to end, 20,000 rows at temperature 1: the first two frames (4 codes,
    ids 0..4 with the pad id: 625 outcomes) drafted by an untrained head and verified exactly
    have plain sampling's distribution (two-sample TV within its sampling threshold; a drafter
    that drafts code 0 while reporting q gives TV 0.97). The rows of a delay-pattern call
    commit one count, here each step's first frame: a row's first draft when it accepted it,
    else the residual's sample, so both paths are exercised."""
    from stats_util import tv, tv_two_sample_threshold

    target = tiny_musicgen(codebook_size=4)
    torch.manual_seed(0)
    tts = TextToSpeech.from_pretrained(target, head=FrameHead.for_target(target))
    n, kw = 20000, dict(temperature=1.0, max_frames=2, progress=False, decode=False)
    hists = []
    for method, seed in (("plain", 1), ("head", 2)):
        out = tts([TEXTS[0]] * n, method=method, tree_depth=3, seed=seed, **kw) \
            if method == "head" else tts([TEXTS[0]] * n, method=method, seed=seed, **kw)
        codes = torch.stack(out.codes).reshape(n, 4)                    # [n, 2 frames x 2]
        index = (codes * torch.tensor([125, 25, 5, 1])).sum(1)         # ids 0..4 (4: pad)
        hists.append(torch.bincount(index, minlength=625).double().numpy() / n)
    assert out.stats.drafted > 0
    assert tv(*hists) < tv_two_sample_threshold(hists[0], n)


def test_frame_head_q_follows_the_pattern(monkeypatch):
    """The head's q is forced as the target's p: pad before each codebook's delay (a point
    mass there), real codes after it; a sampled call runs and its drafts are accepted at
    times."""
    target = tiny_musicgen()
    torch.manual_seed(0)
    head = FrameHead.for_target(target)
    tts = TextToSpeech.from_pretrained(target, head=head)
    seen = []
    propose = FrameDrafter.propose

    def spy(self, last, k_max, active=None):
        d = propose(self, last, k_max, active)
        seen.append((self.target.length, d.probs))
        return d

    monkeypatch.setattr(FrameDrafter, "propose", spy)
    out = tts(TEXTS, method="head", tree_depth=3, max_frames=12, progress=False, seed=0)
    start, q = seen[0]                              # the first step: the start frame fed
    assert start == 0 and q.shape[1:3] == (3, 2)
    pad = 16
    assert torch.equal(q[:, 0, 1, pad], torch.ones(2))     # codebook 1 waits one step
    assert (q[:, 0, 1, :pad] == 0).all() and (q[:, 1:, :, :pad].sum(-1) > 0).all()
    assert out.stats.accepted > 0


def test_frame_head_files_round_trip(tmp_path):
    target = tiny_musicgen()
    head = FrameHead.for_target(target)
    head.save_pretrained(tmp_path)
    back = DraftHead.from_pretrained(tmp_path, target)
    assert isinstance(back, FrameHead) and back.config == head.config
    for k, v in head.state_to_save().items():
        assert torch.equal(v, back.state_to_save()[k]), k
    with pytest.raises(ValueError, match=r"made for 2 codebook heads of \[17, 16\].*accepted "
                                         "the target it was trained for"):
        back.attach(tiny_musicgen(codebooks=3))


def test_frame_head_refusals():
    target = tiny_musicgen()
    head = FrameHead.for_target(target)
    tts = TextToSpeech.from_pretrained(target, head=head)
    with pytest.raises(ValueError, match="a frame head drafts chains"):
        tts(TEXTS, method="head", tree_branch=2, max_frames=4, progress=False)
    with pytest.raises(ValueError, match="has no lm_heads"):
        FrameHead.for_target(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="accepted a FrameHead"):
        FrameDrafter(object())


def test_the_head_kind_is_the_adapters_declaration():
    """A delay-pattern front door declares frame heads (its adapter's ``head_kind``) and
    ``head_for_target`` makes the kind it is told, probing nothing: a token head on it, an
    EAGLE-3 head and an unknown kind are refused by name."""
    from mmspec.drafters import HEAD_KINDS, head_for_target

    target = tiny_musicgen()
    tts = TextToSpeech.from_pretrained(target)
    assert tts.head_kind == "frame" and set(HEAD_KINDS) == {"token", "frame", "depth"}
    assert type(head_for_target(target, kind=tts.head_kind)) is FrameHead
    with pytest.raises(ValueError, match="multi-codebook"):
        head_for_target(target)                      # told "token": its tables refuse it
    with pytest.raises(ValueError, match="arch='eagle3'.*multi-codebook"):
        head_for_target(target, arch="eagle3", kind="frame")
    with pytest.raises(ValueError, match="kind='codec': accepted one of token, frame, depth"):
        head_for_target(target, kind="codec")


def test_training_a_frame_head_raises_its_frames_per_step():
    """A tiny sharp delay-pattern target, its greedy generations recorded by the recipe's
    FrameRecorder, 150 steps of the recipe's training: the trained head's chain emits more
    frames per target step than the untrained one."""
    import argparse

    from accelerate import Accelerator

    from recipes.train import draft_head as recipe

    target = tiny_musicgen()
    with torch.no_grad():
        for h in target.decoder.lm_heads:
            h.weight.mul_(4.0)
    torch.manual_seed(0)
    head = FrameHead.for_target(target)
    tts = TextToSpeech.from_pretrained(target, head=head)
    kw = dict(temperature=0, max_frames=16, progress=False, decode=False)

    def frames_per_step():
        return tts(TEXTS * 4, method="head", tree_depth=3, **kw).stats.tokens_per_step

    batches = []
    for i in range(6):
        rec = recipe.FrameRecorder(head.config.feature_layers)
        texts = [[(3 * i + j) % 30 + 1 for j in range(4 + i % 3)] for _ in range(1)] + TEXTS
        tts(texts * 4, method="plain", drafter=rec, **kw)
        batches.append(rec.batch())
    template = rec.target
    template.eos_step = torch.full((1,), 1 << 30, dtype=torch.long)
    before = frames_per_step()
    args = argparse.Namespace(lr=3e-3, steps=150, unroll=2, seed=0, save_every=10_000,
                              out="unused")
    recipe.train(head, template, batches, args, Accelerator(cpu=True))
    after = frames_per_step()
    assert after > before + 0.3, (before, after)


def test_the_recipe_measures_a_frame_head_chain():
    """The recipe's measure on a delay-pattern target: plain, the head's chain (no tree) and
    the draft model's chain (here the target itself: the exact rule accepts every frame), each
    held-out prompt its own call; the card names the draft."""
    import argparse

    from recipes.train import draft_head as recipe

    target = tiny_musicgen()
    torch.manual_seed(0)
    head = FrameHead.for_target(target)
    tts = TextToSpeech.from_pretrained(target, draft=target, head=head)
    source = recipe.Source("tts", tts, target, [], TEXTS, 6, tts.head_kind)
    assert source.frames and not source.depth
    args = argparse.Namespace(seed=0, temperature=1.0, draft="the-target")
    rows = recipe.measure(source, head, args)
    assert [r["method"] for r in rows] == ["plain", "head chain", "draft model, K = 4"]
    assert rows[0]["tokens_per_step"] == 1.0 and rows[1]["acceptance"] > 0
    assert rows[1]["steps"] < rows[0]["steps"]
    assert rows[2]["acceptance"] == 1.0 and rows[2]["steps"] < rows[0]["steps"]
    trained = dict(modality="tts", data="shapes", samples=1, temperature=1.0, steps=1, unroll=1,
                   seconds=1.0, device="CPU", eval=len(TEXTS), seed=0, draft="the-target")
    card = recipe.model_card("t", head, rows, trained)
    assert "the draft model `the-target`" in " ".join(card.split())
    assert "| draft model, K = 4 | " in card
