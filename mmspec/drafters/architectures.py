"""Which head a target takes, by architecture and kind: mmspec's own (a token, frame or depth
head, the kind the target's adapter declares: ``head_kind``) or EAGLE-3 (the field's
checkpoints' architecture, exported to vLLM and SGLang). ``recipes.train.draft_head --arch``
names one."""

from __future__ import annotations

from .eagle3 import Eagle3Head
from .head import DepthHead, DraftHead, FrameHead

ARCHITECTURES = ("draft-head", "eagle3")
# A target's head kind, declared by its modality's adapter (``head_kind``): "token" (one id
# per event), "frame" (a delay-pattern decoder's codebooks), "depth" (a depth decoder's).
HEAD_KINDS = {"token": DraftHead, "frame": FrameHead, "depth": DepthHead}


def head_for_target(target, feature_layers=None, arch: str = "draft-head", kind: str = "token",
                    **kw) -> DraftHead:
    """A fresh head of ``arch`` for ``target``, whose adapter declares ``kind`` (HEAD_KINDS).
    "draft-head": a ``DraftHead``, ``FrameHead`` or ``DepthHead`` by kind; "eagle3": an
    ``Eagle3Head`` (token targets)."""
    if arch not in ARCHITECTURES:
        raise ValueError(f"arch={arch!r}: accepted one of {', '.join(ARCHITECTURES)}")
    if kind not in HEAD_KINDS:
        raise ValueError(f"kind={kind!r}: accepted one of {', '.join(HEAD_KINDS)}")
    if arch == "eagle3":
        if kw.pop("uncond_features", False):
            raise ValueError("uncond_features: an EAGLE-3 head fuses the conditional branch "
                             "only; accepted with arch='draft-head'")
        if kind != "token":
            raise ValueError(f"arch='eagle3': an EAGLE-3 head drafts from one token table; "
                             f"{type(target).__name__} is a multi-codebook model ({kind} head: "
                             "accepted arch='draft-head')")
        return Eagle3Head.for_target(target, feature_layers, **kw)
    return HEAD_KINDS[kind].for_target(target, feature_layers, **kw)
