"""Grouped projections (``compile=True``): linear layers that read one input, as one product.

A decoder layer's query, key and value projections read the same normed hidden states, as do
an MLP's gate and up projections. At one row inductor fuses their matrix-vector products into
one reduction kernel. At more rows (a K + 1 token verification, a prompt pass) each product
goes to cuBLAS on its own: for the 4096 x 4096 ones of a 7B Llama a split-K kernel and its
reduction each, three times where gpt-fast, whose weights store q/k/v as one matrix, runs one
product (docs/benchmarks.md).

Terms:
    group       sibling ``nn.Linear`` layers of one module with the same input width, dtype,
                device and bias presence (q/k/v/o of an attention; gate/up of an MLP).
    back to back  weights (and biases) laid out one after the other in one buffer, in the
                module's order: each Parameter's ``.data`` a view of it. The Parameters, their
                values and the memory they take are as before.
    run         linear calls in a traced graph on one input whose weights are back to back.

``contiguous_projections(module)`` lays every group of a module out back to back (once; a
group already laid out, or holding a weight shared with another Parameter, is left as it is).
``group_linears(gm, example_inputs)``, a pass over a graph torch.compile traced, replaces each
run by one product over the span of its weights (``as_strided`` from the first) split after;
``grouped(backend)`` is a torch.compile backend that runs the pass first. Calls on one row
are left to inductor's reductions, or with ``rows`` (``RowKernels``; CUDA) go to
``gemv.row_product``: a run as one kernel over its span (an MLP's gate/up run with its
``silu(gate) * up``), any other call alone with the residual add after it; an RMSNorm whose
output only such a call reads goes into the call (``RowKernels.norms``). A trace is shared
by every layer that runs the same code, so the pass is only for models whose groups are all
back to back (``back_to_back``; ``mmspec.engine.regions`` checks it).
"""

from __future__ import annotations

import math
import operator
from collections import defaultdict
from dataclasses import dataclass

import torch
from torch import fx, nn

from ..kernels import gemv  # noqa: F401  (registers torch.ops.mmspec.row_product)
from ..kernels import qkv_rope  # noqa: F401  (registers torch.ops.mmspec.qkv_rope)

LINEAR = (torch._C._nn.linear, nn.functional.linear)


def _plain(t) -> bool:
    """A dense tensor (or Parameter): not a subclass (quantized, distributed) whose layout is
    its own."""
    return type(t) in (torch.Tensor, nn.Parameter)


def _groups(module: nn.Module) -> list[list[nn.Linear]]:
    by: dict = defaultdict(list)
    for child in module.children():
        if (type(child) is nn.Linear and _plain(child.weight)
                and (child.bias is None or _plain(child.bias))):
            w = child.weight
            by[(w.shape[1], w.dtype, w.device, child.bias is None)].append(child)
    return [g for g in by.values() if len(g) > 1]


def _back_to_back(tensors: list[torch.Tensor]) -> bool:
    """One storage, each tensor contiguous and starting where the one before ends."""
    first = tensors[0]
    at = first.storage_offset()
    for t in tensors:
        if (not t.is_contiguous() or t.untyped_storage().data_ptr()
                != first.untyped_storage().data_ptr() or t.storage_offset() != at):
            return False
        at += t.numel()
    return True


def _laid_out(group: list[nn.Linear]) -> bool:
    biases = [m.bias for m in group if m.bias is not None]
    return _back_to_back([m.weight for m in group]) and (not biases or _back_to_back(biases))


def _lay_out(params: list[nn.Parameter]) -> None:
    buffer = torch.empty(sum(p.numel() for p in params), dtype=params[0].dtype,
                         device=params[0].device)
    at = 0
    for p in params:
        view = buffer[at:at + p.numel()].view(p.shape)
        view.copy_(p.data)
        p.data = view
        at += p.numel()


