"""Train the bundled vision-language models on shapes-world questions.

    python -m recipes.train.vlm --which target --time-budget 300   # LLaVA, ~6M parameters
    python -m recipes.train.vlm --which text-draft                  # Llama, text only, ~0.6M
    python -m recipes.train.vlm --which vlm-draft                   # small LLaVA, ~1M
    python -m recipes.train.vlm --arch qwen2-vl --which target      # Qwen2-VL, ~6M
    python -m recipes.train.vlm --arch qwen2-vl --which vlm-draft   # small Qwen2-VL, ~1M

LlavaForConditionalGeneration with a CLIP vision tower (64x64 images, 8x8 patches, 64 image
tokens) and a Llama language model, trained on shapes-world images with questions (colour,
shape, size, count, position, yes/no, "describe the image") and their answers; a word-level
tokenizer and CLIP image processor saved with a chat template, so the folder loads through
AutoProcessor / AutoModelForImageTextToText. The text-only draft sees the same conversations
with the image placeholder removed (Gagrani et al.). Writes safetensors, processor files and a
model card with the answer accuracy on 500 held-out questions under greedy decoding.
``--arch qwen2-vl``: the same sizes as Qwen2VLForConditionalGeneration (a Qwen2-VL vision
tower: 8x8 patches merged 2x2, 16 image tokens with 3-D rotary positions; the word-level
tokenizer with Qwen's vision tokens; Qwen2VLProcessor).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time

import torch

from modalities import shapes_world as sw
from recipes.train.data import load_in_float32, HELD_OUT, count_params, device, fit, write_card

WORDS = (["<pad>", "<s>", "</s>", "<unk>", "<image>", "USER:", "ASSISTANT:", "?", ".", "1", "2", "3"]
         + sorted({"a", "and", "are", "at", "colour", "describe", "how", "image", "is", "many",
                   "no", "object", "objects", "shape", "size", "the", "there", "what", "where",
                   "yes"} | set(sw.SHAPES) | set(sw.COLOURS) | set(sw.SIZES)
                  | {"top", "bottom", "left", "centre", "right"}))
CHAT = ("{% for m in messages %}{% if m['role'] == 'user' %}USER: {% for c in m['content'] %}"
        "{% if c['type'] == 'image' %}<image> {% else %}{{ c['text'] }} {% endif %}{% endfor %}"
        "{% endif %}{% endfor %}{% if add_generation_prompt %}ASSISTANT:{% endif %}")
SIZES = {"target": dict(hidden=256, layers=6, heads=8, inter=688, vision=128, vlayers=4),
         "vlm-draft": dict(hidden=96, layers=2, heads=4, inter=256, vision=64, vlayers=2),
         "text-draft": dict(hidden=128, layers=2, heads=4, inter=352)}


def tokenizer(words=WORDS, chat_template: str | None = CHAT):
    """A word-level fast tokenizer over ``words`` (left padding, ``<image>`` special). Text
    is lower-cased and punctuation split off its word ("What is shown?" -> what is shown ?);
    the chat roles are matched before that."""
    from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                 pre_tokenizers.Punctuation("isolated")])
    tok.add_tokens([AddedToken(w, normalized=False) for w in words if w.endswith(":")])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>",
                                   eos_token="</s>", unk_token="<unk>",
                                   additional_special_tokens=["<image>"])
    fast.padding_side = "left"
    fast.chat_template = chat_template
    return fast


QWEN_SPECIAL = ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>")
QWEN_TEMPLATE = ("{% for m in messages %}{% if m['role'] == 'user' %}USER: "
                 "{% for c in m['content'] %}{% if c['type'] == 'image' %}"
                 "<|vision_start|><|image_pad|><|vision_end|> "
                 "{% elif c['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|> "
                 "{% else %}{{ c['text'] }} {% endif %}{% endfor %}{% endif %}{% endfor %}"
                 "{% if add_generation_prompt %}ASSISTANT:{% endif %}")


def special_tokenizer(words, special, **tokens):
    """A word-level fast tokenizer over ``words`` whose ``special`` tokens (image
    placeholders, which ``words`` must contain) are matched whole; lower-cased, punctuation
    split off, left padding. ``tokens``: more named tokens (``sep_token``,
    ``extra_special_tokens``) for the processors that read them."""
    from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                 pre_tokenizers.Punctuation("isolated")])
    tok.add_special_tokens([AddedToken(w, normalized=False, special=True) for w in special])
    tok.add_tokens([AddedToken(w, normalized=False) for w in words if w.endswith(":")])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>",
                                   eos_token="</s>", unk_token="<unk>", **tokens)
    fast.padding_side = "left"
    return fast


def qwen_tokenizer(words):
    """``special_tokenizer`` with Qwen-VL's vision tokens (``QWEN_SPECIAL``)."""
    return special_tokenizer(words, QWEN_SPECIAL)


