"""End to end on tiny Llama pairs: greedy equality, sampling distribution, streaming."""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np
import pytest
import torch

import mmspec
from mmspec.acceptance import Exact
from conftest import tiny_llama, tiny_windowed
from stats_util import (chi_square_pvalue, continuation_distribution as _continuation_distribution,
                        tv, tv_threshold)


@pytest.mark.parametrize("k", [1, 3, 8])
def test_speculative_greedy_equals_plain_greedy(pair, ragged_prompts, k):
    target, draft = pair
    ids, mask = ragged_prompts
    plain = mmspec.generate(target, None, ids, attention_mask=mask, temperature=0,
                            max_new_tokens=24)
    spec = mmspec.generate(target, draft, ids, attention_mask=mask, temperature=0,
                           max_new_tokens=24, num_draft_tokens=k)
    assert torch.equal(spec.sequences, plain.sequences)
    assert spec.stats.row_steps <= plain.stats.row_steps - spec.stats.accepted + 3 * k
    assert plain.stats.steps == 24


def test_k_follows_the_row_with_the_most_budget_left(ragged_prompts, monkeypatch):
    """Rows advance at their own pace. Where the models' positions have room for K past the
    budget, a step drafts what the row with the most budget left can use (rows nearer their
    end draft past it, what they emit there dropped); where they have none, the row nearest
    its end sets K. Plain greedy's tokens either way, and no more steps with the room."""
    from mmspec.loop import Loop

    ids, mask = ragged_prompts
    n, k = 24, 4
    seen, k_max = [], Loop.k_max

    def spy(self, produced, finished):
        left = [n - p for p, f in zip(produced, finished) if not f]
        seen[-1].append((k_max(self, produced, finished), min(left) - 1, max(left) - 1))
        return seen[-1][-1][0]

    monkeypatch.setattr(Loop, "k_max", spy)
    out = {}
    for room in (True, False):
        limit = ids.shape[1] + n + (k if room else 0)
        target = tiny_llama(seed=0, max_positions=limit)
        draft = tiny_llama(hidden=16, layers=1, seed=1, max_positions=limit)
        plain = mmspec.generate(target, None, ids, attention_mask=mask, temperature=0,
                                max_new_tokens=n)
        seen.append([])
        out[room] = mmspec.generate(target, draft, ids, attention_mask=mask, temperature=0,
                                    max_new_tokens=n, num_draft_tokens=k)
        assert torch.equal(out[room].sequences, plain.sequences)
        assert any(lo != hi for _, lo, hi in seen[-1])         # the rows drifted apart
        assert all(got == (hi if room else lo) for got, lo, hi in seen[-1])
    assert out[True].stats.steps <= out[False].stats.steps


def test_tokens_per_step_count_what_the_rows_keep(pair, ragged_prompts):
    """The target drafting for itself accepts every draft: 9 tokens in the first step. Its
    greedy rows stop at id 11 after 4 and 2 tokens and the third runs to its budget of 10,
    so the rows keep 4, 2 and 9, then 1. Stats count the kept tokens."""
    target, _ = pair
    ids, mask = ragged_prompts
    plain = mmspec.generate(target, None, ids, attention_mask=mask, temperature=0,
                            max_new_tokens=10, stop_token_ids=[11])
    out = mmspec.generate(target, target, ids, attention_mask=mask, temperature=0,
                          max_new_tokens=10, num_draft_tokens=8, stop_token_ids=[11])
    assert torch.equal(out.sequences, plain.sequences)
    kept = [int((row != 0).sum()) for row in plain.sequences[:, ids.shape[1]:]]
    assert kept == [4, 2, 10]
    assert out.stats.accepted == 3 * 8 and out.stats.row_steps == 4
    assert out.stats.emitted == sum(kept) and out.stats.tokens_per_step == 4.0


def _static_widths(target, draft, ragged_prompts, monkeypatch, check=lambda: None) -> list:
    """Generate with a static and a dynamic cache (the same tokens asserted); the static
    steps' (mask width, cache slots), ``check`` run inside every step."""
    from mmspec.cache import StaticSequenceMask

    widths = []
    advance = StaticSequenceMask.advance

    def spy(self, valid, width=None, additive=None, tree=None, *args):
        widths.append((width, self.buf.shape[1], additive))
        check()
        return advance(self, valid, width, additive, tree, *args)

    monkeypatch.setattr(StaticSequenceMask, "advance", spy)
    ids, mask = ragged_prompts
    kw = dict(attention_mask=mask, temperature=0, max_new_tokens=100, num_draft_tokens=3)
    dyn = mmspec.generate(target, draft, ids, **kw)
    widths.clear()
    st = mmspec.generate(target, draft, ids, static_cache=True, **kw)
    assert torch.equal(st.sequences, dyn.sequences)
    return widths


def test_static_steps_attend_over_a_bucket_of_the_cache(pair, ragged_prompts, monkeypatch):
    """Static steps of an SDPA model read only a prefix bucket of the cache (mask width < S,
    growing with the length); tokens equal the dynamic cache's; the model's attention setting
    is restored after every step."""
    target, draft = pair
    sdpa = lambda: target.config._attn_implementation == "sdpa"   # noqa: E731
    assert sdpa()
    widths = _static_widths(target, draft, ragged_prompts, monkeypatch,
                            check=lambda: sdpa() or pytest.fail("switched outside the call"))
    used = sorted({w for w, _, _ in widths})
    total = widths[0][1]
    assert used[0] == 64 and used[-1] <= total and len(used) >= 3, (used, total)
    assert sdpa()
    # built once per step as an additive mask (SDPA would convert a bool one in every layer)
    assert {a for w, t, a in widths if w < t} == {torch.float32}


def test_prefix_attention_casts_a_mask_of_another_dtype():
    """The prefix function takes an additive mask of any float dtype (cast to the queries')
    and gives SDPA's result with the same mask as bool."""
    from transformers import AttentionInterface

    from mmspec.engine import attention

    attention._register()
    fn = AttentionInterface()[attention.NAME]
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 3, 8, generator=g) for _ in range(3))
    visible = torch.tensor([True, False, True, True, False, True])[None, None, None].expand(
        1, 1, 3, 6)
    module = torch.nn.Module()
    module.is_causal, module.training = False, False
    keys, values = torch.cat([k, k], 2), torch.cat([v, v], 2)
    ref, _ = fn(module, q, keys, values, visible)
    additive = (~visible).double() * torch.finfo(torch.float64).min
    out, _ = fn(module, q, keys, values, additive)
    torch.testing.assert_close(out, ref)
    short, _ = fn(module, q, keys, values, additive[..., :4])     # the first 4 keys only
    torch.testing.assert_close(short, fn(module, q, keys[:, :, :4], values[:, :, :4],
                                         visible[..., :4])[0])


def test_models_without_sdpa_attend_over_the_whole_static_cache(ragged_prompts, monkeypatch):
    """Eager attention slices its mask to the keys, not the keys to the mask, and adds it to
    its scores: such models get full-width additive masks (no buckets) and the dynamic
    cache's tokens (with bool masks, as before, they did not)."""
    from mmspec.engine.attention import bucket

    assert [bucket(u, 300) for u in (1, 64, 65, 200, 257, 300)] == [64, 64, 128, 256, 300, 300]
    target = tiny_llama(seed=0)
    target.set_attn_implementation("eager")
    draft = tiny_llama(hidden=16, layers=1, seed=1)
    widths = _static_widths(target, draft, ragged_prompts, monkeypatch)
    assert any(w == total for w, total, _ in widths)                   # the eager target
    assert any(w < total for w, total, _ in widths)                    # the SDPA draft buckets
    assert target.config._attn_implementation == "eager"


@pytest.mark.parametrize("k", [1, 4])
def test_static_cache_path_equals_dynamic_path(pair, ragged_prompts, k):
    """The GPU path's static, position-indexed cache run eagerly (rollback moves the write
    pointer): the same tokens as the dynamic cache and as plain greedy, ragged rows."""
    target, draft = pair
    ids, mask = ragged_prompts
    kw = dict(attention_mask=mask, temperature=0, max_new_tokens=24)
    plain = mmspec.generate(target, None, ids, **kw)
    plain_static = mmspec.generate(target, None, ids, static_cache=True, **kw)
    spec = mmspec.generate(target, draft, ids, num_draft_tokens=k, **kw)
    spec_static = mmspec.generate(target, draft, ids, num_draft_tokens=k, static_cache=True, **kw)
    assert torch.equal(plain_static.sequences, plain.sequences)
    assert torch.equal(spec_static.sequences, plain.sequences)
    assert spec_static.stats.accepted == spec.stats.accepted
    assert spec_static.stats.accepted < spec_static.stats.drafted     # rollbacks happened