def contiguous_projections(net: nn.Module) -> int:
    """Lay out each group of ``net``'s sibling linear layers back to back; returns how many
    groups were laid out. Weights on the meta device or sharing storage with another
    Parameter are left where they are."""
    owners: dict = defaultdict(int)
    for p in net.parameters():
        owners[p.untyped_storage().data_ptr()] += 1
    done = 0
    with torch.no_grad():
        for module in net.modules():
            for group in _groups(module):
                weights = [m.weight for m in group]
                biases = [m.bias for m in group if m.bias is not None]
                if _laid_out(group) or any(p.device.type == "meta" or owners[
                        p.untyped_storage().data_ptr()] > 1 for p in weights + biases):
                    continue
                _lay_out(weights)
                if biases:
                    _lay_out(biases)
                done += 1
    return done


def back_to_back(net: nn.Module) -> bool:
    """Every group of ``net`` laid out back to back (``group_linears``' traces are shared by
    the layers that run the same code: it is applied to a model only when this holds)."""
    return all(_laid_out(group) for module in net.modules() for group in _groups(module))


def _rows(x: fx.Node) -> int | None:
    """The rows of a linear call's input (its leading dimensions' product); None: unknown."""
    value = x.meta.get("example_value")
    if not isinstance(value, torch.Tensor):
        return None
    rows = math.prod(value.shape[:-1])
    return rows if isinstance(rows, int) else None


def _runs(calls: list[tuple], real: dict) -> list[list[tuple]]:
    """Maximal runs (two or more calls) of back-to-back weights, in storage order."""
    calls = sorted(calls, key=lambda c: (real[c[1]].untyped_storage().data_ptr(),
                                         real[c[1]].storage_offset()))
    runs, run = [], calls[:1]
    for c in calls[1:]:
        if _joins(run + [c], real):
            run.append(c)
        else:
            runs.append(run)
            run = [c]
    runs.append(run)
    return [r for r in runs if len(r) > 1]


def _joins(run: list[tuple], real: dict) -> bool:
    weights = [real[w] for _, w, _ in run]
    if len({(w.shape[1], w.dtype) for w in weights}) > 1 or not _back_to_back(weights):
        return False
    biases = [b for _, _, b in run]
    if all(b is None for b in biases):
        return True
    return all(b in real for b in biases) and _back_to_back([real[b] for b in biases])


def _span(graph: fx.Graph, node: fx.Node, tensors: list[torch.Tensor]) -> fx.Node:
    first, rows = tensors[0], sum(t.shape[0] for t in tensors)
    shape = (rows, first.shape[1]) if first.dim() == 2 else (rows,)
    stride = (first.shape[1], 1) if first.dim() == 2 else (1,)
    # from the first tensor's own offset: a trace serves every layer laid out alike
    return graph.call_function(torch.as_strided, (node, shape, stride))


