"""Runs in vLLM's environment (.venv-vllm): vLLM's ``speculators`` package on folders mmspec
wrote, for tests/drafters/test_vllm.py.

    python speculators_check.py JOB.json

JOB: a list of commands, each a list:
    ["logits", HEAD, INPUTS, OUT]   speculators' own Eagle3DraftModel (loaded from HEAD, its
                                    verifier's embeddings from the folder its config names) on
                                    INPUTS (features [T, F], input_ids [T]): the logits [T, N]
                                    of its first step to OUT
    ["ttt", HEAD, INPUTS, OUT, STEPS]
                                    its multi-step (test-time training) forward, ttt_steps =
                                    STEPS, on each row r of INPUTS (features{r} [T_r, F],
                                    input_ids{r} [T_r], one document each): the logits
                                    logits{r} [STEPS, T_r, N] of every step to OUT
    ["resave", HEAD, OUT]           load HEAD, save it again to OUT
    ["convert", SOURCE, OUT, BASE]  speculators' EAGLE-3 converter on the SafeAILab-layout
                                    folder SOURCE, for the target folder BASE
"""

import json
import sys

import torch
from safetensors.torch import load_file, save_file


def load(folder):
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

    config = Eagle3SpeculatorConfig.from_pretrained(folder)
    config.transformer_layer_config._attn_implementation = "eager"     # flex needs a GPU
    model = Eagle3DraftModel.from_pretrained(folder, config=config).eval()
    if "embed_tokens.weight" not in load_file(f"{folder}/model.safetensors"):
        # speculators fills the embeddings from the verifier where they are NaN, but its
        # loader leaves missing ones uninitialised (not NaN) under transformers 5.19
        model.embed_tokens.weight.data.fill_(float("nan"))
    model.load_verifier_weights()
    return model


def logits(head, inputs, out):
    model = load(head)
    x = load_file(inputs)
    seen = []
    model.lm_head.register_forward_hook(lambda module, args, result: seen.append(result))
    t = x["input_ids"].shape[0]
    with torch.no_grad():
        model(hidden_states=x["features"][None], input_ids=x["input_ids"][None],
              document_ids=torch.zeros(1, t, dtype=torch.long), ttt_steps=1)
    save_file({"logits": seen[0][0].contiguous()}, out)


def ttt(head, inputs, out, steps):
    model = load(head)
    x = load_file(inputs)
    seen = []
    model.lm_head.register_forward_hook(lambda module, args, result: seen.append(result[0]))
    found = {}
    for key in sorted(k for k in x if k.startswith("features")):
        row = key.removeprefix("features")
        ids = x[f"input_ids{row}"]
        seen.clear()
        with torch.no_grad():
            model(hidden_states=x[key][None], input_ids=ids[None],
                  document_ids=torch.zeros(1, len(ids), dtype=torch.long), ttt_steps=steps)
        assert len(seen) == steps, (len(seen), steps)
        found[f"logits{row}"] = torch.stack(seen).contiguous()
    save_file(found, out)


def resave(head, out):
    load(head).save_pretrained(out)


def convert(source, out, base):
    from speculators.convert.eagle.eagle3_converter import Eagle3Converter

    Eagle3Converter().convert(source, out, base_model=base, validate=True)


if __name__ == "__main__":
    commands = {"logits": logits, "ttt": ttt, "resave": resave, "convert": convert}
    with open(sys.argv[1]) as f:
        for name, *args in json.load(f):
            commands[name](*args)
