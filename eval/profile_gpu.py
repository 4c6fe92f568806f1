"""Where a decoding step's time goes: the measurements behind docs/benchmarks.md's GPU-path analysis.

    python -m eval.profile_gpu --shape 7b --modes captured,graphs,inductor-untuned,inductor
    python -m eval.profile_gpu --shape janus-pro-7b --modes captured --k 4
    python -m eval.profile_gpu --shape tiny --device cpu --modes eager      # a smoke run

eval.bench_gpu's models (random bf16 weights; the draft is the target's first two layers, eps
0), one row, a 128-token prompt. Per mode (bench_gpu's ``COMPILE``: ``captured`` is
``compile=True``, ``graphs`` captures without compiling; ``inductor-untuned``:
``compile="inductor"`` without coordinate-descent tuning), one JSON line:

- ``capture_s``: seconds to the target's first width-1 step (prefill, compilation under
  ``captured`` / ``inductor``, capture);
- ``replay_ms``: the target's captured width-1 step replayed alone; ``launch_us`` /
  ``draft_launch_us``: host time of one replay call on an idle device (target, draft);
- ``step_ms``: one session step, not synchronised (what bench_gpu's bound uses);
  ``step_sync_ms``: the same with its result read on the host after every step;
- ``plain_ms_per_token`` / ``plain_sync_ms_per_token``: plain decoding of 128 tokens
  pipelined (the default) and synchronised step by step (``pipeline=False``), and whether
  their tokens are ``identical``;
- ``plain_graph_ms`` / ``plain_between_us`` / ``plain_between_ms`` / ``plain_before_ms`` /
  ``plain_after_ms``: one profiled plain call's device timeline (``call_timeline``): its
  step graphs (median; each a chain of ``Engine.plain_steps`` target steps where
  plain decoding chains them), the device time from one step graph's end to the next one's start
  (median and sum), before the first graph (the call's checks, the cache's reset) and after
  the last; ``plain_between_kernels``: the kernels and copies launched between the step
  graphs, by name (launches per step, microseconds each);
- ``loop_syncs``: synchronising CUDA calls made inside the loop of a plain and of a
  speculative call (``torch.cuda.set_sync_debug_mode``), by the mmspec line that made them;
- ``verify_ms`` / ``draft_ms`` / ``pt_ms`` / ``pd_ms``: a K + 1 wide target step, a one-token
  draft step, the target's and the draft's prompt passes (a reused cache's: captured under
  the captured modes), each measured alone;
- ``prompt_host_ms`` / ``prompt_kernel_ms`` / ``prompt_kernels``: one prompt pass of the
  target as ``pt_ms`` times it, under torch.profiler: the host's time to issue it, its
  kernels' device time and their count (a pass whose host time exceeds its device time is
  bound by its launches);
- ``spec_wall_ms`` / ``spec_kernel_ms`` / ``spec_model_ms``: one speculative call (K drafts)
  synchronised step by step (``pipeline=False``) unprofiled (the better of two), the summed
  device time of its kernels under torch.profiler, and its forward passes at the costs
  measured alone (prompt passes + steps x (verify + K x draft)); ``spec_steps``,
  ``spec_acceptance``; the same with ``spec_pipelined_`` for
  ``pipeline=True``. wall - kernel is device idle time, kernel - model the work outside the
  networks (sampling, acceptance, cache bookkeeping) plus any slowdown of the steps in the loop.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import traceback
import warnings
from collections import Counter
from dataclasses import replace

import torch

import mmspec
from mmspec.cache import crop
from mmspec.sessions import CausalLMSession

from .bench_gpu import (COMPILE, SHAPES, build, engine_of, prefill_cost, set_eps, step_cost, sync,
                        timed)
from recipes.cli import COUNT, Names, Parser, describe, run


def step_graph(session):
    """The CUDA graph of a session's one captured step (``warm_session``)."""
    (graph, _, _), = (v for k, v in session._static.graphs.items() if k[0] == "step")
    return graph


