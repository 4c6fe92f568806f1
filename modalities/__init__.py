"""Modality adapters: ``image`` (TextToImage), ``vlm`` (VisionLanguageGenerator), ``speech``
(TextToSpeech); ``registry`` lists the adapters they register on import."""

from . import image, speech, vlm  # noqa: F401  (each registers its adapters)
