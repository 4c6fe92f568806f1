"""Continuous-token autoregressive image models (GIVT / MAR pattern) and CSpD on them:
``model.py`` (the model and its density heads), ``session.py`` (what the loop drives),
``pipeline.py`` (``ContinuousImageGenerator``)."""

from .model import (HEADS, ContinuousARConfig, ContinuousARModel, DiffusionHead, MixtureHead,
                    prompt_rows)
from .pipeline import ContinuousImageGenerator, ContinuousImageOutput, WordIds
from .session import ContinuousSession

__all__ = ["HEADS", "ContinuousARConfig", "ContinuousARModel", "MixtureHead", "DiffusionHead",
           "prompt_rows", "ContinuousSession", "ContinuousImageGenerator",
           "ContinuousImageOutput", "WordIds"]
