"""The text-pair demo (``python -m recipes.demo --text``; the first ``make demo``).

It builds a small text pair
(a 4-layer target and a 1-layer draft trained for seconds on a caption language, see
recipes/text_pair.py) and compares plain decoding with exact speculative decoding on it:
tokens per step, acceptance, wall-clock ratio against plain decoding, and whether the greedy
outputs are token-identical.
"""

from __future__ import annotations

import argparse
import time

import torch

import mmspec
from recipes.text_pair import build_text_pair, prompts  # noqa: F401


def timed(fn, repeats: int = 3):
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return out, best


def text_table(batch: int = 4, max_new_tokens: int = 48, seed: int = 0, progress: bool = True):
    torch.set_num_threads(max(1, torch.get_num_threads()))
    target, draft, tok, info = build_text_pair(seed=seed, progress=progress)
    ids, mask = prompts(tok, batch)
    common = dict(attention_mask=mask, max_new_tokens=max_new_tokens, stop_token_ids=[])
    rows = []
    for temp in (0.0, 1.0):
        plain, t_plain = timed(lambda: mmspec.generate(target, None, ids, temperature=temp,
                                                       seed=seed, **common))
        rows.append(dict(method="plain", temperature=temp, k="-", stats=plain.stats,
                         ratio=1.0, match="-"))
        for k in (2, 4, 6):
            out, t = timed(lambda: mmspec.generate(target, draft, ids, temperature=temp,
                                                   num_draft_tokens=k, seed=seed, **common))
            match = ("yes" if torch.equal(out.sequences, plain.sequences) else "NO") if temp == 0 \
                else "n/a (sampled)"
            rows.append(dict(method="exact", temperature=temp, k=k, stats=out.stats,
                             ratio=t_plain / t, match=match))
    example = tok.decode(plain.generated(0).tolist())
    return rows, info, tok.decode(ids[0][mask[0].bool()].tolist()), example


def print_table(rows) -> None:
    head = f"{'method':8} {'temp':>4} {'K':>2} {'steps':>5} {'tokens/step':>11} " \
           f"{'acceptance':>10} {'speedup':>7}  greedy match"
    print(head)
    print("-" * len(head))
    for r in rows:
        s = r["stats"]
        print(f"{r['method']:8} {r['temperature']:>4.1f} {str(r['k']):>2} {s.steps:>5} "
              f"{s.tokens_per_step:>11.2f} {s.acceptance_rate:>10.2f} {r['ratio']:>6.2f}x  "
              f"{r['match']}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    print("mmspec demo: exact speculative decoding on a text pair trained here (CPU)")
    rows, info, prompt, example = text_table(args.batch, args.max_new_tokens, args.seed)
    print(f"target {info['target_params'] / 1e6:.2f}M params (loss {info['target_loss']:.2f}), "
          f"draft {info['draft_params'] / 1e6:.3f}M params (loss {info['draft_loss']:.2f}); "
          f"batch {args.batch}, {args.max_new_tokens} new tokens, best of 3 runs")
    print(f"prompt: {prompt!r} -> greedy: {example!r}\n")
    print_table(rows)
    print("\nspeedup = plain wall-clock / method wall-clock, same batch, same run; exact "
          "sampling is lossless\n(distribution tests in tests/engine/test_generate.py), greedy is "
          "token-identical.")


if __name__ == "__main__":
    main()
