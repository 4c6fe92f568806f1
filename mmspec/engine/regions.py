"""Regional compilation (``compile="regional"``): each decoder layer fused by torch.compile.

Compiling a whole model fuses all its layers into one graph, lowered and tuned again for every
step width. The layers of a decoder run the same code on weights of the same shapes: compiled
one at a time, the first layer's kernels are generated and tuned once per width and every
other layer runs the same compiled code. For that, each layer is called with a view of the
cache that holds only its own slots (``layer_cache``): the attention's ``cache.update(...,
layer_idx)`` then reads no index, torch.compile puts no guard on it, and the first layer's
traced code serves them all (a layer that does use its index elsewhere gets a guard on it from
torch.compile, and its own trace: correct either way). The output head and the other
projections outside the layers are compiled the same way, and so are the decoder's final norm
and rotary embedding (``BESIDE``), each a few small kernels per step otherwise.

A region compiles its module's ``forward``; the module's own forward hooks (transformers'
``output_hidden_states`` recorders, which feature drafters ask for, a user's) run around the
compiled call as ``nn.Module.__call__`` runs them, outside the graph, and transformers'
recorders inside a layer are off while the regions run (``_hooked``, ``_take_recorders``):
traced, their context variable breaks every layer's graph.

Under inductor, on a model whose decoder layers' sibling projections all lie back to back
(``lay_out``, which the sessions call first: ``grouping.contiguous_projections``), the layers'
linear calls on one input (q/k/v, gate/up) run as one product (``grouping.grouped``); with
``rows`` (``grouping.RowKernels``), one-row calls on CUDA run ``gemv``'s kernel.

``compiled(net, options)`` swaps the compiled layers in while a step is warmed up and captured
as a CUDA graph, and puts the user's modules back after: the graph replays the fused kernels,
the model itself is left as it was. ``dynamic_length(cache, mask)`` marks the static cache's
length (and the mask's width) as a dynamic dimension, so one compilation per step width
serves every cache length (every prompt length and budget).

A prompt pass runs the same regions compiled once more with the prompt's length dynamic
(``compiled(..., prompt=True)``; ``mark_prompt``): one trace serves every prompt length, and
the pass launches a few fused kernels per layer instead of the eager model's hundreds of
small ones (a short pass on a reused cache is then captured per prompt shape:
``Engine.capture_prompts_up_to``). The prompt's regions
are traced through a function of their own (``_call``), so their graphs and the steps'
(static widths, captured) are kept apart.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import weakref
from dataclasses import dataclass

import torch
from torch import nn

from . import grouping


def decoder_layers(net: nn.Module) -> nn.ModuleList:
    """The decoder's layers: the ModuleList holding the most parameters."""
    lists = [m for m in net.modules() if isinstance(m, nn.ModuleList) and len(m)]
    if not lists:
        raise ValueError(f'compile="regional" compiles a decoder\'s layers: {type(net).__name__} '
                         "holds no ModuleList of layers; accepted compile=True or 'inductor'")
    return max(lists, key=lambda m: sum(p.numel() for p in m.parameters()))


# The modules beside a transformers decoder's layers that every step runs, by the names
# transformers gives them: the final norm and the rotary embedding (uncompiled, each is a
# handful of small kernels per step).
BESIDE = ("norm", "rotary_emb")


def regions(net: nn.Module) -> list[tuple[nn.Module, str]]:
    """(parent, name) of each block compiled: the decoder layers, the linear layers outside
    them (the output head), then the decoder's final norm and rotary embedding (``BESIDE``:
    modules of the layers' parent holding no linear layer)."""
    layers = decoder_layers(net)
    inside = {id(m) for m in layers.modules()}
    outside = [(parent, name) for parent in net.modules() if id(parent) not in inside
               for name, child in parent.named_children() if isinstance(child, nn.Linear)]
    owner = next((m for m in net.modules() if any(c is layers for c in m.children())), None)
    beside = [(owner, name) for name in BESIDE if _small(getattr(owner, name, None))]
    return [(layers, str(i)) for i in range(len(layers))] + outside + beside


def _small(module) -> bool:
    """A module compiled beside the layers: one holding no linear layer and no list."""
    return isinstance(module, nn.Module) and not any(
        isinstance(m, (nn.Linear, nn.ModuleList)) for m in module.modules())


def dynamic_length(cache, mask) -> None:
    """Mark the slots dimension of a static cache's keys and values and the last dimension of
    the 4-D mask (or masks, ``cache.shaped``) as dynamic (torch.compile then compiles one graph for every length)."""
    from torch import _dynamo

    for layer in getattr(cache, "layers", ()):
        for name in ("keys", "values"):
            t = getattr(layer, name, None)
            if isinstance(t, torch.Tensor) and t.dim() == 4:
                _dynamo.mark_dynamic(t, 2)
    for m in (mask.values() if isinstance(mask, dict) else [mask]):
        if isinstance(m, torch.Tensor) and m.dim() == 4:
            _dynamo.mark_dynamic(m, 3)


