"""Tiny continuous-token image models built from configs (no downloads)."""

from __future__ import annotations

import torch

from modalities.image.continuous import ContinuousARConfig, ContinuousARModel


def tiny_continuous(head: str = "mixture", *, layers: int = 2, hidden: int = 32, seed: int = 0,
                    grid=(1, 2), latent_dim: int = 2, steps: int = 8, spread: float = 0.0):
    """A random tiny model; ``spread`` > 0 widens the head's output layer so its densities
    are far from the near-standard normal of a fresh initialisation (and differ per model)."""
    torch.manual_seed(seed)
    cfg = ContinuousARConfig(latent_dim=latent_dim, grid=grid, cond_vocab_size=5, head=head,
                             num_components=3, diffusion_steps=steps, head_width=32, head_depth=1,
                             hidden_size=hidden, intermediate_size=2 * hidden,
                             num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                             max_position_embeddings=64)
    model = ContinuousARModel(cfg).eval()
    if spread:
        with torch.no_grad():
            last = model.head.net[2] if head == "mixture" else model.head.out
            last.weight.normal_(0, spread)
            model.latent_in.weight.normal_(0, 1.0)
    return model
