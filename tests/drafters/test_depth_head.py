"""Depth heads (``mmspec.drafters.depth``): a draft head over a depth-decoder model's frames
(CSM), drawing each frame with the target's own head and depth decoder, through
TextToSpeech's method ``head``."""

from __future__ import annotations

import argparse

import pytest
import torch
from tiny_csm import tiny_csm

from mmspec.drafters import DepthDrafter, DepthHead, DraftHead, HeadConfig
from modalities.speech import TextToSpeech
from modalities.speech.csm import CsmAdapter

TEXTS = [[4, 5, 6, 7, 8], [9, 10]]


def _tts(target, head, frames=10):
    return TextToSpeech(CsmAdapter(target, max_frames=frames), head=head)


def _train(target, head, steps: int, temperature: float = 0.0):
    """The recipe's DepthRecorder on plain generations of the target, then its training."""
    from accelerate import Accelerator

    from recipes.train import draft_head as recipe

    tts = _tts(target, head, frames=12)
    batches = []
    for i in range(6):
        rec = recipe.DepthRecorder(head.config.feature_layers)
        texts = [[(3 * i + j) % 16 + 4 for j in range(2 + (i + r) % 4)] for r in range(8)]
        tts(texts, method="plain", drafter=rec, temperature=temperature, seed=i,
            progress=False, decode=False)
        batches.append(rec.batch())
    args = argparse.Namespace(lr=3e-3, steps=steps, unroll=2, seed=0, save_every=10_000,
                              out="unused")
    recipe.train(head, rec.target, batches, args, Accelerator(cpu=True))
    return head


@pytest.fixture(scope="module")
def trained():
    """A sharp tiny CSM and a head trained for it on its greedy frames, with the untrained
    head's frames per step under greedy decoding."""
    target = tiny_csm(scale=3.0)
    torch.manual_seed(0)
    head = DepthHead.for_target(target)
    before = _frames_per_step(target, head)
    return target, _train(target, head, steps=150), before


def _frames_per_step(target, head) -> float:
    out = _tts(target, head, frames=12)(TEXTS * 4, method="head", tree_depth=3, temperature=0,
                                        progress=False, decode=False)
    return out.stats.tokens_per_step


def test_training_a_depth_head_raises_its_frames_per_step(trained):
    """150 steps of the recipe's training on the target's greedy frames: the trained head's
    chain emits more frames per target step than the untrained one."""
    target, head, before = trained
    after = _frames_per_step(target, head)
    assert after > before + 0.2, (before, after)


@pytest.mark.parametrize("static", [False, True])
def test_depth_head_greedy_equals_plain(trained, static):
    """Chains of 1 and 3 frames, ragged rows (two prompt lengths, each row accepting its own
    count): plain greedy's codes, dynamic and static caches; the trained head's drafts are
    accepted, the untrained one's are not."""
    target, head, _ = trained
    torch.manual_seed(0)
    fresh = DepthHead.for_target(target)
    kw = dict(temperature=0, progress=False, static_cache=static)
    plain = _tts(target, None)(TEXTS, method="plain", **kw)
    for h in (head, fresh):
        for depth in (1, 3):
            out = _tts(target, h)(TEXTS, method="head", tree_depth=depth, **kw)
            assert all(torch.equal(a, b) for a, b in zip(out.codes, plain.codes)), depth
            assert out.stats.drafted > 0
            assert (out.stats.accepted > 0) == (h is head), (depth, out.stats.accepted)


