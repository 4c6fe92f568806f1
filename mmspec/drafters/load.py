"""A front door's ``head=`` argument, made into an attached head."""

from __future__ import annotations

from pathlib import Path

from .head import DraftHead


def load_head(head, target):
    """None, a head (``DraftHead`` or one of its kinds: ``Eagle3Head``, MTP heads), or a
    folder in any layout ``mmspec.drafters.layouts`` reads (mmspec's own, EAGLE-3 checkpoints
    of SafeAILab, SpecForge / SGLang, AngelSlim and ``speculators``, a checkpoint with an MTP
    module), attached to ``target`` (the model whose features it reads)."""
    if head is None:
        return None
    if isinstance(head, (str, Path)):
        from .layouts import load

        return load(head, target)
    if not isinstance(head, DraftHead):
        raise ValueError(f"head={type(head).__name__}: accepted a mmspec DraftHead (or an "
                         "Eagle3Head, an MTP head) or the folder it was saved in")
    return head.attach(target)