def test_static_caches_are_reused_across_calls_and_released(pair, ragged_prompts):
    """A second call with the same rows and cache length reuses the first call's static cache
    (reset in place, so captured steps keep their addresses); a target drafting for itself
    holds two at once; tokens stay those of the dynamic path."""
    import gc

    from mmspec.engine.capture import KEPT

    target, draft = pair
    ids, mask = ragged_prompts
    mmspec.release_graphs()
    kw = dict(attention_mask=mask, temperature=0, max_new_tokens=12, num_draft_tokens=3)
    ref = mmspec.generate(target, draft, ids, **kw)
    first = mmspec.generate(target, draft, ids, static_cache=True, **kw)
    gc.collect()
    (key, entries), = KEPT[target].items()
    assert len(entries) == 1
    cache = entries[0].cache
    second = mmspec.generate(target, draft, ids, static_cache=True, **kw)
    gc.collect()
    assert KEPT[target][key] == entries and entries[0].cache is cache    # reused, given back
    assert torch.equal(first.sequences, ref.sequences)
    assert torch.equal(second.sequences, ref.sequences)
    selfdraft = mmspec.generate(target, target, ids, static_cache=True, **kw)
    gc.collect()
    assert len(KEPT[target][key]) == 2          # target and its self-draft: two caches
    assert selfdraft.stats.acceptance_rate == 1.0
    plain = mmspec.generate(target, None, ids, attention_mask=mask, temperature=0, max_new_tokens=12)
    assert torch.equal(selfdraft.sequences, plain.sequences)
    mmspec.release_graphs(target)
    assert target not in KEPT and draft in KEPT
    mmspec.release_graphs()
    assert len(KEPT) == 0


def test_a_static_cache_goes_back_as_soon_as_the_call_drops_its_session(pair):
    """No reference cycle keeps a session alive: its static cache is back in the pool when
    the call returns, without the cycle collector (else the next call makes a new cache and
    captures every step again), with its captured-steps and recurrent helpers too."""
    import gc
    import weakref

    from conftest import tiny_qwen35
    from mmspec.engine.capture import KEPT
    from mmspec.sessions import CausalLMSession
    from mmspec.sessions.captured import CapturedSteps

    target, draft = pair
    ids = torch.tensor([[3, 4, 5, 6]])
    mmspec.release_graphs()
    gc.collect()
    gc.disable()
    try:
        mmspec.generate(target, draft, ids, static_cache=True, temperature=0, max_new_tokens=4,
                        num_draft_tokens=2)
        assert sum(len(v) for v in KEPT[target].values()) == 1
        for model in (target, tiny_qwen35()):
            s = CausalLMSession(model, mmspec.SamplingParams(temperature=0), static_len=64)
            with torch.inference_mode():                # as generate runs sessions
                s.prefill(ids, torch.ones_like(ids))
                s.step(ids[:, -1:])
            s._captured = CapturedSteps(s)              # as a captured session holds it
            assert (s._rollback is not None) == (model is not target)
            ref, steps = weakref.ref(s), s._captured
            del s
            assert ref() is None, model.config.model_type
            with pytest.raises(ReferenceError, match="CapturedSteps: its session was collected"):
                steps.cache_ready()
    finally:
        gc.enable()
    mmspec.release_graphs()


def test_a_networks_structure_is_read_once_and_forgotten_with_its_graphs(pair):
    """Sessions read a network's module configs, cache layers and cache argument once
    (``net_facts``); SDPA is chosen from the configs at each session, so a model switched to
    eager attention between calls gets no prefix attention; ``release_graphs(model)`` forgets
    the facts and static caches of the model and of the parts of it sessions run."""
    from mmspec.sessions.causal_lm import _FACTS
    from mmspec.engine.capture import KEPT
    from mmspec.sessions import CausalLMSession, net_facts

    target, _ = pair
    mmspec.release_graphs()
    params = mmspec.SamplingParams(temperature=0)
    first = CausalLMSession(target, params, static_len=32)
    assert net_facts(target) is net_facts(target) and target in _FACTS
    assert first._sdpa_configs == [target.config] and first._cache_arg in ("cache",
                                                                          "past_key_values")
    try:
        target.config._attn_implementation_internal = "eager"
        assert CausalLMSession(target, params, static_len=32)._sdpa_configs == []
    finally:
        target.config._attn_implementation_internal = "sdpa"
    net_facts(target.model)
    KEPT[target.model] = {}                      # as a session running a part would keep
    mmspec.release_graphs(target)
    assert target not in _FACTS and target.model not in _FACTS and target.model not in KEPT


def test_plain_greedy_equals_transformers_generate(pair, ragged_prompts):
    """The baseline itself is checked against Hugging Face, one unpadded row at a time."""
    target, _ = pair
    ids, mask = ragged_prompts
    plain = mmspec.generate(target, None, ids, attention_mask=mask, temperature=0,
                            max_new_tokens=16)
    for i in range(ids.shape[0]):
        row = ids[i][mask[i].bool()][None]
        ref = target.generate(row, attention_mask=torch.ones_like(row), do_sample=False,
                              max_new_tokens=16, min_new_tokens=16)
        assert ref[0, row.shape[1]:].tolist() == plain.generated(i).tolist()


def test_greedy_rule_with_sampled_draft_equals_plain_greedy(pair, ragged_prompts):
    target, draft = pair
    ids, mask = ragged_prompts
    plain = mmspec.generate(target, None, ids, attention_mask=mask, temperature=0,
                            max_new_tokens=12)
    spec = mmspec.generate(target, draft, ids, attention_mask=mask, temperature=0,
                           rule="greedy", max_new_tokens=12, num_draft_tokens=3, seed=0)
    assert torch.equal(spec.sequences, plain.sequences)


def test_self_draft_accepts_everything(pair, ragged_prompts):
    target, _ = pair
    ids, mask = ragged_prompts
    out = mmspec.generate(target, target, ids, attention_mask=mask, temperature=0,
                          max_new_tokens=20, num_draft_tokens=4)
    assert out.stats.acceptance_rate == 1.0
    assert out.stats.steps == 4  # 5 tokens per step


def test_stop_tokens_end_rows_independently(pair, ragged_prompts):
    target, draft = pair
    ids, mask = ragged_prompts
    plain = mmspec.generate(target, None, ids, attention_mask=mask, temperature=0,
                            max_new_tokens=12)
    stop = int(plain.generated(0)[3])
    out = mmspec.generate(target, draft, ids, attention_mask=mask, temperature=0,
                          max_new_tokens=12, stop_token_ids=[stop], num_draft_tokens=3)
    for i in range(3):
        ref = plain.generated(i).tolist()
        cut = ref.index(stop) + 1 if stop in ref else len(ref)
        assert out.generated(i).tolist() == ref[:cut]


def test_streaming_yields_the_same_tokens(pair, ragged_prompts):
    target, draft = pair
    ids, mask = ragged_prompts
    full = mmspec.generate(target, draft, ids, attention_mask=mask, temperature=0.8, seed=5,
                           max_new_tokens=10, num_draft_tokens=3)
    rows = [[] for _ in range(3)]
    for ev in mmspec.generate_stream(target, draft, ids, attention_mask=mask, temperature=0.8,
                                     seed=5, max_new_tokens=10, num_draft_tokens=3):
        for i, new in enumerate(ev.new_tokens):
            rows[i].extend(new)
    assert rows == [full.generated(i).tolist() for i in range(3)]


def test_generate_stream_takes_generates_arguments_and_defaults(pair, ragged_prompts):
    """One signature for both front doors; a streamed call with the target's generation
    config and a static cache gives ``generate``'s tokens."""
    import inspect

    assert (inspect.signature(mmspec.generate).parameters
            == inspect.signature(mmspec.generate_stream).parameters)
    target, draft = pair
    ids, mask = ragged_prompts
    kw = dict(attention_mask=mask, max_new_tokens=8, static_cache=True, seed=1,
              generation_config="model")
    full = mmspec.generate(target, draft, ids, **kw)
    rows = [[] for _ in range(3)]
    for ev in mmspec.generate_stream(target, draft, ids, **kw):
        for i, new in enumerate(ev.new_tokens):
            rows[i].extend(new)
    assert rows == [full.generated(i).tolist() for i in range(3)]


def _sample_histogram(target, draft, prompt, m, n, temperature, seed, rule, k=3):
    ids = torch.tensor(prompt).expand(n, -1).contiguous()
    out = mmspec.generate(target, draft, ids, temperature=temperature, max_new_tokens=m,
                          num_draft_tokens=k, seed=seed, rule=rule)
    gen = out.sequences[:, len(prompt):]
    v = target.config.vocab_size
    code = (gen * torch.tensor([v ** (m - 1 - i) for i in range(m)])).sum(1)
    return np.bincount(code.numpy(), minlength=v ** m).astype(float), out.stats


class ResampleFromP(Exact):
    """A broken rule: on rejection samples from p instead of the residual."""

    def residual(self, x, p, q, pos):
        return p


@pytest.fixture(scope="module")
def flat_pair():
    # A sharp-ish target and a very different draft so that rejections are frequent.
    return (tiny_llama(vocab=8, hidden=32, seed=3, scale=6.0),
            tiny_llama(vocab=8, hidden=16, layers=1, seed=4, scale=6.0))


