"""One conformance suite over every registered adapter (``modalities.registry.adapters()``),
on tiny float32 models built from configs, greedy decoding:

- speculative decoding (a draft model and Jacobi) gives plain decoding's tokens;
- static caches give the dynamic caches' tokens (or are refused with a clear error before
  any work, where the layout cannot roll a static cache back);
- each row of a batch gives the tokens it gives alone (left padding, ragged rows).

Every registered adapter needs a case below: registering one without a case fails
``test_every_registered_adapter_has_a_case``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pytest
import torch

from modalities.registry import adapters


@dataclass
class Case:
    """run(method, rows, static) -> the generated ids (or codes) of those rows, as lists."""

    run: Callable[[str, list[int], bool], list]
    methods: tuple[str, ...]
    static: bool = True          # static caches supported (else refused before any work)


def _image(name: str) -> Case:
    from test_image import PIPES
    from tiny_image import tiny_vq

    pipe, prompts = PIPES[name](tiny_vq())

    def run(method, rows, static):
        return pipe([prompts[i] for i in rows], method=method, temperature=0, seed=0,
                    progress=False, decode=False, static_cache=static).tokens.tolist()
    return Case(run, ("exact", "sjd", "sjd-maximal"))


def _vlm(kind: str) -> Case:
    from modalities.vlm import VisionLanguageGenerator
    from test_vlm import _models, _pairs

    target, draft, proc = _models(kind)
    ims, prompts = _pairs(kind)
    gen = VisionLanguageGenerator(target, proc, draft, "image")

    def run(method, rows, static):
        return gen.generate([ims[i] for i in rows], [prompts[i] for i in rows], method=method,
                            temperature=0, max_new_tokens=10, seed=0,
                            static_cache=static).token_ids
    return Case(run, ("exact", "sjd"))


def _speech(tts, texts, methods, static=True, frames=8) -> Case:
    def run(method, rows, static_):
        out = tts([texts[i] for i in rows], method=method, temperature=0, max_frames=frames,
                  progress=False, decode=False, static_cache=static_)
        return [c.tolist() for c in out.codes]
    return Case(run, methods, static)


def _delay_pattern() -> Case:
    from modalities.speech import TextToSpeech
    from tiny_speech import tiny_musicgen

    tts = TextToSpeech.from_pretrained(tiny_musicgen(), tiny_musicgen(seed=1, hidden=8, layers=1))
    return _speech(tts, [[3, 4, 5, 6, 7], [8, 9]], ("exact", "sjd"), static=False)


def _single_codebook() -> Case:
    from modalities.speech import SingleCodebookAdapter, TextToSpeech
    from test_speech import ToyCodec, _single

    def mk(m):
        return SingleCodebookAdapter(m, ToyCodec(), range(20, 36), end_id=36, prefix=[1],
                                     suffix=[2], max_frames=16)
    tts = TextToSpeech(mk(_single()), mk(_single(seed=1, hidden=16)))
    return _speech(tts, [[3, 4, 5, 6, 7], [8, 9]], ("exact", "sjd"), frames=12)


def _csm() -> Case:
    from modalities.speech import TextToSpeech
    from modalities.speech.csm import CsmAdapter
    from tiny_csm import tiny_csm

    target, draft = tiny_csm(scale=3.0), tiny_csm(scale=3.0)
    with torch.no_grad():                      # a perturbed copy: acceptance in (0, 1)
        for prm in draft.parameters():
            prm.add_(0.3 * torch.randn_like(prm) * prm.abs().mean())
    tts = TextToSpeech(CsmAdapter(target, max_frames=8), CsmAdapter(draft, max_frames=8))
    return _speech(tts, [[4, 5, 6, 7, 8], [9, 10]], ("exact",))


CASES = {
    "janus": lambda: _image("janus"), "emu3": lambda: _image("emu3"),
    "llamagen": lambda: _image("llamagen"), "token-span": lambda: _image("token-span"),
    "llava": lambda: _vlm("llava"), "llava-next": lambda: _vlm("llava-next"),
    "delay-pattern": _delay_pattern, "single-codebook": _single_codebook, "csm": _csm,
}
NAMES = [a.name for a in adapters()]


@pytest.fixture(scope="module", params=NAMES)
def case(request):
    if request.param not in CASES:
        pytest.fail(f"adapter {request.param!r} is registered without a conformance case")
    torch.manual_seed(0)
    return CASES[request.param]()


def test_every_registered_adapter_has_a_case():
    assert set(NAMES) == set(CASES), set(NAMES) ^ set(CASES)


def test_speculative_greedy_equals_plain_greedy(case):
    plain = case.run("plain", [0, 1], False)
    for method in case.methods:
        assert case.run(method, [0, 1], False) == plain, method


def test_static_caches_give_the_dynamic_tokens(case):
    plain = case.run("plain", [0, 1], False)
    if not case.static:
        with pytest.raises(ValueError, match="static_cache"):
            case.run("plain", [0, 1], True)
        return
    for method in ("plain",) + case.methods:
        assert case.run(method, [0, 1], True) == plain, method


def test_batch_rows_equal_their_single_row_runs(case):
    for method in ("plain", case.methods[0]):
        both = case.run(method, [0, 1], False)
        assert both == case.run(method, [0], False) + case.run(method, [1], False), method
