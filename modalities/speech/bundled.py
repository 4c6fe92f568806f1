"""Loading speech targets: adapters, model objects, Hugging Face folders and the bundled
format (a folder with ``mmspec_speech.json``: a MusicgenForConditionalGeneration-layout
model, its codec folder, a character tokenizer and defaults)."""

from __future__ import annotations

import json
import os

from modalities.registry import generation_defaults, load_pretrained

from .adapters import CodecAdapter, DelayPatternAdapter
from .codec import EncodecCodec, load_codec
from .csm import CsmAdapter


class CharTokenizer:
    """Characters -> ids (the bundled TTS models read raw text)."""

    def __init__(self, alphabet: str, offset: int = 1):
        self.index = {ch: i + offset for i, ch in enumerate(alphabet)}

    def encode(self, text: str) -> list[int]:
        bad = sorted({ch for ch in text.lower() if ch not in self.index})
        if bad:
            raise ValueError(f"text has characters outside the model's alphabet: {bad}")
        return [self.index[ch] for ch in text.lower()]


def load_speech_adapter(spec, **load_kwargs):
    if isinstance(spec, CodecAdapter):
        return spec, {}
    if not isinstance(spec, (str, os.PathLike)):
        if type(spec).__name__ == "MusicgenForConditionalGeneration":
            return DelayPatternAdapter(spec, EncodecCodec(spec.audio_encoder)), generation_defaults(spec)
        if type(spec).__name__ == "CsmForConditionalGeneration":
            return CsmAdapter(spec), {}
        raise ValueError(f"cannot build a speech adapter from {type(spec).__name__}")
    path = os.fspath(spec)
    meta_path = os.path.join(path, "mmspec_speech.json")
    if os.path.isfile(meta_path):
        with open(meta_path) as f:
            meta = json.load(f)
        from transformers import MusicgenForConditionalGeneration

        model = load_pretrained(MusicgenForConditionalGeneration, path, **load_kwargs).eval()
        codec = load_codec(os.path.normpath(os.path.join(path, meta["codec"])))
        codec.to(next(model.parameters()).device)
        tok = CharTokenizer(meta["alphabet"], meta.get("char_offset", 1))
        adapter = DelayPatternAdapter(model, codec, tok, pad_token_id=meta["pad_id"],
                                      eos_token_id=meta.get("eos_id"), max_frames=meta["max_frames"])
        return adapter, dict(meta.get("defaults", {}))
    from transformers import AutoConfig, AutoProcessor, MusicgenForConditionalGeneration

    cfg = load_pretrained(AutoConfig, path, **load_kwargs)
    if cfg.model_type == "csm":
        from transformers import CsmForConditionalGeneration

        model = load_pretrained(CsmForConditionalGeneration, path, **load_kwargs).eval()
        try:
            proc = AutoProcessor.from_pretrained(path)
        except (OSError, ValueError):
            proc = None
        return CsmAdapter(model, tokenizer=getattr(proc, "tokenizer", proc)), {}
    if cfg.model_type != "musicgen":
        raise ValueError(f"{path}: model_type {cfg.model_type!r} is not a speech target mmspec "
                         "knows (musicgen layout, csm, or a folder with mmspec_speech.json)")
    model = load_pretrained(MusicgenForConditionalGeneration, path, **load_kwargs).eval()
    try:
        tok = AutoProcessor.from_pretrained(path).tokenizer
    except Exception:  # no tokenizer files next to the weights
        tok = None
    return DelayPatternAdapter(model, EncodecCodec(model.audio_encoder), tok), generation_defaults(model)
