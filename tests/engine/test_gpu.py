"""GPU-only checks (marked ``gpu``; skipped without CUDA, run on the device machine): the
captured path (static caches + CUDA graphs; ``compile=True``: each decoder layer fused by
torch.compile first) gives the eager path's tokens under greedy decoding in float32, for
text, and for images with guidance, a draft model and Jacobi, trees and heads, Qwen-VL, VLMs
and speech.

Inductor's coordinate-descent tuning is off here (``Engine.inductor_options``, ``fast``): it
picks among kernel configurations of the same fused graph by timing them, which takes most of
the compilation time of these many small models; eval.bench_gpu and eval.first_call run
with it."""

from __future__ import annotations

import pytest
import torch

import mmspec
from conftest import tiny_llama
from mmspec.engine import Engine, compile_mode
from mmspec.engine import grouping

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def fast(compile=True, **switches) -> dict:
    """A front door's ``engine=`` for a captured mode whose steps inductor compiles without
    tuning (quick to compile; what the tests check does not depend on the tuning)."""
    return dict(engine=Engine(compile_mode(compile), inductor_options={}, **switches))


def _record_host_free(monkeypatch) -> list:
    """A list that receives ``host_free`` of every ModelDrafter built from now on."""
    from mmspec.drafters import ModelDrafter

    seen = []
    init = ModelDrafter.__init__

    def spy(self, *args, **kwargs):
        init(self, *args, **kwargs)
        seen.append(self.host_free)

    monkeypatch.setattr(ModelDrafter, "__init__", spy)
    return seen


def _token_span_pipe():
    """A tiny token-span text-to-image pipeline with a draft, on the GPU."""
    from modalities.image import TextToImage, TokenSpanAdapter
    from tiny_image import tiny_token_span, tiny_vq

    dev = torch.device("cuda")
    vq = tiny_vq()
    vq.vq.to(dev)
    m, off = tiny_token_span()
    d, _ = tiny_token_span(seed=1, hidden=16, layers=1)
    mk = lambda x: TokenSpanAdapter(x.to(dev), list(range(off, off + 16)), (4, 4), vq,  # noqa: E731
                                    prefix=[1], suffix=[2], pad_id=0)
    return TextToImage(mk(m), mk(d))


@pytest.mark.parametrize("k", [1, 3, 8])
def test_captured_equals_eager_text(k):
    dev = torch.device("cuda")
    t = tiny_llama(vocab=64, hidden=64, layers=2).to(dev)
    d = tiny_llama(vocab=64, hidden=32, layers=1, seed=1).to(dev)
    ids = torch.tensor([[0, 0, 3, 4, 5], [2, 1, 2, 3, 4], [0, 0, 0, 7, 8]], device=dev)
    mask = (ids != 0).long()
    mask[1] = 1
    kw = dict(attention_mask=mask, temperature=0, max_new_tokens=24, num_draft_tokens=k)
    eager = mmspec.generate(t, d, ids, **kw)
    cap = mmspec.generate(t, d, ids, **fast(), **kw)
    plain = mmspec.generate(t, None, ids, attention_mask=mask, temperature=0, max_new_tokens=24)
    assert torch.equal(eager.sequences, cap.sequences)
    assert torch.equal(plain.sequences, cap.sequences)
    synced = mmspec.generate(t, d, ids, **fast(True, pipeline=False), **kw)   # default: queued
    assert torch.equal(plain.sequences, synced.sequences)


@pytest.mark.parametrize("fuse", ["graphs", True])
def test_captured_plain_decoding_in_chains_equals_eager(fuse, monkeypatch):
    """Captured plain greedy decoding runs ``PLAIN_STEPS`` target steps per launch as one
    chain graph (``Plan.steps_per_launch``): eager plain greedy's tokens in float32, pipelined and
    synchronised, with a budget that ends mid-chain and a row ending on a stop token inside a
    chain; every target step counted."""
    from mmspec.engine import PLAIN_STEPS
    from mmspec.sessions.captured import CapturedSteps

    chains = []
    capture = CapturedSteps.capture_chain

    def spy(self, fn, static, widths, *args):
        chains.append(len(widths))
        return capture(self, fn, static, widths, *args)

    monkeypatch.setattr(CapturedSteps, "capture_chain", spy)
    dev = torch.device("cuda")
    t = tiny_llama(vocab=64, hidden=64, layers=2).to(dev)
    ids = torch.tensor([[0, 0, 3, 4, 5], [2, 1, 2, 3, 4], [0, 0, 0, 7, 8]], device=dev)
    mask = (ids != 0).long()
    mask[1] = 1
    n = 2 * PLAIN_STEPS + 2
    kw = dict(attention_mask=mask, temperature=0, max_new_tokens=n)
    eager = mmspec.generate(t, None, ids, **kw)
    stop = int(eager.sequences[0, ids.shape[1] + PLAIN_STEPS + 1])
    stopped = mmspec.generate(t, None, ids, stop_token_ids=[stop], **kw)
    for pipeline in (None, False):
        cap = mmspec.generate(t, None, ids, **fast(fuse, pipeline=pipeline), **kw)
        assert torch.equal(cap.sequences, eager.sequences), pipeline
        assert cap.stats.steps == n and cap.stats.emitted == eager.stats.emitted
        cap = mmspec.generate(t, None, ids, **fast(fuse, pipeline=pipeline),
                              stop_token_ids=[stop], **kw)
        assert torch.equal(cap.sequences, stopped.sequences), pipeline
    assert PLAIN_STEPS in chains and 2 in chains         # full chains and the budget's last


