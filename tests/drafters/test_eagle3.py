"""The EAGLE-3 head (``mmspec.drafters.eagle3``) and the checkpoint layouts
(``mmspec.drafters.layouts``): the architecture against a float64 re-derivation of the
field's definition, every variant; M-RoPE against transformers' own rotary embeddings; every
registered writable layout round-trips; the layer-id conventions; refusals naming what is
wrong; drafting gives plain greedy."""

from __future__ import annotations

import json
import math

import pytest
import torch

import mmspec
from conftest import tiny_llama
from mmspec.drafters import FeatureDrafter
from mmspec.drafters import layouts
from mmspec.drafters import eagle3
from mmspec.drafters.eagle3 import Eagle3Head, MRopeRotaryEmbedding
from mmspec.drafters.load import load_head
from tiny_heads import VARIANTS, eagle3_head as _head, eagle3_pairs as _pairs, forward

def _target(layers=8, vocab=40, hidden=32):
    return tiny_llama(vocab=vocab, hidden=hidden, layers=layers, heads=2, scale=3.0)


def _rms(x, w, eps):
    return w * x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)


def _rope(x, pos, dim, theta):
    inv = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    f = pos[:, None].double() * inv
    cos, sin = torch.cat([f, f], -1).cos(), torch.cat([f, f], -1).sin()
    half = torch.cat([-x[..., dim // 2:], x[..., :dim // 2]], -1)
    return x * cos + half * sin


def reference(head, feats, embeds):
    """The head's logits [T, V] and fed-back outputs [T, H] for one sequence of T pairs
    (features [T, F], token embeddings [T, H]), written out in float64 from the field's
    definition (SafeAILab's cnets, speculators' Eagle3DraftModel, vLLM's llama_eagle3)."""
    c = head.config
    sd = {k: v.double() for k, v in head.state_to_save().items() if v.is_floating_point()}
    eps, d = c.rms_norm_eps, c.dim
    h = feats.double()
    n = len(c.feature_layers)
    if c.norm_before_fc:
        h = _rms(h, sd["input_norm.weight"], eps)
    if c.fc_norm:
        h = torch.cat([_rms(p, sd[f"fc_norm.{i}.weight"], eps) for i, p in enumerate(h.chunk(n, -1))],
                      -1)
    f = h @ sd["fc.weight"].T
    t = f.shape[0]
    pos = torch.arange(t)
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    for i in range(c.num_layers):
        p = f"layers.{i}."
        if i == 0:
            normed = _rms(f, sd[p + "hidden_norm.weight"], eps)
            x = torch.cat([_rms(embeds.double(), sd[p + "input_layernorm.weight"], eps), normed], -1)
            res = normed if c.norm_before_residual else f
        else:
            x, res = _rms(f, sd[p + "input_layernorm.weight"], eps), f
        q = (x @ sd[p + "self_attn.q_proj.weight"].T).view(t, -1, d).transpose(0, 1)
        k = (x @ sd[p + "self_attn.k_proj.weight"].T).view(t, -1, d).transpose(0, 1)
        v = (x @ sd[p + "self_attn.v_proj.weight"].T).view(t, -1, d).transpose(0, 1)
        q, k = _rope(q, pos, d, c.rope_theta), _rope(k, pos, d, c.rope_theta)
        rep = q.shape[0] // k.shape[0]
        k, v = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
        s = (q @ k.transpose(1, 2)) / math.sqrt(d)
        a = torch.softmax(s.masked_fill(~causal, float("-inf")), -1) @ v
        f = res + a.transpose(0, 1).reshape(t, -1) @ sd[p + "self_attn.o_proj.weight"].T
        m = _rms(f, sd[p + "post_attention_layernorm.weight"], eps)
        gate = m @ sd[p + "mlp.gate_proj.weight"].T
        f = f + (torch.nn.functional.silu(gate) * (m @ sd[p + "mlp.up_proj.weight"].T)) \
            @ sd[p + "mlp.down_proj.weight"].T
    out = _rms(f, sd["norm.weight"], eps)
    logits = torch.full((t, c.vocab_size), float("-inf"), dtype=torch.float64)
    logits[:, head.draft_ids] = out @ sd["lm_head.weight"].T
    return logits, (out if c.norm_output else f)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_each_variant_matches_the_fields_definition_in_float64(variant):
    target = _target()
    head = _head(target, **VARIANTS[variant])
    feats, embeds = _pairs(target, head)
    with torch.no_grad():
        logits, g = forward(head, feats, embeds)
    want, want_g = reference(head, feats, embeds)
    finite = torch.isfinite(want)
    assert torch.equal(torch.isfinite(logits), finite)
    assert finite.sum() == 7 * 24             # the draft ids only
    # float32 against float64: within 1e-5 of each output's largest magnitude
    for mine, ref in ((logits[finite].double(), want[finite]), (g.double(), want_g)):
        assert (mine - ref).abs().max() < 1e-5 * ref.abs().max(), variant


@pytest.mark.parametrize("interleaved", [False, True])
def test_mrope_positions_match_transformers_own_rotary_embeddings(interleaved):
    """Contiguous sections: Qwen2-VL's; interleaved: Qwen3-VL's (cos and sin of 3-axis
    positions); text positions [B, n] are the 1-D rotary embedding."""
    from transformers import LlamaConfig

    section = [4, 6, 6] if not interleaved else [6, 5, 5]
    rope = dict(rope_type="default", rope_theta=1000.0, mrope_section=section)
    if interleaved:
        from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLTextConfig
        from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding as R

        cfg = Qwen3VLTextConfig(hidden_size=64, num_attention_heads=2, head_dim=32,
                                rope_parameters=rope)
    else:
        from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLTextConfig
        from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLRotaryEmbedding as R

        cfg = Qwen2VLTextConfig(hidden_size=64, num_attention_heads=2, rope_parameters=rope)
    llama = LlamaConfig(hidden_size=64, num_attention_heads=2, head_dim=32,
                        rope_parameters=dict(rope_type="default", rope_theta=1000.0))
    mine = MRopeRotaryEmbedding(llama, tuple(section), interleaved)
    pos = torch.randint(0, 50, (3, 2, 5))
    x = torch.zeros(1, dtype=torch.float32)
    for a, b in zip(mine(x, pos), R(cfg)(x, pos)):
        torch.testing.assert_close(a, b)
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    text = torch.arange(6)[None]
    for a, b in zip(mine(x, text), LlamaRotaryEmbedding(llama)(x, text)):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("name", layouts.writable())
def test_every_writable_layout_round_trips(tmp_path, name):
    """Written in the layout, recognised as it, read back: the same tensors and logits."""
    target = _target()
    head = _head(target, layers=eagle3.default_feature_layers(8), fc_norm=name == "speculators")
    layouts.export(head, tmp_path / name, name)
    assert layouts.recognise(tmp_path / name).name == name
    back = load_head(str(tmp_path / name), target)
    assert type(back) is Eagle3Head and back.config.feature_layers == head.config.feature_layers
    for k, v in head.state_to_save().items():
        assert torch.equal(back.state_to_save()[k], v), k
    feats, embeds = _pairs(target, head)
    with torch.no_grad():
        assert torch.equal(forward(back, feats, embeds)[0], forward(head, feats, embeds)[0])


def test_every_registered_layout_is_named_in_the_docs():
    import pathlib

    doc = (pathlib.Path(__file__).resolve().parent.parent.parent / "docs" / "drafters.md").read_text()
    for layout in layouts.LAYOUTS:
        assert f"`{layout.name}`" in doc, layout.name


def test_layer_ids_follow_each_engines_convention(tmp_path):
    """speculators' ids are hidden_states indices, SGLang's explicit ids layer outputs (+1);
    no ids: [2, N/2, N - 3]; a shifted id changes the head's logits."""
    target = _target()
    head = _head(target)                              # hidden_states [1, 2, 4]
    layouts.export(head, tmp_path / "s", "speculators")
    layouts.export(head, tmp_path / "g", "sglang")
    spec = json.loads((tmp_path / "s" / "config.json").read_text())
    sgl = json.loads((tmp_path / "g" / "config.json").read_text())
    assert spec["eagle_aux_hidden_state_layer_ids"] == [1, 2, 4]
    assert sgl["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 3]
    sgl.pop("eagle_config")
    (tmp_path / "g" / "config.json").write_text(json.dumps(sgl))
    assert layouts.load(tmp_path / "g", target).config.feature_layers == (2, 4, 5)
    assert eagle3.default_feature_layers(32) == (2, 16, 29)
    with pytest.raises(ValueError, match=r"\[2, 3, 3\]"):
        eagle3.default_feature_layers(6)
    with pytest.raises(ValueError, match="before the final norm"):
        eagle3.check_feature_layers((2, 4, 8), 8)
    with torch.no_grad():
        hs = target(torch.tensor([[3, 1, 4, 1, 5]]), output_hidden_states=True).hidden_states
    embeds = target.get_input_embeddings()(torch.tensor([3, 1, 4, 1, 5]))
    right = forward(head, torch.cat([hs[i] for i in (1, 2, 4)], -1)[0], embeds)[0]
    shifted = forward(head, torch.cat([hs[i + 1] for i in (1, 2, 4)], -1)[0], embeds)[0]
    assert not torch.allclose(right, shifted, atol=1e-3)


def _edit(folder, config=None, tensors=None):
    from safetensors.torch import load_file, save_file

    if config is not None:
        cfg = json.loads((folder / "config.json").read_text())
        config(cfg)
        (folder / "config.json").write_text(json.dumps(cfg))
    if tensors is not None:
        t = load_file(str(folder / "model.safetensors"))
        tensors(t)
        save_file(t, str(folder / "model.safetensors"))


REFUSALS = {
    "a missing tensor": (None, lambda t: t.pop("fc.weight"), r"missing \['fc.weight'\]"),
    "an unread tensor": (None, lambda t: t.update(extra=torch.zeros(2)), "not read.*extra"),
    "a misshaped tensor": (None, lambda t: t.update({"norm.weight": torch.ones(3)}),
                           r"misshaped \['norm.weight \[3\]"),
    "a t2d that disagrees": (None, lambda t: t["t2d"].logical_not_(), "t2d does not mark"),
    "own embeddings": (None, lambda t: t.update({"embed_tokens.weight": torch.ones(40, 32)}),
                       "not the target's input embeddings"),
    "another width": (lambda c: (c["transformer_layer_config"].update(hidden_size=48),
                                 c.update(target_hidden_size=48)), None, r"'hidden_size': 48"),
    "a narrower head": (lambda c: c["transformer_layer_config"].update(hidden_size=48), None,
                        "target_hidden_size 32 != hidden_size 48"),
    "another vocabulary": (lambda c: c["transformer_layer_config"].update(vocab_size=41), None,
                           r"'vocab_size': 41"),
    "a layer past the target": (lambda c: c.update(eagle_aux_hidden_state_layer_ids=[1, 2, 9]),
                                None, r"feature layers \[1, 2, 9\]"),
    "the last layer": (lambda c: c.update(eagle_aux_hidden_state_layer_ids=[1, 2, 8]), None,
                       "before the final norm"),
    "another algorithm": (lambda c: c.update(speculators_model_type="dflash"), None,
                          "accepted 'eagle3'"),
    "an unstated residual norm": (lambda c: c.pop("norm_before_residual"), None,
                                  "vLLM to true"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_a_head_that_does_not_fit_is_refused_naming_why(tmp_path, case):
    target = _target()
    layouts.export(_head(target), tmp_path, "speculators")
    config, tensors, message = REFUSALS[case]
    _edit(tmp_path, config, tensors)
    with pytest.raises(ValueError, match=message):
        layouts.load(tmp_path, target)


def test_pickle_files_and_unknown_configs_are_refused_by_name(tmp_path):
    target = _target()
    (tmp_path / "config.json").write_text(json.dumps({"draft_vocab_size": 24, "hidden_size": 32}))
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x02")
    with pytest.raises(ValueError, match="pytorch_model.bin are pickle files"):
        layouts.load(tmp_path, target)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValueError, match="no known draft-head layout"):
        layouts.load(tmp_path, target)
    (tmp_path / "config.json").write_text("not json")
    with pytest.raises(ValueError, match="not a JSON config"):
        layouts.load(tmp_path, target)


def test_flat_layouts_refuse_what_their_engines_do_not_run(tmp_path):
    target = _target()
    for name in ("sglang", "safeailab", "angelslim"):
        for variant in ("fc_norm", "norm_before_residual", "norm_output", "norm_before_fc"):
            with pytest.raises(ValueError, match="export this one to 'speculators'"):
                layouts.export(_head(target, layers=(2, 4, 5), **{variant: True}),
                               tmp_path / "g", name)
    with pytest.raises(ValueError, match=r"names no layers.*fuses \[1, 2, 4\]"):
        layouts.export(_head(target), tmp_path / "a", "safeailab")
    layouts.export(_head(target, layers=(2, 4, 5)), tmp_path / "s", "safeailab")
    _edit(tmp_path / "s", lambda c: c.update(norm_output=False))
    with pytest.raises(ValueError, match="norm_output false"):
        layouts.load(tmp_path / "s", target)


@pytest.mark.parametrize("variant", ["plain", "norm_output", "two layers"])
def test_chains_and_trees_give_plain_greedy_on_ragged_rows(variant):
    """Chains and trees of a random head, dynamic and static caches, left-padded rows (one
    with two real tokens): plain greedy's tokens."""
    target = _target()
    head = _head(target, **VARIANTS[variant])
    ids = torch.randint(1, 40, (3, 6), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    mask[2, :4] = 0
    plain = mmspec.generate(target, input_ids=ids, attention_mask=mask, temperature=0,
                            max_new_tokens=10).sequences
    for branch, width in ((1, 1), (2, 3)):
        for static in (False, True):
            out = mmspec.generate(target, input_ids=ids, attention_mask=mask, temperature=0,
                                  max_new_tokens=10, static_cache=static,
                                  drafter=FeatureDrafter(head, depth=3, branch=branch,
                                                         width=width))
            assert torch.equal(out.sequences, plain), (branch, width, static)


# -- training (recipes.train.draft_head --arch eagle3) ----------------------------------------

def test_training_an_eagle3_head_raises_acceptance_with_a_reduced_vocabulary():
    """A tiny sharp target's greedy generations, a reduced draft vocabulary from their target
    mass, 150 steps: the chain accepts more than the untrained head; q is zero outside the
    draft ids; greedy tokens are plain greedy's."""
    from recipes.train import draft_head as recipe
    from tiny_heads import collect as _collect, trains as _trains

    torch.manual_seed(0)
    target = tiny_llama(vocab=16, hidden=32, layers=4, scale=4.0)
    batches, template = _collect(target, layers=(1, 2, 3))
    head = Eagle3Head.for_target(target, feature_layers=(1, 2, 3), draft_vocab_size=10)
    ids = recipe.draft_vocab(batches, 10)
    head.set_draft_ids(ids)
    head.init_output(target.lm_head)
    assert torch.equal(head.draft_ids, ids.sort().values)
    _trains(target, head, template, batches)


def test_the_recipe_trains_exports_and_compares_an_eagle3_head(tmp_path):
    """--arch eagle3 on a text target: a head in the speculators layout, --export sglang
    beside it, measured beside --compare-head (an mmspec head) on the same prompts; the card
    names both; bad flags refused in one line before any work."""
    from recipes.train import draft_head as recipe
    from tiny_heads import text_lm_folder as _text_lm_folder
    from transformers import AutoModelForCausalLM

    lm = _text_lm_folder(tmp_path, layers=7)
    target = AutoModelForCausalLM.from_pretrained(lm)
    common = ["--modality", "text", "--target", lm, "--data", str(tmp_path / "prompts.txt"),
              "--samples", "4", "--eval", "2", "--max-new-tokens", "6", "--collect-batch", "2",
              "--steps", "3", "--tree", "3x2x2", "--device", "cpu"]
    recipe.main(common + ["--out", str(tmp_path / "mine")])
    recipe.main(common + ["--out", str(tmp_path / "e3"), "--arch", "eagle3", "--draft-vocab",
                          "20", "--export", "sglang", str(tmp_path / "e3-sglang"),
                          "--compare-head", str(tmp_path / "mine")])
    assert layouts.recognise(tmp_path / "e3").name == "speculators"
    assert layouts.recognise(tmp_path / "e3-sglang").name == "sglang"
    spec = json.loads((tmp_path / "e3" / "config.json").read_text())
    assert spec["eagle_aux_hidden_state_layer_ids"] == [2, 3, 4]
    assert spec["speculators_config"]["verifier"]["name_or_path"] == lm
    back = load_head(str(tmp_path / "e3-sglang"), target)
    assert back.config.draft_vocab_size == 20 and back.config.feature_layers == (2, 3, 4)
    rows = {r["method"] for r in json.loads((tmp_path / "e3" / "metrics.json").read_text())}
    assert rows == {"plain", "head chain", "head tree", "mmspec DraftHead chain",
                    "mmspec DraftHead tree"}
    card = " ".join((tmp_path / "e3" / "README.md").read_text().split())
    assert "Eagle3Head" in card and "mmspec DraftHead" in card and "20 of the target's" in card
    for flags, message in ((["--export", "speculators", "x"], "accepted with --arch eagle3"),
                           (["--arch", "eagle3", "--export", "vllm", "x"], "accepted one of"),
                           (["--arch", "eagle3", "--uncond-features"], "conditional branch")):
        with pytest.raises(ValueError, match=message):
            recipe.main(common + ["--out", str(tmp_path / "no")] + flags)
    assert not (tmp_path / "no").exists()


@pytest.mark.parametrize("kind", ["qwen2.5-vl", "qwen3-vl"])
def test_an_mrope_head_drafts_at_its_targets_3d_positions(kind):
    """An M-RoPE head on a Qwen-VL target, ragged rows with images: in the prompt each pair
    (f_t, x_{t+1}) at the target's 3-D position of t (the model's own get_rope_index), the
    first token's pair left out; each step's pairs at the target's positions of their t."""
    from modalities.vlm import VisionLanguageGenerator
    from tiny_vlm import qwen_pairs
    from tiny_vlm import tiny_qwen_processor, tiny_qwen_vl

    target, proc = tiny_qwen_vl(kind), tiny_qwen_processor(kind)
    torch.manual_seed(0)
    head = Eagle3Head.for_target(target, feature_layers=(0, 1))
    assert head.mrope
    seen = []
    head.decoder.model.rotary_emb.register_forward_hook(
        lambda module, args, kwargs, out: seen.append(
            (args[1] if len(args) > 1 else kwargs["position_ids"]).clone()), with_kwargs=True)
    gen = VisionLanguageGenerator(target, proc, head=head)
    ims, msgs = qwen_pairs(2)
    batch = gen.encode(ims, msgs)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    gen.generate(ims, msgs, method="head", temperature=0, max_new_tokens=4,
                 tree_branch=1, tree_width=1, tree_depth=2)
    given = {k: batch[k] for k in ("image_grid_thw", "mm_token_type_ids") if k in batch}
    pos, delta = target.model.get_rope_index(ids, attention_mask=mask, **given)
    prompt = seen[0]                                     # [3, B, P - 1]
    for row in range(ids.shape[0]):
        real = mask[row].nonzero().flatten()
        cols = real[1:][real[1:] < ids.shape[1] - 1]     # pairs after the first token's
        assert torch.equal(prompt[:, row, cols], pos[:, row, cols - 1]), row
    root = seen[1][:, :, 0]                              # the first step's root pair
    want = pos[:, :, -2]                                 # paired with the feature of P - 2
    assert torch.equal(root, want)



def test_a_vocabulary_of_the_first_ids_and_unsorted_layers_round_trip(tmp_path):
    """Draft ids 0..N-1 (d2t all zeros, still a reduced vocabulary) and feature layers given
    out of order (fused in ascending order, as the engines capture them): the head maps its
    logits to the target's width, and its files read back as the same head."""
    target = _target()
    head = Eagle3Head.for_target(target, feature_layers=(4, 1, 2), draft_vocab_size=10)
    head.set_draft_ids(torch.arange(10))
    assert head.config.feature_layers == (1, 2, 4) and head.reduced
    assert head.full_logits(torch.zeros(1, 1, 10)).shape == (1, 1, 40)
    layouts.export(head, tmp_path, "speculators")
    back = layouts.load(tmp_path, target)
    assert back.reduced and torch.equal(back.draft_ids, torch.arange(10))
    assert json.loads((tmp_path / "config.json").read_text())[
        "eagle_aux_hidden_state_layer_ids"] == [1, 2, 4]


def test_merged_embeds_is_written_where_true_and_read_back_by_every_layout(tmp_path):
    """A head declaring merged_embeds (the prompt's embeddings are the target's decoder inputs)
    keeps it through every writable layout and mmspec's own files; a head without it writes
    no key (the exports the engines read are unchanged) and reads back without it."""
    from mmspec.drafters import DraftHead

    target = _target()
    for merged in (True, False):
        head = Eagle3Head.for_target(target, merged_embeds=merged)      # the default layers
        for name in layouts.writable():
            folder = tmp_path / f"{name}-{merged}"
            layouts.export(head, folder, name)
            written = json.loads((folder / "config.json").read_text())
            assert written.get("mmspec_merged_embeds", False) is merged, name
            assert layouts.load(folder, target).config.merged_embeds is merged, name
        own = DraftHead.for_target(target, merged_embeds=merged)
        own.save_pretrained(tmp_path / f"own-{merged}")
        assert layouts.load(tmp_path / f"own-{merged}", target).config.merged_embeds is merged
