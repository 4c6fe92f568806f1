"""Ask a vision-language model about images, with speculative decoding beside plain decoding.

    python -m recipes.vlm samples/scene.png "what shape is at the top left?" --method exact
    python -m recipes.vlm photo.png "What is in the picture?" --target path/or/id \\
        --draft path/or/id --draft-mode text --method exact

Prints each answer, tokens per step, acceptance and the speedup against plain decoding
measured in the same run. Without --target it uses the bundled shapes-world VLM
(samples/models/shapes-vlm) and its text draft when they are present.
"""

from __future__ import annotations

import argparse

from PIL import Image

from recipes.cli import (COUNT, SEED, TEMPERATURE, Parser, add_common, add_compile, add_models,
                         bundled_head, bundled_pair, check_compile, check_head, check_method,
                         compile_switch, configure, describe, run)


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(description=__doc__.splitlines()[0])
    ap.add_argument("inputs", nargs="+", help="image paths, then the question")
    add_models(ap, "shapes-vlm", flag="--target")
    ap.add_argument("--draft-mode", choices=["text", "image", "ensemble"], default=None,
                    help="how the draft sees the image (default: image for a VLM draft, text "
                         "for a language model)")
    ap.add_argument("--method", default="exact",
                    help="plain, exact, tree, head, lantern, sjd, ...")
    ap.add_argument("--num-draft-tokens", type=COUNT, default=4, help="drafts per step K")
    ap.add_argument("--max-new-tokens", type=COUNT, default=64)
    ap.add_argument("--temperature", type=TEMPERATURE, default=0.0, help="0 is greedy")
    ap.add_argument("--seed", type=SEED, default=0)
    add_compile(ap)
    add_common(ap)
    return describe(ap)


def check_args(args, device: str, target: str, draft, head) -> list:
    """Every check that needs no model, before any loads (``--max-new-tokens`` against the
    target's config); returns the images."""
    from mmspec.registry import parse_method

    check_compile(args, device)
    spec = parse_method(args.method, {"num_draft_tokens": args.num_draft_tokens},
                        has_draft=draft is not None, has_head=head is not None)
    if args.draft_mode == "ensemble" and spec.drafter_class.trees:
        raise ValueError(f"--method {args.method} drafts trees; --draft-mode ensemble drafts "
                         "chains: accepted --draft-mode image or text")
    check_head(head)
    *paths, question = args.inputs
    if not paths:
        raise ValueError("give at least one image path before the question")
    if not question.strip():
        raise ValueError("the question: accepted a non-blank text after the image paths")
    limit = max_positions(target)
    if limit is not None and args.max_new_tokens >= limit:
        raise ValueError(f"--max-new-tokens {args.max_new_tokens}: accepted at most "
                         f"{limit - 1} (the target's max_position_embeddings={limit}, the "
                         "prompt's tokens included)")
    return [Image.open(p).convert("RGB") for p in paths]


def max_positions(path: str) -> int | None:
    """The text model's max_position_embeddings from a config file alone (None: not stated)."""
    from transformers import AutoConfig

    from modalities.registry import load_pretrained

    cfg = load_pretrained(AutoConfig, path)
    cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    return getattr(cfg, "max_position_embeddings", None)


def main(argv=None):
    args = build_parser().parse_args(argv)
    device = configure(args)
    head = bundled_head(args.target, args.head, "shapes-vlm")
    target, draft = bundled_pair(args.target, args.draft, "shapes-vlm", "shapes-vlm-text-draft")
    images = check_args(args, device, target, draft, head)
    from modalities.vlm import VisionLanguageGenerator

    gen = VisionLanguageGenerator.from_pretrained(target, draft=draft, draft_mode=args.draft_mode,
                                                  device=device, head=head)
    check_method(args.method, {"num_draft_tokens": args.num_draft_tokens}, gen.draft is not None,
                 gen.target.get_input_embeddings().weight.detach().float(),
                 has_head=gen.head is not None)
    *paths, question = args.inputs
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]
    prompts = [messages for _ in images]
    kw = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed,
              compile=compile_switch(args))
    plain = gen.generate(images, prompts, method="plain", **kw)
    spec = gen.generate(images, prompts, method=args.method,
                        num_draft_tokens=args.num_draft_tokens, **kw)
    for p, a in zip(paths, spec.texts):
        print(f"{p}: {a.strip()}")
    s = spec.stats
    print(f"method {args.method}: tokens/step {s.tokens_per_step:.2f}, acceptance "
          f"{s.acceptance_rate:.3f}, {plain.seconds:.2f} s plain vs {spec.seconds:.2f} s "
          f"({plain.seconds / spec.seconds:.2f}x); identical to plain: "
          f"{spec.token_ids == plain.token_ids}")
    return dict(plain=plain, spec=spec)


if __name__ == "__main__":
    run(main, "recipes.vlm")
