"""Vision-language adapter: greedy equality for each target class and draft kind, sampling
distribution, streaming, padded vocabularies and bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats as sstats

from modalities.vlm import VisionLanguageGenerator
from tiny_vlm import (images, llava_models as _models, llava_pairs as _pairs, tiny_llava,
                      tiny_processor, tiny_text_lm)

@pytest.mark.parametrize("kind", ["llava", "llava-next"])
def test_speculative_greedy_equals_plain_greedy(kind):
    target, vlm_draft, proc = _models(kind)
    ims, prompts = _pairs(kind)
    plain = VisionLanguageGenerator(target, proc).generate(ims, prompts, method="plain",
                                                             temperature=0, max_new_tokens=12)
    for draft, mode in ((tiny_text_lm(), "text"), (vlm_draft, "image"), (vlm_draft, "ensemble")):
        g = VisionLanguageGenerator(target, proc, draft, mode)
        for method in ("exact", "greedy"):
            out = g.generate(ims, prompts, method=method, temperature=0, max_new_tokens=12, seed=0)
            assert out.token_ids == plain.token_ids, (mode, method)
    g = VisionLanguageGenerator(target, proc)
    for method in ("sjd", "sjd-maximal"):
        assert g.generate(ims, prompts, method=method, temperature=0, max_new_tokens=12,
                          seed=0).token_ids == plain.token_ids


def test_exact_sampling_matches_plain_sampling():
    """First two generated tokens, 3000 samples each, two-sample chi-square."""
    target, _, proc = _models("llava")
    with torch.no_grad():
        target.lm_head.weight.mul_(0.05)       # flat enough that every id shows up
    draft = tiny_text_lm()
    with torch.no_grad():
        draft.lm_head.weight.mul_(0.05)
    im = images(1)[0]
    n = 3000
    g = VisionLanguageGenerator(target, proc, draft, "text")
    kw = dict(max_new_tokens=2, num_draft_tokens=2)
    a = g.generate([im] * n, ["USER: <image> a ASSISTANT:"] * n, method="plain", seed=0, **kw)
    b = g.generate([im] * n, ["USER: <image> a ASSISTANT:"] * n, method="exact", seed=1, **kw)
    assert b.stats.acceptance_rate > 0.3
    v = target.config.text_config.vocab_size

    def hist(rows):   # first two tokens; a row that stopped at EOS has an "ended" second slot
        return np.bincount([r[0] * (v + 1) + (r[1] if len(r) > 1 else v) for r in rows],
                           minlength=v * (v + 1))
    ha, hb = hist(a.token_ids), hist(b.token_ids)
    keep = (ha + hb) > 0
    assert sstats.chi2_contingency(np.stack([ha[keep], hb[keep]]))[1] > 1e-4


def test_streaming_yields_the_same_text():
    target, draft, proc = _models("llava")
    ims, prompts = _pairs("llava")
    g = VisionLanguageGenerator(target, proc, draft, "image")
    full = g.generate(ims, prompts, method="exact", max_new_tokens=10, seed=3)
    texts = ["", ""]
    for pieces in g.generate(ims, prompts, method="exact", max_new_tokens=10, seed=3, stream=True):
        texts = [t + p for t, p in zip(texts, pieces)]
    assert texts == full.texts


def test_padded_target_vocabulary_maps_a_prefix_draft():
    proc = tiny_processor()
    target = tiny_llava()
    big = tiny_llava(vocab=64)                   # a target padded past the tokenizer
    with torch.no_grad():
        big.lm_head.weight[44:] = -10.0          # padded ids are never likely
    ims, prompts = _pairs("llava")
    g = VisionLanguageGenerator(big, proc, tiny_text_lm(), "text")
    plain = g.generate(ims, prompts, method="plain", temperature=0, max_new_tokens=8)
    spec = g.generate(ims, prompts, method="exact", temperature=0, max_new_tokens=8)
    assert spec.token_ids == plain.token_ids
    with pytest.raises(ValueError, match="vocabulary mismatch"):
        VisionLanguageGenerator(target, proc, tiny_text_lm(vocab=64), "text")
    del target


def test_a_padded_draft_chains_through_its_own_session(monkeypatch):
    """A padded draft's K steps are its own session's ``chain`` (one captured graph on the
    GPU), with the draws and the zero-padded distributions of K single steps; ids past the
    draft's vocabulary reach it as the fallback id."""
    from mmspec.sessions import CausalLMSession, PaddedSession, Session
    from mmspec.sampling import SamplingParams

    draft = tiny_text_lm(vocab=40)
    ids = torch.tensor([[5, 6, 7, 8], [0, 9, 10, 11]])
    mask = torch.tensor([[1, 1, 1, 1], [0, 1, 1, 1]])

    def session():
        s = PaddedSession(CausalLMSession(draft, SamplingParams(temperature=0)), 48)
        s.prefill(ids, mask)
        return s
    chained, stepped = session(), session()
    fed = []
    inner = chained.inner.chain
    monkeypatch.setattr(chained.inner, "chain", lambda t, *a: fed.append(t) or inner(t, *a))
    tokens, valid, on = torch.tensor([[12, 45]]).T, torch.ones(2, 1), torch.ones(2)
    draws, dists = chained.chain(tokens, valid, 3, on)
    want_draws, want_dists = Session.chain(stepped, tokens, valid, 3, on)
    assert fed[0][:, 0].tolist() == [12, 0]                     # 45: past the draft's 40 ids
    assert torch.equal(draws, want_draws) and dists.shape == (2, 3, 48)
    assert torch.equal(dists, want_dists) and not dists[..., 40:].any()
    alone = CausalLMSession(draft, SamplingParams(temperature=0))
    assert PaddedSession.around(alone, 40) is alone                 # nothing to pad
    assert isinstance(PaddedSession.around(alone, 48), PaddedSession)


