"""Rollback of recurrent layers (Qwen3.5's Gated DeltaNet linear attention): after a step
that keeps m of its fed tokens, every row's recurrent and convolution states equal those of
feeding the kept tokens alone, exactly in float32, for every m and ragged rows; speculative
greedy equals plain greedy and transformers' own generate, on dynamic and static caches. Draft
trees verified on a dynamic cache, fed as their root-to-leaf paths: each node's outputs are
its path's, a committed path leaves the states of its tokens alone, and sampling through
trees keeps the target's distribution."""

from __future__ import annotations

import copy

import pytest
import torch

import mmspec
from mmspec.cache import recurrent_layers
from mmspec.sampling import SamplingParams
from mmspec.sessions import CausalLMSession
from conftest import qwen35_prompt as _prompt, tiny_qwen35


def _states(session):
    return [(layer.conv_states[0].clone(), layer.recurrent_states[0].clone())
            for layer in recurrent_layers(session.cache)]


def _lengths(session):
    """A static cache's attention layers' lengths (what their ``update`` moves in place)."""
    return [int(layer.cumulative_length) for layer in session.cache.layers
            if isinstance(getattr(layer, "cumulative_length", None), torch.Tensor)]


def _session(model, static):
    return CausalLMSession(model, SamplingParams(temperature=0),
                           static_len=64 if static else None)


@pytest.mark.parametrize("static", [False, True])
def test_states_after_a_commit_equal_feeding_the_kept_tokens_alone(static):
    model = tiny_qwen35()
    ids, mask = _prompt()
    k = 4
    fed = torch.randint(3, 48, (3, k + 1), generator=torch.Generator().manual_seed(1))
    for kept in ([1, 1, 1], [5, 5, 5], [2, 5, 1], [3, 1, 4], [5, 2, 2]):   # per row, ragged
        s = _session(model, static)
        s.prefill(ids, mask)
        s.step(fed)
        keep = max(kept)
        valid = torch.tensor([[1] * m + [0] * (keep - m) for m in kept])
        s.commit(keep, valid)
        got = _states(s)
        for row, m in enumerate(kept):
            ref = _fed_alone(model, static, ids, mask, fed[:, :m])
            for (conv, rec), (conv_ref, rec_ref) in zip(got, _states(ref)):
                assert torch.equal(conv[row], conv_ref[row]), (kept, row)
                assert torch.equal(rec[row], rec_ref[row]), (kept, row)
        # the next step continues from there: each row as after its kept tokens alone
        nxt = torch.randint(3, 48, (3, 2), generator=torch.Generator().manual_seed(2))
        p = s.step(nxt)
        for row, m in enumerate(kept):
            ref = _fed_alone(model, static, ids, mask, fed[:, :m])
            torch.testing.assert_close(p[row], ref.step(nxt)[row], rtol=1e-5, atol=1e-6)


def _fed_alone(model, static, ids, mask, tokens):
    """A session that was fed only ``tokens`` after the prompt (every row the same count)."""
    ref = _session(model, static)
    ref.prefill(ids, mask)
    if tokens.shape[1]:
        ref.step(tokens)
        ref.commit(tokens.shape[1], torch.ones_like(tokens))
    return ref


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("k", [1, 3, 8])
def test_speculative_greedy_equals_plain_and_the_models_own(static, k):
    target = tiny_qwen35()
    draft = copy.deepcopy(target)                 # close to the target: partial acceptance
    with torch.no_grad():
        g = torch.Generator().manual_seed(3)
        for p in draft.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=g))
    ids, mask = _prompt()
    own = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=16)
    kw = dict(attention_mask=mask, max_new_tokens=16, temperature=0, static_cache=static)
    plain = mmspec.generate(target, None, ids, **kw)
    assert torch.equal(plain.sequences, own)
    spec = mmspec.generate(target, draft, ids, num_draft_tokens=k, **kw)
    assert torch.equal(spec.sequences, plain.sequences)
    assert 0 < spec.stats.acceptance_rate < 1             # rollbacks happened
    jacobi = mmspec.generate(target, mmspec.Jacobi(window=k), ids, **kw)
    assert torch.equal(jacobi.sequences, plain.sequences)