def qwen_processor(words, kind: str = "qwen2-vl", patch: int = 4, max_pixels: int = 64 * 64):
    """A Qwen-VL processor (image and video processors, chat template) over ``words``."""
    import transformers

    size = dict(shortest_edge=16 * 16, longest_edge=max_pixels)
    ip = transformers.Qwen2VLImageProcessor(patch_size=patch, merge_size=2, temporal_patch_size=2,
                                            min_pixels=16 * 16, max_pixels=max_pixels, size=size)
    qwen3 = kind in ("qwen3-vl", "qwen3.5")
    vp = (transformers.Qwen3VLVideoProcessor if qwen3 else transformers.Qwen2VLVideoProcessor)(
        patch_size=patch, merge_size=2, temporal_patch_size=2, size=size)
    cls = {"qwen2-vl": "Qwen2VLProcessor", "qwen2.5-vl": "Qwen2_5_VLProcessor"}.get(
        kind, "Qwen3VLProcessor")
    return getattr(transformers, cls)(image_processor=ip, tokenizer=qwen_tokenizer(words),
                                      video_processor=vp, chat_template=QWEN_TEMPLATE)


def processor():
    from transformers import CLIPImageProcessor, LlavaProcessor

    ip = CLIPImageProcessor(size={"shortest_edge": 64}, crop_size={"height": 64, "width": 64},
                            do_center_crop=True, image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
    return LlavaProcessor(image_processor=ip, tokenizer=tokenizer(), patch_size=8,
                          vision_feature_select_strategy="default", chat_template=CHAT,
                          num_additional_image_tokens=1)


QWEN_WORDS = (["<pad>", "<s>", "</s>", "<unk>", *QWEN_SPECIAL, "USER:", "ASSISTANT:"]
              + [w for w in WORDS if w not in ("<pad>", "<s>", "</s>", "<unk>", "<image>", "USER:",
                                               "ASSISTANT:")])
OUT = {("llava", "target"): "shapes-vlm", ("llava", "vlm-draft"): "shapes-vlm-draft",
       ("llava", "text-draft"): "shapes-vlm-text-draft",
       ("qwen2-vl", "target"): "shapes-qwen-vl", ("qwen2-vl", "vlm-draft"): "shapes-qwen-vl-draft"}


def build_qwen(which: str):
    """A Qwen2VLForConditionalGeneration of ``SIZES[which]`` (64x64 images, 8x8 patches
    merged 2x2: 16 image tokens)."""
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    s = SIZES[which]
    ids = {f"{k}_token_id": QWEN_WORDS.index(f"<|{t}|>") for k, t in (
        ("image", "image_pad"), ("video", "video_pad"), ("vision_start", "vision_start"),
        ("vision_end", "vision_end"))}
    half = s["hidden"] // s["heads"] // 2
    section = [half - 2 * (half * 3 // 8), half * 3 // 8, half * 3 // 8]    # t, h, w
    cfg = Qwen2VLConfig(
        text_config=dict(vocab_size=len(QWEN_WORDS), hidden_size=s["hidden"],
                         intermediate_size=s["inter"], num_hidden_layers=s["layers"],
                         num_attention_heads=s["heads"], num_key_value_heads=s["heads"],
                         max_position_embeddings=160, pad_token_id=0, bos_token_id=1,
                         eos_token_id=2, tie_word_embeddings=True,
                         rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                                              mrope_section=section)),
        vision_config=dict(depth=s["vlayers"], embed_dim=s["vision"], hidden_size=s["hidden"],
                           num_heads=4, patch_size=8, spatial_merge_size=2,
                           temporal_patch_size=2),
        tie_word_embeddings=True, **ids)
    return Qwen2VLForConditionalGeneration(cfg)


def spaced(text: str) -> str:
    return text.replace("?", " ?").replace(".", " .").strip()


def build(which: str):
    s = SIZES[which]
    text = dict(model_type="llama", vocab_size=len(WORDS), hidden_size=s["hidden"],
                intermediate_size=s["inter"], num_hidden_layers=s["layers"],
                num_attention_heads=s["heads"], num_key_value_heads=s["heads"],
                max_position_embeddings=160, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                tie_word_embeddings=True)
    if which == "text-draft":
        from transformers import LlamaConfig, LlamaForCausalLM

        return LlamaForCausalLM(LlamaConfig(**{k: v for k, v in text.items() if k != "model_type"}))
    from transformers import LlavaConfig, LlavaForConditionalGeneration

    cfg = LlavaConfig(vision_config=dict(model_type="clip_vision_model", hidden_size=s["vision"],
                                         intermediate_size=2 * s["vision"],
                                         num_hidden_layers=s["vlayers"], num_attention_heads=4,
                                         image_size=64, patch_size=8, projection_dim=s["vision"]),
                      text_config=text, image_token_index=WORDS.index("<image>"),
                      vision_feature_select_strategy="default", vision_feature_layer=-1)
    return LlavaForConditionalGeneration(cfg)


def examples(seeds, rng, all_questions: bool = False):
    """(image, question, answer) triples (images rendered in parallel); with
    ``all_questions`` the third item is the scene's whole list of (question, answer) pairs."""
    from PIL import Image

    from recipes.train.data import render

    seeds = list(seeds)
    imgs, _ = render(seeds)
    out = []
    for s, arr in zip(seeds, imgs):
        scene = sw.sample_scene(random.Random(s))
        qa = [(spaced(q), spaced(a)) for q, a in sw.questions(scene, random.Random(s))]
        if all_questions:
            out.append((Image.fromarray(arr), None, qa))
        else:
            q, a = qa[rng.randrange(len(qa))]
            out.append((Image.fromarray(arr), q, a))
    return out


def encode_batch(proc, batch, with_image: bool, dev, arch: str = "llava"):
    """Left-padded prompt + answer + </s>; labels only on the answer."""
    tok = proc.tokenizer
    image = "<image> " if arch == "llava" else "<|vision_start|><|image_pad|><|vision_end|> "
    prompts = [f"USER: {image if with_image else ''}{q} ASSISTANT:" for _, q, _ in batch]
    enc = proc(images=[b[0] for b in batch], text=prompts, return_tensors="pt", padding=True) \
        if with_image else tok(prompts, return_tensors="pt", padding=True)
    ans = [tok(a + " </s>", add_special_tokens=False)["input_ids"] for _, _, a in batch]
    from modalities.padding import pad_rows

    a_ids, a_mask = pad_rows(ans, 0, "right")
    ids = torch.cat([enc["input_ids"], a_ids], 1)
    mask = torch.cat([enc["attention_mask"], a_mask], 1)
    labels = torch.cat([torch.full_like(enc["input_ids"], -100), torch.where(a_mask == 1, a_ids, -100)], 1)
    out = dict(input_ids=ids.to(dev), attention_mask=mask.to(dev), labels=labels.to(dev))
    if arch == "llava":
        out["position_ids"] = (mask.cumsum(1) - 1).clamp(min=0).to(dev)
    else:       # the model's own 3-D positions, from the token types and image grids
        types = torch.cat([enc["mm_token_type_ids"], torch.zeros_like(a_ids)], 1)
        out.update(mm_token_type_ids=types.to(dev), image_grid_thw=enc["image_grid_thw"].to(dev))
    if with_image:
        out["pixel_values"] = enc["pixel_values"].to(dev)
    return out


@torch.no_grad()
def accuracy(model, proc, which: str, n: int, dev) -> float:
    from modalities.vlm import VisionLanguageGenerator

    rng = random.Random(7)
    held = examples(range(HELD_OUT, HELD_OUT + n), rng)
    right = 0
    if which == "text-draft":
        tok = proc.tokenizer
        for i in range(0, n, 100):
            chunk = held[i:i + 100]
            prompts = [f"USER: {q} ASSISTANT:" for _, q, _ in chunk]
            enc = tok(prompts, return_tensors="pt", padding=True).to(dev)
            import mmspec

            out = mmspec.generate(model, None, enc["input_ids"], attention_mask=enc["attention_mask"],
                                  temperature=0, max_new_tokens=40)
            for j, (_, _, a) in enumerate(chunk):
                got = tok.decode(out.generated(j).tolist(), skip_special_tokens=True).strip()
                right += got == a
        return right / n
    gen = VisionLanguageGenerator(model, proc)
    for i in range(0, n, 100):
        chunk = held[i:i + 100]
        msgs = [[{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": q}]}]
                for _, q, _ in chunk]
        out = gen.generate([c[0] for c in chunk], msgs, method="plain", temperature=0,
                           max_new_tokens=40)
        right += sum(t.strip() == a for t, (_, _, a) in zip(out.texts, chunk))
    return right / n


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--which", choices=list(SIZES), default="target")
    ap.add_argument("--arch", choices=["llava", "qwen2-vl"], default="llava",
                    help="LlavaForConditionalGeneration or Qwen2VLForConditionalGeneration")
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--time-budget", type=float, default=1e9,
                    help="seconds: training stops early past it (the card gives the steps run)")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--data", type=int, default=60000)
    ap.add_argument("--eval", type=int, default=500)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if (args.arch, args.which) not in OUT:
        raise SystemExit(f"--arch {args.arch} --which {args.which}: accepted "
                         f"{', '.join(f'{a}/{w}' for a, w in OUT)}")
    out_dir = args.out or os.path.join("samples", "models", OUT[args.arch, args.which])
    dev = device()
    torch.manual_seed(0)
    t0 = time.time()
    qwen = args.arch == "qwen2-vl"
    proc = qwen_processor(QWEN_WORDS, "qwen2-vl", patch=8, max_pixels=64 * 64) if qwen else \
        processor()
    model = (build_qwen if qwen else build)(args.which).to(dev)
    with_image = args.which != "text-draft"
    rng = random.Random(0)
    data = examples(range(args.data), rng, all_questions=True)   # a fresh question per visit
    def step_loss():
        batch = []
        for _ in range(args.batch):
            img, _, qa = data[rng.randrange(len(data))]
            q, a = qa[rng.randrange(len(qa))]
            batch.append((img, q, a))
        inputs = encode_batch(proc, batch, with_image, dev, args.arch)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            return model(**inputs).loss

    steps, loss = fit(model, step_loss, args.steps, args.lr, args.time_budget, f"vlm {args.which}")
    train_s = time.time() - t0
    acc = accuracy(model, proc, args.which, args.eval, dev)
    model.to(torch.bfloat16).save_pretrained(out_dir, safe_serialization=True)
    load_in_float32(out_dir)
    proc.save_pretrained(out_dir)
    metrics = dict(which=args.which, params=count_params(model), steps=steps,
                   final_loss=float(loss.detach()), answer_accuracy=acc, train_seconds=round(train_s, 1))
    print(json.dumps(metrics), flush=True)
    with open(os.path.join(out_dir, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=1)
    s = SIZES[args.which]
    arch = ("LlamaForCausalLM (text only: never sees the image)" if args.which == "text-draft" else
            f"Qwen2VLForConditionalGeneration: Qwen2-VL vision tower ({s['vlayers']} layers, "
            f"width {s['vision']}, 64x64 images, 8x8 patches merged 2x2 -> 16 image tokens, "
            "3-D rotary positions) + Qwen2" if qwen else
            f"LlavaForConditionalGeneration: CLIP vision tower ({s['vlayers']} layers, width "
            f"{s['vision']}, 64x64 images, 8x8 patches -> 64 image tokens) + Llama")
    template = ("USER: <|vision_start|><|image_pad|><|vision_end|> question ASSISTANT:" if qwen
                else "USER: <image> question ASSISTANT:")
    write_card(out_dir, f"{os.path.basename(out_dir)}: vision-language {args.which}", {
        "architecture": f"{arch}; language model {s['layers']} layers, hidden {s['hidden']}; "
                        f"word-level tokenizer of {len(QWEN_WORDS if qwen else WORDS)} words, "
                        f"chat template '{template}'",
        "parameters": f"{metrics['params']:,} (stored in bfloat16)",
        "data": f"{args.data} shapes-world images, a random one of each scene's questions per "
                "visit (colour, shape, size, count, position, yes/no, describe)",
        "steps": f"{steps} at batch {args.batch}, AdamW lr {args.lr}",
        "final loss": f"{metrics['final_loss']:.4f} (answer tokens)",
        "quality": f"answer accuracy {acc:.3f} on {args.eval} held-out questions, greedy decoding "
                   "(exact string match)",
        "trained by": f"`python -m recipes.train.vlm --arch {args.arch} --which {args.which} "
                      f"--steps {steps}` "
                      f"({metrics['train_seconds']} s)",
    })


if __name__ == "__main__":
    main()
