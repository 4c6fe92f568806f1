"""Text-to-speech with speculative decoding beside plain decoding, at the same seed.

    python -m recipes.tts "a small blue star at the bottom" --method exact --out out/tts
    python -m recipes.tts --texts-file lines.txt --model path/or/id --draft path --method pcg \\
        --theta 0.45

Writes WAV files for plain decoding and the method, a spectrogram comparison
(comparison.png: plain above, the method below, per text), and prints frames per step,
acceptance, real-time factor and the speedup against plain decoding measured in this run.
Without --model it uses the bundled shapes-world TTS pair (samples/models/shapes-tts*).
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass


from recipes.cli import (Parser, add_common, add_compile, add_method_flags, add_models,
                         add_sampling, bundled_pair, check_compile, check_head, check_method,
                         check_vocab, compile_switch, configure, describe, read_lines, run)

METHOD_PARAMS = ("num_draft_tokens", "theta", "window")


def comparison(plain, spec, method, path):
    """Plain decoding and the method at the same seed, one spectrogram per text."""
    from modalities.speech.audio import spectrogram_grid

    return spectrogram_grid({"plain": plain.waveforms, method: spec.waveforms}, plain.sample_rate,
                            path)


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(description=__doc__.splitlines()[0])
    ap.add_argument("texts", nargs="*", help="texts to speak (or --text, or --texts-file)")
    ap.add_argument("--text", action="append", default=[],
                    help="a text (repeatable; default: none)")
    ap.add_argument("--texts-file", help="one text per line (default: none)")
    add_models(ap, "shapes-tts")
    ap.add_argument("--method", default="exact",
                    help="plain, exact, pcg, jacobi, or <drafter>+<rule>")
    add_method_flags(ap, METHOD_PARAMS)
    add_sampling(ap, top_p=False)
    ap.add_argument("--out", default="out/tts", help="output folder")
    add_compile(ap)
    add_common(ap)
    return describe(ap)


@dataclass(frozen=True)
class SpeechSizes:
    """What a speech model's config files tell before it loads: C ``codebooks`` of
    ``vocab_size`` ids each (as its adapter counts them: pad and end-of-speech included where
    the delay pattern forces them) and, for the bundled format, the characters it reads."""

    codebooks: int
    vocab_size: int
    alphabet: str | None = None


def read_sizes(spec, flag: str = "--model") -> SpeechSizes:
    """``SpeechSizes`` of a speech model folder or id from its config files alone (no
    weights); a folder of no speech layout the loader reads is refused, naming ``flag``."""
    from modalities.registry import load_pretrained
    from modalities.speech.delay import event_width
    from transformers import AutoConfig

    path = os.fspath(spec)
    meta = {}
    if os.path.isfile(os.path.join(path, "mmspec_speech.json")):
        with open(os.path.join(path, "mmspec_speech.json")) as f:
            meta = json.load(f)
    try:
        cfg = load_pretrained(AutoConfig, path)
    except ValueError as e:
        raise ValueError(f"{flag} {e}") from None
    if cfg.model_type == "musicgen":
        dec = cfg.decoder
        pad = meta.get("pad_id", dec.pad_token_id)
        width = event_width(int(dec.vocab_size), int(pad), meta.get("eos_id"))
        return SpeechSizes(int(dec.num_codebooks), width, meta.get("alphabet"))
    if cfg.model_type == "csm":
        return SpeechSizes(int(cfg.num_codebooks), int(cfg.vocab_size))
    raise ValueError(f"{flag} {path}: model_type {cfg.model_type!r} is not a speech target "
                     "mmspec knows: accepted the musicgen layout, csm, or a folder with "
                     "mmspec_speech.json")


def check_sizes(args, model: str, draft, params: dict, texts: list) -> None:
    """``--top-k`` (and any codebook-bounded method parameter) against the target's codebook,
    the draft's codebooks against the target's and the texts' characters against a bundled
    model's alphabet, from the config files (before any model loads)."""
    sizes = read_sizes(model)
    check_vocab(dict(params, top_k=args.top_k), sizes.vocab_size, "a codebook")
    other = read_sizes(draft, "--draft") if draft is not None else None
    if other is not None and (other.codebooks, other.vocab_size) != (sizes.codebooks,
                                                                     sizes.vocab_size):
        raise ValueError(f"--draft {draft}: {other.codebooks} codebooks of {other.vocab_size} "
                         f"ids, the target {sizes.codebooks} of {sizes.vocab_size}: accepted a "
                         "draft with the target's codebooks")
    if sizes.alphabet is not None:
        for i, text in enumerate(texts):
            bad = sorted({ch for ch in text.lower() if ch not in sizes.alphabet})
            if bad:
                raise ValueError(f"text {i + 1} {text!r:.60}: characters {bad} are outside the "
                                 f"model's alphabet: accepted {sizes.alphabet!r} (any case)")


def check_args(args, device: str, draft, params: dict, model: str | None = None) -> list:
    """Every check that needs no model, before any loads (sizes from the ``model`` folder's
    config files); returns the texts."""
    from mmspec.registry import parse_method

    check_compile(args, device)
    parse_method(args.method, params, has_draft=draft is not None, has_head=args.head is not None)
    check_head(args.head)
    texts = list(args.texts) + list(args.text)
    if args.texts_file:
        texts += read_lines(args.texts_file, "--texts-file")
    if not texts:
        raise ValueError("give texts (or --text, or --texts-file)")
    if model is not None:
        check_sizes(args, model, draft, params, texts)
    return texts


def main(argv=None):
    args = build_parser().parse_args(argv)
    device = configure(args)
    model, draft = bundled_pair(args.model, args.draft, "shapes-tts", "shapes-tts-draft")
    params = {k: getattr(args, k) for k in METHOD_PARAMS if getattr(args, k) is not None}
    texts = check_args(args, device, draft, params, model)
    from modalities.speech import TextToSpeech

    tts = TextToSpeech.from_pretrained(model, draft=draft, device=device, head=args.head)
    check_method(args.method, params, tts.draft is not None, tts.target.codebook_embeddings(0),
                 has_head=tts.head is not None)
    kw = dict(temperature=args.temperature, top_k=args.top_k, seed=args.seed,
              guidance_scale=args.guidance, compile=compile_switch(args))
    plain = tts(texts, method="plain", **kw)
    spec = tts(texts, method=args.method, **kw, **params)
    plain.save(os.path.join(args.out, "plain"), spectrogram=False)
    spec.save(os.path.join(args.out, args.method.replace("+", "_")), spectrogram=False)
    comparison(plain, spec, args.method, os.path.join(args.out, "comparison.png"))
    audio = sum(len(w) for w in spec.waveforms) / spec.sample_rate
    s = spec.stats
    print(f"{len(texts)} texts, {audio:.2f} s of audio; outputs in {args.out}")
    for name, o in (("plain", plain), (args.method, spec)):
        st = o.stats
        print(f"{name:14} frames/step {st.tokens_per_step:.2f}  acceptance {st.acceptance_rate:.3f}  "
              f"RTF {o.seconds / max(audio, 1e-9):.3f}  {o.seconds:.2f} s")
    print(f"speedup {plain.seconds / spec.seconds:.2f}x; codes identical to plain: "
          f"{all(len(a) == len(b) and bool((a == b).all()) for a, b in zip(plain.codes, spec.codes))}")
    del s
    return dict(plain=plain, spec=spec)


if __name__ == "__main__":
    run(main, "recipes.tts")
