"""Seeded generations of the bundled models reproduce committed references, in float32, with
and without oneDNN (tests/bundled_regression.py says why both)."""

from __future__ import annotations

import pytest
import torch

import bundled_regression as reg


@pytest.mark.parametrize("mkldnn", [True, False], ids=["onednn", "no-onednn"])
@pytest.mark.parametrize("name", sorted(reg.CHECKS))
def test_bundled_generation_reproduces_committed_reference(name, mkldnn):
    key, fn = reg.CHECKS[name]
    ref = reg.load(name)
    before = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = mkldnn
    try:
        got = fn(ref)
    finally:
        torch.backends.mkldnn.enabled = before
    assert got == ref[key]


def test_bundled_pipelines_keep_greedy_equality_in_their_default_configuration():
    """Loaded as a user loads them (no dtype given): float32, where speculative greedy
    decoding gives plain greedy decoding's tokens on any processor."""
    import os

    from modalities.image import TextToImage
    from modalities.speech import TextToSpeech

    t2i = TextToImage.from_pretrained(os.path.join(reg.MODELS, "shapes-t2i"),
                                      draft=os.path.join(reg.MODELS, "shapes-t2i-draft"))
    assert t2i.target.model.dtype == torch.float32 and t2i.draft.model.dtype == torch.float32
    caps = ["a large red circle at the top left", "a small blue star at the bottom"]
    kw = dict(temperature=0, progress=False, decode=False, seed=0)
    plain = t2i(caps, method="plain", **kw).tokens
    for method in ("exact", "sjd"):
        assert torch.equal(t2i(caps, method=method, **kw).tokens, plain), method
    tts = TextToSpeech.from_pretrained(os.path.join(reg.MODELS, "shapes-tts"),
                                       draft=os.path.join(reg.MODELS, "shapes-tts-draft"))
    assert next(tts.target.model.parameters()).dtype == torch.float32
    kw = dict(temperature=0, progress=False, decode=False, max_frames=60)
    plain = tts("a small blue star at the bottom", method="plain", **kw).codes[0]
    assert torch.equal(tts("a small blue star at the bottom", method="exact", **kw).codes[0], plain)
