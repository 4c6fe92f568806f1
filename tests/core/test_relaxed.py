"""Relaxed rules: each one's declared property, analytically in float64, plus bit-for-bit
degenerate settings, acceptance never below the exact rule's, and parameter validation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mmspec
from conftest import random_pq
from mmspec.acceptance import Annealed, CoarseGrained, Exact, Grouped, Lantern
from stats_util import chi_square_pvalue

V = 10


def rand_case(seed: int, v: int = V, d: int = 3, sharp: float = 2.0, zeros: bool = False):
    return random_pq(seed, v, d, sharp, zeros)


def emitted(rule, p, q, pos: int = 0):
    """Exact distribution of the token emitted at draft position ``pos`` (given earlier drafts
    were accepted), composed from the rule's own accept_prob and residual over every x."""
    v = p.shape[-1]
    xs = torch.arange(v)
    x = torch.zeros(v, pos + 1, dtype=torch.long)
    x[:, pos] = xs
    pp = p.expand(v, pos + 1, v)
    qq = None if q is None else q.expand(v, pos + 1, v)
    a = rule.accept_prob(x, pp, qq)[:, pos]                                   # [V]
    res = rule.residual(xs, p.expand(v, v), None if q is None else q.expand(v, v),
                        torch.full((v,), pos))                                 # [V(x), V]
    w = q if q is not None else None
    out = torch.zeros(v, dtype=torch.float64)
    for xi in range(v):
        wx = float(w[xi]) if w is not None else (1.0 if xi == int(p.argmin()) else 0.0)
        if wx == 0:
            continue
        out[xi] += wx * a[xi]
        out += wx * (1 - a[xi]) * res[xi]
    return out, a


def tv(a, b):
    return float(0.5 * (a - b).abs().sum())


def relaxed_tv_formula(a, p, q):
    return float((q * a - p).clamp_min(0).sum())


# -- declared bounds --------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("delta", [0.05, 0.2, 0.5])
def test_lantern_tv_within_declared_bound(seed, delta):
    p, q, emb = rand_case(seed, zeros=seed % 2 == 1)
    rule = Lantern(emb, k=4, delta=delta)
    o, a = emitted(rule, p, q)
    assert abs(float(o.sum()) - 1) < 1e-12
    t = tv(o, p)
    assert abs(t - relaxed_tv_formula(a, p, q)) < 1e-12   # the exact TV the docstring derives
    assert t <= float(rule.tv_bound(p[None], q[None])[0]) + 1e-12
    assert t <= delta * int((q > p).sum()) + 1e-12


@pytest.mark.parametrize("seed", range(4))
def test_lantern_point_mass_draft_within_delta(seed):
    p, _, emb = rand_case(seed)
    rule = Lantern(emb, k=5, delta=0.1)
    o, _ = emitted(rule, p, None)      # the draft is always argmin p (worst case for exact)
    assert tv(o, p) <= 0.1 + 1e-12


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("lam", [1.2, 2.0, 5.0])
def test_lantern_pp_tv_within_declared_bound(seed, lam):
    p, q, emb = rand_case(seed)
    rule = Lantern(emb, k=6, lam=lam)
    o, a = emitted(rule, p, q)
    t = tv(o, p)
    assert abs(t - relaxed_tv_formula(a, p, q)) < 1e-12
    assert t <= float(rule.tv_bound(p[None], q[None])[0]) + 1e-12
    assert t <= lam - 1 + 1e-12


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("pos", [0, 1, 3])
def test_annealed_tv_within_declared_bound(seed, pos):
    p, q, _ = rand_case(seed)
    rule = Annealed(delta=1.8, nu=0.3)
    o, a = emitted(rule, p, q, pos)
    w = max(1.0, 1.8 * np.exp(-0.3 * pos))
    t = tv(o, p)
    assert abs(t - relaxed_tv_formula(a, p, q)) < 1e-12
    assert t <= min(w - 1, tv(p, q)) + 1e-12
    assert t <= float(rule.tv_bound(p[None], q[None], pos)[0]) + 1e-12


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("monotone", [True, False])
def test_grouped_tv_formula_and_bound(seed, monotone):
    p, q, emb = rand_case(seed, sharp=1.0)
    rule = Grouped(emb, group_size=5, p_threshold=0.3, embed_threshold=1.5, monotone=monotone)
    o, a = emitted(rule, p, q)
    assert abs(float(o.sum()) - 1) < 1e-12
    if monotone:
        assert abs(tv(o, p) - relaxed_tv_formula(a, p, q)) < 1e-12
        assert tv(o, p) <= float(rule.tv_bound(p[None], q[None])[0]) + 1e-12


