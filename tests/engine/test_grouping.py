"""Grouped projections (mmspec.engine.grouping): layout back to back, and the graph pass."""

import pytest
import torch
import transformers

from mmspec.engine import grouping, regions


def _model(kind="llama", layers=2):
    torch.manual_seed(0)
    common = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2)
    if kind == "qwen2":     # q/k/v with biases
        return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common)).eval()
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**common)).eval()


def _counting(counts):
    def backend(gm, example_inputs):
        counts.append(sum(n.op == "call_function" and n.target in grouping.LINEAR
                          for n in gm.graph.nodes))
        return gm.forward
    return backend


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_layout_keeps_parameters_values_and_memory(kind):
    """Each module's sibling projections of one input width end back to back in one buffer:
    the same Parameter objects and values, as many bytes; a second call lays out nothing."""
    m = _model(kind)
    before = {n: (p, p.detach().clone()) for n, p in m.named_parameters()}
    nbytes = sum(p.numel() * p.element_size() for p in m.parameters())
    assert not grouping.back_to_back(m)
    assert grouping.contiguous_projections(m) == 2 * 2          # q/k/v/o and gate/up, per layer
    assert grouping.back_to_back(m) and grouping.contiguous_projections(m) == 0
    after = dict(m.named_parameters())
    assert all(after[n] is p and torch.equal(p, v) for n, (p, v) in before.items())
    assert sum(p.numel() * p.element_size() for p in m.parameters()) == nbytes
    a = m.model.layers[0].self_attn
    assert (a.k_proj.weight.storage_offset() == a.q_proj.weight.numel()
            and a.k_proj.weight.untyped_storage().data_ptr()
            == a.q_proj.weight.untyped_storage().data_ptr())
    if kind == "qwen2":
        assert a.v_proj.bias.storage_offset() == a.q_proj.bias.numel() + a.k_proj.bias.numel()


def test_layout_leaves_shared_weights_where_they_are():
    m = _model()
    a = m.model.layers[0].self_attn
    a.k_proj.weight = a.q_proj.weight.__class__(a.q_proj.weight.data[:16])   # a view of q
    ptr = a.q_proj.weight.untyped_storage().data_ptr()
    grouping.contiguous_projections(m)
    assert a.q_proj.weight.untyped_storage().data_ptr() == ptr
    assert not grouping.back_to_back(m)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_pass_runs_one_product_per_input_on_rows_not_one_row(kind):
    """Under the grouped backend a layer's q/k/v and gate/up calls are one product each (7
    linear calls -> 4) with the same logits; at one row the graph keeps its 7 calls."""
    m = _model(kind)
    grouping.contiguous_projections(m)
    with torch.no_grad():
        for ids, calls in ((torch.tensor([[3, 4, 5, 6]]), 4), (torch.tensor([[3]]), 7)):
            counts = []
            ref = m(ids).logits
            torch._dynamo.reset()
            with regions.compiled(m, {}, backend=grouping.grouped(_counting(counts))):
                got = m(ids).logits
            assert counts[1] == calls        # the rotary embedding's trace, the layers' one
            assert torch.allclose(got, ref, atol=1e-5, rtol=1e-5)
    torch._dynamo.reset()


def test_pass_leaves_weights_that_are_not_back_to_back():
    m = _model()
    counts = []
    with torch.no_grad():
        with regions.compiled(m, {}, backend=grouping.grouped(_counting(counts))):
            m(torch.tensor([[3, 4, 5, 6]]))
    assert counts[1] == 7                    # the rotary embedding's trace, the layers' one
    torch._dynamo.reset()


