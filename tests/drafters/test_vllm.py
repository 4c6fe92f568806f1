"""mmspec's EAGLE-3 heads against the field's own code, run in vLLM's environment
(``.venv-vllm``, which ``make vllm-env`` builds and ``make test`` runs first):

- vLLM's ``speculators`` package reads every variant mmspec writes and computes the same
  logits from the same weights (float32), at every step of a drafted chain too (its
  multi-step forward fed mmspec's drafts); what it saves again loads back to the same head;
  its converter's output for a SafeAILab-layout folder loads to the same head;
- vLLM serves the bundled image target (a transformers Llama over its image tokens) with the
  bundled EAGLE-3 head: greedy tokens with speculation equal vLLM's without and mmspec's own
  plain greedy; vLLM's acceptance on the same prompts within 0.05 of mmspec's measurement of
  the head in the same setting (no guidance: vLLM has none), far above a random head's;
- the same for mmspec's own ``DraftHead`` (the bundled image head) exported to 'vllm' and
  served through mmspec's ``vllm.general_plugins`` entry point (``mmspec_vllm``).

The figures are printed in the session's summary (``parity`` lines).
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import mmspec
from conftest import tiny_llama
from mmspec.drafters import FeatureDrafter, layouts
from mmspec.drafters.eagle3 import Eagle3Head, default_feature_layers
from tiny_heads import VARIANTS, eagle3_head as _head, eagle3_pairs as _pairs, forward

ROOT = Path(__file__).resolve().parents[2]
FIELD = ROOT / ".venv-vllm" / "bin" / "python"


def field(script: str, job, tmp_path: Path, *extra: str, timeout: int = 600):
    """Run tests/field/SCRIPT.py on ``job`` in vLLM's environment."""
    if not FIELD.is_file():
        pytest.fail(f"vLLM's environment is missing ({FIELD}): `make vllm-env` builds it "
                    "(`make test` does)")
    path = tmp_path / f"{script}.json"
    path.write_text(json.dumps(job))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1",
               DO_NOT_TRACK="1")
    r = subprocess.run([str(FIELD), str(ROOT / "tests" / "field" / f"{script}.py"), str(path),
                        *extra], cwd=tmp_path, capture_output=True, text=True, timeout=timeout,
                       env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-6000:]


def test_speculators_reads_mmspecs_heads_and_computes_their_logits(tmp_path, record_property):
    """Every variant exported to the speculators layout: speculators' Eagle3DraftModel gives
    the logits mmspec's head gives (float32, within 1e-5 of their scale); speculators saves
    it again and mmspec reads back the same tensors; speculators' converter turns a
    SafeAILab-layout folder into one mmspec reads as the same head."""
    from safetensors.torch import load_file, save_file

    target = tiny_llama(vocab=40, hidden=32, layers=8, heads=2, scale=3.0)
    target.save_pretrained(tmp_path / "target")
    jobs, expect = [], {}
    for i, (name, kw) in enumerate(sorted(VARIANTS.items())):
        head = _head(target, seed=i, **kw)
        layouts.export(head, tmp_path / f"h{i}", "speculators", target=str(tmp_path / "target"))
        feats, embeds = _pairs(target, head, seed=i)
        ids = torch.randint(0, 40, (feats.shape[0],), generator=torch.Generator().manual_seed(i))
        with torch.no_grad():
            feats = torch.cat([target(ids[None], output_hidden_states=True).hidden_states[j]
                               for j in head.config.feature_layers], -1)[0]
            logits = forward(head, feats, target.get_input_embeddings()(ids))[0]
        save_file({"features": feats.contiguous(), "input_ids": ids}, str(tmp_path / f"x{i}"))
        expect[name] = (i, logits[:, head.draft_ids], head)
        jobs += [["logits", str(tmp_path / f"h{i}"), str(tmp_path / f"x{i}"),
                  str(tmp_path / f"y{i}")],
                 ["resave", str(tmp_path / f"h{i}"), str(tmp_path / f"r{i}")]]
    safe = _head(target, seed=9, layers=default_feature_layers(8))
    layouts.export(safe, tmp_path / "safe", "safeailab")
    jobs.append(["convert", str(tmp_path / "safe"), str(tmp_path / "converted"),
                 str(tmp_path / "target")])
    field("speculators_check", jobs, tmp_path)
    for name, (i, mine, head) in expect.items():
        theirs = load_file(str(tmp_path / f"y{i}"))["logits"]
        gap = (theirs - mine).abs().max().item() / mine.abs().max().item()
        record_property("parity", f"speculators logits, {name}: largest gap {gap:.1e} of scale")
        assert gap < 1e-5, (name, gap)
        back = layouts.load(tmp_path / f"r{i}", target).state_to_save()
        for k, v in head.state_to_save().items():
            assert torch.equal(back[k], v), (name, k)
    converted = layouts.load(tmp_path / "converted", target)
    assert layouts.recognise(tmp_path / "converted").name == "speculators"
    for k, v in safe.state_to_save().items():
        assert torch.equal(converted.state_to_save()[k], v), k


