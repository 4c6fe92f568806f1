"""Text-to-image with speculative decoding, side by side with plain decoding.

    python -m recipes.text_to_image "a large red circle at the top left" \\
        --method sjd --window 16 --coupling maximal --seed 0 --out out/t2i
    python -m recipes.text_to_image --prompts-file samples/prompts/shapes.txt --method lantern \\
        --k 100 --delta 0.1
    python -m recipes.text_to_image --model path/or/hf-id --class-labels 207 360 --method sjd

Writes one PNG per image for plain decoding and for the method (same seed), a comparison
grid (comparison.png: plain left, method right, each column under its method's name, one row
per image), and prints NFE, step compression, tokens per step, acceptance and the wall-clock
speedup measured in this run.
Without --model it runs the bundled shapes-world model (samples/models/shapes-t2i).
"""

from __future__ import annotations

import argparse
import os

from PIL import Image

from recipes.cli import (COUNT, Number, Parser, add_common, add_compile, add_method_flags,
                         add_models, add_sampling, bundled_head, bundled_pair, check_compile,
                         check_head, check_method, check_vocab, compile_switch, configure,
                         describe, read_lines, run)

# the method parameters this recipe takes as flags
METHOD_PARAMS = ("window", "coupling", "init", "num_draft_tokens", "k", "delta", "lam",
                 "group_size", "p_threshold", "embed_threshold", "theta", "nu", "mu",
                 "tree_depth", "tree_branch", "tree_width", "tree_nodes", "tree_spines")


def grid(pairs: list[tuple[Image.Image, Image.Image]], scale: int = 4,
         labels: tuple[str, str] = ("plain", "method")) -> Image.Image:
    """Plain decoding's images left, the method's right, one row per image, each column under
    a strip naming it (``labels``)."""
    from recipes.figures import sheet

    w, h = pairs[0][0].size
    return sheet([(labels[0], [a for a, _ in pairs]), (labels[1], [b for _, b in pairs])],
                 (w * scale, h * scale))


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(description=__doc__.splitlines()[0])
    ap.add_argument("prompts", nargs="*", help="prompts (or --prompt, or --prompts-file)")
    ap.add_argument("--prompt", action="append", default=[],
                    help="a prompt (repeatable; default: none)")
    ap.add_argument("--prompts-file", help="one prompt per line (default: none)")
    ap.add_argument("--class-labels", nargs="*", type=Number(int, 0),
                    help="class ids for class-conditional models (default: none)")
    add_models(ap, "shapes-t2i")
    ap.add_argument("--method", default="sjd-maximal",
                    help="plain, exact, tree, head, sjd, sjd-maximal, sjd-gumbel, sjd-continue, "
                         "lantern, gsd, pcg, annealed, lantern++, or <drafter>+<rule>")
    add_method_flags(ap, METHOD_PARAMS)
    add_sampling(ap)
    ap.add_argument("--negative-prompt", default=None, help="(default: the empty prompt)")
    ap.add_argument("--num-images", type=COUNT, default=1, help="images per prompt")
    ap.add_argument("--out", default="out/text_to_image", help="output folder")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_compile(ap)
    add_common(ap)
    return describe(ap)


def parse(argv=None):
    return build_parser().parse_args(argv)


def choose_prompts(args, prompts: list, class_conditional: bool) -> list:
    """Text prompts, or ``--class-labels`` for class-conditional models; the other refused."""
    if class_conditional:
        if prompts:
            raise ValueError("prompts: this model is class-conditional: accepted --class-labels "
                             "(class ids), not text prompts")
        prompts = list(args.class_labels or [])
    elif args.class_labels:
        raise ValueError("--class-labels: accepted by class-conditional models only; this model "
                         "takes text prompts (--prompt, --prompts-file)")
    if not prompts:
        raise ValueError("give prompts (or --prompts-file, or --class-labels for class-conditional "
                         "models)")
    return prompts


