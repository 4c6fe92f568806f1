"""The engine's own cost per draft token, without the model: a session over a stub network.

    python -m eval.bench_overhead            # CPU; --device cuda on a GPU
    python -m eval.bench_overhead --loop     # host time per step of whole generate calls
    python -m eval.bench_overhead --ops      # tensor operations per step outside the steps
    python -m eval.bench_overhead --call     # host time of a whole call of one token

A ``CausalLMSession`` on the static-cache path drafts K tokens greedily through
``ModelDrafter`` while its network is replaced by a function that returns fixed logits, so
what is timed is everything mmspec does around a forward: sequence plan, the 4-D mask,
sampling, bookkeeping, the commit. Prints microseconds per draft token (best of ``--repeats``).
"""

from __future__ import annotations

import argparse
import time
import types

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import mmspec
from mmspec.drafters import ModelDrafter
from mmspec.sessions import CausalLMSession
from recipes.cli import COUNT, Parser, describe, run


def overhead_us(device: str = "cpu", k: int = 8, tokens: int = 400, vocab: int = 32000) -> float:
    model = _stub(vocab, torch.randn(1, 1, vocab, device=device), device, layers=1)
    s = CausalLMSession(model, mmspec.SamplingParams(temperature=0), static_len=16 + tokens + 2 * k)
    ids = torch.randint(1, vocab, (1, 16), device=device)
    with torch.inference_mode():
        s.prefill(ids, torch.ones_like(ids))
        drafter = ModelDrafter(s, k)
        ones = torch.ones(1, k, dtype=torch.long, device=device)
        rounds = tokens // k
        if device != "cpu":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(rounds):
            drafter.propose(ids[:, -1], 10**9)
            s.commit(k, ones)
        if device != "cpu":
            torch.cuda.synchronize()
    return (time.perf_counter() - t0) / (rounds * k) * 1e6


def _stub(vocab: int, logits: torch.Tensor, device: str, layers: int = 2):
    """A Llama (its config and cache layout) whose forward returns ``logits`` [1, 1, V] for
    every input position: the engine's work around it is what gets timed."""
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=8, intermediate_size=16,
                      num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=2,
                      pad_token_id=0)
    model = LlamaForCausalLM(cfg).to(device).eval()

    def forward(input_ids=None, **kw):
        return types.SimpleNamespace(logits=logits.expand(*input_ids.shape, vocab))
    model.forward = forward
    return model


def loop_us(device: str = "cpu", k: int = 4, tokens: int = 240, vocab: int = 64,
            repeats: int = 3) -> dict:
    """Host microseconds per loop step of whole ``generate`` calls (static caches, greedy)
    with stub target and draft networks that share fixed logits (so every draft is accepted):
    plain decoding, speculative steps synchronised one by one, and pipelined
    (``pipeline=True``). On a GPU the synchronised figure is what the device waits for
    between two speculative steps at most; the pipelined one runs in the device's shadow."""
    logits = torch.randn(1, 1, vocab, device=device)
    target, draft = _stub(vocab, logits, device), _stub(vocab, logits, device)
    ids = torch.randint(1, vocab, (1, 16), device=device)
    kw = dict(temperature=0, max_new_tokens=tokens, num_draft_tokens=k, static_cache=True,
              stop_token_ids=[])
    res, seqs = {}, {}
    for name, d, pipe in (("plain", None, None), ("speculative", draft, False),
                          ("speculative_pipelined", draft, True)):
        best = float("inf")
        for _ in range(repeats + 1):
            t0 = time.perf_counter()
            out = mmspec.generate(target, d, ids, pipeline=pipe, **kw)
            if device != "cpu":
                torch.cuda.synchronize()
            best = min(best, (time.perf_counter() - t0) / out.stats.steps)
        res[name] = best * 1e6
        seqs[name] = out.sequences
        if d is not None:
            res[f"{name}_acceptance"] = out.stats.acceptance_rate
    res["identical"] = all(torch.equal(v, seqs["plain"]) for v in seqs.values())
    return res


