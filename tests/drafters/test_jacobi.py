"""Speculative Jacobi decoding: greedy equality, losslessness of SJD and its couplings,
guidance, and bad input."""

from __future__ import annotations

import pytest
import torch

import mmspec
from mmspec.drafters.jacobi import COUPLINGS, INITS, Jacobi
from conftest import tiny_llama
from jacobi_checks import model_counts, model_distribution
from stats_util import chi_square_pvalue, tv, tv_threshold


@pytest.mark.parametrize("window", [2, 8, 16])
@pytest.mark.parametrize("init", INITS)
def test_greedy_jacobi_equals_plain_greedy(pair, ragged_prompts, window, init):
    target, _ = pair
    ids, mask = ragged_prompts
    plain = mmspec.generate(target, None, ids, attention_mask=mask, temperature=0,
                            max_new_tokens=20)
    for coupling in COUPLINGS:
        out = mmspec.generate(target, None, ids, attention_mask=mask, temperature=0,
                              max_new_tokens=20, seed=1,
                              drafter=Jacobi(window, init=init, coupling=coupling, grid_width=4))
        assert torch.equal(out.sequences, plain.sequences), coupling


@pytest.fixture(scope="module")
def jac_model():
    return tiny_llama(vocab=6, hidden=32, seed=5, scale=5.0)


def _exact3(model, prompt, m=3, guidance=None, uncond=None):
    return model_distribution(model, prompt, m, guidance, uncond)


def _hist(model, prompt, drafter, n, seed, m=3, rule="exact", **kw):
    return model_counts(model, prompt, drafter, n, seed, m, rule, **kw)


@pytest.mark.parametrize("coupling", COUPLINGS)
@pytest.mark.parametrize("init", ["uniform", "sample_horizon"])
def test_jacobi_sampling_is_lossless(jac_model, coupling, init):
    prompt, n = [1, 2, 3], 40_000            # two seeded batches of 20,000 rows
    exact = _exact3(jac_model, prompt)
    runs = [_hist(jac_model, prompt, Jacobi(4, init=init, coupling=coupling, grid_width=2),
                  n // 2, seed=seed) for seed in (0, 1)]
    counts, st = runs[0][0] + runs[1][0], runs[0][1]
    assert st.acceptance_rate > 0.05          # drafts are accepted, so the test means something
    assert tv(counts / n, exact) < tv_threshold(exact, n)
    assert chi_square_pvalue(counts, exact) > 1e-4


class BrokenCoupling(Jacobi):
    """Keeps every old draft but records q = p_new: marginals are not preserved."""

    def _couple(self, p_new, old_tok, old_q, has_old):
        return torch.where(has_old, old_tok, p_new.argmax(-1))


class ResampleFromP(mmspec.Exact):
    def residual(self, x, p, q, pos):
        return p


@pytest.mark.parametrize("broken", ["coupling", "residual"])
def test_lossless_check_detects_breakage(jac_model, broken):
    prompt, n = [1, 2, 3], 20_000
    exact = _exact3(jac_model, prompt)
    if broken == "coupling":
        counts, _ = _hist(jac_model, prompt, BrokenCoupling(4, coupling="maximal"), n, seed=0)
    else:
        counts, _ = _hist(jac_model, prompt, Jacobi(4, coupling="maximal"), n, seed=0,
                          rule=ResampleFromP())
    assert chi_square_pvalue(counts, exact) < 1e-4


def test_guided_jacobi_matches_guided_plain(jac_model):
    prompt, uncond = [1, 2, 3], [0, 0, 5]
    ids = torch.tensor([prompt, [4, 3, 2]])
    un = torch.tensor([uncond, uncond])
    kw = dict(guidance_scale=2.5, uncond_input_ids=un, max_new_tokens=12)
    plain = mmspec.generate(jac_model, None, ids, temperature=0, **kw)
    jac = mmspec.generate(jac_model, None, ids, temperature=0, seed=0,
                          drafter=Jacobi(6, coupling="gumbel"), **kw)
    assert torch.equal(plain.sequences, jac.sequences)
    # sampling: the guided distribution of 3-token continuations
    n = 20_000
    exact = _exact3(jac_model, prompt, guidance=2.5, uncond=uncond)
    counts, _ = _hist(jac_model, prompt, Jacobi(4, coupling="maximal"), n, seed=3,
                      guidance_scale=2.5,
                      uncond_input_ids=torch.tensor(uncond).expand(n, -1).contiguous())
    assert chi_square_pvalue(counts, exact) > 1e-4


def test_guided_probabilities_equal_hand_computation(jac_model):
    """The session's guided p equals u + s (c - u) from separate passes, then softmax."""
    from mmspec.sessions import CausalLMSession

    ids, un = torch.tensor([[1, 2, 3, 4]]), torch.tensor([[0, 0, 5, 1]])
    s = CausalLMSession(jac_model, mmspec.SamplingParams(temperature=0.7), guidance_scale=3.0)
    with torch.no_grad():
        s.prefill(ids, torch.ones_like(ids), uncond_ids=un, uncond_mask=torch.tensor([[0, 0, 1, 1]]))
        got = s.step(torch.tensor([[4, 2]]))
        c = jac_model(torch.tensor([[1, 2, 3, 4, 2]])).logits[:, -2:]
        u = jac_model(torch.tensor([[5, 1, 2]])).logits[:, -2:]
    want = torch.softmax((u + 3.0 * (c - u)) / 0.7, -1)
    assert torch.allclose(got, want, atol=1e-5)


def test_jacobi_with_relaxed_rule_runs(jac_model):
    ids = torch.tensor([[1, 2, 3], [3, 2, 1]])
    emb = jac_model.get_input_embeddings().weight.detach()
    out = mmspec.generate(jac_model, None, ids, max_new_tokens=16, seed=0,
                          drafter=Jacobi(8, coupling="maximal"),
                          rule=mmspec.acceptance.Grouped(emb, group_size=3))
    assert out.num_generated.tolist() == [16, 16]
    assert out.stats.steps < 16


def test_coupling_reaches_beyond_plain_sjd():
    """On a peaked model, coupled drafts keep more of the window than independent redraws."""
    model = tiny_llama(vocab=6, hidden=32, seed=5, scale=3.0)
    ids = torch.tensor([[1, 2, 3]]).expand(64, -1).contiguous()
    steps = {}
    for c in COUPLINGS:
        out = mmspec.generate(model, None, ids, max_new_tokens=32, seed=0, stop_token_ids=[],
                              drafter=Jacobi(16, coupling=c))
        steps[c] = out.stats.tokens_per_step
    assert steps["maximal"] > steps["none"] and steps["gumbel"] > steps["none"]


@pytest.mark.parametrize("kwargs,match", [
    (dict(window=0), r"window=0.*>= 1"),
    (dict(init="nope"), r"init='nope'"),
    (dict(coupling="nope"), r"coupling='nope'"),
    (dict(init="repeat_horizon"), "needs grid_width"),
    (dict(init="repeat_vertical", grid_width=5, span_length=16), r"grid_width=5 does not divide"),
    (dict(init_range=(5, 2)), r"init_range=\(5, 2\)"),
])
def test_bad_jacobi_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Jacobi(**kwargs)


def test_init_range_outside_vocabulary(jac_model):
    with pytest.raises(ValueError, match=r"init_range=\(2, 40\).*\[0, 6\)"):
        mmspec.generate(jac_model, None, torch.tensor([[1, 2]]), drafter=Jacobi(4, init_range=(2, 40)))
