"""Which head a target takes, by architecture: mmspec's own (a token, frame or depth head by
the target's kind) or EAGLE-3 (the field's checkpoints' architecture, exported to vLLM and
SGLang). ``recipes.train.draft_head --arch`` names one."""

from __future__ import annotations

from .eagle3 import Eagle3Head
from .head import DepthHead, DraftHead, FrameHead, find_delay_decoder, is_depth_model

ARCHITECTURES = ("draft-head", "eagle3")


def head_for_target(target, feature_layers=None, arch: str = "draft-head", **kw) -> DraftHead:
    """A fresh head of ``arch`` for ``target``. "draft-head": a ``FrameHead`` for a
    delay-pattern decoder, a ``DepthHead`` for a depth-decoder model (CSM), else a
    ``DraftHead``; "eagle3": an ``Eagle3Head`` (single-table targets)."""
    if arch not in ARCHITECTURES:
        raise ValueError(f"arch={arch!r}: accepted one of {', '.join(ARCHITECTURES)}")
    multi = find_delay_decoder(target) is not None or is_depth_model(target)
    if arch == "eagle3":
        if kw.pop("uncond_features", False):
            raise ValueError("uncond_features: an EAGLE-3 head fuses the conditional branch "
                             "only; accepted with arch='draft-head'")
        if multi:
            raise ValueError(f"arch='eagle3': an EAGLE-3 head drafts from one token table; "
                             f"{type(target).__name__} is a multi-codebook model (accepted "
                             "arch='draft-head', its frame or depth head)")
        return Eagle3Head.for_target(target, feature_layers, **kw)
    if find_delay_decoder(target) is not None:
        return FrameHead.for_target(target, feature_layers, **kw)
    if is_depth_model(target):
        return DepthHead.for_target(target, feature_layers, **kw)
    return DraftHead.for_target(target, feature_layers, **kw)
