"""A small feature network trained here on the shapes world, for FID-style metrics.

A CNN that reads a 64x64 scene and predicts, for each of the 9 cells, the shape, colour and
size there (or none). Its 128-d penultimate activations are the features FID compares: no
pretrained weights are needed, and the features are sensitive to exactly what the shapes
world varies. Trained by ``python -m recipes.train.features``; bundled in
samples/models/shapes-features.
"""

from __future__ import annotations

import json
import os

import torch
import torch.nn as nn
from safetensors.torch import load_file, save_file

from modalities import shapes_world as sw

N_SHAPE, N_COLOUR, N_SIZE = len(sw.SHAPES) + 1, len(sw.COLOURS) + 1, len(sw.SIZES) + 1


class ShapesFeatureNet(nn.Module):
    def __init__(self, width: int = 64, dim: int = 128):
        super().__init__()
        c = width
        self.body = nn.Sequential(
            nn.Conv2d(3, c, 3, padding=1), nn.GELU(), nn.Conv2d(c, c, 3, padding=1, stride=2),
            nn.GELU(), nn.Conv2d(c, 2 * c, 3, padding=1), nn.GELU(),
            nn.Conv2d(2 * c, 2 * c, 3, padding=1, stride=2), nn.GELU(),
            nn.Conv2d(2 * c, 2 * c, 3, padding=1), nn.GELU(), nn.AdaptiveAvgPool2d(3))
        self.proj = nn.Sequential(nn.Flatten(), nn.Linear(2 * c * 9, dim), nn.GELU())
        self.head = nn.Linear(dim, 9 * (N_SHAPE + N_COLOUR + N_SIZE))
        self.config = dict(width=width, dim=dim)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """[B, 3, 64, 64] in [-1, 1] -> [B, dim]."""
        return self.proj(self.body(x))

    def forward(self, x):
        return self.head(self.features(x)).view(x.shape[0], 9, -1)

    def save(self, folder: str) -> None:
        os.makedirs(folder, exist_ok=True)
        save_file({k: v.contiguous() for k, v in self.state_dict().items()},
                  os.path.join(folder, "model.safetensors"))
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(self.config, f)

    @classmethod
    def load(cls, folder: str, device="cpu") -> "ShapesFeatureNet":
        with open(os.path.join(folder, "config.json")) as f:
            net = cls(**json.load(f))
        net.load_state_dict(load_file(os.path.join(folder, "model.safetensors"), device=str(device)))
        return net.to(device).eval()


def targets(scene: sw.Scene) -> torch.Tensor:
    """[9, 3] class indices per cell (0 = empty)."""
    t = torch.zeros(9, 3, dtype=torch.long)
    for o in scene.objects:
        t[o.cell] = torch.tensor([sw.SHAPES.index(o.shape) + 1, list(sw.COLOURS).index(o.colour) + 1,
                                  list(sw.SIZES).index(o.size) + 1])
    return t


def split_logits(logits: torch.Tensor):
    return logits.split([N_SHAPE, N_COLOUR, N_SIZE], dim=-1)