def check_args(args, device: str, model: str, draft, head, params: dict):
    """Every check that needs no model, before any loads (sizes, prompts and the draft's
    codebook against the models' config files); returns (prompts, the target's layout or
    None where only loading it tells)."""
    from mmspec.registry import parse_method
    from modalities.image.pipeline import check_draft_sizes, read_layout

    check_compile(args, device)
    parse_method(args.method, params, has_draft=draft is not None, has_head=head is not None)
    check_head(head)
    prompts = list(args.prompts) + list(args.prompt)
    if args.prompts_file:
        prompts += read_lines(args.prompts_file, "--prompts-file")
    layout = read_layout(model)
    if layout is None:
        return prompts, None
    other = read_layout(draft) if draft is not None else None
    if other is not None and (other.vocab_size, other.num_tokens) != (layout.vocab_size,
                                                                        layout.num_tokens):
        raise ValueError(f"--draft {draft}: {other.vocab_size} codebook ids and {other.num_tokens}"
                         f" tokens an image, the target {layout.vocab_size} and "
                         f"{layout.num_tokens}: accepted a draft with the target's codebook")
    check_vocab(dict(params, top_k=args.top_k), layout.vocab_size)
    check_draft_sizes(params, layout.num_tokens)
    prompts = choose_prompts(args, prompts, layout.class_conditional)
    layout.check_prompts(prompts + ([args.negative_prompt] if args.negative_prompt else []))
    return prompts, layout


def main(argv=None) -> dict:
    args = parse(argv)
    device = configure(args)
    head = bundled_head(args.model, args.head, "shapes-t2i")
    model, draft = bundled_pair(args.model, args.draft, "shapes-t2i", "shapes-t2i-draft")
    params = {k: getattr(args, k) for k in METHOD_PARAMS if getattr(args, k) is not None}
    prompts, layout = check_args(args, device, model, draft, head, params)
    from modalities.image import TextToImage

    pipe = TextToImage.from_pretrained(model, draft=draft, device=device, head=head)
    check_method(args.method, params, pipe.draft is not None, pipe.target.codebook_embeddings(),
                 has_head=pipe.head is not None)
    if layout is None:
        prompts = choose_prompts(args, prompts, pipe.target.class_conditional)
    common = dict(num_images_per_prompt=args.num_images, guidance_scale=args.guidance,
                  temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                  seed=args.seed, progress=not args.no_progress, compile=compile_switch(args))
    if args.negative_prompt:
        common["negative_prompt"] = args.negative_prompt
    plain = pipe(prompts, method="plain", **common)
    spec = pipe(prompts, method=args.method, **common, **params)
    os.makedirs(args.out, exist_ok=True)
    safe = args.method.replace("+", "_")
    for i, (a, b) in enumerate(zip(plain.images, spec.images)):
        a.save(os.path.join(args.out, f"plain_{i:03d}.png"))
        b.save(os.path.join(args.out, f"{safe}_{i:03d}.png"))
    grid(list(zip(plain.images, spec.images)), labels=("plain", args.method)).save(
        os.path.join(args.out, "comparison.png"))
    n = pipe.target.num_tokens
    rows = []
    for name, o in (("plain", plain), (args.method, spec)):
        s = o.stats
        rows.append(dict(method=name, nfe=s.steps, compression=n / max(s.steps, 1),
                         tokens_per_step=s.tokens_per_step, acceptance=s.acceptance_rate,
                         seconds=o.seconds))
    print(f"{len(plain.images)} images of {n} tokens; seed {args.seed}; outputs in {args.out}")
    print(f"{'method':22} {'NFE':>5} {'compression':>11} {'tokens/step':>11} {'acceptance':>10} "
          f"{'seconds':>8} {'speedup':>7}")
    for r in rows:
        print(f"{r['method']:22} {r['nfe']:>5} {r['compression']:>10.2f}x {r['tokens_per_step']:>11.2f} "
              f"{r['acceptance']:>10.3f} {r['seconds']:>8.2f} {rows[0]['seconds'] / r['seconds']:>6.2f}x")
    same = bool((plain.tokens == spec.tokens).all())
    print(f"tokens identical to plain decoding: {same}")
    return dict(rows=rows, identical=same, tokens=spec.tokens.tolist())


if __name__ == "__main__":
    run(main, "recipes.text_to_image")
