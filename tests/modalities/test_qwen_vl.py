"""Qwen-VL targets (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5): 3-D rotary positions through
the loop, and Qwen3.5's linear-attention layers rolled back by snapshot and replay.

Tiny float32 models whose weights are large enough that wrong positions change the argmax
(positions planned without the row's rope delta fail these tests). Greedy: speculative =
plain = the model's own ``generate``, K in {1, 3, 8}, static and dynamic caches, a batch of
three images of different sizes (different numbers of visual tokens, left-padded), image,
text and Jacobi drafts, and video inputs. Sampling: the first two tokens under exact
speculative decoding against the model's own joint distribution of them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from modalities.vlm import VisionLanguageGenerator
from stats_util import chi_square_pvalue
from tiny_vlm import (QWEN_KINDS, QWEN_WORDS, own_tokens as _own, qwen_pairs as _pairs,
                      tiny_qwen_processor, tiny_qwen_vl, tiny_text_lm)

KINDS = list(QWEN_KINDS)
@pytest.fixture(scope="module", params=KINDS)
def qwen(request):
    kind = request.param
    target = tiny_qwen_vl(kind)
    draft = tiny_qwen_vl(kind, seed=1, layers=1)
    return kind, target, draft, tiny_qwen_processor(kind)


def test_plain_greedy_equals_the_models_own_generate_on_a_ragged_batch(qwen):
    _, target, _, proc = qwen
    ims, msgs = _pairs()
    gen = VisionLanguageGenerator(target, proc)
    batch = gen.encode(ims, msgs)
    assert len(set(batch["attention_mask"].sum(1).tolist())) > 1     # ragged, left-padded
    plain = gen.generate(ims, msgs, method="plain", temperature=0, max_new_tokens=10)
    assert plain.token_ids == _own(gen, target, ims, msgs, 10)


@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("static", [False, True])
def test_speculative_greedy_equals_plain_greedy(qwen, k, static):
    _, target, draft, proc = qwen
    ims, msgs = _pairs()
    plain = VisionLanguageGenerator(target, proc).generate(ims, msgs, method="plain",
                                                           temperature=0, max_new_tokens=12)
    image = VisionLanguageGenerator(target, proc, draft, "image")
    text = VisionLanguageGenerator(target, proc, tiny_text_lm(vocab=len(QWEN_WORDS)), "text")
    for gen, method, knob in ((image, "exact", "num_draft_tokens"),
                              (text, "exact", "num_draft_tokens"), (image, "sjd", "window")):
        out = gen.generate(ims, msgs, method=method, temperature=0, max_new_tokens=12, seed=0,
                           static_cache=static, **{knob: k})
        assert out.token_ids == plain.token_ids, (method, gen.draft_mode)


def test_each_row_equals_its_single_row_run(qwen):
    _, target, draft, proc = qwen
    ims, msgs = _pairs()
    gen = VisionLanguageGenerator(target, proc, draft, "image")
    both = gen.generate(ims, msgs, method="exact", temperature=0, max_new_tokens=10).token_ids
    alone = [gen.generate([i], [m], method="exact", temperature=0,
                          max_new_tokens=10).token_ids[0] for i, m in zip(ims, msgs)]
    assert both == alone


def test_the_positions_matter():
    """Without the rope delta (1-D positions on every axis) the tokens differ from the
    model's own: the tests above would catch a session that dropped it."""
    from modalities.vlm.mrope import MRopeSession

    target, proc = tiny_qwen_vl("qwen2-vl"), tiny_qwen_processor("qwen2-vl")
    ims, msgs = _pairs(2)
    gen = VisionLanguageGenerator(target, proc)
    own = _own(gen, target, ims, msgs, 10)
    original = MRopeSession.position_ids
    try:
        MRopeSession.position_ids = lambda self, pos, prompt=False: (
            self._prompt_pos if prompt else pos)
        wrong = gen.generate(ims, msgs, method="plain", temperature=0, max_new_tokens=10)
    finally:
        MRopeSession.position_ids = original
    assert wrong.token_ids != own


