"""Tokens per target step of a text-to-image target's draft model and draft head, by tree size.

    python -m eval.tree_sizes --device cuda                   # the bundled shapes-world models
    python -m eval.tree_sizes --trees 5x2x4,8x2x8 --captions 16 --ks 4,8

Rows: the draft model with the exact rule at each K (a chain), the draft model's tree and the
head's trees at each size (depth x children per expanded node x nodes expanded per level),
on held-out shapes-world captions at one seed and temperature. Prints JSON lines.
"""

from __future__ import annotations

import json
import os

from recipes.cli import (BUNDLED, COUNT, Number, Numbers, Parser, TreeShape, describe, run,
                         tree_name)


def build_parser():
    ap = Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default=os.path.join(BUNDLED, "shapes-t2i"),
                    help="text-to-image target folder or id")
    ap.add_argument("--draft", default=os.path.join(BUNDLED, "shapes-t2i-draft"),
                    help="its draft model")
    ap.add_argument("--head", default=os.path.join(BUNDLED, "shapes-t2i-head"),
                    help="its draft head")
    ap.add_argument("--trees", type=Numbers(TreeShape()), default="5x2x4,6x3x6,8x2x8,8x4x8,10x4x16",
                    help="tree sizes, comma-separated DEPTHxCHILDRENxWIDTH")
    ap.add_argument("--ks", type=Numbers(COUNT), default="4,8", help="the chains' K")
    ap.add_argument("--captions", type=COUNT, default=16, help="held-out captions")
    ap.add_argument("--temperature", type=Number(float, 0), default=1.0, help="0 is greedy")
    ap.add_argument("--seed", type=Number(int, 0), default=0)
    ap.add_argument("--device", default="cpu", help="cpu, cuda ...")
    return describe(ap)


def main(argv=None) -> None:
    from modalities.image import TextToImage
    from recipes.train.draft_head import shapes_items

    args = build_parser().parse_args(argv)
    trees = [(tree_name(p), p) for p in args.trees]
    pipe = TextToImage.from_pretrained(args.target, draft=args.draft, head=args.head,
                                       device=args.device)
    captions = shapes_items("t2i", args.captions, 20_000_000)
    runs = [(f"exact K={k}", "exact", {"num_draft_tokens": k}) for k in args.ks]
    runs += [(f"draft tree {trees[0][0]}", "tree", trees[0][1])]
    runs += [(f"head tree {name}", "head", p) for name, p in trees]
    for name, method, params in runs:
        out = pipe(captions, method=method, seed=args.seed, temperature=args.temperature,
                   progress=False, decode=False, **params)
        print(json.dumps(dict(name=name, tokens_per_step=out.stats.tokens_per_step,
                              steps=out.stats.steps, seconds=out.seconds)), flush=True)


if __name__ == "__main__":
    run(main, "eval.tree_sizes")
