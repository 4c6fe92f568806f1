"""A causal LM whose generated ids are a subset of its vocabulary (image or codec tokens)."""

from __future__ import annotations

import torch

from .causal_lm import CausalLMSession


class TokenSpanSession(CausalLMSession):
    """A causal LM whose generated ids are a subset of its vocabulary (image or codec tokens):
    the rules see compact ids 0..n-1 (``to_vocab[i]`` is the vocabulary id of compact id i);
    with ``eol_every`` the last compact id is an end-of-row token forced at every row end
    (Emu3) and banned elsewhere."""

    def __init__(self, model, params, guidance_scale, to_vocab: torch.Tensor,
                 eol_every: int | None = None, **engine):
        super().__init__(model, params, guidance_scale, **engine)
        self.to_vocab = to_vocab.to(next(model.parameters()).device)
        self.vocab_size = int(to_vocab.numel())
        self.eol_every = eol_every       # row width including the EOL column

    def processing_key(self) -> tuple:
        return super().processing_key() + (self.eol_every,)

    def prefill(self, *args, **kwargs):
        super().prefill(*args, **kwargs)
        # Read inside captured chains: kept with the static cache, not with the session object.
        self.to_vocab = self.persistent("to_vocab", self.to_vocab)

    def embed(self, tokens, first_step=False):
        f = int(first_step)              # the prompt's last token is already a vocabulary id
        ids = self.to_vocab[tokens[:, f:].clamp(min=0)]
        return {"input_ids": torch.cat([tokens[:, :f], ids], 1)}

    def logits(self, out):
        return out.logits.index_select(-1, self.to_vocab)

    def mask_logits(self, logits, gen_index):
        if self.eol_every is None:
            return logits
        eol_pos = (gen_index % self.eol_every) == self.eol_every - 1            # [B, n]
        is_eol = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device)
        is_eol[-1] = True
        allowed = torch.where(eol_pos[..., None], is_eol, ~is_eol)
        return logits.masked_fill(~allowed, float("-inf"))
