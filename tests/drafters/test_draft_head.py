"""Draft heads: files, the training recipe's pieces, and that training raises acceptance."""

from __future__ import annotations

import argparse

import pytest
import torch

import mmspec
from conftest import tiny_llama
from mmspec.drafters import DraftHead, FeatureDrafter
from recipes.train import draft_head as recipe
from tiny_heads import collect as _collect, text_lm_folder as _text_lm_folder, trains as _trains


def test_training_raises_acceptance_above_an_untrained_head():
    """A tiny sharp target, its greedy generations, 150 steps: the trained head's chain
    emits more tokens per target step than the untrained one (which is near 1)."""
    torch.manual_seed(0)
    target = tiny_llama(vocab=16, hidden=32, layers=2, scale=4.0)
    batches, template = _collect(target)
    _trains(target, DraftHead.for_target(target), template, batches)


def test_head_files_round_trip_and_refuse_other_targets(tmp_path):
    target = tiny_llama()
    head = DraftHead.for_target(target)
    head.save_pretrained(tmp_path / "h")
    files = sorted(p.name for p in (tmp_path / "h").iterdir())
    assert files == ["config.json", "model.safetensors"]
    back = DraftHead.from_pretrained(tmp_path / "h", target)
    for k, v in head.state_to_save().items():
        assert torch.equal(v, back.state_to_save()[k]), k
    assert "decoder.lm_head.weight" not in head.state_to_save()     # the target's, not stored
    with pytest.raises(ValueError, match=r"made for an output head of \[16, 32\]"):
        DraftHead.from_pretrained(tmp_path / "h", tiny_llama(vocab=20))
    with pytest.raises(ValueError, match="config.json and model.safetensors"):
        DraftHead.from_pretrained(tmp_path / "missing")
    with pytest.raises(ValueError, match=r"feature_layers=\(0, 9\)"):
        DraftHead.for_target(target, (0, 9))


def test_unrolled_mask_is_what_drafting_attends_to():
    m = recipe.unrolled_mask(5, 3, "cpu")
    t = 5
    # step 1: causal over real pairs
    assert bool(m[:t, :t].equal(torch.ones(t, t, dtype=torch.bool).tril()))
    assert not m[:t, t:].any()
    # step 2, position 3: real pairs 0..2, its own step-2 slot 3
    row = m[t + 3]
    assert row[:t].nonzero().flatten().tolist() == [0, 1, 2]
    assert row[t:2 * t].nonzero().flatten().tolist() == [3] and not row[2 * t:].any()
    # step 3, position 4: real 0..2, step-2 at 3, step-3 at 4
    row = m[2 * t + 4]
    assert row[:t].nonzero().flatten().tolist() == [0, 1, 2]
    assert row[t:2 * t].nonzero().flatten().tolist() == [3]
    assert row[2 * t:].nonzero().flatten().tolist() == [4]


def test_checkpoints_resume_the_optimizer(tmp_path):
    target = tiny_llama()
    batches, template = _collect(target, n_batches=1, rows=4, new=4)
    head = DraftHead.for_target(target)
    args = argparse.Namespace(lr=1e-3, steps=4, unroll=1, seed=0, save_every=2, out=str(tmp_path))
    from accelerate import Accelerator

    recipe.train(head, template, batches, args, Accelerator(cpu=True),
                 clock=recipe.Clock(before=100.0))
    step, opt = recipe.load_checkpoint(DraftHead.for_target(target), str(tmp_path), 1e-3)
    assert step == 4 and len(opt.state) > 0
    assert recipe.checkpoint_seconds(str(tmp_path)) > 100.0      # earlier runs' seconds kept
    assert all(int(s["step"]) == 4 for s in opt.state.values())
    # a run resumed at step 2 follows the same schedule: it ends at the same learning rate
    ends = []
    for start in (0, 2):
        h = DraftHead.for_target(target)
        own = [p for n, p in h.named_parameters() if not n.startswith(
            ("decoder.model.embed_tokens", "decoder.lm_head"))]
        opt = torch.optim.AdamW(own, lr=1e-3)
        recipe.train(h, template, batches, argparse.Namespace(**{**vars(args), "save_every": 99}),
                     Accelerator(cpu=True), start, opt)
        ends.append(opt.param_groups[0]["lr"])
    assert ends[0] == ends[1] < 1e-3 * 0.2, ends