def test_speculative_sampling_matches_target_distribution(flat_pair):
    target, draft = flat_pair
    prompt, m, n, temp = [1, 2, 3], 3, 20_000, 1.0
    exact = _continuation_distribution(target, prompt, m, temp)
    spec, st = _sample_histogram(target, draft, prompt, m, n, temp, seed=0, rule="exact")
    plain, _ = _sample_histogram(target, None, prompt, m, n, temp, seed=1, rule="exact")
    assert st.acceptance_rate < 0.8  # rejections (and so residual draws) are frequent
    thr = tv_threshold(exact, n)
    assert tv(spec / n, exact) < thr
    assert tv(plain / n, exact) < thr
    assert chi_square_pvalue(spec, exact) > 1e-4


def test_distribution_check_fails_for_a_broken_residual(flat_pair):
    target, draft = flat_pair
    prompt, m, n, temp = [1, 2, 3], 3, 20_000, 1.0
    exact = _continuation_distribution(target, prompt, m, temp)
    broken, _ = _sample_histogram(target, draft, prompt, m, n, temp, seed=0, rule=ResampleFromP())
    assert tv(broken / n, exact) > tv_threshold(exact, n) or chi_square_pvalue(broken, exact) < 1e-4
    assert chi_square_pvalue(broken, exact) < 1e-4


def _plain_events(target, ids, mask, n, stops, seed, pipeline, static):
    """Plain decoding through the loop directly; returns the events and the target steps run.
    Under inference mode, as the front doors run (a static cache kept from an earlier call is
    an inference tensor)."""
    from mmspec.generate import _setup
    from mmspec.loop import Stops, stream

    with torch.inference_mode():
        run, prompt = _setup(target, None, ids, mask, "exact", 4, n, mmspec.SamplingParams(),
                             seed, None, None, mmspec.Engine.from_switches(static_cache=static))
        run.prefill(prompt)
        tgt = run.target
        calls = []
        step = tgt.step
        tgt.step = lambda *a, **kw: calls.append(1) or step(*a, **kw)
        events = [(ev.new_tokens, ev.finished, ev.stats.steps)
                  for ev in stream(tgt, run.drafter, run.rule, ids[:, -1], max_new_tokens=n,
                                   stops=Stops(stops), generator=run.generator,
                                   pipeline=pipeline)]
    return events, len(calls)


@pytest.mark.parametrize("static", [False, True])
def test_pipelined_plain_loop_gives_the_same_events(pair, ragged_prompts, static):
    target, _ = pair
    ids, mask = ragged_prompts
    # Budget ends every row: no discarded step.
    a, na = _plain_events(target, ids, mask, 9, set(), 3, False, static)
    b, nb = _plain_events(target, ids, mask, 9, set(), 3, True, static)
    assert a == b and na == nb == 9
    # Stop tokens end rows at different steps; many stop ids so every row ends early.
    stops = set(range(2, 12))
    a, na = _plain_events(target, ids, mask, 30, stops, 3, False, static)
    b, nb = _plain_events(target, ids, mask, 30, stops, 3, True, static)
    assert a == b
    assert a[-1][1] == [True] * 3 and len(a) < 30           # rows ended on stop tokens
    assert nb == na + 1                                      # one step launched, then discarded
    # The default pipelines plain decoding.
    c, nc = _plain_events(target, ids, mask, 30, stops, 3, None, static)
    assert c == a and nc == nb
    # One token: a single step either way.
    a, na = _plain_events(target, ids, mask, 1, stops, 4, False, static)
    b, nb = _plain_events(target, ids, mask, 1, stops, 4, True, static)
    assert a == b and na == nb == 1


def test_pipeline_refuses_a_drafter_that_needs_host_values(pair, ragged_prompts):
    from mmspec.loop import stream

    target, draft = pair
    ids, mask = ragged_prompts
    with pytest.raises(ValueError, match="pipeline=True"):
        next(stream(None, mmspec.drafters.ModelDrafter(None, 3), None, ids[:, -1],
                    max_new_tokens=4, pipeline=True))


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("k", [1, 3])
def test_pipelined_speculative_loop_equals_the_synchronised_one(pair, ragged_prompts, static, k):
    """pipeline=True: the draft keeps rejected slots as holes, steps are queued before the
    previous one is read. Greedy: plain greedy's tokens; sampled: the synchronised loop's."""
    target, draft = pair
    ids, mask = ragged_prompts
    kw = dict(attention_mask=mask, max_new_tokens=14, num_draft_tokens=k, static_cache=static)
    plain = mmspec.generate(target, None, ids, temperature=0, **kw)
    piped = mmspec.generate(target, draft, ids, temperature=0, pipeline=True, **kw)
    assert torch.equal(piped.sequences, plain.sequences)
    unpiped = mmspec.generate(target, None, ids, temperature=0, pipeline=False, **kw)
    assert torch.equal(unpiped.sequences, plain.sequences)
    stop = int(plain.generated(1)[2])
    for seed in (0, 1):
        a = mmspec.generate(target, draft, ids, temperature=1.0, seed=seed, stop_token_ids=[stop],
                            pipeline=False, **kw)
        b = mmspec.generate(target, draft, ids, temperature=1.0, seed=seed, stop_token_ids=[stop],
                            pipeline=True, **kw)
        assert torch.equal(a.sequences, b.sequences)
        assert a.stats.steps == b.stats.steps and a.stats.accepted == b.stats.accepted


def test_pipelined_speculative_loop_reads_the_last_step_before_queueing_past_the_budget(
        pair, ragged_prompts, monkeypatch):
    """Rows that end by their budget: the loop reads a step that may end every row before
    queueing the next, so no step is verified past the end (a stop token may still cost one)."""
    from mmspec.acceptance import Greedy

    target, draft = pair
    ids, mask = ragged_prompts
    verified = []
    call = Greedy.__call__

    def spy(self, *args, **kwargs):
        verified.append(1)
        return call(self, *args, **kwargs)

    monkeypatch.setattr(Greedy, "__call__", spy)
    for k in (1, 3):
        for d in (draft, target):          # the target as its own draft accepts everything
            verified.clear()
            out = mmspec.generate(target, d, ids, attention_mask=mask, max_new_tokens=17,
                                  num_draft_tokens=k, temperature=0, stop_token_ids=[],
                                  pipeline=True)
            assert len(verified) == out.stats.steps
        assert out.stats.acceptance_rate == 1.0


def test_pipeline_argument_is_checked(pair, ragged_prompts):
    target, draft = pair
    ids, mask = ragged_prompts
    with pytest.raises(ValueError, match="pipeline=1"):
        mmspec.generate(target, draft, ids, attention_mask=mask, pipeline=1)
    with pytest.raises(ValueError, match="pipeline=True: accepted only with a drafter whose"):
        mmspec.generate(target, None, ids, attention_mask=mask, pipeline=True,
                        drafter=mmspec.Jacobi(window=3))
    # A host-free drafter given by the user pipelines: plain decoding's tokens.
    kw = dict(attention_mask=mask, temperature=0, max_new_tokens=6)
    piped = mmspec.generate(target, None, ids, pipeline=True, drafter=mmspec.NoDraft(), **kw)
    assert torch.equal(piped.sequences, mmspec.generate(target, None, ids, **kw).sequences)


def test_static_sequence_mask_follows_the_dynamic_one():
    """The static cache's device-buffer sequence mask against the growing one, through random
    steps, rollbacks and holes: the same validity, positions and 4-D masks."""
    from mmspec.cache import SequenceMask, StaticSequenceMask

    g = torch.Generator().manual_seed(0)
    rows, slots = 3, 64
    dyn = SequenceMask.from_prompt(torch.ones(rows, 1, dtype=torch.long))
    st = StaticSequenceMask.allocate(rows, slots, "cpu")
    st.buf.fill_(1)                           # stale bits must never be read
    st.reset().buf[:, 40:] = 1
    for step in range(12):
        n = int(torch.randint(1, 6, (1,), generator=g))
        valid = (torch.rand(rows, n, generator=g) < 0.8).long()
        attn, pos = dyn.plan(valid)
        dyn.append(valid)
        mask4, pos_s = st.advance(valid)
        st.appended(n)
        assert torch.equal(pos, pos_s)
        end = attn.shape[1]
        for i in range(n):                    # slot j visible to token i: real and j <= L + i, or itself
            want = torch.zeros(rows, slots, dtype=torch.bool)
            want[:, :end - n + i + 1] = attn[:, :end - n + i + 1].bool()
            want[:, end - n + i] = True
            assert torch.equal(mask4[:, 0, i], want)
        remove = int(torch.randint(0, n + 1, (1,), generator=g))
        dyn.rollback(remove)
        st.rollback(remove)
        keep = int(torch.randint(0, dyn.length + 1, (1,), generator=g)) if step % 2 else 0
        if keep:
            kv = torch.rand(rows, keep, generator=g) < 0.7
            dyn.invalidate_tail(keep, kv)
            st.invalidate_tail(keep, kv)
        assert torch.equal(dyn.mask, st.mask) and torch.equal(dyn.next_pos, st.next_pos)
        assert int(st.dev_len) == st.length == dyn.length
    with pytest.raises(RuntimeError, match="static_len=64"):
        st.check_room(slots - st.length + 1)


