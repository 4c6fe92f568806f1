"""CSpD end to end on tiny continuous-token image models (mixture and diffusion heads)."""

from __future__ import annotations

import pytest
import torch

from mmspec.acceptance import ContinuousExact
from modalities.image.continuous import ContinuousARModel, ContinuousImageGenerator
from stats_util import energy_test_pvalue
from tiny_continuous import tiny_continuous

N = 1500


class ResidualFromTarget(ContinuousExact):
    """The flaw the end-to-end test must catch: a rejected draft replaced by a draw from p."""

    def residual_sample(self, p, q, generator=None):
        y = p.sample(generator)
        return y, torch.zeros(y.shape[0], dtype=torch.bool), torch.ones(y.shape[0], dtype=torch.long)


@pytest.fixture(scope="module")
def mixture_pair():
    return (tiny_continuous("mixture", seed=0, spread=0.6),
            tiny_continuous("mixture", layers=1, seed=1, spread=1.5))


def joint(out):
    return out.latents.reshape(out.latents.shape[0], -1).numpy()     # first two tokens, [N, 4]


def test_mixture_joint_of_first_two_tokens_matches_plain(mixture_pair):
    target, draft = mixture_pair
    gen = ContinuousImageGenerator(target, draft)
    labels = [i % 5 for i in range(N)]
    spec = gen(labels, num_draft_tokens=2, seed=1)
    plain = gen(labels, seed=2, use_draft=False)
    st = spec.stats
    assert 0.05 < st.acceptance_rate < 0.95          # the draft differs: both paths are exercised
    assert st.extra["rejections"] > 100 and st.extra["residual_proposals"] >= st.extra["rejections"]
    assert st.extra["density_exact"] is True
    assert torch.isfinite(spec.latents).all()
    assert energy_test_pvalue(joint(spec), joint(plain)) > 0.005
    # The same test catches a rejected draft replaced by a plain draw from the target.
    bad = gen(labels, num_draft_tokens=2, seed=1, rule=ResidualFromTarget())
    assert energy_test_pvalue(joint(bad), joint(plain)) < 0.005


def test_mixture_batch_rows_are_independent_of_batching(mixture_pair):
    target, draft = mixture_pair
    gen = ContinuousImageGenerator(target, draft)
    out = gen([0, 3], num_draft_tokens=3, seed=0)
    assert out.latents.shape == (2, 2, 2)
    assert out.stats.steps >= 1 and out.stats.emitted >= 2


@pytest.fixture(scope="module")
def diffusion_pair():
    """Tiny diffusion-head models trained briefly on a two-token synthetic sequence (an
    untrained denoiser is not a sampler)."""
    from recipes.train.continuous import train_synthetic

    target, _, _ = train_synthetic("tiny", "diffusion", steps=250, length=2)
    draft, _, _ = train_synthetic("tiny-draft", "diffusion", steps=250, length=2, seed=1)
    return target, draft


@pytest.mark.parametrize("aligned", [True, False])
def test_diffusion_head_spec_matches_plain_chain(diffusion_pair, aligned):
    target, draft = diffusion_pair
    gen = ContinuousImageGenerator(target, draft)
    labels = [i % 5 for i in range(N)]
    kw = dict(temperature=3.0, guidance_scale=1.5)
    spec = gen(labels, num_draft_tokens=2, seed=1, trajectory_alignment=aligned, **kw)
    plain = gen(labels, seed=2, use_draft=False, **kw)
    assert spec.stats.extra["density_exact"] is False
    assert spec.stats.extra["rejections"] > 100
    assert energy_test_pvalue(joint(spec), joint(plain)) > 0.005


def test_trajectory_alignment_raises_acceptance(diffusion_pair):
    target, draft = diffusion_pair
    gen = ContinuousImageGenerator(target, draft)
    labels = [i % 5 for i in range(400)]
    a = gen(labels, num_draft_tokens=1, seed=0, temperature=3.0, trajectory_alignment=True)
    b = gen(labels, num_draft_tokens=1, seed=0, temperature=3.0, trajectory_alignment=False)
    assert a.stats.acceptance_rate > b.stats.acceptance_rate + 0.15


def test_self_draft_accepts_everything_and_prefill_counts_plain_steps():
    model = tiny_continuous("mixture", seed=0, spread=0.6, grid=(2, 4))
    gen = ContinuousImageGenerator(model, model)
    out = gen([1, 2], num_draft_tokens=3, seed=0)
    assert out.stats.acceptance_rate > 0.999
    pre = gen([1, 2], num_draft_tokens=3, seed=0, prefill_fraction=0.5)
    # 4 of 8 tokens from the target alone (4 steps, no drafts), then 4 tokens in one step of K=3.
    assert pre.stats.steps == 5 and pre.stats.drafted == 2 * 3
    assert pre.latents.shape == (2, 8, 2)


def test_bound_on_proposals_is_counted_and_never_yields_zeros():
    target = tiny_continuous("mixture", seed=0, spread=0.6)
    draft = tiny_continuous("mixture", layers=1, seed=1, spread=0.6)
    out = ContinuousImageGenerator(target, draft)([i % 5 for i in range(400)], num_draft_tokens=2,
                                                  seed=0, max_proposals=1)
    ex = out.stats.extra
    assert ex["residual_fallbacks"] > 0 and ex["residual_proposals"] == ex["rejections"]
    assert torch.isfinite(out.latents).all() and (out.latents != 0).all()


