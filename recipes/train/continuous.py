"""Train continuous-token image models (modalities.image.continuous) from scratch.

    python -m recipes.train.continuous --data shapes --size target --head mixture
    python -m recipes.train.continuous --data shapes --size draft --head mixture
    python -m recipes.train.continuous --data synthetic --size tiny --steps 300   # seconds, CPU

``--data shapes``: text-conditional over the pre-quantisation latents of the bundled
shapes-vq (16x16 grid, D = 8), captions as word ids, dropped 10% of the time (guidance
needs the unconditional branch). ``--data synthetic``: a class-conditional latent sequence
with known structure (a 2-D autoregressive process whose start depends on the class), for
tests and the CPU benchmark. Writes safetensors, config and a model card with the final loss.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
from tqdm.auto import tqdm

from modalities.image.continuous import ContinuousARConfig, ContinuousARModel, prompt_rows

SIZES = {"tiny": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=64, head_width=32, head_depth=1),
         "tiny-draft": dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                            num_key_value_heads=1, intermediate_size=32, head_width=32, head_depth=1),
         "target": dict(hidden_size=256, num_hidden_layers=6, num_attention_heads=8,
                        num_key_value_heads=8, intermediate_size=640, head_width=256, head_depth=3),
         "draft": dict(hidden_size=128, num_hidden_layers=3, num_attention_heads=4,
                       num_key_value_heads=4, intermediate_size=384, head_width=128, head_depth=2)}


class SyntheticLatents:
    """Class-conditional sequences x_0..x_{L-1} in R^D: x_0 ~ a class-dependent two-component
    mixture; x_i = R x_{i-1} * 0.8 + c_class + 0.3 * noise (R a fixed rotation). Deterministic
    from ``seed``."""

    num_classes = 5

    def __init__(self, length: int = 6, dim: int = 2, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.length, self.dim = length, dim
        self.centres = torch.randn(self.num_classes, 2, dim, generator=g) * 1.5
        self.drift = torch.randn(self.num_classes, dim, generator=g) * 0.5
        q, _ = torch.linalg.qr(torch.randn(dim, dim, generator=g))
        self.rot = q

    def sample(self, n: int, generator=None, labels=None) -> tuple[torch.Tensor, torch.Tensor]:
        c = (torch.randint(0, self.num_classes, (n,), generator=generator) if labels is None
             else torch.as_tensor(labels))
        comp = torch.randint(0, 2, (n,), generator=generator)
        x = self.centres[c, comp] + 0.4 * torch.randn(n, self.dim, generator=generator)
        out = [x]
        for _ in range(self.length - 1):
            x = 0.8 * x @ self.rot.T + self.drift[c] + 0.3 * torch.randn(n, self.dim, generator=generator)
            out.append(x)
        return c, torch.stack(out, 1)

    def config(self, **kw) -> dict:
        return dict(latent_dim=self.dim, grid=(1, self.length), cond_vocab_size=self.num_classes, **kw)


def build(size: str, head: str, data_cfg: dict, **kw) -> ContinuousARModel:
    cfg = ContinuousARConfig(head=head, max_position_embeddings=512, **SIZES[size], **data_cfg, **kw)
    return ContinuousARModel(cfg)


def train(model: ContinuousARModel, batches, steps: int, lr: float = 2e-3, seed: int = 0,
          progress: bool = True, time_budget: float | None = None,
          input_noise: float = 0.0) -> list[float]:
    """AdamW with warm-up and cosine decay; ``batches(step, generator) -> (prompt_ids, latents)``.
    Returns the loss per step. With ``time_budget`` (seconds) the step count is lowered to fit,
    timed on steps 10-40 (the schedule follows the new count; it says so)."""
    dev = next(model.parameters()).device
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.95))
    total = [steps]          # lowered once to fit ``time_budget`` (timed on steps 10-40)
    warm = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(s, total[0]) / total[0])))
    g = torch.Generator().manual_seed(seed)
    gd = torch.Generator(device=dev).manual_seed(seed)
    model.train()
    losses, t0 = [], time.time()
    bar = tqdm(total=steps, desc="train", disable=not progress, mininterval=5)
    step = 0
    while step < total[0]:
        (ids, mask), lat = batches(step, g)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            loss = model.training_loss(ids.to(dev), lat.to(dev), mask.to(dev), generator=gd,
                                       input_noise=input_noise)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        step += 1
        bar.update(1)
        if step % 50 == 0:
            bar.set_postfix(loss=f"{np.mean(losses[-50:]):.4f}")
        if step == 10:
            t10 = time.time()
        if step == 40 and time_budget is not None:      # steady-state rate (after warm-up)
            per = (time.time() - t10) / 30
            fit = max(60, int((time_budget - (time.time() - t0)) / per) + 40)
            if fit < total[0]:
                print(f"{per * 1e3:.1f} ms/step: training {fit} of {steps} steps to fit "
                      f"{time_budget:.0f} s", flush=True)
                total[0] = fit
    bar.close()
    model.eval()
    return losses


def synthetic_batches(data: SyntheticLatents, cfg: ContinuousARConfig, batch: int, drop: float = 0.1):
    def fn(step, g):
        c, x = data.sample(batch, g)
        d = torch.rand(batch, generator=g) < drop
        return prompt_rows([[int(v)] for v in c], cfg, d), x
    return fn


def train_synthetic(size: str = "tiny", head: str = "mixture", steps: int = 300, batch: int = 128,
                    seed: int = 0, length: int = 6, progress: bool = False,
                    input_noise: float = 0.0, **kw):
    """A model of ``SyntheticLatents(length)`` (tests and eval/bench_continuous.py)."""
    data = SyntheticLatents(length=length)
    torch.manual_seed(seed)
    model = build(size, head, data.config(), **kw)
    losses = train(model, synthetic_batches(data, model.config, batch), steps, seed=seed,
                   progress=progress, input_noise=input_noise)
    return model, losses, data


# -- the shapes world ----------------------------------------------------------------------------
def CaptionIds():
    """The shapes-world caption words as conditioning ids (the generator's ``tokenizer``)."""
    from modalities.image.continuous import WordIds
    from recipes.train.t2i import WORDS

    return WordIds(WORDS)


@torch.no_grad()
def shapes_latents(vq, images: np.ndarray, dev) -> torch.Tensor:
    """Pre-quantisation latents [N, 256, D] of rendered scenes (uint8 [N, 64, 64, 3])."""
    from recipes.train.data import to_tensor

    out = []
    for i in range(0, len(images), 1000):
        h = vq.encode(to_tensor(images[i:i + 1000], dev).to(vq.dtype)).latents
        out.append(h.float().flatten(2).transpose(1, 2).cpu())
    return torch.cat(out)


def load_shapes(vq_path: str, n: int, dev, cache: str | None = None):
    """(latents [n, 256, D] float32 on the CPU, captions) of training scenes 0..n-1; cached in
    ``cache`` (a safetensors file plus a captions list) when given."""
    from safetensors.torch import load_file, save_file

    if cache and os.path.exists(cache) and os.path.exists(cache + ".txt"):
        lat = load_file(cache)["latents"]
        with open(cache + ".txt") as f:
            caps = f.read().splitlines()
        if len(caps) >= n:
            return lat[:n], caps[:n]
    from diffusers import VQModel

    from recipes.train.data import render

    vq = VQModel.from_pretrained(vq_path, torch_dtype=torch.float32).to(dev).eval()
    images, caps = render(range(n))
    lat = shapes_latents(vq, images, dev)
    if cache:
        os.makedirs(os.path.dirname(cache) or ".", exist_ok=True)
        save_file({"latents": lat.contiguous()}, cache)
        with open(cache + ".txt", "w") as f:
            f.write("\n".join(caps))
    return lat, caps


@torch.no_grad()
def evaluate(model, vq_path: str, n: int, dev, temperatures=(1.0,), guidance=None,
             batch: int = 250) -> dict:
    """Compositional accuracy (shapes-world parser) of plain sampling on n held-out captions."""
    from diffusers import VQModel

    from modalities import shapes_world as sw
    from modalities.image.continuous import ContinuousImageGenerator
    from recipes.train.data import HELD_OUT, render

    vq = VQModel.from_pretrained(vq_path, torch_dtype=torch.float32).to(dev).eval()
    _, caps = render(range(HELD_OUT, HELD_OUT + n))
    gen = ContinuousImageGenerator(model.to(dev).eval(), decoder=vq, tokenizer=CaptionIds())
    out = {}
    for t in temperatures:
        imgs = []
        for i in range(0, n, batch):
            imgs += gen(prompts=caps[i:i + batch], temperature=t, guidance_scale=guidance,
                        seed=i).images
        out[str(t)] = round(sw.compositional_accuracy(imgs, caps), 3)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", choices=["shapes", "synthetic"], default="shapes")
    ap.add_argument("--size", choices=list(SIZES), default="target")
    ap.add_argument("--head", choices=["mixture", "diffusion"], default="mixture")
    ap.add_argument("--components", type=int, default=8)
    ap.add_argument("--steps", type=int, default=6000)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--images", type=int, default=100000)
    ap.add_argument("--vq", default="samples/models/shapes-vq")
    ap.add_argument("--out", default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--time-budget", type=float, default=None)
    ap.add_argument("--input-noise", type=float, default=0.0,
                    help="std of Gaussian noise on the latents the model reads (normalised units)")
    ap.add_argument("--cache", default=None, help="latents cache (safetensors) for --data shapes")
    ap.add_argument("--prepare-only", action="store_true", help="write --cache and stop")
    ap.add_argument("--eval", type=int, default=0, help="held-out captions to score (shapes)")
    ap.add_argument("--guidance", type=float, default=None, help="for --eval (diffusion heads)")
    ap.add_argument("--eval-temperatures", default="1.0,0.7", help="for --eval, comma-separated")
    a = ap.parse_args(argv)
    from recipes.train.data import count_params, device, write_card

    dev = device()
    t0 = time.time()
    if a.prepare_only:
        if not a.cache:
            ap.error("--prepare-only needs --cache")
        lat, _ = load_shapes(a.vq, a.images, dev, a.cache)
        print(f"{len(lat)} latents -> {a.cache} ({time.time() - t0:.0f} s)")
        return
    if a.data == "synthetic":
        data = SyntheticLatents()
        torch.manual_seed(a.seed)
        model = build(a.size, a.head, data.config(), num_components=a.components).to(dev)
        batches = synthetic_batches(data, model.config, a.batch)
        desc = "synthetic class-conditional latent sequences (SyntheticLatents, length 6, D = 2)"
    else:
        lat, captions = load_shapes(a.vq, a.images, dev, a.cache)
        mean, std = float(lat.mean()), float(lat.std())
        lat = ((lat - mean) / std).to(dev)
        tok = CaptionIds()
        ids = [tok.encode(c) for c in captions]
        torch.manual_seed(a.seed)
        model = build(a.size, a.head, dict(latent_dim=lat.shape[-1], grid=(16, 16),
                                           cond_vocab_size=len(tok.words), latent_mean=mean,
                                           latent_std=std),
                      num_components=a.components).to(dev)
        width = max(len(r) for r in ids) + 1
        full, fmask = (t.to(dev) for t in prompt_rows(ids, model.config, width=width))
        null, _ = (t.to(dev) for t in prompt_rows(ids, model.config, torch.ones(len(ids)), width))

        def batches(step, g):
            i = torch.randint(0, len(ids), (a.batch,), generator=g).to(dev)
            drop = (torch.rand(a.batch, generator=g) < 0.1).to(dev)
            return (torch.where(drop[:, None], null[i], full[i]), fmask[i]), lat[i]
        desc = (f"{a.images} rendered shapes-world scenes (seeds outside the held-out set), "
                f"pre-quantisation latents of {a.vq}, captions dropped 10% of the time"
                + (f"; inputs noised with std {a.input_noise} (normalised units) against exposure "
                   "bias" if a.input_noise else ""))
    print(f"{count_params(model) / 1e6:.2f}M parameters, head {a.head}")
    losses = train(model, batches, a.steps, lr=a.lr, seed=a.seed, time_budget=a.time_budget,
                   input_noise=a.input_noise)
    out = a.out or os.path.join("samples", "models", f"shapes-continuous-{a.head}-{a.size}")
    from recipes.train.data import load_in_float32

    model.to(torch.bfloat16).save_pretrained(out)        # bundled weights: bfloat16
    load_in_float32(out)
    model.float()                                           # what loading them gives back
    final = float(np.mean(losses[-100:]))
    write_card(out, f"Continuous-token image model ({a.head} head, {a.size})", {
        "architecture": f"ContinuousARModel: Llama backbone, {a.head} head",
        "parameters": count_params(model), "data": desc, "steps": len(losses),
        "final loss": f"{final:.4f} (mean of the last 100 steps)",
        "seconds": round(time.time() - t0, 1),
        "command": "python -m recipes.train.continuous "
                   + " ".join(sys.argv[1:] if argv is None else argv),
    })
    if a.data == "shapes":
        import json as _json

        from recipes.train.t2i import WORDS

        with open(os.path.join(out, "mmspec_continuous.json"), "w") as f:
            _json.dump({"decoder": os.path.relpath(a.vq, out), "decoder_class": "VQModel",
                        "words": list(WORDS)}, f, indent=1)
    fields = {}
    if a.eval and a.data == "shapes":
        temps = tuple(float(t) for t in a.eval_temperatures.split(","))
        acc = evaluate(model, a.vq, a.eval, dev, temperatures=temps, guidance=a.guidance)
        fields["quality"] = (f"compositional accuracy on {a.eval} held-out captions, plain sampling"
                             + (f", guidance {a.guidance}" if a.guidance else "") + ": "
                             + ", ".join(f"temperature {k}: {v}" for k, v in acc.items()))
        print(json.dumps({"size": a.size, "head": a.head, "final_loss": final,
                          "compositional_accuracy": acc, "steps": len(losses),
                          "seconds": round(time.time() - t0, 1)}), flush=True)
        with open(os.path.join(out, "README.md"), "a") as f:
            f.write(f"- **quality**: {fields['quality']}\n")
    print(f"final loss {final:.4f} -> {out}")


if __name__ == "__main__":
    main()