def test_bad_input():
    target, draft, proc = _models("llava")
    g = VisionLanguageGenerator(target, proc, draft, "image")
    im = images(1)[0]
    with pytest.raises(ValueError, match="has no <image> token but an image was given"):
        g.generate(im, "USER: a ASSISTANT:")
    with pytest.raises(ValueError, match="has an <image> token but no image was given"):
        g.generate(None, "USER: <image> a ASSISTANT:")
    with pytest.raises(ValueError, match="image count mismatch"):
        g.generate([im, im], ["USER: <image> a ASSISTANT:"])
    with pytest.raises(ValueError, match=r"image tensors must be \[3, H, W\]"):
        g.generate(torch.zeros(4, 32, 32), "USER: <image> a ASSISTANT:")
    with pytest.raises(ValueError, match="max_new_tokens=0"):
        g.generate(im, "USER: <image> a ASSISTANT:", max_new_tokens=0)
    with pytest.raises(ValueError, match="draft_mode='ensemble' needs a vision-language draft"):
        VisionLanguageGenerator(target, proc, tiny_text_lm(), "ensemble")
    with pytest.raises(ValueError, match="num_draft_tokens=0"):
        g.generate(im, "USER: <image> a ASSISTANT:", method="exact", num_draft_tokens=0)
    with pytest.raises(ValueError, match="compile='fast'"):
        g.generate(im, "USER: <image> a ASSISTANT:", compile="fast")
    with pytest.raises(ValueError, match="compile=True needs static_cache=True"):
        g.generate(im, "USER: <image> a ASSISTANT:", compile=True, static_cache=False)
    with pytest.raises(ValueError, match="pipeline='yes'"):
        g.generate(im, "USER: <image> a ASSISTANT:", pipeline="yes")
    with pytest.raises(ValueError, match="max_new_tokens=200 .* max_position_embeddings=128"):
        g.generate(im, "USER: <image> a ASSISTANT:", max_new_tokens=200)
    with pytest.raises(ValueError, match="pipeline=True: the last drafts would pass"):
        g.generate(im, "USER: <image> a ASSISTANT:", method="exact", max_new_tokens=105,
                   pipeline=True, num_draft_tokens=8)
    ens = VisionLanguageGenerator(target, proc, draft, "ensemble")
    with pytest.raises(ValueError, match="pipeline=True: accepted only with a drafter whose steps need no host"):
        ens.generate(im, "USER: <image> a ASSISTANT:", method="exact", pipeline=True)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="accepted a model on a CUDA device"):
            g.generate(im, "USER: <image> a ASSISTANT:", compile=True)


@pytest.mark.parametrize("kind", ["llava", "llava-next"])
def test_static_caches_give_the_dynamic_tokens(kind):
    """static_cache=True (what compile=True captures) for every draft kind, synchronised and
    with draft steps queued ahead (pipeline=True: rejected drafts kept as holes), Jacobi and
    plain decoding: the dynamic-cache tokens under greedy decoding in float32."""
    target, vlm_draft, proc = _models(kind)
    ims, prompts = _pairs(kind)
    plain = VisionLanguageGenerator(target, proc).generate(ims, prompts, temperature=0,
                                                             max_new_tokens=16)
    kw = dict(temperature=0, max_new_tokens=16, seed=0, static_cache=True)
    g = VisionLanguageGenerator(target, proc)
    for method in ("plain", "sjd"):
        assert g.generate(ims, prompts, method=method, **kw).token_ids == plain.token_ids, method
    for draft, mode in ((tiny_text_lm(), "text"), (vlm_draft, "image"), (target, "image"),
                        (vlm_draft, "ensemble")):
        g = VisionLanguageGenerator(target, proc, draft, mode)
        for pipeline in ((None,) if mode == "ensemble" else (None, True)):
            for k in (1, 3):
                out = g.generate(ims, prompts, method="exact", num_draft_tokens=k,
                                 pipeline=pipeline, **kw)
                assert out.token_ids == plain.token_ids, (mode, pipeline, k)


