"""SJD-PAC's adaptive continuation decided by float64 enumeration (docs/METHODS.md, section 3).

The target is a first-order chain given as explicit tables: p(x_1) = T[s0] and
p(x_{t+1} | x_{<=t}) = T[x_t], so a distribution computed given a stale draft differs from the
one given the emitted token. The enumeration follows ``Jacobi`` with the maximal coupling and
``continuation=c`` step by step over every branch (uniform initial drafts with one-hot q, the
exact rule's accept / residual / bonus, the coupling's keep / redraw, forced slots with q = 0),
and gives the exact distribution of the first m emitted tokens.

- c = 0 (the maximal coupling; SJD-PAC's released code, which commits only up to the first
  rejection and keeps the stale-tested tail as the next drafts): equal to the target's to 1e-12.
- c >= 1 (the window's tokens that pass their stale tests are committed, method
  ``sjd-continue``): not lossless. The counterexample below has TV > 0; every case stays within
  the hybrid bound B = sum over forced tokens of E[TV(stale p, p given the emitted prefix)],
  and B <= (m - 1) delta, delta = max_{a, b} TV(T[a], T[b]) (the target's sensitivity to one
  token).
- Monte Carlo: the ``Jacobi`` drafter itself with the exact rule, driven by the same tables,
  samples the enumerated distribution (so the implementation is the process analysed).
- Proactive drafting at one position: siblings drawn as the released sampler draws them, verified
  by the tree rule, are not lossless once fresh and stale distributions differ; siblings drawn
  from p_stale without replacement are.
"""

from __future__ import annotations

import itertools
from collections import defaultdict

import numpy as np
import pytest
import torch

import mmspec
from mmspec.acceptance import Exact
from mmspec.drafters.jacobi import Jacobi
from mmspec.registry import MethodContext, build_method, parse_method
from mmspec.types import VerifyOutput
from stats_util import chi_square_pvalue

S0 = 0                      # the prompt's last token


def _ratio(num: float, den: float) -> float:
    """min(1, num / den) with 0/0 -> 0 and c/0 -> 1 (``Rule.ratio``)."""
    if den > 0:
        return min(1.0, num / den)
    return 1.0 if num > 0 else 0.0


def _residual(p: tuple, q: tuple) -> tuple:
    r = [max(0.0, a - b) for a, b in zip(p, q)]
    s = sum(r)
    return tuple(x / s for x in r) if s > 0 else p


def _tv(a, b) -> float:
    return 0.5 * sum(abs(x - y) for x, y in zip(a, b))


def enumerate_jacobi(T: np.ndarray, window: int, m: int, continuation: int):
    """(distribution of the first m emitted tokens {tuple: prob}, hybrid bound B)."""
    v, L = T.shape[0], window
    rows = [tuple(float(x) for x in r) for r in T]
    zero = (0.0,) * v
    onehot = [tuple(1.0 if i == j else 0.0 for i in range(v)) for j in range(v)]
    out: dict = defaultdict(float)
    bound = 0.0
    # state: (emitted path, window ((token, q, stale p), ...)) -> probability
    frontier: dict = defaultdict(float)
    for xs in itertools.product(range(v), repeat=L):
        frontier[((), tuple((x, onehot[x], None) for x in xs))] += v ** -L
    while frontier:
        (path, win), w0 = frontier.popitem()
        last = path[-1] if path else S0
        p = [rows[last]] + [rows[x] for x, _, _ in win]               # p_0 .. p_K (K = L)
        outcomes = []                                                 # (emitted, n, weight)

        def verify(i, w, emitted):
            nonlocal bound
            if i == L:
                for y in range(v):
                    outcomes.append((emitted + (y,), L, w * p[L][y]))
                return
            x, q, stale = win[i]
            t = len(path) + i
            if stale is not None and t < m:        # a forced token reached at position t
                prev = emitted[-1] if emitted else last
                bound += w * _tv(stale, rows[prev])
            a = _ratio(p[i][x], q[x])
            if a > 0:
                verify(i + 1, w * a, emitted + (x,))
            if a < 1:
                r = _residual(p[i], q)
                for y in range(v):
                    if r[y] > 0:
                        outcomes.append((emitted + (y,), i, w * (1 - a) * r[y]))

        verify(0, w0, ())
        for emitted, n, w in outcomes:
            new_path = path + emitted
            if len(new_path) >= m:
                out[new_path[:m]] += w
                continue
            # the refreshed window, slot by slot (the coupling's keep / redraw branches)
            partial = [((), 0, w)]                  # (slots so far, redraws among covered, w)
            for s in range(L):
                o = n + 1 + s
                has_p, has_old = o <= L, o < L
                nxt = []
                for slots, red, ww in partial:
                    if has_p:
                        pn = p[o]
                        choices = []                # (token, redrawn, weight)
                        if has_old:
                            x, q, _ = win[o]
                            a = _ratio(pn[x], q[x])
                            if a > 0:
                                choices.append((x, False, a))
                            if a < 1:
                                r = _residual(pn, q)
                                choices += [(y, True, (1 - a) * r[y]) for y in range(v) if r[y] > 0]
                        else:
                            choices = [(y, True, pn[y]) for y in range(v) if pn[y] > 0]
                        for y, redrawn, cw in choices:
                            forced = continuation > 0 and red < continuation
                            slot = (y, zero, pn) if forced else (y, pn, None)
                            nxt.append((slots + (slot,), red + redrawn, ww * cw))
                    elif has_old:
                        nxt.append((slots + (win[o],), red, ww))
                    else:                           # a fresh uniform draft, one-hot q
                        nxt += [(slots + ((y, onehot[y], None),), red, ww / v) for y in range(v)]
                partial = nxt
            for slots, _, ww in partial:
                frontier[(new_path, slots)] += ww
    return dict(out), bound


