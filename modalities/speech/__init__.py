"""Codec-token speech: the ``TextToSpeech`` pipeline, the layouts it serves (delay pattern,
single codebook, depth decoder), codecs, and audio outputs.

Files: ``pipeline.py`` (TextToSpeech), ``adapters.py`` (the layouts), ``delay.py`` (the delay
pattern and its session), ``csm.py`` (depth decoders), ``codec.py`` (codecs), ``bundled.py``
(loading), ``audio.py`` (WAV files and spectrograms). Imports point one way:
pipeline -> bundled -> csm -> adapters -> delay, codec.
"""

from .adapters import CodecAdapter, DelayPatternAdapter, SingleCodebookAdapter
from .audio import AudioOutput, save_spectrogram, spectrogram_grid
from .codec import EncodecCodec, TransformersCodec, codec_for
from .delay import DecoderWithTextEncoder, DelayPatternSession, apply_delay, undo_delay
from .pipeline import TextToSpeech

__all__ = ["TextToSpeech", "AudioOutput", "CodecAdapter", "DelayPatternAdapter",
           "SingleCodebookAdapter", "EncodecCodec", "TransformersCodec", "codec_for",
           "DecoderWithTextEncoder", "DelayPatternSession", "apply_delay", "undo_delay",
           "save_spectrogram", "spectrogram_grid"]
