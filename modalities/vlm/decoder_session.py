"""Sessions on a VLM's text decoder, for models whose own forward cannot take a step's masks.

PaliGemma 2 (a Gemma 2 decoder: sliding-window layers beside full ones) builds its masks in
its forward from what it is handed: a 4-D mask reaches every layer as it is, one mask per
layer kind is refused. Sliding-window layers need their own mask past the window, so the
session calls the decoder itself (``net``) with one mask per layer kind, feeds the prompt as
the model's own merged input embeddings (``media_last``: the model's pass computes them) and
applies the model's head, soft-capped as the model caps it.
"""

from __future__ import annotations

import torch

from mmspec.sessions import CausalLMSession


def decodes_alone(model) -> bool:
    """The model's forward takes one mask for every layer although its decoder has
    sliding-window layers (PaliGemma 2): its session calls the decoder (``DecoderSession``)."""
    text = model.config.get_text_config()
    return model.config.model_type == "paligemma" and bool(getattr(text, "sliding_window", None))


class DecoderSession(CausalLMSession):
    """A ``CausalLMSession`` on ``model.model.language_model`` with ``model.lm_head``."""

    def __init__(self, model, params, guidance_scale=None, **engine):
        super().__init__(model, params, guidance_scale, net=model.model.language_model, **engine)
        self._cap = getattr(model.config.get_text_config(), "final_logit_softcapping", None)

    def prefill(self, input_ids, attention_mask, *args, inputs_embeds=None, **kwargs):
        if inputs_embeds is None:
            raise ValueError("inputs_embeds: the prompt's merged input embeddings are required "
                             f"(media_last): {type(self.model).__name__}'s decoder is called "
                             "without its image features")
        super().prefill(input_ids, attention_mask, *args, inputs_embeds=inputs_embeds, **kwargs)

    def logits(self, out) -> torch.Tensor:
        logits = self.model.lm_head(out.last_hidden_state)
        return logits if self._cap is None else torch.tanh(logits / self._cap) * self._cap
