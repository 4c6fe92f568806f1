"""One conformance suite over every registered Jacobi method (``mmspec.registry``'s drafters of
the Jacobi family: ``sjd``, ``sjd-maximal``, ``sjd-gumbel``, ``sjd-continue``, ``sjd-proactive``
and any registered later), each built as a method builds it (``build_method``, its preset
parameters) with small windows and trees.

- Analytic (float64 enumeration, ``jacobi_checks.enumerate_method``, on order-2 tables): a
  method the registry declares lossless (``Method.lossless``) emits exactly the target's
  distribution of its first tokens; a relaxed one (``sjd-continue``) differs from it, within
  (m - 1) delta (docs/METHODS.md, section 3). The Gumbel coupling keeps a continuous table per
  position across steps, which no finite enumeration follows: its methods are checked by
  Monte Carlo only (``ENUMERABLE``).
- Monte Carlo: the registered drafter itself, with the method's rule, on the same tables,
  samples the enumerated distribution (chi-square), lossless methods the target's.
- End to end on a tiny Llama: greedy decoding equals plain greedy decoding (ragged rows;
  guidance on static caches); sampled with guidance, the tree methods emit the guided
  target's distribution (the chain couplings: ``tests/drafters/test_jacobi.py``).
- The checks can fail: children recorded with the wrong q are caught by both.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mmspec
from jacobi_checks import (ENUMERABLE, as_array, drive, enumerate_method, model_counts,
                           model_distribution, sensitivity, tables, target, tv)
from mmspec.drafters.jacobi import Jacobi, ProactiveJacobi
from mmspec.registry import MethodContext, build_method, drafter_names, parse_method
from stats_util import chi_square_pvalue

V = 3


def drafter_class(name: str) -> type:
    return parse_method(name, has_draft=True, has_head=True).drafter_class


JACOBI = [n for n in drafter_names() if issubclass(drafter_class(n), Jacobi)]
# Small trees for the tables (V = 3): the default branch (4 > V) leaves children without
# mass, which the enumeration follows too (``test_children_without_mass``).
SMALL = {"tree_branch": 2, "tree_depth": 2}


def build(name: str, window: int, tree: dict | None = None, **params):
    """The method's drafter and rule, as the registry builds them for a V-id target (``tree``:
    tree parameters over ``SMALL``, for the tree methods)."""
    if issubclass(drafter_class(name), ProactiveJacobi):
        params = {**SMALL, **(tree or {}), **params}
    drafter, rule, _ = build_method(name, {"window": window, **params},
                                    MethodContext(jacobi={"init_range": (0, V)}))
    return drafter, rule


def model_of(drafter) -> dict:
    """The enumeration's settings for a registered drafter; a class the enumeration does not
    model fails here (add it to ``jacobi_checks``)."""
    kw = dict(window=drafter.window, coupling=drafter.coupling,
              continuation=drafter.continuation)
    if type(drafter) is ProactiveJacobi:
        return dict(kw, branch=drafter.branch, depth=drafter.depth, spines=drafter.spines)
    assert type(drafter) is Jacobi, f"{type(drafter).__name__}: no enumeration model"
    return kw


def lossless(name: str) -> bool:
    return parse_method(name, {"window": 2}, has_draft=False).lossless


def test_the_suite_covers_the_jacobi_family():
    assert {"sjd", "sjd-maximal", "sjd-gumbel", "sjd-continue", "sjd-proactive"} <= set(JACOBI)
    assert {lossless(n) for n in JACOBI} == {True, False}


CASES = [(3, 2, 3, 0), (3, 3, 3, 1), (4, 2, 2, 2)]          # (V, window, tokens, seed)
# The methods the enumeration models: every coupling but Gumbel's (a continuous table per
# position, kept across steps), which the Monte Carlo checks alone cover.
ENUMERATED = [n for n in JACOBI if model_of(build(n, 2)[0])["coupling"] in ENUMERABLE]


def test_only_gumbel_couplings_are_left_to_monte_carlo():
    left = {n: model_of(build(n, 2)[0])["coupling"] for n in JACOBI if n not in ENUMERATED}
    assert set(left.values()) <= {"gumbel"} and "sjd-proactive" in ENUMERATED, left


@pytest.mark.parametrize("name", ENUMERATED)
@pytest.mark.parametrize("v,window,m,seed", CASES)
def test_the_enumerated_distribution_keeps_the_declared_guarantee(name, v, window, m, seed):
    drafter, _ = build(name, window)
    kw = model_of(drafter)
    T = tables(v, seed)
    got, want = enumerate_method(T, m, **kw), target(T, m)
    assert abs(sum(got.values()) - 1) < 1e-12
    if lossless(name):
        assert tv(got, want) < 1e-12
    else:
        assert 1e-6 < tv(got, want) <= (m - 1) * sensitivity(T) + 1e-12


@pytest.mark.parametrize("name", JACOBI)
def test_the_drafter_samples_its_distribution(name):
    """60,000 rows of the registered drafter on order-2 tables, window 3, the first 3 tokens."""
    drafter, rule = build(name, 3)
    kw = model_of(drafter)
    T, m = tables(V, 1), 3
    counts = drive(drafter, rule, T, m, 60_000, seed=0)
    exact = as_array(target(T, m), V, m)
    if kw["coupling"] in ENUMERABLE:
        assert chi_square_pvalue(counts, as_array(enumerate_method(T, m, **kw), V, m)) > 1e-4
    if lossless(name):
        assert chi_square_pvalue(counts, exact) > 1e-4
    else:                              # and the sample tells it apart from the target
        assert chi_square_pvalue(counts, exact) < 1e-6


def test_children_without_mass():
    """The default branch (4) on 3 ids: children past q's support repeat child 0 as a point
    mass; exact in the enumeration and in the drafter's own draws."""
    drafter, rule = build("sjd-proactive", 3, {"tree_branch": 4})
    T, m = tables(V, 2), 3
    kw = model_of(drafter)
    assert kw["branch"] == 4
    assert tv(enumerate_method(T, m, **kw), target(T, m)) < 1e-12
    counts = drive(drafter, rule, T, m, 40_000, seed=1)
    assert chi_square_pvalue(counts, as_array(target(T, m), V, m)) > 1e-4