def target(T: np.ndarray, m: int) -> dict:
    out = {}
    for path in itertools.product(range(T.shape[0]), repeat=m):
        w, prev = 1.0, S0
        for x in path:
            w, prev = w * float(T[prev, x]), x
        out[path] = w
    return out


def tv(a: dict, b: dict) -> float:
    return 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


def sensitivity(T: np.ndarray) -> float:
    """delta: the largest TV between next-token distributions after two different tokens."""
    return max(_tv(T[a], T[b]) for a in range(len(T)) for b in range(len(T)))


def random_tables(v: int, seed: int, sharp: float = 2.0) -> np.ndarray:
    g = np.random.default_rng(seed)
    t = np.exp(sharp * g.standard_normal((v, v)))
    return t / t.sum(1, keepdims=True)


# The counterexample (docs/METHODS.md): V = 3, window 2, first 3 tokens, c = 1. A "sticky"
# chain: after token a the next token is a with probability 0.9.
STICKY = np.array([[0.9, 0.05, 0.05],
                   [0.05, 0.9, 0.05],
                   [0.05, 0.05, 0.9]])

CASES = [(v, L, m, seed) for v, L, m in [(3, 2, 3), (3, 3, 3), (4, 2, 3), (3, 4, 3), (5, 2, 2)]
         for seed in range(2)]


@pytest.mark.parametrize("v,L,m,seed", CASES)
def test_continuation_zero_is_lossless(v, L, m, seed):
    """The maximal coupling (the stale test decides the next drafts, nothing is committed
    past the first rejection): exactly the target, and no forced token (B = 0)."""
    T = random_tables(v, seed)
    got, bound = enumerate_jacobi(T, L, m, continuation=0)
    assert abs(sum(got.values()) - 1) < 1e-12
    assert tv(got, target(T, m)) < 1e-12 and bound == 0.0


@pytest.mark.parametrize("v,L,m,seed", CASES)
@pytest.mark.parametrize("c", [1, 2])
def test_continuation_stays_within_its_bound(v, L, m, seed, c):
    T = random_tables(v, seed)
    got, bound = enumerate_jacobi(T, L, m, continuation=c)
    d = tv(got, target(T, m))
    assert abs(sum(got.values()) - 1) < 1e-12
    assert d <= bound + 1e-12 <= (m - 1) * sensitivity(T) + 2e-12
    if m > 1:
        assert d > 1e-6               # lossy on every random table with m >= 2


def test_continuation_is_lossless_when_the_target_ignores_the_last_token():
    """Rows of T equal: stale and fresh distributions coincide, nothing is lost (delta = 0)."""
    T = np.tile(random_tables(3, 0)[:1], (3, 1))
    got, bound = enumerate_jacobi(T, 3, 3, continuation=1)
    assert tv(got, target(T, 3)) < 1e-12 and bound < 1e-15


