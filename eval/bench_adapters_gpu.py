"""GPU benchmark of the modality adapters' engine switches: eager against ``compile=True``,
plain decoding against speculative decoding, through the adapters' own calls.

    python -m eval.bench_adapters_gpu --out out/bench_adapters          # H100 / H200
    python -m eval.bench_adapters_gpu --tiny --device cpu               # a smoke run on CPU

- ``vlm``: ``VisionLanguageGenerator`` on a LLaVA-1.5-7B shape (CLIP ViT-L/14 at 336 px, 576
  image tokens, the 7B Llama language model, vocabulary 32064), random bf16 weights. Drafts:
  the language model's first two layers as a text-only causal LM (``draft_mode="text"``: it
  never sees the image), and the same two layers with the target's vision tower and projector
  (``"image"``). As in ``eval.bench_gpu``, layers >= 2 of the target write into the residual
  stream scaled by ``eps``, so at eps = 0 the image draft is exact while the text draft still
  misses the image; acceptance is measured and reported.
- ``qwen2.5-vl``, ``qwen3.5``: ``VisionLanguageGenerator`` on a Qwen2.5-VL-7B shape and a
  Qwen3.5-9B shape (three in four decoder layers Gated DeltaNet linear attention, rolled back
  by snapshot and replay), a 336 px image (144 visual tokens), random bf16 weights; the draft
  is the same class with the target's first decoder layers (``"image"``: two; Qwen3.5 four,
  up to its first full-attention layer), eps as above; for Qwen2.5-VL also a smaller model of
  the family (``"3b-shape"``: the Qwen2.5-VL-3B shape with its own random weights and the
  family's padded vocabulary; with random weights its acceptance is near zero, so its row
  measures the cost side: the bound at the first-layers draft's tokens per step is reported
  as ``bound_at_image_acceptance``).
- ``tts``: ``TextToSpeech`` with a ``SingleCodebookAdapter`` on a Llasa-1B shape (Llama 1B:
  16 layers of hidden 2048, a 193,800-id vocabulary of text and 65,536 codec ids); the draft is
  its first two layers the same way. Codes only (``decode=False``): the codec is not timed.

Greedy decoding at each ``--batches`` size (rows of one call: images of different colours,
texts of different lengths); every speculative and captured output is checked token for token
against eager plain decoding at the same batch. Each row: ms per generated token, acceptance,
tokens per step, the speedup against eager plain decoding and against plain decoding in the
same mode, and the analytic bound (tokens per step x a plain step / (a K + 1 verification
step + K draft steps), single steps timed on a static cache at the row's batch) with
efficiency = speedup / bound. Speculative rows also give those single steps' times
(``step_ms``, ``verify_ms``, ``draft_step_ms``) beside the call's time per target step
(``ms_per_step``, the prompt pass included), so a call below its bound shows whether its
steps or the rest of the call take the time. JSON lines on stdout and in bench.jsonl;
report.md summarises.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import Callable

import torch

import mmspec
from eval.bench_gpu import (build, copy_bandwidth, first_layers, open_log, residual_writes, set_eps,
                            step_cost, timed)
from recipes.cli import COUNT, Names, Number, Numbers, Parser, describe, run


def step_bytes(modules) -> int:
    """Bytes of weights one decoding step reads: the modules' parameters (each once) less
    their input-embedding tables, of which a step reads only its tokens' rows."""
    params = {id(p): p for m in modules for p in m.parameters()}
    for m in modules:
        emb = m.get_input_embeddings() if hasattr(m, "get_input_embeddings") else None
        if emb is not None:
            params.pop(id(emb.weight), None)
    return sum(p.numel() * p.element_size() for p in params.values())


