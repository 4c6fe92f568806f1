"""Core benchmark: tokens per step, acceptance and wall-clock ratio against plain decoding.

    python -m eval.bench_core                     # CPU: the text pair trained in seconds
    python -m eval.bench_core --device cuda       # GPU: a larger random-weight Llama pair

Prints one JSON line per setting and a table. Ratios come from one run (same batch, same
prompts, best of --repeats). Nothing here is asserted; tests never time anything.
The analytic bound next to each measured ratio is docs/METHODS.md section 1:
(1 - a^(K+1)) / ((1 - a)(K c + 1)) with a the measured acceptance and c the measured
draft/target cost ratio of one forward.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import mmspec
from recipes.cli import COUNT, TEMPERATURE, Numbers, Parser, describe, run


def bound(alpha: float, k: int, c: float) -> float:
    if alpha >= 1:
        return (k + 1) / (k * c + 1)
    return (1 - alpha ** (k + 1)) / ((1 - alpha) * (k * c + 1))


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def forward_cost(model, batch: int, device, repeats: int = 20) -> float:
    """Seconds of one single-token decode forward with a short cache (eager)."""
    from mmspec.sessions import CausalLMSession

    s = CausalLMSession(model, mmspec.SamplingParams(temperature=0))
    ids = torch.ones(batch, 16, dtype=torch.long, device=device)
    with torch.inference_mode():
        s.prefill(ids, torch.ones_like(ids))
        tok = ids[:, :1]
        for _ in range(3):
            s.step(tok)
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(repeats):
            s.step(tok)
        _sync(device)
    return (time.perf_counter() - t0) / repeats


def random_llama(hidden, layers, heads, vocab, seed, device, dtype):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=int(hidden * 8 / 3),
                      num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=heads, max_position_embeddings=4096,
                      pad_token_id=0, eos_token_id=None, bos_token_id=None)
    with torch.device(device):
        return LlamaForCausalLM(cfg).to(dtype).eval()


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(description="core speculative decoding benchmark")
    ap.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1 ...")
    ap.add_argument("--batch", type=COUNT, default=1, help="rows per call")
    ap.add_argument("--max-new-tokens", type=COUNT, default=64)
    ap.add_argument("--ks", type=Numbers(COUNT), default="2,4,8", help="drafts per step K")
    ap.add_argument("--temperatures", type=Numbers(TEMPERATURE), default="0,1", help="0 is greedy")
    ap.add_argument("--repeats", type=COUNT, default=3, help="timed calls per setting")
    ap.add_argument("--out", default=None, help="write the JSON lines to this file too "
                                                "(default: print only)")
    return describe(ap)


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    dev = torch.device(args.device)

    if dev.type == "cpu":
        from recipes.text_pair import build_text_pair, prompts

        target, draft, tok, info = build_text_pair(progress=False)
        ids, mask = prompts(tok, args.batch)
        name = f"text pair trained here: target {info['target_params']/1e6:.2f}M, draft {info['draft_params']/1e6:.3f}M"
    else:
        dtype = torch.bfloat16
        target = random_llama(2048, 16, 16, 32000, 0, dev, dtype)
        draft = random_llama(512, 2, 8, 32000, 1, dev, dtype)
        ids = torch.randint(1, 32000, (args.batch, 128), device=dev)
        mask = torch.ones_like(ids)
        name = "random-weight Llama pair: target 16x2048 (~1.1B), draft 2x512, bf16"
    ids, mask = ids.to(dev), mask.to(dev)
    c = forward_cost(draft, args.batch, dev) / forward_cost(target, args.batch, dev)
    print(f"# {name}; device {dev}; batch {args.batch}; draft/target forward cost c = {c:.3f}")

    rows = []
    for temp in args.temperatures:
        def run(d, k):
            best, out = float("inf"), None
            for _ in range(args.repeats):
                _sync(dev)
                t0 = time.perf_counter()
                out = mmspec.generate(target, d, ids, attention_mask=mask, temperature=temp,
                                      num_draft_tokens=k, max_new_tokens=args.max_new_tokens,
                                      seed=0, stop_token_ids=[])
                _sync(dev)
                best = min(best, time.perf_counter() - t0)
            return out, best

        plain, t_plain = run(None, 1)
        for k in args.ks:
            out, t = run(draft, k)
            a = out.stats.acceptance_rate
            row = dict(device=str(dev), batch=args.batch, temperature=temp, k=k,
                       tokens_per_step=round(out.stats.tokens_per_step, 3),
                       acceptance=round(a, 3), speedup=round(t_plain / t, 3),
                       bound=round(bound(a, k, c), 3), cost_ratio=round(c, 4),
                       ms_per_token_plain=round(1e3 * t_plain / args.max_new_tokens, 3),
                       ms_per_token=round(1e3 * t / args.max_new_tokens, 3),
                       greedy_match=bool(torch.equal(out.sequences, plain.sequences)) if temp == 0 else None)
            rows.append(row)
            print(json.dumps(row))
    print(f"\n{'temp':>4} {'K':>2} {'tok/step':>8} {'accept':>6} {'speedup':>7} {'bound':>6}")
    for r in rows:
        print(f"{r['temperature']:>4.1f} {r['k']:>2} {r['tokens_per_step']:>8.2f} "
              f"{r['acceptance']:>6.2f} {r['speedup']:>6.2f}x {r['bound']:>5.2f}x")
    if args.out:
        with open(args.out, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    run(main, "eval.bench_core")
