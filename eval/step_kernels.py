"""A decoding step's kernels and time over fresh compilations, per inductor setting.

    python -m eval.step_kernels --compilations 3 \\
        --setting realize_opcount_threshold=30 --setting realize_opcount_threshold=6
    python -m eval.step_kernels --shape tiny --device cpu --compilations 1   # a smoke run

eval.bench_gpu's target (random bf16 weights), one row, a 128-token prompt, a step of
``--width`` tokens (1: plain decoding's step; K + 1: a chain's verification). Each compilation
runs in a fresh process with an empty inductor cache (``TORCHINDUCTOR_CACHE_DIR`` a new
temporary folder), the settings interleaved (A, B, A, B, ...): inductor's coordinate-descent
tuning lands on different kernel configurations from one compilation to the next, so one
compilation per setting says little. A setting is comma-separated ``KEY=VALUE`` inductor
options (VALUE as JSON) laid over ``Engine.inductor_options``, or with KEY
``engine.NAME`` a speed field of ``mmspec.engine.Engine`` (``engine.row_kernels=false``);
an empty setting is the defaults. Under CUDA the step is captured (``compile=True``) and, at
width 1, its graph replayed alone (``replay_ms``, 100 replays after 20; wider steps through
the session's step and rollback, as ``eval.bench_gpu.step_cost``); on the CPU the eager step
is timed.
One JSON line per compilation with the top ``--kernels`` kernels of one step (name, launches
per step, microseconds per launch), then one line per setting: the step's min, median and
max over its compilations.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from recipes.cli import COUNT, ROOT, Parser, describe, run


def parse_setting(text: str) -> dict:
    """``"K1=V1,K2=V2"`` -> {K1: V1, K2: V2} (VALUE as JSON); ``""`` -> {}."""
    from dataclasses import fields

    from mmspec.engine import Engine

    from .bench_gpu import inductor_option

    setting = dict(inductor_option(part) for part in text.split(",") if part)
    names = [f.name for f in fields(Engine)[3:] if not f.name.endswith("inductor_options")]
    attributes = split_setting(setting)[1]
    for name in attributes:
        if name not in names:
            raise argparse.ArgumentTypeError(f"'engine.{name}': accepted an Engine speed "
                                             f"field ({', '.join(names)}; inductor options "
                                             "as KEY=VALUE)")
    try:
        Engine(**attributes)                           # values checked before any work
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return setting


def split_setting(setting: dict) -> tuple[dict, dict]:
    """(its inductor options, its ``engine.NAME`` entries by NAME) of a setting."""
    options, attributes = {}, {}
    for k, v in setting.items():
        if k.startswith("engine."):
            attributes[k.removeprefix("engine.")] = v
        else:
            options[k] = v
    return options, attributes


def _kernel_rows(prof, steps: int, top: int) -> list[dict]:
    cuda = torch.autograd.DeviceType.CUDA
    events = [e for e in prof.events() if e.device_type == cuda] or list(prof.events())
    rows: dict[str, list] = {}
    for e in events:
        us = e.device_time_total if e.device_type == cuda else e.self_cpu_time_total
        r = rows.setdefault(e.name, [0, 0.0])
        r[0] += 1
        r[1] += us
    ranked = sorted(rows.items(), key=lambda kv: -kv[1][1])[:top]
    return [dict(name=n[:120], per_step=c / steps, us=t / c) for n, (c, t) in ranked]


def _step(session, cuda: bool, tokens, none):
    """One step of ``tokens`` [1, width], rolled back: the captured width-1 graph replayed
    alone (CUDA), else the session's step and its commit (captured under CUDA)."""
    from mmspec.cache import crop

    from .profile_gpu import step_graph

    if cuda and tokens.shape[1] == 1:
        graph = step_graph(session)

        def step():
            graph.replay()
            crop(session.cache, 1)
    else:
        def step():
            session.step(tokens)
            session.commit(0, none)
    return step


