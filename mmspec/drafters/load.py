"""A front door's ``head=`` argument, made into an attached head."""

from __future__ import annotations

import json
from pathlib import Path

from .head import CONFIG, DraftHead
from .mtp import MtpHead


def load_head(head, target):
    """None, a ``DraftHead``, a folder it was saved in, or a checkpoint folder whose model
    ships an MTP module (``mmspec.drafters.mtp``; told apart by its config, which has no
    ``feature_layers``), attached to ``target`` (the model whose features it reads)."""
    if head is None:
        return None
    if isinstance(head, (str, Path)):
        cfg = Path(head) / CONFIG
        if cfg.is_file() and "feature_layers" not in json.loads(cfg.read_text()):
            return MtpHead.from_checkpoint(head, target)
        return DraftHead.from_pretrained(head, target)
    if not isinstance(head, DraftHead):
        raise ValueError(f"head={type(head).__name__}: accepted a mmspec DraftHead or the folder "
                         "it was saved in")
    return head.attach(target)
