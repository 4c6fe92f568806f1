"""mmspec: multimodal speculative decoding.

The core knows tensors and caches, never a modality. Start with ``mmspec.generate`` for text
models; modality pipelines live in the ``modalities`` package.
"""

from .acceptance import Exact, Greedy, Rule
from .drafters import (DraftHead, Drafter, FeatureDrafter, Jacobi, ModelDrafter, NoDraft,
                       ProactiveJacobi, TreeDrafter)
from .engine import Engine, Plan
from .generate import generate, generate_stream
from .loop import Stops, run, stream
from .registry import (build_method, make_rule, parse_method, register_drafter, register_rule,
                       rule_names, rules)
from .runner import Run, prepare
from .sampling import SamplingParams
from .sessions import CausalLMSession, Session, release_graphs
from .tree import Tree
from .types import Draft, GenerateOutput, StepStats, TargetOutput, VerifyOutput

__version__ = "0.1.0"

__all__ = [
    "Draft", "TargetOutput", "VerifyOutput", "StepStats", "GenerateOutput",
    "Rule", "Exact", "Greedy", "make_rule", "rule_names", "rules", "register_rule",
    "register_drafter", "parse_method", "build_method",
    "SamplingParams", "Session", "CausalLMSession", "Drafter", "ModelDrafter", "NoDraft",
    "Jacobi", "ProactiveJacobi", "TreeDrafter", "FeatureDrafter", "DraftHead", "Tree", "Engine", "Plan", "Run",
    "prepare", "Stops",
    "generate", "generate_stream", "run", "stream", "release_graphs",
]
