"""The main job of ``make demo``: speculative decoding on the bundled shapes-world models (CPU).

Text-to-image with the bundled target (samples/models/shapes-t2i, 5.8M parameters) and its
draft (0.74M): plain decoding, exact speculative decoding with the draft, SJD, coupled SJD
(maximal and Gumbel), LANTERN and GSD at their defaults, on a fixed set of held-out captions
(samples/prompts/shapes_eval.txt) with one seed. Prints a table (method, NFE, step
compression, tokens per step, acceptance, wall-clock ratio against plain decoding measured
in this run, compositional accuracy by the shapes-world parser with its 95% interval) and writes
out/demo/comparison.png (images side by side at the same seed) and out/demo/quality_vs_speedup.png.

Then vision-language answers (samples/models/shapes-vlm with its text-only, image and
ensemble drafts, and the Qwen2-VL-architecture pair samples/models/shapes-qwen-vl with its
draft; quality: answer accuracy) and text-to-speech (samples/models/shapes-tts and
its draft; quality: mel cepstral distortion against espeak-ng), with the same columns, WAV
files and a spectrogram comparison under out/demo/; then continuous-token text-to-image
(samples/models/shapes-continuous and its draft: plain decoding and exact continuous
speculative decoding, compositional accuracy) with out/demo/continuous.png.

Quality columns carry 95% intervals (Wilson for accuracies over the 8 captions or 24
questions, a bootstrap of the mean for the MCD over 2 sentences x 4 seeds): on so few items a
lossless method can differ from plain decoding by chance, and overlapping intervals say so.
``--threads N`` (``make demo THREADS=N``) sets torch's CPU threads; torch's default, one per
core (or ``OMP_NUM_THREADS``), oversubscribes a machine busy with other work.

``python -m recipes.demo --text`` runs the earlier text-pair demo instead.
"""

from __future__ import annotations

import argparse
import math
import os
import time

import numpy as np
import torch

from recipes.cli import COUNT, SEED, Number, Parser, describe, run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
METHODS = ("plain", "exact", "sjd", "sjd-maximal", "sjd-gumbel", "lantern", "gsd")
# Trees and draft heads: (row, method, parameters); the head is samples/models/*-head.
CHAIN = dict(tree_depth=4, tree_branch=1, tree_width=1)
TREE = dict(tree_depth=5, tree_branch=2, tree_width=4)
TREE_ROWS = (("tree (draft)", "tree", TREE), ("head chain", "head", CHAIN),
             ("head tree", "head", TREE), ("head tree+lantern", "head+lantern", TREE))
REPEATS = 2        # timed runs per method, after a warm-up call of each pipeline
SPEECH_SEEDS = 4   # seeds per sentence for the speech quality column (the first one timed)


def timed(call, repeats: int = REPEATS):
    """``call()`` ``repeats`` times: (the first run's output, seconds of each run)."""
    out, secs = None, []
    for i in range(repeats):
        t0 = time.perf_counter()
        res = call()
        secs.append(time.perf_counter() - t0)
        out = res if i == 0 else out
    return out, secs


def speedups(rows) -> None:
    """Each row's wall-clock speedup over the first (plain) row: the ratio of median seconds,
    and its spread over the runs (slowest plain / fastest method .. the reverse)."""
    base = rows[0]["seconds"]
    for r in rows:
        r["speedup"] = float(np.median(base)) / float(np.median(r["seconds"]))
        r["spread"] = (min(base) / max(r["seconds"]), max(base) / min(r["seconds"]))


def _speed(r) -> str:
    return f"{r['speedup']:.2f}x ({r['spread'][0]:.2f}-{r['spread'][1]:.2f})"