def _chains(target, head, prompts: list[list[int]], depth: int):
    """mmspec drafting, greedy, a chain of ``depth`` tokens with ``head`` after each of
    ``prompts`` (left-padded into one batch) through ``FeatureDrafter`` and the head's session,
    at the first step: -> the prompt's features as the head read them [B, P - 1, F] (the
    target's prompt pass keeps those of all but the prompt's last token, which its first step
    feeds with the drafts), the chain's root (that last token) [B], the drafted tokens
    [B, depth] and the head's output-layer logits over its draft ids at each drafting step
    [B, depth, N]."""
    p = max(map(len, prompts))
    ids = torch.tensor([[0] * (p - len(x)) + x for x in prompts])
    mask = torch.tensor([[0] * (p - len(x)) + [1] * len(x) for x in prompts])
    drafter = FeatureDrafter(head, depth=depth, branch=1, width=1)
    seen, got = [], {}
    begin, propose = drafter.begin, drafter.propose

    def on_begin(*args, **kw):
        begin(*args, **kw)
        got.setdefault("features", drafter.target.features.clone())

    def on_propose(last, *args, **kw):
        seen.clear()
        draft = propose(last, *args, **kw)
        if "chain" not in got:                                   # the first step's
            got["chain"] = last.clone(), draft.tokens.clone(), torch.stack(seen, 1)
        return draft

    drafter.begin, drafter.propose = on_begin, on_propose
    hook = head.lm_head.register_forward_hook(lambda m, a, out: seen.append(out.detach()[:, -1]))
    try:
        mmspec.generate(target, input_ids=ids, attention_mask=mask, drafter=drafter,
                        temperature=0, max_new_tokens=2 * depth + 2, stop_token_ids=[])
    finally:
        hook.remove()
    last, tokens, logits = got["chain"]
    assert tokens.shape == (len(prompts), depth) and logits.shape[1] == depth
    return got["features"], last, tokens, logits


def test_speculators_multi_step_forward_gives_mmspecs_chain_drafts(tmp_path, record_property):
    """Every variant drafting chains of 3 after three prompts (7, 5 and 9 tokens, left-padded
    into one batch): the logits of drafting steps 1..3 of mmspec's head equal those of
    speculators' own Eagle3DraftModel's multi-step ("test-time training") forward (float32,
    within 1e-5 of their scale), given the same weights, prompt features and tokens.

    Which quantities correspond. mmspec, a prompt x_0..x_{P-1}: the target's prompt pass keeps
    the features f_0..f_{P-2} (its first step feeds x_{P-1} with the drafts); the head holds
    the pairs (f_t, x_{t+1}), t < P - 2 (none for x_0); drafting step 1 feeds the root
    (f_{P-2}, x_{P-1}) and drafts y_1 from its logits; step k > 1 feeds (g_{k-1}, y_{k-1}),
    g_{k-1} the head's output of step k - 1 (normed with norm_output), one position further,
    seeing the prompt's pairs and its own chain. speculators (speculators/models/eagle3/core.py,
    forward): hidden_states [f_0..f_{P-2}, then d - 1 unused columns], input_ids [x_1..x_{P-1},
    y_1..y_{d-1}], ttt_steps = d; its step s (from 0) feeds at each index i its step s - 1
    output at i (the carried hidden_states, normed with norm_output) with the token
    input_ids[i + s] (teacher forcing: its own argmax, line 322, is overwritten, lines
    332-338), at position_ids + s (line 357); its queries see the step-0 keys causally and, of
    each later step's keys, only their own index (eagle3/attention.py: the diagonal of
    create_combined_mask_mod, extend_dense_mask_for_draft_tokens). So mmspec's step k is
    speculators' step k - 1 at index P - 2, fed mmspec's own drafts. Its other indices are
    chains after shorter prefixes fed the sequence's own tokens (and the pad token 0 past its
    end), not compared. The positions differ by a constant (speculators' start at 1, as
    speculators' shift_batch numbers them): rotary, so the same logits."""
    from safetensors.torch import load_file, save_file

    depth = 3
    target = tiny_llama(vocab=40, hidden=32, layers=8, heads=2, scale=3.0)
    target.save_pretrained(tmp_path / "target")
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(1, 40, (n,), generator=g).tolist() for n in (7, 5, 9)]
    jobs, expect = [], {}
    for i, (name, kw) in enumerate(sorted(VARIANTS.items())):
        head = _head(target, seed=i, **kw)
        layouts.export(head, tmp_path / f"h{i}", "speculators", target=str(tmp_path / "target"))
        feats, last, drafts, logits = _chains(target, head, prompts, depth)
        assert last.tolist() == [x[-1] for x in prompts]
        rows = {}
        for r, x in enumerate(prompts):
            rows[f"features{r}"] = torch.cat([feats[r, 1 - len(x):],
                                              feats.new_zeros(depth - 1, feats.shape[-1])])
            rows[f"input_ids{r}"] = torch.tensor(x[1:] + drafts[r, :depth - 1].tolist())
        save_file(rows, str(tmp_path / f"c{i}"))
        expect[name] = (i, logits)
        jobs.append(["ttt", str(tmp_path / f"h{i}"), str(tmp_path / f"c{i}"),
                     str(tmp_path / f"z{i}"), depth])
    field("speculators_check", jobs, tmp_path)
    for name, (i, mine) in expect.items():
        out = load_file(str(tmp_path / f"z{i}"))
        theirs = torch.stack([out[f"logits{r}"][:, len(x) - 2] for r, x in enumerate(prompts)])
        gaps = (theirs - mine).abs().amax((0, 2)) / mine.abs().amax((0, 2))     # per step
        record_property("parity", f"speculators multi-step logits, {name}: steps 1..{depth} "
                                  f"largest gaps " + ", ".join(f"{x:.1e}" for x in gaps)
                                  + " of scale")
        assert (gaps < 1e-5).all(), (name, gaps)