def test_num_draft_tokens_sets_the_drafts_per_step():
    """The target as its own image draft accepts every draft: ceil(T / (K + 1)) steps."""
    target, _, proc = _models("llava")
    g = VisionLanguageGenerator(target, proc, target, "image")
    for k in (1, 3, 6):
        out = g.generate(images(1)[0], "USER: <image> a ASSISTANT:", method="exact",
                         temperature=0, max_new_tokens=20, num_draft_tokens=k)
        assert out.stats.steps == -(-20 // (k + 1)), k


def test_recipe_runs_on_a_saved_tiny_model(tmp_path, capsys):
    from recipes import vlm as recipe

    target, draft, proc = _models("llava")
    target.save_pretrained(tmp_path / "t")
    proc.save_pretrained(tmp_path / "t")
    draft.save_pretrained(tmp_path / "d")
    proc.save_pretrained(tmp_path / "d")
    img = tmp_path / "x.png"
    images(1)[0].save(img)
    res = recipe.main([str(img), "what colour is the circle ?", "--target", str(tmp_path / "t"),
                       "--draft", str(tmp_path / "d"), "--draft-mode", "image",
                       "--max-new-tokens", "6"])
    assert res["spec"].token_ids == res["plain"].token_ids
    out = capsys.readouterr().out
    assert "tokens/step" in out and "identical to plain: True" in out


REFUSED = [("Gemma3nForConditionalGeneration", "does not implement")]


@pytest.mark.parametrize("name,why", REFUSED)
def test_unsupported_vlm_classes_are_refused_with_the_reason(name, why):
    """The class with its default config, on the meta device (no weights): refused before
    any work, as target and as an image draft."""
    import transformers

    from modalities.vlm.generator import supported_classes

    cls = getattr(transformers, name)
    with torch.device("meta"):
        model = cls(cls.config_class())
    with pytest.raises(ValueError, match=rf"target {name} .*{why}.*accepted "
                                         r"ChameleonForConditionalGeneration, Gemma3ForConditionalGeneration"):
        VisionLanguageGenerator(model, tiny_processor())
    target, _, proc = _models("llava")
    with pytest.raises(ValueError, match=rf"draft {name} .*{why}"):
        VisionLanguageGenerator(target, proc, model, "image")
    assert supported_classes() == [
        "ChameleonForConditionalGeneration", "Gemma3ForConditionalGeneration",
        "Gemma4ForConditionalGeneration", "Idefics3ForConditionalGeneration", "InternVLForConditionalGeneration",
        "LlavaForConditionalGeneration",
        "LlavaNextForConditionalGeneration", "LlavaOnevisionForConditionalGeneration",
        "Mistral3ForConditionalGeneration", "PaliGemmaForConditionalGeneration",
        "Qwen2VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration",
        "Qwen3VLForConditionalGeneration", "Qwen3VLMoeForConditionalGeneration",
        "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration",
        "SmolVLMForConditionalGeneration"]


def test_paligemma_2_decodes_past_its_window_inside_the_prefix():
    """PaliGemma 2 (a Gemma 2 decoder: 4-slot sliding windows, 13- and 6-token bidirectional
    prefixes): its forward takes one mask for every layer, so its decoder is called alone
    (``DecoderSession``: merged embeddings, soft-capped head). The prefix's tokens see the
    whole prefix past the window on the sliding layers, the refed last one in the first step
    too; greedy decoding gives the model's own tokens."""
    from modalities.vlm.decoder_session import DecoderSession
    from modalities.vlm.generator import _session
    from mmspec.sampling import SamplingParams
    from tiny_vlm import tiny_paligemma, tiny_paligemma_processor

    target, proc = tiny_paligemma(window=4), tiny_paligemma_processor()
    assert isinstance(_session(target, SamplingParams(0.0)), DecoderSession)
    ims = images(2, seed=5)
    prompts = ["<image> what colour is the circle ? ASSISTANT:", "<image> a"]
    own = []
    for im, prompt in zip(ims, prompts):
        batch = proc(images=[im], text=[prompt], return_tensors="pt")
        assert batch["input_ids"].shape[1] > 4            # the prefix outruns the window
        batch.pop("labels")
        own.append(target.generate(**batch, do_sample=False, max_new_tokens=10)[
            0, batch["input_ids"].shape[1]:].tolist())
    g = VisionLanguageGenerator(target, proc)
    for static in (False, True):
        out = g.generate(ims, prompts, temperature=0, max_new_tokens=10, static_cache=static)
        assert out.token_ids == own, static


def test_transformers_conventions():
    """generate(**processor outputs), assistant_model= and a transformers streamer."""
    from threading import Thread

    from transformers import TextIteratorStreamer

    target, draft, proc = _models("llava")
    ims, prompts = _pairs("llava")
    g = VisionLanguageGenerator(target, proc, assistant_model=draft)
    assert g.draft is draft and g.draft_mode == "image"
    kw = dict(temperature=0, max_new_tokens=8)
    ref = g.generate([ims[1]], [prompts[1]], method="exact", **kw)
    inputs = proc(images=[ims[1]], text=[prompts[1]], return_tensors="pt")
    out = g.generate(**inputs, method="exact", **kw)
    assert out.token_ids == ref.token_ids
    streamer = TextIteratorStreamer(proc.tokenizer, skip_prompt=True, skip_special_tokens=True)
    th = Thread(target=lambda: g.generate(**inputs, method="exact", streamer=streamer, **kw))
    th.start()
    text = "".join(streamer)
    th.join()
    assert text.strip() == ref.texts[0].strip()
    with pytest.raises(ValueError, match="draft and assistant_model"):
        VisionLanguageGenerator(target, proc, draft, assistant_model=draft)
    with pytest.raises(ValueError, match="streamer: accepted with one prompt"):
        g.generate(ims, prompts, streamer=streamer, **kw)
    with pytest.raises(ValueError, match="processor outputs .* instead of images and prompts"):
        g.generate(ims[1], prompts[1], **inputs, **kw)


CHAT_REFUSALS = {
    "an unknown role": ([{"role": "robot", "content": [{"type": "text", "text": "hi"}]}],
                        "a role in"),
    "no content": ([{"role": "user"}], "a role in"),
    "content as a dict": ([{"role": "user", "content": {"type": "text", "text": "hi"}}],
                          "content accepted as a string or a list"),
    "an audio part": ([{"role": "user", "content": [{"type": "audio", "audio": "a.wav"}]}],
                      "a part of type 'audio'"),
    "a dropped system turn": ([{"role": "system", "content": [{"type": "text", "text": "be brief"}]},
                               {"role": "user", "content": [{"type": "image"},
                                                            {"type": "text", "text": "what colour ?"}]}],
                              r"message 0 \(system\).*drops 'system' turns"),
    "an empty question": ([{"role": "user", "content": [{"type": "image"},
                                                        {"type": "text", "text": "  "}]}],
                          "only blank text"),
}


@pytest.mark.parametrize("case", sorted(CHAT_REFUSALS))
def test_chat_messages_the_template_would_drop_are_refused_before_any_work(case):
    """Roles, content and parts checked, and every text required in the prompt the bundled
    processor's chat template renders: nothing dropped silently, no empty question answered."""
    import os

    from transformers import AutoProcessor

    from modalities.vlm.generator import chat_prompt

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = AutoProcessor.from_pretrained(os.path.join(root, "samples", "models", "shapes-vlm"))
    messages, message = CHAT_REFUSALS[case]
    with pytest.raises(ValueError, match=message):
        chat_prompt(proc, messages)
    ok = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what colour ?"}]}]
    assert chat_prompt(proc, ok).startswith("USER: <image> what colour ?")


@pytest.mark.parametrize("kind", ["llava", "llava-next", "qwen2-vl", "qwen2.5-vl", "qwen3-vl",
                                  "qwen3.5"])
def test_prompts_that_end_on_the_image_decode_as_the_models_own_generate(kind):
    """A prompt whose last token is an image placeholder (completion-style prompts, and the
    layout transformers' own Qwen3-VL tester builds): plain, draft-model, Jacobi and head
    decoding give the model's own greedy tokens, a batch with a row that ends on text too,
    dynamic and static caches (it raised "Image features and image tokens do not match").
    Qwen3-VL adds image features inside its first layers (deepstack): its vision tower's
    outputs are split between the prompt pass and the first step."""
    from mmspec.drafters.architectures import head_for_target
    from tiny_vlm import image_last_case, own_tokens as _own

    target, draft, proc, ims, prompts = image_last_case(kind)
    torch.manual_seed(0)
    gen = VisionLanguageGenerator(target, proc, draft, "image",
                                  head=head_for_target(target, (0, 1), arch="eagle3"))
    assert gen.encode(ims[:1], prompts[:1])["input_ids"][0, -1] == target.config.image_token_id
    own = _own(gen, target, ims, prompts, 6)
    for method in ("plain", "exact", "sjd", "head"):
        for static in (False, True):
            out = gen.generate(ims, prompts, method=method, temperature=0, max_new_tokens=6,
                               static_cache=static, seed=0)
            assert out.token_ids == own, (method, static)


def test_qwen3_vl_trailing_image_features_reach_the_first_step():
    """Qwen3-VL, a prompt ending on its image: the vision tower's outputs split between the
    prompt pass (every placeholder but the trailing one) and the first step (the trailing
    one, its deepstack features included) give the model's own last-position logits; without
    the trailing deepstack features they differ (the greedy tokens of the tiny model do not
    show it)."""
    from transformers import DynamicCache

    from modalities.vlm.deepstack import split_trailing
    from tiny_vlm import image_last_case

    target, _, proc, ims, prompts = image_last_case("qwen3-vl")   # prompts[0] ends on the image
    batch = dict(VisionLanguageGenerator(target, proc).encode(ims[:1], prompts[:1]))
    ids = batch["input_ids"]
    with torch.no_grad():
        own = target(**batch).logits[0, -1]
        prompt, (trailing,) = split_trailing(target, batch)
        pos, _ = target.model.get_rope_index(ids, attention_mask=batch["attention_mask"],
                                             image_grid_thw=batch["image_grid_thw"],
                                             mm_token_type_ids=batch.get("mm_token_type_ids"))
        gaps = []
        for deep in (True, False):
            cache = DynamicCache(config=target.config)
            target(input_ids=ids[:, :-1], position_ids=pos[:, :, :-1], cache=cache,
                   mm_encoder_outputs=prompt["mm_encoder_outputs"],
                   image_grid_thw=batch["image_grid_thw"])
            enc = trailing.outputs(ids[:, -1:], target.get_input_embeddings())
            if not deep:
                enc.deepstack_features = [[d[0] * 0] for d in enc.deepstack_features]
            out = target(input_ids=ids[:, -1:], position_ids=pos[:, :, -1:], cache=cache,
                         mm_encoder_outputs={"image": enc})
            gaps.append(float((out.logits[0, -1] - own).abs().max()))
    assert gaps[0] < 1e-4 < 1e-3 < gaps[1], gaps
    # a draft equal to the placeholder: its own embedding, no deepstack addition
    img = target.config.image_token_id
    enc = trailing.outputs(torch.tensor([[img, img, 5]]), target.get_input_embeddings())
    (feats,), ((deep,),) = enc.pooler_output, enc.deepstack_features
    assert torch.equal(feats[0], trailing.features[0]) and torch.equal(deep[0], trailing.deep[0][0])
    assert torch.equal(feats[1], target.get_input_embeddings().weight[img]) and not deep[1].any()


def test_question_lines_are_read_one_way(tmp_path):
    """``modalities.vlm.questions``: the line format the sweep and the draft-head recipe
    read: fields, the answer when given, a seed's scene or a file's image, one user turn;
    two or three fields and a non-blank question accepted, the image checked without
    reading it."""
    from modalities import shapes_world as sw
    from modalities.vlm.questions import Question

    q = Question.parse("31000089\twhat shape is at the top left?\tcircle")
    assert (q.image, q.text, q.answer) == ("31000089", "what shape is at the top left?", "circle")
    assert Question.parse("7\t what ? ").answer is None and Question.parse("7\t what ? ").text == "what ?"
    assert np.array_equal(np.asarray(q.picture()), np.asarray(sw.sample(31000089)[1]))
    assert q.messages()[0]["content"][1] == {"type": "text", "text": q.text}
    for bad in ("7", "7\t  ", "7\ta\tb\tc"):
        with pytest.raises(ValueError, match=r"accepted IMAGE<TAB>QUESTION\[<TAB>ANSWER\]"):
            Question.parse(bad)
    with pytest.raises(ValueError, match="image 'nowhere.png': accepted a shapes-world seed"):
        Question.parse("nowhere.png\twhat ?").check_image()
    path = tmp_path / "scene.png"
    sw.sample(5)[1].save(path)
    Question.parse(f"{path}\twhat ?").check_image()