@pytest.mark.parametrize("kind", ["qwen2-vl", "qwen3-vl"])
def test_video_inputs_through_processor_outputs(kind):
    target, proc = tiny_qwen_vl(kind, seed=2), tiny_qwen_processor(kind)
    video = np.random.default_rng(1).integers(0, 255, (4, 32, 32, 3), dtype=np.uint8)
    msgs = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "a"}]}]
    text = proc.apply_chat_template(msgs, add_generation_prompt=True)
    batch = proc(text=[text], videos=[video], return_tensors="pt", do_sample_frames=False)
    gen = VisionLanguageGenerator(target, proc, tiny_qwen_vl(kind, seed=1, layers=1), "image")
    plain = gen.generate(**batch, method="plain", temperature=0, max_new_tokens=8).token_ids
    own = target.generate(**batch, do_sample=False, max_new_tokens=8)
    assert plain == [own[0, batch["input_ids"].shape[1]:].tolist()]
    for method in ("exact", "sjd"):
        assert gen.generate(**batch, method=method, temperature=0, max_new_tokens=8,
                            seed=0).token_ids == plain, method


def _histogram(rows, v, pooled):
    """Joint frequencies of the first two tokens; after a first token in ``pooled`` (the end
    token, the vision tokens) the second slot is one category, "any"."""
    keys = [r[0] * (v + 1) + (r[1] if len(r) > 1 and r[0] not in pooled else v) for r in rows]
    return np.bincount(keys, minlength=v * (v + 1)) / len(rows)


def _joint(target, one, v, pooled):
    """The model's own joint distribution of the first two tokens, float64, in
    ``_histogram``'s categories: p(t1) from the prompt, p(t2 | t1) from the prompt and t1 (one
    forward of v rows, no cache; a vision token cannot follow the image as text, so its row is
    pooled)."""
    width = one["input_ids"].shape[1]
    t1 = torch.tensor([0 if t in pooled else t for t in range(v)])[:, None]
    with torch.no_grad():
        p1 = torch.softmax(target(**one).logits[0, -1].double(), -1)
        rows = {k: t.repeat(v, *[1] * (t.dim() - 1)) for k, t in one.items()}
        for k, t in rows.items():                 # per-position inputs gain the column of t1
            if t.dim() == 2 and t.shape[1] == width:
                col = {"input_ids": t1, "attention_mask": torch.ones_like(t1)}.get(k, 0 * t1)
                rows[k] = torch.cat([t, col.to(t.dtype)], 1)
        p2 = torch.softmax(target(**rows).logits[:, -1].double(), -1)
    joint = torch.zeros(v, v + 1, dtype=torch.float64)
    joint[:, :v] = p1[:, None] * p2
    for t in pooled:
        joint[t] = 0
        joint[t, v] = p1[t]
    return joint.flatten().numpy()


@pytest.mark.parametrize("kind", ["qwen2-vl", "qwen3.5"])
def test_exact_sampling_matches_the_models_own_sampling(kind):
    """The first two tokens of 20,000 rows under exact speculative sampling against the
    model's own joint distribution of them (computed by its forward): chi-square goodness of
    fit. With the residual replaced by p the same check gives p-values near 1e-75."""
    target, proc = tiny_qwen_vl(kind), tiny_qwen_processor(kind)
    draft = tiny_text_lm(vocab=len(QWEN_WORDS))
    with torch.no_grad():       # many pairs show up, and one draft in five is rejected
        target.lm_head.weight.mul_(0.3)
        draft.lm_head.weight.mul_(0.3)
    ims, msgs = _pairs(1)
    gen = VisionLanguageGenerator(target, proc, draft, "text")
    one, n, v = gen.encode(ims, msgs), 20_000, len(QWEN_WORDS)
    cfg = target.config
    pooled = {2, cfg.image_token_id, cfg.video_token_id, cfg.vision_start_token_id,
              cfg.vision_end_token_id}
    joint = _joint(target, one, v, pooled)
    batch = {k: t.repeat(n, *[1] * (t.dim() - 1)) for k, t in one.items()}
    exact = gen.generate(**batch, method="exact", seed=2, max_new_tokens=2, num_draft_tokens=2)
    assert exact.stats.acceptance_rate > 0.05
    assert chi_square_pvalue(_histogram(exact.token_ids, v, pooled) * n, joint) > 1e-4


