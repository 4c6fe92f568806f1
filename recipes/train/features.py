"""Train the shapes-world feature network used for FID (modalities/shapes_features.py).

    python -m recipes.train.features --steps 3000 --out samples/models/shapes-features
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from modalities.shapes_features import ShapesFeatureNet, split_logits, targets
from modalities import shapes_world as sw
from recipes.train.data import HELD_OUT, count_params, device, render, to_tensor, write_card


def scenes(seeds):
    return [sw.sample_scene(random.Random(s)) for s in seeds]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--data", type=int, default=40000)
    ap.add_argument("--eval", type=int, default=1000)
    ap.add_argument("--out", default="samples/models/shapes-features")
    args = ap.parse_args(argv)
    dev = device()
    torch.manual_seed(0)
    t0 = time.time()
    seeds = range(args.data)
    imgs, _ = render(seeds)
    x_all = to_tensor(imgs, dev)
    y_all = torch.stack([targets(s) for s in scenes(seeds)]).to(dev)
    net = ShapesFeatureNet().to(dev)
    opt = torch.optim.AdamW(net.parameters(), lr=2e-3, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=2e-3, total_steps=args.steps)
    g = torch.Generator(device=dev).manual_seed(0)
    for step in tqdm(range(args.steps), desc="features", mininterval=5):
        idx = torch.randint(args.data, (args.batch,), device=dev, generator=g)
        x, y = x_all[idx], y_all[idx]
        x = x + 0.05 * torch.randn_like(x)           # robustness to decoder noise
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            logits = net(x).float()
        loss = sum(F.cross_entropy(lg.reshape(-1, lg.shape[-1]), y[..., i].reshape(-1))
                   for i, lg in enumerate(split_logits(logits)))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
    net.eval()
    hs = range(HELD_OUT, HELD_OUT + args.eval)
    himgs, _ = render(hs)
    with torch.no_grad():
        logits = net(to_tensor(himgs, dev))
        y = torch.stack([targets(s) for s in scenes(hs)]).to(dev)
        pred = torch.stack([lg.argmax(-1) for lg in split_logits(logits)], -1)
    acc = float((pred == y).all(-1).all(-1).float().mean())
    metrics = dict(params=count_params(net), final_loss=float(loss), steps=args.steps,
                   scene_accuracy=acc, seconds=round(time.time() - t0, 1))
    print(json.dumps(metrics))
    net.cpu().save(args.out)
    with open(os.path.join(args.out, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=1)
    write_card(args.out, "shapes-features: feature network for FID", {
        "architecture": "5-layer CNN, 128-d features, per-cell shape/colour/size heads",
        "parameters": f"{metrics['params']:,}",
        "data": f"{args.data} shapes-world scenes (+ Gaussian pixel noise 0.05)",
        "steps": f"{args.steps} at batch {args.batch}",
        "final loss": f"{metrics['final_loss']:.4f}",
        "quality": f"whole-scene attribute accuracy on {args.eval} held-out scenes: {acc:.3f}",
        "trained by": f"`python -m recipes.train.features --steps {args.steps}` ({metrics['seconds']} s)",
    })


if __name__ == "__main__":
    main()
