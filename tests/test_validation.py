"""Bad input raises ValueError naming the parameter and the accepted range, before any model runs."""

from __future__ import annotations

import pytest
import torch

import mmspec
from mmspec.acceptance import Exact
from mmspec.sampling import SamplingParams
from conftest import tiny_llama


class Exploding(torch.nn.Module):
    """Wraps a model and fails if it is ever called: checks happen before any forward."""

    def __init__(self, model):
        super().__init__()
        self.inner = model
        self.config = model.config
        self.generation_config = model.generation_config

    def get_output_embeddings(self):
        return self.inner.get_output_embeddings()

    def forward(self, *a, **k):
        raise AssertionError("the model ran before the input was validated")


@pytest.fixture(scope="module")
def models():
    return Exploding(tiny_llama(vocab=16)), Exploding(tiny_llama(vocab=16, hidden=16, layers=1))


IDS = torch.tensor([[1, 2, 3]])


@pytest.mark.parametrize("kwargs,match", [
    (dict(num_draft_tokens=0), r"num_draft_tokens=0.*>= 1"),
    (dict(temperature=-0.5), r"temperature=-0.5.*>= 0"),
    (dict(temperature=float("nan")), r"temperature=nan"),
    (dict(top_p=0.0), r"top_p=0.0.*\(0, 1\]"),
    (dict(top_p=1.5), r"top_p=1.5.*\(0, 1\]"),
    (dict(top_k=0), r"top_k=0.*>= 1"),
    (dict(max_new_tokens=0), r"max_new_tokens=0.*>= 1"),
    (dict(rule="nonsense"), r"rule='nonsense'.*accepted one of"),
])
def test_bad_settings(models, kwargs, match):
    target, draft = models
    with pytest.raises(ValueError, match=match):
        mmspec.generate(target, draft, IDS, **kwargs)


def test_vocabulary_mismatch(models):
    target, _ = models
    other = Exploding(tiny_llama(vocab=20, hidden=16, layers=1))
    with pytest.raises(ValueError, match=r"vocabulary mismatch.*20.*16"):
        mmspec.generate(target, other, IDS)


def test_prompt_longer_than_positions():
    target = Exploding(tiny_llama(vocab=16, max_positions=8))
    with pytest.raises(ValueError, match=r"longer than the target's max_position_embeddings=8"):
        mmspec.generate(target, None, torch.ones(1, 9, dtype=torch.long))
    with pytest.raises(ValueError, match=r"max_new_tokens=10.*accepted max_new_tokens <= 4"):
        mmspec.generate(target, None, torch.ones(1, 4, dtype=torch.long), max_new_tokens=10)


def test_bad_prompt_shapes(models):
    target, draft = models
    with pytest.raises(ValueError, match="input_ids must be a \\[B, P\\] long tensor"):
        mmspec.generate(target, draft, torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="attention_mask must match"):
        mmspec.generate(target, draft, IDS, attention_mask=torch.ones(1, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="left-padded"):
        mmspec.generate(target, draft, IDS, attention_mask=torch.tensor([[1, 1, 0]]))
    with pytest.raises(ValueError, match=r"ids in \[0, 15\]"):
        mmspec.generate(target, draft, torch.tensor([[1, 99]]))


def test_nan_logits_in_a_rule():
    p = torch.full((1, 2, 4), 0.25)
    p[0, 1, 2] = float("nan")
    with pytest.raises(ValueError, match="target_probs contains NaN or inf"):
        Exact()(torch.tensor([[1]]), None, p)
    q = torch.full((1, 1, 4), 0.25)
    q[0, 0, 0] = float("inf")
    with pytest.raises(ValueError, match="draft_probs contains NaN or inf"):
        Exact()(torch.tensor([[1]]), q, torch.full((1, 2, 4), 0.25))


def test_rule_shape_errors():
    with pytest.raises(ValueError, match=r"target_probs must be \[B, K\+1, V\]"):
        Exact()(torch.tensor([[1, 2]]), None, torch.full((1, 2, 4), 0.25))
    with pytest.raises(ValueError, match="draft_probs must be None or"):
        Exact()(torch.tensor([[1]]), torch.full((1, 1, 5), 0.2), torch.full((1, 2, 4), 0.25))
    with pytest.raises(ValueError, match=r"draft_tokens must be ids in \[0, 3\]"):
        Exact()(torch.tensor([[7]]), None, torch.full((1, 2, 4), 0.25))


def test_nan_logits_from_a_model_are_reported():
    model = tiny_llama(vocab=16)
    with torch.no_grad():
        model.lm_head.weight[3, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN or inf probabilities"):
        mmspec.generate(model, None, IDS, max_new_tokens=2)
    # Greedy decoding too: the one-hot distribution carries the NaN (argmax propagates it).
    with pytest.raises(ValueError, match="NaN or inf probabilities"):
        mmspec.generate(model, None, IDS, max_new_tokens=2, temperature=0)
    with pytest.raises(ValueError, match="NaN or inf probabilities"):
        mmspec.generate(model, model, IDS, max_new_tokens=2, temperature=0, static_cache=True)


def test_sampling_params_processing():
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0]])
    p = SamplingParams(top_k=2).probs(logits)
    assert (p[0, 2:] == 0).all() and torch.isclose(p.sum(), torch.tensor(1.0))
    p = SamplingParams(top_p=0.5).probs(logits)
    assert int((p > 0).sum()) == 1
    g = SamplingParams(temperature=0).probs(logits)
    assert g.tolist() == [[1.0, 0.0, 0.0, 0.0]]
    p = SamplingParams(min_p=0.3).probs(logits)
    assert int((p > 0).sum()) == 2