def test_counterexample():
    """The documented numbers (window 2, c = 1): the first token is exact; the first two tokens
    are at TV 17/30 = 0.567 (= the hybrid bound; delta = 0.85), the first three at 17/25 = 0.68
    (bound 34/45 = 0.756, (m - 1) delta = 1.7). The target repeats token 0 three times with
    probability 0.729; the continued windows emit 0 0 0 with probability 0.117."""
    one, _ = enumerate_jacobi(STICKY, 2, 1, continuation=1)
    assert tv(one, target(STICKY, 1)) < 1e-12
    two, b2 = enumerate_jacobi(STICKY, 2, 2, continuation=1)
    assert abs(tv(two, target(STICKY, 2)) - 17 / 30) < 1e-12 and abs(b2 - 17 / 30) < 1e-12
    got, bound = enumerate_jacobi(STICKY, 2, 3, continuation=1)
    want = target(STICKY, 3)
    assert abs(tv(got, want) - 17 / 25) < 1e-12 and abs(bound - 34 / 45) < 1e-12
    assert abs(sensitivity(STICKY) - 0.85) < 1e-12
    assert abs(want[(0, 0, 0)] - 0.729) < 1e-12 and abs(got[(0, 0, 0)] - 0.117) < 1e-12


def test_the_bound_is_nearly_attained():
    """The worst of 900 random tables (V 3-5, three sharpnesses, window 2, m = 2): TV 0.792
    against delta = 0.998; a stale context costs up to the full sensitivity per token."""
    T = random_tables(5, 254, sharp=6.0)
    got, bound = enumerate_jacobi(T, 2, 2, continuation=1)
    d = tv(got, target(T, 2))
    assert abs(d - 0.7924) < 1e-4 and d <= bound <= sensitivity(T)
    assert sensitivity(T) > 0.99


def test_the_enumeration_detects_a_broken_coupling():
    """A coupling that keeps a draft with probability min(1, p/q) but redraws from p (not the
    residual) is caught at c = 0: the check can fail."""
    T = random_tables(3, 1)
    got, _ = enumerate_jacobi(T, 2, 3, continuation=0)
    assert tv(got, target(T, 3)) < 1e-12
    import test_sjd_pac as me
    real = me._residual
    try:
        me._residual = lambda p, q: p
        bad, _ = enumerate_jacobi(T, 2, 3, continuation=0)
    finally:
        me._residual = real
    assert tv(bad, target(T, 3)) > 1e-3


# -- the drafter itself, driven by the same tables --------------------------------------------

def _drive(T: np.ndarray, window: int, m: int, continuation: int, n: int, seed: int):
    """Jacobi(maximal, continuation) + Exact on n rows of the chain T: counts of the first m
    emitted tokens."""
    v = T.shape[0]
    Tt = torch.tensor(T, dtype=torch.float32)
    g = torch.Generator().manual_seed(seed)
    d = Jacobi(window, coupling="maximal", continuation=continuation, generator=g)
    ids = torch.full((n, 1), S0)
    d.begin(ids, torch.ones_like(ids), vocab_size=v)
    last = ids[:, 0]
    emitted = torch.full((n, m + window + 1), -1)
    count = torch.zeros(n, dtype=torch.long)
    rows = torch.arange(n)
    while int(count.min()) < m:
        draft = d.propose(last, window)
        ctx = torch.cat([last[:, None], draft.tokens], 1)               # [n, K + 1]
        p = Tt[ctx]
        out = Exact()(draft.tokens, draft.probs, p, g)
        for i in range(out.tokens.shape[1]):
            ok = (i <= out.num_accepted) & (count < emitted.shape[1])
            emitted[rows[ok], count[ok]] = out.tokens[ok, i]
            count = count + ok.long()
        d.observe(out, p, None)
        last = out.last_tokens
    first = emitted[:, :m]
    code = (first * torch.tensor([v ** (m - 1 - i) for i in range(m)])).sum(1)
    return np.bincount(code.numpy(), minlength=v ** m).astype(float)


@pytest.mark.parametrize("continuation", [0, 1])
def test_the_drafter_samples_the_enumerated_distribution(continuation):
    v, L, m, n = 3, 3, 3, 60_000
    want, _ = enumerate_jacobi(STICKY, L, m, continuation)
    probs = np.array([want.get(k, 0.0) for k in itertools.product(range(v), repeat=m)])
    counts = _drive(STICKY, L, m, continuation, n, seed=continuation)
    assert chi_square_pvalue(counts, probs) > 1e-4
    if continuation:                  # and the sample tells it apart from the target
        exact = np.array([target(STICKY, m)[k] for k in itertools.product(range(v), repeat=m)])
        assert chi_square_pvalue(counts, exact) < 1e-6


