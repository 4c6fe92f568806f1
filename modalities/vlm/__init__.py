"""Vision-language models: LLaVA-family targets with text-only, multimodal and ensemble drafts."""

from .generator import VisionLanguageGenerator, VLMOutput

__all__ = ["VisionLanguageGenerator", "VLMOutput"]