def test_grouped_window_at_the_ends_of_the_ranking():
    p = torch.softmax(torch.arange(10, dtype=torch.float64), -1)     # rank 0 = id 9
    rule = Grouped(None, group_size=4, p_threshold=1.0)
    ids, keep = rule.groups(torch.tensor([9, 0, 5]), p.expand(3, 10))
    assert ids[0].tolist() == [9, 8, 7, 6]       # top of the ranking: no wrap-around
    assert ids[1].tolist() == [3, 2, 1, 0]       # bottom of the ranking
    assert 5 in ids[2].tolist() and keep.all()


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("theta", [0.0, 0.45, 0.8])
def test_pcg_emitted_group_distribution_is_exact(seed, theta):
    p, q, emb = rand_case(seed, zeros=seed % 2 == 1)
    rule = CoarseGrained(emb, theta=theta)
    groups = rule.groups
    member = torch.zeros(V, V, dtype=torch.bool)                      # member[g, t]
    member[groups.rows, groups.cols] = True
    sizes = groups.sizes.double()
    pc, qc = rule.coarse(p[None])[0], rule.coarse(q[None])[0]
    assert abs(float(pc.sum()) - 1) < 1e-12
    ga = rule.group_accept(p[None], q[None])[0]
    rc = rule.coarse_residual(p[None], q[None])[0]
    # x ~ q, owner g uniform in S(x) = {g : x in G(g)}, accept g with ga[g], else g' ~ rc.
    out = torch.zeros(V, dtype=torch.float64)
    reject = 0.0
    for x in range(V):
        for g in range(V):
            if member[g, x]:
                w = float(q[x]) / float(sizes[x])
                out[g] += w * ga[g]
                reject += w * (1 - float(ga[g]))
    out += reject * rc
    assert float((out - pc).abs().max()) < 1e-12
    # The contract's per-token functions are the marginals of that process.
    x = torch.arange(V)
    a = rule.accept_prob(x[:, None], p.expand(V, 1, V), q.expand(V, 1, V))[:, 0]
    mean_ga = torch.stack([ga[member[:, t]].mean() for t in range(V)])
    assert float((a - mean_ga).abs().max()) < 1e-12
    r = rule.residual(x, p.expand(V, V), q.expand(V, V), torch.zeros(V, dtype=torch.long))[0]
    want = torch.zeros(V, dtype=torch.float64)
    for g in range(V):
        if pc[g] > 0:
            want += rc[g] * member[g].double() * p / sizes / pc[g]
    assert float((r - want / want.sum()).abs().max()) < 1e-12


# -- degenerate settings: the exact rule, analytically and bit for bit ---------------------

def degenerate_rules(emb):
    return [Lantern(emb, k=4, delta=0.0), Lantern(emb, k=0, delta=0.3), Lantern(emb, k=4, lam=1.0),
            Grouped(emb, group_size=1), CoarseGrained(emb, theta=1.0),
            Annealed(delta=1.0, nu=0.0, mu=0.0)]


@pytest.mark.parametrize("idx", range(6))
def test_degenerate_settings_are_exact(idx):
    p, q, emb = rand_case(3)
    rule = degenerate_rules(emb)[idx]
    o, _ = emitted(rule, p, q)
    assert float((o - p).abs().max()) < 1e-12


@pytest.mark.parametrize("idx", range(6))
@pytest.mark.parametrize("point_mass", [False, True])
def test_degenerate_settings_bit_for_bit(idx, point_mass):
    g = torch.Generator().manual_seed(0)
    b, k, v = 64, 5, V
    p = torch.softmax(2 * torch.randn(b, k + 1, v, generator=g), -1)
    q = torch.softmax(2 * torch.randn(b, k, v, generator=g), -1)
    x = torch.multinomial(q.reshape(-1, v), 1, generator=g).reshape(b, k)
    emb = torch.randn(v, 3, generator=g)
    rule = degenerate_rules(emb)[idx]
    qq = None if point_mass else q
    want = Exact()(x, qq, p, torch.Generator().manual_seed(7))
    got = rule(x, qq, p, torch.Generator().manual_seed(7))
    assert torch.equal(got.tokens, want.tokens) and torch.equal(got.num_accepted, want.num_accepted)


# -- acceptance never below the exact rule's ------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), sharp=st.floats(0.1, 4.0), zeros=st.booleans(),
       param=st.floats(0.0, 1.0))
def test_acceptance_never_below_exact(seed, sharp, zeros, param):
    p, q, emb = rand_case(seed, sharp=sharp, zeros=zeros)
    x = torch.arange(V)[:, None]
    pp, qq = p.expand(V, 1, V), q.expand(V, 1, V)
    exact = Exact().accept_prob(x, pp, qq)[:, 0]
    rules = [Lantern(emb, k=5, delta=param), Lantern(emb, k=5, lam=1 + 3 * param),
             Grouped(emb, group_size=1 + int(8 * param)),
             Annealed(delta=0.5 + 3 * param, nu=0.5)]
    for rule in rules:  # per token
        a = rule.accept_prob(x, pp, qq)[:, 0]
        assert bool((a >= exact - 1e-12).all()), rule
    pcg = CoarseGrained(emb, theta=2 * param - 1)       # in expectation over x ~ q
    a = pcg.accept_prob(x, pp, qq)[:, 0]
    assert float((q * a).sum()) >= float((q * exact).sum()) - 1e-12