def build_vlm(dev, dtype, tiny: bool):
    from transformers import CLIPImageProcessor, LlavaConfig, LlavaForConditionalGeneration, LlavaProcessor

    from recipes.train.vlm import CHAT, WORDS, tokenizer

    size, patch = (32, 8) if tiny else (336, 14)
    text = (dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=4) if tiny else
            dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                 num_attention_heads=32, num_key_value_heads=32))
    vision = (dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
              if tiny else dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24,
                                num_attention_heads=16))
    cfg = LlavaConfig(vision_config=dict(model_type="clip_vision_model", image_size=size,
                                         patch_size=patch, projection_dim=768, **vision),
                      text_config=dict(model_type="llama", vocab_size=32064,
                                       max_position_embeddings=4096, pad_token_id=0,
                                       bos_token_id=1, eos_token_id=None, **text),
                      image_token_index=WORDS.index("<image>"), vision_feature_layer=-2,
                      vision_feature_select_strategy="default")
    torch.manual_seed(0)
    with torch.device(dev):
        target = LlavaForConditionalGeneration(cfg).to(dtype).eval()
    lm = target.model.language_model
    text_draft = first_layers(lm, target.lm_head)
    with torch.device("meta"):
        image_draft = LlavaForConditionalGeneration(LlavaConfig(
            vision_config=cfg.vision_config.to_dict(),
            text_config={**cfg.text_config.to_dict(), "num_hidden_layers": 2},
            image_token_index=cfg.image_token_index, vision_feature_layer=-2,
            vision_feature_select_strategy="default"))
    image_draft.model.vision_tower = target.model.vision_tower
    image_draft.model.multi_modal_projector = target.model.multi_modal_projector
    image_draft.model.language_model = text_draft.model
    image_draft.lm_head = target.lm_head
    image_draft.eval()
    ip = CLIPImageProcessor(size={"shortest_edge": size}, crop_size={"height": size, "width": size})
    proc = LlavaProcessor(image_processor=ip, tokenizer=tokenizer(), patch_size=patch,
                          vision_feature_select_strategy="default", chat_template=CHAT,
                          num_additional_image_tokens=1)
    return target, {"text": text_draft, "image": image_draft}, proc, residual_writes(lm.layers[2:])


QWEN_SHAPES = {  # (model type, text config, vision config) at 7B / 9B; tiny for smoke runs
    "qwen2.5-vl": ("Qwen2_5_VL", dict(hidden_size=3584, intermediate_size=18944,
                                      num_hidden_layers=28, num_attention_heads=28,
                                      num_key_value_heads=4, vocab_size=152064),
                   dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16,
                        out_hidden_size=3584, window_size=112, fullatt_block_indexes=[7, 15, 23, 31])),
    "qwen3.5": ("Qwen3_5", dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=32,
                                num_attention_heads=16, num_key_value_heads=4, head_dim=256,
                                vocab_size=248320),
                dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16,
                     out_hidden_size=4096)),
}


# A smaller same-family draft: Qwen2.5-VL-3B (its own vision tower's output width, the
# family's 151,936-id vocabulary under the 7B's 152,064: padded, as users pair them).
SMALL_SHAPES = {
    "qwen2.5-vl": (dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
                        num_attention_heads=16, num_key_value_heads=2, vocab_size=151936),
                   dict(out_hidden_size=2048)),
}


