"""How a call runs on the device: the ``Engine`` (mode and every speed switch, given per
call) and its ``Plan`` (``plan.py``); the compile passes the captured modes use: regional
compilation of decoder layers (``regions.py``), grouped projections and one-row products
(``grouping.py``), prefix and decode attention over static caches (``attention.py``). The
Triton kernels they launch live in ``mmspec.kernels``."""

from .plan import (CAPTURED, GRAPH_SWITCHES, INDUCTOR_OPTIONS, MODES, PLAIN_STEPS, Engine, Plan,
                   compile_mode, static_length)

__all__ = ["CAPTURED", "GRAPH_SWITCHES", "INDUCTOR_OPTIONS", "MODES", "PLAIN_STEPS", "Engine",
           "Plan", "compile_mode", "static_length"]
