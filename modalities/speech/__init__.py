"""Codec-token speech: delay-pattern multi-codebook targets (MusicGen layout), the
``TextToSpeech`` pipeline, and the delay pattern itself."""

from .delay import DelayPatternSession, apply_delay, undo_delay
from .pipeline import (AudioOutput, DelayPatternAdapter, EncodecCodec, SingleCodebookAdapter,
                       DecoderWithTextEncoder, TextToSpeech, TransformersCodec, codec_for)

__all__ = ["TextToSpeech", "AudioOutput", "DelayPatternAdapter", "SingleCodebookAdapter",
           "EncodecCodec", "TransformersCodec", "codec_for", "DecoderWithTextEncoder",
           "DelayPatternSession", "apply_delay", "undo_delay"]
