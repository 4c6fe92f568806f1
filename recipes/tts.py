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
import os


from recipes.cli import (Parser, add_common, add_compile, add_method_flags, add_models,
                         add_sampling, bundled_pair, check_compile, check_head, check_method,
                         compile_switch, configure, describe, read_lines, run)

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


def check_args(args, device: str, draft, params: dict) -> list:
    """Every check that needs no model, before any loads; returns the texts."""
    from mmspec.registry import parse_method

    check_compile(args, device)
    parse_method(args.method, params, has_draft=draft is not None, has_head=args.head is not None)
    check_head(args.head)
    texts = list(args.texts) + list(args.text)
    if args.texts_file:
        texts += read_lines(args.texts_file, "--texts-file")
    if not texts:
        raise ValueError("give texts (or --text, or --texts-file)")
    return texts


def main(argv=None):
    args = build_parser().parse_args(argv)
    device = configure(args)
    model, draft = bundled_pair(args.model, args.draft, "shapes-tts", "shapes-tts-draft")
    params = {k: getattr(args, k) for k in METHOD_PARAMS if getattr(args, k) is not None}
    texts = check_args(args, device, draft, params)
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