def measure(shape: str, device: str, setting: dict, top: int, width: int = 1) -> dict:
    """One compilation of ``setting``: the step's time and its kernels, in this process."""
    from mmspec.engine import INDUCTOR_OPTIONS

    from .bench_gpu import build, engine_of, sync
    from .profile_gpu import warm_session

    dev = torch.device(device)
    cuda = dev.type == "cuda"
    options, attributes = split_setting(setting)
    engine = engine_of(cuda, inductor_options={**dict(INDUCTOR_OPTIONS), **options},
                       **attributes)
    target, _, _ = build(shape, dev, torch.bfloat16 if cuda else torch.float32)
    prompt = torch.randint(2, target.config.vocab_size, (1, 128), device=dev,
                           generator=torch.Generator(device=dev).manual_seed(0))
    none = torch.ones(1, 0, dtype=torch.bool, device=dev)
    with torch.inference_mode():
        t0 = time.perf_counter()
        s = warm_session(target, dev, engine, prompt, width)   # captured, rolled back
        sync(dev)
        capture_s = time.perf_counter() - t0
        step = _step(s, cuda, prompt[:, :width], none)
        for _ in range(20 if cuda else 2):
            step()
        sync(dev)
        reps = 100 if cuda else 5
        t0 = time.perf_counter()
        for _ in range(reps):
            step()
        sync(dev)
        replay_ms = (time.perf_counter() - t0) / reps * 1e3
        steps = 10 if cuda else 2
        kinds = torch.profiler.ProfilerActivity
        with torch.profiler.profile(activities=[kinds.CUDA if cuda else kinds.CPU]) as prof:
            for _ in range(steps):
                step()
            sync(dev)
    return dict(shape=shape, width=width, setting=setting, device=torch.cuda.get_device_name(dev)
                if cuda else "cpu", capture_s=capture_s, replay_ms=replay_ms,
                kernels=_kernel_rows(prof, steps, top))


def summary(rows: list[dict]) -> list[dict]:
    """Per setting (in first-seen order): the step's min, median and max over compilations."""
    by: dict[str, list[float]] = {}
    for r in rows:
        by.setdefault(json.dumps(r["setting"], sort_keys=True), []).append(r["replay_ms"])
    return [dict(setting=json.loads(k), compilations=len(v), min_ms=min(v),
                 median_ms=statistics.median(v), max_ms=max(v)) for k, v in by.items()]


def build_parser():
    from .bench_gpu import SHAPES

    ap = Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=list(SHAPES), default="7b", help="model shape")
    ap.add_argument("--device", default="cuda", help="cuda, cuda:1 ... (cpu: the eager step)")
    ap.add_argument("--setting", action="append", default=None, metavar="K=V[,K=V]",
                    help="inductor options over the defaults (repeat for an A/B; default: "
                         "the defaults alone)")
    ap.add_argument("--compilations", type=COUNT, default=3, help="fresh compilations per setting")
    ap.add_argument("--kernels", type=COUNT, default=8, help="kernels listed per compilation")
    ap.add_argument("--width", type=COUNT, default=1,
                    help="tokens per step (1: plain decoding; K + 1: a chain's verification)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    return describe(ap)


def main(argv=None):
    a = build_parser().parse_args(argv)
    texts = a.setting or [""]
    for text in texts + ([a.child] if a.child else []):     # refused before any work
        try:
            parse_setting(text)
        except argparse.ArgumentTypeError as err:
            raise ValueError(f"--setting: {err}") from None
    if a.child is not None:                                  # one compilation, in this process
        print(json.dumps(measure(a.shape, a.device, parse_setting(a.child), a.kernels,
                                 a.width)))
        return None
    rows = []
    for _ in range(a.compilations):
        for text in texts:
            with tempfile.TemporaryDirectory() as cache:
                env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache)
                cmd = [sys.executable, "-m", "eval.step_kernels", "--child", text, "--shape",
                       a.shape, "--device", a.device, "--kernels", str(a.kernels),
                       "--width", str(a.width)]
                out = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
            if out.returncode != 0:
                raise RuntimeError(f"eval.step_kernels --setting {text!r} failed:\n"
                                   f"{out.stderr[-2000:]}")
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(json.dumps(rows[-1]), flush=True)
    for line in summary(rows):
        print(json.dumps(line), flush=True)
    return rows


if __name__ == "__main__":
    run(main, "eval.step_kernels")
