"""The bundled shapes-world models load through from_pretrained and generate; a seeded
generation of the continuous pair reproduces committed latents (the token models' references:
test_bundled_regression.py)."""

from __future__ import annotations

import json
import os

import pytest
import torch

from modalities import shapes_world as sw
from modalities.image import TextToImage

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODELS = os.path.join(ROOT, "samples", "models")


@pytest.fixture(scope="module")
def pipe():
    return TextToImage.from_pretrained(os.path.join(MODELS, "shapes-t2i"),
                                       draft=os.path.join(MODELS, "shapes-t2i-draft"))


def test_bundled_pair_generates_a_16x16_grid_that_decodes_to_64x64(pipe):
    assert pipe.target.grid == (16, 16) and pipe.target.vocab_size == 512
    out = pipe("a large yellow star at the centre", method="sjd", seed=1, progress=False)
    assert out.tokens.shape == (1, 256)
    assert out.images[0].size == (64, 64)
    assert pipe.defaults["guidance_scale"] == 3.0


@pytest.fixture(scope="module")
def continuous():
    from modalities.image.continuous import ContinuousImageGenerator

    return ContinuousImageGenerator.from_pretrained(
        os.path.join(MODELS, "shapes-continuous"), draft=os.path.join(MODELS, "shapes-continuous-draft"))


def test_bundled_continuous_pair_generates_latents_that_decode_to_64x64(continuous):
    cfg = continuous.target.config
    assert cfg.head == continuous.draft.config.head == "mixture"
    assert tuple(cfg.grid) == (16, 16) and cfg.latent_dim == continuous.draft.config.latent_dim
    out = continuous(prompts=["a large yellow star at the centre"], seed=1, num_draft_tokens=2)
    assert out.latents.shape == (1, 256, cfg.latent_dim) and torch.isfinite(out.latents).all()
    assert out.images[0].size == (64, 64)
    assert out.stats.extra["density_exact"] and out.stats.accepted > 0


def test_bundled_continuous_seeded_generation_reproduces_committed_latents(continuous):
    with open(os.path.join(ROOT, "tests", "data", "bundled_continuous_seed0.json")) as f:
        ref = json.load(f)
    out = continuous(prompts=ref["captions"], seed=ref["seed"], temperature=ref["temperature"],
                     num_draft_tokens=ref["num_draft_tokens"], decode=False)
    got = out.latents[:, :16].flatten(1)
    assert torch.allclose(got, torch.tensor(ref["first_latents"]), atol=1e-4)
    assert (out.stats.steps, out.stats.accepted) == (ref["target_steps"], ref["accepted"])


def test_model_cards_and_sizes():
    total = 0
    names = sorted(os.listdir(MODELS))
    assert {"shapes-vq", "shapes-t2i", "shapes-t2i-draft", "shapes-features", "shapes-continuous",
            "shapes-continuous-draft"} <= set(names)
    for name in names:
        folder = os.path.join(MODELS, name)
        assert os.path.isfile(os.path.join(folder, "README.md"))
        for f in os.listdir(folder):
            size = os.path.getsize(os.path.join(folder, f))
            assert size < 15_000_000, f
            total += size
        assert not any(f.endswith((".bin", ".pt", ".pth", ".pkl")) for f in os.listdir(folder))
    # the bundled pairs of every modality, LLaVA, Qwen-VL, the heads (the image heads in
    # float32, as measured: 6.6 MB and 8.5 MB; the EAGLE-3 answer head 8.0 MB)
    assert total < 105_000_000


def test_bundled_feature_net_reads_scenes():
    from modalities.shapes_features import ShapesFeatureNet, split_logits, targets
    from recipes.train.data import to_tensor

    import numpy as np
    net = ShapesFeatureNet.load(os.path.join(MODELS, "shapes-features"))
    scenes, imgs = [], []
    for s in range(20_000_000, 20_000_020):
        sc, im, _ = sw.sample(s)
        scenes.append(sc)
        imgs.append(np.asarray(im))
    with torch.no_grad():
        logits = net(to_tensor(np.stack(imgs), "cpu"))
    pred = torch.stack([lg.argmax(-1) for lg in split_logits(logits)], -1)
    want = torch.stack([targets(s) for s in scenes])
    assert (pred == want).all(-1).all(-1).float().mean() >= 0.9


def test_repro_check_reports_identical_runs_on_the_cpu():
    from eval.repro_check import main

    res = main(["--num-prompts", "2", "--repeats", "2", "--device", "cpu"])
    assert res["rows"] == 2 and res["identical_rows"] == [2]
    assert res["forward_bitwise_equal"] == [True]
