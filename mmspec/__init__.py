"""mmspec: multimodal speculative decoding.

The core knows tensors and caches, never a modality. Start with ``mmspec.generate`` for text
models; modality pipelines live in the ``modalities`` package.
"""

from .acceptance import Exact, Greedy, Rule
from .drafters import Jacobi, ModelDrafter, NoDraft
from .generate import generate, generate_stream
from .loop import run, stream
from .registry import make_rule, rule_names
from .sampling import SamplingParams
from .session import CausalLMSession, release_graphs
from .types import Draft, GenerateOutput, StepStats, TargetOutput, VerifyOutput

__version__ = "0.1.0"

__all__ = [
    "Draft", "TargetOutput", "VerifyOutput", "StepStats", "GenerateOutput",
    "Rule", "Exact", "Greedy", "make_rule", "rule_names",
    "SamplingParams", "CausalLMSession", "ModelDrafter", "NoDraft", "Jacobi",
    "generate", "generate_stream", "run", "stream", "release_graphs",
]