def warm_session(model, dev, cap, prompt, width):
    """A greedy session on a 512-slot static cache, ``prompt`` fed and one step of ``width``
    taken and rolled back (captured under ``cap``)."""
    s = CausalLMSession(model, mmspec.SamplingParams(temperature=0), static_len=512,
                        engine=engine_of(cap))
    s.prefill(prompt, torch.ones_like(prompt))
    s.step(prompt[:, :width])
    s.commit(0, torch.ones(1, 0, dtype=torch.bool, device=dev))   # captured, rolled back
    return s


def prompt_profile(model, dev, cap, prompt) -> dict:
    """One prompt pass on a reused static cache (``prefill_cost``'s: after a pass that
    allocates it) under torch.profiler: the host's milliseconds to issue it, its kernels'
    device milliseconds and count (on the CPU: its operations')."""
    from torch.profiler import ProfilerActivity, profile

    cuda = dev.type == "cuda"

    with torch.inference_mode():
        for _ in range(3):     # allocate, then compile the prompt's trace and capture
            s = CausalLMSession(model, mmspec.SamplingParams(temperature=0),
                                static_len=prompt.shape[1] + 64, engine=engine_of(cap))
            s.prefill(prompt, torch.ones_like(prompt))
        sync(dev)
        s = CausalLMSession(model, mmspec.SamplingParams(temperature=0),
                            static_len=prompt.shape[1] + 64, engine=engine_of(cap))
        with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
            t0 = time.perf_counter()
            s.prefill(prompt, torch.ones_like(prompt))
            host = time.perf_counter() - t0
            sync(dev)
    busy = [(e.self_device_time_total if cuda else e.self_cpu_time_total, e.count)
            for e in prof.key_averages()]
    return dict(prompt_host_ms=1e3 * host, prompt_kernel_ms=sum(t for t, _ in busy) / 1e3,
                prompt_kernels=sum(n for t, n in busy if t > 0))


def _loop_syncs(fn) -> dict:
    """Synchronising CUDA calls made while ``fn`` runs inside mmspec/loop.py, by line."""
    seen: Counter = Counter()

    def show(message, category, filename, lineno, file=None, line=None):
        frames = [f for f in traceback.extract_stack() if f.filename.endswith("mmspec/loop.py")]
        if frames:
            seen[f"loop.py:{frames[-1].name}:{frames[-1].lineno}"] += 1

    with warnings.catch_warnings():          # restores showwarning and the filters
        warnings.simplefilter("always")
        warnings.showwarning = show
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return dict(seen)