def test_session_lays_out_the_decoder_layers_and_lets_kept_steps_go():
    """A session's layout moves only the decoder layers' projections (the output head, which
    a head drafter may share, stays) and drops every kept static cache: their steps were
    captured on the weights' former places."""
    import mmspec
    from mmspec.engine.capture import KEPT
    from mmspec.sessions import CausalLMSession
    from mmspec.sessions.captured import CapturedSteps

    m = _model()
    m.extra = torch.nn.Linear(32, 8, bias=False)      # a sibling of the output head
    ids = torch.tensor([[3, 4, 5]])
    mmspec.generate(m, None, ids, temperature=0, max_new_tokens=2, static_cache=True)
    assert m in KEPT                               # a static cache kept for the next call
    head = m.lm_head.weight.untyped_storage().data_ptr()
    session = CausalLMSession(m, mmspec.SamplingParams(temperature=0))
    CapturedSteps(session).lay_out()
    assert grouping.back_to_back(m.model.layers) and m not in KEPT
    assert m.lm_head.weight.untyped_storage().data_ptr() == head
    assert regions._LAID_OUT[m] and not regions.lay_out(m)        # once per model
    mmspec.release_graphs(m)              # after Parameters are replaced: laid out again
    a = m.model.layers[1].mlp
    a.up_proj.weight.data = a.up_proj.weight.data.clone()
    assert m not in regions._LAID_OUT and regions.lay_out(m)
    assert grouping.back_to_back(m.model.layers)


def test_layout_leaves_tensor_subclasses_alone():
    """A weight of a tensor subclass (quantized, distributed) keeps its own layout: it stays
    out of its group, whose other members are laid out."""
    class Packed(torch.Tensor):
        pass

    m = _model(layers=1)
    a = m.model.layers[0].self_attn
    a.q_proj.weight = torch.nn.Parameter(a.q_proj.weight.detach().as_subclass(Packed))
    q = a.q_proj.weight.untyped_storage().data_ptr()
    grouping.contiguous_projections(m)
    assert a.q_proj.weight.untyped_storage().data_ptr() == q
    assert grouping._back_to_back([a.k_proj.weight, a.v_proj.weight, a.o_proj.weight])


def _row_counting(counts, norms=False):
    """The pass with ``rows`` (on any device: the op's CPU path is ``F.linear``), then the
    graph's linear calls, per ``row_product`` call (residual added, gated), the eps of the
    calls that take an RMSNorm (0 for the others) and the graph's ``torch.rsqrt`` calls."""
    op = torch.ops.mmspec.row_product.default
    rows = grouping.RowKernels(norms=norms)

    def backend(gm, example_inputs):
        grouping.group_linears(gm, example_inputs, rows)
        nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
        calls = [n.args for n in nodes if n.target is op]
        counts.append((sum(n.target in grouping.LINEAR for n in nodes),
                       [(a[3] is not None, a[4]) for a in calls],
                       [a[6] if len(a) > 5 else 0 for a in calls],
                       sum(n.target is torch.rsqrt for n in nodes)))
        return gm.forward
    return backend


@pytest.mark.parametrize("norms", [False, True])
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_one_row_pass_runs_row_products_with_their_residual_adds(kind, norms):
    """At one row, with ``rows``: q/k/v one ``row_product``, o and down each one with the
    residual add after it, gate/up one gated (its ``silu(gate) * up`` inside), the output
    head one; with ``norms`` the input and post-attention RMSNorms inside the q/k/v and
    gate/up calls (no rsqrt left in the layer). The logits are those of the layers."""
    m = _model(kind)
    grouping.contiguous_projections(m)
    ids = torch.tensor([[3]])
    counts = []
    eps = m.config.rms_norm_eps if norms else 0
    with torch.no_grad():
        ref = m(ids).logits
        torch._dynamo.reset()
        with regions.compiled(m, {}, backend=grouping.grouped(_row_counting(counts, norms))):
            got = m(ids).logits
    assert counts[1] == (0, [(False, False), (True, False), (False, True), (True, False)],
                         [eps, 0, eps, 0], 0 if norms else 2)          # (0: the rotary's)
    assert counts[-1] == (0, [(False, False)], [0], 0)
    assert torch.allclose(got, ref, atol=1e-5, rtol=1e-5)
    torch._dynamo.reset()


