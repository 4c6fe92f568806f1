"""The static-cache pool and CUDA-graph capture of the captured modes: what they keep between
calls, and how a step closure becomes a replayable graph. Sessions hand it closures and
their caches; it imports no session.

    Captured    a static cache with the graphs captured on it (keyed by input shapes), its
                memory pool and the buffers its graphs read
    KEPT        the pool: per network (weakly) and per key, the entries no session holds
    take / give_back / release   hand an entry to a session, return it, forget them
    capture_graph  warm a closure up, undo its writes, capture it in the entry's memory pool
    compile_fixed / compiled     torch.compile for fixed shapes (captured steps' parts)
"""

from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass, field

import torch


@dataclass
class Captured:
    """A static cache with the steps captured on it (graphs keyed by input shapes)."""

    cache: object
    graphs: dict = field(default_factory=dict)
    pool: object = None
    fused: object = None
    seq: object = None       # its StaticSequenceMask (buffers the captured steps read)
    buffers: dict = field(default_factory=dict)   # a session's per-call constants steps read
    generator: object = None  # the generator sampled chains are captured with (``chain``)


# Static caches (and their captured steps) outlive one generate call: kept per module (weakly)
# and per key, handed to one session at a time, given back when that session is collected.
KEPT: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def take(net, key, make) -> Captured:
    """An entry kept for ``net`` under ``key``, or ``make()``'s; the caller holds it alone."""
    free = KEPT.setdefault(net, {}).setdefault(key, [])
    return free.pop() if free else make()


def give_back(net_ref, key, entry: Captured) -> None:
    """Return ``entry`` to the pool (``net_ref``: a weak reference to its network)."""
    net = net_ref()
    if net is not None:
        KEPT.setdefault(net, {}).setdefault(key, []).append(entry)


def release(modules=None) -> None:
    """Forget the entries kept for these modules (every module's if None)."""
    if modules is None:
        KEPT.clear()
        return
    for module in modules:
        KEPT.pop(module, None)


def capture_graph(run, undo, entry: Captured, generator: torch.Generator | None = None):
    """Warm ``run`` up twice on a side stream, ``undo`` its writes after each, then
    capture it in ``entry``'s memory pool: (graph, its outputs). ``generator``: one that
    ``run`` draws from, registered with the graph (its seed and offset are read at each
    replay, and the offset advanced by what the graph consumed)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            run()
            undo()
    torch.cuda.current_stream().wait_stream(side)
    if entry.pool is None:
        entry.pool = torch.cuda.graph_pool_handle()
    graph = torch.cuda.CUDAGraph()
    if generator is not None:
        graph.register_generator_state(generator)
    with torch.cuda.graph(graph, pool=entry.pool):
        out = run()
    return graph, out


def compile_fixed(fn, **options):
    """``torch.compile(fn)`` for fixed shapes, traced once per shape and guard, with room for
    the entries captured steps make (past dynamo's default limit calls would run op by op)."""
    from torch import _dynamo

    _dynamo.config.cache_size_limit = max(_dynamo.config.cache_size_limit, 64)
    return torch.compile(fn, dynamic=False, **options)


@functools.cache
def compiled(fn):
    """``fn`` compiled once per process (``compile_fixed``) for captured regional steps."""
    return compile_fixed(fn)

