"""Time to the first generated token: compilation and capture of every width a call needs.

    python -m eval.first_call --modes captured,graphs            # 7B Llama shape, bf16, CUDA
    python -m eval.first_call --shape tiny --device cpu --modes eager   # a smoke run

eval.bench_gpu's target and draft (random bf16 weights, the draft the target's first two
layers, eps 0), one row, a 128-token prompt, 128 new tokens, greedy. Each mode runs in a fresh
process with an empty inductor cache (``TORCHINDUCTOR_CACHE_DIR`` in a new temporary folder),
so nothing compiled by an earlier mode or run is reused. In it: a speculative call (K drafts;
its steps: the target K + 1 wide, the draft one wide) timed from the call to its return
(``spec_first_s``: compilation, capture and the call), the same call again
(``spec_second_s``: under ``compile=True`` the prompt pass on the reused cache is compiled
here, once for every prompt length), a third time (``spec_s``, warm), then plain decoding once
(``plain_first_s``: the width-1 step captured) and again (``plain_s``). First minus warm is
the time spent compiling and capturing. One JSON line per mode.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

from recipes.cli import COUNT, ROOT, Names, Parser, describe, run



def measure(shape: str, device: str, mode: str, k: int, new_tokens: int, prompt_len: int) -> dict:
    """The five timings of one mode, in this process."""
    import mmspec

    from .bench_gpu import COMPILE, build, set_eps, sync

    dev = torch.device(device)
    target, draft, originals = build(shape, dev, torch.bfloat16 if dev.type == "cuda"
                                     else torch.float32)
    set_eps(originals, 0.0)
    prompt = torch.randint(2, target.config.vocab_size, (1, prompt_len), device=dev,
                           generator=torch.Generator(device=dev).manual_seed(0))
    gen = dict(temperature=0, max_new_tokens=new_tokens, stop_token_ids=[],
               compile=COMPILE[mode], static_cache=mode != "eager")
    row = dict(mode=mode, shape=shape, k=k, device=torch.cuda.get_device_name(dev)
               if dev.type == "cuda" else "cpu")
    for tag, d, kk in (("spec_first_s", draft, k), ("spec_second_s", draft, k),
                       ("spec_s", draft, k), ("plain_first_s", None, 0), ("plain_s", None, 0)):
        sync(dev)
        t0 = time.perf_counter()
        mmspec.generate(target, d, prompt, num_draft_tokens=kk, **gen)
        sync(dev)
        row[tag] = time.perf_counter() - t0
    return row


def build_parser():
    from .bench_gpu import COMPILE, SHAPES

    ap = Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=list(SHAPES), default="7b", help="model shape")
    ap.add_argument("--device", default="cuda", help="cuda, cuda:1 ... (cpu: eager only)")
    ap.add_argument("--modes", type=Names(tuple(COMPILE)), default="captured,graphs",
                    help="captured: compile=True (regional); graphs: compile='graphs'")
    ap.add_argument("--k", type=COUNT, default=4, help="drafts per step K")
    ap.add_argument("--new-tokens", type=COUNT, default=128)
    ap.add_argument("--prompt", type=COUNT, default=128, help="prompt tokens")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return describe(ap)


def main(argv=None):
    a = build_parser().parse_args(argv)
    if torch.device(a.device).type != "cuda" and any(m != "eager" for m in a.modes):
        raise ValueError(f"--modes {','.join(a.modes)}: accepted eager only on {a.device}")
    if a.child:                                   # one mode, in this process
        print(json.dumps(measure(a.shape, a.device, a.modes[0], a.k, a.new_tokens, a.prompt)))
        return None
    rows = []
    for mode in a.modes:
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache)
            cmd = [sys.executable, "-m", "eval.first_call", "--child", "--modes", mode,
                   "--shape", a.shape, "--device", a.device, "--k", str(a.k),
                   "--new-tokens", str(a.new_tokens), "--prompt", str(a.prompt)]
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
        if out.returncode != 0:
            raise RuntimeError(f"eval.first_call --modes {mode} failed:\n{out.stderr[-2000:]}")
        row = json.loads(out.stdout.strip().splitlines()[-1])
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


if __name__ == "__main__":
    run(main, "eval.first_call")
