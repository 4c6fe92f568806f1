"""Is generation on this device bitwise reproducible? Same process, same inputs, repeated.

    python -m eval.repro_check                 # default attention kernels
    python -m eval.repro_check --math          # attention through the math kernel

Plain sampling of the bundled text-to-image model on the first ``--num-prompts`` evaluation
captions, ``--repeats`` times with one seed: how many rows repeat the first run's ids
exactly; and a fixed-shape forward pass repeated: bitwise equal or not. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--math", action="store_true", help="math attention kernel only")
    ap.add_argument("--num-prompts", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args(argv)
    if a.math:
        for name in ("enable_flash_sdp", "enable_mem_efficient_sdp", "enable_cudnn_sdp"):
            if hasattr(torch.backends.cuda, name):
                getattr(torch.backends.cuda, name)(False)
    from modalities.image import TextToImage

    with open(os.path.join(ROOT, "samples", "prompts", "shapes_eval.txt")) as f:
        caps = [line.strip() for line in f if line.strip()][: a.num_prompts]
    pipe = TextToImage.from_pretrained(os.path.join(ROOT, "samples", "models", "shapes-t2i"))
    pipe.target.model.to(a.device)
    if hasattr(pipe.target.vq, "vq"):
        pipe.target.vq.vq.to(a.device)
    runs = [pipe(caps, method="plain", seed=0, progress=False).tokens for _ in range(a.repeats)]
    m = pipe.target.model
    g = torch.Generator(a.device).manual_seed(0)
    ids = torch.randint(0, m.config.vocab_size, (len(caps), 300), device=a.device, generator=g)
    with torch.no_grad():
        logits = [m(input_ids=ids).logits for _ in range(a.repeats)]
    res = dict(device=str(a.device), math_attention=a.math, rows=len(caps),
               identical_rows=[int((runs[0] == r).all(1).sum()) for r in runs[1:]],
               forward_bitwise_equal=[bool(torch.equal(logits[0], x)) for x in logits[1:]])
    print(json.dumps(res), flush=True)
    return res


if __name__ == "__main__":
    main()