def test_the_recipe_refuses_bad_input_in_one_line(tmp_path, capsys):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "recipes.train.draft_head", "--modality", "t2i",
                        "--target", "x", "--out", str(tmp_path), "--unroll", "9"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "--unroll" in r.stderr and len(r.stderr.strip().splitlines()) <= 2
    r = subprocess.run([sys.executable, "-m", "recipes.train.draft_head", "--modality", "t2i",
                        "--target", "x", "--out", str(tmp_path), "--tree", "5x2"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "--tree" in r.stderr and "DEPTHxCHILDRENxWIDTH" in r.stderr
    r = subprocess.run([sys.executable, "-m", "recipes.train.draft_head", "--modality", "vlm",
                        "--target", "x", "--out", str(tmp_path), "--resume"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "checkpoint does not exist" in r.stderr
    r = subprocess.run([sys.executable, "-m", "recipes.train.draft_head", "--modality", "tts",
                        "--target", "x", "--out", str(tmp_path), "--uncond-features"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "--uncond-features: accepted with --modality t2i" in r.stderr
    r = subprocess.run([sys.executable, "-m", "recipes.train.draft_head", "--modality", "t2i",
                        "--target", "x", "--out", str(tmp_path), "--head-layers", "0"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "--head-layers" in r.stderr
    r = subprocess.run([sys.executable, "-m", "recipes.train.draft_head", "--modality", "tts",
                        "--target", "x", "--out", str(tmp_path), "--data", "shapes-describe"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "--data shapes-describe: accepted with --modality vlm" in r.stderr
    r = subprocess.run([sys.executable, "-m", "recipes.train.draft_head", "--modality", "t2i",
                        "--target", "x", "--out", str(tmp_path), "--merged-embeds"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "--merged-embeds: accepted with --modality vlm" in r.stderr


def test_two_processes_collect_shares_and_train_one_head(tmp_path):
    """torchrun, two CPU processes (gloo): each collects its share of the prompts, the data
    file holds both shares, the gradients are averaged (the recipe raises when the processes'
    heads differ after training), and ``--resume`` continues with the joined data."""
    import json
    import os
    import subprocess
    import sys

    from safetensors import safe_open

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = tmp_path / "head"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
           "2", "-m", "recipes.train.draft_head", "--modality", "tts", "--target",
           os.path.join(root, "samples", "models", "shapes-tts"), "--samples", "4", "--eval",
           "1", "--collect-batch", "1", "--save-every", "2", "--device", "cpu", "--out", str(out)]
    for extra in (["--steps", "4"], ["--steps", "6", "--resume"]):
        r = subprocess.run(cmd + extra, cwd=root, capture_output=True, text=True, timeout=600,
                           env=dict(os.environ, PYTHONPATH=root))
        assert r.returncode == 0, r.stderr[-3000:]
        if not extra[-1] == "--resume":
            first = recipe.checkpoint_seconds(str(out))
    # the card's seconds count the first run's work too
    assert json.loads((out / "training.json").read_text())["seconds"] > first > 0
    with safe_open(str(out / "data.safetensors"), "pt") as f:
        assert {k.split(".")[0] for k in f.keys()} == {"0", "1", "2", "3"}   # both shares
    assert not list(out.glob("*.part*"))
    assert json.loads((out / "checkpoint" / "trainer.json").read_text())["step"] == 6
    assert json.loads((out / "training.json").read_text())["device"].startswith("2 processes")
    assert (out / "README.md").is_file() and (out / "model.safetensors").is_file()


def test_a_reduced_draft_vocabulary_drafts_only_its_ids_and_trains(tmp_path):
    """--draft-vocab: the ids with the most target mass; the head's q is zero elsewhere, its
    tokens under greedy are plain greedy's, training lifts acceptance, the ids round-trip
    through the files (its output rows are the target's, not stored)."""
    torch.manual_seed(0)
    target = tiny_llama(vocab=16, hidden=32, layers=2, scale=4.0)
    batches, template = _collect(target)
    head = DraftHead.for_target(target, draft_vocab_size=8)
    ids = recipe.draft_vocab(batches, 8)
    assert ids.shape == (8,) and ids.unique().numel() == 8
    head.set_draft_ids(ids)
    assert torch.equal(head.decoder.lm_head.weight, target.lm_head.weight[ids.sort().values])
    wide = head.full_logits(torch.randn(2, 3, 8))
    outside = torch.ones(16, dtype=torch.bool)
    outside[ids] = False
    assert bool(torch.isinf(wide[..., outside]).all()) and bool(torch.isfinite(wide[..., ids]).all())
    _trains(target, head, template, batches)
    head.save_pretrained(tmp_path / "h")
    back = DraftHead.from_pretrained(tmp_path / "h", target)
    assert torch.equal(back.draft_ids, head.draft_ids)
    assert torch.equal(back.decoder.lm_head.weight, head.decoder.lm_head.weight)
    assert "decoder.lm_head.weight" not in head.state_to_save()
    with pytest.raises(ValueError, match=r"draft_vocab_size=16: accepted None or an integer "
                                         r"in \[1, 15\]"):
        DraftHead.for_target(target, draft_vocab_size=16)
    with pytest.raises(ValueError, match="accepted 8 distinct ids in"):
        head.set_draft_ids(torch.tensor([1, 1, 2, 3, 4, 5, 6, 7]))


# -- greedy trees: ranked by the draft's softmax ---------------------------------------------

def _first_tree(target, drafter, temperature):
    """The first tree ``drafter`` proposes on three left-padded prompts."""
    ids = torch.tensor([[0, 3, 4, 5, 6], [2, 1, 2, 3, 4], [0, 0, 7, 8, 9]])
    seen, propose = [], drafter.propose
    drafter.propose = lambda *a, **k: seen.append(propose(*a, **k)) or seen[-1]
    mmspec.generate(target, input_ids=ids, attention_mask=(ids != 0).long(), seed=0,
                    temperature=temperature, max_new_tokens=3, drafter=drafter)
    return seen[0]


@pytest.mark.parametrize("kind", ["draft model", "DraftHead", "Eagle3Head"])
def test_a_greedy_tree_is_the_tree_of_the_drafts_softmax(kind):
    """At temperature 0 a draft session's q is one-hot: its top-2 would be the argmax beside an
    arbitrary id at the score floor, so every tree a chain with dead siblings. A greedy tree
    of top-k children is the one the draft's softmax gives: the tree drafted at temperature 1
    with top-k children (tree_sample=False), node for node; a chain's session stays greedy."""
    from mmspec.drafters import TreeDrafter
    from mmspec.sampling import SamplingParams
    from mmspec.sessions import CausalLMSession
    from tiny_heads import eagle3_head

    target = tiny_llama(vocab=40, hidden=32, layers=6, heads=2, scale=3.0)
    draft = tiny_llama(vocab=40, hidden=16, layers=1, seed=1)
    torch.manual_seed(5)
    head = (DraftHead.for_target(target) if kind == "DraftHead" else
            eagle3_head(target, draft_vocab=30, layers=(1, 2, 4)) if kind == "Eagle3Head" else None)

    def drafter(temperature, **shape):
        if head is not None:
            return FeatureDrafter(head, **shape)
        return TreeDrafter(CausalLMSession(draft, SamplingParams(temperature=temperature)),
                           **shape)

    shape = dict(depth=3, branch=2, width=2, sample=False)
    greedy, soft = (_first_tree(target, drafter(t, **shape), t) for t in (0.0, 1.0))
    assert torch.equal(greedy.tokens, soft.tokens) and greedy.probs is None
    assert torch.equal(greedy.tree.parents, soft.tree.parents)
    chain = drafter(0.0, depth=3, branch=1, width=1)
    assert torch.equal(_first_tree(target, chain, 0.0).tokens[:, 0], greedy.tokens[:, 0])
    assert not chain._soft and chain.session.greedy


# -- a VLM head's prompt embeddings: the merged image features (merged_embeds) -------------

@pytest.mark.parametrize("arch", ["draft-head", "eagle3"])
def test_a_merged_embeds_head_reads_the_targets_hidden_states_0_at_image_positions(arch):
    """A LLaVA target, ragged rows with images: a head whose config declares merged_embeds
    reads at the image placeholders (every prompt column its decoder's prompt pass feeds) the
    target's own hidden_states[0], the merged image features, and so does the recipe's
    recorder (what such a head trains on); a head without it reads the placeholder id's
    embedding there, as before. Both give plain greedy."""
    from mmspec.drafters.architectures import head_for_target
    from modalities.vlm import VisionLanguageGenerator
    from tiny_vlm import llava_pairs, tiny_llava, tiny_processor

    target, proc = tiny_llava(), tiny_processor()
    ims, prompts = llava_pairs("llava")
    torch.manual_seed(0)
    plain = VisionLanguageGenerator(target, proc).generate(ims, prompts, temperature=0,
                                                           max_new_tokens=5).token_ids
    for merged in (True, False):
        head = head_for_target(target, (0, 1), arch=arch, merged_embeds=merged)
        gen = VisionLanguageGenerator(target, proc, head=head)
        batch = gen.encode(ims, prompts)
        ids = batch["input_ids"]
        with torch.no_grad():
            hs0 = target(**batch, output_hidden_states=True).hidden_states[0]
        image = ids == target.config.image_token_id                            # [B, P]
        image[:, -1] = False                # the last column is the first step's
        seen = []
        head.decoder.model.register_forward_pre_hook(
            lambda m, a, kw: seen.append(kw["inputs_embeds"]) if not seen else None,
            with_kwargs=True)
        drafter = FeatureDrafter(head, depth=2, branch=1, width=1)
        out = gen.generate(ims, prompts, drafter=drafter, temperature=0, max_new_tokens=5)
        assert out.token_ids == plain, (arch, merged)
        embeds = drafter.session.prompt_embeds[:, :-1]       # the prompt pass's columns
        want = hs0 if merged else target.get_input_embeddings()(ids)
        assert torch.allclose(embeds[image[:, :-1]], want[image], atol=1e-6), (arch, merged)
        if arch == "eagle3":                # its decoder's input: [token embedding, feature]
            fed = seen[0][..., :head.config.hidden_size]
            assert torch.allclose(fed[image[:, :-1]], want[image], atol=1e-6)
        assert not torch.allclose(hs0[image], target.get_input_embeddings()(ids)[image])
        rec = recipe.Recorder(head.config.feature_layers, merged=merged)
        gen.generate(ims, prompts, drafter=rec, temperature=0, max_new_tokens=3)
        recorded = rec.batch()["embeds"][:, :ids.shape[1]]
        assert torch.allclose(recorded[image], want[image], atol=1e-6), (arch, merged)
        assert rec.batch()["features"].shape[-1] == 2 * head.config.hidden_size


# -- heads on recurrent targets (trees as paths) and on targets without tree steps (chains) --

def test_a_heads_trees_on_a_recurrent_vlm_give_plain_greedy_on_both_caches():
    """Qwen3.5 (linear attention layers, M-RoPE): on dynamic and static caches the head's
    trees are verified as their paths (``trees`` stays True, its shape kept); speculative
    greedy == plain greedy on ragged rows."""
    from tiny_vlm import tiny_qwen_vl

    target = tiny_qwen_vl("qwen3.5")
    torch.manual_seed(5)
    head = DraftHead.for_target(target)
    ids = torch.tensor([[0, 0, 5, 6, 7, 8], [5, 6, 7, 8, 9, 10]])
    kw = dict(attention_mask=(ids != 0).long(), temperature=0, max_new_tokens=10)
    for static in (False, True):
        plain = mmspec.generate(target, None, ids, static_cache=static, **kw)
        drafter = FeatureDrafter(head, depth=3)
        out = mmspec.generate(target, None, ids, static_cache=static, drafter=drafter, **kw)
        assert drafter.trees and (drafter.branch, drafter.width) == (2, 4), static
        assert torch.equal(out.sequences, plain.sequences), static


def _sliding_target(vocab: int = 12):
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    cfg = MistralConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64,
                        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                        sliding_window=64, max_position_embeddings=256)
    return MistralForCausalLM(cfg).eval()


def test_a_trees_parameters_on_a_target_without_tree_steps_are_refused_in_one_message():
    target = _sliding_target()
    head = DraftHead.for_target(target)
    with pytest.raises(ValueError, match="tree_branch=2: CausalLMSession takes no tree steps "
                                         r"\(sliding-window layers, or recurrent layers under "
                                         r"guidance\), so the head drafts a chain"):
        mmspec.generate(target, None, torch.tensor([[5, 6, 7, 8]]), temperature=0,
                        max_new_tokens=2, drafter=FeatureDrafter(head, depth=3, branch=2))


def test_a_chain_head_samples_the_target_distribution():
    """A sliding-window target (no tree steps): 20,000 rows sampled at temperature 1 through
    the head's chains give the target's joint distribution of the first two tokens
    (enumerated in float64): TV under its sampling bound, chi-square not rejected."""
    import numpy as np

    from stats_util import chi_square_pvalue, tv, tv_threshold

    target = _sliding_target()
    torch.manual_seed(5)
    drafter = FeatureDrafter(DraftHead.for_target(target), depth=2)
    v, prompt, n = target.config.vocab_size, torch.tensor([[5, 6, 7, 8]]), 20_000
    with torch.no_grad():
        p1 = target(input_ids=prompt).logits[0, -1].double().softmax(-1)
        both = torch.cat([prompt.expand(v, -1), torch.arange(v)[:, None]], 1)
        p2 = target(input_ids=both).logits[:, -1].double().softmax(-1)
    joint = (p1[:, None] * p2).flatten().numpy()
    out = mmspec.generate(target, None, prompt.expand(n, -1), temperature=1.0, max_new_tokens=2,
                          stop_token_ids=[], seed=0, drafter=drafter)
    assert not drafter.trees and out.stats.tokens_per_step > 1.5
    pairs = out.sequences[:, -2:]
    counts = np.bincount((pairs[:, 0] * v + pairs[:, 1]).numpy(), minlength=v * v)
    assert tv(counts / n, joint) < tv_threshold(joint, n)
    assert chi_square_pvalue(counts, joint) > 1e-4


# -- a checkpoint's own MTP module ---------------------------------------------------------

def _mtp_checkpoint(target, folder, sharded=False, extra=None):
    """Random ``mtp.*`` tensors of the target's sizes (the checkpoint's names) next to one of
    the model's tensors, as one file or two shards with an index; returns the tensors."""
    import json

    from safetensors.torch import save_file

    from mmspec.drafters.mtp import NAMES, MtpHead

    g = torch.Generator().manual_seed(3)
    mtp = {}
    for name, t in MtpHead(target).state_to_save().items():
        src = next(s for s, d in NAMES.items() if name.startswith(d))
        mtp["mtp." + src + name[len(NAMES[src]):]] = torch.randn(t.shape, generator=g) * 0.3
    mtp.update(extra or {})
    model = {"model.norm.weight": torch.ones(4)}
    if not sharded:
        save_file({**model, **mtp}, str(folder / "model.safetensors"))
    else:
        save_file(model, str(folder / "a.safetensors"))
        save_file(mtp, str(folder / "b.safetensors"))
        index = {"weight_map": {**{k: "a.safetensors" for k in model},
                                **{k: "b.safetensors" for k in mtp}}}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return mtp


@pytest.mark.parametrize("sharded", [False, True])
def test_an_mtp_module_loads_from_the_checkpoint_and_drafts(tmp_path, sharded):
    """``MtpHead.from_checkpoint``: the checkpoint's ``mtp.*`` tensors become the head's
    weights (fc, the two pre-fc norms, one Qwen3.5 full-attention layer, its norm), shared
    embeddings and output head; it drafts chains on Qwen3.5 with plain greedy's tokens."""
    from tiny_vlm import tiny_qwen_vl

    from mmspec.drafters import MtpHead
    from mmspec.drafters.mtp import head_name

    target = tiny_qwen_vl("qwen3.5")
    mtp = _mtp_checkpoint(target, tmp_path, sharded)
    head = MtpHead.from_checkpoint(tmp_path, target)
    params = dict(head.named_parameters())
    for name, t in mtp.items():
        assert torch.equal(params[head_name(name)].detach(), t), name
    assert head.decoder.model.embed_tokens is target.get_input_embeddings()
    target.config.save_pretrained(tmp_path)      # a model's folder: head= finds its MTP module
    from mmspec.drafters.load import load_head

    again = load_head(str(tmp_path), target)
    assert isinstance(again, MtpHead) and all(
        torch.equal(p, q) for p, q in zip(again.parameters(), head.parameters()))
    ids = torch.tensor([[0, 0, 5, 6, 7, 8], [5, 6, 7, 8, 9, 10]])
    kw = dict(attention_mask=(ids != 0).long(), temperature=0, max_new_tokens=10)
    plain = mmspec.generate(target, None, ids, **kw)
    out = mmspec.generate(target, None, ids, drafter=FeatureDrafter(head, depth=3), **kw)
    assert torch.equal(out.sequences, plain.sequences)


def test_mtp_checkpoints_that_do_not_fit_are_refused(tmp_path):
    from safetensors.torch import save_file
    from tiny_vlm import tiny_qwen_vl

    from mmspec.drafters import MtpHead

    target = tiny_qwen_vl("qwen3.5")
    with pytest.raises(ValueError, match="accepted a folder with model.safetensors"):
        MtpHead.from_checkpoint(tmp_path, target)
    save_file({"model.norm.weight": torch.ones(4)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"holds no mtp\.\* tensors \(no native MTP module\)"):
        MtpHead.from_checkpoint(tmp_path, target)
    _mtp_checkpoint(target, tmp_path, extra={"mtp.layers.1.mlp.up_proj.weight": torch.ones(2)})
    with pytest.raises(ValueError, match=r"unexpected or misshaped \['mtp.layers.1.mlp.up_proj"):
        MtpHead.from_checkpoint(tmp_path, target)
    with pytest.raises(ValueError, match="an MTP head is the checkpoint's own"):
        MtpHead(target).save_pretrained(tmp_path / "out")


def test_the_recipe_trains_a_text_head_from_a_prompts_file(tmp_path):
    """--modality text on a causal LM folder with its tokenizer and a prompts file: collect,
    train, save, and measure beside --draft (here the target itself: the exact rule accepts
    every draft)."""
    import json

    lm = _text_lm_folder(tmp_path)
    recipe.main(["--modality", "text", "--target", lm, "--data", str(tmp_path / "prompts.txt"),
                 "--out", str(tmp_path / "head"), "--samples", "4", "--eval", "2",
                 "--max-new-tokens", "6", "--collect-batch", "2", "--steps", "3", "--draft", lm,
                 "--tree", "3x2x2", "--device", "cpu"])
    rows = {r["method"]: r for r in json.loads((tmp_path / "head" / "metrics.json").read_text())}
    assert set(rows) == {"plain", "head chain", "head tree", "draft model, K = 4"}
    assert rows["draft model, K = 4"]["acceptance"] == 1.0
    assert rows["plain"]["tokens_per_step"] == 1.0
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(lm)
    assert isinstance(DraftHead.from_pretrained(tmp_path / "head", target), DraftHead)
    card = " ".join((tmp_path / "head" / "README.md").read_text().split())
    assert "tree = depth 3, 2 children per node, 2 nodes expanded per level" in card
    assert "the draft model" in card


def test_the_session_keeps_both_branches_features_under_guidance():
    """``keep_features(layers, uncond=True)`` under guidance: each row's conditional features,
    then its unconditional row's, the same as sessions without guidance on either prompt;
    refused without guidance."""
    from mmspec.sampling import SamplingParams
    from mmspec.sessions import CausalLMSession

    target = tiny_llama(layers=3)
    g = torch.Generator().manual_seed(0)
    ids, unc = (torch.randint(1, 16, (2, 6), generator=g) for _ in range(2))
    mask = torch.ones_like(ids)

    def features(guidance, uncond, prompt):
        s = CausalLMSession(target, SamplingParams(temperature=0.0), guidance_scale=guidance)
        s.keep_features((1, 3), uncond)
        extra = dict(uncond_ids=unc, uncond_mask=mask) if guidance is not None else {}
        s.prefill(prompt, mask, **extra)
        return s.features

    both = features(3.0, True, ids)
    assert both.shape == (2, 5, 4 * 32)
    torch.testing.assert_close(both[..., :64], features(None, False, ids))
    torch.testing.assert_close(both[..., 64:], features(None, False, unc))
    torch.testing.assert_close(both[..., :64], features(3.0, False, ids))
    with pytest.raises(ValueError, match="uncond features: accepted only with classifier-free"):
        features(None, True, ids)


def test_a_head_of_several_layers_round_trips_and_gives_plain_greedy(tmp_path):
    """``num_layers=2``: the files keep it, and its trees give plain greedy's tokens."""
    target = tiny_llama(layers=3)
    torch.manual_seed(1)
    head = DraftHead.for_target(target, num_layers=2)
    assert len(head.decoder.model.layers) == 2
    head.save_pretrained(tmp_path / "h")
    back = DraftHead.from_pretrained(tmp_path / "h", target)
    assert back.config.num_layers == 2
    ids = torch.randint(1, 16, (3, 4), generator=torch.Generator().manual_seed(0))
    plain = mmspec.generate(target, input_ids=ids, temperature=0, max_new_tokens=12)
    out = mmspec.generate(target, input_ids=ids, temperature=0, max_new_tokens=12,
                          drafter=FeatureDrafter(back, depth=3, branch=2, width=2))
    assert torch.equal(out.sequences, plain.sequences)
    with pytest.raises(ValueError, match=r"num_layers=0: accepted an integer >= 1"):
        DraftHead.for_target(target, num_layers=0)


def test_the_recipe_generates_speech_up_to_the_targets_frame_limit(tmp_path):
    """A sentence cut at 32 frames drafts only its start: tts defaults to the target's own
    frame limit (the card says so), vlm and text to 32 tokens."""
    from recipes.cli import BUNDLED

    def source(modality, target, *extra):
        args = recipe.build_parser().parse_args(
            ["--modality", modality, "--target", f"{BUNDLED}/{target}", "--out", str(tmp_path),
             "--device", "cpu", "--eval", "1", "--samples", "1", *extra])
        return recipe.load_source(args)

    tts = source("tts", "shapes-tts")
    assert tts.max_new_tokens is None
    frames = tts.generate(tts.held_out, 0, 1.0).stats
    assert frames.emitted > 32
    assert source("tts", "shapes-tts", "--max-new-tokens", "8").max_new_tokens == 8
    assert source("vlm", "shapes-vlm").max_new_tokens == 32
    trained = dict(modality="tts", data="shapes", samples=1, temperature=1.0, steps=1, unroll=1,
                   seconds=1.0, device="cpu", eval=1, seed=0, max_new_tokens=None)
    head = mmspec.drafters.DraftHead.from_pretrained(f"{BUNDLED}/shapes-tts-head", tts.model)
    card = recipe.model_card("t", head, [], trained)
    assert "up to the target's own frame limit" in card


def test_a_card_names_what_its_describe_data_asked(tmp_path):
    """A card says what its VLM training data asked, as recorded at training (`shapes`: one
    scene in two described, `shapes-describe`: every one), and where it was measured; cards
    without that record do not speak of descriptions."""
    from recipes.cli import BUNDLED

    args = recipe.build_parser().parse_args(
        ["--modality", "vlm", "--target", f"{BUNDLED}/shapes-vlm", "--out", str(tmp_path),
         "--device", "cpu", "--eval", "1", "--samples", "1"])
    source = recipe.load_source(args)
    head = mmspec.drafters.DraftHead.from_pretrained(f"{BUNDLED}/shapes-vlm-head", source.model)
    trained = dict(modality="vlm", data="shapes-describe", samples=1, temperature=0.0, steps=1,
                   unroll=1, seconds=1.0, device="cpu", eval=1, seed=0, max_new_tokens=32,
                   describe_every=1)
    card = " ".join(recipe.model_card("t", head, [], trained).split())
    assert 'Every training scene was asked "describe the image."' in card
    assert "seed 0)" in card
    card = " ".join(recipe.model_card("t", head, [], dict(trained, measured_on="CPU")).split())
    assert "seed 0, on CPU)" in card
    card = " ".join(recipe.model_card("t", head, [], dict(trained, data="shapes",
                                                           describe_every=2)).split())
    assert 'One training scene in 2 was asked "describe the image."' in card
    trained.pop("describe_every")                # a card of no shapes VLM data (t2i, a file)
    card = recipe.model_card("t", head, [], dict(trained, modality="t2i", data="shapes"))
    assert "describe the image" not in card


def test_shapes_vlm_items_describe_one_scene_in_two_and_vary_the_other_questions():
    """The recipe's `shapes` VLM items (and the demo's): even scenes asked for a description
    (answered by the scene's caption), odd ones each of the four one-word questions in turn;
    `shapes-describe` asks every scene."""
    from modalities import shapes_world as sw

    start = 20_000_000
    items = [recipe.shapes_question(s) for s in range(start, start + 16)]
    texts = [msgs[0]["content"][1]["text"] for _, msgs, _ in items]
    for s, (_, _, answer), text in zip(range(start, start + 16), items, texts):
        described = text.startswith("describe")
        assert described == (s % 2 == 0)
        if described:
            assert answer.replace(" ", "") == sw.caption(sw.sample(s)[0]).replace(" ", "")
        else:                                    # a word, a count or a place ("top left")
            assert len(answer.split()) <= 2
    asked = {t.split()[0] + " " + t.split()[1] for t in texts[1::2]}
    assert len(asked) >= 3                       # one-word questions of several kinds
    every = [m[0]["content"][1]["text"] for _, m in recipe.shapes_items("vlm", 6, start, 1)]
    assert all(t.startswith("describe") for t in every)


def test_the_recipe_records_what_its_vlm_data_asked_and_where_it_measured(tmp_path):
    """A VLM head trained on the shapes data records its description rate in training.json,
    and its card states it and the measuring device; --merged-embeds is saved in its config
    and named on its card."""
    import json

    from recipes.cli import BUNDLED

    recipe.main(["--modality", "vlm", "--target", f"{BUNDLED}/shapes-vlm", "--out",
                 str(tmp_path), "--data", "shapes-describe", "--samples", "2", "--collect-batch",
                 "2", "--eval", "1", "--steps", "1", "--temperature", "0", "--tree", "2x1x1",
                 "--device", "cpu", "--merged-embeds"])
    with open(tmp_path / "training.json") as f:
        trained = json.load(f)
    assert trained["describe_every"] == 1 and trained["measured_on"] == "CPU"
    card = " ".join((tmp_path / "README.md").read_text().split())
    assert 'Every training scene was asked "describe the image."' in card
    assert ", on CPU)" in card and "merged image features" in card
    assert DraftHead.from_pretrained(tmp_path).config.merged_embeds


def _deepseek_checkpoint(folder, layers=2):
    """A tiny DeepSeek-V3 checkpoint with its MTP layer as DeepSeek ships it: transformers
    writes a model of ``layers + 1`` layers (layer ``layers`` an MoE block), the MTP layer's
    enorm, hnorm, eh_proj and shared_head.norm are added beside that block, and the config
    says ``layers``. Returns the target loaded from the folder, naming the MTP layer's index
    in ``_keys_to_ignore_on_load_unexpected`` as its class does for its released size (where
    transformers' ``MtpModel`` looks for MTP layers)."""
    import json

    from safetensors.torch import load_file, save_file
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    cfg = dict(vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
               num_attention_heads=2, num_key_value_heads=2, n_shared_experts=1,
               n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
               first_k_dense_replace=1, q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=8,
               v_head_dim=16, qk_nope_head_dim=8, max_position_embeddings=128,
               num_mtp_layers=1, pad_token_id=0, eos_token_id=None, bos_token_id=None)
    torch.manual_seed(0)
    DeepseekV3ForCausalLM(DeepseekV3Config(num_hidden_layers=layers + 1, **cfg)).save_pretrained(
        folder)
    tensors = load_file(str(folder / "model.safetensors"))
    g = torch.Generator().manual_seed(5)
    for name, shape in (("enorm.weight", (32,)), ("hnorm.weight", (32,)),
                        ("shared_head.norm.weight", (32,)), ("eh_proj.weight", (32, 64))):
        tensors[f"model.layers.{layers}.{name}"] = 1 + 0.3 * torch.randn(shape, generator=g) \
            if "norm" in name else 0.2 * torch.randn(shape, generator=g)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["num_hidden_layers"] = layers
    (folder / "config.json").write_text(json.dumps(config))
    target = DeepseekV3ForCausalLM.from_pretrained(folder).eval()
    target._keys_to_ignore_on_load_unexpected = [rf"model\.layers\.{layers}.*"]
    return target


def test_a_deepseek_mtp_layer_drafts_what_transformers_own_mtp_drafts(tmp_path):
    """A DeepSeek-V3-style MTP layer (``model.layers.{N}.*``) loaded by ``head=`` the target's
    folder: its draft logits equal transformers' ``MTPCandidateGenerator``'s (batch 1, after
    the prompt); mmspec drafts with it on ragged batches, plain greedy's tokens; another
    folder than the target's is refused."""
    from transformers import GenerationConfig
    from transformers.generation.candidate_generator import MTPCandidateGenerator

    from mmspec.drafters.load import load_head
    from mmspec.drafters.mtp import DeepSeekMtpHead

    target = _deepseek_checkpoint(tmp_path)
    head = load_head(str(tmp_path), target)
    assert isinstance(head, DeepSeekMtpHead)
    prompt = torch.tensor([[5, 9, 3, 17, 22, 8]])
    with torch.no_grad():
        out = target(prompt, output_hidden_states=True)
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        full = torch.cat([prompt, nxt], 1)
        gen = MTPCandidateGenerator(target, GenerationConfig(do_sample=False), {})
        pos = torch.arange(full.shape[1])[None]
        _, theirs = gen.get_candidates(full, {"position_ids": pos}, out, False, 0)
        # mmspec's pairs: (h_t, x_{t+1}) at the target's position of t
        x = head.inputs(target.get_input_embeddings()(full[:, 1:]),
                        head.reduce_features(out.hidden_states[-1]))
        g = head.decoder.model(inputs_embeds=x, position_ids=pos[:, :-1]).last_hidden_state
        mine = head.decoder.lm_head(g[:, -1:])
    torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=1e-5)
    ids = torch.tensor([[0, 0, 5, 6, 7, 8], [5, 6, 7, 8, 9, 10]])
    kw = dict(attention_mask=(ids != 0).long(), temperature=0, max_new_tokens=10)
    plain = mmspec.generate(target, None, ids, **kw)
    drafted = mmspec.generate(target, None, ids, drafter=FeatureDrafter(head, depth=3), **kw)
    assert torch.equal(drafted.sequences, plain.sequences)
    with pytest.raises(ValueError, match="the target's own checkpoint"):
        DeepSeekMtpHead.from_checkpoint(tmp_path / "elsewhere", target)


@pytest.mark.parametrize("damage", ["truncated weights", "weights not safetensors",
                                    "config not JSON", "config of another kind"])
def test_a_damaged_head_folder_is_refused_naming_the_file(tmp_path, damage):
    """Truncated or foreign files in a head's folder: one ValueError naming the file, through
    ``head=`` (the front doors' loader) as through ``DraftHead.from_pretrained``."""
    from mmspec.drafters.load import load_head

    target = tiny_llama()
    DraftHead.for_target(target).save_pretrained(tmp_path)
    weights, config = tmp_path / "model.safetensors", tmp_path / "config.json"
    if damage == "truncated weights":
        weights.write_bytes(weights.read_bytes()[:200])
    elif damage == "weights not safetensors":
        weights.write_bytes(b"\x80\x02not a tensor file")
    elif damage == "config not JSON":
        config.write_text("{feature_layers")
    else:
        config.write_text('{"feature_layers": [1], "color": "red"}')
    name = "config.json" if "config" in damage else "model.safetensors"
    for load in (lambda: load_head(str(tmp_path), target),
                 lambda: DraftHead.from_pretrained(tmp_path, target)):
        with pytest.raises(ValueError, match=name):
            load()