def _replace(graph: fx.Graph, x: fx.Node, run: list[tuple], real: dict, op) -> fx.Node:
    """The calls of ``run`` on ``x`` as one call of ``op`` (``linear``'s arguments; for
    ``gemv.row_product`` no residual, not gated) over their weights' span, split after;
    returns that call."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    first = min((c[0] for c in run), key=order.__getitem__)
    with graph.inserting_before(first):
        weight = _span(graph, run[0][1], [real[w] for _, w, _ in run])
        bias = None
        if run[0][2] is not None:
            bias = _span(graph, run[0][2], [real[b] for _, _, b in run])
        args = (x, weight, bias) if op is torch._C._nn.linear else (x, weight, bias, None,
                                                                     False)
        y = graph.call_function(op, args)
        parts = graph.call_function(torch.split, (y, [real[w].shape[0] for _, w, _ in run], -1))
        for i, (node, _, _) in enumerate(run):
            part = graph.call_function(operator.getitem, (parts, i))
            part.meta = dict(node.meta)
            node.replace_all_uses_with(part)
    for node, _, _ in run:
        graph.erase_node(node)
    return y


def _linear_args(node: fx.Node):
    args = list(node.args) + [None] * (3 - len(node.args))
    x = node.kwargs.get("input", args[0])
    w = node.kwargs.get("weight", args[1])
    b = node.kwargs.get("bias", args[2])
    return x, w, b


@dataclass(frozen=True)
class RowKernels:
    """One-row calls through ``gemv.row_product`` (``group_linears``); ``norms``: with the
    RMSNorm before a call in the call (each program of the kernel reads all of x); ``rope``:
    a q/k/v run with its rotary embedding and cache writes as ``qkv_rope`` (``_rope``)."""

    norms: bool = True
    rope: bool = True


def group_linears(gm: fx.GraphModule, example_inputs, rows: RowKernels | None = None) -> int:
    """Replace each run of linear calls in ``gm`` (inputs of more than one row; weights and
    biases among its placeholders, ``example_inputs`` their tensors) by one product split
    after; with ``rows``, one-row calls by ``gemv.row_product`` (``_row_products``). Returns
    the number of calls made."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    real = {n: t for n, t in zip(placeholders, example_inputs) if _plain(t)}
    by_input: dict = defaultdict(list)
    by_row: dict = defaultdict(list)
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in LINEAR:
            x, w, b = _linear_args(node)
            n = _rows(x)
            if w in real and (b is None or b in real) and n is not None:      # else left alone
                (by_row if n == 1 else by_input)[x].append((node, w, b))
    runs = [(x, run) for x, calls in by_input.items() for run in _runs(calls, real)]
    for x, run in runs:
        _replace(gm.graph, x, run, real, torch._C._nn.linear)
    made = len(runs) + (0 if rows is None else _row_products(gm.graph, by_row, real, rows))
    if made:
        gm.graph.lint()
        gm.recompile()
    return made


def _row_products(graph: fx.Graph, by_row: dict, real: dict, rows: RowKernels) -> int:
    """One-row calls as ``gemv.row_product`` (``group_linears``): a run over its span, split
    after, or gated when its outputs only feed ``silu(first) * second`` (an MLP's gate/up); a
    single call with the residual add that alone reads it. With ``rows.norms``, a run whose
    input is an RMSNorm's output that only it reads takes the norm's input and weight instead
    (``_rms_norm``); with ``rows.rope``, a q/k/v run with its rotary embedding and cache
    writes becomes one ``qkv_rope`` call (``_rope``)."""
    op, made = torch.ops.mmspec.row_product.default, 0
    for calls in by_row.values():
        runs = _runs(calls, real)
        joined = {c[0] for run in runs for c in run}
        for run in runs + [[c] for c in calls if c[0] not in joined]:
            x = _linear_args(run[0][0])[0]       # now (a replaced call may have been it)
            alone = set(x.users) == {c[0] for c in run}
            norm = _rms_norm(x, real) if rows.norms and alone else None
            if _gated(run):
                y = _gate_up(graph, x, run, real, op)
            elif len(run) > 1:
                y = _replace(graph, x, run, real, op)
            else:
                y = _single(graph, x, run[0][0], real[run[0][1]], run[0][1], run[0][2], op)
            if norm is not None:
                _take_norm(graph, y, norm)
            if rows.rope and len(run) == 3:          # q, k, v (a gated run has two)
                _rope(graph, y)
            made += 1
    return made


@dataclass(frozen=True)
class _Norm:
    """An RMSNorm in a traced graph (``_rms_norm``): its input, weight, epsilon and nodes."""

    h: fx.Node
    weight: fx.Node
    eps: float
    nodes: tuple[fx.Node, ...]          # output first


def _call(node, target, n_args: int) -> bool:
    return (isinstance(node, fx.Node) and node.op in ("call_function", "call_method")
            and node.target in target and len(node.args) == n_args)


