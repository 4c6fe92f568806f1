"""Regional compilation (``compile="regional"``): each decoder layer fused by torch.compile.

Compiling a whole model fuses all its layers into one graph, lowered and tuned again for every
step width. The layers of a decoder run the same code on weights of the same shapes: compiled
one at a time, the first layer's kernels are generated and tuned once per width and every
other layer runs the same compiled code. For that, each layer is called with a view of the
cache that holds only its own slots (``layer_cache``): the attention's ``cache.update(...,
layer_idx)`` then reads no index, torch.compile puts no guard on it, and the first layer's
traced code serves them all (a layer that does use its index elsewhere gets a guard on it from
torch.compile, and its own trace: correct either way). The output head and the other
projections outside the layers are compiled the same way.

``compiled(net, options)`` swaps the compiled layers in while a step is warmed up and captured
as a CUDA graph, and puts the user's modules back after: the graph replays the fused kernels,
the model itself is left as it was. ``dynamic_length(cache, mask)`` marks the static cache's
length (and the mask's width) as a dynamic dimension, so one compilation per step width
serves every cache length (every prompt length and budget).
"""

from __future__ import annotations

import contextlib
import copy
import functools

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


@functools.cache
def _layer_cache_class(cls: type) -> type:
    """``cls`` with ``update`` writing one layer's slots (``_layer``), whatever index it gets."""

    def update(self, keys, values, layer_idx, *args, **kwargs):
        return self._layer.update(keys, values, *args, **kwargs)

    return type(f"Layer{cls.__name__}", (cls,), {"update": update})


def layer_cache(cache, index: int):
    """A view of ``cache`` for the layer at ``index`` (the same class as far as ``isinstance``
    sees, the same layers and state; ``update`` goes to the layer's own slots), or ``cache``
    itself when it is not a plain layered cache (encoder-decoder, offloaded, its own
    ``update``)."""
    from transformers.cache_utils import Cache

    plain = (isinstance(cache, Cache) and type(cache).update is Cache.update
             and not getattr(cache, "offloading", False)
             and index < len(getattr(cache, "layers", ())))
    if not plain:
        return cache
    view = copy.copy(cache)
    view.__class__ = _layer_cache_class(type(cache))
    view._layer = cache.layers[index]
    return view


class _Region(nn.Module):
    """A layer compiled, called with its own view of the cache."""

    def __init__(self, layer: nn.Module, index: int | None, options: dict, backend: str):
        super().__init__()
        self.index = index
        kw = dict(options=dict(options)) if backend == "inductor" else {}
        self.compiled = torch.compile(layer, dynamic=False, backend=backend, **kw)

    def forward(self, *args, **kwargs):
        if self.index is not None:
            args = [layer_cache(v, self.index) if _is_cache(v) else v for v in args]
            kwargs = {k: layer_cache(v, self.index) if _is_cache(v) else v
                      for k, v in kwargs.items()}
        return self.compiled(*args, **kwargs)


def _is_cache(value) -> bool:
    from transformers.cache_utils import Cache

    return isinstance(value, Cache)


def _cache_index(layers: nn.ModuleList, i: int) -> int | None:
    """``i`` when every ``layer_idx`` the layer's modules hold is ``i`` (the cache slots its
    attention updates are the i-th), else None (the layer gets the whole cache)."""
    held = {m.layer_idx for m in layers[i].modules()
            if isinstance(getattr(m, "layer_idx", None), int)}
    return i if held == {i} else None


def _wrapped(parent: nn.Module, name: str, module: nn.Module, options: dict,
             backend: str) -> nn.Module:
    """A compiled wrapper (made per capture: torch.compile keeps the traced code on the
    module's code object, so a new wrapper finds what an earlier one compiled)."""
    index = _cache_index(parent, int(name)) if isinstance(parent, nn.ModuleList) else None
    return _Region(module, index, options, backend)


@contextlib.contextmanager
def compiled(net: nn.Module, options: dict, backend="inductor"):
    """Run ``net`` with its regions compiled (``options``: inductor's; ``backend``: a
    torch.compile backend); the original modules are back after. A failure of torch.compile
    is raised as a RuntimeError that names ``compile='graphs'``."""
    from torch import _dynamo

    pairs = regions(net)
    # Layers that keep their own trace (see _cache_index) need an entry each per step width.
    _dynamo.config.cache_size_limit = max(_dynamo.config.cache_size_limit, 1024)
    _dynamo.config.accumulated_cache_size_limit = max(
        _dynamo.config.accumulated_cache_size_limit, 4096)
    originals = [getattr(parent, name) for parent, name in pairs]
    try:
        for (parent, name), module in zip(pairs, originals):
            setattr(parent, name, _wrapped(parent, name, module, options, backend))
        yield
    except _dynamo.exc.TorchDynamoException as err:
        cause = getattr(err, "inner_exception", None) or err
        first = (str(cause).strip().splitlines() or [""])[0][:300]
        raise RuntimeError(f"compile=True: torch.compile failed on {type(net).__name__}'s "
                           f"layers ({type(cause).__name__}: {first}); compile='graphs' "
                           "captures the steps without compiling") from err
    finally:
        for (parent, name), module in zip(pairs, originals):
            setattr(parent, name, module)
