"""Tensor-parallel targets: transformers' ``tp_plan="auto"`` in two processes on ``gloo`` (CPU),
as ``torchrun`` runs them on GPUs. Each process loads the target split in two and its own
draft; the loop runs in each. Greedy decoding (plain, a draft model, Jacobi; dynamic and
static caches) gives one process's tokens, for ``mmspec.generate``, a VLM front door
loaded with ``from_pretrained(..., distributed_config=...)``, and the text-to-image (guided)
and speech front doors over the split Llama; sampling gives the same tokens
in both processes, seeded or not (``mmspec.distributed.shared_seed``), though their global
generators differ. Sampled tokens are not compared with one process's: the all-reduce sums
partial products in another order, and a last-bit difference may move a draw."""

from __future__ import annotations

import json
import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

import mmspec

WORLD = 2
METHODS = ("plain", "draft", "jacobi")


def _tiny_llama(seed: int, hidden: int, layers: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(
        hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=97, initializer_range=0.3,
        max_position_embeddings=128)).eval()


def _text(target, draft) -> dict:
    ids = torch.randint(3, 97, (2, 7), generator=torch.Generator().manual_seed(1))
    out = {}
    for method in METHODS:
        kw = {"draft": dict(draft=draft), "jacobi": dict(drafter=mmspec.Jacobi(4))}.get(method, {})
        for static in (False, True):
            for temperature, seed in ((0, 0), (1.0, 3), (1.0, None)):
                res = mmspec.generate(target, input_ids=ids, max_new_tokens=10, stop_token_ids=[],
                                      temperature=temperature, seed=seed, static_cache=static,
                                      **kw)
                out[f"{method} static={static} t={temperature} seed={seed}"] = \
                    res.sequences.tolist()
    return out


def _vlm(gen) -> dict:
    from tiny_vlm import images

    ims = images(2)
    prompts = ["USER: <image> what colour is the circle ? ASSISTANT:", "USER: <image> a ASSISTANT:"]
    return {f"{m}": gen.generate(ims, prompts, method=m, temperature=0, max_new_tokens=8,
                                 seed=0).token_ids for m in ("plain", "sjd")}


def _fronts(target) -> dict:
    """The text-to-image (a token span of the target's ids, guidance on) and single-codebook
    speech front doors on ``target``: plain and Jacobi decoding, greedy and seeded sampling."""
    from modalities.image import TextToImage, TokenSpanAdapter
    from modalities.speech import SingleCodebookAdapter, TextToSpeech
    from tiny_image import tiny_vq
    from tiny_speech import TEXTS, ToyCodec

    pipe = TextToImage(TokenSpanAdapter(target, list(range(40, 56)), (4, 4), tiny_vq(),
                                        prefix=[1], suffix=[2], pad_id=0))
    tts = TextToSpeech(SingleCodebookAdapter(target, ToyCodec(), range(20, 36), end_id=36,
                                             prefix=[1], suffix=[2], max_frames=12))
    out = {}
    for method in ("plain", "sjd"):
        for t in (0, 1.0):
            image = pipe([[3, 4, 5], [6]], method=method, guidance_scale=3.0, temperature=t,
                         seed=5, progress=False, decode=False)
            speech = tts(TEXTS, method=method, temperature=t, seed=5, progress=False)
            out[f"image {method} t={t}"] = image.tokens.tolist()
            out[f"speech {method} t={t}"] = [c.tolist() for c in speech.codes]
    return out


def _rows(weight) -> int:
    """The rows of a weight this process holds (a DTensor's local shard)."""
    return (weight.to_local() if hasattr(weight, "to_local") else weight).shape[0]


def _worker(rank: int, port: int, folder: str) -> None:
    import sys

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import DistributedConfig, LlamaForCausalLM

    from modalities.vlm import VisionLanguageGenerator

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # tests/: helpers
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    split = dict(distributed_config=DistributedConfig(tp_plan="auto", tp_size=WORLD),
                 device_mesh=init_device_mesh("cpu", (WORLD,)))
    target = LlamaForCausalLM.from_pretrained(f"{folder}/target", **split).eval()
    draft = LlamaForCausalLM.from_pretrained(f"{folder}/draft").eval()
    gen = VisionLanguageGenerator.from_pretrained(f"{folder}/vlm", **split)
    torch.manual_seed(1000 + rank)        # processes whose global generators differ
    out = {"split": [_rows(target.model.layers[0].self_attn.q_proj.weight),
                     _rows(gen.target.model.language_model.layers[0].self_attn.q_proj.weight)],
           "text": _text(target, draft), "vlm": _vlm(gen), "fronts": _fronts(target)}
    with open(f"{folder}/rank{rank}.json", "w") as f:
        json.dump(out, f)
    dist.barrier()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """The target, draft and VLM saved; both processes' results, and one process's."""
    from tiny_vlm import tiny_llava, tiny_processor

    from modalities.vlm import VisionLanguageGenerator

    folder = tmp_path_factory.mktemp("tp")
    target, draft = _tiny_llama(0, 64, 2), _tiny_llama(1, 32, 1)
    target.save_pretrained(folder / "target")
    draft.save_pretrained(folder / "draft")
    vlm, proc = tiny_llava(hidden=64), tiny_processor()
    vlm.config.text_config.num_attention_heads = 4
    vlm = type(vlm)(vlm.config).eval()
    vlm.save_pretrained(folder / "vlm")
    proc.save_pretrained(folder / "vlm")
    mp.spawn(_worker, args=(_free_port(), str(folder)), nprocs=WORLD, join=True)
    runs = [json.loads((folder / f"rank{r}.json").read_text()) for r in range(WORLD)]
    gen = VisionLanguageGenerator.from_pretrained(str(folder / "vlm"))
    return runs, {"text": _text(target, draft), "vlm": _vlm(gen), "fronts": _fronts(target)}


def test_the_target_is_split_across_the_processes(ranks):
    runs, _ = ranks
    assert [r["split"] for r in runs] == [[64 // WORLD, 128 // WORLD]] * WORLD   # q_proj's rows


def test_greedy_tokens_equal_one_process(ranks):
    runs, one = ranks
    keys = [k for k in one["text"] if "t=0 " in k]
    assert len(keys) == 2 * len(METHODS)
    for key in keys:
        assert all(r["text"][key] == one["text"][key] for r in runs), key
    assert all(r["vlm"] == one["vlm"] for r in runs)


def test_image_and_speech_front_doors_take_a_split_target(ranks):
    """Text-to-image with guidance and single-codebook speech on the split target: greedy
    tokens equal one process's, seeded sampling draws alike in every process (the rules'
    embedding tables gathered whole: ``mmspec.distributed.whole``)."""
    runs, one = ranks
    for key, want in one["fronts"].items():
        assert runs[0]["fronts"][key] == runs[1]["fronts"][key], key
        if key.endswith("t=0"):
            assert runs[0]["fronts"][key] == want, key


def test_sampled_calls_draw_alike_in_every_process(ranks):
    """Seeded, every process draws alike; without a seed, the first process's global
    generator draws one for all: the processes' tokens agree though their global generators
    differ (each drawing its own would feed the split layers different tokens), and differ
    from a seeded call's."""
    runs, _ = ranks
    keys = [k for k in runs[0]["text"] if "t=1.0" in k]
    assert len(keys) == 4 * len(METHODS)
    for key in keys:
        assert runs[0]["text"][key] == runs[1]["text"][key], key
    keys = [k for k in keys if "seed=None" in k]
    assert any(runs[0]["text"][k] != runs[0]["text"][k.replace("seed=None", "seed=3")]
               for k in keys)
