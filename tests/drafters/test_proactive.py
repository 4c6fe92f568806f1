"""SJD-PAC's proactive drafting as a lossless tree (``ProactiveJacobi``, method
``sjd-proactive``): the step's tree, the spine the window is refreshed from, the couplings, the
front doors and bad settings. Its losslessness over the registry: tests/suites/
test_jacobi_conformance.py."""

from __future__ import annotations

import pytest
import torch

import mmspec
from jacobi_checks import as_array, drive, layout, tables, target
from mmspec.drafters.jacobi import ProactiveJacobi
from mmspec.registry import MethodContext, build_method, parse_method
from mmspec.types import VerifyOutput
from stats_util import chi_square_pvalue


def _drafter(v: int = 8, rows: int = 2, window: int = 4, **kw) -> ProactiveJacobi:
    d = ProactiveJacobi(window, **{"coupling": "maximal", "tree_branch": 2, "tree_depth": 2,
                                   "generator": torch.Generator().manual_seed(0), **kw})
    ids = torch.zeros(rows, 1, dtype=torch.long)
    d.begin(ids, torch.ones_like(ids), vocab_size=v)
    return d


@pytest.mark.parametrize("k,branch,depth,spines", [(4, 2, 2, 1), (5, 2, 2, 3), (3, 3, 1, 3),
                                                   (2, 2, 3, 1), (4, 1, 2, 1)])
def test_the_step_tree_is_the_documented_shape(k, branch, depth, spines):
    """Parents, depths and child order against the enumeration's own layout; nodes() counts
    them; every child's token is the window's draft at its depth (child 0) or another id."""
    d = _drafter(window=k, tree_branch=branch, tree_depth=depth, tree_spines=spines)
    d.tokens = torch.randint(0, 8, d.tokens.shape)
    d.q = torch.softmax(torch.randn(d.q.shape), -1)
    draft = d.propose(torch.zeros(2, dtype=torch.long), k)
    nodes, _ = layout(k, branch, depth, spines)
    assert draft.tokens.shape[1] == len(nodes) - 1 == ProactiveJacobi.nodes(k, branch, depth, spines)
    assert draft.tree.parents[0].tolist() == [parent for parent, _, _ in nodes[1:]]
    assert draft.tree.depths()[0].tolist() == [lev for _, lev, _ in nodes]
    assert draft.tree.max_depth == k
    for i, (_, lev, j) in enumerate(nodes[1:]):
        x, q = draft.tokens[:, i], draft.probs[:, i]
        if j == 0:                   # the window's draft with its recorded q
            assert torch.equal(x, d.tokens[:, lev - 1]) and torch.equal(q, d.q[:, lev - 1])
        else:                        # drawn without the window's draft
            assert bool((x != d.tokens[:, lev - 1]).all())
            assert bool((q.gather(1, d.tokens[:, lev - 1, None]) == 0).all())


def test_children_are_the_same_under_every_parent_and_distinct():
    d = _drafter(window=3, tree_branch=3, tree_depth=2)
    d.q = torch.softmax(torch.randn(d.q.shape), -1)
    draft = d.propose(torch.zeros(2, dtype=torch.long), 3)
    level1, level2 = draft.tokens[:, :3], draft.tokens[:, 3:12].view(2, 3, 3)
    assert bool((level2 == level2[:, :1]).all())            # the same children under each node
    assert all(len(set(r.tolist())) == 3 for r in level1)
    # q of child j: q without children < j, renormalised
    q1 = d.q[:, 0]
    for j in range(3):
        want = q1.clone()
        want.scatter_(1, level1[:, :j], 0)
        assert torch.allclose(draft.probs[:, j], want / want.sum(1, keepdim=True))


def test_a_fresh_window_has_children_without_mass():
    """A fresh window's q is one-hot: children 1.. repeat child 0 as point masses (never
    accepted once child 0 is rejected: the residual has no mass there)."""
    d = _drafter(window=3, tree_branch=3, tree_depth=1)
    draft = d.propose(torch.zeros(2, dtype=torch.long), 3)
    assert bool((draft.tokens[:, :3] == d.tokens[:, :1]).all())
    assert torch.equal(draft.probs[:, 1], torch.nn.functional.one_hot(d.tokens[:, 0], 8).float())
    d = _drafter(v=2, window=2, tree_branch=4, tree_depth=1)     # more children than ids
    d.q = torch.full_like(d.q, 0.5)
    draft = d.propose(torch.zeros(2, dtype=torch.long), 2)
    assert draft.tokens.shape[1] == 4 + 1 and bool((draft.tokens[:, 2:4] == d.tokens[:, :1]).all())