def mark_prompt(values, length: int) -> None:
    """Mark ``length`` (the prompt's) as a dynamic size of the tensors in ``values`` (a
    region's arguments; tuples one level deep): any dimension of an integer tensor (positions),
    the dimensions between the batch and the last one of the others (hidden states, masks,
    rotary tables; the last is a feature or the cache's slots)."""
    from torch import _dynamo

    tensors = [t for v in values for t in (v if isinstance(v, (tuple, list)) else (v,))
               if isinstance(t, torch.Tensor)]
    for t in tensors:
        integer = not (t.is_floating_point() or t.dtype == torch.bool)
        dims = range(t.dim()) if integer else range(1 if t.dim() > 1 else 0, t.dim() - 1)
        for d in dims:
            if t.shape[d] == length:
                _dynamo.maybe_mark_dynamic(t, d)


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


def _call(forward, *args, **kwargs):
    """A prompt region's call (its own code object: its traces are not the steps')."""
    return forward(*args, **kwargs)


def _hooked(module: nn.Module, run, args: tuple, kwargs: dict):
    """``run(*args, **kwargs)`` (``module``'s compiled forward) with ``module``'s own forward
    pre-hooks and hooks around it, called as ``nn.Module.__call__`` calls them, outside the
    compiled graph: a hook (mmspec's ``FeatureTap``, transformers' output recorders) is plain
    Python each call, not code traced into, and guarded in, the graph the layers share."""
    for i, hook in module._forward_pre_hooks.items():
        if i in module._forward_pre_hooks_with_kwargs:
            res = hook(module, args, kwargs)
            args, kwargs = (args, kwargs) if res is None else res
        else:
            res = hook(module, args)
            args = args if res is None else res if isinstance(res, tuple) else (res,)
    out = run(*args, **kwargs)
    for i, hook in module._forward_hooks.items():
        res = (hook(module, args, kwargs, out) if i in module._forward_hooks_with_kwargs
               else hook(module, args, out))
        out = out if res is None else res
    return out


# The module of transformers' output-recording hooks (``output_hidden_states`` and the like):
# installed on a model's first call that asks for an output, kept for good, and untraceable
# by torch.compile (they read a context variable).
_RECORDERS = "transformers.utils.output_capturing"


def _take_recorders(modules: list[nn.Module], held: list) -> None:
    """transformers' output recorders taken off ``modules`` (the modules inside a compiled
    region) into ``held``, put back when the regions are (``compiled``). Inside a layer they
    record attentions or router logits, which no session asks for; traced, each would break
    the layer's graph in two (the region's own hooks run outside its graph: ``_hooked``)."""
    for m in modules:
        for i, hook in list(m._forward_hooks.items()):
            if getattr(hook, "__module__", None) == _RECORDERS:
                held.append((m, i, hook))
                del m._forward_hooks[i]


class _Region(nn.Module):
    """A layer compiled, called with its own view of the cache; ``prompt``: the length of
    the sequence (its inputs' second dimension) is dynamic."""

    def __init__(self, layer: nn.Module, index: int | None, options: dict, backend: str,
                 prompt: bool = False, group: bool = False,
                 rows: grouping.RowKernels | None = None):
        super().__init__()
        self.index, self.prompt, self.layer = index, prompt, layer
        # The modules inside, whose recorders are taken off while the regions run (``held``:
        # where, set by ``compiled``; a model's first ask installs them during a call).
        self.inside = [m for m in layer.modules() if m is not layer]
        self.held: list | None = None
        kw = dict(options=dict(options)) if backend == "inductor" and not group else {}
        if backend == "inductor" and group:   # linear layers reading one input: one product
            backend = grouping.grouped(options, rows)
        fn = functools.partial(_call, layer.forward) if prompt else layer.forward
        self.compiled = torch.compile(fn, dynamic=False, backend=backend, **kw)

    def forward(self, *args, **kwargs):
        if self.held is not None:
            _take_recorders(self.inside, self.held)
        if self.index is not None:
            args = [layer_cache(v, self.index) if _is_cache(v) else v for v in args]
            kwargs = {k: layer_cache(v, self.index) if _is_cache(v) else v
                      for k, v in kwargs.items()}
        first = args[0] if args else kwargs.get("hidden_states", kwargs.get("input"))
        if self.prompt and isinstance(first, torch.Tensor) and first.dim() > 1:
            mark_prompt([*args, *kwargs.values()], first.shape[1])
        return _hooked(self.layer, self.compiled, tuple(args), kwargs)


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
             backend, prompt: bool, group: bool,
             rows: grouping.RowKernels | None) -> nn.Module:
    index = _cache_index(parent, int(name)) if isinstance(parent, nn.ModuleList) else None
    return _Region(module, index, options, backend, prompt, group, rows)


