"""Image-token generation: adapters for Janus, Emu3, LlamaGen-style and token-span models,
the ``TextToImage`` pipeline, and a VQ tokenizer on diffusers' VQModel."""

from .adapters import (Emu3Adapter, ImageAdapter, JanusAdapter, LlamaGenAdapter,
                       TokenSpanAdapter)
from .llamagen import LlamaGenConfig, LlamaGenForImageGeneration, load_llamagen_state_dict
from .pipeline import ImageOutput, TextToImage, to_pil
from .vq import VQTokenizer

__all__ = ["ImageAdapter", "JanusAdapter", "Emu3Adapter", "TokenSpanAdapter", "LlamaGenAdapter",
           "LlamaGenConfig", "LlamaGenForImageGeneration", "load_llamagen_state_dict",
           "TextToImage", "ImageOutput", "to_pil", "VQTokenizer"]
