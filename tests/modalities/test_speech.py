"""Speech adapter: delay pattern round trip, greedy equality for delay-pattern and
single-codebook targets, sampling distribution on a tiny delay-pattern model, audio shapes,
bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats as sstats

from modalities.speech import (DelayPatternAdapter, EncodecCodec, SingleCodebookAdapter,
                               TextToSpeech, apply_delay, undo_delay)
from tiny_speech import TEXTS, ToyCodec, single_codebook as _single, tiny_musicgen


def test_delay_pattern_round_trips():
    frames = torch.randint(0, 16, (2, 7, 4))
    stream = apply_delay(frames, pad=16)
    assert stream.shape == (2, 10, 4)
    assert (stream[:, 0, 1:] == 16).all() and (stream[:, -1, :-1] == 16).all()
    assert torch.equal(undo_delay(stream, 7), frames)
    with pytest.raises(ValueError, match="holds at most"):
        undo_delay(stream, 8)


@pytest.fixture(scope="module")
def delay_pair():
    return tiny_musicgen(), tiny_musicgen(seed=1, hidden=8, layers=1)


@pytest.mark.parametrize("guidance", [None, 3.0])
def test_delay_pattern_greedy_equals_plain(delay_pair, guidance):
    tts = TextToSpeech.from_pretrained(*delay_pair)
    kw = dict(temperature=0, max_frames=12, progress=False, guidance_scale=guidance)
    plain = tts(TEXTS, method="plain", **kw)
    assert [c.shape for c in plain.codes] == [(12, 2), (12, 2)]
    for method in ("exact", "greedy", "pcg", "sjd", "sjd-maximal", "sjd-gumbel"):
        extra = dict(theta=1.0) if method == "pcg" else (dict(window=4) if "sjd" in method else {})
        out = tts(TEXTS, method=method, **extra, **kw)
        assert all(torch.equal(a, b) for a, b in zip(out.codes, plain.codes)), method
    # the plain codes respect the pattern: every frame holds real codes
    assert all((c < 16).all() for c in plain.codes)


def test_audio_has_the_codec_rate_and_length(delay_pair, tmp_path):
    tts = TextToSpeech.from_pretrained(*delay_pair)
    out = tts(TEXTS, max_frames=10, progress=False, seed=0)
    assert out.sample_rate == 16000
    assert [w.shape for w in out.waveforms] == [(160,), (160,)]     # 10 frames x hop 16
    files = out.save(str(tmp_path))
    import soundfile as sf

    data, sr = sf.read(files[0])
    assert sr == 16000 and len(data) == 160
    assert files[1].endswith(".png")


def test_exact_sampling_matches_plain_sampling(delay_pair):
    t, d = tiny_musicgen(codebook_size=4), tiny_musicgen(seed=1, hidden=8, layers=1, codebook_size=4)
    with torch.no_grad():
        for m in (t, d):
            for head in m.decoder.lm_heads:
                head.weight.mul_(0.2)
    tts = TextToSpeech.from_pretrained(t, draft=d)
    n = 3000
    kw = dict(max_frames=2, progress=False, decode=False)
    a = tts([[3, 4, 5]] * n, method="plain", seed=0, **kw)
    b = tts([[3, 4, 5]] * n, method="exact", seed=1, num_draft_tokens=2, **kw)
    # Rows of this model cannot keep holes (its positions follow the cache length), so a batch
    # commits to its shortest accepted length; one row alone shows the drafts are used.
    one = tts([[3, 4, 5]], method="exact", seed=2, num_draft_tokens=2, max_frames=12,
              progress=False, decode=False)
    assert one.stats.acceptance_rate > 0.2

    def hist(codes):   # first frame (2 codebooks) x second frame's codebook 0
        return np.bincount([int(c[0, 0]) * 16 + int(c[0, 1]) * 4 + int(c[1, 0]) for c in codes],
                           minlength=64)
    ha, hb = hist(a.codes), hist(b.codes)
    keep = (ha + hb) > 0
    assert sstats.chi2_contingency(np.stack([ha[keep], hb[keep]]))[1] > 1e-4
    # Jacobi windows of whole frames (maximal coupling) are exact too.
    c = tts([[3, 4, 5]] * n, method="sjd-maximal", window=3, seed=3, **kw)
    hc = hist(c.codes)
    keep = (ha + hc) > 0
    assert sstats.chi2_contingency(np.stack([ha[keep], hc[keep]]))[1] > 1e-4


def test_single_codebook_greedy_equals_plain_including_jacobi():
    mk = lambda m: SingleCodebookAdapter(m, ToyCodec(), range(20, 36), end_id=36,  # noqa: E731
                                         prefix=[1], suffix=[2], max_frames=16)
    tts = TextToSpeech(mk(_single()), mk(_single(seed=1, hidden=16)))
    plain = tts(TEXTS, method="plain", temperature=0, progress=False)
    for method in ("exact", "sjd", "sjd-maximal", "lantern"):
        out = tts(TEXTS, method=method, temperature=0, progress=False)
        assert all(torch.equal(a, b) for a, b in zip(out.codes, plain.codes)), method
    assert plain.waveforms[0].shape[0] == 80 * plain.codes[0].shape[0]


def test_bad_input(delay_pair):
    t, d = delay_pair
    with pytest.raises(ValueError, match="codebooks"):
        TextToSpeech.from_pretrained(t, draft=tiny_musicgen(codebooks=3))
    with pytest.raises(ValueError, match="codebooks of"):
        TextToSpeech.from_pretrained(t, draft=tiny_musicgen(codebook_size=8))
    other = DelayPatternAdapter(d, EncodecCodec(d.audio_encoder))
    other.codec.sample_rate = 24000
    with pytest.raises(ValueError, match="sample-rate mismatch"):
        TextToSpeech(DelayPatternAdapter(t, EncodecCodec(t.audio_encoder)), other)
    tts = TextToSpeech.from_pretrained(t)
    with pytest.raises(ValueError, match="at least one text"):
        tts([], progress=False)
    with pytest.raises(ValueError, match="non-empty"):
        tts([[]], progress=False)
    with pytest.raises(ValueError, match="string texts need a tokenizer"):
        tts("hello", progress=False)
    with pytest.raises(ValueError, match="events of several ids"):
        tts(TEXTS, method="sjd", init="repeat_horizon", grid_width=4, progress=False)
    with pytest.raises(ValueError, match="static_cache / compile: not available for delay-pattern"):
        tts(TEXTS, static_cache=True, progress=False)
    with pytest.raises(ValueError, match="pipeline=True: not available for delay-pattern"):
        TextToSpeech.from_pretrained(t, draft=d)(TEXTS, method="exact", pipeline=True,
                                                 progress=False)
    with pytest.raises(ValueError, match="compile='yes'"):
        tts(TEXTS, compile="yes", progress=False)
    with pytest.raises(ValueError, match="num_draft_tokens=0"):
        TextToSpeech.from_pretrained(t, draft=d)(TEXTS, method="exact", num_draft_tokens=0,
                                                 progress=False)


def test_single_codebook_static_caches_give_the_dynamic_codes():
    """static_cache=True (what compile=True captures), with and without guidance (the draft
    gets its own unconditional rows), synchronised and with draft steps queued ahead: the
    dynamic-cache codes under greedy decoding in float32; the target as its own draft accepts
    every draft."""
    mk = lambda m: SingleCodebookAdapter(m, ToyCodec(), range(20, 36), end_id=36,  # noqa: E731
                                         prefix=[1], suffix=[2], max_frames=16)
    for draft in (_single(seed=1, hidden=16), _single()):
        tts = TextToSpeech(mk(_single()), mk(draft))
        for g in (None, 2.0):
            plain = tts(TEXTS, method="plain", temperature=0, progress=False, guidance_scale=g)
            for method, pipeline in (("plain", None), ("sjd", None), ("exact", None),
                                     ("exact", True), ("lantern", True)):
                out = tts(TEXTS, method=method, temperature=0, progress=False, guidance_scale=g,
                          static_cache=True, pipeline=pipeline)
                assert all(torch.equal(a, b) for a, b in zip(out.codes, plain.codes)), \
                    (method, pipeline, g)
                if method == "exact" and draft.config.hidden_size == 32:
                    assert out.stats.acceptance_rate == 1.0


def save_bundled_tiny(folder, model, max_frames=8):
    """The bundled speech format around a tiny model (Encodec codec, character tokenizer)."""
    import json

    model.save_pretrained(folder / "model")
    model.audio_encoder.save_pretrained(folder / "codec")
    meta = dict(codec="../codec", alphabet="abcdefghijklmnopqrstuvwxyz .", char_offset=1,
                pad_id=16, eos_id=None, max_frames=max_frames, defaults={"guidance_scale": 1.0})
    (folder / "model" / "mmspec_speech.json").write_text(json.dumps(meta))
    return folder / "model"


def test_recipe_runs_end_to_end(tmp_path, capsys, delay_pair):
    from recipes import tts as recipe

    t, d = delay_pair
    tp = save_bundled_tiny(tmp_path / "t", t)
    dp = save_bundled_tiny(tmp_path / "d", d)
    texts = tmp_path / "texts.txt"
    texts.write_text("a red star\nblue\n")
    res = recipe.main(["--model", str(tp), "--draft", str(dp), "--out", str(tmp_path / "out"),
                       "--temperature", "0", "--method", "exact", "--texts-file", str(texts)])
    assert (tmp_path / "out" / "comparison.png").exists()
    assert len(list((tmp_path / "out" / "plain").glob("*.wav"))) == 2
    assert "codes identical to plain: True" in capsys.readouterr().out
    assert res["spec"].stats.steps <= res["plain"].stats.steps


def tiny_dac(codebooks=2, size=16):
    from transformers import DacConfig, DacModel

    torch.manual_seed(0)
    return DacModel(DacConfig(encoder_hidden_size=8, downsampling_ratios=[2, 4], decoder_hidden_size=32,
                              n_codebooks=codebooks, codebook_size=size, codebook_dim=4,
                              upsampling_ratios=[4, 2], hidden_size=16, hop_length=8)).eval()


def tiny_mimi(codebooks=2, size=16):
    from transformers import MimiConfig, MimiModel

    torch.manual_seed(0)
    return MimiModel(MimiConfig(hidden_size=16, num_filters=4, upsampling_ratios=[4, 2],
                                codebook_size=size, codebook_dim=8, num_quantizers=codebooks,
                                num_semantic_quantizers=1, vector_quantization_hidden_dimension=8,
                                upsample_groups=16, num_hidden_layers=1, intermediate_size=32,
                                num_attention_heads=2, num_key_value_heads=2, head_dim=8)).eval()


def test_transformers_codecs_decode_frames_at_their_rate():
    from modalities.speech import codec_for

    dac = codec_for(tiny_dac(codebooks=3))
    w = dac.decode(torch.randint(0, 16, (2, 10, 3)))
    assert w.shape == (2, 80) and dac.sample_rate == 16000 and np.isfinite(w).all()   # hop 8
    mimi = codec_for(tiny_mimi(codebooks=4))
    w = mimi.decode(torch.randint(0, 16, (2, 10, 4)))
    assert mimi.sample_rate == 24000 and w.shape[0] == 2 and w.shape[1] % 10 == 0 and w.shape[1] > 0
    with pytest.raises(ValueError, match=r"\[B, N, C\]"):
        dac.decode(torch.randint(0, 16, (10, 3)))
    with pytest.raises(ValueError, match="accepted EncodecModel, DacModel, MimiModel or Xcodec2Model"):
        codec_for(torch.nn.Linear(2, 2))


def test_delay_pattern_target_speaks_through_a_dac_codec():
    from modalities.speech import codec_for

    model = tiny_musicgen(codebooks=2, codebook_size=16)
    tts = TextToSpeech(DelayPatternAdapter(model, codec_for(tiny_dac(codebooks=2))))
    out = tts(TEXTS, max_frames=6, progress=False, seed=0)
    assert out.sample_rate == 16000
    assert [w.shape for w in out.waveforms] == [(48,), (48,)]        # 6 frames x hop 8


def tiny_xcodec2():
    from transformers import Xcodec2Config, Xcodec2Model

    torch.manual_seed(0)
    sem = Xcodec2Config().semantic_model_config.to_dict()
    sem.update(hidden_size=16, num_hidden_layers=1, intermediate_size=32, num_attention_heads=2,
               output_hidden_size=16, conv_dim=[16], conv_stride=[1], conv_kernel=[1],
               num_adapter_layers=1, feature_projection_input_dim=16)
    cfg = Xcodec2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                        num_attention_heads=2, num_key_value_heads=2, head_dim=16,
                        encoder_hidden_size=4, downsampling_ratios=[2, 2], quantization_dim=48,
                        quantization_levels=[4, 4], semantic_model_config=sem)
    return Xcodec2Model(cfg).eval()


def test_single_codebook_target_speaks_through_xcodec2():
    """Llasa's layout: a Llama over [text | X-codec2 ids | end], decoded by Xcodec2Model."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from modalities.speech import codec_for

    codec = codec_for(tiny_xcodec2())
    assert codec.codebook_size == 16 and codec.sample_rate == 16000
    torch.manual_seed(0)
    lm = LlamaForCausalLM(LlamaConfig(vocab_size=40, hidden_size=16, intermediate_size=32,
                                      num_hidden_layers=1, num_attention_heads=2,
                                      num_key_value_heads=2, max_position_embeddings=64)).eval()
    adapter = SingleCodebookAdapter(lm, codec, codec_ids=range(20, 36), end_id=36, max_frames=8)
    out = TextToSpeech(adapter)([[3, 4, 5]], temperature=0, progress=False)
    n = len(out.codes[0])
    assert n > 0 and out.waveforms[0].shape == (4 * n,)             # hop 4 samples per code


