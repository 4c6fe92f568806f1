"""A VQ image tokenizer on diffusers' ``VQModel``: images <-> codebook ids on a token grid."""

from __future__ import annotations

import torch


class VQTokenizer:
    """Wraps a ``diffusers.VQModel``.

    encode: images [B, 3, H, W] in [-1, 1] -> ids [B, h * w] (raster order)
    decode: ids [B, h * w] -> images [B, 3, H, W] in [-1, 1]
    codebook: [C, d] embedding table (the latent space LANTERN/GSD/PCG measure distances in)
    """

    def __init__(self, vq):
        self.vq = vq

    @classmethod
    def from_pretrained(cls, path, **kwargs) -> "VQTokenizer":
        """Load a diffusers ``VQModel`` folder or id (float32 unless ``torch_dtype`` is given)."""
        from diffusers import VQModel

        kwargs.setdefault("torch_dtype", torch.float32)     # bundled weights are float16
        return cls(VQModel.from_pretrained(path, **kwargs).eval())

    @property
    def codebook(self) -> torch.Tensor:
        """The [C, d] codebook embedding table."""
        return self.vq.quantize.embedding.weight

    @property
    def codebook_size(self) -> int:
        """C, entries of the codebook."""
        return int(self.codebook.shape[0])

    @property
    def device(self) -> torch.device:
        """The device of the codebook."""
        return self.codebook.device

    def latent_grid(self, image_size: int) -> int:
        """Tokens per side of the latent grid for images of ``image_size`` pixels."""
        down = 2 ** (len(self.vq.config.block_out_channels) - 1)
        return image_size // down

    @torch.no_grad()
    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """Images [B, 3, H, W] in [-1, 1] -> codebook ids [B, h * w] in raster order."""
        h = self.vq.encode(images).latents
        _, _, (_, _, idx) = self.vq.quantize(h)
        return idx.reshape(images.shape[0], -1)

    @torch.no_grad()
    def decode(self, ids: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """Codebook ids [B, h * w] on ``grid`` (h, w) -> images [B, 3, H, W] in [-1, 1]."""
        b = ids.shape[0]
        c = self.codebook.shape[1]
        z = self.vq.quantize.get_codebook_entry(ids.reshape(-1), (b, grid[0], grid[1], c))
        return self.vq.decode(z, force_not_quantize=True, return_dict=False)[0]
