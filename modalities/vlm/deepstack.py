"""Prompts that end on an image or video placeholder, for models with deepstack (Qwen3-VL).

The session feeds a prompt's last column in its first step. Qwen3-VL merges each
placeholder's features into the embeddings and adds the vision tower's deepstack features to
its first decoder layers' states at those positions, in the pass that is handed them. So the
vision tower runs once, its outputs are split: every placeholder's but each row's trailing one
go to the prompt pass (``mm_encoder_outputs``, the model's own way of taking precomputed
features), and the trailing ones to the first step (``TrailingMedia``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

PIXELS = {"image": ("pixel_values", "image_grid_thw", "image_token_id", "get_image_features"),
          "video": ("pixel_values_videos", "video_grid_thw", "video_token_id",
                    "get_video_features")}


def has_deepstack(model) -> bool:
    """The vision tower adds features to the decoder's first layers (Qwen3-VL)."""
    vision = getattr(model.config, "vision_config", None)
    return bool(getattr(vision, "deepstack_visual_indexes", None))


@dataclass
class TrailingMedia:
    """One kind's ("image" or "video") features of the rows whose last prompt token is its
    placeholder ``token``: ``features`` [T, d] and ``deep`` (per deepstack layer, [T, d]) in
    the order of those rows; ``rows`` [B] bool marks them; ``output`` the encoder output class
    the model reads (``pooler_output``, ``deepstack_features``)."""

    kind: str
    token: int
    features: torch.Tensor
    deep: list[torch.Tensor]
    rows: torch.Tensor
    output: type

    def outputs(self, tokens: torch.Tensor, embedding: torch.nn.Module):
        """The encoder outputs for the first step's ``tokens`` [B, n] (column 0: the prompt's
        last token). A drafted token equal to the placeholder gets the id's own embedding and
        no deepstack addition, what the model computes for it without features."""
        at = tokens == self.token
        trailing = torch.zeros_like(at)
        trailing[:, 0] = self.rows
        mine = trailing[at].to(self.features.device)         # [placeholders in the step]
        n = mine.shape[0]
        own = embedding(tokens.new_tensor([self.token])).to(self.features.device,
                                                             self.features.dtype)
        feats = own.expand(n, -1).clone()
        feats[mine] = self.features
        deep = [self.features.new_zeros(n, d.shape[-1]) for d in self.deep]
        for full, part in zip(deep, self.deep):
            full[mine] = part
        return self.output(pooler_output=[feats], deepstack_features=[[d] for d in deep])


def split_trailing(model, batch: dict) -> tuple[dict, list[TrailingMedia]]:
    """``batch`` (the processor's outputs) as the prompt pass takes it, its pixels replaced by
    the encoder outputs of every placeholder but each row's trailing one, and those."""
    ids, inner = batch["input_ids"], model.model
    out = {k: v for k, v in batch.items() if k not in ("pixel_values", "pixel_values_videos")}
    encoded, trailing = {}, []
    for kind, (pixels, grid, token_name, features) in PIXELS.items():
        if batch.get(pixels) is None:
            continue
        token = getattr(model.config, token_name)
        with torch.no_grad():
            f = getattr(inner, features)(batch[pixels], batch[grid], return_dict=True)
        feats = torch.cat(f.pooler_output)
        deep = [torch.cat(d) for d in f.deepstack_features]
        at = ids == token
        rows = at[:, -1]
        last = at.sum(1).cumsum(0) - 1                        # each row's last placeholder
        keep = torch.ones(feats.shape[0], dtype=torch.bool, device=feats.device)
        keep[last[rows].to(keep.device)] = False
        encoded[kind] = type(f)(pooler_output=[feats[keep]],
                                deepstack_features=[[d[keep]] for d in deep])
        if bool(rows.any()):
            trailing.append(TrailingMedia(kind, token, feats[~keep], [d[~keep] for d in deep],
                                          rows, type(f)))
    return {**out, "mm_encoder_outputs": encoded}, trailing