def test_musicgen_for_causal_lm_with_a_text_encoder_equals_the_full_model(delay_pair):
    """The decoder alone (MusicgenForCausalLM) plus MusicGen's text encoder gives the codes the
    full MusicgenForConditionalGeneration gives, plain and speculative, greedy in float32."""
    t, d = delay_pair
    full = TextToSpeech.from_pretrained(t, draft=d)

    def parts(m):
        return DelayPatternAdapter(m.decoder, EncodecCodec(m.audio_encoder),
                                   text_encoder=m.text_encoder,
                                   enc_to_dec_proj=getattr(m, "enc_to_dec_proj", None))
    split = TextToSpeech(parts(t), parts(d))
    kw = dict(temperature=0, max_frames=8, progress=False)
    a, b = full(TEXTS, **kw), split(TEXTS, **kw)
    assert all(torch.equal(x, y) for x, y in zip(a.codes, b.codes))
    c = split(TEXTS, method="exact", num_draft_tokens=3, **kw)
    assert all(torch.equal(x, y) for x, y in zip(a.codes, c.codes))
    with pytest.raises(ValueError, match="text_encoder="):
        DelayPatternAdapter(t.decoder, EncodecCodec(t.audio_encoder))


def test_guidance_defaults_to_the_models_generation_config():
    from modalities.speech.bundled import load_speech_adapter

    m = tiny_musicgen(pad_outside=True)
    assert m.generation_config.guidance_scale is None
    assert load_speech_adapter(m)[1] == {}                          # no guidance unless set
    m.generation_config.guidance_scale = 3.0                        # released checkpoints
    assert load_speech_adapter(m)[1] == {"guidance_scale": 3.0}
    tts = TextToSpeech.from_pretrained(m)                           # pad id past the logits
    out = tts(TEXTS, temperature=1.0, seed=0, max_frames=6, progress=False)
    assert all(c.shape == (6, 2) and int(c.max()) < 16 for c in out.codes)


