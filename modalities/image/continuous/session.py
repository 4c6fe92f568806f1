"""The session the loop drives on a continuous-token model: latents in, densities out."""

from __future__ import annotations

import torch

from mmspec.sampling import SamplingParams
from mmspec.sessions import CaptureTraits, CausalLMSession

from .model import MixtureHead


class ContinuousSession(CausalLMSession):
    """A ``CausalLMSession`` whose step returns densities [B, n] over latents (vectors in,
    densities out; the first step after the prompt feeds the start-of-image embedding).

    temperature: > 0. guidance_scale: diffusion heads only. noise: the diffusion head's noise
    bank [B, L, S, D] (the same tensor for draft and target: trajectory alignment).
    """

    capture = CaptureTraits(chain_hooks=False)  # densities drawn with its own noise, one by one

    def __init__(self, model, temperature: float, guidance_scale=None, noise=None):
        super().__init__(model, SamplingParams(temperature=1.0), guidance_scale)
        self.temperature, self.noise = temperature, noise

    def prefill(self, input_ids, attention_mask, uncond_ids=None, uncond_mask=None):
        super().prefill(input_ids, attention_mask, uncond_ids, uncond_mask)
        self._uncond_last = None          # both branches start with bos_id: rows are duplicated

    def embed(self, tokens, first_step=False):
        return {"latents": tokens, "bos_first": first_step}

    def logits(self, out):
        return out.last_hidden_state

    def distributions(self, h, gen_index):
        """Hidden states [R, n, H] -> next-latent densities [B, n]."""
        head = self.model.head
        if isinstance(head, MixtureHead):
            return head.density(h, self.temperature)
        b = self.batch_size
        # Rows that already finished ride along past the last index; their output is never
        # read, so they reuse the last block of noise.
        idx = gen_index.clamp(max=self.noise.shape[1] - 1)
        noise = self.noise[torch.arange(b, device=idx.device)[:, None], idx]
        return head.density(h[:b], noise, self.temperature, h[b:] if self.guided else None,
                            self.guidance_scale)