@pytest.mark.parametrize("model", ["llama", "qwen3.5"])
@pytest.mark.parametrize("static", [False, True])
def test_a_commit_without_validity_keeps_the_slots_as_fed(ragged_prompts, model, static):
    """``commit(keep, None)`` (what the loop passes when each row keeps one slot) leaves the
    session as a commit of the validity the slots were fed with: the same sequence mask and
    positions, and the same distributions at the next step (padding rows included)."""
    from mmspec.sampling import SamplingParams
    from mmspec.sessions import CausalLMSession
    from conftest import tiny_qwen35

    net = tiny_llama(seed=0) if model == "llama" else tiny_qwen35(vocab=16)
    ids, mask = ragged_prompts
    fed = torch.tensor([[3, 4, 5], [6, 7, 8], [9, 1, 2]])
    valid = torch.tensor([[1, 1, 1], [0, 0, 0], [1, 1, 0]])
    sessions = []
    for as_fed in (True, False):
        s = CausalLMSession(net, SamplingParams(temperature=0), static_len=32 if static else None)
        s.prefill(ids, mask)
        s.step(fed, valid)
        s.commit(2, None if as_fed else valid[:, :2])
        sessions.append(s)
    a, b = sessions
    assert torch.equal(a.seq.mask, b.seq.mask) and torch.equal(a.seq.next_pos, b.seq.next_pos)
    nxt = torch.tensor([[4], [5], [6]])
    torch.testing.assert_close(a.step(nxt), b.step(nxt), rtol=0, atol=0)


@pytest.mark.parametrize("processing", [
    dict(temperature=0.0), dict(temperature=0.7), dict(temperature=0.9, top_k=5),
    dict(temperature=1.0, top_p=0.8), dict(temperature=1.0, min_p=0.1),
    dict(temperature=0.8, guidance_scale=2.0)])
def test_a_steps_compiled_tail_is_traced_whole_and_equals_eager(pair, ragged_prompts,
                                                                 processing):
    """What ``compiled_tail`` compiles for captured regional steps, the sequence mask's update
    (with and without a tree, buffers mutated in place) and a session's distributions, traced
    whole (fullgraph; AOT autograd's functionalisation, no code generation) through steps and
    rollbacks: the same masks, positions, buffers and probabilities as eager; under greedy
    processing a chain step's draw too (``_greedy_draw``)."""
    from mmspec.cache import StaticSequenceMask, TreeMask
    from mmspec.sampling import SamplingParams
    from mmspec.sessions import CausalLMSession

    torch._dynamo.reset()
    advance = torch.compile(StaticSequenceMask.advance, backend="aot_eager", fullgraph=True)
    g = torch.Generator().manual_seed(0)
    masks = [StaticSequenceMask.allocate(3, 32, "cpu") for _ in range(2)]
    for step in range(6):
        n = 1 + step % 3
        valid = (torch.rand(3, n, generator=g) < 0.8).long()
        tree = None
        if step % 3 == 2:
            anc = torch.tril(torch.rand(3, n, n, generator=g) < 0.6)
            anc |= torch.eye(n, dtype=torch.bool)
            tree = TreeMask(anc, torch.arange(n).expand(3, n) % 2)
        got = advance(masks[0], valid, 16, torch.float32, tree)
        want = StaticSequenceMask.advance(masks[1], valid, 16, torch.float32, tree)
        for a, b in zip(got, want):
            assert torch.equal(a, b)
        for m in masks:
            m.appended(n)
            m.rollback(step % 2)
        for a, b in (("buf", "buf"), ("dev_len", "dev_len"), ("next_pos", "next_pos")):
            assert torch.equal(getattr(masks[0], a), getattr(masks[1], b))
    target, _ = pair
    ids, mask = ragged_prompts
    scale = processing.pop("guidance_scale", None)
    s = CausalLMSession(target, SamplingParams(**processing), scale, static_len=32)
    s.prefill(ids, mask, **({} if scale is None else dict(uncond_ids=ids, uncond_mask=mask)))
    logits = torch.randn(6 if scale else 3, 2, s.vocab_size, generator=g)
    pos = torch.arange(2).expand(logits.shape[0], 2) + 9
    dist = torch.compile(CausalLMSession._distributions, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(dist(s, logits, pos), s._distributions(logits, pos), rtol=0, atol=0)
    if s.greedy:                                      # a greedy chain's draw, compiled with them
        logits[0, -1, :2] = logits[0, -1].max() + 1   # a tie: the lower id, as eager
        draw = torch.compile(CausalLMSession._greedy_draw, backend="aot_eager", fullgraph=True)
        (x, q), (want_x, want_q) = draw(s, logits, pos), s._greedy_draw(logits, pos)
        assert torch.equal(x, want_x) and torch.equal(q, want_q) and int(x[0]) == 0
    assert s._tail(CausalLMSession._distributions) is CausalLMSession._distributions  # eager
    torch._dynamo.reset()


def test_adapters_queue_drafts_where_positions_allow():
    """Engine.plan: the one decision of ModelDrafter(host_free=...) for every front door."""
    from mmspec import Engine

    def queues(pipeline, compile, draft_model, positions, limits, profile=False):
        engine = Engine.from_switches(compile, None, pipeline, profile)
        return engine.plan(max_new_tokens=1, num_draft_tokens=4, draft_model=draft_model,
                           positions=positions, limits=limits).queue_drafts

    assert queues(None, True, True, 100, [128, None])            # captured: the default
    assert queues(None, "graphs", True, 100, [128, None])
    assert not queues(None, False, True, 100, [128])             # eager: synchronised
    assert not queues(None, "inductor", True, 100, [128])
    assert not queues(None, True, True, 100, [128], profile=True)
    assert not queues(False, True, True, 100, [128])
    assert queues(True, False, True, 100, [None])                 # asked for
    assert not queues(None, True, True, 129, [128])              # K drafts past the end
    assert not queues(True, True, False, 999, [128])             # no draft model
    with pytest.raises(ValueError, match=r"max_position_embeddings=96 \(129 positions needed\)"):
        queues(True, True, True, 129, [128, 96])


def test_an_engine_object_stands_for_the_switches(pair, ragged_prompts):
    from mmspec import Engine

    target, draft = pair
    ids, mask = ragged_prompts
    kw = dict(attention_mask=mask, temperature=0, max_new_tokens=9, num_draft_tokens=3)
    ref = mmspec.generate(target, draft, ids, static_cache=True, pipeline=True, **kw)
    got = mmspec.generate(target, draft, ids, engine=Engine("static", pipeline=True), **kw)
    assert torch.equal(ref.sequences, got.sequences)
    assert Engine.from_switches(static_cache=True, pipeline=False) == Engine("static", False)
    assert Engine.from_switches(compile="inductor").compile == "inductor"
    with pytest.raises(ValueError, match="engine: accepted an Engine, given instead of"):
        mmspec.generate(target, draft, ids, engine=Engine("static"), static_cache=True, **kw)
    with pytest.raises(ValueError, match="mode='fast'"):
        Engine("fast")
    with pytest.raises(ValueError, match="accepted a model on a CUDA device"):
        mmspec.generate(target, draft, ids, engine=Engine("graphs"), **kw)


def test_speed_switches_are_per_call_fields_of_the_engine(pair, ragged_prompts):
    """Every speed switch is a field of the call's Engine: the sessions of one call read its
    engine, a static cache is kept per graph-shaping switch (not shared with a call that
    turned one off), another call's engine changes nothing, and bad values are refused."""
    import gc
    from dataclasses import fields

    from mmspec import Engine
    from mmspec.engine import GRAPH_SWITCHES, INDUCTOR_OPTIONS
    from mmspec.engine.capture import KEPT
    from mmspec.sessions import CausalLMSession

    target, draft = pair
    ids, mask = ragged_prompts
    kw = dict(attention_mask=mask, temperature=0, max_new_tokens=6, num_draft_tokens=2)
    off = Engine("static", shared_pointer=False, row_kernels=False, plain_steps=2,
                 inductor_options={"coordinate_descent_tuning": False})
    mmspec.release_graphs()
    ref = mmspec.generate(target, draft, ids, engine=Engine("static"), **kw)
    got = mmspec.generate(target, draft, ids, engine=off, **kw)
    assert torch.equal(ref.sequences, got.sequences)
    gc.collect()
    keys = [k for k in KEPT.get(target, {})]
    assert len(keys) == 2 and {k[3] for k in keys} == {Engine("static").speed, off.speed}
    session = CausalLMSession(target, mmspec.SamplingParams(temperature=0), static_len=64,
                              engine=off)
    assert session.engine is off and session.compile is False
    assert Engine().inductor_options == INDUCTOR_OPTIONS          # defaults untouched
    assert Engine(inductor_options=dict(INDUCTOR_OPTIONS)) == Engine()
    assert set(GRAPH_SWITCHES) < {f.name for f in fields(Engine)}      # each an Engine field
    for bad, match in ((dict(row_kernels=1), "row_kernels=1: accepted True or False"),
                       (dict(captured_prompts=-1), "captured_prompts=-1: accepted an integer >= 0"),
                       (dict(plain_steps=0), "plain_steps=0: accepted an integer >= 1"),
                       (dict(inductor_options=3), "inductor_options=3: accepted a mapping"),
                       (dict(inductor_options={"post_grad_fusion_options": {}}),
                        "accepted a mapping of torch.compile option names to hashable")):
        with pytest.raises(ValueError, match=match):
            Engine(**bad)
    with pytest.raises(ValueError, match="engine: accepted an Engine, given instead of compile="):
        CausalLMSession(target, mmspec.SamplingParams(temperature=0), static_len=64,
                        compile="graphs", engine=off)
    mmspec.release_graphs()


def test_generation_config_gives_model_generate_processing(pair):
    from transformers import GenerationConfig

    from mmspec import SamplingParams

    sp = SamplingParams.from_generation_config
    assert sp(GenerationConfig()) == SamplingParams(temperature=0.0)               # greedy
    assert sp(GenerationConfig(do_sample=True)) == SamplingParams(top_k=50)        # transformers' fill
    assert sp(GenerationConfig(do_sample=True, top_k=0, top_p=0.9, temperature=0.7)) == \
        SamplingParams(temperature=0.7, top_p=0.9)
    assert sp(GenerationConfig(do_sample=True), top_k=5) == SamplingParams(top_k=5)  # given wins
    target, draft = pair
    ids = torch.tensor([[1, 2, 3]])
    own = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                          max_new_tokens=8, pad_token_id=0)
    for d in (None, draft):
        out = mmspec.generate(target, d, ids, max_new_tokens=8, generation_config="model",
                              stop_token_ids=[])
        assert torch.equal(out.sequences, own)
    with pytest.raises(ValueError, match="generation_config='fast'"):
        mmspec.generate(target, None, ids, generation_config="fast")


