"""The draft heads' step cost on the GPU: mmspec's ``DraftHead`` and the EAGLE-3 head
(``Eagle3Head``) at one width, captured steps on a static cache.

    python -m eval.bench_heads_gpu                  # a 7B Llama's width, bf16, one H200
    python -m eval.bench_heads_gpu --device cpu --shape tiny --compile none   # a smoke run
    python -m eval.bench_heads_gpu --arch eagle3 --reps 20     # one head's rows, fewer steps

Each head drafts for a target of the shape's width (H, heads, vocabulary) but only four
layers (a head's step does not depend on the target's depth), one decoder layer each; a chain
step feeds one pair, a tree level ``--width`` pairs. Prints milliseconds per step (the median
of ``--reps`` after warm-up) and the EAGLE-3 head's cost over the DraftHead's.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import mmspec
from mmspec.drafters.architectures import head_for_target
from mmspec.drafters.head_session import HeadSession, prefill_pairs
from mmspec.sessions import CausalLMSession

SHAPES = {
    "7b": dict(hidden_size=4096, intermediate_size=11008, num_attention_heads=32,
               num_key_value_heads=32, vocab_size=32000),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                 num_key_value_heads=4, vocab_size=512),
}


def head_step_ms(target, arch: str, width: int, dev, compile, reps: int, prompt=64) -> float:
    """Median milliseconds of one head step of ``width`` pairs after a prompt of ``prompt``."""
    params = mmspec.SamplingParams(temperature=0)
    static = prompt + width * (reps + 8) + 8
    head = head_for_target(target, (1, 2, 3), arch=arch)
    tgt = CausalLMSession(target, params, static_len=static, compile=compile)
    tgt.keep_features(head.config.feature_layers)
    session = HeadSession(head, tgt, static_len=static, compile=compile)
    ids = torch.randint(1, target.config.vocab_size, (1, prompt), device=dev)
    times = []
    with torch.inference_mode():
        tgt.prefill(ids, torch.ones_like(ids))
        feed = prefill_pairs(session, ids, torch.ones_like(ids)).expand(1, width, -1)
        tok = ids[:, :width]
        for i in range(reps + 3):
            session.feed = feed.contiguous()
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            session.step(tok)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            if i >= 3:
                times.append(time.perf_counter() - t0)
            session.commit(0, torch.ones(1, 0, dtype=torch.bool, device=dev))
    return 1e3 * statistics.median(times)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="7b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--compile", choices=("regional", "graphs", "none"), default="regional")
    ap.add_argument("--width", type=int, default=16, help="pairs of a tree level")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--arch", nargs="+", choices=("draft-head", "eagle3"),
                    default=["draft-head", "eagle3"],
                    help="the heads measured, in this order (each row printed when measured; "
                         "the ratio when both are)")
    args = ap.parse_args(argv)
    dev = torch.device(args.device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    torch.manual_seed(0)
    cfg = LlamaConfig(num_hidden_layers=4, max_position_embeddings=4096, **SHAPES[args.shape])
    target = LlamaForCausalLM(cfg).to(dev, dtype).eval()
    compile = False if args.compile == "none" else args.compile
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU"
    print(f"{args.shape} width (H {cfg.hidden_size}, vocabulary {cfg.vocab_size}), {dtype}, "
          f"compile={args.compile}, {name}")
    print("| head | chain step (1 pair) ms | tree level (%d pairs) ms |" % args.width)
    print("|---|---|---|")
    cost = {}
    for arch in dict.fromkeys(args.arch):
        cost[arch] = [head_step_ms(target, arch, w, dev, compile, args.reps)
                      for w in (1, args.width)]
        print(f"| {arch} | {cost[arch][0]:.3f} | {cost[arch][1]:.3f} |", flush=True)
    if len(cost) < 2:
        return
    ratio = [e / d for e, d in zip(cost["eagle3"], cost["draft-head"])]
    print(f"EAGLE-3 / DraftHead: chain {ratio[0]:.2f}x, tree level {ratio[1]:.2f}x")


if __name__ == "__main__":
    main()
