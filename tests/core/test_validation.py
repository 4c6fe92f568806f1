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


# -- obscure inputs: each a clear error naming the parameter, before any forward -----------

def _gen(**kw):
    def call(models):
        target, draft = models
        args = dict(target=target, draft=draft, input_ids=IDS)
        args.update(kw)
        return mmspec.generate(args.pop("target"), args.pop("draft"), args.pop("input_ids"), **args)
    return call


GENERATE_CASES = [
    (_gen(top_p="0.9"), r"top_p='0.9' is out of range"),
    (_gen(seed="abc"), r"seed='abc': accepted None or an integer"),
    (_gen(seed=1.5), r"seed=1.5: accepted None or an integer"),
    (_gen(stop_token_ids=5), r"stop_token_ids=5: accepted a list of token ids"),
    (_gen(max_new_tokens=True), r"max_new_tokens=True: accepted an integer >= 1"),
    (_gen(target=None), r"target=None: accepted a transformers causal LM object"),
    (_gen(target="path/to/model"), r"target='path/to/model': accepted a transformers causal LM"),
    (_gen(draft="path/to/draft"), r"draft='path/to/draft': accepted a transformers causal LM"),
    (_gen(temperature=True), r"temperature=True is out of range"),
    (_gen(rule="pcg", temperature="1"), r"temperature='1' is out of range"),
]


@pytest.mark.parametrize("call,match", GENERATE_CASES)
def test_obscure_generate_inputs_are_clear_errors(models, call, match):
    with pytest.raises(ValueError, match=match):
        call(models)


def test_a_rule_named_alone_is_built_on_the_targets_embeddings(pair):
    target, draft = pair
    ids = torch.tensor([[1, 2, 3]])
    for name in ("lantern", "gsd", "pcg", "annealed"):
        out = mmspec.generate(target, draft, ids, rule=name, max_new_tokens=6, seed=0)
        assert out.num_generated.tolist() == [6], name


def test_obscure_pipeline_inputs_are_clear_errors(tmp_path):
    import os

    from modalities.image import TextToImage
    from modalities.image.continuous import ContinuousImageGenerator
    from modalities.speech import TextToSpeech
    from modalities.vlm import VisionLanguageGenerator
    from mmspec.acceptance import CoarseGrained

    with pytest.raises(ValueError, match=r"target=123: accepted an ImageAdapter"):
        TextToImage(123)
    missing = str(tmp_path / "no-such-model")
    for load in (TextToImage.from_pretrained, TextToSpeech.from_pretrained,
                 VisionLanguageGenerator.from_pretrained, ContinuousImageGenerator.from_pretrained):
        with pytest.raises(ValueError, match=r"no such model folder"):
            load(missing)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match=rf"{broken}: could not load"):
        VisionLanguageGenerator.from_pretrained(str(broken))
    with pytest.raises(ValueError, match=r"theta='high': accepted a cosine threshold"):
        CoarseGrained(torch.randn(4, 2), theta="high")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    t2i = TextToImage.from_pretrained(os.path.join(root, "samples", "models", "shapes-t2i"))
    with pytest.raises(ValueError, match=r"class_labels: accepted by class-conditional models only"):
        t2i(class_labels=[1], progress=False)
    with pytest.raises(ValueError, match=r"prompt=None: accepted a string"):
        t2i(progress=False)
    cont = ContinuousImageGenerator.from_pretrained(
        os.path.join(root, "samples", "models", "shapes-continuous"))
    with pytest.raises(ValueError, match=r"class_labels='a red circle': accepted class ids"):
        cont("a red circle")
    tts = TextToSpeech.from_pretrained(os.path.join(root, "samples", "models", "shapes-tts"))
    with pytest.raises(ValueError, match=r"guidance_scale='3': accepted a finite float >= 0"):
        tts("a red circle", guidance_scale="3", progress=False)


def test_truncated_weights_name_their_path(tmp_path):
    import os
    import shutil

    from modalities.image import TextToImage

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    src = os.path.join(root, "samples", "models", "shapes-t2i-draft")
    dst = tmp_path / "cut"
    shutil.copytree(src, dst)
    shutil.copytree(os.path.join(root, "samples", "models", "shapes-vq"), tmp_path / "shapes-vq")
    weights = dst / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:5000])
    with pytest.raises(ValueError, match=rf"{dst}: could not load LlamaForCausalLM"):
        TextToImage.from_pretrained(str(dst))
    shutil.rmtree(tmp_path / "shapes-vq")
    with pytest.raises(ValueError, match=r"shapes-vq': no such model folder"):
        TextToImage.from_pretrained(str(dst))


def test_hub_ids_are_not_taken_for_missing_folders(monkeypatch):
    """ "name" and "org/name" go to transformers (here offline: its error, with the id named);
    only paths that look local are refused as missing folders."""
    from modalities.registry import load_pretrained
    from transformers import AutoConfig

    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # the hub reads the variable once, at import: its constant too, so no request is tried
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    for hub_id in ("gpt2-nonexistent-here", "org/model-nonexistent-here"):
        with pytest.raises(ValueError, match=rf"{hub_id}: could not load AutoConfig"):
            load_pretrained(AutoConfig, hub_id)
    with pytest.raises(ValueError, match="no such model folder"):
        load_pretrained(AutoConfig, "./not/a/folder")
