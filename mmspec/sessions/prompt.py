"""What a session's prompt pass takes besides the pass itself: the unconditional rows of
classifier-free guidance, and prompt blocks (spans whose tokens see each other both ways in
the pass: Gemma 3's and 4's images, PaliGemma's prefix)."""

from __future__ import annotations

from dataclasses import replace

import torch

from ..cache import Blocks


def with_uncond(input_ids, attention_mask, uncond_ids, uncond_mask) -> tuple:
    """(ids, mask): the prompt's rows followed by the unconditional prompts' (guidance)."""
    if uncond_ids is None:
        raise ValueError("guidance_scale is set: uncond_ids (the unconditional prompts) "
                         "are required")
    if uncond_ids.shape != input_ids.shape:
        raise ValueError(f"uncond_ids must have the prompt's shape {tuple(input_ids.shape)}"
                         f" (left-pad both to one width), got {tuple(uncond_ids.shape)}")
    return torch.cat([input_ids, uncond_ids], 0), torch.cat([attention_mask, uncond_mask], 0)


def prompt_blocks(blocks, input_ids: torch.Tensor, window, guided: bool,
                  recurrent: bool) -> Blocks | None:
    """``prefill(prompt_blocks=)`` as ``Blocks`` (an ids tensor: blocks on every layer),
    checked against the prompt; None where they would open sliding-window layers only and
    the model has none."""
    if isinstance(blocks, torch.Tensor):
        blocks = Blocks(blocks)
    if blocks is None or (blocks.sliding_only and window is None):
        return None
    if blocks.ids.shape != input_ids.shape or guided or recurrent:
        raise ValueError(f"prompt_blocks: accepted [B, P] of the prompt's shape "
                         f"{tuple(input_ids.shape)}, without guidance or recurrent layers")
    return blocks


def refeed_blocks(blocks: Blocks, window) -> Blocks | None:
    """The blocks the first step's refeed of the last prompt token sees: a last token inside
    a block saw the whole block past its window (PaliGemma 2's prefix), so does its refeed;
    None otherwise."""
    if window is None or not blocks.past_window or not bool((blocks.ids[:, -1] >= 0).any()):
        return None
    return Blocks(blocks.ids[:, -1:], blocks.sliding_only, blocks.ids, past_window=True)


def step_blocks(first: Blocks | None, n: int) -> Blocks | None:
    """``first`` (``refeed_blocks``) widened to a first step of ``n`` slots."""
    if first is None:
        return None
    return replace(first, ids=torch.nn.functional.pad(first.ids, (0, n - 1), value=-1))
