"""Analytic exactness of the exact rule (float64, enumeration of every draft and branch).

The rule's own ``accept_prob`` and ``residual`` are composed over every draft token, every
accept/reject branch and every recovered or bonus token; the distribution of the first one and
two emitted tokens must equal the target's to 1e-12. ``Rule.__call__`` (the stochastic
composition of the same two functions) is checked by the saturated cases below and the Monte
Carlo tests.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from mmspec.acceptance import Exact, Greedy
from mmspec.types import PAD
from rule_checks import Tables


def emitted_distribution(rule, tables: Tables, k: int, m: int, point_mass: bool = False):
    """{token tuple of length m: probability} for the first m emitted tokens."""
    v = tables.v
    ids = torch.arange(v)

    def go(prefix: tuple, drafts_left: int, m_left: int, out: dict, w: float, path: tuple):
        if m_left == 0:
            out[path] = out.get(path, 0.0) + w
            return
        p, q = tables.get(prefix)
        if drafts_left == 0:  # bonus token from p, then a fresh step
            for y in range(v):
                if p[y] > 0:
                    go(prefix + (y,), k, m_left - 1, out, w * float(p[y]), path + (y,))
            return
        if point_mass:  # a deterministic draft token, q(x) = 1
            xs = [int(q.argmax())]
            qx = [1.0]
            qq = None
        else:
            xs = [x for x in range(v) if q[x] > 0]
            qx = [float(q[x]) for x in xs]
            qq = q.expand(len(xs), v)[:, None]
        x_t = torch.tensor(xs)[:, None]
        a = rule.accept_prob(x_t, p.expand(len(xs), v)[:, None], qq)[:, 0]
        res = rule.residual(x_t[:, 0], p.expand(len(xs), v), None if qq is None else qq[:, 0],
                            torch.zeros(len(xs), dtype=torch.long))
        for i, x in enumerate(xs):
            wa = w * qx[i] * float(a[i])
            if wa > 0:
                go(prefix + (x,), drafts_left - 1, m_left - 1, out, wa, path + (x,))
            wr = w * qx[i] * (1 - float(a[i]))
            if wr > 0:
                for y in range(v):
                    if res[i, y] > 0:
                        go(prefix + (y,), k, m_left - 1, out, wr * float(res[i, y]), path + (y,))

    out: dict = {}
    go((), k, m, out, 1.0, ())
    return out


def target_distribution(tables: Tables, m: int) -> dict:
    out = {}
    for path in itertools.product(range(tables.v), repeat=m):
        w = 1.0
        for i in range(m):
            w *= float(tables.get(path[:i])[0][path[i]])
        if w > 0:
            out[path] = w
    return out


def assert_same(a: dict, b: dict, tol=1e-12):
    keys = set(a) | set(b)
    worst = max(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in keys)
    assert worst < tol, f"max abs difference {worst}"


CASES = [
    ("dense", "dense", "random"),
    ("dense", "zeros", "random"),     # q with zeros
    ("zeros", "dense", "random"),     # p with zeros
    ("zeros", "zeros", "random"),
    ("dense", "dense", "equal"),      # p == q
    ("dense", "dense", "disjoint"),   # disjoint supports
    ("dense", "onehot", "random"),
]


@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("p_kind,q_kind,relation", CASES)
def test_exact_first_two_tokens(k, p_kind, q_kind, relation):
    v = 6 if k == 8 else 9
    tables = Tables(v, seed=k, p_kind=p_kind, q_kind=q_kind, relation=relation)
    rule = Exact()
    for m in (1, 2):
        got = emitted_distribution(rule, tables, k, m)
        assert_same(got, target_distribution(tables, m))


@pytest.mark.parametrize("k", [1, 3])
def test_exact_point_mass_draft(k):
    tables = Tables(12, seed=3, p_kind="dense", q_kind="dense", relation="random")
    got = emitted_distribution(Exact(), tables, k, 2, point_mass=True)
    assert_same(got, target_distribution(tables, 2))


def test_analytic_check_detects_a_wrong_residual():
    """The enumeration is able to fail: a rule that resamples from p on rejection is biased."""

    class ResampleFromP(Exact):
        def residual(self, x, p, q, pos):
            return p

    tables = Tables(8, seed=1, p_kind="dense", q_kind="dense", relation="random")
    got = emitted_distribution(ResampleFromP(), tables, 2, 1)
    want = target_distribution(tables, 1)
    assert max(abs(got.get(kk, 0) - want.get(kk, 0)) for kk in want) > 1e-3


# -- the stochastic composition (Rule.__call__) -------------------------------------------

def test_saturated_accept_all_then_bonus():
    v, k = 10, 4
    drafts = torch.tensor([[1, 2, 3, 4]])
    p = torch.zeros(1, k + 1, v, dtype=torch.float64)
    p[0, torch.arange(k), drafts[0]] = 1
    p[0, k, 7] = 1
    q = p[:, :k].clone()
    out = Exact()(drafts, q, p, torch.Generator().manual_seed(0))
    assert out.num_accepted.tolist() == [4]
    assert out.tokens.tolist() == [[1, 2, 3, 4, 7]]


@pytest.mark.parametrize("j", [0, 1, 3])
def test_saturated_reject_at_j_gives_recovered(j):
    v, k = 10, 4
    drafts = torch.tensor([[1, 2, 3, 4]])
    p = torch.zeros(1, k + 1, v, dtype=torch.float64)
    p[0, torch.arange(k), drafts[0]] = 1
    p[0, j] = 0
    p[0, j, 9] = 1            # the target is sure of 9 at position j
    p[0, k, 7] = 1
    q = torch.zeros(1, k, v, dtype=torch.float64)
    q[0, torch.arange(k), drafts[0]] = 1
    for rule in (Exact(), Greedy()):
        out = rule(drafts, q, p, torch.Generator().manual_seed(0))
        assert out.num_accepted.tolist() == [j]
        assert out.tokens[0, :j].tolist() == drafts[0, :j].tolist()
        assert int(out.tokens[0, j]) == 9
        assert (out.tokens[0, j + 1:] == PAD).all()


def test_rule_call_monte_carlo_first_token():
    """u < a, the cumulative product and the recovered sample, on 200k identical rows."""
    g = torch.Generator().manual_seed(0)
    v, k, n = 6, 2, 200_000
    p = torch.rand(k + 1, v, generator=g, dtype=torch.float64) ** 2
    p /= p.sum(-1, keepdim=True)
    q = torch.rand(k, v, generator=g, dtype=torch.float64) ** 2
    q /= q.sum(-1, keepdim=True)
    x = torch.multinomial(q, n, replacement=True, generator=g).T                 # [n, k]
    out = Exact()(x, q.expand(n, k, v), p.expand(n, k + 1, v), g)
    first = torch.bincount(out.tokens[:, 0], minlength=v).double() / n
    assert (first - p[0]).abs().max() < 5 * (0.25 / n) ** 0.5
    # second emitted token when the first draft was accepted: p_2 marginal (same for all x_1)
    acc = out.num_accepted >= 1
    second = torch.bincount(out.tokens[acc, 1], minlength=v).double() / int(acc.sum())
    assert (second - p[1]).abs().max() < 5 * (0.25 / int(acc.sum())) ** 0.5


def test_greedy_rule_is_deterministic_and_matches_argmax():
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(4, 4, 7, generator=g), -1)
    drafts = p[:, :3].argmax(-1)
    drafts[1, 1] = (drafts[1, 1] + 1) % 7
    out = Greedy()(drafts, None, p)
    assert out.num_accepted.tolist() == [3, 1, 3, 3]
    assert int(out.tokens[1, 1]) == int(p[1, 1].argmax())
    assert int(out.tokens[0, 3]) == int(p[0, 3].argmax())


def test_exact_under_a_one_hot_target_is_the_greedy_chain():
    """The loop swaps Exact for Greedy when the target is greedy (its p one-hot): for any q
    (one-hot, dense or a point mass) and any draws, exact verification emits the same tokens."""
    g = torch.Generator().manual_seed(1)
    b, k, v = 64, 4, 5
    best = torch.randint(v, (b, k + 1), generator=g)
    p = torch.zeros(b, k + 1, v, dtype=torch.float64).scatter_(-1, best[..., None], 1.0)
    # drafts that agree with the argmax for a random number of leading positions
    drafts = torch.randint(v, (b, k), generator=g)
    agree = torch.rand(b, k, generator=g) < 0.7
    drafts = torch.where(agree, best[:, :k], drafts)
    dense = torch.softmax(torch.randn(b, k, v, generator=g, dtype=torch.float64), -1)
    dense.scatter_(-1, drafts[..., None], 0.3)                  # q(x) > 0 where x was drafted
    dense /= dense.sum(-1, keepdim=True)
    one_hot = torch.zeros(b, k, v, dtype=torch.float64).scatter_(-1, drafts[..., None], 1.0)
    want = Greedy()(drafts, None, p)
    n_want = (drafts == best[:, :k]).long().cumprod(1).sum(1)
    assert torch.equal(want.num_accepted, n_want) and 0 < int(n_want.sum()) < b * k
    for q in (None, dense, one_hot):
        for seed in range(3):
            got = Exact()(drafts, q, p, torch.Generator().manual_seed(seed))
            assert torch.equal(got.tokens, want.tokens)
            assert torch.equal(got.num_accepted, want.num_accepted)