def _rms_norm(x: fx.Node, real: dict) -> _Norm | None:
    """``weight * (h32 * rsqrt(mean(h32 ** 2, -1, keepdim=True) + eps)).to(h.dtype)`` with
    ``h32 = h.to(float32)`` (transformers' RMSNorm) ending in ``x``, its weight a 1-D
    Parameter of h's dtype; None for anything else (Gemma's ``1 + weight``, a norm that keeps
    its dtype ...)."""
    if not _call(x, (operator.mul,), 2):
        return None
    weight, cast = x.args if x.args[0] in real else x.args[::-1]
    if weight not in real or not _call(cast, ("to",), 2):
        return None
    scaled = cast.args[0]
    if not _call(scaled, (operator.mul,), 2) or not _call(scaled.args[1], (torch.rsqrt,), 1):
        return None
    h32, rsqrt = scaled.args
    add = rsqrt.args[0]
    if not (_call(add, (operator.add,), 2) and isinstance(add.args[1], float)
            and _call(h32, ("to",), 2) and h32.args[1] is torch.float32):
        return None
    mean = add.args[0]
    if not (_call(mean, ("mean",), 2) and mean.args[1] == -1
            and mean.kwargs == {"keepdim": True}):
        return None
    square = mean.args[0]
    if not (_call(square, ("pow",), 2) and square.args == (h32, 2)):
        return None
    h, w = h32.args[0], real[weight]
    value = h.meta.get("example_value") if isinstance(h, fx.Node) else None
    if not (isinstance(value, torch.Tensor) and cast.args[1] is value.dtype == w.dtype
            and w.dim() == 1 and w.shape[0] == value.shape[-1]):
        return None
    return _Norm(h, weight, add.args[1], (x, cast, scaled, rsqrt, add, mean, square, h32))


def _take_norm(graph: fx.Graph, y: fx.Node, norm: _Norm) -> None:
    """``y`` (a ``row_product`` of the norm's output) reads the norm's input and weight
    instead; the norm's nodes nothing reads any more are erased."""
    y.args = (norm.h, *y.args[1:5], norm.weight, norm.eps)
    for node in norm.nodes:
        if not node.users:
            graph.erase_node(node)


@dataclass(frozen=True)
class _Head:
    """One of a q/k/v span's parts as heads: ``part.view(1, 1, -1, D).transpose(1, 2)``."""

    states: fx.Node                    # the transposed view
    d: int                             # the head dimension
    nodes: tuple[fx.Node, ...]         # states, view, part


def _heads(part: fx.Node) -> _Head | None:
    view = next(iter(part.users), None) if len(part.users) == 1 else None
    if not (_call(view, ("view",), 2) and len(view.users) == 1):
        return None
    states = next(iter(view.users))
    shape = view.args[1]
    if not (_call(states, ("transpose",), 3) and states.args[1:] == (1, 2)
            and isinstance(shape, tuple) and len(shape) == 4 and shape[:3] == (1, 1, -1)
            and isinstance(shape[3], int) and shape[3] % 2 == 0):
        return None
    return _Head(states, shape[3], (states, view, part))


def _rotary(node: fx.Node, t: fx.Node, d: int):
    """(cos, sin, nodes) when ``node`` is transformers' ``t * cos + rotate_half(t) * sin``
    (``rotate_half``: ``cat((-t[..., D/2:], t[..., :D/2]), -1)``); else None."""
    if not _call(node, (operator.add,), 2):
        return None
    first, second = node.args
    if not (_call(first, (operator.mul,), 2) and _call(second, (operator.mul,), 2)
            and first.args[0] is t):
        return None
    cat, sin = second.args
    if not (_call(cat, (torch.cat,), 1) and cat.kwargs == {"dim": -1}
            and len(cat.args[0]) == 2):
        return None
    neg, low = cat.args[0]
    high = neg.args[0] if _call(neg, (operator.neg,), 1) else None
    half = d // 2
    if not (_call(high, (operator.getitem,), 2) and _call(low, (operator.getitem,), 2)
            and high.args == (t, (Ellipsis, slice(half, None, None)))
            and low.args == (t, (Ellipsis, slice(None, half, None)))):
        return None
    return first.args[1], sin, (node, first, second, cat, neg, high, low)


