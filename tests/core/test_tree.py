"""Draft trees: the shape tables, and lossless tree verification.

Analytic (float64): the verification's own per-round function (``sibling_round``) composed
over every sibling draw, every accept/reject branch and every emitted token, lazily (only the
children of visited nodes are drawn); the distribution of the first m emitted tokens must
equal the target's to 1e-12, for tree shapes up to 3 levels x 3 siblings, children drawn
i.i.d. from q, without replacement from q, or deterministically (top-k: point masses), for
p and q with zeros, p == q and disjoint supports. The batched walk (``exact_tree``) is
checked against the same enumeration by Monte Carlo, and end to end in test_tree_decoding.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from mmspec.acceptance import Exact, Greedy, Lantern
from mmspec.acceptance.tree import exact_tree, greedy_tree, sibling_round
from mmspec.tree import Tree
from mmspec.types import PAD
from conftest import path_to
from rule_checks import Tables
from stats_util import chi_square_pvalue


def _children(parents) -> list[list[int]]:
    kids = [[] for _ in range(len(parents) + 1)]
    for i, p in enumerate(parents, 1):
        kids[p].append(i)
    return kids


def _choices(q: torch.Tensor, drawn: tuple, j: int, mode: str):
    """(token, probability of drawing it, the q it was drawn from or None) for sibling j."""
    if mode == "top":
        order = sorted(range(len(q)), key=lambda t: (-float(q[t]), t))
        return [(order[j], 1.0, None)]
    if mode == "without":
        q = q.clone()
        q[list(drawn)] = 0
        q = q / q.sum()
    return [(x, float(q[x]), q) for x in range(len(q)) if q[x] > 0]


def tree_emitted(parents, tables: Tables, m: int, mode: str, accept=None) -> dict:
    """{first m emitted tokens: probability} under exact tree verification (``accept``: a
    relaxed rule's ``node_accept`` instead)."""
    kids, out = _children(parents), {}

    def emit(pre, w, left, y):
        if left == 1:
            out[pre + (y,)] = out.get(pre + (y,), 0.0) + w
        else:
            walk(0, pre + (y,), tables.get(pre + (y,))[0], 0, (), w, left - 1)

    def walk(node, pre, r, j, drawn, w, left):
        if j == len(kids[node]):                 # every child rejected (or a leaf): draw from r
            for y in range(len(r)):
                if r[y] > 0:
                    emit(pre, w * float(r[y]), left, y)
            return
        q = tables.get(pre)[1]
        for x, px, qj in _choices(q, drawn, j, mode):
            a, res = sibling_round(r, torch.tensor(x), qj, accept, len(pre))
            a = float(a)
            if a > 0:                             # accepted: the child's token is emitted
                if left == 1:
                    out[pre + (x,)] = out.get(pre + (x,), 0.0) + w * px * a
                else:
                    child = kids[node][j]
                    walk(child, pre + (x,), tables.get(pre + (x,))[0], 0, (), w * px * a,
                         left - 1)
            if a < 1:
                walk(node, pre, res, j + 1, drawn + (x,), w * px * (1 - a), left)

    walk(0, (), tables.get(())[0], 0, (), 1.0, m)
    return out


def target_emitted(tables: Tables, m: int) -> dict:
    out = {}
    for seq in itertools.product(range(tables.v), repeat=m):
        w = 1.0
        for i in range(m):
            w *= float(tables.get(seq[:i])[0][seq[i]])
        if w > 0:
            out[seq] = w
    return out


def _shapes():
    for d in (1, 2, 3):
        for b in itertools.product((1, 2, 3), repeat=d):
            yield Tree.uniform(b), b
    # irregular: a chain with a side branch, a bushy root with one deep branch
    yield Tree.from_parents((0, 0, 1, 3)), "side"
    yield Tree.from_parents((0, 0, 0, 3, 4)), "deep"


SHAPES = list(_shapes())
CASES = [("plain", "plain", "random"), ("zeros", "zeros", "random"), ("plain", "plain", "equal"),
         ("plain", "plain", "disjoint"), ("onehot", "plain", "random")]


def _parents(tree: Tree) -> tuple:
    return tuple(tree.parents[0].tolist())


@pytest.mark.parametrize("mode", ["top", "iid", "without"])
@pytest.mark.parametrize("tree,shape", SHAPES, ids=[str(s) for _, s in SHAPES])
def test_tree_verification_is_exact(tree, shape, mode):
    """Every uniform shape up to 3 levels x 3 siblings and two irregular ones: the first
    max_depth + 1 emitted tokens (every level reached) are the target's, for five p/q kinds
    (three siblings i.i.d. over three tokens enumerate the first two levels only, to keep
    the enumeration in seconds)."""
    heavy = mode != "top" and tree.max_children == 3 and tree.max_depth == 3
    m = 2 if heavy else tree.max_depth + 1
    # without replacement: three siblings need three tokens in q's support
    cases = CASES if mode != "without" else [c for c in CASES if c[1:] != ("zeros", "random")
                                             and c[2] != "disjoint"]
    for seed, (p_kind, q_kind, relation) in enumerate(cases):
        tables = Tables(3, seed, p_kind, q_kind, relation)
        got, want = tree_emitted(_parents(tree), tables, m, mode), target_emitted(tables, m)
        assert set(got) <= set(want) | {k for k, v in got.items() if v < 1e-14}
        for seq, w in want.items():
            assert abs(got.get(seq, 0.0) - w) < 1e-12, (shape, mode, relation, seq)


@pytest.mark.parametrize("mode", ["iid", "without"])
def test_the_full_three_by_three_tree_is_exact_to_its_leaves(mode):
    """Three levels of three sampled siblings, enumerated down to the leaves (4 tokens)."""
    tree = Tree.uniform((3, 3, 3))
    tables = Tables(3, 11, "plain", "plain", "random")
    got, want = tree_emitted(_parents(tree), tables, 4, mode), target_emitted(tables, 4)
    for seq, w in want.items():
        assert abs(got.get(seq, 0.0) - w) < 1e-12, seq


def test_the_enumeration_fails_for_a_wrong_residual(monkeypatch):
    """The analytic check can fail: with the residual replaced by p (no subtraction of q) the
    first emitted token is no longer the target's."""
    import test_tree

    right = sibling_round

    def wrong(target, x, q, *rest):
        a, _ = right(target, x, q)
        return a, target
    monkeypatch.setattr(test_tree, "sibling_round", wrong)
    tables = Tables(3, 0, "plain", "plain", "random")
    got = tree_emitted((0, 0, 0), tables, 1, "iid")
    want = target_emitted(tables, 1)
    assert max(abs(got.get(s, 0.0) - w) for s, w in want.items()) > 1e-3


def test_tree_tables():
    t = Tree.from_parents((0, 0, 1, 1, 2), batch=2)
    assert t.num_nodes == 6 and t.max_depth == 2 and t.max_children == 2
    assert t.depths()[0].tolist() == [0, 1, 1, 2, 2, 2]
    assert t.children()[1].tolist() == [[1, 2], [3, 4], [5, -1], [-1, -1], [-1, -1], [-1, -1]]
    anc = t.ancestors()[0]
    deep = Tree.chain(6).ancestors()[0]
    assert bool(deep.equal(torch.ones(7, 7, dtype=torch.bool).tril()))      # every distance
    assert anc[5].nonzero().flatten().tolist() == [0, 2, 5]
    assert anc[3].nonzero().flatten().tolist() == [0, 1, 3]
    chain = Tree.chain(3)
    assert chain.max_depth == 3 and chain.max_children == 1
    assert bool(chain.ancestors()[0].equal(torch.ones(4, 4, dtype=torch.bool).tril()))
    with pytest.raises(ValueError, match=r"parents\[1\]=2"):
        Tree.from_parents((0, 2))
    with pytest.raises(ValueError, match="branching"):
        Tree.uniform((2, 0))


def _batched(tree, tables, n, mode, seed=0):
    """Draw n trees of the analytic model in a batch and verify them with ``exact_tree``;
    returns the first emitted tokens' counts."""
    g = torch.Generator().manual_seed(seed)
    kids = _children(_parents(tree))
    k = tree.num_nodes - 1
    tokens = torch.zeros(n, k, dtype=torch.long)
    probs = torch.zeros(n, k, tables.v, dtype=torch.float64)
    p = torch.zeros(n, k + 1, tables.v, dtype=torch.float64)
    prefixes = [[()] * (k + 1) for _ in range(n)]
    for node in range(k + 1):
        for b in range(n):
            base = prefixes[b][node]
            p[b, node] = tables.get(base)[0]
            q = tables.get(base)[1]
            drawn = ()
            for c in kids[node]:
                if mode == "top":
                    x = sorted(range(tables.v), key=lambda t: (-float(q[t]), t))[len(drawn)]
                else:
                    qj = q.clone()
                    if mode == "without":
                        qj[list(drawn)] = 0
                        qj = qj / qj.sum()
                    x = int(torch.multinomial(qj, 1, generator=g))
                    probs[b, c - 1] = qj
                tokens[b, c - 1] = x
                drawn += (x,)
                prefixes[b][c] = base + (x,)
    out = exact_tree(Tree(tree.parents.expand(n, -1), tree.max_depth, tree.max_children),
                     tokens, None if mode == "top" else probs, p, g)
    return out


@pytest.mark.parametrize("mode", ["top", "iid", "without"])
def test_batched_walk_matches_the_enumeration(mode):
    """``exact_tree`` over 20,000 rows of sampled trees: the first emitted token follows the
    target's distribution (chi-square); every row emits its accepted drafts and one more."""
    tree = Tree.from_parents((0, 0, 1, 1, 2))
    tables = Tables(3, 7, "zeros", "plain", "random")
    out = _batched(tree, tables, 20_000, mode)
    n = out.num_accepted
    assert bool((n <= tree.max_depth).all())
    assert bool((out.tokens[torch.arange(len(n)), n] >= 0).all())
    counts = torch.bincount(out.tokens[:, 0], minlength=3).numpy()
    want = target_emitted(tables, 1)
    assert chi_square_pvalue(counts, np.array([want.get((y,), 0.0) for y in range(3)])) > 1e-3


def test_greedy_tree_follows_the_argmax_chain():
    g = torch.Generator().manual_seed(0)
    tree = Tree.from_parents((0, 0, 1, 2, 2), batch=4)
    p = torch.softmax(torch.randn(4, 6, 5, generator=g), -1)
    best = p.argmax(-1)
    tokens = torch.randint(5, (4, 5), generator=g)
    tokens[0, 1] = best[0, 0]          # row 0: node 2 (second child of the root) matches
    tokens[0, 3] = best[0, 2]          # then node 4 (first child of node 2)
    tokens[1, 0] = tokens[1, 1] = best[1, 0]   # row 1: both root children match: the first
    tokens[1, 2] = best[1, 1]
    tokens[2, 0] = (best[2, 0] + 1) % 5
    tokens[2, 1] = (best[2, 0] + 2) % 5        # row 2: nothing matches
    out = greedy_tree(tree, tokens, None, p)
    assert out.num_accepted[:3].tolist() == [2, 2, 0]
    assert out.path[0].tolist() == [0, 2, 4] and out.path[1].tolist() == [0, 1, 3]
    assert out.tokens[0].tolist() == [int(best[0, 0]), int(best[0, 2]), int(best[0, 4])]
    assert out.tokens[2].tolist() == [int(best[2, 0]), PAD, PAD]
    assert bool(Greedy().verify_tree(tree, tokens, None, p).tokens.equal(out.tokens))


def test_rules_declare_trees():
    from mmspec.acceptance import CoarseGrained, Grouped

    tree = Tree.chain(2)
    p = torch.full((1, 3, 4), 0.25)
    assert Exact.trees and Greedy.trees and Lantern(embeddings=torch.eye(4), k=2).trees
    assert Grouped().trees and not Grouped(monotone=False).trees
    with pytest.raises(ValueError, match="does not verify draft trees"):
        CoarseGrained(embeddings=torch.eye(4)).verify_tree(
            tree, torch.zeros(1, 2, dtype=torch.long), None, p)
    with pytest.raises(ValueError, match=r"tree.parents must be \[B, K\]"):
        exact_tree(Tree.chain(3), torch.zeros(1, 2, dtype=torch.long), None, p)


class _Node:
    """One (p, q) for every prefix: a single node's children all see the same q."""

    def __init__(self, p, q):
        self.p, self.q, self.v = p, q, len(p)

    def get(self, prefix):
        return self.p, self.q


def _relaxed_rules():
    """Every registered token rule that verifies trees without being lossless, at its method
    defaults, and LANTERN++ (V = 6: GSD groups of 4)."""
    import mmspec
    from mmspec.acceptance import Relaxed
    from mmspec.registry import MethodContext

    emb = torch.randn(6, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    ctx = MethodContext(embeddings=emb)
    params = {"lantern": {"k": 3, "delta": 0.05}, "gsd": {"group_size": 4}}
    rules = [info.cls.from_params(params.get(info.name, {}), ctx) for info in mmspec.rules()
             if info.event == "token" and issubclass(info.cls, Relaxed)]
    rules.append(Lantern(emb, k=3, lam=1.5))
    return [r for r in rules if r.trees]


@pytest.mark.parametrize("rule", _relaxed_rules(), ids=repr)
@pytest.mark.parametrize("mode", ["iid", "top"])
@pytest.mark.parametrize("m", [1, 2, 3])
def test_relaxed_rules_on_a_tree_node_stay_within_their_bound(rule, mode, m):
    """A relaxed rule's tree verification, enumerated in float64 over the children's draws:
    the token emitted at a node with m children is within ``node_tv_bound`` of p (the sum of
    the rule's chain bound over the rounds), at the root and at depth 2 (annealed weights
    depend on it); an acceptance that ignores the rule (always accept) breaks the bound."""
    broke = False
    for seed, depth in itertools.product(range(6), (0, 2)):
        g = torch.Generator().manual_seed(seed)
        p, q = (torch.softmax(3 * torch.randn(6, generator=g, dtype=torch.float64), 0)
                for _ in range(2))
        if seed % 2:
            p[int(q.argmax())] = 0.0          # a draft favourite the target never emits
            p /= p.sum()
        if mode == "iid":
            qs = [q] * m
        else:
            order = sorted(range(6), key=lambda t: (-float(q[t]), t))[:m]
            qs = [torch.nn.functional.one_hot(torch.tensor(t), 6).double() for t in order]

        def law(accept):
            out = tree_emitted([0] * m, _Node(p, q), 1, mode,
                               accept=lambda x, r, qq, d: accept(x, r, qq, d + depth))
            return torch.tensor([out.get((y,), 0.0) for y in range(6)], dtype=torch.float64)

        o = law(rule.node_accept)
        bound = float(rule.node_tv_bound(p[None], [qj[None] for qj in qs], depth)[0])
        assert abs(float(o.sum()) - 1) < 1e-12
        assert 0.5 * float((o - p).abs().sum()) <= bound + 1e-12, (seed, depth)
        loose = law(lambda x, r, qq, d: torch.ones_like(r[..., 0]))
        broke |= 0.5 * float((loose - p).abs().sum()) > bound + 1e-6
    # GSD declares TV(p, q) itself per round, which even accepting every child meets.
    assert broke or rule.name == "gsd"


@pytest.mark.parametrize("rule", _relaxed_rules(), ids=repr)
def test_relaxed_tree_verification_at_its_exact_parameters_is_exact_bit_for_bit(rule):
    """At ``exact_at`` a relaxed rule's tree walk draws the same numbers and emits the same
    tokens and paths as exact tree verification."""
    import dataclasses

    if rule.exact_at is None:
        pytest.skip(f"{rule.name} declares no exact parameters")
    exact_at = {"lam": 1.0} if getattr(rule, "lam", None) is not None else rule.exact_at
    exact_rule = dataclasses.replace(rule, **exact_at)
    g = torch.Generator().manual_seed(5)
    b, v = 64, 6
    tree = Tree.uniform((2, 2), batch=b)
    k = tree.parents.shape[1]
    p = torch.softmax(2 * torch.randn(b, k + 1, v, generator=g, dtype=torch.float64), -1)
    q = torch.softmax(2 * torch.randn(b, k, v, generator=g, dtype=torch.float64), -1)
    x = torch.multinomial(q.reshape(-1, v), 1, generator=g).view(b, k)
    got = exact_rule.verify_tree(tree, x, q, p, torch.Generator().manual_seed(9))
    ref = Exact().verify_tree(tree, x, q, p, torch.Generator().manual_seed(9))
    assert torch.equal(got.tokens, ref.tokens) and torch.equal(got.path, ref.path)
    relaxed = rule.verify_tree(tree, x, q, p, torch.Generator().manual_seed(9))
    assert int(relaxed.num_accepted.sum()) >= int(ref.num_accepted.sum())


def test_a_chain_tree_verifies_as_the_chain_rule():
    """A chain is a tree: exact_tree over a chain emits the chain rule's distribution (same
    counts of accepted lengths, statistically) and greedy_tree the same tokens."""
    g = torch.Generator().manual_seed(1)
    b, k, v = 4000, 3, 6
    p = torch.softmax(torch.randn(1, k + 1, v, generator=g), -1).expand(b, -1, -1)
    q = torch.softmax(torch.randn(1, k, v, generator=g), -1).expand(b, -1, -1)
    x = torch.multinomial(q.reshape(-1, v), 1, generator=g).view(b, k)
    tree = Tree.chain(k, batch=b)
    assert bool(greedy_tree(tree, x, q, p).tokens.equal(Greedy()(x, q, p).tokens))
    n_tree = torch.bincount(exact_tree(tree, x, q, p, g).num_accepted, minlength=k + 1)
    n_chain = torch.bincount(Exact()(x, q, p, g).num_accepted, minlength=k + 1)
    assert chi_square_pvalue(n_tree.numpy(), (n_chain / n_chain.sum()).numpy()) > 1e-3


# -- tree steps on a session ---------------------------------------------------------------

def _session(model, static: bool, guided: bool = False):
    from mmspec.sampling import SamplingParams
    from mmspec.sessions import CausalLMSession

    return CausalLMSession(model, SamplingParams(), guidance_scale=2.0 if guided else None,
                           static_len=32 if static else None)


def _prefill(sess, ids, mask):
    # with guidance, the unconditional prompts: the same rows without their first real token
    kw = dict(uncond_ids=ids, uncond_mask=mask * (mask.cumsum(1) > 1)) if sess.guided else {}
    sess.prefill(ids, mask, **kw)


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("guided", [False, True])
def test_a_tree_step_gives_each_node_its_paths_distribution(ragged_prompts, static, guided):
    """Every node's distribution equals the one of feeding its path as a chain; after a
    commit of a path per row (ragged), the next step equals a session that was fed the
    paths alone (float32, dynamic and static caches, with guidance)."""
    from conftest import tiny_llama

    model = tiny_llama()
    ids, mask = ragged_prompts
    # depths up to 6: every ancestor distance (a pointer-doubling walk would miss 3, 5, 6)
    tree = Tree.from_parents((0, 0, 1, 1, 2, 4, 6, 7, 8), batch=3)
    g = torch.Generator().manual_seed(0)
    nodes = torch.randint(1, 16, (3, 10), generator=g)
    nodes[:, 0] = ids[:, -1]
    sess = _session(model, static, guided)
    _prefill(sess, ids, mask)
    p = sess.step(nodes, tree=tree)
    for node in range(10):
        chain = path_to(tree, node)
        ref = _session(model, static, guided)
        _prefill(ref, ids, mask)
        want = ref.step(nodes[:, chain])[:, -1]
        torch.testing.assert_close(p[:, node], want, rtol=1e-5, atol=1e-6)
    # commit: row 0 keeps root-1-3, row 1 root-2-5, row 2 only the root (a hole after it)
    path = torch.tensor([[0, 1, 3], [0, 2, 5], [0, 0, 0]])
    valid = torch.tensor([[1, 1, 1], [1, 1, 1], [1, 0, 0]])
    sess.commit(3, valid, path)
    nxt = torch.tensor([[9], [10], [11]])
    got = sess.step(nxt)
    ref = _session(model, static, guided)
    _prefill(ref, ids, mask)
    ref.step(nodes.gather(1, path), valid)
    ref.commit(3, valid)
    torch.testing.assert_close(got, ref.step(nxt), rtol=1e-5, atol=1e-6)


def test_tree_steps_are_refused_where_they_cannot_run(ragged_prompts):
    from conftest import tiny_llama

    sess = _session(tiny_llama(), False)
    ids, mask = ragged_prompts
    sess.prefill(ids, mask)
    with pytest.raises(ValueError, match="tree of 3 nodes x 3 rows for a step of 4 slots"):
        sess.step(torch.ones(3, 4, dtype=torch.long), tree=Tree.chain(2, batch=3))
    sess.trees = False
    with pytest.raises(ValueError, match="recurrent or sliding-window layers"):
        sess.step(torch.ones(3, 3, dtype=torch.long), tree=Tree.chain(2, batch=3))


# -- end to end: a draft model's trees through the loop --------------------------------------

def _tree_drafter(draft, temperature, static_len=None, **tree):
    from mmspec.drafters import TreeDrafter
    from mmspec.sampling import SamplingParams
    from mmspec.sessions import CausalLMSession

    sess = CausalLMSession(draft, SamplingParams(temperature=temperature), static_len=static_len)
    return TreeDrafter(sess, **tree)


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("shape", [dict(depth=3, branch=2, width=2),
                                   dict(depth=4, branch=3, width=2, nodes=7),
                                   dict(depth=1, branch=3, width=1)])
def test_greedy_trees_give_plain_greedy(pair, ragged_prompts, static, shape):
    """Speculative greedy with draft trees == plain greedy, ragged rows, float32."""
    import mmspec

    target, draft = pair
    ids, mask = ragged_prompts
    plain = mmspec.generate(target, None, ids, attention_mask=mask, temperature=0,
                            max_new_tokens=12, static_cache=static)
    drafter = _tree_drafter(draft, 0, 128 if static else None, **shape)
    out = mmspec.generate(target, input_ids=ids, attention_mask=mask, temperature=0,
                          max_new_tokens=12, drafter=drafter, static_cache=static)
    assert out.sequences.tolist() == plain.sequences.tolist()
    assert out.stats.tokens_per_step > 1.0


def _tree_histogram(target, drafter, prompt, m, n, seed):
    import mmspec

    ids = torch.tensor(prompt).expand(n, -1).contiguous()
    out = mmspec.generate(target, input_ids=ids, drafter=drafter, temperature=1.0,
                          max_new_tokens=m, seed=seed)
    gen = out.sequences[:, len(prompt):]
    v = target.config.vocab_size
    code = (gen * torch.tensor([v ** (m - 1 - i) for i in range(m)])).sum(1)
    return np.bincount(code.numpy(), minlength=v ** m).astype(float), out.stats


@pytest.mark.parametrize("sample", [True, False])
def test_tree_sampling_matches_the_target_and_fails_without_the_residual(monkeypatch, sample):
    """20,000 rows, three tokens, a depth-3 tree of two children per node, drawn from q
    without replacement (each verified against its own q) or the top-k (point masses): the
    emitted sequences follow the target's exact distribution; replacing the residual by the
    running target (a rejected child's mass comes back) breaks it."""
    import mmspec.acceptance.tree as tree_mod
    from conftest import tiny_llama
    from stats_util import tv, tv_threshold
    from stats_util import continuation_distribution as _continuation_distribution

    target = tiny_llama(vocab=8, hidden=32, seed=3, scale=6.0)
    draft = tiny_llama(vocab=8, hidden=16, layers=1, seed=4, scale=6.0)
    prompt, m, n = [1, 2, 3], 3, 20_000
    exact = _continuation_distribution(target, prompt, m, 1.0)
    shape = dict(depth=3, branch=2, width=2, sample=sample)
    got, st = _tree_histogram(target, _tree_drafter(draft, 1.0, **shape), prompt, m, n, 0)
    assert st.histogram[1] > 100 and st.histogram[2] > 100     # paths of one and two drafts
    assert tv(got / n, exact) < tv_threshold(exact, n)
    assert chi_square_pvalue(got, exact) > 1e-4

    right = tree_mod.sibling_round
    monkeypatch.setattr(tree_mod, "sibling_round",
                        lambda target, x, q, *rest: (right(target, x, q, *rest)[0], target))
    broken, _ = _tree_histogram(target, _tree_drafter(draft, 1.0, **shape), prompt, m, n, 0)
    assert chi_square_pvalue(broken, exact) < 1e-4


def test_children_past_the_drafts_support_never_accept():
    """A draft whose q holds fewer ids than the tree's children (its session samples top-1:
    q one-hot) under a target that samples all ids: the children drawn after q's support is
    used up repeat the first child as a point mass, which no residual can accept, and the
    emitted sequences follow the target (with a zero q recorded for them, each was accepted
    whenever reached)."""
    from conftest import tiny_llama
    from mmspec.drafters import TreeDrafter
    from mmspec.sampling import SamplingParams
    from mmspec.sessions import CausalLMSession
    from stats_util import continuation_distribution as _continuation_distribution
    from stats_util import tv, tv_threshold

    target = tiny_llama(vocab=8, hidden=32, seed=3, scale=6.0)
    draft = tiny_llama(vocab=8, hidden=16, layers=1, seed=4, scale=6.0)
    prompt, m, n = [1, 2, 3], 2, 20_000
    exact = _continuation_distribution(target, prompt, m, 1.0)
    session = CausalLMSession(draft, SamplingParams(temperature=1.0, top_k=1))
    drafter = TreeDrafter(session, depth=2, branch=3, width=1, sample=True)
    got, st = _tree_histogram(target, drafter, prompt, m, n, 0)
    assert tv(got / n, exact) < tv_threshold(exact, n)
    assert chi_square_pvalue(got, exact) > 1e-4


def test_tree_methods_by_name_and_bad_input(pair, ragged_prompts):
    from mmspec.acceptance import Grouped
    from mmspec.registry import MethodContext, build_method
    from mmspec.sampling import SamplingParams
    from mmspec.sessions import CausalLMSession

    _, draft = pair
    ctx = MethodContext(draft_session=lambda: CausalLMSession(draft, SamplingParams()))
    drafter, rule, k = build_method("tree", {"tree_depth": 3, "tree_branch": 2}, ctx)
    assert drafter.trees and rule.trees and k == 2 + 4 + 8
    with pytest.raises(ValueError, match="tree_nodes=99 is out of range: accepted 1..14"):
        build_method("tree", {"tree_depth": 3, "tree_branch": 2, "tree_nodes": 99}, ctx)
    with pytest.raises(ValueError, match="tree_nodes=5 keeps the best nodes"):
        build_method("tree", {"tree_nodes": 5, "tree_sample": True}, ctx)
    with pytest.raises(ValueError, match="tree_depth"):
        build_method("tree", {"tree_depth": 0}, ctx)
    with pytest.raises(ValueError, match="does not verify draft trees"):
        import mmspec

        ids, mask = ragged_prompts
        mmspec.generate(pair[0], input_ids=ids, attention_mask=mask,
                        rule=Grouped(monotone=False), drafter=_tree_drafter(draft, 1.0))


# -- draft heads on the target's features ----------------------------------------------------

def _head_drafter(target, **tree):
    from mmspec.drafters import DraftHead, FeatureDrafter

    torch.manual_seed(5)
    return FeatureDrafter(DraftHead.for_target(target), **tree)


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("shape", [dict(depth=3, branch=2, width=2), dict(depth=4, branch=1, width=1),
                                   dict(depth=4, branch=3, width=2, nodes=6)])
def test_a_draft_head_gives_plain_greedy(pair, ragged_prompts, static, shape):
    """Trees and chains from a (random) head on the target's features: speculative greedy ==
    plain greedy, ragged rows, dynamic and static caches."""
    import mmspec

    target, _ = pair
    ids, mask = ragged_prompts
    plain = mmspec.generate(target, None, ids, attention_mask=mask, temperature=0,
                            max_new_tokens=12, static_cache=static)
    out = mmspec.generate(target, input_ids=ids, attention_mask=mask, temperature=0,
                          max_new_tokens=12, drafter=_head_drafter(target, **shape),
                          static_cache=static)
    assert out.sequences.tolist() == plain.sequences.tolist()


def test_more_children_than_the_draft_has_ids_are_refused_before_any_work(pair):
    """tree_branch above the draft's vocabulary (a draft model's, a head's draft ids) is
    refused when the drafter is built, naming the parameter and the bound."""
    from mmspec.drafters import FeatureDrafter, TreeDrafter
    from mmspec.drafters.eagle3 import Eagle3Head
    from mmspec.sampling import SamplingParams
    from mmspec.sessions import CausalLMSession

    target, draft = pair
    v = target.config.vocab_size
    session = CausalLMSession(draft, SamplingParams(temperature=0))
    with pytest.raises(ValueError, match=f"tree_branch={v + 1}: accepted at most the draft's {v}"):
        TreeDrafter(session, branch=v + 1)
    head = Eagle3Head.for_target(target, feature_layers=(0, 1), draft_vocab_size=5)
    with pytest.raises(ValueError, match="tree_branch=6: accepted at most the draft's 5 ids"):
        FeatureDrafter(head, branch=6)
    assert FeatureDrafter(head, branch=5).branch == 5
