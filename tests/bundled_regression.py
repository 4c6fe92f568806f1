"""Seeded generations of the bundled models, compared with committed references.

Regression checks on loading and on the loop, not on quality. They run the bundled models in
float32: bf16 matrix kernels on the CPU round differently on different processors (AMX,
AVX-512, AVX2), which breaks near-ties between tokens, so a reference written in bf16 on one
machine fails on another. float32 leaves differences near 1e-7, far below any gap a seeded
sampler or an argmax meets over these short runs; ``test_bundled_regression`` also reruns
each check with oneDNN (mkldnn) disabled, so a check that depended on one kernel path fails
here rather than on a user's machine.

    python tests/bundled_regression.py      # rewrite tests/data/bundled_*_seed0.json
"""

from __future__ import annotations

import functools
import json
import os

import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)   # run as a script: the repository's packages
MODELS = os.path.join(ROOT, "samples", "models")
DATA = os.path.join(ROOT, "tests", "data")
F32 = dict(dtype=torch.float32)


@functools.lru_cache(maxsize=None)
def t2i():
    from modalities.image import TextToImage

    return TextToImage.from_pretrained(os.path.join(MODELS, "shapes-t2i"),
                                       draft=os.path.join(MODELS, "shapes-t2i-draft"), **F32)


@functools.lru_cache(maxsize=None)
def tts():
    from modalities.speech import TextToSpeech

    return TextToSpeech.from_pretrained(os.path.join(MODELS, "shapes-tts"),
                                        draft=os.path.join(MODELS, "shapes-tts-draft"), **F32)


@functools.lru_cache(maxsize=None)
def vlm():
    from modalities.vlm import VisionLanguageGenerator

    return VisionLanguageGenerator.from_pretrained(
        os.path.join(MODELS, "shapes-vlm"), draft=os.path.join(MODELS, "shapes-vlm-text-draft"), **F32)


def t2i_tokens(ref: dict) -> list[int]:
    out = t2i()(ref["caption"], method=ref["method"], seed=ref["seed"],
                guidance_scale=ref["guidance_scale"], progress=False, decode=False)
    return out.tokens[0].tolist()


def tts_codes(ref: dict) -> list[list[int]]:
    return tts()(ref["text"], method="exact", seed=0, progress=False, decode=False).codes[0].tolist()


def vlm_ids(ref: dict) -> list[int]:
    from modalities import shapes_world as sw

    img = sw.sample(ref["seed_scene"])[1]
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": ref["question"]}]}]
    out = vlm().generate(img, msgs, method="exact", seed=0, temperature=1.0, max_new_tokens=16)
    return out.token_ids[0]


# reference file -> (the key holding the result, the function that recomputes it)
CHECKS = {
    "bundled_t2i_exact_seed0.json": ("tokens", t2i_tokens),
    "bundled_tts_seed0.json": ("codes", tts_codes),
    "bundled_vlm_seed0.json": ("ids", vlm_ids),
}


def load(name: str) -> dict:
    with open(os.path.join(DATA, name)) as f:
        return json.load(f)


def main() -> None:
    for name, (key, fn) in CHECKS.items():
        ref = load(name)
        with torch.inference_mode():
            ref[key] = fn(ref)
        with open(os.path.join(DATA, name), "w") as f:
            json.dump(ref, f)
        print(f"wrote tests/data/{name}")


if __name__ == "__main__":
    main()