def test_depth_head_sampling_is_the_targets_distribution():
    """Monte Carlo end to end, 20,000 rows at temperature 1: the first two frames (2
    codebooks of 4 ids: 256 outcomes) drafted by a head and verified exactly have plain
    sampling's distribution (two-sample TV within its sampling threshold); rows accept their
    own counts, so first drafts, residual samples and the depth walk after a rejected
    codebook are all exercised."""
    from stats_util import tv, tv_two_sample_threshold

    target = tiny_csm(codebooks=2, vocab=4, scale=2.0)
    torch.manual_seed(0)
    head = DepthHead.for_target(target)
    tts = _tts(target, head, frames=2)
    n, kw = 20000, dict(temperature=1.0, progress=False, decode=False)
    hists = []
    for method, seed in (("plain", 1), ("head", 2)):
        extra = dict(tree_depth=2) if method == "head" else {}
        out = tts([[4, 5, 6]] * n, method=method, seed=seed, **extra, **kw)
        codes = [c.flatten().tolist() for c in out.codes]
        # rows end at an end-of-audio frame (codebook 0 = 0): that frame and after are one
        index = [sum(v * 4 ** (3 - i) for i, v in enumerate((c + [0, 0, 0, 0])[:4]))
                 if len(c) == 4 else (c[0] * 4 + c[1] if len(c) == 2 else 0) + 256
                 for c in codes]
        hists.append(torch.bincount(torch.tensor(index), minlength=512).double().numpy() / n)
    assert 0 < out.stats.accepted < out.stats.drafted
    assert tv(*hists) < tv_two_sample_threshold(hists[0], n), (tv(*hists),
                                                               tv_two_sample_threshold(hists[0], n))


def test_depth_head_files_round_trip(tmp_path):
    target = tiny_csm()
    head = DepthHead.for_target(target)
    head.save_pretrained(tmp_path)
    back = DraftHead.from_pretrained(tmp_path, target)
    assert isinstance(back, DepthHead) and back.config == head.config
    for k, v in head.state_to_save().items():
        assert torch.equal(v, back.state_to_save()[k]), k
    assert not any(k.startswith("decoder.model.embed_tokens") for k in back.state_to_save())
    with pytest.raises(ValueError, match=r"made for 3 codebooks and a head of \[8, 16\].*"
                                         "accepted the target it was trained for"):
        back.attach(tiny_csm(codebooks=2))
    out = _tts(target, str(tmp_path))(TEXTS, method="head", tree_depth=2, temperature=0,
                                      progress=False, decode=False)
    assert out.stats.drafted > 0


def test_depth_head_refusals():
    target = tiny_csm()
    tts = _tts(target, DepthHead.for_target(target))
    with pytest.raises(ValueError, match="a depth head drafts chains"):
        tts(TEXTS, method="head", tree_branch=2, progress=False)
    with pytest.raises(ValueError, match="has no backbone_model, lm_head, depth_decoder"):
        DepthHead.for_target(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="accepted a DepthHead"):
        DepthDrafter(object())
    with pytest.raises(ValueError, match="a depth head needs codebooks"):
        DepthHead(HeadConfig(hidden_size=16, feature_layers=(1,), vocab_size=8, codebooks=3))


def test_the_recipe_fits_measures_and_describes_a_depth_head(tmp_path):
    """The recipe's path for a CSM target: collect (DepthRecorder), train, save, measure the
    chain on held-out prompts and write the card."""
    from accelerate import Accelerator

    from recipes.train import draft_head as recipe

    target = tiny_csm(scale=3.0)
    tts = _tts(target, None, frames=6)
    items = [[(i + j) % 16 + 4 for j in range(2 + i % 3)] for i in range(8)]
    source = recipe.Source("tts", tts, target, items, TEXTS, 6, tts.head_kind)
    assert source.depth and not source.frames
    args = argparse.Namespace(draft_vocab=None, feature_layers=None, target="tiny-csm",
                              out=str(tmp_path), resume=False, collect_batch=4, seed=0,
                              temperature=1.0, lr=3e-3, steps=5, unroll=2, save_every=10_000,
                              draft=None, uncond_features=False, head_layers=1,
                              arch="draft-head", init=None, freeze_output=False, export=None,
                              merged_embeds=False)
    head = recipe.fit(source, args, Accelerator(cpu=True))
    assert isinstance(DraftHead.from_pretrained(tmp_path, target), DepthHead)
    rows = recipe.measure(source, head, args)
    assert [r["method"] for r in rows] == ["plain", "head chain"]
    assert rows[1]["acceptance"] > 0 and rows[1]["steps"] < rows[0]["steps"]
    card = recipe.model_card("tiny-csm", head, rows, dict(
        modality="tts", data="shapes", samples=8, temperature=1.0, steps=5, unroll=2,
        seconds=1.0, eval=2, seed=0, device="CPU"))
    assert "DepthHead" in card and "depth decoder over 3 codebooks" in card