def _rope(graph: fx.Graph, y: fx.Node) -> bool:
    """A one-row q/k/v ``row_product`` ``y`` (split in three, each part as heads) whose q and
    k get transformers' rotary embedding and whose k and v then go into the cache by
    ``index_copy_(cache, 2, at, ...)`` at one slot, read by nothing else: all of it as one
    ``qkv_rope`` call. Returns whether it was; the graph is left as it was if not."""
    split = next(iter(y.users), None) if len(y.users) == 1 else None
    if not (_call(split, (torch.split,), 3) and len(split.users) == 3
            and split.args[1][1] == split.args[1][2]):           # as many k rows as v rows
        return False
    heads = [_heads(p) for p in sorted(split.users, key=lambda n: n.args[1])]
    if any(h is None for h in heads) or len({h.d for h in heads}) != 1:
        return False
    (q, k, v), d = heads, heads[0].d
    rots = [_embedded(h.states, d) for h in (q, k)]
    if None in rots or rots[0][1:3] != rots[1][1:3] or len(v.states.users) != 1:
        return False
    (q_embed, cos, sin, q_nodes), (k_embed, _, _, k_nodes) = rots
    copies = [next(iter(n.users)) if len(n.users) == 1 else None for n in (k_embed, v.states)]
    if not all(_call(c, ("index_copy_",), 4) and c.args[1] == 2 for c in copies):
        return False
    (copy_k, copy_v), at = copies, copies[0].args[2]
    if copy_v.args[2] is not at or copy_k.args[3] is not k_embed or copy_v.args[3] is not v.states:
        return False
    order = {n: i for i, n in enumerate(graph.nodes)}
    first = min(copies, key=order.__getitem__)
    if any(order[u] < order[first] for u in q_embed.users):
        return False
    norm, eps = (y.args[5], y.args[6]) if len(y.args) > 5 else (None, 0.0)
    with graph.inserting_before(first):
        fused = graph.call_function(torch.ops.mmspec.qkv_rope.default, (
            y.args[0], y.args[1], y.args[2], norm, eps, cos, sin, copy_k.args[0],
            copy_v.args[0], _pointer(at), split.args[1][0], d))
    fused.meta = dict(q_embed.meta)
    q_embed.replace_all_uses_with(fused)
    _erase(graph, [copy_k, copy_v, *q_nodes, *k_nodes, *q.nodes, *k.nodes, *v.nodes, split, y])
    if fused.args[9] is not at and not at.users:
        _erase(graph, [at, at.args[0]] if len(at.args[0].users) == 1 else [at])
    return True


def _pointer(at: fx.Node) -> fx.Node:
    """The cache's 0-d write pointer when ``at`` is ``arange(1) + pointer`` (static layers'
    slot at one row; the op reads its one element, and no kernel per layer computes ``at``),
    else ``at``."""
    if not (_call(at, (operator.add,), 2) and _call(at.args[0], (torch.arange,), 1)
            and at.args[0].args[0] == 1 and isinstance(at.args[1], fx.Node)):
        return at
    value = at.args[1].meta.get("example_value")
    ok = isinstance(value, torch.Tensor) and value.dim() == 0 and not value.is_floating_point()
    return at.args[1] if ok else at


def _embedded(states: fx.Node, d: int):
    """(output, cos, sin, nodes) of the rotary embedding of ``states`` when it is all that
    reads them (``_rotary``); else None."""
    muls = [n for n in states.users if _call(n, (operator.mul,), 2) and n.args[0] is states]
    if len(states.users) != 3 or len(muls) != 1 or len(muls[0].users) != 1:
        return None
    found = _rotary(next(iter(muls[0].users)), states, d)
    if found is None or set(states.users) != {muls[0], *found[2][5:]}:
        return None
    return (found[2][0], *found)


def _erase(graph: fx.Graph, nodes: list[fx.Node]) -> None:
    """Erase ``nodes`` (consumers before producers); each must be read by nothing left."""
    for node in nodes:
        assert not node.users, node
        graph.erase_node(node)


