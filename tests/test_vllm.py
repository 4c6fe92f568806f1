"""mmspec's EAGLE-3 heads against the field's own code, run in vLLM's environment
(``.venv-vllm``, which ``make vllm-env`` builds and ``make test`` runs first):

- vLLM's ``speculators`` package reads every variant mmspec writes and computes the same
  logits from the same weights (float32); what it saves again loads back to the same head;
  its converter's output for a SafeAILab-layout folder loads to the same head;
- vLLM serves the bundled image target (a transformers Llama over its image tokens) with the
  bundled EAGLE-3 head: greedy tokens with speculation equal vLLM's without and mmspec's own
  plain greedy; vLLM's acceptance on the same prompts within 0.05 of mmspec's measurement of
  the head in the same setting (no guidance: vLLM has none), far above a random head's.

The figures are printed in the session's summary (``parity`` lines).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

import mmspec
from conftest import tiny_llama
from mmspec.drafters import FeatureDrafter, layouts
from mmspec.drafters.eagle3 import Eagle3Head, default_feature_layers
from test_eagle3 import VARIANTS, _head, _pairs, forward

ROOT = Path(__file__).resolve().parent.parent
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


def test_vllm_serves_the_bundled_image_head_as_mmspec_measures_it(tmp_path, record_property):
    from modalities.image import TextToImage
    from recipes.train.draft_head import shapes_items

    pipe = TextToImage.from_pretrained(str(ROOT / "samples/models/shapes-t2i"))
    model = pipe.target.model
    prompts = [pipe.target._encode(c) for c in shapes_items("t2i", 8, 20_000_000)]
    new, k = 64, 3
    p = max(map(len, prompts))
    ids = torch.tensor([[0] * (p - len(x)) + x for x in prompts])
    mask = torch.tensor([[0] * (p - len(x)) + [1] * len(x) for x in prompts])
    kw = dict(input_ids=ids, attention_mask=mask, temperature=0, max_new_tokens=new,
              stop_token_ids=[])
    plain = mmspec.generate(model, **kw).sequences[:, p:]
    bundled = str(ROOT / "samples/models/shapes-t2i-eagle3")
    head = layouts.load(bundled, model)
    drafted = mmspec.generate(model, drafter=FeatureDrafter(head, depth=k, branch=1, width=1),
                              **kw)
    ours = drafted.stats.accepted / drafted.stats.drafted
    torch.manual_seed(0)
    layouts.export(Eagle3Head.for_target(model, head.config.feature_layers, num_layers=2),
                   tmp_path / "random", "speculators", target=str(ROOT / "samples/models/shapes-t2i"))
    runs = [dict(name="plain", head=None, k=0), dict(name="bundled", head=bundled, k=k),
            dict(name="random", head=str(tmp_path / "random"), k=k)]
    field("vllm_serve", dict(target=str(ROOT / "samples/models/shapes-t2i"), prompts=prompts,
                             max_tokens=new, runs=runs), tmp_path, str(tmp_path / "out.json"))
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["bundled"]["tokens"] == out["plain"]["tokens"] == out["random"]["tokens"]
    for row, n in enumerate(_agreeing_prefixes(model, ids, mask, plain)):
        assert out["plain"]["tokens"][row][:n] == plain[row, :n].tolist(), row
    rate = {name: out[name]["accepted_tokens"] / out[name]["draft_tokens"]
            for name in ("bundled", "random")}
    record_property("parity", f"vLLM acceptance {rate['bundled']:.3f} (random head "
                              f"{rate['random']:.3f}), mmspec's {ours:.3f}, K = {k}, "
                              f"{len(prompts)} captions x {new} tokens")
    assert abs(rate["bundled"] - ours) <= 0.05, (rate, ours)
    assert rate["bundled"] > 0.25 and rate["random"] < 0.05, rate