def test_without_the_restore_the_tokens_differ(monkeypatch):
    """The check above can fail: skipping the snapshot's restore changes the tokens."""
    from mmspec.cache import StateSnapshot

    target = tiny_qwen35()
    draft = tiny_qwen35(seed=1)
    ids, mask = _prompt()
    kw = dict(attention_mask=mask, max_new_tokens=16, temperature=0, stop_token_ids=[])
    plain = mmspec.generate(target, None, ids, **kw)
    monkeypatch.setattr(StateSnapshot, "restore", lambda self, rows=None: None)
    spec = mmspec.generate(target, draft, ids, num_draft_tokens=3, **kw)
    assert not torch.equal(spec.sequences, plain.sequences)


def test_a_recurrent_draft_holds_exactly_the_tokens_its_rows_kept():
    """A draft model with recurrent layers is never queued with holes (``host_free`` off),
    and after a step whose rows accepted K, 1 and 0 of its drafts, each row's states are
    those of feeding the last emitted token and its accepted drafts alone."""
    from mmspec.drafters import ModelDrafter
    from mmspec.types import PAD, VerifyOutput

    model, k = tiny_qwen35(seed=1), 3
    ids, mask = _prompt()
    drafter = ModelDrafter(_session(model, False), num_tokens=k, host_free=True)
    assert not drafter.host_free
    drafter.begin(ids, mask)
    last = torch.tensor([5, 6, 7])
    draft = drafter.propose(last, k)
    n = torch.tensor([k, 1, 0])
    tokens = torch.full((3, k + 1), PAD)
    for row, m in enumerate(n.tolist()):
        tokens[row, :m] = draft.tokens[row, :m]
        tokens[row, m] = 9                                       # the recovered or bonus token
    drafter.observe(VerifyOutput(tokens=tokens, num_accepted=n), None, n.tolist())
    got = _states(drafter.session)
    fed = torch.cat([last[:, None], draft.tokens], 1)
    for row, m in enumerate(n.tolist()):
        ref = _states(_fed_alone(model, False, ids, mask, fed[:, :m + 1]))
        for (conv, rec), (conv_ref, rec_ref) in zip(got, ref):
            torch.testing.assert_close(conv[row], conv_ref[row], rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(rec[row], rec_ref[row], rtol=1e-5, atol=1e-6)


# -- draft trees: verified as their paths, on dynamic and static caches ------------------

@pytest.mark.parametrize("static", [False, True])
def test_a_tree_step_gives_each_node_its_paths_outputs_and_commits_a_path(static):
    """Every node's distribution and features equal those of feeding its path as a chain;
    the cache is untouched by the tree (a static cache's lengths included); after a commit
    of a path per row (ragged), the states and the next step equal a session that was fed
    the paths alone."""
    from mmspec.tree import Tree
    from conftest import path_to

    model = tiny_qwen35()
    ids, mask = _prompt()
    tree = Tree.from_parents((0, 0, 1, 1, 2, 4), batch=3)         # depths up to 4, 4 leaves
    nodes = torch.randint(3, 48, (3, 7), generator=torch.Generator().manual_seed(4))
    nodes[:, 0] = ids[:, -1]
    sess = _session(model, static)
    assert sess.tree_verify and not sess.trees
    sess.keep_features((1, 4))
    sess.prefill(ids, mask)
    before, lengths = _states(sess), _lengths(sess)
    p = sess.step(nodes, tree=tree)
    feats = sess.features
    assert all(torch.equal(a, b) for x, y in zip(before, _states(sess)) for a, b in zip(x, y))
    assert _lengths(sess) == lengths and (len(lengths) > 0) == static
    for node in range(7):
        chain = path_to(tree, node)
        ref = _session(model, static)
        ref.keep_features((1, 4))
        ref.prefill(ids, mask)
        torch.testing.assert_close(p[:, node], ref.step(nodes[:, chain])[:, -1],
                                   rtol=1e-5, atol=1e-6)
        # hidden states (larger than probabilities): the padded path's length rounds apart
        torch.testing.assert_close(feats[:, node], ref.features[:, -1], rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="one tree step after a commit"):
        sess.step(nodes, tree=tree)
    # row 0 keeps root-1-3-6, row 1 root-2-5, row 2 only the root
    path = torch.tensor([[0, 1, 3, 6], [0, 2, 5, 0], [0, 0, 0, 0]])
    valid = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [1, 0, 0, 0]])
    sess.commit(4, valid, path)
    nxt = torch.tensor([[9], [10], [11]])
    got_states, got = _states(sess), sess.step(nxt)
    for row, m in enumerate(valid.sum(1).tolist()):
        ref = _fed_alone(model, static, ids, mask, nodes.gather(1, path)[:, :m])
        for (conv, rec), (conv_ref, rec_ref) in zip(got_states, _states(ref)):
            torch.testing.assert_close(conv[row], conv_ref[row], rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(rec[row], rec_ref[row], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got[row], ref.step(nxt)[row], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", [dict(depth=3, branch=2, width=2),
                                   dict(depth=4, branch=3, width=2, nodes=6)])