def test_attention_mask_is_inferred_from_the_pad_id_as_transformers(pair, ragged_prompts):
    """A left-padded batch without attention_mask: the padding is the pad id's run at each
    row's left (transformers' rule), not attended; pad ids after a real token are ambiguous."""
    target, draft = pair
    ids, mask = ragged_prompts                       # pad id 0 at the left of rows 0 and 2
    kw = dict(temperature=0, max_new_tokens=8)
    want = mmspec.generate(target, draft, ids, attention_mask=mask, **kw)
    got = mmspec.generate(target, draft, ids, **kw)
    assert torch.equal(got.sequences, want.sequences)
    bad = torch.tensor([[3, 0, 5], [4, 5, 6]])
    with pytest.raises(ValueError, match=r"row 0 holds the pad id 0 after a real token"):
        mmspec.generate(target, None, bad, **kw)
    one = mmspec.generate(target, None, bad[:1], **kw)      # one row: nothing is padding
    assert one.sequences.shape == (1, 11)
    # pad_token_id given: its run at the left is the padding, as with the mask
    repad = torch.where(mask.bool(), ids, 9)
    got = mmspec.generate(target, draft, repad, pad_token_id=9, **kw)
    assert torch.equal(got.sequences[:, ids.shape[1]:], want.sequences[:, ids.shape[1]:])


@pytest.mark.parametrize("draft_kind", [None, "model"])
def test_per_phase_seconds_are_disjoint_and_add_up_to_the_call(pair, ragged_prompts, draft_kind):
    """prefill + draft + verify + accept never exceed the call's total (the synchronised loop
    charged the next step's draft and verify to this step's accept), and cover most of it."""
    import time

    target, draft = pair
    ids, mask = ragged_prompts
    t0 = time.perf_counter()
    out = mmspec.generate(target, draft if draft_kind else None, ids, attention_mask=mask,
                          max_new_tokens=24, seed=0, pipeline=False)
    wall = time.perf_counter() - t0
    s = out.stats
    phases = s.seconds_prefill + s.seconds_draft + s.seconds_verify + s.seconds_accept
    assert phases <= s.seconds_total + 1e-6 and s.seconds_total <= wall
    assert phases >= 0.6 * s.seconds_total


def test_regional_compilation_swaps_layers_in_and_back(pair):
    """compile="regional": the decoder layers, the output head, the final norm and the rotary
    embedding are the regions; inside ``regions.compiled`` the model runs them compiled with
    the same logits, after it (and after an error) the user's modules are back."""
    from mmspec.engine import regions

    target, _ = pair
    layers = target.model.layers
    names = [(type(p).__name__, n) for p, n in regions.regions(target)]
    assert names == [("ModuleList", str(i)) for i in range(len(layers))] + [
        (type(target).__name__, "lm_head"), ("LlamaModel", "norm"), ("LlamaModel", "rotary_emb")]
    ids = torch.tensor([[3, 4, 5, 6]])
    modules = list(target.modules())
    originals = list(layers)
    with torch.no_grad():
        ref = target(ids).logits
        with regions.compiled(target, {}, backend="eager"):
            assert all(isinstance(m, regions._Region) and m.layer is o
                       for m, o in zip(layers, originals))
            got = target(ids).logits
        with pytest.raises(RuntimeError, match="inside"):
            with regions.compiled(target, {}, backend="eager"):
                raise RuntimeError("inside")
    assert torch.equal(ref, got)
    assert list(target.modules()) == modules
    head = mmspec.DraftHead.for_target(target)                # a one-layer decoder
    assert regions.decoder_layers(head.decoder) is head.decoder.model.layers
    with pytest.raises(ValueError, match='compile="regional" compiles a decoder.s layers: '
                                         "Linear holds no ModuleList"):
        regions.regions(torch.nn.Linear(2, 2))


def test_regional_compile_failure_names_the_unfused_mode(pair):
    """torch.compile failing on the layers (here a backend that raises) is a RuntimeError
    that says what failed and names compile='graphs'; the user's modules are back."""
    from mmspec.engine import regions

    target, _ = pair
    modules = list(target.modules())

    def broken(gm, example_inputs):
        raise NotImplementedError("no compiler here")

    with torch.no_grad(), pytest.raises(RuntimeError, match=r"compile=True: torch.compile "
                                        r"failed on LlamaForCausalLM's layers \(NotImplementedError: "
                                        r"no compiler here\); compile='graphs' captures"):
        with regions.compiled(target, {}, backend=broken):
            target(torch.tensor([[3, 4, 5]]))
    assert list(target.modules()) == modules
    torch._dynamo.reset()


def test_compile_true_is_the_regional_mode():
    """compile=True (or "regional") is the regional captured mode, "graphs" capture without
    compiling: drafts queued by default in both, K fixed, caches sized alike (the compiled
    layers take any cache length); the sessions get the mode's name; other values refused."""
    from mmspec import Engine

    for switch in (True, "regional"):
        engine = Engine.from_switches(compile=switch)
        assert (engine.mode, engine.captures, engine.compile) == ("regional", True, "regional")
    graphs = Engine.from_switches(compile="graphs")
    assert (graphs.mode, graphs.captures, graphs.compile) == ("graphs", True, "graphs")
    assert graphs.plan(max_new_tokens=8, num_draft_tokens=4, draft_model=True).queue_drafts
    with pytest.raises(ValueError, match="compile='fast': accepted False, True, 'graphs', "
                                         "'regional' or 'inductor'"):
        Engine.from_switches(compile="fast")
    plan = engine.plan(max_new_tokens=128, num_draft_tokens=4, draft_model=True)
    assert plan.queue_drafts and plan.holes and plan.fixed_k
    assert plan.static_len(128, 1) == Engine("graphs").plan(
        max_new_tokens=128, num_draft_tokens=4, draft_model=True).static_len(128, 1)


def test_plain_decoding_chains_its_steps_where_a_captured_target_draws_greedily():
    """``Plan.steps_per_launch``: ``Engine.plain_steps`` target steps a launch for plain decoding under
    captured engines of a target that chains its greedy steps in one graph; one otherwise
    (eager engines, drafts, sampling, targets that do not chain); other counts refused by
    the loop before any work."""
    from types import SimpleNamespace

    from mmspec import Engine
    from mmspec.drafters import NoDraft
    from mmspec.engine import PLAIN_STEPS
    from mmspec.loop import check_plain_steps

    chains, plain, drafts = SimpleNamespace(greedy=True, chains=True), NoDraft(), SimpleNamespace(plain=False)
    cases = [("regional", plain, chains, PLAIN_STEPS), ("graphs", plain, chains, PLAIN_STEPS),
             ("static", plain, chains, 1), ("regional", drafts, chains, 1),
             ("regional", plain, SimpleNamespace(greedy=False, chains=True), 1),
             ("regional", plain, SimpleNamespace(greedy=True, chains=False), 1)]
    for mode, drafter, target, want in cases:
        plan = Engine(mode).plan(max_new_tokens=8)
        assert plan.steps_per_launch(target, drafter) == want, (mode, drafter, target)
    sampled = SimpleNamespace(greedy=False, params=SimpleNamespace(temperature=0.7))
    with pytest.raises(ValueError, match="plain_steps=4: accepted 1 unless plain decoding of "
                                         "a greedy target"):
        check_plain_steps(sampled, NoDraft(), 4)
    with pytest.raises(ValueError, match="plain_steps=0: accepted an integer >= 1"):
        check_plain_steps(chains, NoDraft(), 0)
    from mmspec.drafters import Prefilled            # drafts nothing, but feeds its prefill
    prefilled = Prefilled(NoDraft(), 2)
    assert not prefilled.plain and Engine("regional").plan(
        max_new_tokens=8).steps_per_launch(chains, prefilled) == 1
    with pytest.raises(ValueError, match="plain_steps=4: accepted 1 unless plain decoding"):
        check_plain_steps(SimpleNamespace(greedy=True, params=SimpleNamespace(temperature=0)),
                          prefilled, 4)