def test_guidance_keeps_masked_logits_masked():
    from mmspec.sampling import guide

    inf = float("inf")
    c = torch.tensor([1.0, -inf, 0.5, -inf])
    u = torch.tensor([0.0, -inf, -inf, 2.0])
    g = guide(c, u, 3.0)
    assert g[0] == 3.0 and torch.isneginf(g[1:]).all()            # no NaN from -inf - -inf
    assert torch.equal(guide(c, c, 0.0)[:1], c[:1])


def test_audio_output_has_the_transformers_names(delay_pair):
    out = TextToSpeech.from_pretrained(*delay_pair)(TEXTS, max_frames=4, progress=False, seed=0)
    assert out.audio is out.waveforms and out.sampling_rate == out.sample_rate


def test_text_ids_outside_the_models_text_vocabulary_are_refused(delay_pair):
    """Token-id texts past the text vocabulary: named before any model runs (they raised an
    IndexError inside the embedding)."""
    from modalities.speech import TextToSpeech

    tts = TextToSpeech.from_pretrained(*delay_pair)
    vocab = tts.target.text_vocab_size()
    with pytest.raises(ValueError, match=rf"token ids \[{vocab}\]: accepted ids in \[0, {vocab - 1}\]"):
        tts([[1, 2, vocab]], progress=False, max_frames=4)