class _MLP(torch.nn.Module):
    def __init__(self, extra: bool):
        super().__init__()
        self.extra = extra
        self.gate = torch.nn.Linear(8, 6, bias=False)
        self.up = torch.nn.Linear(8, 6, bias=False)
        self.out = torch.nn.Linear(6, 6)

    def forward(self, x):
        g = self.gate(x)
        h = torch.nn.functional.silu(g) * self.up(x)
        if self.extra:
            h = h + g
        return self.out(h) + torch.ones(6)         # an add that broadcasts: not a residual


@pytest.mark.parametrize("extra", [False, True])
def test_gate_up_is_gated_only_when_it_feeds_silu_times_up_alone(extra):
    """A gate/up run whose outputs feed only ``silu(gate) * up`` is one gated
    ``row_product``; a gate output read elsewhere makes it a plain one, split after. An add
    that broadcasts is no residual."""
    torch.manual_seed(0)
    m = _MLP(extra)
    grouping.contiguous_projections(m)
    x = torch.randn(1, 1, 8)
    counts = []
    with torch.no_grad():
        got = torch.compile(m, backend=_row_counting(counts))(x)
        assert torch.allclose(got, m(x), atol=1e-6)
    assert counts == [(0, [(False, not extra), (False, False)], [0, 0], 0)]
    torch._dynamo.reset()


class _Normed(torch.nn.Module):
    """transformers' RMSNorm, then a projection; ``variant``: "gemma" scales by 1 + weight,
    "read" reads the normed states besides the projection."""

    def __init__(self, variant: str):
        super().__init__()
        self.variant = variant
        self.weight = torch.nn.Parameter(torch.rand(8) + 0.5)
        self.proj = torch.nn.Linear(8, 6, bias=False)

    def forward(self, h):
        h32 = h.to(torch.float32)
        x = h32 * torch.rsqrt(h32.pow(2).mean(-1, keepdim=True) + 1e-6)
        x = (1 + self.weight if self.variant == "gemma" else self.weight) * x.to(h.dtype)
        y = self.proj(x)
        return y + x[..., :6] if self.variant == "read" else y


@pytest.mark.parametrize("variant", ["llama", "gemma", "read"])
def test_rms_norm_goes_into_the_row_product_only_as_transformers_writes_it(variant):
    """With ``RowKernels(norms=True)`` an RMSNorm whose output only the one-row product reads
    becomes the product's (its input, weight and eps); a ``1 + weight`` norm or one whose
    output is read elsewhere stays in the graph. The output is the module's."""
    torch.manual_seed(0)
    m = _Normed(variant)
    x = 3 * torch.randn(1, 1, 8)
    counts = []
    with torch.no_grad():
        got = torch.compile(m, backend=_row_counting(counts, norms=True))(x)
        assert torch.allclose(got, m(x), atol=1e-6)
    fused, read = variant == "llama", variant == "read"       # read: added as a residual
    assert counts == [(0, [(read, False)], [1e-6 if fused else 0], 0 if fused else 1)]
    torch._dynamo.reset()


