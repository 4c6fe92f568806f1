"""Relaxed rules on a tiny pair with flat distributions: acceptance versus measured TV.

    python -m eval.bench_relaxed [--samples 20000] [--out out/bench_relaxed]

For each rule and parameter: acceptance rate and tokens per step (256 rows x 40 tokens), and
the total variation of the
first two emitted tokens from the target's exact distribution (enumerated), measured from
``--samples`` generations; ``noise`` is the same TV for plain sampling (the sampling floor).
Writes sweep.csv and acceptance_vs_tv.png under --out.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import os
import time

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import mmspec
from mmspec.acceptance import Annealed, CoarseGrained, Exact, Grouped, Lantern
from recipes.cli import COUNT, Number, Parser, describe, run


def tiny(vocab, hidden, layers, seed, scale):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=2,
                      max_position_embeddings=64, pad_token_id=0, eos_token_id=None,
                      bos_token_id=None, tie_word_embeddings=False)
    m = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        m.lm_head.weight.mul_(scale)
    return m


def exact_joint(model, prompt, m):
    v = model.config.vocab_size
    seqs = torch.tensor(list(itertools.product(range(v), repeat=m)))
    ids = torch.cat([torch.tensor(prompt).expand(len(seqs), -1), seqs], 1)
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits.double()[:, len(prompt) - 1 : -1], -1)
    return logp.gather(-1, seqs[..., None]).squeeze(-1).sum(-1).exp().numpy()


def measure(target, draft, rule, prompt, m, n, k, seed):
    """Histogram of the first m emitted tokens (generating m + k so every step drafts k)."""
    ids = torch.tensor(prompt).expand(n, -1).contiguous()
    out = mmspec.generate(target, draft, ids, rule=rule, num_draft_tokens=k,
                          max_new_tokens=m + k, seed=seed, stop_token_ids=[])
    v = target.config.vocab_size
    gen = out.sequences[:, len(prompt) : len(prompt) + m]
    code = (gen * torch.tensor([v ** (m - 1 - i) for i in range(m)])).sum(1)
    return np.bincount(code.numpy(), minlength=v ** m) / n, out.stats


def speed(target, draft, rule, prompt, k, rows=256, tokens=40):
    """Acceptance and tokens per step on longer generations (256 rows x 40 tokens)."""
    ids = torch.tensor(prompt).expand(rows, -1).contiguous()
    return mmspec.generate(target, draft, ids, rule=rule, num_draft_tokens=k,
                           max_new_tokens=tokens, seed=1, stop_token_ids=[]).stats


def sweep(emb):
    yield "exact", "-", Exact()
    for d in (0.05, 0.1, 0.2, 0.4):
        yield "lantern", f"delta={d}", Lantern(emb, k=8, delta=d)
    for lam in (1.5, 2.0, 4.0):
        yield "lantern++", f"lam={lam}", Lantern(emb, k=8, lam=lam)
    for g in (3, 7, 14):
        yield "gsd", f"G={g}", Grouped(emb, group_size=g, p_threshold=0.15, embed_threshold=1.0)
    for t in (0.8, 0.6, 0.45, 0.3):
        yield "pcg", f"theta={t}", CoarseGrained(emb, theta=t)
    for d in (1.5, 2.0, 4.0):
        yield "annealed", f"delta={d}", Annealed(delta=d, nu=0.7)


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(description="relaxed acceptance sweep")
    ap.add_argument("--samples", type=COUNT, default=50000, help="Monte Carlo samples per rule")
    ap.add_argument("--vocab", type=Number(int, 2), default=16, help="vocabulary of the tiny pair")
    ap.add_argument("--k", type=COUNT, default=4, help="drafts per step K")
    ap.add_argument("--scale", type=Number(float, 0, open_low=True), default=3.0,
                    help="output-head scale of both models")
    ap.add_argument("--out", default="out/bench_relaxed", help="output folder")
    return describe(ap)


def main(argv=None):
    args = build_parser().parse_args(argv)
    torch.set_grad_enabled(False)
    target = tiny(args.vocab, 32, 2, 0, args.scale)
    draft = tiny(args.vocab, 16, 1, 1, args.scale)
    emb = target.get_input_embeddings().weight.detach()
    prompt, m = [1, 2, 3], 2
    exact = exact_joint(target, prompt, m)
    plain, _ = measure(target, None, Exact(), prompt, m, args.samples, 1, 123)
    noise = 0.5 * np.abs(plain - exact).sum()
    print(f"# tiny pair, V={args.vocab}, K={args.k}, {args.samples} samples; TV of the first "
          f"{m} tokens; sampling floor (plain sampling) TV = {noise:.4f}")
    print(f"{'rule':10} {'param':11} {'accept':>6} {'tok/step':>8} {'TV':>7}  time")
    rows = []
    for name, param, rule in sweep(emb):
        t0 = time.perf_counter()
        emp, _ = measure(target, draft, rule, prompt, m, args.samples, args.k, 0)
        st = speed(target, draft, rule, prompt, args.k)
        dt = time.perf_counter() - t0
        tvd = 0.5 * np.abs(emp - exact).sum()
        rows.append(dict(rule=name, param=param, acceptance=st.acceptance_rate,
                         tokens_per_step=st.tokens_per_step, tv=tvd, noise=noise))
        print(f"{name:10} {param:11} {st.acceptance_rate:6.3f} {st.tokens_per_step:8.2f} "
              f"{tvd:7.4f}  {dt:.1f}s")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "sweep.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name in dict.fromkeys(r["rule"] for r in rows):
        rs = [r for r in rows if r["rule"] == name]
        ax.plot([r["tv"] for r in rs], [r["acceptance"] for r in rs], "o-", label=name)
    ax.axvline(noise, color="grey", ls="--", lw=1, label="sampling floor")
    ax.set_xlabel("TV of emitted tokens from the target (measured)")
    ax.set_ylabel("acceptance rate")
    ax.legend(fontsize=8)
    ax.set_title(f"relaxed acceptance, tiny pair (V={args.vocab}, K={args.k})")
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "acceptance_vs_tv.png"), dpi=120)
    print(f"wrote {args.out}/sweep.csv and acceptance_vs_tv.png")


if __name__ == "__main__":
    run(main, "eval.bench_relaxed")
