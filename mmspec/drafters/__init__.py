"""Drafters: where draft tokens come from (a model, the target itself, nothing)."""

from .base import Drafter, NoDraft
from .depth import DepthDrafter
from .eagle3 import Eagle3Config, Eagle3Head
from .feature import FeatureDrafter
from .frame import FrameDrafter
from .architectures import ARCHITECTURES, HEAD_KINDS, head_for_target
from .head import DepthHead, DraftHead, FrameHead, HeadConfig
from .jacobi import Jacobi, ProactiveJacobi
from .model import ModelDrafter
from .mtp import DeepSeekMtpHead, MtpHead
from .prefill import Prefilled
from .tree import TreeDrafter

__all__ = ["ARCHITECTURES", "HEAD_KINDS", "Drafter", "NoDraft", "ModelDrafter", "TreeDrafter", "FeatureDrafter", "DraftHead",
           "HeadConfig", "FrameHead", "FrameDrafter", "DepthHead",
           "DepthDrafter", "head_for_target", "MtpHead", "DeepSeekMtpHead", "Eagle3Head",
           "Eagle3Config", "Jacobi", "ProactiveJacobi", "Prefilled"]
