"""Image-token adapters and the TextToImage pipeline on tiny models built from configs."""

from __future__ import annotations


import numpy as np
import pytest
import torch
from scipy import stats as sstats

from modalities.image import (Emu3Adapter, JanusAdapter, LlamaGenAdapter, TextToImage,
                              load_llamagen_state_dict)
from tiny_image import (PIPES, emu3_pipe, llamagen_pipe, tiny_emu3, tiny_janus, tiny_llamagen,
                        tiny_token_span, tiny_vq, token_span_pipe)


@pytest.fixture(scope="module")
def vq():
    return tiny_vq()


@pytest.mark.parametrize("name", list(PIPES))
@pytest.mark.parametrize("guidance", [None, 3.0])
def test_speculative_greedy_equals_plain_greedy(name, guidance, vq):
    pipe, prompts = PIPES[name](vq)
    kw = dict(guidance_scale=guidance, temperature=0, progress=False, seed=0)
    plain = pipe(prompts, method="plain", **kw)
    assert plain.tokens.shape == (2, pipe.target.num_tokens)
    for method in ("exact", "sjd", "sjd-maximal", "sjd-gumbel"):
        out = pipe(prompts, method=method, **kw)
        assert torch.equal(out.tokens, plain.tokens), method
    jac = pipe(prompts, method="sjd", init="repeat_vertical", **kw)
    assert torch.equal(jac.tokens, plain.tokens)


def test_decoded_images_have_the_configured_size(vq):
    for name, size in (("janus", (8, 8)), ("emu3", (6, 4)), ("llamagen", (16, 16)),
                       ("token-span", (16, 16))):
        pipe, prompts = PIPES[name](vq)
        out = pipe(prompts, num_images_per_prompt=2, progress=False, seed=1)
        assert len(out.images) == 4
        assert all(im.size == size and im.mode == "RGB" for im in out.images)


def test_a_call_runs_under_inference_mode_as_the_other_front_doors(vq):
    """The whole call (prompts, rule, loop, decoding) runs under inference mode: an adapter's
    decoder builds no autograd graph, and the tokens are inference tensors."""
    pipe, prompts = PIPES["janus"](vq)
    seen = []
    decode = pipe.target.decode
    pipe.target.decode = lambda ids: (seen.append(torch.is_inference_mode_enabled()), decode(ids))[1]
    out = pipe(prompts, progress=False, seed=1)
    assert seen == [True] and out.tokens.is_inference()


def test_emu3_rows_end_with_eol():
    pipe, prompts = emu3_pipe()
    out = pipe(prompts, method="sjd", progress=False, seed=3)
    eol = pipe.target.vocab_size - 1
    grid = out.tokens.view(2, 2, 4)
    assert (grid[..., -1] == eol).all() and (grid[..., :-1] != eol).all()


def _hist(tokens: torch.Tensor, v: int, m: int = 3) -> np.ndarray:
    code = (tokens[:, :m] * torch.tensor([v ** (m - 1 - i) for i in range(m)])).sum(1)
    return np.bincount(code.numpy(), minlength=v ** m)


def test_exact_sampling_matches_plain_sampling_in_distribution(vq):
    """Two-sample chi-square on the first three tokens (64 categories), with guidance."""
    from tiny_image import tiny_llamagen

    small = tiny_vq(codebook=4)
    tgt = tiny_llamagen(codebook=4, grid=2)
    drf = tiny_llamagen(seed=1, codebook=4, grid=2, dim=16, layers=1)
    with torch.no_grad():
        tgt.output.weight.mul_(0.1)
        drf.output.weight.mul_(0.1)
    pipe = TextToImage(LlamaGenAdapter(tgt, small), LlamaGenAdapter(drf, small))
    n = 6000
    kw = dict(num_images_per_prompt=n, guidance_scale=2.0, progress=False, decode=False)
    plain = pipe([2], method="plain", seed=0, **kw)
    spec = pipe([2], method="exact", seed=1, **kw)
    sjd = pipe([2], method="sjd-maximal", seed=2, **kw)
    assert spec.stats.acceptance_rate > 0.2
    a, b, c = _hist(plain.tokens, 4), _hist(spec.tokens, 4), _hist(sjd.tokens, 4)
    keep = (a + b + c) > 0
    assert sstats.chi2_contingency(np.stack([a[keep], b[keep]]))[1] > 1e-4
    assert sstats.chi2_contingency(np.stack([a[keep], c[keep]]))[1] > 1e-4