def test_save_and_load_roundtrip(tmp_path, mixture_pair):
    target, _ = mixture_pair
    target.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    again = ContinuousARModel.from_pretrained(tmp_path).eval()
    a = ContinuousImageGenerator(target)([1, 2], seed=0).latents
    b = ContinuousImageGenerator(again)([1, 2], seed=0).latents
    assert torch.equal(a, b)


def test_decoder_turns_latents_into_images():
    from diffusers import VQModel

    vq = VQModel(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
                 up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(16, 16),
                 layers_per_block=1, latent_channels=2, num_vq_embeddings=8, norm_num_groups=8,
                 vq_embed_dim=2).eval()
    model = tiny_continuous("mixture", grid=(4, 4))
    out = ContinuousImageGenerator(model, decoder=vq)([0, 1], seed=0)
    assert len(out.images) == 2 and out.images[0].size == (8, 8)


def test_bad_input_is_rejected_before_work(mixture_pair):
    target, draft = mixture_pair
    other = tiny_continuous("mixture", latent_dim=3)
    with pytest.raises(ValueError, match="latent dimension mismatch"):
        ContinuousImageGenerator(target, other)
    gen = ContinuousImageGenerator(target, draft)
    with pytest.raises(ValueError, match="temperature"):
        gen([1], temperature=0.0)
    with pytest.raises(ValueError, match="guidance_scale needs diffusion heads"):
        gen([1], guidance_scale=2.0)
    with pytest.raises(ValueError, match=r"conditioning ids must be in \[0, 4\]"):
        gen([7])
    with pytest.raises(ValueError, match="prefill_fraction"):
        gen([1], prefill_fraction=1.5)
    with pytest.raises(ValueError, match="num_draft_tokens"):
        gen([1], num_draft_tokens=0)
    with pytest.raises(ValueError, match="max_proposals"):
        gen([1], max_proposals=0)
    with pytest.raises(ValueError, match="exactly one"):
        gen()
    d8 = tiny_continuous("diffusion", steps=8)
    d4 = tiny_continuous("diffusion", steps=4, seed=1)
    with pytest.raises(ValueError, match="trajectory_alignment"):
        ContinuousImageGenerator(d8, d4)([1], guidance_scale=1.0)
    broken = tiny_continuous("mixture", seed=3)
    with torch.no_grad():
        broken.head.net[2].bias.fill_(float("nan"))
    with pytest.raises(ValueError, match="NaN or inf"):
        ContinuousImageGenerator(broken)([1], seed=0)


def test_training_recipe_writes_a_loadable_model(tmp_path):
    from recipes.train.continuous import main

    out = tmp_path / "m"
    main(["--data", "synthetic", "--size", "tiny", "--head", "mixture", "--steps", "30",
          "--batch", "32", "--out", str(out)])
    assert (out / "model.safetensors").exists() and (out / "README.md").exists()
    model = ContinuousARModel.from_pretrained(out)
    lat = ContinuousImageGenerator(model)([0, 4], seed=0).latents
    assert lat.shape == (2, 6, 2) and torch.isfinite(lat).all()


def test_autoencoder_kl_decoder_and_folder_with_decoder_and_words(tmp_path):
    import json

    from diffusers import AutoencoderKL

    kl = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
                       up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(16, 16),
                       layers_per_block=1, latent_channels=2, norm_num_groups=8).eval()
    kl.save_pretrained(tmp_path / "kl")
    model = tiny_continuous("mixture", grid=(4, 4))
    model.save_pretrained(tmp_path / "m")
    words = ["a", "red", "blue", "circle", "star"]
    (tmp_path / "m" / "mmspec_continuous.json").write_text(json.dumps(
        {"decoder": "../kl", "decoder_class": "AutoencoderKL", "words": words}))
    gen = ContinuousImageGenerator.from_pretrained(str(tmp_path / "m"))
    out = gen(prompts=["a red circle", "a blue star"], seed=0)
    assert len(out.images) == 2 and out.images[0].size == (8, 8)
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        gen(prompts=["a green circle"])


def test_input_noise_perturbs_only_what_the_model_reads():
    model = tiny_continuous("mixture", seed=0, spread=0.6)
    ids = torch.tensor([[1, model.config.bos_id]])
    lat = torch.randn(1, 2, 2)
    base = model.training_loss(ids, lat)
    same = model.training_loss(ids, lat, generator=torch.Generator().manual_seed(0), input_noise=0.0)
    noisy = model.training_loss(ids, lat, generator=torch.Generator().manual_seed(0), input_noise=0.5)
    assert torch.equal(base, same) and not torch.equal(base, noisy)
    # The first position reads only the prompt: its loss is unchanged by input noise.
    lat1 = lat[:, :1]
    assert torch.equal(model.training_loss(ids, lat1),
                       model.training_loss(ids, lat1, generator=torch.Generator().manual_seed(0),
                                           input_noise=0.5))