def build_qwen(kind: str, dev, dtype, tiny: bool):
    """A Qwen2.5-VL-7B or Qwen3.5-9B shape (random weights), its processor, and an image draft
    of the same class made of the target's first decoder layers (two; Qwen3.5: four, its first
    full-attention layer included; vision tower, embeddings and head shared); the later layers
    write scaled by eps."""
    import transformers

    from recipes.train.vlm import QWEN_SPECIAL, WORDS, qwen_processor

    words = ["<pad>", "<s>", "</s>", "<unk>", *QWEN_SPECIAL] + WORDS[5:]
    name, text, vision = QWEN_SHAPES[kind]
    if tiny:
        text = {**text, **dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                               num_attention_heads=4, num_key_value_heads=2)}
        text.update(head_dim=16, rope_parameters=dict(
            rope_type="default", rope_theta=1e4, mrope_section=[2, 3, 3],
            partial_rotary_factor=1.0, mrope_interleaved=kind == "qwen3.5"))
        vision = {**vision, **dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                                   out_hidden_size=64, fullatt_block_indexes=[0])}
    ids = {f"{k}_token_id": words.index(f"<|{t}|>") for k, t in (
        ("image", "image_pad"), ("video", "video_pad"), ("vision_start", "vision_start"),
        ("vision_end", "vision_end"))}
    cfg = getattr(transformers, f"{name}Config")(
        text_config=dict(max_position_embeddings=4096, pad_token_id=0, bos_token_id=1,
                         eos_token_id=None, **text),
        vision_config=dict(patch_size=14, spatial_merge_size=2, temporal_patch_size=2, **vision),
        **ids)
    cls = getattr(transformers, f"{name}ForConditionalGeneration")
    torch.manual_seed(0)
    with torch.device(dev):
        target = cls(cfg).to(dtype).eval()
    n = 4 if kind == "qwen3.5" else 2       # Qwen3.5: three linear layers and one full
    with torch.device("meta"):
        draft = cls(type(cfg)(text_config={**cfg.text_config.to_dict(), "num_hidden_layers": n,
                                           "layer_types": cfg.text_config.layer_types[:n]},
                              vision_config=cfg.vision_config.to_dict(), **ids))
    lm, dlm = target.model.language_model, draft.model.language_model
    draft.model.visual, draft.lm_head = target.model.visual, target.lm_head
    dlm.embed_tokens, dlm.norm, dlm.rotary_emb = lm.embed_tokens, lm.norm, lm.rotary_emb
    dlm.layers = torch.nn.ModuleList(list(lm.layers[:n]))
    proc = qwen_processor(words, kind, patch=14, max_pixels=336 * 336)
    drafts = {"image": draft.eval()}
    if kind in SMALL_SHAPES:                 # a smaller model of the family, its own weights
        small_text, small_vision = SMALL_SHAPES[kind]
        if tiny:
            small_text = {**text, "num_hidden_layers": 2, "vocab_size": text["vocab_size"] - 64}
            small_vision = {}
        layers = small_text["num_hidden_layers"]
        small_text = {**small_text, "layer_types": ["full_attention"] * layers}
        small = type(cfg)(text_config={**cfg.text_config.to_dict(), **small_text},
                          vision_config={**cfg.vision_config.to_dict(), **small_vision}, **ids)
        torch.manual_seed(1)
        with torch.device(dev):
            drafts["3b-shape"] = cls(small).to(dtype).eval()
    return target, drafts, proc, residual_writes(lm.layers[n:])


def build_tts(dev, dtype, tiny: bool):
    from modalities.speech import SingleCodebookAdapter

    target, draft, originals = build("tiny" if tiny else "llasa-1b", dev, dtype)
    vocab = target.config.vocab_size
    size = 64 if tiny else 65536                  # codec ids: the vocabulary's last ids but one

    class NoCodec:                       # codes only: nothing is decoded
        sample_rate, codebook_size = 16000, size

        def decode(self, frames):
            raise RuntimeError("not decoded in the benchmark")

    mk = lambda m: SingleCodebookAdapter(m, NoCodec(), range(vocab - 1 - size, vocab - 1),  # noqa: E731
                                         end_id=vocab - 1, prefix=[1], suffix=[2])
    return mk(target), {"2-layer": mk(draft)}, None, originals


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--which", type=Names(("vlm", "tts", *QWEN_SHAPES)), default="vlm,tts",
                    help="adapters: vlm (LLaVA-1.5-7B), qwen2.5-vl (7B), qwen3.5 (9B), tts")
    ap.add_argument("--device", default="cuda", help="cuda, cuda:1 ... (cpu: eager only)")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (a smoke run)")
    ap.add_argument("--eps", type=Numbers(Number(float, 0)), default="0.0,0.05",
                    help="scale of the draft's dropped layers' residual writes")
    ap.add_argument("--k", type=COUNT, default=4, help="drafts per step K")
    ap.add_argument("--batches", type=Numbers(COUNT), default="1", help="rows per call, e.g. 1,16")
    ap.add_argument("--new-tokens", type=COUNT, default=128)
    ap.add_argument("--modes", type=Names(("eager", "captured")), default="eager,captured")
    ap.add_argument("--out", default="out/bench_adapters", help="output folder")
    return describe(ap)