def wilson(hits: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of the proportion ``hits / n`` (an accuracy column)."""
    p, zz = hits / n, z * z
    centre = (p + zz / (2 * n)) / (1 + zz / n)
    half = z * math.sqrt(p * (1 - p) / n + zz / (4 * n * n)) / (1 + zz / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def bootstrap_mean(values, draws: int = 4000, seed: int = 0) -> tuple[float, float]:
    """95% percentile bootstrap interval of the mean of ``values`` (the MCD column)."""
    v = np.asarray(values, float)
    means = v[np.random.default_rng(seed).integers(0, len(v), (draws, len(v)))].mean(1)
    return float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def _quality(r, digits: int = 3) -> str:
    """The quality figure and its 95% interval (two decimals)."""
    lo, hi = r["quality_ci"]
    return f"{r['quality']:.{digits}f} ({lo:.2f}-{hi:.2f})"


def image_demo(n_prompts: int = 8, seed: int = 0, out_dir: str = "out/demo", progress=True):
    from modalities import shapes_world as sw
    from modalities.image import TextToImage

    models = os.path.join(ROOT, "samples", "models")
    pipe = TextToImage.from_pretrained(os.path.join(models, "shapes-t2i"),
                                       draft=os.path.join(models, "shapes-t2i-draft"),
                                       head=os.path.join(models, "shapes-t2i-head"))
    with open(os.path.join(ROOT, "samples", "prompts", "shapes_eval.txt")) as f:
        prompts = [line.strip() for line in f if line.strip()][:n_prompts]
    rows, images = [], {}
    pipe(prompts, method="plain", seed=seed, progress=False, decode=False)  # warm-up, full batch
    runs = [(m, m, {}) for m in METHODS] + list(TREE_ROWS)
    for name, method, params in runs:
        out, dt = timed(lambda: pipe(prompts, method=method, seed=seed, progress=progress,
                                     **params))
        images[name] = out.images
        hits = sum(sw.matches(im, p) for im, p in zip(out.images, prompts))
        rows.append(dict(method=name, nfe=out.stats.steps,
                         compression=pipe.target.num_tokens / out.stats.steps,
                         tokens_per_step=out.stats.tokens_per_step,
                         acceptance=out.stats.acceptance_rate, seconds=dt,
                         quality=hits / len(prompts), quality_ci=wilson(hits, len(prompts))))
    speedups(rows)
    os.makedirs(out_dir, exist_ok=True)
    _comparison(images, prompts, os.path.join(out_dir, "comparison.png"))
    _plot(rows, os.path.join(out_dir, "quality_vs_speedup.png"))
    return rows, prompts, pipe


def _comparison(images: dict, prompts, path, show: int = 4, scale: int = 2):
    """The first ``show`` captions' images, one labelled column per method."""
    from recipes.figures import sheet

    sheet(images, 64 * scale, rows=min(show, len(prompts))).save(path)


def _plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(9, 3.6))
    for r in rows:
        lo, hi = r["quality_ci"]
        for a, x in ((ax[0], r["compression"]), (ax[1], r["speedup"])):
            a.errorbar(x, r["quality"], yerr=[[r["quality"] - lo], [hi - r["quality"]]], fmt="o",
                       ms=5, capsize=3, alpha=0.8)
            a.annotate(r["method"], (x, r["quality"]), fontsize=8)
    ax[0].set_xlabel("step compression (tokens per target forward)")
    ax[1].set_xlabel("wall-clock speedup on this CPU")
    for a in ax:
        a.set_ylabel("compositional accuracy (95% interval)")
        a.grid(alpha=0.3)
    fig.suptitle("shapes-world text-to-image: quality versus speed (bundled models, CPU)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def print_image_table(rows, n_prompts):
    w = max(13, *(len(r["method"]) for r in rows))
    print(f"{'method':{w}} {'NFE':>4} {'compression':>11} {'tokens/step':>11} {'acceptance':>10} "
          f"{'wall-clock':>18} {'accuracy':>16}")
    print("-" * (76 + w))
    for r in rows:
        print(f"{r['method']:{w}} {r['nfe']:>4} {r['compression']:>10.2f}x "
              f"{r['tokens_per_step']:>11.2f} {r['acceptance']:>10.3f} {_speed(r):>18} "
              f"{_quality(r, 2):>16}")
    print(f"\nNFE: target forwards for the batch of {n_prompts} images (the slowest row); "
          "compression = 256 tokens / NFE;\ntokens/step per row; wall-clock = plain seconds / "
          f"method seconds, median of {REPEATS} warm runs (range), {torch.get_num_threads()} CPU "
          "threads (a CPU is compute-bound: a\nwindow of 16 tokens costs "
          "~16 single-token forwards here, so step compression does not become speed\nas it does "
          "on a GPU); accuracy = fraction of images whose parse matches the caption, with its 95%\n"
          f"interval over the {n_prompts} captions (Wilson): methods whose intervals overlap "
          "plain decoding's\ndo not differ measurably here.")
    plain = rows[0]["seconds"]
    print(f"plain decoding took {min(plain):.2f}-{max(plain):.2f} s for the {n_prompts} images "
          f"on {torch.get_num_threads()} threads")


VLM_SETUPS = {   # family -> (target, [(row, draft, draft mode, method)])
    "llava": ("shapes-vlm", [("plain", "shapes-vlm-text-draft", "text", "plain"),
                             ("exact, text-only draft", "shapes-vlm-text-draft", "text", "exact"),
                             ("exact, VLM draft", "shapes-vlm-draft", "image", "exact"),
                             ("exact, ensemble draft", "shapes-vlm-draft", "ensemble", "exact"),
                             ("sjd", "shapes-vlm-text-draft", "text", "sjd"),
                             ("tree, VLM draft", "shapes-vlm-draft", "image", "tree"),
                             ("head chain", "shapes-vlm-draft", "image", "head"),
                             ("head tree", "shapes-vlm-draft", "image", "head")]),
    "qwen2-vl": ("shapes-qwen-vl", [("plain", "shapes-qwen-vl-draft", "image", "plain"),
                                    ("exact, VLM draft", "shapes-qwen-vl-draft", "image", "exact"),
                                    ("sjd", "shapes-qwen-vl-draft", "image", "sjd")]),
}


def vlm_questions(n: int = 24):
    """(image, chat messages, answer) for n held-out shapes-world questions, every other one
    "describe the image." (the draft-head recipe's `shapes` items)."""
    from recipes.train.draft_head import shapes_question

    return [shapes_question(s) for s in range(20_000_000, 20_000_000 + n)]


def vlm_demo(n: int = 24, seed: int = 0, family: str = "llava"):
    """Rows of the bundled VLM pair of ``family`` (LLaVA or Qwen2-VL) on n questions."""
    from modalities.vlm import VisionLanguageGenerator

    models = os.path.join(ROOT, "samples", "models")
    qs = vlm_questions(n)
    images, msgs = [q[0] for q in qs], [q[1] for q in qs]
    target, setups = VLM_SETUPS[family]
    rows = []
    head = os.path.join(models, f"{target}-head")
    for name, draft, mode, method in setups:
        gen = VisionLanguageGenerator.from_pretrained(
            os.path.join(models, target), draft=os.path.join(models, draft), draft_mode=mode,
            head=head if os.path.isdir(head) else None)
        params = {"tree": TREE, "head tree": TREE, "head chain": CHAIN}.get(
            method if method == "tree" else name, {})
        gen.generate(images[:1], msgs[:1], method=method, temperature=0, max_new_tokens=4,
                     **params)  # warm
        out, secs = timed(lambda: gen.generate(images, msgs, method=method, temperature=0,
                                               max_new_tokens=32, seed=seed, **params))
        hits = sum(t.strip() == a for t, (_, _, a) in zip(out.texts, qs))
        rows.append(dict(method=name, nfe=out.stats.steps, tokens_per_step=out.stats.tokens_per_step,
                         acceptance=out.stats.acceptance_rate, seconds=secs, quality=hits / n,
                         quality_ci=wilson(hits, n)))
    speedups(rows)
    return rows, qs[0]


def tts_demo(out_dir: str, seed: int = 0):
    import numpy as np

    from modalities.speech.metrics import mel_cepstral_distortion
    from modalities.speech import TextToSpeech
    from recipes.train.speech_data import reference
    from recipes.tts import comparison

    models = os.path.join(ROOT, "samples", "models")
    head = os.path.join(models, "shapes-tts-head")
    tts = TextToSpeech.from_pretrained(os.path.join(models, "shapes-tts"),
                                       draft=os.path.join(models, "shapes-tts-draft"),
                                       head=head if os.path.isdir(head) else None)
    texts = ["a small blue star at the bottom", "there is a red cross"]
    refs = [reference(f"us {t}") for t in texts]
    rows, outs = [], {}
    tts(texts[0], method="plain", seed=seed, progress=False, max_frames=8)      # warm-up
    methods = [("plain", {}), ("exact", {}), ("pcg", {"theta": 0.45})]
    if tts.head is not None:                  # the frame head: chains of 4 frames
        methods.append(("head", {"tree_depth": 4}))
    for method, kw in methods:
        # one text at a time: this model's rows commit to the batch's shortest accepted length
        parts, secs = timed(lambda: [tts(t, method=method, seed=seed, progress=False, **kw)
                                     for t in texts])
        # quality over SPEECH_SEEDS seeds per sentence (the first: the timed run's outputs)
        waves = [p.waveforms[0] for p in parts] + [
            tts(t, method=method, seed=seed + k, progress=False, **kw).waveforms[0]
            for k in range(1, SPEECH_SEEDS) for t in texts]
        mcd = [mel_cepstral_distortion(w, r) for w, r in zip(waves, refs * SPEECH_SEEDS)]
        st = [p.stats for p in parts]
        drafted = sum(s.drafted for s in st)
        rows.append(dict(method=method, nfe=sum(s.steps for s in st),
                         tokens_per_step=sum(s.emitted for s in st) / sum(s.row_steps for s in st),
                         acceptance=sum(s.accepted for s in st) / drafted if drafted else 0.0,
                         seconds=secs, quality=float(np.mean(mcd)),
                         quality_ci=bootstrap_mean(mcd)))
        outs[method] = parts
        for i, p in enumerate(parts):
            p.save(os.path.join(out_dir, "tts", method), spectrogram=False, prefix=f"text{i}")
    speedups(rows)

    class Joined:   # the comparison figure takes one output per method
        def __init__(self, parts):
            self.waveforms = [p.waveforms[0] for p in parts]
            self.sample_rate = parts[0].sample_rate
    comparison(Joined(outs["plain"]), Joined(outs["exact"]), "exact",
               os.path.join(out_dir, "tts_comparison.png"))
    return rows


def continuous_demo(prompts, out_dir: str, seed: int = 0, k: int = 2):
    from modalities import shapes_world as sw
    from modalities.image.continuous import ContinuousImageGenerator

    models = os.path.join(ROOT, "samples", "models")
    gen = ContinuousImageGenerator.from_pretrained(os.path.join(models, "shapes-continuous"),
                                                   draft=os.path.join(models, "shapes-continuous-draft"))
    rows, images = [], {}
    gen(prompts=prompts[:1], seed=seed, use_draft=False, decode=False)           # warm-up
    for method, spec in (("plain", False), (f"cspd K={k}", True)):
        out, secs = timed(lambda: gen(prompts=prompts, seed=seed, num_draft_tokens=k,
                                      use_draft=spec))
        st = out.stats
        hits = sum(sw.matches(im, p) for im, p in zip(out.images, prompts))
        rows.append(dict(method=method, nfe=st.steps, tokens_per_step=st.tokens_per_step,
                         acceptance=st.acceptance_rate if spec else 0.0, seconds=secs,
                         quality=hits / len(prompts), quality_ci=wilson(hits, len(prompts))))
        images[method] = out.images
    speedups(rows)
    _comparison(images, prompts, os.path.join(out_dir, "continuous.png"), show=len(prompts), scale=1)
    return rows


def print_rows(rows, quality):
    """The table of one modality; the quality column with its 95% interval."""
    print(f"{'method':24} {'NFE':>4} {'tokens/step':>11} {'acceptance':>10} {'wall-clock':>18} "
          f"{quality:>21}")
    print("-" * 93)
    for r in rows:
        print(f"{r['method']:24} {r['nfe']:>4} {r['tokens_per_step']:>11.2f} {r['acceptance']:>10.3f} "
              f"{_speed(r):>18} {_quality(r):>21}")


def text_demo(batch=4, max_new_tokens=48, seed=0):
    from recipes.demo_text import print_table, text_table

    rows, info, prompt, example = text_table(batch, max_new_tokens, seed)
    print(f"target {info['target_params'] / 1e6:.2f}M params, draft {info['draft_params'] / 1e6:.3f}M "
          f"params; batch {batch}, {max_new_tokens} new tokens")
    print_table(rows)


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=Number(int, 1, 500), default=8,
                    help="held-out captions (samples/prompts/shapes_eval.txt has 500)")
    ap.add_argument("--seed", type=SEED, default=0)
    ap.add_argument("--out", default="out/demo", help="output folder")
    ap.add_argument("--text", action="store_true", help="the text-pair demo instead")
    ap.add_argument("--threads", type=COUNT, default=None,
                    help="CPU threads (default: torch's: OMP_NUM_THREADS, else one per core; on a "
                         "machine busy with other work 1 can be several times faster)")
    return describe(ap)


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.text:                    # trains its pair first: gradients stay on
        text_demo(seed=args.seed)
        return
    torch.set_grad_enabled(False)
    t0 = time.time()
    print("mmspec demo: text-to-image on the bundled shapes-world models (CPU, "
          f"{torch.get_num_threads()} threads), {args.prompts} held-out captions, seed {args.seed}")
    rows, prompts, pipe = image_demo(args.prompts, args.seed, args.out)
    print(f"example caption: {prompts[0]!r}\n")
    print_image_table(rows, args.prompts)
    print(f"\nwrote {args.out}/comparison.png and {args.out}/quality_vs_speedup.png")
    print("\nvision-language answers on the bundled shapes-world VLM (24 held-out questions, greedy;"
          " accuracy with its 95% Wilson interval)")
    rows, example = vlm_demo()
    print_rows(rows, "accuracy")
    print("\nthe same questions on the bundled Qwen2-VL-architecture pair (3-D rotary positions)")
    print_rows(vlm_demo(family="qwen2-vl")[0], "accuracy")
    print(f"\ntext-to-speech on the bundled shapes-world TTS (2 sentences, timed at seed {args.seed}; "
          f"quality: MCD in dB against espeak-ng,\nlower is better, the mean over the 2 sentences at "
          f"{SPEECH_SEEDS} seeds with its 95% bootstrap interval)")
    print_rows(tts_demo(args.out, args.seed), "MCD (dB)")
    print(f"\nwrote WAV files under {args.out}/tts and {args.out}/tts_comparison.png")
    print(f"\ncontinuous-token text-to-image on the bundled mixture-head pair ({args.prompts} "
          f"held-out captions, seed {args.seed}, temperature 1; quality: compositional accuracy)")
    print_rows(continuous_demo(prompts, args.out, args.seed), "accuracy")
    print(f"\nwrote {args.out}/continuous.png (columns: plain, speculative) "
          f"({time.time() - t0:.0f} s in all)")


if __name__ == "__main__":
    run(main, "recipes.demo")