# -- the checks can fail ----------------------------------------------------------------------

class WrongQ(ProactiveJacobi):
    """Draws the children without replacement but records each with the full q (as if drawn
    i.i.d.): not the q they were drawn from."""

    def _siblings(self, levels):
        tok, q = super()._siblings(levels)
        return tok, self.q[:, :levels, None].expand_as(q)


def test_the_checks_catch_children_with_the_wrong_q(monkeypatch):
    import jacobi_checks

    T, m = tables(V, 0), 3
    real = jacobi_checks._siblings

    def wrong(token, q, branch):
        return [((t, tuple(tuple(q) for _ in qs)), w) for (t, qs), w in real(token, q, branch)]

    monkeypatch.setattr(jacobi_checks, "_siblings", wrong)
    assert tv(enumerate_method(T, m, window=3, **{"branch": 2, "depth": 2}), target(T, m)) > 1e-2
    drafter = WrongQ(3, coupling="maximal", init_range=(0, V), **SMALL)
    counts = drive(drafter, mmspec.Exact(), T, m, 60_000, seed=0)
    assert chi_square_pvalue(counts, as_array(target(T, m), V, m)) < 1e-6


# -- end to end on a tiny model ---------------------------------------------------------------

@pytest.mark.parametrize("name", JACOBI)
def test_greedy_equals_plain_greedy(pair, ragged_prompts, name):
    """Ragged rows on dynamic caches; two guided rows on static caches."""
    target_model, _ = pair
    ids, mask = ragged_prompts
    kw = dict(temperature=0, max_new_tokens=20)
    plain = mmspec.generate(target_model, None, ids, attention_mask=mask, **kw)
    for window in (2, 6):
        drafter, rule = build(name, window, init_range=(0, 16))
        out = mmspec.generate(target_model, None, ids, attention_mask=mask, seed=1,
                              drafter=drafter, rule=rule.name, **kw)
        assert torch.equal(out.sequences, plain.sequences), window
    ids, un = torch.tensor([[1, 2, 3], [4, 3, 2]]), torch.tensor([[0, 0, 5], [0, 0, 5]])
    kw = dict(kw, guidance_scale=2.5, uncond_input_ids=un, static_cache=True)
    plain = mmspec.generate(target_model, None, ids, **kw)
    drafter, rule = build(name, 5, {"tree_branch": 3}, init_range=(0, 16))
    out = mmspec.generate(target_model, None, ids, seed=0, drafter=drafter, rule=rule.name, **kw)
    assert torch.equal(plain.sequences, out.sequences)


TREES = [n for n in JACOBI if drafter_class(n).trees]


@pytest.mark.parametrize("name", TREES)
def test_guided_trees_sample_the_guided_target(name):
    """20,000 guided rows of a 6-id tiny Llama through ``mmspec.generate`` (tree steps on the
    session, paths committed, ragged accepted lengths): the first 3 tokens follow the guided
    target's distribution."""
    from conftest import tiny_llama

    model = tiny_llama(vocab=6, hidden=32, seed=5, scale=5.0)
    prompt, uncond, n = [1, 2, 3], [0, 0, 5], 20_000
    exact = model_distribution(model, prompt, guidance=2.5, uncond=uncond)
    drafter, rule = build(name, 4, {"tree_branch": 3}, init_range=(0, 6))
    counts, stats = model_counts(model, prompt, drafter, n, seed=3, rule=rule.name,
                                 guidance_scale=2.5,
                                 uncond_input_ids=torch.tensor(uncond).expand(n, -1).contiguous())
    assert stats.acceptance_rate > 0.05 and stats.tokens_per_step > 1.5
    assert chi_square_pvalue(counts, exact) > 1e-4
