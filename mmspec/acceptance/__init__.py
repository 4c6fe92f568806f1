"""Acceptance rules: one per file, each a pure tensor function behind ``Rule``'s contract.

Lossless: ``Exact`` (speculative sampling), ``Greedy`` (greedy verification).
Relaxed (declare ``lossless = False`` and a TV bound): ``Lantern`` (and LANTERN++ with
``lam``), ``Grouped`` (GSD), ``Annealed`` (Cool-SD). ``CoarseGrained`` (PCG) is exact at
group level (``group_lossless = True``). ``ContinuousExact`` (CSpD) verifies vector tokens
against densities. ``Frame`` verifies multi-codebook frames codebook by
codebook with any of them; ``DepthFrame`` does so for frames from a depth decoder (CSM).
"""

from .annealed import Annealed
from .base import Rule
from .coarse import CoarseGrained
from .continuous import ContinuousExact
from .exact import Exact, Greedy
from .frame import DepthFrame, Frame
from .grouped import Grouped
from .lantern import Lantern
from .relaxed import Relaxed

__all__ = ["Rule", "Relaxed", "Exact", "Greedy", "Lantern", "Grouped", "CoarseGrained",
           "Annealed", "Frame", "DepthFrame", "ContinuousExact"]