@dataclass
class _Made:
    """A model's compiled wrappers for one setting: where each goes (the parent held weakly,
    the model being one), the module it wraps."""

    places: list[tuple[weakref.ref, str]]
    originals: list[nn.Module]
    wrappers: list[nn.Module]

    @property
    def pairs(self) -> list[tuple[nn.Module, str]]:
        return [(parent(), name) for parent, name in self.places]

    def current(self) -> bool:
        return all(getattr(p, n) is m for (p, n), m in zip(self.pairs, self.originals))


_MADE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# Per model: whether its decoder layers' groups all lie back to back (``lay_out``).
_LAID_OUT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def lay_out(net: nn.Module) -> bool:
    """Lay ``net``'s decoder layers' projections out back to back (``grouping``), once per
    model (again after ``forget_layout``); True when weights moved now."""
    if net in _LAID_OUT:
        return False
    layers = decoder_layers(net)
    moved = grouping.contiguous_projections(layers) > 0
    _LAID_OUT[net] = grouping.back_to_back(layers)
    return moved


def forget_layout(net: nn.Module | None = None) -> None:
    """Check ``net``'s layout again at its next ``lay_out`` (all models' if None)."""
    if net is None:
        _LAID_OUT.clear()
    else:
        _LAID_OUT.pop(net, None)


def _made(net: nn.Module, options: dict, backend, prompt: bool, group: bool,
          rows: grouping.RowKernels | None) -> _Made:
    """The wrappers of ``net``'s regions, made once per model and setting (and again when its
    modules were replaced): making them calls torch.compile per region, which costs more
    than a prompt pass; the traced code itself is kept by torch.compile on the modules' code
    objects."""
    key = (backend if isinstance(backend, str) else id(backend), repr(sorted(options.items())),
           prompt, group, rows)
    made = _MADE.setdefault(net, {})
    entry = made.get(key)
    if entry is None or not entry.current():
        pairs = regions(net)
        originals = [getattr(parent, name) for parent, name in pairs]
        entry = made[key] = _Made([(weakref.ref(p), n) for p, n in pairs], originals, [
            _wrapped(parent, name, module, options, backend, prompt, group, rows)
            for (parent, name), module in zip(pairs, originals)])
    return entry


@contextlib.contextmanager
def compiled(net: nn.Module, options: dict, backend="inductor", prompt: bool = False,
             group: bool = True, rows: grouping.RowKernels | None = None):
    """Run ``net`` with its regions compiled (``options``: inductor's; ``backend``: a
    torch.compile backend; ``prompt``: for prompt passes, of any length; ``group``: under
    inductor, linear calls on one input whose weights lie back to back as one product, on a
    model ``lay_out`` found all back to back; ``rows``: with ``group``, one-row calls on
    CUDA through ``gemv.row_product``); the original modules are back after. A failure
    of torch.compile is raised as a RuntimeError that names ``compile='graphs'``."""
    from torch import _dynamo

    # Layers that keep their own trace (see _cache_index) need an entry each per step width.
    _dynamo.config.cache_size_limit = max(_dynamo.config.cache_size_limit, 1024)
    _dynamo.config.accumulated_cache_size_limit = max(
        _dynamo.config.accumulated_cache_size_limit, 4096)
    group = group and backend == "inductor" and _LAID_OUT.get(net, False)
    made = _made(net, options, backend, prompt, group, rows if group else None)
    pairs = made.pairs
    held: list = []
    try:
        for (parent, name), wrapper in zip(pairs, made.wrappers):
            setattr(parent, name, wrapper)
            wrapper.held = held
        yield
    except _dynamo.exc.TorchDynamoException as err:
        cause = getattr(err, "inner_exception", None) or err
        first = (str(cause).strip().splitlines() or [""])[0][:300]
        raise RuntimeError(f"compile=True: torch.compile failed on {type(net).__name__}'s "
                           f"layers ({type(cause).__name__}: {first}); compile='graphs' "
                           "captures the steps without compiling") from err
    finally:
        for (parent, name), module, wrapper in zip(pairs, made.originals, made.wrappers):
            setattr(parent, name, module)
            wrapper.held = None
        for m, i, hook in held:
            m._forward_hooks[i] = hook
