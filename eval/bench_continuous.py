"""CSpD on continuous-token models: acceptance, tokens per step and residual proposals per
rejection, for mixture and diffusion heads, with and without trajectory alignment.

    python -m eval.bench_continuous                       # trains tiny pairs on the CPU (~1 min)
    python -m eval.bench_continuous --target DIR --draft DIR [--prompts FILE]  # trained models
    python -m eval.bench_continuous --input-noise 0,0.1,0.3   # training-input noise, synthetic

Without --target, a target and a draft of each head are trained here on the synthetic latent
sequences of recipes/train/continuous.py (length 16, D = 2) and measured on ``--rows`` rows.
Each configuration is also run as plain decoding of the target in the same process, so the
wall-clock ratio is measured, not assumed (CPU figures: ratios from one run). The analytic
bound on tokens per target step for per-position acceptance alpha and K drafts is
(1 - alpha^(K+1)) / (1 - alpha) (alpha = accepted / (accepted + rejections); ``acceptance`` is
accepted / drafted). Sequences are short (16 tokens), so K drafts near the end are cut.
Prints one JSON line per row and a Markdown table; writes them under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from modalities.image.continuous import ContinuousImageGenerator
from recipes.cli import COUNT, GUIDANCE, Number, Numbers, Parser, describe, run


def bound(a: float, k: int) -> float:
    return float(k + 1) if a >= 1 else (1 - a ** (k + 1)) / (1 - a)


def run_one(gen, cond, *, k, temperature, aligned, guidance, seed, prefill):
    kw = dict(temperature=temperature, guidance_scale=guidance, seed=seed, decode=False)
    t0 = time.perf_counter()
    plain = gen(**cond, use_draft=False, **kw)
    t_plain = time.perf_counter() - t0
    t0 = time.perf_counter()
    spec = gen(**cond, num_draft_tokens=k, trajectory_alignment=aligned,
               prefill_fraction=prefill, **kw)
    t_spec = time.perf_counter() - t0
    st, ex = spec.stats, spec.stats.extra
    rej = ex.get("rejections", 0)
    # Per-position acceptance (the i.i.d. model's alpha, its maximum-likelihood estimate:
    # each step contributes its accepted drafts and at most one rejection) and the plain
    # fraction of drafted tokens that were accepted.
    alpha = st.accepted / max(1, st.accepted + rej)
    return dict(k=k, temperature=temperature, aligned=aligned, guidance=guidance,
                alpha=round(alpha, 4), acceptance=round(st.acceptance_rate, 4), tokens_per_step=round(st.emitted / max(1, st.row_steps), 3),
                bound_tokens_per_step=round(bound(alpha, k), 3),
                target_steps=st.steps, plain_steps=plain.stats.steps,
                rejections=rej,
                proposals_per_rejection=round(ex.get("residual_proposals", 0) / rej, 2) if rej else None,
                fallbacks=ex.get("residual_fallbacks", 0),
                density_exact=ex.get("density_exact"),
                speedup=round(t_plain / t_spec, 3), seconds_spec=round(t_spec, 3),
                seconds_plain=round(t_plain, 3))


def energy_distance(x, y) -> float:
    """Energy distance 2 E|X-Y| - E|X-X'| - E|Y-Y'| between two samples [N, d]."""
    x, y = torch.as_tensor(x, dtype=torch.float64), torch.as_tensor(y, dtype=torch.float64)
    return float(2 * torch.cdist(x, y).mean() - torch.cdist(x, x).mean() - torch.cdist(y, y).mean())


def exposure(noises: list[float], steps: int, rows: int = 600, length: int = 16) -> list[dict]:
    """Training-input noise against exposure bias: tiny mixture models of the synthetic task
    trained with each noise level; energy distance of their plain samples (whole sequences)
    to the data, next to the floor between two samples of the data."""
    from recipes.train.continuous import SyntheticLatents, train_synthetic

    data = SyntheticLatents(length=length)
    labels = [i % 5 for i in range(rows)]
    _, real = data.sample(rows, torch.Generator().manual_seed(9), labels=labels)
    _, real2 = data.sample(rows, torch.Generator().manual_seed(10), labels=labels)
    out = [dict(input_noise="floor (data vs data)",
                energy_distance=round(energy_distance(real2.reshape(rows, -1), real.reshape(rows, -1)), 4))]
    for noise in noises:
        model, losses, _ = train_synthetic("tiny", "mixture", steps=steps, length=length,
                                           input_noise=noise)
        gen = ContinuousImageGenerator(model)(labels, seed=0).latents.reshape(rows, -1)
        out.append(dict(input_noise=noise, final_loss=round(sum(losses[-50:]) / 50, 3),
                        energy_distance=round(energy_distance(gen, real.reshape(rows, -1)), 4)))
    return out


def table(rows: list[dict]) -> str:
    cols = ["head", "aligned", "temperature", "k", "alpha", "acceptance", "tokens_per_step",
            "bound_tokens_per_step", "proposals_per_rejection", "fallbacks", "speedup"]
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        out.append("| " + " | ".join(str(r.get(c)) for c in cols) + " |")
    return "\n".join(out)


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default=None,
                    help="folder (default: the bundled shapes-continuous)")
    ap.add_argument("--draft", default=None,
                    help="folder (default: the bundled draft with the bundled target)")
    ap.add_argument("--prompts", default=None,
                    help="caption file, for text-conditional models (default: the held-out "
                         "captions)")
    ap.add_argument("--rows", type=COUNT, default=64, help="images per setting")
    ap.add_argument("--k", type=Numbers(COUNT), default="2,4", help="drafts per step K")
    ap.add_argument("--temperatures", type=Numbers(Number(float, 0, open_low=True)),
                    default="1.0,2.0")
    ap.add_argument("--guidance", type=GUIDANCE, default=None, help="(default: the model's)")
    ap.add_argument("--prefill", type=Number(float, 0, 1), default=0.0,
                    help="fraction of each image given as the prompt")
    ap.add_argument("--train-steps", type=COUNT, default=400,
                    help="training steps of the synthetic pair (with --input-noise)")
    ap.add_argument("--device", default=None,
                    help="cpu, cuda, cuda:1 ... (default: cuda when available, else cpu)")
    ap.add_argument("--out", default="out/bench_continuous", help="output folder")
    ap.add_argument("--input-noise", type=Numbers(Number(float, 0)), default=None,
                    help="e.g. 0,0.1,0.3: instead of the table, compare training-input noise "
                         "levels by the energy distance of samples to the synthetic data "
                         "(default: the table)")
    return describe(ap)


def main(argv=None):
    a = build_parser().parse_args(argv)
    if a.input_noise is not None:
        for r in exposure(a.input_noise, a.train_steps):
            print(json.dumps(r), flush=True)
        return
    dev = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    ks, temps = a.k, a.temperatures
    pairs = []
    if a.target is None:
        from recipes.train.continuous import train_synthetic

        for head in ("mixture", "diffusion"):
            t0 = time.time()
            tgt, lt, _ = train_synthetic("tiny", head, steps=a.train_steps, length=16)
            dr, ld, _ = train_synthetic("tiny-draft", head, steps=a.train_steps, length=16, seed=1)
            print(f"trained {head} pair in {time.time() - t0:.0f} s (final loss target "
                  f"{sum(lt[-50:]) / 50:.3f}, draft {sum(ld[-50:]) / 50:.3f})")
            cond = dict(class_labels=[i % 5 for i in range(a.rows)])
            pairs.append((head, ContinuousImageGenerator(tgt.to(dev), dr.to(dev)), cond))
    else:
        gen = ContinuousImageGenerator.from_pretrained(a.target, a.draft).to(dev)
        tgt = gen.target
        if a.prompts:
            with open(a.prompts) as f:
                caps = [line.strip() for line in f if line.strip()][: a.rows]
            cond = dict(prompts=caps)
        else:
            cond = dict(class_labels=[i % tgt.config.cond_vocab_size for i in range(a.rows)])
        pairs.append((tgt.config.head, gen, cond))
    rows = []
    os.makedirs(a.out, exist_ok=True)
    for head, gen, cond in pairs:
        guidance = a.guidance if head == "diffusion" else None
        for temp in temps:
            for aligned in ([True, False] if head == "diffusion" else [True]):
                for k in ks:
                    r = dict(head=head, **run_one(gen, cond, k=k, temperature=temp, aligned=aligned,
                                                  guidance=guidance, seed=0, prefill=a.prefill))
                    r["device"] = str(dev)
                    print(json.dumps(r), flush=True)
                    rows.append(r)
    md = table(rows)
    print(md)
    with open(os.path.join(a.out, "results.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    with open(os.path.join(a.out, "report.md"), "w") as f:
        f.write(md + "\n")


if __name__ == "__main__":
    run(main, "eval.bench_continuous")
