"""One conformance suite over every registered rule (``mmspec.rules()``): registering a rule
puts it under test, built from its defaults as a method would build it (``from_params``).

Token rules, composed exactly in float64 from their own ``accept_prob`` and ``residual`` over
every draft token (real drafts and point masses, several positions):
- lossless rules emit their declared reference (``Rule.reference``: p; Greedy: the argmax);
- relaxed rules (``Relaxed``) stay within their declared ``tv_bound``;
- group-lossless rules (PCG) emit the target's group distribution;
- rules declaring ``exact_at`` give Exact's tokens bit for bit at those parameters;
- ``__call__`` samples the analytic distribution (chi-square, Monte Carlo).
Frame rules: the first emitted frame is distributed as the target's frame distribution
(factorised for ``Frame``, autoregressive for ``DepthFrame``; Monte Carlo). Vector rules: the
emitted latents follow the target density (Kolmogorov-Smirnov).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats as sstats

import mmspec
from mmspec.acceptance import DepthFrame, Exact, Relaxed
from mmspec.densities import GaussianMixture
from mmspec.distributions import Distribution
from mmspec.registry import MethodContext
from rule_checks import V, case, check_guarantee, emitted
from stats_util import chi_square_pvalue

RULES = {info.name: info for info in mmspec.rules()}
TOKEN = sorted(n for n, i in RULES.items() if i.event == "token")
FRAME = sorted(n for n, i in RULES.items() if i.event == "frame")
VECTOR = sorted(n for n, i in RULES.items() if i.event == "vector")


def build(name: str, emb: torch.Tensor, **params):
    info = RULES[name]
    return info.cls.from_params(params, MethodContext(embeddings=emb))


CASES = [dict(seed=s, sharp=sh, zeros=z) for s, sh, z in
         [(0, 2.0, False), (1, 0.5, False), (2, 4.0, True), (3, 1.0, True)]]


@pytest.mark.parametrize("name", TOKEN)
@pytest.mark.parametrize("c", range(len(CASES)))
@pytest.mark.parametrize("pos", [0, 2])
@pytest.mark.parametrize("point_mass", [False, True])
def test_token_rule_keeps_its_declared_guarantee(name, c, pos, point_mass):
    p, q, emb = case(**CASES[c])
    check_guarantee(build(name, emb), p, None if point_mass else q, pos)


def test_the_token_suite_covers_lossless_relaxed_and_group_rules():
    kinds = {(RULES[n].lossless, issubclass(RULES[n].cls, Relaxed)) for n in TOKEN}
    assert {(True, False), (False, True), (False, False)} <= kinds


@pytest.mark.parametrize("name", [n for n in TOKEN if RULES[n].cls.exact_at])
@pytest.mark.parametrize("point_mass", [False, True])
def test_degenerate_settings_give_exact_bit_for_bit(name, point_mass):
    g = torch.Generator().manual_seed(0)
    b, k = 64, 5
    p = torch.softmax(2 * torch.randn(b, k + 1, V, generator=g), -1)
    q = torch.softmax(2 * torch.randn(b, k, V, generator=g), -1)
    x = torch.multinomial(q.reshape(-1, V), 1, generator=g).reshape(b, k)
    rule = build(name, torch.randn(V, 3, generator=g), **RULES[name].cls.exact_at)
    qq = None if point_mass else q
    want = Exact()(x, qq, p, torch.Generator().manual_seed(7))
    got = rule(x, qq, p, torch.Generator().manual_seed(7))
    assert torch.equal(got.tokens, want.tokens) and torch.equal(got.num_accepted, want.num_accepted)


@pytest.mark.parametrize("name", TOKEN)
def test_token_rule_call_samples_its_analytic_distribution(name):
    p, q, emb = case(11)
    rule = build(name, emb)
    want = emitted(rule, p, q)
    n, g = 60_000, torch.Generator().manual_seed(1)
    x = torch.multinomial(q, n, replacement=True, generator=g)[:, None]
    out = rule(x, q.expand(n, 1, V), p.expand(n, 2, V), g)
    counts = torch.bincount(out.tokens[:, 0], minlength=V).numpy().astype(float)
    if float(want.max()) > 1 - 1e-12:          # a deterministic rule (greedy)
        assert counts[int(want.argmax())] == n
    else:
        assert chi_square_pvalue(counts, want.numpy()) > 1e-4


FUSED = sorted(n for n in TOKEN if RULES[n].cls.fuses)


def test_greedy_declares_that_it_fuses():
    """The trace test below runs over ``FUSED``: it must not be empty."""
    assert "greedy" in FUSED


@pytest.mark.parametrize("name", FUSED)
@pytest.mark.parametrize("k", [0, 3])
@pytest.mark.parametrize("ragged", [True, False])
def test_a_fusing_rule_settles_a_step_in_one_trace(name, k, ragged):
    """What ``loop.settler`` compiles under captured engines: the rule, the common prefix,
    stops, budgets and the packed transfer trace with no graph break (``fullgraph``) and
    give the eager results (backend ``aot_eager``: the trace, not a device's kernels)."""
    import functools

    from mmspec.loop import Stops, settle

    p, _, emb = case(5)
    rule, stops = build(name, emb), Stops((int(p.argmax()), V - 1))
    b = 3
    probs = p.float().expand(b, k + 1, V).clone()
    probs[1] = probs[1].roll(1, -1)
    x = probs.argmax(-1)[:, :k].clone()
    if k:
        x[1, 1:] = (x[1, 1:] + 1) % V          # row 1 (running) rejects at position 1
    state = (torch.tensor([0, 2, 5]), torch.tensor([True, True, False]), torch.tensor(6),
             torch.tensor(stops.ids))
    eager = functools.partial(settle, rule, stops, ragged)
    traced = torch.compile(eager, backend="aot_eager", dynamic=False, fullgraph=True)
    want, got = eager(x, None, probs, *state), traced(x, None, probs, *state)
    assert k == 0 or int(want[0].num_accepted[1]) < k        # a rejection is settled
    flat = [lambda r: r[0].tokens, lambda r: r[0].num_accepted, lambda r: r[1].last,
            lambda r: r[1].produced, lambda r: r[1].active, lambda r: r[2], lambda r: r[3]]
    assert all(torch.equal(f(got), f(want)) for f in flat)


def test_settler_compiles_a_fusing_rule_once_per_rule_stops_and_ragged():
    """``loop.settler``: a fusing rule's compiled function is shared by every call with the
    same rule, stops and ragged flag, and never sees the call's generator; other rules (and
    ``fuse=False``) settle op by op with the call's generator."""
    import functools

    from mmspec.acceptance import Greedy
    from mmspec.loop import Stops, settler

    g = torch.Generator()
    fused = settler(Greedy(), Stops((3,)), True, None, fuse=True)
    assert not isinstance(fused, functools.partial)
    assert settler(Greedy(), Stops((3,)), True, g, fuse=True) is fused
    assert settler(Greedy(), Stops((4,)), True, None, fuse=True) is not fused
    for rule, fuse in ((Exact(), True), (Greedy(), False)):
        plain = settler(rule, Stops(), True, g, fuse=fuse)
        assert isinstance(plain, functools.partial) and plain.keywords["generator"] is g


# -- frames -----------------------------------------------------------------------------------

C, VF = 2, 4


def _tables(seed: int):
    """Autoregressive frame tables: t0 [V] for codebook 0, t1 [V, V] for codebook 1 given 0."""
    g = torch.Generator().manual_seed(seed)
    t0 = torch.softmax(torch.randn(VF, generator=g, dtype=torch.float64), -1)
    t1 = torch.softmax(torch.randn(VF, VF, generator=g, dtype=torch.float64), -1)
    return t0, t1


class TabularFrames(Distribution):
    """The same autoregressive frame distribution at every position of a [B, n] batch."""

    def __init__(self, t0, t1, shape):
        self.t0, self.t1, self.shape, self.codebooks = t0, t1, torch.Size(shape), C

    @property
    def batch_shape(self):
        return self.shape

    def along(self, x):                                                      # [B, k, C]
        p0 = self.t0.expand(*x.shape[:2], VF)
        return torch.stack([p0, self.t1[x[..., 0]]], 2)

    def complete(self, pos, frame, first_free, generator=None):
        frame = frame.clone()
        x0 = torch.multinomial(self.t0.expand(len(frame), VF), 1, generator=generator)[:, 0]
        frame[:, 0] = torch.where(first_free <= 0, x0, frame[:, 0])
        x1 = torch.multinomial(self.t1[frame[:, 0]], 1, generator=generator)[:, 0]
        frame[:, 1] = torch.where(first_free <= 1, x1, frame[:, 1])
        return frame


def _draft_frames(q0, q1, n, g):
    x0 = torch.multinomial(q0.expand(n, VF), 1, generator=g)[:, 0]
    x1 = torch.multinomial(q1[x0], 1, generator=g)[:, 0]
    return torch.stack([x0, x1], -1), torch.stack([q0.expand(n, VF), q1[x0]], 1)


@pytest.mark.parametrize("name", FRAME)
def test_frame_rule_emits_the_target_frame_distribution(name):
    cls, n, g = RULES[name].cls, 60_000, torch.Generator().manual_seed(0)
    p0, p1 = _tables(1)
    q0, q1 = _tables(2)
    rule = cls.from_params({}, MethodContext())
    if issubclass(cls, DepthFrame):           # codebook 1 depends on codebook 0
        x, qx = _draft_frames(q0, q1, n, g)
        target, joint = TabularFrames(p0, p1, (n, 2)), p0[:, None] * p1
    else:                                     # parallel heads: independent codebooks
        p1, q1 = p1[0].expand(VF, VF), q1[0].expand(VF, VF)
        x, qx = _draft_frames(q0, q1, n, g)
        target = torch.stack([p0.expand(n, 2, VF), p1[0].expand(n, 2, VF)], 2)
        joint = p0[:, None] * p1[0][None]
    out = rule(x[:, None], qx[:, None], target, g)
    first = out.tokens[:, 0]
    counts = np.bincount((first[:, 0] * VF + first[:, 1]).numpy(), minlength=VF * VF)
    assert chi_square_pvalue(counts.astype(float), joint.reshape(-1).numpy()) > 1e-4


# -- vectors ----------------------------------------------------------------------------------

def _gaussian(mean, scale, *shape):
    m = torch.full((*shape, 1, 1), float(mean), dtype=torch.float64)
    return GaussianMixture(torch.zeros(*shape, 1, dtype=torch.float64), m,
                           torch.full_like(m, math.log(scale)))


@pytest.mark.parametrize("name", VECTOR)
def test_vector_rule_emits_the_target_density(name):
    rule = RULES[name].cls.from_params({}, MethodContext())
    n, k, g = 20_000, 2, torch.Generator().manual_seed(0)
    q = _gaussian(1.0, 1.5, n, k)
    out = rule(q.sample(g), q, _gaussian(0.0, 1.0, n, k + 1), g)
    first = out.tokens[:, 0, 0].numpy()
    assert sstats.kstest(first, sstats.norm(0, 1).cdf).pvalue > 1e-4
