"""3-D rotary positions (M-RoPE: Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5 and their MoE
variants) for the loop.

A Qwen-VL prompt's positions are three axes (time, height, width): text tokens count up on
all three, an image's tokens take their grid coordinates from where the image starts, and
the text after it resumes at the largest position + 1. The model's own position function
(``model.model.get_rope_index``) computes them from the prompt's ids, token types and image
or video grids. Every token after the prompt then has position

    p_axis = p_1d + (the prompt's last position on that axis - its p_1d),

where p_1d counts the row's real tokens before it: after a prompt that ends on text this is
``rope_delta`` = (largest position + 1) - (the row's real prompt tokens) on every axis; after
one that ends on an image each axis continues from the image's last position, as
transformers' decoding does. p_1d is exactly what the session's sequence mask gives every slot, for K + 1 draft positions, ragged rows with holes, static caches and
captured steps alike, rolled back with the cache. So the session maps its 1-D positions
(``position_ids`` hook) and nothing else changes; transformers' own decoding does the same
(``compute_3d_position_ids``: cumulative mask + delta).
"""

from __future__ import annotations

import torch

from mmspec.sessions import CaptureTraits, CausalLMSession

# Model types whose decoder takes M-RoPE positions, and their position function's extra inputs.
MROPE_TYPES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe")
POSITION_INPUTS = ("mm_token_type_ids", "image_grid_thw", "video_grid_thw", "second_per_grid_ts")


def uses_mrope(model) -> bool:
    """The model's decoder takes 3-D rotary positions (one of ``MROPE_TYPES``)."""
    return getattr(model.config, "model_type", None) in MROPE_TYPES


def token_types(model, input_ids: torch.Tensor) -> torch.Tensor:
    """Token types as the processors give them (text 0, image 1, video 2), from the ids."""
    cfg = model.config
    types = torch.zeros_like(input_ids)
    types[input_ids == cfg.image_token_id] = 1
    types[input_ids == cfg.video_token_id] = 2
    return types


class MRopeSession(CausalLMSession):
    """A Qwen-VL session: the prompt's 3-D positions from the model's position function, and
    every later slot's from its 1-D position plus the row's ``rope_delta``."""

    # the prompt's 3-D positions are the call's (``_prompt_pos``); rows' rope deltas
    capture = CaptureTraits(prompt_graphs=False, row_buffers=("_delta",))
    _trailing: tuple = ()        # ``prefill(trailing_media=)``

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                trailing_media=(), **model_kwargs):
        """As ``CausalLMSession.prefill``; ``model_kwargs`` carries the processor's outputs
        (``pixel_values``, ``image_grid_thw``, ``mm_token_type_ids`` ...); ``trailing_media``:
        the features of prompts' last tokens that are placeholders, fed by the first step
        (``deepstack.TrailingMedia``: Qwen3-VL)."""
        self._trailing = tuple(trailing_media)
        if model_kwargs.get("mm_token_type_ids") is None:
            model_kwargs["mm_token_type_ids"] = token_types(self.model, input_ids)
        given = {k: model_kwargs[k] for k in POSITION_INPUTS if model_kwargs.get(k) is not None}
        pos, _ = self.model.model.get_rope_index(input_ids, attention_mask=attention_mask,
                                                 **given)
        self._prompt_pos = pos[:, :, :-1]       # the last column is fed by the first step
        model_kwargs["mm_token_type_ids"] = model_kwargs["mm_token_type_ids"][:, :-1]
        super().prefill(input_ids, attention_mask, **model_kwargs)
        # Each axis continues from the prompt's last token (its 1-D position: the row's real
        # tokens before it), as transformers' decoding does: rope_delta on every axis after a
        # prompt that ends on text, the image's grid position after one that ends on an image.
        last = (attention_mask.long().sum(1) - 1)[:, None].to(pos.device)         # [B, 1]
        delta = pos[:, :, -1].T - last                                           # [B, 3]
        self._delta = self.persistent("rope_delta", delta.to(input_ids.device))

    def embed(self, tokens: torch.Tensor, first_step: bool = False) -> dict:
        inputs = super().embed(tokens, first_step)
        if first_step and self._trailing:
            table = self.model.get_input_embeddings()
            inputs["mm_encoder_outputs"] = {t.kind: t.outputs(tokens, table)
                                            for t in self._trailing}
        return inputs

    def position_ids(self, pos: torch.Tensor, prompt: bool = False) -> torch.Tensor:
        """[3, R, n]: the prompt's from ``get_rope_index``, later slots' p_1d plus each
        axis's offset from the prompt's last token."""
        if prompt:
            return self._prompt_pos
        return pos[None] + self._delta.T[:, :, None]