def test_captured_equals_eager_images_with_guidance_and_jacobi(monkeypatch):
    """... and with a draft model the captured steps are queued ahead (host-free drafter)."""
    host_free = _record_host_free(monkeypatch)
    pipe = _token_span_pipe()
    for method in ("plain", "exact", "sjd-maximal"):
        kw = dict(guidance_scale=2.0, temperature=0, progress=False, seed=0, method=method)
        host_free.clear()
        a = pipe([[3, 4, 5], [6]], **kw)
        b = pipe([[3, 4, 5], [6]], **fast(), **kw)
        assert torch.equal(a.tokens, b.tokens), method
        assert host_free == ([False, True] if method == "exact" else []), method


def test_captured_trees_and_heads_equal_eager():
    """A draft model's trees and a head's trees (and chains), with guidance, through captured
    steps (one graph per tree width): plain greedy's tokens."""
    from mmspec.drafters import DraftHead

    pipe = _token_span_pipe()
    torch.manual_seed(3)
    pipe.head = DraftHead.for_target(pipe.target.model)
    kw = dict(guidance_scale=2.0, temperature=0, progress=False, seed=0)
    plain = pipe([[3, 4, 5], [6]], method="plain", **kw)
    for method, params in (("tree", {}), ("head", {}),
                           ("head", dict(tree_branch=1, tree_width=1, tree_depth=3))):
        eager = pipe([[3, 4, 5], [6]], method=method, **params, **kw)
        cap = pipe([[3, 4, 5], [6]], method=method, **fast(), **params, **kw)
        assert torch.equal(eager.tokens, plain.tokens), (method, params)
        assert torch.equal(cap.tokens, plain.tokens), (method, params)


@pytest.mark.parametrize("fuse", ["graphs", True])
def test_captured_head_trees_on_a_recurrent_target_give_plain_greedy(fuse):
    """A head's trees on Qwen3.5 (linear attention) under captured steps: each tree verified
    as its paths on the static cache's rows repeated, the head's steps captured; plain
    greedy's tokens, twice (the second call reuses the first one's cache and graphs)."""
    from mmspec.drafters import DraftHead, FeatureDrafter
    from conftest import qwen35_prompt as _prompt, tiny_qwen35

    dev = torch.device("cuda")
    target = tiny_qwen35(vocab=8).to(dev)
    ids, mask = (t.to(dev) for t in _prompt())
    ids = ids % 8
    kw = dict(attention_mask=mask, temperature=0, max_new_tokens=16, stop_token_ids=[])
    plain = mmspec.generate(target, None, ids, **kw).sequences.tolist()
    torch.manual_seed(5)
    head = DraftHead.for_target(target).to(dev)
    for _ in range(2):
        drafter = FeatureDrafter(head, depth=3, branch=2, width=2)
        out = mmspec.generate(target, input_ids=ids, drafter=drafter, **fast(fuse), **kw)
        assert out.sequences.tolist() == plain
        assert drafter.trees and out.stats.accepted > 0
    mmspec.release_graphs()


