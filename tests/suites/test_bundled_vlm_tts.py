"""The bundled vision-language and speech models: they load through from_pretrained and
generate (seeded references: test_bundled_regression.py), and the codec round-trips speech with
bounded distortion."""

from __future__ import annotations

import os
import random

import pytest

from modalities import shapes_world as sw

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODELS = os.path.join(ROOT, "samples", "models")
DATA = os.path.join(ROOT, "tests", "data")


@pytest.fixture(scope="module")
def vlm():
    from modalities.vlm import VisionLanguageGenerator

    return VisionLanguageGenerator.from_pretrained(os.path.join(MODELS, "shapes-vlm"),
                                                   draft=os.path.join(MODELS, "shapes-vlm-text-draft"))


def _questions(n, start=30_000_000):
    from recipes.train.vlm import spaced

    out = []
    for s in range(start, start + n):
        scene, img, _ = sw.sample(s)
        q, a = sw.questions(scene, random.Random(s))[s % 3 + 2]     # shape / colour / size questions
        out.append((img, spaced(q), spaced(a)))
    return out


def _msgs(q):
    return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": q}]}]


def test_bundled_vlm_answers_and_drafts(vlm):
    qs = _questions(24)
    plain = vlm.generate([i for i, _, _ in qs], [_msgs(q) for _, q, _ in qs], method="plain",
                         temperature=0, max_new_tokens=12)
    right = sum(t.strip() == a for t, (_, _, a) in zip(plain.texts, qs))
    assert right / len(qs) >= 0.6             # the card reports 0.814 on 500 questions
    spec = vlm.generate([i for i, _, _ in qs], [_msgs(q) for _, q, _ in qs], method="exact",
                        temperature=0, max_new_tokens=12)
    assert spec.token_ids == plain.token_ids and spec.stats.acceptance_rate > 0.2


def test_bundled_qwen_vl_pair_answers_and_drafts():
    """The Qwen2-VL-architecture pair (3-D rotary positions) through the Auto classes: its
    answers, and exact speculative decoding with its VLM draft giving the same tokens."""
    from modalities.vlm import VisionLanguageGenerator

    gen = VisionLanguageGenerator.from_pretrained(os.path.join(MODELS, "shapes-qwen-vl"),
                                                  draft=os.path.join(MODELS, "shapes-qwen-vl-draft"))
    assert type(gen.target).__name__ == "Qwen2VLForConditionalGeneration"
    qs = _questions(24)
    images, msgs = [i for i, _, _ in qs], [_msgs(q) for _, q, _ in qs]
    plain = gen.generate(images, msgs, method="plain", temperature=0, max_new_tokens=12)
    right = sum(t.strip() == a for t, (_, _, a) in zip(plain.texts, qs))
    assert right / len(qs) >= 0.45             # the card reports 0.618 on 500 questions
    spec = gen.generate(images, msgs, method="exact", temperature=0, max_new_tokens=12)
    assert spec.token_ids == plain.token_ids and spec.stats.acceptance_rate > 0.3


@pytest.fixture(scope="module")
def tts():
    from modalities.speech import TextToSpeech

    return TextToSpeech.from_pretrained(os.path.join(MODELS, "shapes-tts"),
                                        draft=os.path.join(MODELS, "shapes-tts-draft"))


def test_bundled_tts_generates_audio_at_the_codec_rate(tts):
    out = tts("a small blue star at the bottom", method="exact", seed=0, progress=False)
    assert out.sample_rate == 16000 and len(out.codes[0]) > 0
    assert len(out.waveforms[0]) == 256 * len(out.codes[0])          # hop 256 per frame


def test_codec_round_trips_speech_with_bounded_distortion():
    from eval.metrics import mel_cepstral_distortion
    from modalities.speech.codec import MelRVQCodec
    from recipes.train.speech_data import utterance

    codec = MelRVQCodec.load(os.path.join(MODELS, "shapes-codec"))
    _, wave = utterance(40_000_000)                       # espeak-ng (installed by make)
    codes = codec.encode(wave)
    assert codes.shape[1] == 4 and int(codes.max()) < 256
    rec = codec.decode(codes[None])[0]
    mcd = mel_cepstral_distortion(rec, wave)
    other = mel_cepstral_distortion(utterance(40_000_001)[1], wave)
    assert mcd < 25 and mcd < 0.6 * other


def test_bundled_vlm_tokenizer_normalises_and_refuses_unknown_words(vlm):
    """Capitals and punctuation are normalised (no silent <unk>); unknown words are refused."""
    tok = vlm.processor.tokenizer
    a = tok("USER: <image> What colour is the circle? ASSISTANT:")["input_ids"]
    b = tok("USER: <image> what colour is the circle ? ASSISTANT:")["input_ids"]
    assert a == b and tok.unk_token_id not in a
    img = sw.sample(1)[1]
    with pytest.raises(ValueError, match=r"the words \['shown\?'\] are outside the tokenizer's"):
        vlm.generate(img, _msgs("What is shown?"), max_new_tokens=4)
    out = vlm.generate(img, _msgs("What colour is the circle?"), temperature=0, max_new_tokens=4)
    assert out.texts[0].strip()


def test_empty_texts_are_refused(tts, vlm):
    with pytest.raises(ValueError, match="text: accepted non-empty strings"):
        tts("", progress=False)
    with pytest.raises(ValueError, match="text: accepted non-empty strings"):
        tts("   ", progress=False)
    with pytest.raises(ValueError, match="text=NoneType: accepted a string"):
        tts(None, progress=False)