# -- the registered method --------------------------------------------------------------------

def test_sjd_continue_is_registered_as_a_relaxed_jacobi_method():
    drafter, rule, k = build_method("sjd-continue", {"window": 4},
                                    MethodContext(jacobi={"init_range": (0, 5)}))
    assert isinstance(drafter, Jacobi) and (drafter.coupling, drafter.continuation) == ("maximal", 1)
    assert rule.name == "exact" and k == 4
    assert parse_method("sjd-continue", {"window": 4}, has_draft=False).lossless is False
    assert Jacobi.lossless_for({"continuation": 2}) is False
    for name in ("sjd", "sjd-maximal", "sjd-gumbel"):
        assert parse_method(name, {"window": 4}, has_draft=False).lossless is True
    # the rule's declaration too: a relaxed rule on a lossless drafter is relaxed
    assert parse_method("sjd-maximal+lantern", has_draft=False).lossless is False
    assert parse_method("sjd-maximal", {"continuation": 1}, has_draft=False).lossless is False
    with pytest.raises(ValueError, match="continuation=1 needs coupling='maximal'"):
        build_method("sjd", {"continuation": 1})
    with pytest.raises(ValueError, match="continuation=-1"):
        Jacobi(4, coupling="maximal", continuation=-1)


def test_the_sweep_report_treats_sjd_continue_as_relaxed():
    """``eval.report`` asks the method (rule and drafter): ``sjd-continue`` (or ``sjd-maximal``
    with a continuation setting) is reported relaxed, with no lossless check; ``sjd-maximal``
    is checked against plain decoding."""
    from types import SimpleNamespace

    from eval.report import _lossless, summarize

    assert _lossless("sjd-continue") is False and _lossless("sjd-maximal") is True
    assert _lossless("sjd-maximal", {"continuation": 2}) is False

    def row(method, i, params=None):
        return dict(method=method, setting=",".join(f"{k}={v}" for k, v in (params or {}).items())
                    or "default", params=params or {}, seed=0, chunk=0, prompt_index=i,
                    seconds_batch=1.0, seconds_draft=0.0, seconds_verify=1.0, batch_steps=4,
                    nfe=4, tokens_per_step=1.0, acceptance=0.5, ids=[i % 3, 1, 2])

    rows = [row(m, i, ps) for m, ps in [("plain", None), ("sjd-maximal", None),
                                        ("sjd-continue", None), ("sjd-maximal", {"continuation": 1})]
            for i in range(6)]
    summary, _ = summarize(rows, SimpleNamespace(vocab=3), list(range(6)))
    got = {s["method"]: s for s in summary}
    assert got["sjd-maximal"]["lossless"] and got["sjd-maximal"]["distribution_check"] == "pass"
    for label in ("sjd-continue", "sjd-maximal[continuation=1]"):
        assert got[label]["lossless"] is False and "distribution_check" not in got[label]


@pytest.mark.parametrize("window", [2, 8])
def test_greedy_sjd_continue_equals_plain_greedy(pair, ragged_prompts, window):
    """Under greedy decoding the loop verifies with the argmax chain, which re-tests the forced
    tokens in their true context: plain greedy decoding, token for token."""
    target_model, _ = pair
    ids, mask = ragged_prompts
    plain = mmspec.generate(target_model, None, ids, attention_mask=mask, temperature=0,
                            max_new_tokens=20)
    out = mmspec.generate(target_model, None, ids, attention_mask=mask, temperature=0,
                          max_new_tokens=20, seed=1,
                          drafter=Jacobi(window, coupling="maximal", continuation=1))
    assert torch.equal(out.sequences, plain.sequences)


# Row 0 accepts 1 draft (shift 2): old slots 2..5 kept / redrawn / kept / redrawn, old slot 6
# absent (a draw from p, a redraw), slot 5 fresh. Row 1 accepts 3 (shift 4): old slots 4, 5
# redrawn / kept, old slot 6 absent, slots 3..5 fresh. Forced: the covered slots up to and
# including the c-th redraw.
KEEPS = {0: [True, False, True, False], 1: [False, True]}
FORCED = {0: ([], []), 1: ([0, 1], [0]), 2: ([0, 1, 2, 3], [0, 1, 2])}