@pytest.mark.parametrize("fuse", ["graphs", True, "inductor"])
def test_fused_capture_equals_eager(fuse):
    dev = torch.device("cuda")
    t = tiny_llama(vocab=64, hidden=64, layers=2).to(dev)
    d = tiny_llama(vocab=64, hidden=32, layers=1, seed=1).to(dev)
    ids = torch.tensor([[1, 2, 3, 4, 5], [0, 0, 7, 8, 9]], device=dev)
    mask = (ids != 0).long()
    kw = dict(attention_mask=mask, temperature=0, max_new_tokens=16, num_draft_tokens=3)
    eager = mmspec.generate(t, d, ids, **kw)
    modules = [type(m) for m in t.modules()]
    fused = mmspec.generate(t, d, ids, **fast(fuse), **kw)
    assert torch.equal(eager.sequences, fused.sequences)
    assert [type(m) for m in t.modules()] == modules         # the user's modules are back
    plain = mmspec.generate(t, None, ids, **fast(fuse), **{**kw, "num_draft_tokens": 0})
    assert torch.equal(eager.sequences, plain.sequences)
    # compile=True lays each layer's projections out back to back (mmspec.engine.grouping)
    assert grouping.back_to_back(t) == (fuse is True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_row_product_kernel_matches_linear(dtype):
    """``gemv``'s kernel on the 7B Llama's one-row shapes (q/k/v span and gated gate/up, each
    with and without the RMSNorm before it; o and down with a residual, the output head; a
    bias; row and K tails) against ``F.linear`` in float64, within the dtype's rounding; the
    same bits on a second call (no atomics)."""
    from mmspec.kernels import gemv

    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    for n, k, bias, res, gated, norm in [(12288, 4096, False, False, False, False),
                                         (12288, 4096, False, False, False, True),
                                         (22016, 4096, False, False, True, False),
                                         (22016, 4096, False, False, True, True),
                                         (4096, 4096, False, True, False, False),
                                         (4096, 11008, False, True, False, False),
                                         (32000, 4096, True, False, False, False),
                                         (1000, 1000, True, True, True, True)]:
        x = (3 * torch.randn(1, 1, k, device=dev, generator=g)).to(dtype)
        w = (torch.randn(n, k, device=dev, generator=g) / k ** 0.5).to(dtype)
        b = torch.randn(n, device=dev, generator=g).to(dtype) if bias else None
        m = n // 2 if gated else n
        r = torch.randn(1, 1, m, device=dev, generator=g).to(dtype) if res else None
        nw = (torch.rand(k, device=dev, generator=g) + 0.5).to(dtype) if norm else None
        args = (x, w, b, r, gated, nw, 1e-5)
        y = torch.ops.mmspec.row_product(*args)
        d = lambda t: None if t is None else t.double()           # noqa: E731
        ref = gemv._reference(x.double(), w.double(), d(b), d(r), gated, d(nw), 1e-5)
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        assert y.dtype == dtype and y.shape == ref.shape
        err = (y.double() - ref).abs().max().item()
        assert err <= tol * ref.abs().max().item(), (n, k, norm, err)
        assert torch.equal(y, torch.ops.mmspec.row_product(*args))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_qkv_rope_kernel_matches_the_unfused_layers(dtype):
    """``qkv_rope``'s kernel on the 7B Llama's q/k/v span (32 heads of 128; with and without
    the RMSNorm) and a grouped-query one with a bias (28 heads on 4) against the unfused
    layers in float64, within the dtype's rounding: q rotated, k rotated and v in the cache
    at the slot, the other slots untouched; the same bits on a second call."""
    from mmspec.kernels import qkv_rope

    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    for nq, nk, d, bias, norm in [(4096, 4096, 128, False, False), (4096, 4096, 128, False, True),
                                  (3584, 512, 128, True, True)]:
        k = 4096 if nq == 4096 else 3584
        x = (3 * torch.randn(1, 1, k, device=dev, generator=g)).to(dtype)
        w = (torch.randn(nq + 2 * nk, k, device=dev, generator=g) / k ** 0.5).to(dtype)
        b = torch.randn(nq + 2 * nk, device=dev, generator=g).to(dtype) if bias else None
        nw = (torch.rand(k, device=dev, generator=g) + 0.5).to(dtype) if norm else None
        angle = torch.rand(d // 2, device=dev, generator=g) * 6.3
        cos, sin = torch.cat([angle.cos()] * 2).to(dtype), torch.cat([angle.sin()] * 2).to(dtype)
        cache = [torch.randn(1, nk // d, 64, d, device=dev, generator=g).to(dtype) for _ in "kv"]
        pos = torch.tensor([37], device=dev)
        want = [t.double() for t in cache]
        dd = lambda t: None if t is None else t.double()           # noqa: E731
        ref = qkv_rope._reference(x.double(), w.double(), dd(b), dd(nw), 1e-5, cos.double(),
                                  sin.double(), *want, pos, nq, d)
        outs = []
        for _ in range(2):
            got = [t.clone() for t in cache]
            outs.append((torch.ops.mmspec.qkv_rope(x, w, b, nw, 1e-5, cos, sin, *got, pos, nq,
                                                   d), got))
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        (y, (keys, values)), (y2, (keys2, values2)) = outs
        for a, r in ((y, ref), (keys, want[0]), (values, want[1])):
            assert a.dtype == dtype and a.shape == r.shape
            assert (a.double() - r).abs().max().item() <= tol * r.abs().max().item(), (nq, norm)
        assert torch.equal(y, y2) and torch.equal(keys, keys2) and torch.equal(values, values2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_attention_kernel_matches_sdpa(dtype):
    """``decode_attention``'s kernels on the 7B Llama's step shapes (32 heads of 128; one
    query and five; 128, 256 and 700 slots read of 1,024: one split and several) and a
    grouped-query shape (28 heads on 4) against the reference in float64, within the dtype's
    rounding; ``applies`` says yes to them; the same bits on a second call."""
    from conftest import attention_inputs as _inputs

    from mmspec.kernels import decode_attention as da

    for b, h, hkv, n, d, w in [(1, 32, 32, 1, 128, 128), (1, 32, 32, 5, 128, 256),
                               (2, 32, 32, 1, 128, 700), (16, 28, 4, 5, 128, 300)]:
        q, k, v, mask = _inputs(b, h, hkv, n, d, 1024, w, True, dtype=dtype, device="cuda")
        assert da.applies(q, k, v, mask, {"dropout": 0.0, "scaling": d ** -0.5})
        y = torch.ops.mmspec.decode_attention(q, k, v, mask, d ** -0.5)
        ref = da.reference(*(t.double() for t in (q, k, v, mask)), d ** -0.5)
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        assert y.dtype == dtype and y.shape == ref.shape == (b, n, h, d)
        err = (y.double() - ref).abs().max().item()
        assert err <= tol * ref.abs().max().item(), (b, h, hkv, n, w, err)
        assert torch.equal(y, torch.ops.mmspec.decode_attention(q, k, v, mask, d ** -0.5))


@pytest.mark.parametrize("k", [0, 4])
def test_one_row_steps_run_the_row_kernel_and_give_plain_greedy(k, monkeypatch):
    """At batch 1 ``compile=True`` runs q/k/v (with the RMSNorm before it, the rotary
    embedding and the cache writes after: ``qkv_rope``) and the gated MLP (with its RMSNorm),
    o and down (with their residual adds) and the output head through ``gemv``'s kernel, and
    attention through ``decode_attention``'s: the tokens are eager plain greedy's (float32),
    speculative or not."""
    from mmspec.kernels import decode_attention, gemv, qkv_rope

    calls, attention, rope = [], [], []
    launch, attend, rotary = gemv.launch, decode_attention.launch, qkv_rope.launch
    monkeypatch.setattr(gemv, "launch", lambda *a, **kw: calls.append(
        (a[3] is not None, a[4], kw.get("norm") is not None)) or launch(*a, **kw))
    monkeypatch.setattr(qkv_rope, "launch", lambda *a, **kw: rope.append(
        a[3] is not None) or rotary(*a, **kw))
    monkeypatch.setattr(decode_attention, "launch", lambda q, *a, **kw: attention.append(
        q.shape[2]) or attend(q, *a, **kw))
    torch._dynamo.reset()
    dev = torch.device("cuda")
    t = tiny_llama(vocab=64, hidden=64, layers=2).to(dev)
    d = tiny_llama(vocab=64, hidden=32, layers=1, seed=1).to(dev) if k else None
    ids = torch.tensor([[1, 2, 3, 4, 5]], device=dev)
    kw = dict(temperature=0, max_new_tokens=24)
    plain = mmspec.generate(t, None, ids, **kw)
    fused = mmspec.generate(t, d, ids, **fast(), num_draft_tokens=k, **kw)
    assert torch.equal(plain.sequences, fused.sequences)
    assert {(False, True, True), (True, False, False), (False, False, False)} <= set(calls)
    assert rope and all(rope)                 # every q/k/v row: norm, rotary, cache writes
    assert {1, k + 1} <= set(attention)       # plain and draft steps, the verification
    torch._dynamo.reset()


def test_captured_steps_are_reused_by_the_next_call():
    import gc

    from mmspec.engine.capture import KEPT

    dev = torch.device("cuda")
    t = tiny_llama(vocab=64, hidden=64, layers=2).to(dev)
    d = tiny_llama(vocab=64, hidden=32, layers=1, seed=1).to(dev)
    kw = dict(temperature=0, max_new_tokens=24, num_draft_tokens=3)
    a = torch.tensor([[3, 4, 5], [6, 7, 8]], device=dev)
    b = torch.tensor([[9, 3, 1], [2, 2, 5]], device=dev)
    mmspec.release_graphs()
    first = mmspec.generate(t, d, a, **fast(), **kw)
    gc.collect()
    (key, (entry,)), = KEPT[t].items()
    graphs = dict(entry.graphs)
    second = mmspec.generate(t, d, b, **fast(), **kw)
    gc.collect()
    assert KEPT[t][key] == [entry]
    # no step captured again; the prompt pass is, once the cache's slots are allocated
    assert {k for k in entry.graphs if k[0] != "prompt"} == graphs.keys()
    assert all(entry.graphs[k] is graphs[k] for k in graphs)
    assert torch.equal(first.sequences, mmspec.generate(t, d, a, **kw).sequences)
    assert torch.equal(second.sequences, mmspec.generate(t, d, b, **kw).sequences)
    mmspec.release_graphs()


def test_captured_steps_compute_the_calls_own_distributions():
    """Captured steps compute their distributions inside their graphs
    (``captures_processing``), keyed by the call's processing: sessions on one reused static
    cache at temperature 1, 0.5 and 1 again each return the eager session's probabilities at
    their own temperature (float32), from one graph per temperature; a step's result is its
    own (the next step leaves it as it was)."""
    import gc

    from mmspec.engine.capture import KEPT

    dev = torch.device("cuda")
    t = tiny_llama(vocab=64, hidden=64, layers=2).to(dev)
    ids = torch.tensor([[3, 4, 5, 6]], device=dev)
    mmspec.release_graphs()
    for temperature in (1.0, 0.5, 1.0):
        got = []
        for compile in (False, True):
            with torch.inference_mode():               # as generate runs sessions
                p, kept = _two_steps(t, ids, temperature, compile)
            assert torch.equal(p, kept)
            got.append(p)
            gc.collect()
        torch.testing.assert_close(got[1], got[0], atol=1e-5, rtol=1e-4)
    (entry,), = (v for k, v in KEPT[t].items() if k[2] != "static")      # **fast(True)'s
    assert len({k[3] for k in entry.graphs if k[0] == "step"}) == 2
    mmspec.release_graphs()


def _two_steps(t, ids, temperature, compile):
    """A session's first step's distributions after a second step, and a copy taken
    before it."""
    from mmspec.sessions import CausalLMSession

    s = CausalLMSession(t, mmspec.SamplingParams(temperature=temperature), static_len=64,
                        **(fast(compile) if compile else {}))
    s.prefill(ids, torch.ones_like(ids))
    assert s.captures_processing
    p = s.step(ids[:, -1:])
    kept = p.clone()
    s.step(ids[:, -2:-1])
    return p, kept


def test_compiled_prompt_passes_on_a_reused_cache():
    """compile=True: a reused static cache's prompt passes run the layers compiled with the
    prompt's length dynamic: the second call traces them once, the third (another length)
    traces nothing; tokens equal eager plain greedy."""
    from torch._dynamo.utils import counters

    dev = torch.device("cuda")
    t = tiny_llama(vocab=64, hidden=64, layers=2).to(dev)
    kw = dict(temperature=0, max_new_tokens=12)
    prompts = [torch.tensor([[0, 0, 3, 4, 5], [2, 1, 2, 3, 4]], device=dev),
               torch.tensor([[5, 6, 7, 8, 9, 1, 2, 3, 4]] * 2, device=dev),
               torch.tensor([[0] * 6 + list(range(2, 10)), list(range(3, 17))], device=dev)]
    mmspec.release_graphs()
    torch._dynamo.reset()              # traces kept from other tests' models of the same code
    traced = []
    for ids in prompts:
        mask = (ids != 0).long()
        eager = mmspec.generate(t, None, ids, attention_mask=mask, **kw)
        fused = mmspec.generate(t, None, ids, attention_mask=mask, **fast(), **kw)
        assert torch.equal(eager.sequences, fused.sequences)
        traced.append(counters["stats"]["unique_graphs"])
    assert traced[1] > traced[0] and traced[2] == traced[1]
    mmspec.release_graphs()


@pytest.mark.parametrize("fuse", ["graphs", True])
def test_prompt_passes_are_captured_on_a_reused_cache(fuse):
    """Captured steps replay a reused cache's prompt passes from one graph per prompt shape
    (the cache's first pass, which allocates its slots, runs uncaptured), at most
    ``captured_prompts`` shapes per cache (later ones run uncaptured); tokens equal eager
    plain greedy, padded rows included."""
    import gc

    from mmspec.engine.capture import KEPT

    dev = torch.device("cuda")
    t = tiny_llama(vocab=64, hidden=64, layers=2).to(dev)
    kw = dict(temperature=0, max_new_tokens=12)
    a = torch.tensor([[0, 0, 3, 4, 5], [2, 1, 2, 3, 4]], device=dev)
    b = torch.tensor([[0, 9, 3, 1, 7], [2, 2, 5, 6, 1]], device=dev)
    c = torch.tensor([[5, 6, 7, 8, 9, 1, 2, 3, 4]] * 2, device=dev)     # the same cache

    def prompt_graphs():
        gc.collect()
        return {k: v[0] for entries in KEPT[t].values() for e in entries
                for k, v in e.graphs.items() if k[0] == "prompt"}

    mmspec.release_graphs()
    seen = []
    for ids in (a, b, a, c):
        mask = (ids != 0).long()
        out = mmspec.generate(t, None, ids, attention_mask=mask,
                              **fast(fuse, captured_prompts=1), **kw)
        assert torch.equal(out.sequences,
                           mmspec.generate(t, None, ids, attention_mask=mask, **kw).sequences)
        seen.append(prompt_graphs())
    assert [len(g) for g in seen] == [0, 1, 1, 1]
    assert seen[2] == seen[1]                            # replayed, not captured again
    mask = (c != 0).long()          # room for more: the same cache captures it
    out = mmspec.generate(t, None, c, attention_mask=mask, **fast(fuse, captured_prompts=8), **kw)
    assert len(prompt_graphs()) == 2
    assert torch.equal(out.sequences,
                       mmspec.generate(t, None, c, attention_mask=mask, **kw).sequences)
    mmspec.release_graphs()


@pytest.mark.parametrize("fuse", ["graphs", True])
def test_captured_greedy_draft_chains_are_one_graph(fuse):
    """Captured greedy drafts: the K steps after the first are one graph per first width
    (``CausalLMSession.chain``), queued or synchronised; tokens equal eager plain greedy;
    sampled drafts are chains too, and step one graph at a time without ``sampled_chains``."""
    import gc

    from mmspec.engine.capture import KEPT

    dev = torch.device("cuda")
    t = tiny_llama(vocab=64, hidden=64, layers=2).to(dev)
    d = tiny_llama(vocab=64, hidden=32, layers=1, seed=1).to(dev)
    ids = torch.tensor([[0, 0, 3, 4, 5], [2, 1, 2, 3, 4]], device=dev)
    mask = (ids != 0).long()
    kw = dict(attention_mask=mask, max_new_tokens=20, num_draft_tokens=3)
    plain = mmspec.generate(t, None, ids, temperature=0, **{**kw, "num_draft_tokens": 0})

    def chains():
        gc.collect()
        return [k for entries in KEPT.get(d, {}).values() for e in entries
                for k in e.graphs if k[0] == "chain"]

    for pipeline in (None, False):
        mmspec.release_graphs()
        out = mmspec.generate(t, d, ids, temperature=0, **fast(fuse, pipeline=pipeline), **kw)
        assert torch.equal(out.sequences, plain.sequences)
        assert chains()
    for sampled in (True, False):
        mmspec.release_graphs()
        mmspec.generate(t, d, ids, temperature=1.0, seed=0, **fast(fuse, sampled_chains=sampled),
                        **kw)
        assert bool(chains()) == sampled
    mmspec.release_graphs()


def test_captured_sampled_draft_chains_draw_what_the_eager_steps_draw():
    """Sampled chains as graphs (``Engine.sampled_chains``): the call's generator is
    followed through the graph's own, so at temperature 1 with a seed a call draws exactly
    what stepping one graph at a time draws, on the call that captures and on the next
    (replays); the chain graphs exist."""
    import gc

    from mmspec.engine.capture import KEPT

    dev = torch.device("cuda")
    t = tiny_llama(vocab=64, hidden=64, layers=2).to(dev)
    d = tiny_llama(vocab=64, hidden=32, layers=1, seed=1).to(dev)
    ids = torch.tensor([[0, 0, 3, 4, 5], [2, 1, 2, 3, 4]], device=dev)
    kw = dict(attention_mask=(ids != 0).long(), max_new_tokens=24, num_draft_tokens=3,
              temperature=1.0)
    stepped = [mmspec.generate(t, d, ids, seed=s, **fast(sampled_chains=False), **kw).sequences
               for s in (0, 1)]
    mmspec.release_graphs()
    for s in (0, 1, 0):
        got = mmspec.generate(t, d, ids, seed=s, **fast(), **kw).sequences
        assert torch.equal(got, stepped[s]), s
    gc.collect()
    assert any(k[0] == "chain" for entries in KEPT.get(d, {}).values() for e in entries
               for k in e.graphs)
    mmspec.release_graphs()


def test_captured_speculative_decoding_is_pipelined_by_default():
    """compile=True queues speculative steps ahead (caches sized for K + 1 slots per step);
    pipeline=False, profile=True and "inductor" keep them synchronised."""
    from mmspec.engine import static_length
    from mmspec.engine.capture import KEPT

    dev = torch.device("cuda")
    t = tiny_llama(vocab=64, hidden=64, layers=2).to(dev)
    d = tiny_llama(vocab=64, hidden=32, layers=1, seed=1).to(dev)
    ids = torch.tensor([[1, 2, 3, 4, 5]], device=dev)
    kw = dict(temperature=0, max_new_tokens=100, num_draft_tokens=4)
    holes, tight = (static_length(5, 1, 100, 4, h) for h in (True, False))
    assert holes > tight
    for extra, want in ((dict(), holes), (dict(pipeline=False), tight),
                        (dict(profile=True), tight)):
        mmspec.release_graphs()
        mmspec.generate(t, d, ids, **kw, **fast(True, **extra))
        assert [key[1] for key in KEPT[t]] == [want], extra
    mmspec.release_graphs()


def test_greedy_steps_settle_in_one_compiled_function():
    """Under captured steps a greedy call's acceptance, stops, budgets and transfer run as
    one compiled function (``loop.settler``), made once per process; same tokens as eager,
    rows ending on a stop token included, and as with ``Engine.fused_settle`` off."""
    from mmspec.acceptance import Greedy
    from mmspec.loop import _SETTLERS

    dev = torch.device("cuda")
    t = tiny_llama(vocab=64, hidden=64, layers=2).to(dev)
    d = tiny_llama(vocab=64, hidden=32, layers=1, seed=1).to(dev)
    ids = torch.tensor([[0, 3, 4, 5], [2, 1, 2, 3], [0, 0, 7, 8]], device=dev)
    mask = (ids != 0).long()
    mask[1] = 1
    plain = mmspec.generate(t, None, ids, attention_mask=mask, temperature=0, max_new_tokens=30)
    stop = int(plain.sequences[0, 4 + 6])                 # row 0 stops after 7 new tokens
    kw = dict(attention_mask=mask, temperature=0, max_new_tokens=30, stop_token_ids=[stop],
              seed=0)                           # a generator the fused function never sees
    for k, draft in ((0, None), (3, d)):
        want = mmspec.generate(t, draft, ids, num_draft_tokens=k, **kw)
        fused = mmspec.generate(t, draft, ids, num_draft_tokens=k, **fast(), **kw)
        assert torch.equal(fused.sequences, want.sequences), k
        unfused = mmspec.generate(t, draft, ids, num_draft_tokens=k,
                                  **fast(fused_settle=False), **kw)
        assert torch.equal(unfused.sequences, want.sequences), k
    assert any(isinstance(key[0], Greedy) for key in _SETTLERS)
    mmspec.release_graphs()


@pytest.mark.parametrize("kind", ["qwen2-vl", "qwen3-vl", "qwen3.5"])
def test_captured_qwen_vl_equals_eager(kind):
    """Qwen-VL with compile=True: the eager tokens; a second call with other images (other
    rope deltas) replays the steps captured in the first, reading its own deltas."""
    from modalities.vlm import VisionLanguageGenerator
    from tiny_vlm import qwen_pairs as _pairs
    from tiny_vlm import tiny_qwen_processor, tiny_qwen_vl

    dev = torch.device("cuda")
    target, proc = tiny_qwen_vl(kind).to(dev), tiny_qwen_processor(kind)
    g = VisionLanguageGenerator(target, proc, tiny_qwen_vl(kind, seed=1, layers=1).to(dev),
                                "image")
    ims, msgs = _pairs()
    kw = dict(temperature=0, max_new_tokens=16, seed=0)
    for rows in ([0, 1], [1, 2], [2, 1]):        # [2, 1]: [1, 2]'s shapes, swapped deltas
        a, m = [ims[i] for i in rows], [msgs[i] for i in rows]
        for method in ("plain", "exact", "sjd"):
            eager = g.generate(a, m, method=method, **kw).token_ids
            assert g.generate(a, m, method=method, **fast(), **kw).token_ids == eager, \
                (rows, method)
    mmspec.release_graphs()


def test_captured_vlm_equals_eager(monkeypatch):
    """VisionLanguageGenerator(compile=True) for every draft kind, Jacobi and plain decoding:
    the eager tokens; text and image drafts are queued ahead (host-free), the ensemble not,
    and draft their K tokens as one captured chain (through the padded draft session)."""
    import gc

    from mmspec.engine.capture import KEPT
    from modalities.vlm import VisionLanguageGenerator
    from tiny_vlm import images, tiny_llava, tiny_processor, tiny_text_lm

    host_free = _record_host_free(monkeypatch)
    dev = torch.device("cuda")
    target, proc = tiny_llava().to(dev), tiny_processor()
    ims = images(2)
    prompts = ["USER: <image> what colour is the circle ? ASSISTANT:", "USER: <image> a ASSISTANT:"]
    kw = dict(temperature=0, max_new_tokens=20, seed=0)
    g = VisionLanguageGenerator(target, proc)
    for method in ("plain", "sjd"):
        assert (g.generate(ims, prompts, method=method, **fast(), **kw).token_ids
                == g.generate(ims, prompts, method=method, **kw).token_ids), method
    for draft, mode in ((tiny_text_lm().to(dev), "text"), (tiny_llava(seed=1, hidden=16, layers=1).to(dev), "image"),
                        (target, "image"), (tiny_llava(seed=1, hidden=16, layers=1).to(dev), "ensemble")):
        g = VisionLanguageGenerator(target, proc, draft, mode)
        for k in (1, 4):
            eager = g.generate(ims, prompts, method="exact", num_draft_tokens=k, **kw)
            host_free.clear()
            cap = g.generate(ims, prompts, method="exact", num_draft_tokens=k, **fast(), **kw)
            assert cap.token_ids == eager.token_ids, (mode, k)
            assert cap.stats.steps == eager.stats.steps, (mode, k)
            assert host_free[-1] == (mode != "ensemble"), (mode, host_free)
        gc.collect()
        chains = [key for entries in KEPT.get(draft, {}).values() for e in entries
                  for key in e.graphs if key[0] == "chain"]
        assert bool(chains) == (mode != "ensemble"), mode
    mmspec.release_graphs()


def test_captured_speech_equals_eager():
    """TextToSpeech(compile=True): single-codebook targets with guidance and a draft model,
    and CSM (captured backbone, eager depth decoder): the eager codes."""
    from modalities.speech import SingleCodebookAdapter, TextToSpeech
    from modalities.speech.csm import CsmAdapter
    from tiny_speech import TEXTS, ToyCodec, single_codebook as _single
    from tiny_csm import tiny_csm

    dev = torch.device("cuda")
    mk = lambda m: SingleCodebookAdapter(m.to(dev), ToyCodec(), range(20, 36), end_id=36,  # noqa: E731
                                         prefix=[1], suffix=[2], max_frames=16)
    tts = TextToSpeech(mk(_single()), mk(_single(seed=1, hidden=16)))
    for method in ("plain", "exact", "sjd"):
        for g in (None, 2.0):
            kw = dict(method=method, temperature=0, progress=False, guidance_scale=g, decode=False)
            a, b = tts(TEXTS, **kw), tts(TEXTS, **fast(), **kw)
            assert all(torch.equal(x, y) for x, y in zip(a.codes, b.codes)), (method, g)
    target, draft = tiny_csm(scale=3.0).to(dev), tiny_csm(scale=3.0, seed=1).to(dev)
    tts = TextToSpeech(CsmAdapter(target, max_frames=10), CsmAdapter(draft, max_frames=10))
    for method in ("plain", "exact"):
        kw = dict(method=method, temperature=0, progress=False, decode=False, num_draft_tokens=3)
        if method == "plain":
            kw.pop("num_draft_tokens")
        a, b = tts([[4, 5, 6, 7, 8], [9, 10]], **kw), tts([[4, 5, 6, 7, 8], [9, 10]], **fast(), **kw)
        assert all(torch.equal(x, y) for x, y in zip(a.codes, b.codes)), method
    mmspec.release_graphs()


def test_captured_depth_head_equals_eager():
    """A depth head on CSM under compile=True (the head's session and the backbone captured,
    the depth decoder eager): the eager codes, chains of 1 and 3 frames."""
    from modalities.speech import TextToSpeech
    from modalities.speech.csm import CsmAdapter
    from tiny_csm import tiny_csm

    from mmspec.drafters import DepthHead

    target = tiny_csm(scale=3.0).to("cuda")
    torch.manual_seed(0)
    tts = TextToSpeech(CsmAdapter(target, max_frames=10), head=DepthHead.for_target(target))
    for depth in (1, 3):
        kw = dict(method="head", tree_depth=depth, temperature=0, progress=False, decode=False)
        a, b = tts([[4, 5, 6, 7, 8], [9, 10]], **kw), tts([[4, 5, 6, 7, 8], [9, 10]],
                                                          **fast(True), **kw)
        assert all(torch.equal(x, y) for x, y in zip(a.codes, b.codes)), depth
        assert b.stats.drafted > 0
    mmspec.release_graphs()


def test_recipes_compile_on_the_gpu(tmp_path):
    """recipes.text_to_image --device cuda --compile on a tiny bundled-format pair: the
    pipeline moves to the GPU and its captured steps give the eager tokens (greedy, float32)."""
    from recipes.text_to_image import main
    from tiny_image import save_tiny_bundled_pair

    paths = save_tiny_bundled_pair(str(tmp_path))
    common = ["--model", paths[0], "--draft", paths[1], "--prompt", "a large red circle",
              "--temperature", "0", "--method", "exact", "--no-progress", "--device", "cuda"]
    eager = main(common + ["--out", str(tmp_path / "e")])
    captured = main(common + ["--compile", "--out", str(tmp_path / "c")])
    assert eager["identical"] and captured["identical"]
    assert captured["tokens"] == eager["tokens"]
    mmspec.release_graphs()


@pytest.mark.parametrize("method", ["draft", "jacobi", "plain"])
def test_captured_sliding_window_layers_give_the_models_own_tokens(method):
    """A Gemma 3 text model of 4-slot sliding windows beside full layers, 20 tokens past
    ragged prompts of 7 and 3, captured: each row's tokens are the model's own ``generate``
    (the static mask carries the window counted in positions, replayed step after step)."""
    from conftest import tiny_windowed

    windowed = lambda seed, layers: tiny_windowed(seed, layers, hidden=64).cuda()  # noqa: E731
    dev = torch.device("cuda")
    target = windowed(0, 2)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 64, (1, n), generator=g).to(dev) for n in (7, 3)]
    own = [target.generate(p, do_sample=False, max_new_tokens=20, pad_token_id=0)[0, p.shape[1]:]
           .tolist() for p in prompts]
    ids = torch.zeros(2, 7, dtype=torch.long, device=dev)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, 7 - p.shape[1]:], mask[i, 7 - p.shape[1]:] = p[0], 1
    drafter = dict(draft=dict(draft=windowed(1, 1)), jacobi=dict(drafter=mmspec.Jacobi(4)),
                   plain={})[method]
    out = mmspec.generate(target, input_ids=ids, attention_mask=mask, max_new_tokens=20,
                          temperature=0, **fast(), stop_token_ids=[], **drafter)
    assert out.sequences[:, 7:].tolist() == own
    mmspec.release_graphs()


@pytest.mark.parametrize("kind", ["gemma3", "paligemma2"])
def test_captured_gemma_vlms_equal_eager(kind):
    """Gemma 3 (bidirectional image blocks in the prompt, sliding windows after it) and
    PaliGemma 2 (its decoder called alone; a prefix longer than its window, the first step
    refeeding a token inside it) with compile=True: the eager tokens, for plain, image-draft
    and Jacobi decoding."""
    from functools import partial

    from modalities.vlm import VisionLanguageGenerator
    from tiny_vlm import (images, tiny_gemma3, tiny_gemma3_processor, tiny_paligemma,
                          tiny_paligemma_processor)

    dev = torch.device("cuda")
    build, proc = dict(gemma3=(tiny_gemma3, tiny_gemma3_processor()),
                       paligemma2=(partial(tiny_paligemma, window=4),
                                   tiny_paligemma_processor()))[kind]
    target = build().to(dev)
    g = VisionLanguageGenerator(target, proc, build(seed=1, layers=1).to(dev), "image")
    msgs = [[{"role": "user", "content": [{"type": "image"},
                                          {"type": "text", "text": "what colour is the circle ?"}]}],
            [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "a"}]}]]
    kw = dict(temperature=0, max_new_tokens=16, seed=0)
    for method in ("plain", "exact", "sjd"):
        eager = g.generate(images(2), msgs, method=method, **kw).token_ids
        assert g.generate(images(2), msgs, method=method, **fast(), **kw).token_ids == eager, \
            method
    mmspec.release_graphs()


@pytest.mark.parametrize("kind", ["llava", "qwen2-vl", "qwen3-vl"])
def test_captured_prompts_that_end_on_the_image_equal_eager(kind):
    """A prompt ending on its image placeholder beside one ending on text, compile=True: the
    eager tokens (the first step feeds the last column's merged embedding, or Qwen3-VL's
    trailing encoder outputs uncaptured; later steps replay), plain, draft and Jacobi."""
    from modalities.vlm import VisionLanguageGenerator
    from tiny_vlm import image_last_case

    dev = torch.device("cuda")
    target, draft, proc, ims, prompts = image_last_case(kind)
    g = VisionLanguageGenerator(target.to(dev), proc, draft.to(dev), "image")
    kw = dict(temperature=0, max_new_tokens=12, seed=0)
    for method in ("plain", "exact", "sjd"):
        eager = g.generate(ims, prompts, method=method, **kw).token_ids
        assert g.generate(ims, prompts, method=method, **fast(), **kw).token_ids == eager, \
            method
    mmspec.release_graphs()