@pytest.mark.parametrize("under_prefix", [False, True])
def test_regional_layers_compile_once_for_every_cache_length(under_prefix):
    """With the cache length and the mask width marked dynamic (``regions.dynamic_length``)
    and each layer given its own view of the cache (``regions.layer_cache``), steps on static
    caches of three lengths trace the layers' code once and the output head, the final norm
    and the rotary embedding once each (torch.compile's eager backend: the tracing, without
    code generation); the same logits as uncompiled. Under prefix attention
    (``mmspec.engine.attention.prefix``, as ``compile="regional"`` runs every pass) the same holds for
    masks narrower than the cache and as wide as it."""
    from torch._dynamo.utils import counters
    from transformers import StaticCache

    from mmspec.engine import regions
    from mmspec.engine.attention import module_configs, prefix, sdpa_configs

    target = tiny_llama(seed=0)   # its own: traces are counted on it
    torch._dynamo.reset()
    counters.clear()
    ids = torch.tensor([[3, 4, 5, 6, 7]])
    shapes = ((256, 256), (256, 64), (128, 128), (320, 128)) if under_prefix else \
        ((64, 64), (128, 128), (192, 192))                          # (slots, mask width)
    for slots, width in shapes:
        outs = []
        for fused in (False, True):
            cache = StaticCache(config=target.config, max_cache_len=slots)
            configs = sdpa_configs(module_configs(target)) if under_prefix else []
            with torch.no_grad(), prefix(configs):
                target(input_ids=ids[:, :4], cache=cache, use_cache=True)
                mask = torch.zeros(1, 1, 1, width, dtype=torch.bool)
                mask[..., :5] = True
                step = dict(input_ids=ids[:, 4:], cache=cache, attention_mask=mask,
                            position_ids=torch.tensor([[4]]), use_cache=True)
                if fused:
                    regions.dynamic_length(cache, mask)
                    with regions.compiled(target, {}, backend="eager"):
                        outs.append(target(**step).logits)
                else:
                    outs.append(target(**step).logits)
        torch.testing.assert_close(outs[1], outs[0])
    assert len(target.model.layers) > 1
    assert counters["stats"]["unique_graphs"] == 4        # layers, head, norm, rotary
    torch._dynamo.reset()


def test_regional_prompt_passes_compile_once_for_every_prompt_length():
    """Prompt passes (``regions.compiled(..., prompt=True)``) of three lengths on caches of
    three lengths (their slots allocated, as a session's reused cache) trace the layers, the
    output head, the final norm and the rotary embedding once each, with the prompt's and the
    cache's length dynamic; a step after them traces its own graphs (the prompts' are not the
    steps'); the logits equal uncompiled ones."""
    from torch._dynamo.utils import counters
    from transformers import StaticCache

    from mmspec.engine import regions

    target = tiny_llama(seed=0)   # its own: traces are counted on it
    torch._dynamo.reset()
    counters.clear()
    cfg = target.config
    for length, slots in ((3, 64), (7, 128), (12, 64)):
        ids = torch.arange(3, 3 + length)[None]
        mask = torch.ones(1, 1, length, slots, dtype=torch.bool).tril()
        outs = []
        for fused in (False, True):
            cache = StaticCache(config=cfg, max_cache_len=slots)
            cache.early_initialization(1, cfg.num_key_value_heads, cfg.head_dim, torch.float32,
                                       torch.device("cpu"))
            prompt = dict(input_ids=ids, cache=cache, attention_mask=mask,
                          position_ids=torch.arange(length)[None], use_cache=True)
            with torch.no_grad():
                if fused:
                    regions.dynamic_length(cache, mask)
                    with regions.compiled(target, {}, backend="eager", prompt=True):
                        outs.append(target(**prompt).logits)
                else:
                    outs.append(target(**prompt).logits)
        torch.testing.assert_close(outs[1], outs[0])
    assert counters["stats"]["unique_graphs"] == 4        # layers, head, norm, rotary
    step = torch.zeros(1, 1, 1, slots, dtype=torch.bool)
    step[..., :13] = True
    with torch.no_grad(), regions.compiled(target, {}, backend="eager"):
        regions.dynamic_length(cache, step)
        target(input_ids=ids[:, -1:], cache=cache, attention_mask=step,
               position_ids=torch.tensor([[12]]), use_cache=True)
    assert counters["stats"]["unique_graphs"] == 8
    torch._dynamo.reset()


@pytest.mark.parametrize("by_index", [False, True])
def test_regional_layer_reading_its_index_is_traced_on_its_own(by_index):
    """GPT-2 scales attention by 1 / (layer index + 1) when asked: torch.compile then guards
    on each layer's index and traces every layer (3 + the head), else once (1 + the head);
    the logits equal uncompiled ones either way, on both cache kinds."""
    from torch._dynamo.utils import counters
    from transformers import DynamicCache, GPT2Config, GPT2LMHeadModel, StaticCache

    from mmspec.engine import regions

    cfg = GPT2Config(n_embd=32, n_layer=3, n_head=2, vocab_size=64,
                     scale_attn_by_inverse_layer_idx=by_index)
    m = GPT2LMHeadModel(cfg).eval()
    ids = torch.tensor([[1, 2, 3, 4]])
    for make in (lambda: DynamicCache(config=cfg), lambda: StaticCache(config=cfg,
                                                                       max_cache_len=16)):
        torch._dynamo.reset()
        counters.clear()
        outs = []
        for fused in (False, True):
            cache = make()
            with torch.no_grad():
                m(input_ids=ids[:, :3], cache=cache, use_cache=True)
                with regions.compiled(m, {}, backend="eager") if fused else nullcontext():
                    outs.append(m(input_ids=ids[:, 3:], cache=cache, use_cache=True).logits)
        torch.testing.assert_close(outs[1], outs[0], rtol=0, atol=0)
        assert counters["stats"]["unique_graphs"] == (3 if by_index else 1) + 1
    torch._dynamo.reset()


@pytest.mark.parametrize("prompt", [False, True])
def test_regions_run_hooks_outside_their_graphs(prompt):
    """transformers records ``output_hidden_states`` by forward hooks it installs on a model's
    first call that asks (and keeps): compiled regions run each region's own hooks outside
    its graph and take the recorders inside it off, so a model once asked traces as many
    graphs as one never asked, with no graph break; hidden states asked for under the regions
    (a model's very first ask included) equal uncompiled ones; a user's hook that replaces a
    layer's output still does."""
    from torch._dynamo.utils import counters

    from mmspec.engine import regions

    ids = torch.tensor([[3, 4, 5, 6, 7]])
    graphs = {}
    for asks in ("never", "before", "inside"):
        target = tiny_llama(seed=0)   # its own: traces are counted on it
        with torch.no_grad():
            if asks == "before":      # transformers installs its recorders now
                target(input_ids=ids, output_hidden_states=True)
            torch._dynamo.reset()
            counters.clear()
            for n in (5, 3, 4):
                with regions.compiled(target, {}, backend="eager", prompt=prompt):
                    out = target(input_ids=ids[:, :n], output_hidden_states=asks != "never")
                reference = target(input_ids=ids[:, :n], output_hidden_states=True)
                torch.testing.assert_close(out.logits, reference.logits)
                if asks != "never":
                    assert len(out.hidden_states) == len(target.model.layers) + 1
                    for got, want in zip(out.hidden_states, reference.hidden_states):
                        torch.testing.assert_close(got, want)
        assert sum(counters["graph_break"].values()) == 0
        graphs[asks] = counters["stats"]["unique_graphs"]
    assert graphs["before"] == graphs["inside"] == graphs["never"] == (4 if prompt else
                                                                       graphs["never"])
    handle = target.model.layers[1].register_forward_hook(lambda m, a, out: out * 0)
    with torch.no_grad(), regions.compiled(target, {}, backend="eager", prompt=prompt):
        zeroed = target(input_ids=ids, output_hidden_states=True).hidden_states[2]
    handle.remove()
    assert not zeroed.any()
    torch._dynamo.reset()