@dataclass
class Setup:
    """One adapter shape ready to time: ``call(draft, method, compile, batch) -> (ids, stats)``,
    the decoder modules a step reads, the drafts, the layers eps scales, and the causal LMs
    whose single steps are timed for the analytic bound (``"target"`` and each draft's name)."""

    call: Callable
    decoder: list
    drafts: dict
    originals: list
    lms: dict


def setup_vlm(which: str, args, dev, dtype) -> Setup:
    from PIL import Image

    from modalities.vlm import VisionLanguageGenerator
    from recipes.train.vlm import WORDS

    build = build_vlm if which == "vlm" else (lambda *a: build_qwen(which, *a))
    target, drafts, proc, originals = build(dev, dtype, args.tiny)
    side = 32 if args.tiny else 336
    question = " ".join(WORDS[12:40])
    prompt = (f"USER: <image> describe the image {question} ASSISTANT:" if which == "vlm" else
              [{"role": "user", "content": [{"type": "image"},
                                            {"type": "text", "text": question}]}])

    def call(draft_name, method, compile, batch):
        mode = "text" if draft_name == "text" else "image"
        images = [Image.new("RGB", (side, side), (200, 40 + 10 * i, 40)) for i in range(batch)]
        g = VisionLanguageGenerator(target, proc, drafts.get(draft_name), mode)
        out = g.generate(images, [prompt] * batch, method=method, max_new_tokens=args.new_tokens,
                         temperature=0, num_draft_tokens=args.k, compile=compile)
        return out.token_ids, out.stats
    return Setup(call, [target.model.language_model, target.lm_head], drafts, originals,
                 {"target": target, **drafts})


def setup_tts(args, dev, dtype) -> Setup:
    from modalities.speech import TextToSpeech

    target, drafts, _, originals = build_tts(dev, dtype, args.tiny)

    def call(draft_name, method, compile, batch):
        tts = TextToSpeech(target, drafts.get(draft_name))
        text = [list(range(3, 40 - i % 8)) for i in range(batch)]
        out = tts(text, method=method, temperature=0, max_frames=args.new_tokens, decode=False,
                  progress=False, compile=compile,
                  **({} if method == "plain" else dict(num_draft_tokens=args.k)))
        return [c.tolist() for c in out.codes], out.stats
    return Setup(call, [target.model], drafts, originals,
                 {"target": target.model, **{k: d.model for k, d in drafts.items()}})


def bound(stats, costs: dict, draft: str, k: int) -> float:
    """The analytic speedup: tokens per step x a plain step's cost / (a verification step of
    K + 1 tokens + K draft steps), from the measured single-step costs."""
    return stats.tokens_per_step * costs["t1"] / (costs["tk"] + k * costs[draft])


def measure(which: str, st: Setup, args, modes, emit, bw, dev) -> None:
    floor_ms = 1e3 * step_bytes(st.decoder) / bw
    emit(dict(kind=f"{which}-shape", step_gb=step_bytes(st.decoder) / 1e9, floor_ms=floor_ms))
    for eps in args.eps:
        set_eps(st.originals, eps)
        for batch in args.batches:
            measure_batch(which, st, args, modes, emit, floor_ms, dev, eps, batch)
        mmspec.release_graphs()


