"""Train the shapes-world VQ tokenizer: diffusers VQModel, 64x64 -> 16x16 tokens, 512 codes.

    python -m recipes.train.vq --steps 4000 --out samples/models/shapes-vq

L1 + L2 reconstruction with the VQ commitment loss; codes unused for 200 steps are re-seeded
from encoder outputs (dead-code restarts). Reports PSNR and shapes-world parser accuracy on
500 held-out reconstructions, and writes fp16 safetensors + config + a model card.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import torch
import torch.nn.functional as F
from diffusers import VQModel
from tqdm.auto import tqdm

from modalities import shapes_world as sw
from recipes.train.data import (HELD_OUT, count_params, device, render, to_tensor, to_uint8,
                                write_card)


def build(codebook: int = 512, latent: int = 8) -> VQModel:
    return VQModel(in_channels=3, out_channels=3,
                   down_block_types=("DownEncoderBlock2D",) * 3,
                   up_block_types=("UpDecoderBlock2D",) * 3,
                   block_out_channels=(64, 96, 128), layers_per_block=1,
                   latent_channels=latent, num_vq_embeddings=codebook, vq_embed_dim=latent,
                   norm_num_groups=32, sample_size=64)


@torch.no_grad()
def evaluate(vq: VQModel, n: int = 500, dev=None) -> dict:
    from modalities.image import VQTokenizer

    tok = VQTokenizer(vq)
    imgs, caps = render(range(HELD_OUT, HELD_OUT + n))
    x = to_tensor(imgs, dev)
    ids = torch.cat([tok.encode(x[i:i + 250].to(vq.dtype)) for i in range(0, n, 250)])
    rec = torch.cat([tok.decode(ids[i:i + 250], (16, 16)) for i in range(0, n, 250)]).float()
    mse = F.mse_loss((rec.clamp(-1, 1) + 1) / 2, (x + 1) / 2).item()
    out = to_uint8(rec)
    acc = sw.compositional_accuracy(list(out), caps)
    used = int(torch.unique(ids).numel())
    return dict(psnr=10 * math.log10(1 / mse), parser_accuracy=acc, codes_used=used)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--codebook", type=int, default=512)
    ap.add_argument("--lr", type=float, default=4e-4)
    ap.add_argument("--out", default="samples/models/shapes-vq")
    ap.add_argument("--data", type=int, default=40000, help="training scenes rendered")
    ap.add_argument("--eval", type=int, default=500, help="held-out scenes to score")
    args = ap.parse_args(argv)
    dev = device()
    torch.manual_seed(0)
    t0 = time.time()
    imgs, _ = render(range(args.data))
    data = to_tensor(imgs, dev)
    vq = build(args.codebook).to(dev)
    opt = torch.optim.AdamW(vq.parameters(), lr=args.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=args.steps,
                                                pct_start=0.05)
    last_used = torch.zeros(args.codebook, device=dev)
    g = torch.Generator(device=dev).manual_seed(0)
    bar = tqdm(range(args.steps), desc="vq", mininterval=5)
    for step in bar:
        x = data[torch.randint(len(data), (args.batch,), device=dev, generator=g)]
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            h = vq.encode(x).latents
        h = h.float()
        quant, commit, (_, _, idx) = vq.quantize(h)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            rec = vq.decoder(vq.post_quant_conv(quant))
        rec = rec.float()
        loss = F.l1_loss(rec, x) + F.mse_loss(rec, x) + commit
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        with torch.no_grad():   # dead-code restarts from current encoder outputs
            last_used[idx.flatten().unique()] = step
            dead = (step - last_used) > 200
            if step % 100 == 0 and dead.any() and step < args.steps * 0.8:
                z = h.permute(0, 2, 3, 1).reshape(-1, h.shape[1])
                pick = z[torch.randint(len(z), (int(dead.sum()),), device=dev, generator=g)]
                vq.quantize.embedding.weight.data[dead] = pick
                last_used[dead] = step
        if step % 200 == 0:
            bar.set_postfix(loss=f"{loss.item():.4f}")
    vq.eval()
    metrics = evaluate(vq, n=args.eval, dev=dev)
    metrics.update(final_loss=float(loss), steps=args.steps, seconds=round(time.time() - t0, 1),
                   params=count_params(vq))
    print(json.dumps(metrics))
    os.makedirs(args.out, exist_ok=True)
    vq.to(torch.float16).save_pretrained(args.out, safe_serialization=True)
    with open(os.path.join(args.out, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=1)
    write_card(args.out, "shapes-vq: VQ tokenizer (diffusers VQModel)", {
        "architecture": "diffusers VQModel, 3 encoder/decoder blocks (64, 96, 128 channels), "
                        f"64x64 RGB -> 16x16 tokens, codebook {args.codebook} x 8",
        "parameters": f"{metrics['params']:,} (stored in float16)",
        "data": f"{args.data} shapes-world scenes (seeds 0..{args.data - 1})",
        "steps": f"{args.steps} at batch {args.batch}, AdamW lr {args.lr}, L1 + L2 + commitment",
        "final loss": f"{metrics['final_loss']:.4f}",
        f"quality ({args.eval} held-out scenes)": f"PSNR {metrics['psnr']:.2f} dB, parser accuracy on "
                                         f"reconstructions {metrics['parser_accuracy']:.3f}, "
                                         f"{metrics['codes_used']} codes used",
        "trained by": f"`python -m recipes.train.vq --steps {args.steps} --batch {args.batch}` ({metrics['seconds']} s)",
    })


if __name__ == "__main__":
    main()