def test_layer_cache_views_one_layer():
    """``regions.layer_cache``: the cache's class for isinstance, the same layers, updates to
    the viewed layer's slots whatever index is passed; an encoder-decoder cache is left as is."""
    from transformers import DynamicCache, EncoderDecoderCache, LlamaConfig, StaticCache

    from mmspec.engine import regions

    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, vocab_size=64)
    cache = StaticCache(config=cfg, max_cache_len=8)
    view = regions.layer_cache(cache, 1)
    assert isinstance(view, StaticCache) and view.layers is cache.layers
    k = torch.ones(1, 2, 1, 16)
    cache.update(k, k, 0)
    keys, values = view.update(3 * k, 2 * k, 0)                  # the index passed is ignored
    assert keys is cache.layers[1].keys and values is cache.layers[1].values
    assert keys[0, :, 0].eq(3).all() and values[0, :, 0].eq(2).all() and keys[0, :, 1:].eq(0).all()
    assert cache.layers[0].keys[0, :, 0].eq(1).all() and cache.layers[0].keys[0, :, 1:].eq(0).all()
    enc = EncoderDecoderCache(DynamicCache(), DynamicCache())
    assert regions.layer_cache(enc, 0) is enc


def test_static_rollback_moves_every_write_pointer_in_one_call(monkeypatch):
    """``cache.crop`` on static layers moves their ``cumulative_length`` together (one
    ``_foreach_sub_``, no per-layer crop call); a layer with a crop of its own (a sliding
    window's) gets that crop; the next update writes at the rolled-back slot."""
    from transformers import LlamaConfig, StaticCache
    from transformers.cache_utils import StaticLayer

    from mmspec.cache import crop

    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                      num_attention_heads=2, num_key_value_heads=2, vocab_size=64,
                      layer_types=["full_attention", "sliding_attention", "full_attention"],
                      sliding_window=4)
    cache = StaticCache(config=cfg, max_cache_len=8)
    k = torch.ones(1, 2, 3, 16)
    for i in range(3):
        cache.update(k, k, i)
    calls, own = [], StaticLayer.crop
    monkeypatch.setattr(StaticLayer, "crop", lambda self, n: (calls.append(self), own(self, n)))
    crop(cache, 2)
    window = [layer for layer in cache.layers if type(layer) is not StaticLayer]
    assert len(window) == 1 and calls == window          # its crop calls StaticLayer's
    assert [int(layer.cumulative_length) for layer in cache.layers] == [1, 1, 1]
    assert window[0].cumulative_length_int == 1
    keys, _ = cache.update(2 * k[:, :, :1], k[:, :, :1], 0)
    assert keys[0, :, 1].eq(2).all() and keys[0, :, 0].eq(1).all()


@pytest.mark.parametrize("static", [False, True])
def test_sliding_window_layers_decode_past_their_window(static):
    """Layers of a 4-slot sliding window beside full ones (Gemma 3's), 16 tokens after
    prompts of 7 and 3: plain, draft-model and Jacobi decoding give each row the model's own
    ``generate`` tokens alone, on both caches. The caches keep every slot (a rollback past
    the window needs them; transformers' window layers refuse it) and the step's masks carry
    the window counted in positions (the ragged batch's holes do not count)."""
    import mmspec

    target, draft = tiny_windowed(0), tiny_windowed(1, layers=1)
    prompts = [torch.randint(3, 64, (1, 7), generator=torch.Generator().manual_seed(i))
               for i in range(2)]
    prompts[1] = prompts[1][:, :3]
    own = [target.generate(p, do_sample=False, max_new_tokens=16, pad_token_id=0)[0, p.shape[1]:]
           .tolist() for p in prompts]
    ids = torch.zeros(2, 7, dtype=torch.long)
    mask = torch.zeros(2, 7, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, 7 - p.shape[1]:], mask[i, 7 - p.shape[1]:] = p[0], 1
    for drafter in (dict(draft=draft), dict(drafter=mmspec.Jacobi(4)), {}):
        out = mmspec.generate(target, input_ids=ids, attention_mask=mask, max_new_tokens=16,
                              temperature=0, static_cache=static, stop_token_ids=[],
                              **drafter)
        assert out.sequences[:, 7:].tolist() == own, drafter


def _models_own_block_masks(kind: str, ids, attn, window: int):
    """(full, sliding) bool masks [B, 1, P, P] of a prompt pass as the model's own code builds
    them for prompt blocks ``ids`` [B, P] (-1 outside a block), SDPA layout."""
    from transformers import Gemma2Config, Gemma3TextConfig
    from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

    b, p = attn.shape
    kw = dict(hidden_size=8, num_hidden_layers=2, num_attention_heads=1, num_key_value_heads=1,
              head_dim=8, sliding_window=window, layer_types=["sliding_attention", "full_attention"])
    cfg = (Gemma2Config if kind == "paligemma2" else Gemma3TextConfig)(**kw)
    cfg._attn_implementation = "sdpa"
    args = (cfg, torch.zeros(b, p, 8), attn, None, torch.arange(p)[None].expand(b, -1))
    if kind == "paligemma2":               # PaliGemma's forward, with Gemma 2's window
        return (create_causal_mask(*args, block_sequence_ids=ids),
                create_sliding_window_causal_mask(*args, block_sequence_ids=ids))
    if kind == "gemma3":
        from transformers.models.gemma3.modeling_gemma3 import create_masks_for_vision_model
    else:
        from transformers.models.gemma4.modeling_gemma4 import create_masks_for_vision_model
    masks = create_masks_for_vision_model(*args, ids)
    return masks["full_attention"], masks["sliding_attention"]


@pytest.mark.parametrize("kind", ["gemma3", "gemma4", "paligemma2"])
def test_prompt_blocks_longer_than_the_window_get_the_models_own_masks(kind):
    """7-token blocks (an image; PaliGemma 2's prefix) in ragged prompts, a 3-slot window: the
    prompt pass's masks equal the model's own on every real query. Gemma 3: causal OR block
    (full layers), window AND (causal OR block) (sliding); Gemma 4 the same on its sliding
    layers alone; PaliGemma 2: window-causal OR block (the prefix past the window)."""
    from mmspec.cache import Blocks, SequenceMask, Window

    attn = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1, 1, 1], [1] * 10])
    ids = torch.full((2, 10), -1)
    ids[0, 2:9], ids[1, 1:8] = 0, 0
    blocks = dict(gemma3=Blocks(ids), gemma4=Blocks(ids, sliding_only=True),
                  paligemma2=Blocks(ids, past_window=True))[kind]
    ours, _ = SequenceMask.from_prompt(attn).plan(attn, None, Window(3), blocks)
    full, sliding = _models_own_block_masks(kind, ids, attn, 3)
    real = attn.bool()[:, None, :, None]
    assert ((full == ours["full_attention"]) | ~real).all()
    assert ((sliding == ours["sliding_attention"]) | ~real).all()
    assert not torch.equal(full & real, sliding & real)          # the window bites


def test_rollback_without_static_crop(monkeypatch):
    """transformers < 5.18, whose static layers have no crop: their write pointers move,
    and a dynamic cache's layers keep their own crop."""
    from transformers import DynamicCache, LlamaConfig, StaticCache
    from transformers.cache_utils import StaticLayer

    from mmspec.cache import crop

    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, vocab_size=64)
    monkeypatch.delattr(StaticLayer, "crop")
    static, dynamic = StaticCache(config=cfg, max_cache_len=8), DynamicCache(config=cfg)
    k = torch.ones(1, 2, 3, 16)
    for i in range(2):
        static.update(k, k, i)
        dynamic.update(k, k, i)
    crop(static, 2)
    crop(dynamic, 2)
    assert [int(layer.cumulative_length) for layer in static.layers] == [1, 1]
    assert dynamic.get_seq_length() == 1


def test_shared_write_pointer_cache_matches_a_static_cache():
    """``static_cache`` with a shared write pointer, driven as a session drives it (every
    layer's update, then one ``advance``; rollbacks by ``crop``; ``reset``), holds what a
    StaticCache of full-attention layers holds after the same writes (its sliding-window
    layer keeps every slot too: the window is the mask's); the shared pointer moves once
    per forward and per crop, and the layer's own crop refuses."""
    from transformers import LlamaConfig, StaticCache

    from mmspec.cache import SharedPointerLayer, advance, crop, reset, static_cache

    kw = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=2,
              num_key_value_heads=2, vocab_size=64)
    cfg = LlamaConfig(**kw, layer_types=["full_attention", "sliding_attention", "full_attention"],
                      sliding_window=4)
    full = LlamaConfig(**kw)
    ours, theirs = static_cache(cfg, 8), StaticCache(config=full, max_cache_len=8)
    assert [type(layer) is SharedPointerLayer for layer in ours.layers] == [True, True, True]
    g = torch.Generator().manual_seed(0)
    for n, remove in ((3, 0), (2, 1), (1, 2), (3, 0)):
        k, v = torch.randn(2, 1, 2, n, 16, generator=g)
        for cache in (ours, theirs):
            for i in range(3):
                cache.update(k, v, i)
        advance(ours, n)
        crop(ours, remove)
        crop(theirs, remove)
        assert ours.layers[0].cumulative_length is ours.layers[1].cumulative_length
        for a, b in zip(ours.layers, theirs.layers):
            assert int(a.get_seq_length()) == int(b.get_seq_length())
            assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
    assert int(ours.get_seq_length()) == (3 - 0) + (2 - 1) + (1 - 2) + (3 - 0)
    with pytest.raises(TypeError, match="share one write pointer"):
        ours.layers[0].crop(-1)
    reset(ours)
    assert int(ours.get_seq_length()) == 0 and not ours.layers[2].keys.any()