def test_row_product_kernel_matches_linear_under_the_triton_interpreter():
    """``gemv``'s Triton kernel run by Triton's interpreter on the CPU (a child process:
    the interpreter is chosen when Triton is imported): plain, with a bias, a residual,
    gated, its input RMS-normed, row and K tails; float32 against ``F.linear`` in float64."""
    import os
    import subprocess
    import sys

    code = (
        "import torch\n"
        "from mmspec.kernels import gemv\n"
        "torch.manual_seed(0)\n"
        "for n, k, bias, res, gated, norm in [(40, 300, False, False, False, False),"
        " (40, 256, True, True, False, False), (7, 129, False, True, False, True),"
        " (34, 64, True, False, True, False), (20, 130, False, True, True, True)]:\n"
        "    x, w = 3 * torch.randn(1, 1, k), torch.randn(n, k)\n"
        "    b = torch.randn(n) if bias else None\n"
        "    m = n // 2 if gated else n\n"
        "    r = torch.randn(1, 1, m) if res else None\n"
        "    nw = torch.rand(k) + 0.5 if norm else None\n"
        "    y = gemv.launch(x, w, b, r, gated, pdl=False, norm=nw, eps=1e-5)\n"
        "    d = lambda t: None if t is None else t.double()\n"
        "    ref = gemv._reference(x.double(), w.double(), d(b), d(r), gated, d(nw), 1e-5)\n"
        "    assert y.shape == ref.shape == (1, 1, m), (y.shape, m)\n"
        "    err = (y.double() - ref).abs().max().item()\n"
        "    assert err < 1e-4 * ref.abs().max().item(), (n, k, bias, res, gated, norm, err)\n"
        "print('ok')\n")
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_row_product_kernel_compiles_for_hopper_in_every_setting(dtype):
    """Every launch setting ``gemv`` tunes among, with a bias, a residual, gating and the
    norm (and each of those alone in one setting), compiles for sm_90 without a GPU; under
    PDL each program's first weight loads come before its wait on the kernel before it."""
    from conftest import row_kernel_for_hopper

    settings = [dict(HAS_BIAS=True, HAS_RESIDUAL=True, GATED=True, NORM=True, PDL=True)]
    settings += [dict(HAS_BIAS=False, HAS_RESIDUAL=r, GATED=g, NORM=nm, PDL=pdl)
                 for r, g, nm, pdl in ((True, False, False, True), (False, True, True, False))]
    row_kernel_for_hopper(dtype, [dict(K=4096, **f) for f in settings])


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_one_row_q_k_v_with_its_rotary_and_cache_writes_is_one_call(kind, backend):
    """At one row on a static cache (``cache.static_cache``: the layers write at one shared
    pointer), with ``rows``: each layer's q/k/v product, the rotary embedding of q and k and
    the writes of k and v into the cache are one ``qkv_rope`` call (biases included); the
    logits and every cache slot are the unfused layers', through AOT autograd's
    functionalisation of the op's writes (and inductor's code on the CPU); the op reads the
    cache's write pointer itself (no ``arange`` left to compute the slot); with ``rope``
    off, no such call."""
    from mmspec.cache import advance, static_cache

    m = _model(kind)
    grouping.contiguous_projections(m)
    op = torch.ops.mmspec.qkv_rope.default
    results = []
    for rope in (None, True, False):
        fused, slots = [], []

        def compile_fn(gm, example_inputs):
            grouping.group_linears(gm, example_inputs, grouping.RowKernels(rope=rope))
            fused.append(sum(n.target is op for n in gm.graph.nodes))
            slots.append(sum(n.target is torch.arange for n in gm.graph.nodes))
            return torch._dynamo.lookup_backend(backend)(gm, example_inputs)

        cache = static_cache(m.config, 16)
        with torch.no_grad():
            m(input_ids=torch.tensor([[3, 4, 5]]), cache=cache, use_cache=True)
            advance(cache, 3)
            torch._dynamo.reset()
            step = dict(input_ids=torch.tensor([[6]]), cache=cache, use_cache=True,
                        cache_position=torch.tensor([3]))
            if rope is None:
                logits = m(**step).logits
            else:
                with regions.compiled(m, {}, backend=compile_fn):
                    logits = m(**step).logits
        results.append((logits, [t.clone() for layer in cache.layers
                                 for t in (layer.keys, layer.values)], fused, slots))
    (ref, ref_cache, *_), *compiled = results
    assert compiled[0][2][1] == 1 and compiled[1][2][1] == 0        # the layer's trace
    assert compiled[0][3][1] == 0 < compiled[1][3][1]    # the op reads the pointer itself
    for logits, tensors, *_ in compiled:
        torch.testing.assert_close(logits, ref, rtol=1e-5, atol=1e-5)
        for got, want in zip(tensors, ref_cache):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch._dynamo.reset()