def _gated(run: list[tuple]) -> bool:
    """The run's two outputs only feed ``silu(first) * second``."""
    if len(run) != 2:
        return False
    gate, up = run[0][0], run[1][0]
    silu, mul = next(iter(gate.users), None), next(iter(up.users), None)
    return (len(gate.users) == len(up.users) == 1 and silu is not None
            and silu.target is nn.functional.silu and len(silu.users) == 1
            and next(iter(silu.users)) is mul and mul.target is operator.mul
            and set(mul.args) == {silu, up})


def _gate_up(graph: fx.Graph, x: fx.Node, run: list[tuple], real: dict, op) -> fx.Node:
    """A gated run (``_gated``) as one gated call of ``op`` in place of its product."""
    (gate, w, b), (up, _, _) = run
    silu = next(iter(gate.users))
    mul = next(iter(silu.users))
    order = {n: i for i, n in enumerate(graph.nodes)}
    with graph.inserting_before(min(gate, up, key=order.__getitem__)):
        weight = _span(graph, w, [real[c[1]] for c in run])
        bias = None if b is None else _span(graph, b, [real[c[2]] for c in run])
        y = graph.call_function(op, (x, weight, bias, None, True))
    y.meta = dict(mul.meta)
    mul.replace_all_uses_with(y)
    for node in (mul, silu, gate, up):
        graph.erase_node(node)
    return y


def _single(graph: fx.Graph, x: fx.Node, node: fx.Node, weight: torch.Tensor, w: fx.Node,
            b: fx.Node | None, op) -> fx.Node:
    """One call as ``op``, with the add of a tensor like its output when that add alone reads
    it (the residual)."""
    add = next(iter(node.users), None)
    residual = None
    if (len(node.users) == 1 and add.target is operator.add and len(add.args) == 2
            and node in add.args and add.args[0] is not add.args[1]):
        other = add.args[1] if add.args[0] is node else add.args[0]
        mine, theirs = node.meta.get("example_value"), getattr(other, "meta", {}).get(
            "example_value")
        if (isinstance(theirs, torch.Tensor) and isinstance(mine, torch.Tensor)
                and theirs.shape == mine.shape and theirs.dtype == mine.dtype == weight.dtype):
            residual = other
    order = {n: i for i, n in enumerate(graph.nodes)}
    at = node if residual is None or order[residual] < order[node] else residual
    with graph.inserting_after(at):
        y = graph.call_function(op, (x, w, b, residual, False))
    y.meta = dict((node if residual is None else add).meta)
    (node if residual is None else add).replace_all_uses_with(y)
    if residual is not None:
        graph.erase_node(add)
    graph.erase_node(node)
    return y


_BACKENDS: dict = {}


def grouped(backend, rows: RowKernels | None = None):
    """A torch.compile backend: ``group_linears`` (``rows`` on CUDA inputs with Triton), then
    ``backend`` (a callable, or inductor with its options: ``grouped({"coordinate_descent_
    tuning": True})``). One object per backend and options, so every layer's region finds the
    traces the first one made."""
    key = (backend if callable(backend) else repr(sorted(backend.items())), rows)
    if key not in _BACKENDS:
        _BACKENDS[key] = _grouped(backend, rows)
    return _BACKENDS[key]


def _kernels_available(example_inputs) -> bool:
    """The inputs are on CUDA and Triton is there (``gemv.row_product``'s kernel)."""
    import importlib.util

    return (any(isinstance(t, torch.Tensor) and t.is_cuda for t in example_inputs)
            and importlib.util.find_spec("triton") is not None)


def _grouped(backend, rows: RowKernels | None):
    def compile_fn(gm: fx.GraphModule, example_inputs):
        group_linears(gm, example_inputs, rows if _kernels_available(example_inputs) else None)
        if callable(backend):
            return backend(gm, example_inputs)
        from torch._inductor.compile_fx import compile_fx

        return compile_fx(gm, example_inputs, config_patches=dict(backend))
    return compile_fn
