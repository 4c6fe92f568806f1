"""Id rows -> one padded batch: ``pad_rows(rows, pad, side)`` -> (ids [N, W], mask [N, W]).

Decoder-only prompts are left-padded (the last column real in every row); encoder inputs and
training targets are right-padded."""

from __future__ import annotations

import torch


def pad_rows(rows: list[list[int]], pad: int, side: str = "left",
             device=None) -> tuple[torch.Tensor, torch.Tensor]:
    if side not in ("left", "right"):
        raise ValueError(f"side={side!r}: accepted 'left' or 'right'")
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            cols = slice(width - len(r), None) if side == "left" else slice(0, len(r))
            ids[i, cols] = torch.as_tensor(list(r), dtype=torch.long)
            mask[i, cols] = 1
    return ids.to(device), mask.to(device)


def left_pad(rows: list[list[int]], pad: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    return pad_rows(rows, pad, "left", device)