def test_a_draft_heads_trees_give_plain_greedy_on_a_recurrent_target(shape):
    """A head's trees on a Qwen3.5 target, on dynamic and static caches (trees verified as
    their paths): plain greedy's tokens, with drafts accepted."""
    from mmspec.drafters import DraftHead, FeatureDrafter

    target = tiny_qwen35(vocab=8)
    ids, mask = _prompt()
    ids = ids % 8
    kw = dict(attention_mask=mask, temperature=0, max_new_tokens=16, stop_token_ids=[])
    plain = mmspec.generate(target, None, ids, **kw)
    torch.manual_seed(5)
    head = DraftHead.for_target(target)
    for static in (False, True):
        drafter = FeatureDrafter(head, **shape)
        out = mmspec.generate(target, input_ids=ids, drafter=drafter, static_cache=static, **kw)
        assert out.sequences.tolist() == plain.sequences.tolist(), static
        assert drafter.trees and out.stats.accepted > 0, static
    one = ids[:, -1:]                    # one-token prompts: the first tree meets an empty cache
    kw["attention_mask"] = torch.ones_like(one)
    expected = mmspec.generate(target, None, one, **kw).sequences.tolist()
    for static in (False, True, True):   # the second static call reuses the first one's cache
        out = mmspec.generate(target, input_ids=one, drafter=FeatureDrafter(head, **shape),
                              static_cache=static, **kw)
        assert out.sequences.tolist() == expected, static


@pytest.mark.parametrize("broken", [False, True])
def test_sampling_through_trees_on_a_recurrent_target_keeps_its_distribution(monkeypatch,
                                                                             broken):
    """8,000 rows, three tokens of four ids, a head's depth-2 trees (two children per node,
    the best node of each level expanded, drawn from q without replacement): the emitted
    sequences follow the target's exact distribution; when every node reads the first path's
    outputs at its depth (``Tree.paths`` broken), 4,000 rows show they do not. (transformers'
    reference linear attention pads every multi-token step to 64 positions, so rows cost;
    tree sampling itself is checked on 20,000 rows in tests/core/test_tree.py.)"""
    import numpy as np
    from stats_util import tv, tv_threshold
    from stats_util import chi_square_pvalue, continuation_distribution as _continuation_distribution

    from mmspec.drafters import DraftHead, FeatureDrafter
    from mmspec.tree import Tree

    if broken:
        right = Tree.paths
        monkeypatch.setattr(Tree, "paths", lambda t: (right(t)[0], torch.zeros_like(right(t)[1])))
    target = tiny_qwen35(vocab=4, seed=2)
    prompt, m, n = [3, 1, 3], 3, 4_000 if broken else 8_000
    exact = _continuation_distribution(target, prompt, m, 1.0)
    torch.manual_seed(6)
    drafter = FeatureDrafter(DraftHead.for_target(target), depth=2, branch=2, width=1)
    out = mmspec.generate(target, input_ids=torch.tensor(prompt).expand(n, -1).contiguous(),
                          drafter=drafter, temperature=1.0, max_new_tokens=m, seed=0,
                          stop_token_ids=[])
    code = (out.sequences[:, len(prompt):] * torch.tensor([16, 4, 1])).sum(1)
    got = np.bincount(code.numpy(), minlength=4 ** m).astype(float)
    assert out.stats.histogram[1] > 100 and out.stats.histogram[2] > 100
    if broken:
        assert chi_square_pvalue(got, exact) < 1e-4
    else:
        assert tv(got / n, exact) < tv_threshold(exact, n)
        assert chi_square_pvalue(got, exact) > 1e-4