def test_the_window_is_refreshed_from_the_spine():
    """Each refreshed slot's q is the distribution computed at the spine's node: the accepted
    path, then child 0 below it, then the chain of the window's drafts (every node gives a
    distinct distribution here). Nodes (branch 2, depth 2, 2 spines, k = 4): 1, 2 at depth 1;
    3, 4 under 1 and 5, 6 under 2; the chains 3 -> 7 -> 9 and 4 -> 8 -> 10."""
    v, k = 64, 4
    d = _drafter(v=v, rows=4, window=k, coupling="none", tree_spines=2)
    draft = d.propose(torch.zeros(4, dtype=torch.long), k)
    assert draft.tree.parents[0].tolist() == [0, 0, 1, 1, 2, 2, 3, 4, 7, 8]
    p = torch.nn.functional.one_hot(torch.arange(11), v).float().expand(4, -1, -1).clone()
    path = torch.tensor([[0, 2, 5, 0, 0], [0, 0, 0, 0, 0], [0, 1, 4, 0, 0], [0, 2, 0, 0, 0]])
    n = torch.tensor([2, 0, 2, 1])
    tokens = torch.where(torch.arange(k + 1) <= n[:, None], 7, -1)
    d.observe(VerifyOutput(tokens=tokens, num_accepted=n, path=path), p, None)
    # the new slot s is old slot s + n + 1, whose distribution the node at depth s + n + 1
    # computed: row 0 below node 5 (no child: the first chain), row 1 below the root, row 2
    # below node 4 (its own chain), row 3 below node 2 (its child 0, 5, then the first chain)
    spine = {0: [7, 9], 1: [1, 3, 7, 9], 2: [8, 10], 3: [5, 7, 9]}
    for row, nodes in spine.items():
        for s, node in enumerate(nodes):
            assert int(d.q[row, s].argmax()) == node, (row, s)
            assert int(d.tokens[row, s]) == node   # drawn from that one-hot distribution


@pytest.mark.parametrize("coupling", ["none", "maximal", "gumbel"])
def test_every_coupling_keeps_the_tree_lossless(coupling):
    """The drafter with each coupling (Gumbel: the children are the next keys of the
    position's persistent table) on order-2 tables: the first 3 tokens follow the target."""
    T, m = tables(3, 4), 3
    drafter, rule, _ = build_method("sjd-proactive", {"window": 3, "coupling": coupling,
                                                      "tree_branch": 2, "tree_depth": 2},
                                    MethodContext(jacobi={"init_range": (0, 3)}))
    counts = drive(drafter, rule, T, m, 60_000, seed=2)
    assert chi_square_pvalue(counts, as_array(target(T, m), 3, m)) > 1e-4


def test_registered_sizes_and_guarantee():
    method = parse_method("sjd-proactive", {}, has_draft=False)
    assert method.lossless and method.drafter_class.trees
    assert method.num_draft_tokens({"window": 16}) == 4 + 16 + 14
    assert method.reach({"window": 16}) == 16
    m = parse_method("sjd-proactive", {"window": 8, "tree_depth": 3, "tree_branch": 2,
                                       "tree_spines": 8}, has_draft=False)
    assert m.num_draft_tokens() == 2 + 4 + 8 + 8 * 5 and m.reach() == 8
    d, rule, k = build_method("sjd-proactive", {"window": 6}, MethodContext())
    assert (d.coupling, d.branch, d.depth, d.spines, k) == ("maximal", 4, 2, 1, 4 + 16 + 4)


@pytest.mark.parametrize("kwargs,match", [
    (dict(continuation=1), "continuation=1: a proactive tree"),
    (dict(tree_branch=0), "tree_branch=0"),
    (dict(tree_depth=True), "tree_depth=True"),
    (dict(tree_spines=-1), "tree_spines=-1"),
    (dict(event_shape=(2,)), "token streams"),
])
def test_bad_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ProactiveJacobi(4, **{"coupling": "maximal", **kwargs})


@pytest.mark.parametrize("name", ["janus", "emu3", "llamagen", "token-span"])
def test_image_adapters_greedy_equals_plain_greedy(name):
    """Through the text-to-image front door of every image adapter, with guidance, dynamic and
    static caches."""
    from tiny_image import PIPES, tiny_vq

    pipe, prompts = PIPES[name](tiny_vq())
    kw = dict(guidance_scale=3.0, temperature=0, progress=False, seed=0)
    plain = pipe(prompts, method="plain", **kw)
    for static in (False, True):
        out = pipe(prompts, method="sjd-proactive", window=6, static_cache=static, **kw)
        assert torch.equal(out.tokens, plain.tokens), static


def test_sampled_images_through_the_front_door():
    """Sampling at the adapter's defaults runs every row to its image with fewer steps than
    tokens and a tree of the registered size per step."""
    from tiny_image import PIPES, tiny_vq

    pipe, prompts = PIPES["token-span"](tiny_vq())
    out = pipe(prompts, method="sjd-proactive", window=4, guidance_scale=2.0, seed=0,
               progress=False)
    assert out.tokens.shape[1] == pipe.target.num_tokens
    assert out.stats.drafted_by_position and out.stats.steps < pipe.target.num_tokens
    assert mmspec.ProactiveJacobi is ProactiveJacobi