def test_reset_empties_a_static_cache_as_transformers_does():
    """``cache.reset`` (one zeroing call for the static layers) leaves a used cache as
    ``Cache.reset`` does; a sliding-window layer (a reset of its own) included."""
    from transformers import MistralConfig, StaticCache
    from transformers.cache_utils import StaticLayer

    from mmspec.cache import reset

    cfg = MistralConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=2, num_key_value_heads=2, vocab_size=64,
                        sliding_window=4)
    cfg.layer_types = ["full_attention", "sliding_attention"]
    ours, theirs = (StaticCache(config=cfg, max_cache_len=8) for _ in range(2))
    assert [type(layer).reset is StaticLayer.reset for layer in ours.layers] == [True, False]
    k = torch.randn(1, 2, 3, 16, generator=torch.Generator().manual_seed(0))
    for cache in (ours, theirs):
        for i in range(len(cache.layers)):
            cache.update(k, k, i)
    assert float(ours.layers[0].keys.abs().sum()) > 0
    reset(ours)
    theirs.reset()
    for a, b in zip(ours.layers, theirs.layers):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
        assert int(a.get_seq_length()) == int(b.get_seq_length()) == 0


def test_regional_wrappers_keep_no_model_alive():
    """The compiled wrappers kept for a model (``regions._made``) do not keep it alive."""
    import gc
    import weakref

    from transformers import LlamaConfig, LlamaForCausalLM

    from mmspec.engine import regions

    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, vocab_size=64)
    m = LlamaForCausalLM(cfg).eval()
    with torch.no_grad(), regions.compiled(m, {}, backend="eager"):
        m(torch.tensor([[1, 2, 3]]))
    layer = weakref.ref(m.model.layers[0])
    del m
    gc.collect()
    assert layer() is None
    torch._dynamo.reset()


def test_token_span_tables_live_with_the_static_cache():
    """A token-span session's id table is read inside captured chains: on a static cache it
    is the cache's buffer (one address for every call on that cache), not the session's."""
    import gc

    from mmspec.sessions import TokenSpanSession

    m = tiny_llama(vocab=32)
    ids = torch.tensor([[3, 4, 5]])
    ptrs = []
    for _ in range(2):
        s = TokenSpanSession(m, mmspec.SamplingParams(temperature=0), None,
                             torch.arange(8, 24), static_len=64)
        s.prefill(ids, torch.ones_like(ids))
        assert s.to_vocab is s._static.buffers["to_vocab"]
        assert torch.equal(s.to_vocab, torch.arange(8, 24))
        ptrs.append(s.to_vocab.data_ptr())
        del s
        gc.collect()
    assert ptrs[0] == ptrs[1]
    mmspec.release_graphs(m)


def test_which_prompt_passes_are_captured():
    """``CapturedSteps.captures_prompt``: a pass of 2 to ``capture_prompts_up_to`` tokens in all (rows x
    length) on a cache whose slots a first pass allocated, its ids alone, the session's
    prompt positions capturable, room for its shape among ``captured_prompts``."""
    from dataclasses import replace

    from mmspec.sessions import CaptureTraits, CausalLMSession
    from mmspec.sessions.captured import CapturedSteps

    t = tiny_llama(vocab=32)
    s = CausalLMSession(t, mmspec.SamplingParams(temperature=0), static_len=64)
    steps = CapturedSteps(s)                  # what a captured session asks
    ids = torch.randint(1, 32, (2, 5))
    ones = torch.ones_like(ids)
    inputs, valid = {"input_ids": ids[:, :4]}, ones[:, :4]
    s.prefill(ids[:, :1], ones[:, :1])        # a one-token prompt: the slots stay unallocated
    assert not steps.captures_prompt(inputs, valid, 64, {})
    s.prefill(ids, ones)                      # allocates them
    assert steps.captures_prompt(inputs, valid, 64, {})
    assert not steps.captures_prompt({"input_ids": ids[:, :1]}, valid[:, :1], 64, {})
    assert not steps.captures_prompt(inputs, valid, 64, {"pixel_values": ids})
    s.engine = replace(s.engine, capture_prompts_up_to=7)                   # 2 rows x 4 > 7
    assert not steps.captures_prompt(inputs, valid, 64, {})
    s.engine = replace(s.engine, capture_prompts_up_to=8)
    assert steps.captures_prompt(inputs, valid, 64, {})
    s._static.graphs[steps.graph_key({**inputs, "valid": valid}, 64, True)] = None
    s.engine = replace(s.engine, captured_prompts=1)
    assert steps.captures_prompt(inputs, valid, 64, {})                       # its own shape
    assert not steps.captures_prompt({"input_ids": ids[:, :3]}, valid[:, :3], 64, {})
    s.capture = CaptureTraits(prompt_graphs=False)
    assert not steps.captures_prompt(inputs, valid, 64, {})


@pytest.mark.parametrize("pipeline", [True, False])
def test_plain_steps_in_chains_give_plain_greedy_and_its_counts(pair, ragged_prompts, pipeline,
                                                               monkeypatch):
    """Plain decoding three target steps per launch (``Plan.steps_per_launch``; the chains run
    step by step here) gives plain greedy's tokens with rows ending on a stop token inside a
    chain and a budget ending mid-chain; the stats count every target step, the kept tokens
    as plain decoding counts them, and no row is fed past its budget."""
    from mmspec.engine import Plan

    target, _ = pair
    ids, mask = ragged_prompts
    run = dict(attention_mask=mask, temperature=0, max_new_tokens=10, pipeline=pipeline)
    free = mmspec.generate(target, None, ids, **run)
    stop = int(free.sequences[0, ids.shape[1] + 4])      # row 0's fifth token: mid-chain
    plain = mmspec.generate(target, None, ids, stop_token_ids=[stop], **run)
    monkeypatch.setattr(Plan, "steps_per_launch", lambda self, session, drafter: 3)
    for stops in ([], [stop]):
        chained = mmspec.generate(target, None, ids, stop_token_ids=stops, **run)
        want = free if not stops else plain
        assert torch.equal(chained.sequences, want.sequences), stops
        assert chained.stats.emitted == want.stats.emitted
        assert chained.stats.row_steps == want.stats.row_steps
        assert chained.stats.accepted == chained.stats.drafted == 0
    assert plain.generated(0).tolist()[-1] == stop           # row 0 ended on its stop
    assert mmspec.generate(target, None, ids, **run).stats.steps == 10       # 3 + 3 + 3 + 1


def test_a_plain_chain_settles_in_one_trace():
    """``loop.settle_chain`` (what ``chain_settler`` compiles under captured engines): every
    running row emits its chain, cut at its first stop token and its budget; rows that had
    ended emit nothing. Traced whole (``fullgraph``, backend ``aot_eager``) it gives the
    eager results."""
    import functools

    from mmspec.loop import HostValues, Stops, settle_chain

    stops = Stops((3,))
    tokens = torch.tensor([[5, 3, 7], [1, 2, 4], [4, 4, 4]])
    p = torch.nn.functional.one_hot(tokens, 8).float()
    state = (torch.tensor([0, 4, 5]), torch.tensor([True, True, False]), torch.tensor(6),
             torch.tensor(stops.ids))
    for ragged in (True, False):
        eager = functools.partial(settle_chain, stops, ragged)
        traced = torch.compile(eager, backend="aot_eager", dynamic=False, fullgraph=True)
        want, got = eager(tokens, p, *state), traced(tokens, p, *state)
        host = HostValues.unpack(want[3].tolist(), None)
        assert host.cut == [2, 2, 0] and host.running == [False, False, False]
        assert host.tokens == [[5, 3], [1, 2], []] and not host.bad
        assert want[1].produced.tolist() == [2, 6, 5]
        assert torch.equal(want[1].last, tokens[:, -1])
        for w, g in zip((want[0].tokens, want[1].produced, want[1].active, want[2], want[3]),
                        (got[0].tokens, got[1].produced, got[1].active, got[2], got[3])):
            assert torch.equal(w, g)


def test_the_greedy_rule_at_temperature_above_zero_is_refused_before_any_work(pair):
    """Sampling with rule 'greedy' would silently decode greedily: refused, naming the rule
    and the temperature (``mmspec.generate``; every front door meets the rule in
    ``mmspec.runner.prepare``)."""
    target, draft = pair
    ids = torch.tensor([[1, 2, 3]])
    for kw in (dict(rule="greedy"), dict(rule="greedy", temperature=0.7)):
        with pytest.raises(ValueError, match="rule 'greedy'.*temperature=0"):
            mmspec.generate(target, draft, ids, max_new_tokens=4, seed=0, **kw)
