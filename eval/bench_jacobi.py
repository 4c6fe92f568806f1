"""Speculative Jacobi decoding: NFE and step compression per coupling, window and init.

    python -m eval.bench_jacobi [--grid 8] [--batch 16] [--steps 300]
    python -m eval.bench_jacobi --bundled [--batch 8]     # the bundled shapes-world T2I model

The model is a tiny Llama trained here for ~20 s on a "blocks" world: 8x8 token grids of
coloured rectangles over a noisy background (16 ids), raster order, so tokens correlate with
their left and upper neighbours like image tokens do. Each setting samples --batch grids
(temperature 1, exact rule, lossless) and reports target forwards (NFE), step compression
(grid tokens / NFE per row) and acceptance. Plain decoding needs one forward per token.
"""

from __future__ import annotations

import argparse
import json
import random
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import mmspec
from mmspec.drafters import Jacobi
from recipes.cli import COUNT, Number, Numbers, Parser, describe, run

BOS = 16


def blocks(rng: random.Random, g: int) -> list[int]:
    bg = rng.randrange(4)
    grid = [[bg if rng.random() > 0.15 else rng.randrange(4) for _ in range(g)] for _ in range(g)]
    for _ in range(rng.randint(1, 3)):
        c = rng.randrange(4, 16)
        r0, c0 = rng.randrange(g - 1), rng.randrange(g - 1)
        h, w = rng.randint(2, g - r0), rng.randint(2, g - c0)
        for r in range(r0, r0 + h):
            for cc in range(c0, c0 + w):
                grid[r][cc] = c
    return [BOS] + [t for row in grid for t in row]


def train(g: int, steps: int, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    rng = random.Random(seed)
    cfg = LlamaConfig(vocab_size=17, hidden_size=128, intermediate_size=512, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=4,
                      max_position_embeddings=g * g + 8, pad_token_id=0, bos_token_id=BOS,
                      eos_token_id=None)
    model = LlamaForCausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    for _ in range(steps):
        x = torch.tensor([blocks(rng, g) for _ in range(32)])
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"# blocks-world target: {sum(p.numel() for p in model.parameters())/1e6:.2f}M params, "
          f"{steps} steps, final loss {loss.item():.3f}")
    return model.eval()


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(description="Jacobi decoding benchmark")
    ap.add_argument("--grid", type=Number(int, 2), default=8, help="image grid side (tokens)")
    ap.add_argument("--batch", type=COUNT, default=16, help="rows per call")
    ap.add_argument("--steps", type=COUNT, default=300, help="training steps of the tiny model")
    ap.add_argument("--windows", type=Numbers(COUNT), default="4,8,16", help="Jacobi windows")
    ap.add_argument("--bundled", action="store_true",
                    help="run on samples/models/shapes-t2i (16x16 grid, guidance 3)")
    return describe(ap)


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.bundled:
        return bundled(args)
    g = args.grid
    model = train(g, args.steps)
    n = g * g
    ids = torch.full((args.batch, 1), BOS)
    plain = mmspec.generate(model, None, ids, max_new_tokens=n, seed=0, stop_token_ids=[])
    print(f"plain decoding: NFE {plain.stats.steps} for {n} tokens")
    print("compression = tokens / NFE for the batch (its slowest row); tokens/step per row")
    print(f"{'init':15} {'coupling':8} {'L':>3} {'NFE':>4} {'compression':>11} {'tokens/step':>11} "
          f"{'accept':>6} {'time':>6}")
    for init in ("uniform", "repeat_horizon", "repeat_vertical"):
        for coupling in ("none", "maximal", "gumbel"):
            for window in args.windows:
                d = Jacobi(window, init=init, coupling=coupling, init_range=(0, 16), grid_width=g,
                           span_length=n)
                t0 = time.perf_counter()
                out = mmspec.generate(model, None, ids, max_new_tokens=n, seed=0, drafter=d,
                                      stop_token_ids=[])
                dt = time.perf_counter() - t0
                s = out.stats
                print(f"{init:15} {coupling:8} {window:>3} {s.steps:>4} {n / s.steps:>10.2f}x "
                      f"{s.tokens_per_step:>11.2f} {s.acceptance_rate:>6.3f} {dt:>5.1f}s")
                print(json.dumps(dict(init=init, coupling=coupling, window=window, nfe=s.steps,
                                      step_compression=round(n / s.steps, 3),
                                      tokens_per_step=round(s.tokens_per_step, 3),
                                      acceptance=round(s.acceptance_rate, 4))), flush=True)


def bundled(args):
    from modalities import shapes_world as sw
    from modalities.image import TextToImage

    pipe = TextToImage.from_pretrained("samples/models/shapes-t2i")
    with open("samples/prompts/shapes_eval.txt") as f:
        prompts = [x.strip() for x in f if x.strip()][: args.batch]
    n = pipe.target.num_tokens
    print(f"# bundled shapes-t2i, {len(prompts)} captions, guidance 3, temperature 1, seed 0")
    print(f"{'init':15} {'coupling':8} {'L':>3} {'NFE':>4} {'compression':>11} {'tokens/step':>11} "
          f"{'accept':>6} {'accuracy':>8}")
    for init in ("uniform", "repeat_horizon", "repeat_vertical"):
        for coupling in ("none", "maximal", "gumbel"):
            for window in args.windows:
                out = pipe(prompts, method="sjd", init=init, coupling=coupling, window=window,
                           seed=0, progress=False)
                s = out.stats
                acc = sw.compositional_accuracy(out.images, prompts)
                print(f"{init:15} {coupling:8} {window:>3} {s.steps:>4} {n / s.steps:>10.2f}x "
                      f"{s.tokens_per_step:>11.2f} {s.acceptance_rate:>6.3f} {acc:>8.2f}", flush=True)


if __name__ == "__main__":
    run(main, "eval.bench_jacobi")
