"""Train the bundled text-to-image models: a Llama over [caption words | image tokens].

    python -m recipes.train.t2i --size target --steps 8000   # ~6M parameters
    python -m recipes.train.t2i --size draft --steps 8000    # ~0.7M parameters

The Emu3 / Lumina-mGPT pattern: ``<bos> caption <boi>`` then 256 VQ tokens (16x16, from
samples/models/shapes-vq), loss on the image tokens; captions are dropped 10% of the time
(``<bos> <boi>``) so classifier-free guidance works. Writes bf16 safetensors, config,
mmspec_image.json (token layout, default guidance) and a model card with the compositional
accuracy of 500 held-out captions under plain sampling.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from modalities import shapes_world as sw
from recipes.train.data import load_in_float32, HELD_OUT, count_params, device, fit, render, to_tensor, write_card

PAD, BOS, BOI = 0, 1, 2
WORDS = (["a", "and", "at", "the"] + list(sw.SIZES) + list(sw.COLOURS) + list(sw.SHAPES)
         + ["top", "bottom", "left", "centre", "right"])
WORD_OFFSET = 3
IMAGE_OFFSET = WORD_OFFSET + len(WORDS)
PREFIX = 32                      # caption tokens incl. <bos> ... <boi>, left-padded
SIZES = {"target": dict(hidden=256, layers=7, heads=8, inter=688),
         "draft": dict(hidden=128, layers=3, heads=4, inter=352)}


def encode_caption(text: str) -> list[int]:
    index = {w: i + WORD_OFFSET for i, w in enumerate(WORDS)}
    return [index[w] for w in text.split()]


def build(size: str, codebook: int) -> LlamaForCausalLM:
    s = SIZES[size]
    cfg = LlamaConfig(vocab_size=IMAGE_OFFSET + codebook, hidden_size=s["hidden"],
                      intermediate_size=s["inter"], num_hidden_layers=s["layers"],
                      num_attention_heads=s["heads"], num_key_value_heads=s["heads"],
                      max_position_embeddings=PREFIX + 256 + 32, pad_token_id=PAD,
                      bos_token_id=BOS, eos_token_id=None, tie_word_embeddings=False)
    return LlamaForCausalLM(cfg)


def prefixes(captions: list[str], drop: np.ndarray) -> np.ndarray:
    out = np.full((len(captions), PREFIX), PAD, dtype=np.int64)
    for i, c in enumerate(captions):
        ids = [BOS] + ([] if drop[i] else encode_caption(c)) + [BOI]
        out[i, PREFIX - len(ids):] = ids
    return out


@torch.no_grad()
def tokenize_images(vq_tok, images: np.ndarray, dev) -> torch.Tensor:
    out = []
    for i in range(0, len(images), 1000):
        out.append(vq_tok.encode(to_tensor(images[i:i + 1000], dev).to(vq_tok.vq.dtype)))
    return torch.cat(out).to(torch.int16)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=list(SIZES), default="target")
    ap.add_argument("--steps", type=int, default=8000)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--data", type=int, default=120000)
    ap.add_argument("--vq", default="samples/models/shapes-vq")
    ap.add_argument("--out", default=None)
    ap.add_argument("--eval", type=int, default=500, help="held-out captions to score")
    ap.add_argument("--guidance", type=float, default=3.0)
    ap.add_argument("--time-budget", type=float, default=None,
                    help="seconds of training: --steps is lowered to fit (timed on 30 steps)")
    args = ap.parse_args(argv)
    out_dir = args.out or f"samples/models/shapes-t2i{'' if args.size == 'target' else '-draft'}"
    from modalities.image import VQTokenizer

    dev = device()
    t0 = time.time()
    torch.manual_seed(0)
    vq = VQTokenizer.from_pretrained(args.vq)
    vq.vq.to(dev)
    images, captions = render(range(args.data))
    codes = tokenize_images(vq, images, dev)                                   # [N, 256]
    del images
    rng = np.random.default_rng(1)
    drop = rng.random(args.data) < 0.1
    pre = torch.from_numpy(prefixes(captions, drop)).to(dev)
    model = build(args.size, vq.codebook_size).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.95))
    g = torch.Generator(device=dev).manual_seed(0)

    def batch():
        idx = torch.randint(args.data, (args.batch,), device=dev, generator=g)
        ids = torch.cat([pre[idx], codes[idx].long() + IMAGE_OFFSET], 1)
        mask = (ids != PAD).long()
        pos = (mask.cumsum(1) - 1).clamp(min=0)
        labels = ids.clone()
        labels[:, :PREFIX] = -100
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            return model(input_ids=ids, attention_mask=mask, position_ids=pos, labels=labels).loss

    model.train()
    if args.time_budget:   # time 30 steps at the peak learning rate's start, then fit the budget
        for pg in opt.param_groups:
            pg["lr"] = args.lr * 0.04
        t_s = time.time()
        for _ in range(30):
            loss = batch()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        per_step = (time.time() - t_s) / 30
        args.steps = max(100, min(args.steps, int(args.time_budget / per_step)))
        print(f"{per_step * 1e3:.1f} ms/step: training {args.steps} steps", flush=True)
    _, loss = fit(model, batch, args.steps, args.lr, desc=f"t2i {args.size}", opt=opt)
    train_seconds = time.time() - t0
    meta = dict(image_token_offset=IMAGE_OFFSET, codebook_size=vq.codebook_size, grid=[16, 16],
                prefix=[BOS], suffix=[BOI], pad_id=PAD, words=WORDS, word_offset=WORD_OFFSET,
                defaults={"guidance_scale": args.guidance})
    from modalities.image.pipeline import TextToImage, save_bundled

    model.to(torch.bfloat16)
    save_bundled(out_dir, model, fmt="token-span", vq_folder=args.vq, meta=meta)
    load_in_float32(out_dir)
    # Quality of the saved weights: plain sampling at the default guidance.
    pipe = TextToImage.from_pretrained(out_dir, torch_dtype=torch.float32)
    pipe.target.model.to(dev)
    pipe.target.vq.vq.to(dev).float()
    _, held_caps = render(range(HELD_OUT, HELD_OUT + args.eval))
    accs = {}
    for gs in sorted({1.0, args.guidance, 2 * args.guidance}):
        imgs = []
        for i in range(0, args.eval, 250):
            imgs += pipe(held_caps[i:i + 250], guidance_scale=gs, seed=i, progress=False).images
        accs[gs] = sw.compositional_accuracy(imgs, held_caps)
    metrics = dict(size=args.size, params=count_params(model), final_loss=float(loss.detach()),
                   steps=args.steps, train_seconds=round(train_seconds, 1),
                   compositional_accuracy={str(k): v for k, v in accs.items()},
                   default_guidance=args.guidance)
    print(json.dumps(metrics))
    with open(os.path.join(out_dir, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=1)
    s = SIZES[args.size]
    write_card(out_dir, f"shapes-t2i{'' if args.size == 'target' else '-draft'}: text-to-image "
               f"{args.size}", {
                   "architecture": f"LlamaForCausalLM, {s['layers']} layers, hidden {s['hidden']}, "
                                   f"{s['heads']} heads; vocabulary = 3 specials + {len(WORDS)} "
                                   f"words + {vq.codebook_size} image tokens",
                   "parameters": f"{metrics['params']:,} (stored in bfloat16)",
                   "sequence": "<bos> caption <boi> + 16x16 tokens of shapes-vq (raster order)",
                   "data": f"{args.data} shapes-world scenes, caption dropout 10%",
                   "steps": f"{args.steps} at batch {args.batch}, AdamW lr {args.lr}",
                   "final loss": f"{metrics['final_loss']:.4f} (image tokens)",
                   "quality": f"compositional accuracy on {args.eval} held-out captions, plain sampling "
                              "(temperature 1): " + ", ".join(
                                  f"guidance {k}: {v:.3f}" for k, v in accs.items()),
                   "default guidance": str(args.guidance),
                   "trained by": f"`python -m recipes.train.t2i --size {args.size} --steps "
                                 f"{args.steps}` ({metrics['train_seconds']} s)",
               })


if __name__ == "__main__":
    main()