@pytest.mark.parametrize("c", [0, 1, 2])
def test_continuation_forces_q_to_zero_up_to_the_cth_redraw(c):
    """The window after ``observe``: covered slots up to and including the c-th redraw carry
    q = 0 (forced), later covered slots the fresh p, slots past the pass a one-hot q. The keep
    tests are certain (the fresh p of an old one-hot draft is 1: kept; 0: redrawn), so no draw
    decides the answer; the rows accept different counts and count their own redraws."""
    v, L = 6, 6
    one_hot = lambda x: torch.nn.functional.one_hot(torch.as_tensor(x), v).float()
    d = Jacobi(L, coupling="maximal", continuation=c, generator=torch.Generator().manual_seed(0))
    ids = torch.zeros(2, 1, dtype=torch.long)
    d.begin(ids, torch.ones_like(ids), vocab_size=v)
    old = d.tokens.clone()
    assert torch.equal(d.q, one_hot(old))
    n = torch.tensor([1, 3])
    p = torch.full((2, L + 1, v), 1.0 / v)
    for b, keeps in KEEPS.items():
        for i, keep in enumerate(keeps):
            j, x = int(n[b]) + 1 + i, int(old[b, int(n[b]) + 1 + i])
            p[b, j] = one_hot(x) if keep else (1 - one_hot(x)) / (v - 1)
        p[b, L] = torch.softmax(torch.arange(v, dtype=torch.float) * (b + 1), 0)
    tokens = torch.full((2, L + 1), -1)
    for b in range(2):
        tokens[b, : int(n[b]) + 1] = torch.cat([old[b, : int(n[b])], torch.tensor([1])])
    d.observe(VerifyOutput(tokens=tokens, num_accepted=n), p, None)
    for b, keeps in KEEPS.items():
        shift = int(n[b]) + 1
        for s in range(L):
            j = s + shift
            if j > L:                               # past the pass: a fresh draft, one-hot q
                assert torch.equal(d.q[b, s], one_hot(d.tokens[b, s]))
                continue
            want = torch.zeros(v) if s in FORCED[c][b] else p[b, j]
            assert torch.equal(d.q[b, s], want), (b, s)
            assert float(p[b, j, d.tokens[b, s]]) > 0
            if j < L:                               # kept exactly where the keep test passed
                assert (int(d.tokens[b, s]) == int(old[b, j])) == keeps[s]