def test_mismatched_families_are_refused_before_any_work():
    from tiny_vlm import tiny_llava

    target, proc = tiny_qwen_vl("qwen2-vl"), tiny_qwen_processor("qwen2-vl")
    with pytest.raises(ValueError, match="family"):
        VisionLanguageGenerator(target, proc, tiny_llava(), "image")


def test_video_to_a_draft_that_cannot_read_it_is_refused_before_any_work():
    """Processor outputs (a video) reach an image draft only through the target's processor:
    a draft with its own processor is refused, naming what is accepted."""
    target, proc = tiny_qwen_vl("qwen2-vl"), tiny_qwen_processor("qwen2-vl")
    gen = VisionLanguageGenerator(target, proc, tiny_qwen_vl("qwen2-vl", seed=1, layers=1),
                                  "image", draft_processor=tiny_qwen_processor("qwen2-vl"))
    video = np.zeros((4, 32, 32, 3), dtype=np.uint8)
    msgs = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "a"}]}]
    batch = proc(text=[proc.apply_chat_template(msgs, add_generation_prompt=True)],
                 videos=[video], return_tensors="pt", do_sample_frames=False)
    with pytest.raises(ValueError, match="accepted images and prompts"):
        gen.generate(**batch, method="exact", temperature=0, max_new_tokens=4)


def test_the_ensemble_draft_reads_qwen_positions(qwen):
    """The ensemble stacks image + text and text-only prompts as one draft batch: its token
    types and 3-D positions follow from the stacked ids (the target as its own draft: the
    image block agrees with it, the mixture still accepts most drafts)."""
    _, target, _, proc = qwen
    ims, msgs = _pairs()
    plain = VisionLanguageGenerator(target, proc).generate(ims, msgs, method="plain",
                                                           temperature=0, max_new_tokens=10)
    out = VisionLanguageGenerator(target, proc, target, "ensemble").generate(
        ims, msgs, method="exact", temperature=0, max_new_tokens=10, seed=0)
    # the mixture of the modes' one-hot drafts is sampled (seeded): the image block's argmax
    # is the target's, the text-only block's often not
    assert out.token_ids == plain.token_ids and out.stats.acceptance_rate > 0.3


def test_a_padded_target_vocabulary_maps_the_family_draft():
    """Family members pad their vocabularies differently (151,936 vs 152,064 ids): a draft
    whose vocabulary is a prefix of the target's is mapped by zero-padding."""
    proc = tiny_qwen_processor("qwen2-vl")
    # the target may emit padded ids (random weights): the draft then reads its fallback id
    target = tiny_qwen_vl("qwen2-vl", vocab=len(QWEN_WORDS) + 16)
    ims, msgs = _pairs()
    draft = tiny_qwen_vl("qwen2-vl", seed=1, layers=1)
    plain = VisionLanguageGenerator(target, proc).generate(ims, msgs, method="plain",
                                                           temperature=0, max_new_tokens=10)
    for mode in ("image", "text"):
        d = draft if mode == "image" else tiny_text_lm(vocab=len(QWEN_WORDS))
        out = VisionLanguageGenerator(target, proc, d, mode).generate(
            ims, msgs, method="exact", temperature=0, max_new_tokens=10)
        assert out.token_ids == plain.token_ids, mode
    with pytest.raises(ValueError, match="vocabulary mismatch"):
        VisionLanguageGenerator(tiny_qwen_vl("qwen2-vl"), proc,
                                tiny_qwen_vl("qwen2-vl", vocab=len(QWEN_WORDS) + 16), "image")