def _agreeing_prefixes(model, ids, mask, generated, tol=1e-4) -> list[int]:
    """Per row, how many generated tokens lie before the first near-tie of the target's top
    two logits (float32; docs/engine.md's near-tie caveat: kernels may order such ties
    differently)."""
    p = ids.shape[1]
    full = torch.cat([ids, generated], 1)
    with torch.no_grad():
        logits = model(full, attention_mask=torch.cat([mask, torch.ones_like(generated)], 1)
                       ).logits[:, p - 1:-1]
    top = logits.topk(2, -1).values
    tie = (top[..., 0] - top[..., 1]) < tol * top[..., 0].abs().clamp(min=1)
    return [int(t.nonzero()[0]) if t.any() else generated.shape[1] for t in tie]


class _ImageSetting:
    """The bundled image target (a transformers Llama over its image tokens) on 8 captions,
    greedy, 64 tokens, chains of K = 3 (no guidance: vLLM has none), and mmspec's own plain
    greedy tokens of them."""

    new, k = 64, 3
    target = str(ROOT / "samples/models/shapes-t2i")

    def __init__(self):
        from modalities.image import TextToImage
        from recipes.train.draft_head import shapes_items

        pipe = TextToImage.from_pretrained(self.target)
        self.model = pipe.target.model
        self.prompts = [pipe.target._encode(c) for c in shapes_items("t2i", 8, 20_000_000)]
        p = self.p = max(map(len, self.prompts))
        self.ids = torch.tensor([[0] * (p - len(x)) + x for x in self.prompts])
        self.mask = torch.tensor([[0] * (p - len(x)) + [1] * len(x) for x in self.prompts])
        self.kw = dict(input_ids=self.ids, attention_mask=self.mask, temperature=0,
                       max_new_tokens=self.new, stop_token_ids=[])
        self.plain = mmspec.generate(self.model, **self.kw).sequences[:, p:]

    def acceptance(self, head) -> float:
        """mmspec's acceptance of ``head`` drafting chains of K."""
        out = mmspec.generate(self.model, drafter=FeatureDrafter(head, depth=self.k, branch=1,
                                                                 width=1), **self.kw)
        return out.stats.accepted / out.stats.drafted

    def serve(self, tmp_path: Path, heads: dict[str, str]) -> dict[str, float]:
        """vLLM serves the target plainly and with each of ``heads`` (name: folder,
        method="eagle3", K): greedy tokens with speculation equal vLLM's without, which
        equal mmspec's plain greedy up to each row's first near-tie; -> each head's
        acceptance in vLLM."""
        runs = [dict(name="plain", head=None, k=0)]
        runs += [dict(name=name, head=folder, k=self.k) for name, folder in heads.items()]
        field("vllm_serve", dict(target=self.target, prompts=self.prompts,
                                 max_tokens=self.new, runs=runs), tmp_path,
              str(tmp_path / "out.json"))
        out = json.loads((tmp_path / "out.json").read_text())
        for name in heads:
            assert out[name]["tokens"] == out["plain"]["tokens"], name
        for row, n in enumerate(_agreeing_prefixes(self.model, self.ids, self.mask,
                                                   self.plain)):
            assert out["plain"]["tokens"][row][:n] == self.plain[row, :n].tolist(), row
        return {name: out[name]["accepted_tokens"] / out[name]["draft_tokens"]
                for name in heads}