# -- the stochastic composition and the models ----------------------------------------------

@pytest.mark.parametrize("make", [lambda e: Lantern(e, k=4, delta=0.2),
                                  lambda e: Grouped(e, group_size=4, p_threshold=0.5, embed_threshold=1.5),
                                  lambda e: CoarseGrained(e, theta=0.3),
                                  lambda e: Annealed(delta=1.5)])
def test_rule_call_samples_its_analytic_distribution(make):
    p, q, emb = rand_case(11)
    rule = make(emb)
    want, _ = emitted(rule, p, q)
    n = 100_000
    g = torch.Generator().manual_seed(1)
    x = torch.multinomial(q, n, replacement=True, generator=g)[:, None]
    out = rule(x, q.expand(n, 1, V), torch.cat([p, p])[None].reshape(1, 2, V).expand(n, 2, V), g)
    counts = torch.bincount(out.tokens[:, 0], minlength=V).numpy().astype(float)
    assert chi_square_pvalue(counts, want.numpy()) > 1e-4


@pytest.mark.parametrize("name", ["lantern", "gsd", "pcg", "annealed"])
def test_relaxed_rules_run_in_generate_with_a_draft_model(name, pair, ragged_prompts):
    target, draft = pair
    ids, mask = ragged_prompts
    emb = target.get_input_embeddings().weight.detach()
    kwargs = {"annealed": {}, "lantern": {"embeddings": emb, "k": 5}}.get(name, {"embeddings": emb})
    rule = mmspec.make_rule(name, **kwargs)
    exact = mmspec.generate(target, draft, ids, attention_mask=mask, max_new_tokens=30,
                            num_draft_tokens=3, seed=0)
    out = mmspec.generate(target, draft, ids, attention_mask=mask, max_new_tokens=30,
                          num_draft_tokens=3, seed=0, rule=rule)
    assert out.num_generated.tolist() == [30, 30, 30]
    assert out.stats.acceptance_rate > 0


# -- validation ---------------------------------------------------------------------------

@pytest.mark.parametrize("build,match", [
    (lambda e: Lantern(e, k=4, delta=1.5), r"delta=1.5.*\[0, 1\]"),
    (lambda e: Lantern(e, k=4, delta=-0.1), r"delta=-0.1.*\[0, 1\]"),
    (lambda e: Lantern(e, k=-1), r"k=-1.*\[0, 9\]"),
    (lambda e: Lantern(e, k=10), r"k=10.*\[0, 9\]"),
    (lambda e: Lantern(e, k=2, delta=0.1, lam=2.0), "not both"),
    (lambda e: Lantern(e, k=2, lam=0.5), r"lam=0.5.*>= 1"),
    (lambda e: CoarseGrained(e, theta=1.5), r"theta=1.5.*\[-1, 1\]"),
    (lambda e: Grouped(e, group_size=0), r"group_size=0.*>= 1"),
    (lambda e: Grouped(e, p_threshold=0.0), r"p_threshold=0.0"),
    (lambda e: Annealed(delta=0.0), r"delta=0.0.*> 0"),
    (lambda e: Annealed(delta=2.0, nu=-1.0), r"nu=-1.0.*>= 0"),
    (lambda e: Lantern(torch.randn(10), k=2), r"embeddings must be a \[V, d\] tensor"),
    (lambda e: Lantern(torch.full((10, 2), float("nan")), k=2), "NaN or inf"),
])
def test_parameter_validation(build, match):
    emb = torch.randn(V, 3)
    with pytest.raises(ValueError, match=match):
        build(emb)


@pytest.mark.parametrize("build", [lambda e: Lantern(e, k=2), lambda e: Grouped(e, group_size=2),
                                   lambda e: CoarseGrained(e, theta=0.5)])
def test_table_rows_must_match_vocabulary(build):
    rule = build(torch.randn(12, 3))
    p = torch.full((1, 2, V), 1 / V)
    with pytest.raises(ValueError, match=r"embeddings has 12 rows but the distributions have V = 10"):
        rule(torch.tensor([[1]]), None, p)


def test_knn_index_is_nearest_first_and_excludes_self():
    from mmspec.acceptance.geometry import knn_index

    e = torch.tensor([[0.0], [1.0], [3.0], [10.0]])
    idx = knn_index(e, 2)
    assert idx.tolist() == [[1, 2], [0, 2], [1, 0], [2, 1]]
    big = torch.randn(2048, 8)
    assert knn_index(big, 100).shape == (2048, 100)