def test_janus_guided_logits_equal_hand_computation():
    from mmspec.sampling import SamplingParams

    model = tiny_janus()
    ad = JanusAdapter(model, bos_id=1, boi_id=9, pad_id=0)
    batch = ad.prompt_batch([[1, 5, 6, 9]], None, True)
    s = ad.session(SamplingParams(temperature=1.0), 4.0)
    with torch.no_grad():
        s.prefill(**batch)
        got = s.step(torch.tensor([[9, 3]]))                   # BOI, then image token 3
        lm, head = model.model.language_model, model.model.generation_head

        def branch(ids):
            text = model.get_input_embeddings()(torch.tensor([ids]))
            img = model.prepare_embeddings_for_image_generation(torch.tensor([[3]]))
            return head(lm(inputs_embeds=torch.cat([text, img], 1)).last_hidden_state[:, -2:])
        c, u = branch([1, 5, 6, 9]), branch([1, 0, 0, 9])   # Janus pads all but BOS/BOI
    want = torch.softmax(u + 4.0 * (c - u), -1)
    assert torch.allclose(got, want, atol=1e-5)


def test_llamagen_loader_maps_llamagen_layout_and_matches_reference():
    """A synthetic state dict in LlamaGen's layout (module. prefix, freqs_cis) loads, and the
    model's logits equal a literal transcription of LlamaGen's forward (no cache)."""
    src = tiny_llamagen(seed=3)
    sd = {"module." + k: v.clone() for k, v in src.state_dict().items()}
    sd["module.freqs_cis"] = torch.zeros(17, 8, 2)
    dst = tiny_llamagen(seed=4)
    load_llamagen_state_dict(dst, sd)
    cfg = dst.config
    cls_idx, idx = torch.tensor([2]), torch.tensor([[3, 1, 4, 1, 5]])
    with torch.no_grad():
        # LlamaGen's Transformer.forward, training path, written out
        h = torch.cat([dst.cls_embedding.embedding_table(cls_idx)[:, None], dst.tok_embeddings(idx)], 1)
        hd = cfg.dim // cfg.n_head
        half = hd // 2
        freqs = 1.0 / (cfg.rope_base ** (torch.arange(0, half, 2)[: half // 2].float() / half))
        f = torch.outer(torch.arange(cfg.grid_size).float(), freqs)
        fg = torch.cat([f[:, None, :].expand(-1, cfg.grid_size, -1),
                        f[None, :, :].expand(cfg.grid_size, -1, -1)], -1)
        fc = torch.cat([torch.zeros(1, hd // 2, 2),
                        torch.stack([fg.cos(), fg.sin()], -1).flatten(0, 1)])[: h.shape[1]]

        def rot(x):
            xs = x.float().reshape(*x.shape[:-1], -1, 2)
            fcv = fc.view(1, xs.size(1), 1, xs.size(3), 2)
            return torch.stack([xs[..., 0] * fcv[..., 0] - xs[..., 1] * fcv[..., 1],
                                xs[..., 1] * fcv[..., 0] + xs[..., 0] * fcv[..., 1]], -1).flatten(3)
        for layer in dst.layers:
            a = layer.attention
            x = layer.attention_norm(h)
            q, k, v = a.wqkv(x).split([cfg.dim, cfg.dim, cfg.dim], -1)
            q, k = rot(q.view(1, -1, cfg.n_head, hd)), rot(k.view(1, -1, cfg.n_head, hd))
            v = v.view(1, -1, cfg.n_head, hd)
            o = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
            h = h + a.wo(o.transpose(1, 2).reshape(1, -1, cfg.dim))
            h = h + layer.feed_forward(layer.ffn_norm(h))
        want = dst.output(dst.norm(h)).float()
        emb = torch.cat([dst.condition_embeddings(cls_idx), dst.tok_embeddings(idx)], 1)
        got = dst(inputs_embeds=emb).logits
    assert torch.allclose(got, want, atol=1e-5)
    assert torch.equal(dst.output.weight, src.output.weight)
    bad = dict(sd)
    bad["module.extra.weight"] = torch.zeros(1)
    with pytest.raises(ValueError, match="unexpected"):
        load_llamagen_state_dict(dst, bad)


def test_llamagen_text_conditional_runs(vq):
    pipe = TextToImage(LlamaGenAdapter(tiny_llamagen(cond="t2i"), vq))
    caps = [torch.randn(3, 12), torch.randn(3, 12)]
    a = pipe(caps, guidance_scale=3.0, method="plain", temperature=0, progress=False)
    b = pipe(caps, guidance_scale=3.0, method="sjd", temperature=0, progress=False)
    assert torch.equal(a.tokens, b.tokens)
    with pytest.raises(ValueError, match=r"caption embeddings must be \[3, 12\]"):
        pipe([torch.randn(2, 12)], progress=False)


@pytest.mark.parametrize("kwargs,match", [
    (dict(guidance_scale=-1.0), r"guidance_scale=-1.0.*>= 0"),
    (dict(guidance_scale=float("nan")), r"guidance_scale=nan"),
    (dict(num_images_per_prompt=0), r"num_images_per_prompt=0.*>= 1"),
    (dict(method="nope"), r"method='nope'"),
    (dict(method="lantern", delta=3.0), r"delta=3.0.*\[0, 1\]"),
    (dict(method="sjd", window=0), r"window=0"),
    (dict(method="plain", bogus=1), r"unknown parameter\(s\) \['bogus'\]"),
    (dict(top_k=100), r"top_k=100: accepted at most the codebook size 16"),
    (dict(compile="fast"), r"compile='fast': accepted False, True, 'graphs', 'regional' or 'inductor'"),
])
def test_bad_input(kwargs, match, vq):
    pipe, prompts = token_span_pipe(vq)
    with pytest.raises(ValueError, match=match):
        pipe(prompts, progress=False, **kwargs)


def test_empty_prompt_list_and_codebook_mismatch(vq):
    pipe, _ = token_span_pipe(vq)
    with pytest.raises(ValueError, match="at least one prompt"):
        pipe([], progress=False)
    other = tiny_llamagen(codebook=8)
    with pytest.raises(ValueError, match="differs from the target's"):
        TextToImage(LlamaGenAdapter(tiny_llamagen(), vq), LlamaGenAdapter(other, tiny_vq(codebook=8)))
    with pytest.raises(ValueError, match=r"class labels must be in \[0, 4\]"):
        llamagen_pipe(vq)[0]([7], progress=False)


def test_relaxed_methods_run_on_images(vq):
    pipe, prompts = token_span_pipe(vq)
    for method in ("lantern", "sjd+lantern", "gsd", "pcg", "sjd-maximal+annealed", "lantern++"):
        out = pipe(prompts, method=method, guidance_scale=2.0, progress=False, seed=0)
        assert out.tokens.shape == (2, 16) and out.stats.steps <= 16


def test_recipe_runs_end_to_end_on_a_saved_tiny_model(tmp_path, vq, capsys):
    from modalities.image.pipeline import save_bundled
    from recipes import text_to_image

    m, off = tiny_token_span()
    d, _ = tiny_token_span(seed=1, hidden=16, layers=1)
    vq.vq.save_pretrained(tmp_path / "vq")
    meta = dict(image_token_offset=off, codebook_size=16, grid=[4, 4], prefix=[1], suffix=[2],
                pad_id=0, words=[f"w{i}" for i in range(10)], word_offset=3,
                defaults={"guidance_scale": 2.0})
    save_bundled(str(tmp_path / "t"), m, fmt="token-span", vq_folder=str(tmp_path / "vq"), meta=meta)
    save_bundled(str(tmp_path / "d"), d, fmt="token-span", vq_folder=str(tmp_path / "vq"), meta=meta)
    out = tmp_path / "out"
    res = text_to_image.main(["w1 w2 w3", "w4", "--model", str(tmp_path / "t"), "--draft",
                              str(tmp_path / "d"), "--method", "exact", "--temperature", "0",
                              "--out", str(out), "--no-progress"])
    assert res["identical"]
    files = sorted(p.name for p in out.iterdir())
    assert files == ["comparison.png", "exact_000.png", "exact_001.png", "plain_000.png",
                     "plain_001.png"]
    text = capsys.readouterr().out
    assert "compression" in text and "speedup" in text
    with pytest.raises(ValueError, match="not in the model's vocabulary"):
        text_to_image.main(["unknown words", "--model", str(tmp_path / "t"), "--no-progress",
                            "--out", str(out)])


def test_emu3_partial_vocabulary_maps_generate_the_named_codes():
    """A map that names some VQ codes (transformers' tester configurations): the generator
    draws only those codes, which the VQ decodes; a map naming codes past the codebook is
    refused with them named."""
    codes = [0, 2, 3, 5, 7, 8, 11, 13, 17, 19, 23]
    adapter = Emu3Adapter(tiny_emu3(codes=codes), 2, 3)
    assert adapter.vocab_size == len(codes) + 1                      # + the end-of-row id
    out = TextToImage(adapter)([[1, 5, 6, 42, 44]], method="sjd", progress=False, seed=0)
    assert set(adapter.image_tokens(out.tokens).flatten().tolist()) <= set(codes)
    assert out.images[0].size == (6, 4)
    assert adapter.codebook_embeddings().shape[0] == adapter.vocab_size
    with pytest.raises(ValueError, match=r"visual tokens \[30\] for a VQ codebook of 24 codes"):
        Emu3Adapter(tiny_emu3(codes=[0, 30]), 2, 3)


def test_diffusers_conventions(vq):
    """generator=, output_type, return_dict and callback_on_step_end as in diffusers."""
    pipe, prompts = PIPES["token-span"](vq)
    kw = dict(method="sjd", progress=False)
    a = pipe(prompts, seed=3, **kw)
    b = pipe(prompts, generator=torch.Generator().manual_seed(3), **kw)
    assert torch.equal(a.tokens, b.tokens)
    arr = pipe(prompts, seed=3, output_type="np", **kw).images
    assert arr.shape == (2, 16, 16, 3) and arr.dtype == np.float32
    assert np.allclose(arr[0] * 255, np.asarray(a.images[0]), atol=1)
    pt = pipe(prompts, seed=3, output_type="pt", **kw).images
    assert pt.shape == (2, 3, 16, 16) and float(pt.max()) <= 1
    (imgs,) = pipe(prompts, seed=3, return_dict=False, **kw)
    assert len(imgs) == 2
    seen = []
    pipe(prompts, seed=3, callback_on_step_end=lambda p, i, t, kw_: seen.append(
        (i, t, min(len(r) for r in kw_["tokens"]))), **kw)
    assert seen[0][:2] == (0, None) and seen[-1][2] == pipe.target.num_tokens
    with pytest.raises(ValueError, match="output_type='latent'"):
        pipe(prompts, output_type="latent", **kw)
    with pytest.raises(ValueError, match="seed and generator"):
        pipe(prompts, seed=1, generator=torch.Generator(), **kw)


def test_relaxed_rules_verify_draft_trees_on_images(vq):
    """A tree drafter with a relaxed rule by name: at the rule's exact parameters the same
    images as exact tree verification (same draws), relaxed it runs and emits every token."""
    pipe, prompts = token_span_pipe(vq)
    kw = dict(guidance_scale=2.0, progress=False, seed=3, tree_depth=3, tree_branch=2)
    exact = pipe(prompts, method="tree", **kw)
    assert torch.equal(pipe(prompts, method="tree+lantern", delta=0.0, **kw).tokens, exact.tokens)
    assert torch.equal(pipe(prompts, method="tree+annealed", delta=1.0, nu=0.0, **kw).tokens,
                       exact.tokens)
    for method in ("tree+lantern", "tree+gsd", "tree+annealed", "tree+lantern++"):
        out = pipe(prompts, method=method, **kw)
        assert out.tokens.shape == (2, 16) and out.stats.steps <= 16, method
    with pytest.raises(ValueError, match="does not verify draft trees"):
        pipe(prompts, method="tree+pcg", **kw)


@pytest.mark.parametrize("name", list(PIPES))
def test_a_head_on_both_branches_features_gives_plain_greedy(name, vq):
    """A head fusing the unconditional branch's features too (``uncond_features``) drafts
    under guidance and gives plain greedy's tokens, static and dynamic caches; the target
    session keeps both branches' features side by side; without guidance it is refused
    before any work."""
    from mmspec.drafters.architectures import head_for_target
    from mmspec.drafters.load import load_head

    pipe, prompts = PIPES[name](vq)
    model = pipe.target.model
    torch.manual_seed(7)
    pipe.head = load_head(head_for_target(model, uncond_features=True), model)
    assert pipe.head.reduce.in_features == 2 * len(pipe.head.config.feature_layers) * \
        pipe.head.config.hidden_size
    kw = dict(guidance_scale=3.0, temperature=0, progress=False, seed=0, decode=False)
    plain = pipe(prompts, method="plain", **kw)
    for static in (False, True):
        out = pipe(prompts, method="head", static_cache=static, **kw)
        assert torch.equal(out.tokens, plain.tokens), static
    with pytest.raises(ValueError, match="uncond features: accepted only with classifier-free"):
        pipe(prompts, method="head", **{**kw, "guidance_scale": None})


@pytest.mark.parametrize("prompt,match", [(5, r"prompt 0: 5: accepted a string or a list"),
                                          ([[3, 10_000]], r"token ids \[10000\]: accepted ids"),
                                          ([[3, -1]], r"token ids \[-1\]"),
                                          ([["a", 3]], "accepted a string or a list of token ids")])
def test_prompts_that_are_not_text_or_ids_of_the_vocabulary_are_refused(prompt, match):
    """A number, ids past the vocabulary, mixed lists: named before any model runs (they
    raised TypeError or IndexError inside the model)."""
    import os

    from modalities.image import TextToImage

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    pipe = TextToImage.from_pretrained(os.path.join(root, "samples", "models", "shapes-t2i"))
    with pytest.raises(ValueError, match=match):
        pipe(prompt, progress=False, decode=False)