def test_vllm_serves_the_bundled_image_head_as_mmspec_measures_it(tmp_path, record_property):
    s = _ImageSetting()
    bundled = str(ROOT / "samples/models/shapes-t2i-eagle3")
    head = layouts.load(bundled, s.model)
    ours = s.acceptance(head)
    torch.manual_seed(0)
    layouts.export(Eagle3Head.for_target(s.model, head.config.feature_layers, num_layers=2),
                   tmp_path / "random", "speculators", target=s.target)
    rate = s.serve(tmp_path, dict(bundled=bundled, random=str(tmp_path / "random")))
    record_property("parity", f"vLLM acceptance {rate['bundled']:.3f} (random head "
                              f"{rate['random']:.3f}), mmspec's {ours:.3f}, K = {s.k}, "
                              f"{len(s.prompts)} captions x {s.new} tokens")
    assert abs(rate["bundled"] - ours) <= 0.05, (rate, ours)
    assert rate["bundled"] > 0.25 and rate["random"] < 0.05, rate


def test_vllm_serves_mmspecs_own_draft_head_through_the_plugin(tmp_path, record_property):
    """mmspec's own DraftHead (the bundled image head: 2 layers, fusing hidden_states
    [1, 4, 7], 7 the target's last layer after its final norm) exported to 'vllm' and served
    by vLLM through mmspec's vllm.general_plugins entry point (architecture
    MmspecDraftHeadEagle3, method="eagle3"): greedy tokens as above; vLLM's acceptance within
    0.05 of mmspec's measurement of the head, both as vLLM runs it (no pair for the prompt's
    first token: vLLM's proposer has no slot for it) and as trained (with that pair), and of
    the same weights drafting a reduced vocabulary; far above a random DraftHead's. The
    exported folder reads back as the same head."""
    import mmspec_vllm
    from mmspec.drafters import DraftHead

    s = _ImageSetting()
    head = layouts.load(ROOT / "samples/models/shapes-t2i-head", s.model)
    assert type(head) is DraftHead and head.config.feature_layers == (1, 4, 7)
    layouts.export(head, tmp_path / "mine", "vllm", target=s.target)
    config = json.loads((tmp_path / "mine" / "config.json").read_text())
    assert config["architectures"] == [mmspec_vllm.ARCHITECTURE]
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 4, 7]
    assert config["mmspec_final_norm"] == {"layer": 7, "eps": 1e-6}
    back = layouts.load(tmp_path / "mine", s.model)
    assert layouts.recognise(tmp_path / "mine").name == "vllm" and type(back) is DraftHead
    for k, v in head.state_to_save().items():
        assert torch.equal(back.state_to_save()[k], v), k
    trained = s.acceptance(head)
    head.first_pair = False                     # as vLLM's proposer pairs the prompt
    as_vllm = s.acceptance(head)
    # the same weights drafting 300 ids only (the plain tokens' and the lowest others):
    # -inf outside them in vLLM as in mmspec
    reduced = DraftHead(replace(head.config, draft_vocab_size=300))
    reduced.load_state_dict(head.state_to_save(), strict=False)
    reduced.attach(s.model)
    seen = s.plain.unique()
    rest = torch.tensor([i for i in range(head.config.vocab_size) if i not in set(seen.tolist())])
    reduced.set_draft_ids(torch.cat([seen, rest[:300 - len(seen)]]))
    reduced.first_pair = False
    as_vllm_reduced = s.acceptance(reduced)
    layouts.export(reduced, tmp_path / "reduced", "vllm", target=s.target)
    torch.manual_seed(0)
    layouts.export(DraftHead.for_target(s.model, head.config.feature_layers, num_layers=2),
                   tmp_path / "random", "vllm", target=s.target)
    rate = s.serve(tmp_path, dict(mine=str(tmp_path / "mine"), reduced=str(tmp_path / "reduced"),
                                  random=str(tmp_path / "random")))
    record_property("parity", f"vLLM plugin, mmspec DraftHead: acceptance {rate['mine']:.3f} "
                              f"(random head {rate['random']:.3f}), mmspec's {as_vllm:.3f} "
                              f"without the first pair, {trained:.3f} as trained; 300 draft "
                              f"ids: vLLM {rate['reduced']:.3f}, mmspec {as_vllm_reduced:.3f}; "
                              f"K = {s.k}, {len(s.prompts)} captions x {s.new} tokens")
    assert abs(rate["mine"] - as_vllm) <= 0.05 and abs(rate["mine"] - trained) <= 0.05, \
        (rate, as_vllm, trained)
    assert abs(rate["reduced"] - as_vllm_reduced) <= 0.05, (rate, as_vllm_reduced)
    assert rate["mine"] > 0.25 and rate["random"] < 0.05, rate