def call_us(device: str = "cpu", layers: int = 32, prompt: int = 128, vocab: int = 64,
            repeats: int = 5) -> float:
    """Host microseconds of a whole ``generate`` call of one new token (static cache, greedy)
    on a stub network of ``layers`` decoder layers: the call's set-up (checks, plan, session,
    the kept static cache), the prompt pass and one step around a forward that costs
    nothing, and the output. Best of ``repeats`` rounds of 20 calls."""
    model = _stub(vocab, torch.randn(1, 1, vocab, device=device), device, layers=layers)
    ids = torch.randint(1, vocab, (1, prompt), device=device)
    kw = dict(temperature=0, max_new_tokens=1, static_cache=True, stop_token_ids=[],
              attention_mask=torch.ones_like(ids))
    mmspec.generate(model, None, ids, **kw)           # the static cache, kept for the next
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(20):
            mmspec.generate(model, None, ids, **kw)
        if device != "cpu":
            torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / 20)
    return best * 1e6


def ops_per_step(k: int = 4, vocab: int = 64) -> dict:
    """Tensor operations (views excluded: each of the others is a kernel on a GPU) that the
    loop, the rules and the sessions run per step outside the static step itself (mask,
    positions and forward: what ``compile=True`` captures as one graph), for plain and for
    speculative decoding (greedy, stub networks, static caches, CPU). Counted with a
    TorchDispatchMode over two calls of different lengths, so per-call setup cancels."""
    import contextlib

    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.n, self.inside = 0, 0

        def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
            if not self.inside and not func.is_view and func.__name__.split(".")[0] not in (
                    "detach", "detach_", "lift_fresh", "alias"):
                self.n += 1
            return func(*args, **(kwargs or {}))

    @contextlib.contextmanager
    def counting():
        step = CausalLMSession._static_step
        counter = Count()

        def inside(self, *a, **kw):
            counter.inside += 1
            try:
                return step(self, *a, **kw)
            finally:
                counter.inside -= 1
        CausalLMSession._static_step = inside
        try:
            with counter:
                yield counter
        finally:
            CausalLMSession._static_step = step

    logits = torch.randn(1, 1, vocab)
    target, draft = _stub(vocab, logits, "cpu"), _stub(vocab, logits, "cpu")
    ids = torch.randint(1, vocab, (1, 16))
    res = {}
    for name, d in (("plain", None), ("speculative", draft)):
        counts = []
        for tokens in (4 * (k + 1), 12 * (k + 1)):
            with counting() as c:
                out = mmspec.generate(target, d, ids, temperature=0, max_new_tokens=tokens,
                                      num_draft_tokens=k, static_cache=True, stop_token_ids=[])
            counts.append((c.n, out.stats.steps))
        (n0, s0), (n1, s1) = counts
        res[name] = (n1 - n0) / (s1 - s0)
    return res


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1 ...")
    ap.add_argument("--k", type=COUNT, default=None,
                    help="drafts per step (default: 8; with --loop or --ops: 4)")
    ap.add_argument("--repeats", type=COUNT, default=5, help="timed rounds")
    ap.add_argument("--loop", action="store_true",
                    help="host time per loop step of whole generate calls")
    ap.add_argument("--call", action="store_true",
                    help="host time of a whole generate call of one token (32 stub layers)")
    ap.add_argument("--ops", action="store_true",
                    help="tensor operations per loop step outside the (captured) static step")
    return describe(ap)


def main(argv=None):
    a = build_parser().parse_args(argv)
    if a.ops:
        r = ops_per_step(a.k or 4)
        print(f"tensor operations per step outside the static step (CPU, stub networks, "
              f"greedy): plain {r['plain']:.1f}, speculative K = {a.k or 4} {r['speculative']:.1f}")
        return r
    if a.call:
        us = call_us(a.device, repeats=a.repeats)
        print(f"host time per generate call of one token ({a.device}, 32-layer stub network, "
              f"128-token prompt, static cache): {us:.0f} us")
        return us
    if a.loop:
        r = loop_us(a.device, a.k or 4)
        print(f"host time per step ({a.device}, stub networks, acceptance "
              f"{r['speculative_acceptance']:.2f}): plain {r['plain']:.0f} us, speculative "
              f"{r['speculative']:.0f} us synchronised, {r['speculative_pipelined']:.0f} us "
              f"pipelined; tokens identical: {r['identical']}")
        return r
    k = a.k or 8
    best = min(overhead_us(a.device, k) for _ in range(a.repeats))
    print(f"{best:.1f} us of engine time per draft token (K = {k}, {a.device}, stub network)")
    return best


if __name__ == "__main__":
    run(main, "eval.bench_overhead")
