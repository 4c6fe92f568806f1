"""Regional compilation (``compile="regional"``): each decoder layer fused by torch.compile.

Compiling a whole model fuses all its layers into one graph, lowered and tuned again for every
step width. The layers of a decoder run the same code on weights of the same shapes: compiled
one at a time, the first layer's kernels are generated and tuned once per width, and every
other layer's graph is the same graph, found in inductor's cache (each layer is still traced on
its own, since its cache slot is a different Python object). The output head and the other
projections outside the layers are compiled the same way.

``compiled(net, options)`` swaps the compiled layers in while a step is warmed up and captured
as a CUDA graph, and puts the user's modules back after: the graph replays the fused kernels,
the model itself is left as it was. ``dynamic_length(cache, mask)`` marks the static cache's
length (and the mask's width) as a dynamic dimension, so one compilation per step width
serves every cache length (every prompt length and budget).
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn


def decoder_layers(net: nn.Module) -> nn.ModuleList:
    """The decoder's layers: the ModuleList holding the most parameters."""
    lists = [m for m in net.modules() if isinstance(m, nn.ModuleList) and len(m)]
    if not lists:
        raise ValueError(f'compile="regional" compiles a decoder\'s layers: {type(net).__name__} '
                         "holds no ModuleList of layers; accepted compile=True or 'inductor'")
    return max(lists, key=lambda m: sum(p.numel() for p in m.parameters()))


def regions(net: nn.Module) -> list[tuple[nn.Module, str]]:
    """(parent, name) of each block compiled: the decoder layers, then the linear layers
    outside them (the output head)."""
    layers = decoder_layers(net)
    inside = {id(m) for m in layers.modules()}
    outside = [(parent, name) for parent in net.modules() if id(parent) not in inside
               for name, child in parent.named_children() if isinstance(child, nn.Linear)]
    return [(layers, str(i)) for i in range(len(layers))] + outside


def dynamic_length(cache, mask) -> None:
    """Mark the slots dimension of a static cache's keys and values and the last dimension of
    the 4-D mask as dynamic (torch.compile then compiles one graph for every length)."""
    from torch import _dynamo

    for layer in getattr(cache, "layers", ()):
        for name in ("keys", "values"):
            t = getattr(layer, name, None)
            if isinstance(t, torch.Tensor) and t.dim() == 4:
                _dynamo.mark_dynamic(t, 2)
    if isinstance(mask, torch.Tensor) and mask.dim() == 4:
        _dynamo.mark_dynamic(mask, 3)


def _wrapped(module: nn.Module, options: dict, backend: str) -> nn.Module:
    """A compiled wrapper (made per capture: torch.compile keeps the traced code on the
    module's code object, so a new wrapper finds what an earlier one compiled)."""
    kw = dict(options=dict(options)) if backend == "inductor" else {}
    return torch.compile(module, dynamic=False, backend=backend, **kw)


@contextlib.contextmanager
def compiled(net: nn.Module, options: dict, backend: str = "inductor"):
    """Run ``net`` with its regions compiled (``options``: inductor's; ``backend``: a
    torch.compile backend); the original modules are back after."""
    from torch import _dynamo

    pairs = regions(net)
    # One traced entry per layer and step width (all layers share one code object).
    _dynamo.config.cache_size_limit = max(_dynamo.config.cache_size_limit, 1024)
    _dynamo.config.accumulated_cache_size_limit = max(
        _dynamo.config.accumulated_cache_size_limit, 4096)
    originals = [getattr(parent, name) for parent, name in pairs]
    try:
        for (parent, name), module in zip(pairs, originals):
            setattr(parent, name, _wrapped(module, options, backend))
        yield
    finally:
        for (parent, name), module in zip(pairs, originals):
            setattr(parent, name, module)
