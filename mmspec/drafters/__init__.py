"""Drafters: where draft tokens come from (a model, the target itself, nothing)."""

from .base import Drafter, NoDraft
from .depth import DepthDrafter
from .feature import FeatureDrafter
from .frame import FrameDrafter
from .head import DepthHead, DraftHead, FrameHead, HeadConfig, head_for_target
from .jacobi import Jacobi
from .model import ModelDrafter
from .mtp import MtpHead
from .prefill import Prefilled
from .tree import TreeDrafter

__all__ = ["Drafter", "NoDraft", "ModelDrafter", "TreeDrafter", "FeatureDrafter", "DraftHead",
           "HeadConfig", "FrameHead", "FrameDrafter", "DepthHead",
           "DepthDrafter", "head_for_target", "MtpHead", "Jacobi", "Prefilled"]
