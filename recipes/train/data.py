"""Shapes-world data for the training recipes: rendered in parallel from seeds, no files.

Train seeds start at 0, held-out evaluation seeds at HELD_OUT (never used for training).
"""

from __future__ import annotations

import json
import os
from multiprocessing import Pool

import numpy as np
import torch

from modalities import shapes_world as sw

HELD_OUT = 10_000_000


def _one(seed: int):
    scene, img, cap = sw.sample(seed)
    return np.asarray(img, dtype=np.uint8), cap


def render(seeds, workers: int | None = None) -> tuple[np.ndarray, list[str]]:
    """uint8 [N, 64, 64, 3] images and their captions for the given seeds."""
    seeds = list(seeds)
    workers = workers or min(16, os.cpu_count() or 1)
    if workers > 1 and len(seeds) > 256:
        with Pool(workers) as pool:
            out = pool.map(_one, seeds, chunksize=256)
    else:
        out = [_one(s) for s in seeds]
    return np.stack([o[0] for o in out]), [o[1] for o in out]


def to_tensor(images: np.ndarray, device) -> torch.Tensor:
    """uint8 [N, H, W, 3] -> float [N, 3, H, W] in [-1, 1]."""
    t = torch.from_numpy(images).to(device).permute(0, 3, 1, 2).float()
    return t / 127.5 - 1


def to_uint8(images: torch.Tensor) -> np.ndarray:
    """float [N, 3, H, W] in [-1, 1] -> uint8 [N, H, W, 3]."""
    x = ((images.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    return x.permute(0, 2, 3, 1).cpu().numpy()


def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def count_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def load_in_float32(folder: str) -> None:
    """Mark a saved model folder to load in float32 by default (config.json ``dtype``): the
    weights stay bfloat16 on disk (half the bytes), and loading casts them. The bundled
    models are small, and float32 keeps speculative greedy decoding equal to plain greedy
    decoding on every CPU (bf16 kernels round differently per processor and per step
    width, which breaks near-ties)."""
    path = os.path.join(folder, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    cfg["dtype"] = "float32"
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


def write_card(folder: str, title: str, fields: dict) -> None:
    """A short model card (README.md) next to the weights."""
    lines = [f"# {title}", "", "Trained here, from scratch, on the procedural shapes world "
             "(modalities/shapes_world.py). A small model for tests, demos and honest "
             "acceptance measurements, not a general-purpose generator.", ""]
    for k, v in fields.items():
        lines.append(f"- **{k}**: {v}")
    with open(os.path.join(folder, "README.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def fit(model, step_loss, steps: int, lr: float, time_budget: float | None = None,
        desc: str = "train", opt=None) -> tuple[int, "torch.Tensor"]:
    """AdamW (weight decay 0.01; or the caller's ``opt``) with a one-cycle schedule over
    ``steps`` calls of ``step_loss() -> loss``, gradients clipped at 1, the loss on the
    progress bar every 200 steps; a hard cap at ``time_budget`` seconds stops early (the
    caller's card says how many steps ran). Returns (steps run, last loss)."""
    import time

    from tqdm.auto import tqdm

    if opt is None:
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.05)
    model.train()
    t0, loss = time.time(), None
    bar = tqdm(range(steps), desc=desc, mininterval=5)
    for i in bar:
        if time_budget is not None and time.time() - t0 > time_budget:
            steps = i
            break
        loss = step_loss()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if i % 200 == 0:
            bar.set_postfix(loss=f"{loss.item():.4f}")
    model.eval()
    return steps, loss