def test_sjd_continue_with_guidance_and_static_caches(pair):
    """Guided, on static caches: greedy equals plain greedy; sampling runs every row out."""
    target_model, _ = pair
    ids, un = torch.tensor([[1, 2, 3], [4, 3, 2]]), torch.tensor([[0, 0, 5], [0, 0, 5]])
    kw = dict(guidance_scale=2.5, uncond_input_ids=un, max_new_tokens=16, static_cache=True)
    plain = mmspec.generate(target_model, None, ids, temperature=0, **kw)
    jac = mmspec.generate(target_model, None, ids, temperature=0, seed=0,
                          drafter=Jacobi(6, coupling="maximal", continuation=1), **kw)
    assert torch.equal(plain.sequences, jac.sequences)
    out = mmspec.generate(target_model, None, ids, seed=0,
                          drafter=Jacobi(6, coupling="maximal", continuation=2), **kw)
    # bounds that hold for any draw: one to window + 1 tokens per row and step
    assert out.num_generated.tolist() == [16, 16] and -(-16 // 7) <= out.stats.steps <= 16


@pytest.mark.parametrize("name", ["janus", "emu3", "llamagen", "token-span"])
def test_image_adapters_greedy_sjd_continue_equals_plain_greedy(name):
    """Through the text-to-image front door of every image adapter, with guidance."""
    from tiny_image import PIPES
    from tiny_image import tiny_vq

    pipe, prompts = PIPES[name](tiny_vq())
    kw = dict(guidance_scale=3.0, temperature=0, progress=False, seed=0)
    plain = pipe(prompts, method="plain", **kw)
    out = pipe(prompts, method="sjd-continue", **kw)
    assert torch.equal(out.tokens, plain.tokens)


# -- proactive drafting: the siblings at one position -----------------------------------------
# SJD-PAC's tree (not in mmspec) offers K siblings at a position after the first rejection and
# verifies them next step by recursive rejection sampling (section 10's tree rule): sibling i is
# taken as drawn from q_i = p_stale without the earlier siblings, renormalised. As read from the
# released sampler, sibling 1 is the maximal coupling's draft (x_old kept, else a residual draw)
# and the later ones are draws without replacement from the stale residual
# norm(max(0, p_stale - q_old)), not from p_stale.

def _norm(x: np.ndarray):
    s = x.sum()
    return x / s if s > 0 else None


def _without_replacement(dist: np.ndarray, k: int, taken: tuple = ()):
    """[(k draws without replacement from dist, excluding ``taken``), probability]."""
    out = []

    def go(seq, w):
        if len(seq) == k:
            out.append((tuple(seq), w))
            return
        r = dist.copy()
        r[list(taken) + seq] = 0
        s = r.sum()
        for y in np.flatnonzero(r > 0):
            go(seq + [int(y)], w * r[y] / s)

    go([], 1.0)
    return out


def _recursive(siblings, p_stale, p_fresh) -> np.ndarray:
    """The token the tree rule emits at the position, for these siblings."""
    out, w, p = np.zeros(len(p_fresh)), 1.0, p_fresh.copy()
    for i, c in enumerate(siblings):
        q = p_stale.copy()
        q[list(siblings[:i])] = 0
        q = _norm(q)
        a = _ratio(p[c], q[c])
        out[c] += w * a
        w *= 1 - a
        p = _norm(np.maximum(p - q, 0))
        if w == 0 or p is None:
            return out
    return out + w * p


def proactive(p_stale, q_old, p_fresh, k: int, released: bool) -> np.ndarray:
    """Emitted distribution at the position: the old draft x ~ q_old, the coupling's keep test
    against p_stale, k siblings (``released``: later ones from the stale residual; else from
    p_stale without replacement, as the rule takes them), then the tree rule against p_fresh."""
    out = np.zeros(len(p_stale))
    res = _norm(np.maximum(p_stale - q_old, 0))
    for x in np.flatnonzero(q_old > 0):
        a = _ratio(p_stale[x], q_old[x])
        firsts = [(int(x), a)] + ([] if res is None else
                                  [(int(y), (1 - a) * res[y]) for y in np.flatnonzero(res > 0)])
        if released:                       # the residual draws, shifted behind a kept draft
            branches = []
            if a > 0:
                branches += [((int(x),) + s, a * w) for s, w in _without_replacement(res, k - 1)]
            if a < 1:
                branches += [(s, (1 - a) * w) for s, w in _without_replacement(res, k)]
        else:
            branches = [((c,) + s, fw * w) for c, fw in firsts if fw > 0
                        for s, w in _without_replacement(p_stale, k - 1, (c,))]
        for sibs, w in branches:
            out += q_old[x] * w * _recursive(list(sibs), p_stale, p_fresh)
    return out


def test_proactive_siblings_from_the_stale_residual_are_not_lossless():
    """The released draws: exact when nothing is stale (p_fresh = p_stale: the first sibling,
    distributed as p_stale, is always accepted), but the fresh distribution differs after a
    rejection. Counterexample, V = 4, K = 2: p_stale = (0.1, 0.7, 0.1, 0.1),
    q_old = (6, 1, 1, 3) / 11, p_fresh = (0.1, 0.2, 0.3, 0.4): the position emits
    (0.1, 0.2, 0.549, 0.151), TV 0.249. Later siblings drawn from p_stale without replacement
    (as the rule takes them) are exact for every table."""
    ps, qo = np.array([0.1, 0.7, 0.1, 0.1]), np.array([6, 1, 1, 3]) / 11
    pf = np.array([0.1, 0.2, 0.3, 0.4])
    got = proactive(ps, qo, pf, 2, released=True)
    assert abs(got.sum() - 1) < 1e-12 and abs(_tv(got, pf) - 0.24882) < 1e-5
    assert np.allclose(got, [0.1, 0.2, 0.54882, 0.15118], atol=1e-5)
    assert _tv(proactive(ps, qo, ps, 2, released=True), ps) < 1e-12
    assert _tv(proactive(ps, qo, pf, 2, released=False), pf) < 1e-12
    g = np.random.default_rng(0)
    worst = 0.0
    for t in range(60):
        v, k = 4 + t % 2, 2 + t % 2
        ps, qo, pf = (_norm(np.exp(2 * g.standard_normal(v))) for _ in range(3))
        if (np.maximum(ps - qo, 0) > 0).sum() < k:
            continue                       # the released draws need k residual tokens
        assert _tv(proactive(ps, qo, pf, k, released=False), pf) < 1e-12
        assert _tv(proactive(ps, qo, ps, k, released=True), ps) < 1e-12
        worst = max(worst, _tv(proactive(ps, qo, pf, k, released=True), pf))
    assert worst > 0.1