def call_timeline(events: list[dict]) -> dict:
    """A profiled call's kernels (torch.profiler's chrome-trace events) split at its CUDA graph
    replays: every device event is attributed to the runtime call that queued it (by its
    correlation id); the first replay is the prompt pass's when prompt passes are captured,
    so the step graphs are the later ones. Empty when no graph was replayed."""
    api = {e["args"]["correlation"]: e["name"] for e in events
           if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    device = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")),
                    key=lambda e: e["ts"])
    graphs: dict = {}
    for e in device:
        c = e.get("args", {}).get("correlation")
        if api.get(c) == "cudaGraphLaunch":
            span = graphs.setdefault(c, [e["ts"], e["ts"] + e["dur"]])
            span[1] = max(span[1], e["ts"] + e["dur"])
    spans = sorted(graphs.values())
    if len(spans) < 3:
        return {}
    steps = sorted(b - a for a, b in spans[1:])
    between = sorted(spans[i + 1][0] - spans[i][1] for i in range(1, len(spans) - 1))
    end = max(e["ts"] + e["dur"] for e in device)
    return dict(graph_ms=steps[len(steps) // 2] / 1e3, between_us=between[len(between) // 2],
                between_ms=sum(between) / 1e3, before_ms=(spans[0][0] - device[0]["ts"]) / 1e3,
                after_ms=(end - spans[-1][1]) / 1e3,
                between_kernels=_between_kernels(device, api, spans, len(between)))


def _between_kernels(device: list[dict], api: dict, spans: list, gaps: int) -> list[dict]:
    """The device events queued outside the graphs between the first step graph and the last
    one, by name (most device time first): launches per step and microseconds each."""
    first, last = spans[1][0], spans[-1][0]
    rows: dict = {}
    for e in device:
        if (first < e["ts"] < last
                and api.get(e.get("args", {}).get("correlation")) != "cudaGraphLaunch"):
            r = rows.setdefault(e["name"][:100], [0, 0.0])
            r[0] += 1
            r[1] += e["dur"]
    return [dict(name=n, per_step=c / gaps, us=t / c)
            for n, (c, t) in sorted(rows.items(), key=lambda kv: -kv[1][1])]


def plain_timeline(target, prompt, gen: dict) -> dict:
    """``call_timeline`` of one plain call (after the calls timed before it)."""
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        mmspec.generate(target, None, prompt, **gen)
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    return {f"plain_{k}": v for k, v in call_timeline(events).items()}


def profile_mode(target, draft, dev, mode: str, k: int = 4, new_tokens: int = 128,
                 prompt_len: int = 128, reps: int = 30, trace: str | None = None) -> dict:
    untuned = {"inductor_options": {}} if mode == "inductor-untuned" else {}
    cap = engine_of({**COMPILE, "inductor-untuned": "inductor"}[mode], **untuned)
    cuda = dev.type == "cuda"

    def piped(pipeline) -> dict:
        return {"engine": replace(cap, pipeline=pipeline)}

    if cuda:
        torch._dynamo.reset()
    mmspec.release_graphs()
    r = dict(mode=mode, k=k)
    prompt = torch.randint(2, target.config.vocab_size, (1, prompt_len), device=dev,
                           generator=torch.Generator(device=dev).manual_seed(0))
    none = torch.ones(1, 0, dtype=torch.bool, device=dev)
    with torch.inference_mode():
        t0 = time.perf_counter()
        s = warm_session(target, dev, cap, prompt, 1)
        sync(dev)
        r["capture_s"] = time.perf_counter() - t0     # compilation and capture, width 1
        tok = prompt[:, :1]
        if cap.captures:
            for name, model, sess in (("", target, s), ("draft_", draft, None)):
                sess = sess or warm_session(model, dev, cap, prompt, 1)
                graph, host = step_graph(sess), []
                for _ in range(reps):
                    sync(dev)
                    t0 = time.perf_counter()
                    graph.replay()
                    host.append(time.perf_counter() - t0)
                    crop(sess.cache, 1)
                r[f"{name}launch_us"] = 1e6 * sorted(host)[reps // 2]
            graph = step_graph(s)
            sync(dev)
            t0 = time.perf_counter()
            for _ in range(reps):
                graph.replay()
                crop(s.cache, 1)
            sync(dev)
            r["replay_ms"] = 1e3 * (time.perf_counter() - t0) / reps
        sync(dev)
        t0 = time.perf_counter()
        for _ in range(reps):
            s.step(tok).argmax(-1).tolist()       # the step, read on the host
            s.commit(0, none)                     # and rolled back
        sync(dev)
        r["step_sync_ms"] = 1e3 * (time.perf_counter() - t0) / reps
        del s
    r["step_ms"] = 1e3 * step_cost(target, 1, 1, dev, cap, prompt_len, reps)
    gen = dict(temperature=0, max_new_tokens=new_tokens, stop_token_ids=[])
    outs = {}
    for key, pipe in (("plain_ms_per_token", None), ("plain_sync_ms_per_token", False)):
        # two untimed calls: the first captures, the second compiles the prompt's trace
        outs[key], t = timed(lambda: mmspec.generate(
            target, None, prompt, **gen, **piped(pipe)), dev, warmup=2)
        r[key] = 1e3 * t / new_tokens
    r["identical"] = bool(torch.equal(outs["plain_ms_per_token"].sequences,
                                      outs["plain_sync_ms_per_token"].sequences))
    if cuda and cap.captures:
        r.update(plain_timeline(target, prompt, {**gen, **piped(None)}))
    spec = dict(gen, num_draft_tokens=k)
    c = dict(verify=step_cost(target, 1, k + 1, dev, cap, prompt_len, reps),
             draft=step_cost(draft, 1, 1, dev, cap, prompt_len, reps),
             pt=prefill_cost(target, 1, dev, prompt_len, compile=cap),
             pd=prefill_cost(draft, 1, dev, prompt_len, compile=cap))
    r.update({f"{key}_ms": 1e3 * v for key, v in c.items()})
    r.update(prompt_profile(target, dev, cap, prompt))
    for tag, pipe in (("spec", False), ("spec_pipelined", True)):
        out, t = timed(lambda: mmspec.generate(target, draft, prompt, **spec, **piped(pipe)),
                       dev, warmup=2)
        r[f"{tag}_wall_ms"] = 1e3 * t
        r[f"{tag}_steps"] = out.stats.steps
        r[f"{tag}_acceptance"] = out.stats.acceptance_rate
        # The call's forward passes at their separately measured costs.
        r[f"{tag}_model_ms"] = 1e3 * (c["pt"] + c["pd"] + out.stats.steps
                                      * (c["verify"] + k * c["draft"]))
        if cuda:
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                mmspec.generate(target, draft, prompt, **spec, **piped(pipe))
                sync(dev)
            events = prof.key_averages()
            r[f"{tag}_kernel_ms"] = sum(e.self_device_time_total for e in events) / 1e3
            if trace:
                with open(os.path.join(trace, f"{mode}_{tag}_kernels.txt"), "w") as f:
                    f.write(events.table(sort_by="self_cuda_time_total", row_limit=40,
                                         max_name_column_width=90))
    if cuda:
        r["loop_syncs"] = dict(
            plain=_loop_syncs(lambda: mmspec.generate(target, None, prompt, **gen, **piped(None))),
            speculative=_loop_syncs(lambda: mmspec.generate(target, draft, prompt,
                                                            **spec, **piped(False))),
            pipelined=_loop_syncs(lambda: mmspec.generate(target, draft, prompt,
                                                          **spec, **piped(True))))
    return r


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=list(SHAPES), default="7b", help="model shape")
    ap.add_argument("--device", default="cuda", help="cuda, cuda:1 ... (cpu: eager only)")
    ap.add_argument("--modes", type=Names((*COMPILE, "inductor-untuned")),
                    default="captured,graphs",
                    help="captured: compile=True (regional); graphs: compile='graphs'")
    ap.add_argument("--k", type=COUNT, default=4, help="drafts per step K")
    ap.add_argument("--new-tokens", type=COUNT, default=128)
    ap.add_argument("--prompt", type=COUNT, default=128, help="prompt tokens")
    ap.add_argument("--trace", default=None,
                    help="a folder: each speculative call's kernel table is written there "
                         "(default: none)")
    return describe(ap)


def main(argv=None):
    a = build_parser().parse_args(argv)
    if a.trace:
        os.makedirs(a.trace, exist_ok=True)
    dev = torch.device(a.device)
    target, draft, originals = build(a.shape, dev, torch.bfloat16 if dev.type == "cuda" else
                                     torch.float32)
    set_eps(originals, 0.0)
    rows = []
    for mode in a.modes:
        row = profile_mode(target, draft, dev, mode, a.k, a.new_tokens, a.prompt, trace=a.trace)
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


if __name__ == "__main__":
    run(main, "eval.profile_gpu")