def test_the_recipe_exports_a_draft_head_for_vllm(tmp_path):
    """--export vllm with mmspec's own head (--arch draft-head): the exported folder reads
    back as the head the recipe saved, with the target's final norm copied where the head
    fuses its last layer; EAGLE-3 layouts for a DraftHead, 'vllm' for an EAGLE-3 head, a
    target that is no local folder, one whose final norm is not Llama's (Gemma) where the
    head fuses the last layer, and an M-RoPE target are refused before any work."""
    from safetensors.torch import load_file
    from tiny_heads import text_lm_folder as _text_lm_folder
    from transformers import AutoModelForCausalLM

    from mmspec.drafters import DraftHead
    from recipes.train import draft_head as recipe

    lm = _text_lm_folder(tmp_path, layers=4)
    common = ["--modality", "text", "--target", lm, "--data", str(tmp_path / "prompts.txt"),
              "--samples", "4", "--eval", "2", "--max-new-tokens", "6", "--collect-batch", "2",
              "--steps", "3", "--tree", "3x2x2", "--device", "cpu"]
    gemma, mrope = tmp_path / "gemma", tmp_path / "mrope"
    for folder, cfg in ((gemma, dict(model_type="gemma3_text", num_hidden_layers=4,
                                     rms_norm_eps=1e-6)),
                        (mrope, dict(model_type="qwen2_vl_text", num_hidden_layers=4,
                                     rms_norm_eps=1e-6,
                                     rope_parameters={"mrope_section": [2, 1, 1]}))):
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(cfg))
    for flags, message in ((["--export", "speculators", "x"], "accepted with --arch eagle3"),
                           (["--arch", "eagle3", "--export", "vllm", "x"], "accepted one of"),
                           (["--export", "vllm", "x", "--target", "org/name"],
                            "not a local folder"),
                           (["--export", "vllm", "x", "--target", str(gemma)],
                            "no Llama-style final RMSNorm"),
                           (["--export", "vllm", "x", "--target", str(mrope)], "M-RoPE")):
        with pytest.raises(ValueError, match=message):
            recipe.main(common + ["--out", str(tmp_path / "no")] + flags)
    assert not (tmp_path / "no").exists()
    layouts.check_vllm_target(str(gemma), (1, 2, 3))   # the last layer not fused: no norm read
    recipe.main(common + ["--out", str(tmp_path / "head"), "--export", "vllm",
                          str(tmp_path / "head-vllm")])
    target = AutoModelForCausalLM.from_pretrained(lm)
    saved = layouts.load(tmp_path / "head", target)
    back = layouts.load(tmp_path / "head-vllm", target)
    assert type(back) is DraftHead and back.config == saved.config
    assert saved.config.feature_layers == (1, 2, 4)              # the default: 4 is the last
    for k, v in saved.state_to_save().items():
        assert torch.equal(back.state_to_save()[k], v), k
    config = json.loads((tmp_path / "head-vllm" / "config.json").read_text())
    assert config["mmspec_final_norm"] == {"layer": 4, "eps": target.config.rms_norm_eps}
    norm = load_file(str(tmp_path / "head-vllm" / "model.safetensors"))["target_norm.weight"]
    assert torch.equal(norm, target.model.norm.weight.detach())
    with pytest.raises(ValueError, match="accepted mmspec's own token DraftHead"):
        layouts.export(layouts.load(ROOT / "samples/models/shapes-t2i-eagle3",
                                    AutoModelForCausalLM.from_pretrained(
                                        ROOT / "samples/models/shapes-t2i")),
                       tmp_path / "e3", "vllm")