def measure_batch(which, st: Setup, args, modes, emit, floor_ms, dev, eps, batch) -> None:
    """Plain and each draft's rows at one eps and batch, eager plain decoding the reference."""
    n, base = args.new_tokens, None
    for mode in modes:
        cap = mode == "captured"
        costs = dict(t1=step_cost(st.lms["target"], batch, 1, dev, cap),
                     tk=step_cost(st.lms["target"], batch, args.k + 1, dev, cap),
                     **{d: step_cost(st.lms[d], batch, 1, dev, cap) for d in st.drafts})
        # Captured calls: two warm-up calls (steps captured, the prompt pass compiled).
        reps = dict(repeats=3, warmup=2) if cap else {}
        (ref, _), t_plain = timed(lambda: st.call(None, "plain", cap, batch), dev, **reps)
        base = base or (ref, t_plain)
        emit(dict(kind=f"{which}-plain", mode=mode, eps=eps, batch=batch,
                  ms_per_token=1e3 * t_plain / n, step_over_floor=1e3 * t_plain / n / floor_ms,
                  speedup_vs_eager_plain=base[1] / t_plain, identical=ref == base[0]))
        seen = {}
        for name in st.drafts:
            (toks, stats), t = timed(lambda: st.call(name, "exact", cap, batch), dev, **reps)
            b = bound(stats, costs, name, args.k)
            seen[name] = stats
            extra = ({} if name != "3b-shape" or "image" not in seen else dict(
                bound_at_image_acceptance=bound(seen["image"], costs, name, args.k)))
            emit(dict(kind=f"{which}-spec", mode=mode, eps=eps, batch=batch, draft=name,
                      k=args.k, acceptance=stats.acceptance_rate,
                      tokens_per_step=stats.tokens_per_step, ms_per_token=1e3 * t / n,
                      speedup=t_plain / t, bound=b, efficiency=t_plain / t / b,
                      speedup_vs_eager_plain=base[1] / t, identical=toks == base[0],
                      steps=stats.steps, ms_per_step=1e3 * t / stats.steps,
                      step_ms=1e3 * costs["t1"], verify_ms=1e3 * costs["tk"],
                      draft_step_ms=1e3 * costs[name], **extra))


def main(argv=None):
    args = build_parser().parse_args(argv)
    dev = torch.device(args.device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    rows, emit = open_log(args.out)
    bw = copy_bandwidth(dev)
    emit(dict(kind="setup", device=torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
              copy_tb_s=bw / 1e12, torch=torch.__version__,
              transformers=__import__("transformers").__version__))
    modes = [m for m in args.modes if dev.type == "cuda" or m == "eager"]
    for which in args.which:
        st = setup_tts(args, dev, dtype) if which == "tts" else setup_vlm(which, args, dev, dtype)
        measure(which, st, args, modes, emit, bw, dev)
        del st                                   # free one shape before building the next
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    write_report(args.out, rows)


def write_report(out_dir, rows):
    s = rows[0]
    lines = ["# Adapter GPU benchmark", "",
             f"{s['device']}, torch {s['torch']}, transformers {s['transformers']}, copy "
             f"bandwidth {s['copy_tb_s']:.2f} TB/s. Greedy; ms per token = a call's time / new "
             "tokens (per generated position of the batch). Floor: the decoder's "
             "weights (input embeddings excepted) read once per step.", "",
             "| what | mode | eps | batch | draft | K | acceptance | tokens/step | ms/token "
             "| step / floor | speedup (same mode) | analytic bound | efficiency "
             "| speedup vs eager plain | identical | ms per step: the call's (prompt included) / "
             "verification + K draft steps |", "|" + "---|" * 16]
    for r in rows[1:]:
        if r["kind"].endswith("-shape"):
            lines.append(f"| {r['kind']}: {r['step_gb']:.2f} GB per step, floor "
                         f"{r['floor_ms']:.2f} ms |" + " |" * 15)
            continue
        per_step = ("" if "ms_per_step" not in r else f"{r['ms_per_step']:.2f} / "
                    f"{r['verify_ms'] + r['k'] * r['draft_step_ms']:.2f}")
        lines.append("| " + " | ".join(str(v) if not isinstance(v, float) else f"{v:.2f}" for v in (
            r["kind"], r["mode"], r["eps"], r["batch"], r.get("draft", ""), r.get("k", ""),
            r.get("acceptance", ""), r.get("tokens_per_step", ""), r["ms_per_token"],
            r.get("step_over_floor", ""), r.get("speedup", ""), r.get("bound", ""),
            r.get("efficiency", ""), r["speedup_vs_eager_plain"], r["identical"], per_step))
            + " |")
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    run(main, "eval.bench_adapters_gpu")
