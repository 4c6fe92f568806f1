"""GPU benchmark: speculative Jacobi decoding against plain decoding with guidance, one image.

On the Janus-Pro-7B shape (default), with classifier-free guidance, through mmspec's
text-to-image path:

    python -m eval.bench_jacobi_gpu --out out/bench_jacobi_gpu     # Janus-Pro-7B shape, bf16, H200
    python -m eval.bench_jacobi_gpu --modes eager,captured         # eager steps too
    python -m eval.bench_jacobi_gpu --windows 8,16,32              # each method at each window
    python -m eval.bench_jacobi_gpu --shape tiny --device cpu --new-tokens 16 --windows 4
                                                                   # a smoke run on the CPU

Target: ``eval.bench_gpu.SHAPES[--shape]`` built by ``eval.bench_gpu.build`` (random bf16
weights, seed 0; the Janus-Pro-7B shape is its language model generating image tokens: the 7B
decoder, 30 layers, with the 16,384-id image head as its output layer; Janus' generation
embeddings and the MLPs around them, about 67 MB, are not modelled). It runs as a
``modalities.image.TokenSpanAdapter`` under ``modalities.image.TextToImage``, the pipeline
every text-to-image method runs through: every vocabulary id is an image id, the prompt is
``--prompt`` random ids between a begin id and a begin-of-image id, and guidance is the
pipeline's doubled batch (the conditional row and the unconditional one, an empty caption,
two rows of one forward per step; the rule sees u + s (c - u)). Pixels are not decoded
(``decode=False``): the adapter is given a codebook table alone (zeros, 8 wide like Janus'),
which the pipeline hands to the rules as their geometry and these methods never read.
Sampling as text-to-image runs: temperature 1 (``--temperature``), the pipeline's top-k (none
unless ``--top-k``), seed 0; ``--new-tokens`` image tokens (576: one 384 x 384 Janus image, a
24 x 24 grid; other counts on the most nearly square grid).

Per mode of ``--modes`` (``captured``: ``compile=True``, each decoder layer fused and the
steps captured; ``eager``; on the CPU eager only), in one process on one target:

- ``plain``: plain decoding of the image. ``ms_per_token`` and ``ms_per_step`` are the call's
  time over its image tokens and over its target forwards (``steps``); ``step_ms`` is one
  plain step of the two rows timed alone (``eval.bench_gpu.step_cost``: width 1, static
  cache, the step replayed 20 times at the call's mean context); ``step_over_floor`` and
  ``call_step_over_floor`` put those against the HBM floor (``floor_ms``: the weights a step
  reads, ``eval.bench_adapters_gpu.step_bytes``, once per step whatever the rows, at the
  copy bandwidth ``eval.bench_gpu.copy_bandwidth`` measured); ``first_call_s`` is the first
  call's time (compilation and capture included); ``tokens`` the image tokens it produced.
- ``jacobi``: each method of ``--methods`` (``sjd``: lossless, independent redraws;
  ``sjd-maximal``: lossless, maximal coupling; ``sjd-continue``: relaxed, continuation c = 1;
  ``sjd-continue-c2``: c = 2; docs/image.md) at each window of ``--windows`` (default the
  method's own, 16). ``steps`` are its target forwards, ``compression`` = image tokens /
  steps measured in the call (random weights accept little: as measured),
  ``tokens_per_step`` and ``acceptance`` the loop's counters, ``ms_per_token`` and
  ``ms_per_step`` as for plain; ``window_step_ms`` is the step the window verifies (window + 1
  tokens, two rows) timed alone as ``step_ms`` was, beside ``plain_step_ms`` (the plain row's
  ``step_ms``); ``speedup`` = the plain call's time / this call's (wall clock, same mode);
  ``bound`` = compression x plain_step_ms / window_step_ms, the speedup the measured steps
  allow at the compression measured in the call; ``efficiency`` = speedup / bound;
  ``bundled_compression`` is the step compression measured on the bundled shapes-t2i model
  for the method (``--compressions``, docs/image.md's table: 3.32, 3.46, 4.13, 4.83) and
  ``bound_bundled`` = bundled_compression x plain_step_ms / window_step_ms, the speedup this
  shape's measured steps would give at a trained model's compression (measured on a 16 x 16
  grid at window 16: at another window or grid it is the same arithmetic, not a measurement).

Each call is timed ``--repeats`` times (default 2) after its warm-up, the best kept: the
first call compiles and captures the steps, under a captured mode a second captures the prompt
pass (steps captured once per shape and reused by later calls, ``mmspec.release_graphs`` after
each mode). A Jacobi call that fails gives an ``error``
row (the exception's first line; the traceback on stderr) and the run goes on. JSON lines go
to stdout (with ``#`` progress lines, flushed, so a run cut short shows what it measured) and
bench.jsonl; report.md summarises (rewritten after each mode).
"""

from __future__ import annotations

import argparse
import os
import traceback
from dataclasses import asdict, dataclass, field

import torch

import mmspec
from eval.bench_adapters_gpu import step_bytes
from eval.bench_gpu import COMPILE, SHAPES, build, copy_bandwidth, open_log, step_cost, timed
from mmspec.registry import parse_method
from recipes.cli import COUNT, Names, Number, Numbers, Parser, describe, run

# label -> (TextToImage method, its parameters): docs/image.md's rows, in its table's order
METHODS = {"sjd": ("sjd", {}), "sjd-maximal": ("sjd-maximal", {}),
           "sjd-continue": ("sjd-continue", {}),
           "sjd-continue-c2": ("sjd-continue", {"continuation": 2})}
# step compression on the bundled shapes-t2i model, 48 captions, window 16 (docs/image.md)
BUNDLED = "3.32,3.46,4.13,4.83"
MODES = ("eager", "captured", "graphs")


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=list(SHAPES), default="janus-pro-7b", help="model shape")
    ap.add_argument("--device", default="cuda", help="cuda, cuda:1 ... (cpu: eager only)")
    ap.add_argument("--modes", type=Names(MODES), default="captured",
                    help="captured: compile=True; graphs: compile='graphs'; eager")
    ap.add_argument("--methods", type=Names(tuple(METHODS)), default=",".join(METHODS),
                    help="Jacobi methods (sjd-continue-c2: sjd-continue with continuation=2)")
    ap.add_argument("--windows", type=Numbers(COUNT), default=None,
                    help="Jacobi windows, each method at each (default: the method's own)")
    ap.add_argument("--compressions", type=Numbers(Number(float, 0, open_low=True)),
                    default=BUNDLED,
                    help=f"step compressions measured on the bundled model, one per method in "
                         f"the order {', '.join(METHODS)} (docs/image.md)")
    ap.add_argument("--new-tokens", type=COUNT, default=576,
                    help="image tokens (576: one 384 x 384 Janus image)")
    ap.add_argument("--prompt", type=COUNT, default=48, help="prompt tokens (random ids)")
    ap.add_argument("--guidance", type=Number(float, 1, open_low=True), default=5.0,
                    help="classifier-free guidance scale (Janus-Pro's cfg weight)")
    ap.add_argument("--temperature", type=Number(float, 0, open_low=True), default=1.0,
                    help="sampling temperature (text-to-image samples)")
    ap.add_argument("--top-k", type=COUNT, default=None,
                    help="top-k sampling (default: none, the pipeline's)")
    ap.add_argument("--seed", type=Number(int, 0), default=0,
                    help="the calls' seed (each call draws the same way) and the prompt's")
    ap.add_argument("--repeats", type=COUNT, default=2, help="warm calls per row, the best kept")
    ap.add_argument("--out", default="out/bench_jacobi_gpu", help="output folder")
    return describe(ap)


def grid(n: int) -> tuple[int, int]:
    """The most nearly square (rows, cols) grid of ``n`` tokens (576: 24 x 24)."""
    cols = max(c for c in range(1, int(n ** 0.5) + 1) if n % c == 0)
    return n // cols, cols


@dataclass
class Codebook:
    """What a TokenSpanAdapter needs of a VQ here: a codebook table (the rules' geometry,
    unread by Jacobi's exact and continued tests); no pixel decoder (``decode=False``)."""

    codebook: torch.Tensor

    @property
    def device(self) -> torch.device:
        return self.codebook.device

    def decode(self, ids, grid):
        raise ValueError("no pixel decoder: the benchmark runs decode=False")


def pipeline(target, n: int, guidance: float):
    """``TextToImage`` over ``target`` (every vocabulary id an image id) on an ``n``-token
    grid, guidance ``guidance`` by default."""
    from modalities.image import TextToImage, TokenSpanAdapter

    vocab = target.config.vocab_size
    dev = next(target.parameters()).device
    adapter = TokenSpanAdapter(target, list(range(vocab)), grid(n),
                               Codebook(torch.zeros(vocab, 8, device=dev)), prefix=[1],
                               suffix=[2], pad_id=0)
    return TextToImage(adapter, defaults=dict(guidance_scale=guidance))


@dataclass
class PlainRow:
    """Plain decoding of the image in one mode (the module docstring's columns)."""

    mode: str
    tokens: int
    images: int
    steps: int
    ms_per_token: float
    ms_per_step: float
    step_ms: float
    step_over_floor: float
    call_step_over_floor: float
    first_call_s: float
    kind: str = "plain"


@dataclass
class JacobiRow:
    """One Jacobi method at one window in one mode (the module docstring's columns)."""

    mode: str
    method: str
    window: int
    lossless: bool
    tokens: int
    images: int
    steps: int
    compression: float
    tokens_per_step: float
    acceptance: float
    ms_per_token: float
    ms_per_step: float
    window_step_ms: float
    plain_step_ms: float
    speedup: float
    bound: float
    efficiency: float
    bundled_compression: float
    bound_bundled: float
    first_call_s: float
    kind: str = "jacobi"


@dataclass
class Bench:
    """One mode's calls on one pipeline: the same prompt, seed and sampling in every call."""

    args: argparse.Namespace
    pipe: object
    mode: str
    dev: torch.device
    floor_ms: float
    steps_ms: dict = field(default_factory=dict)      # width -> step_ms(width)

    @property
    def cap(self):
        return COMPILE[self.mode]

    @property
    def context(self) -> int:
        """The calls' mean context: prompt, its two ids, half the image."""
        return self.args.prompt + 2 + self.args.new_tokens // 2

    def call(self, method: str, **params):
        a = self.args
        ids = torch.randint(3, self.pipe.target.vocab_size, (a.prompt,),
                            generator=torch.Generator().manual_seed(a.seed)).tolist()
        return self.pipe(ids, method=method, seed=a.seed, temperature=a.temperature,
                         top_k=a.top_k, compile=self.cap, decode=False, progress=False,
                         **params)

    def best(self, method: str, **params):
        """(the last output, the best seconds of ``--repeats`` warm calls, the first call's).
        Two calls warm up: the first captures the steps, the second the prompt pass (its
        static cache is allocated only then: ``capture_prompts_up_to``); a second call timed
        as warm took 5.3 s more than the third on the Janus shape."""
        run_once = lambda: self.call(method, **params)  # noqa: E731
        out, first = timed(run_once, self.dev, 1)
        progress(f"{self.mode}: {method}{' ' + str(params) if params else ''}: first call "
                 f"{first:.1f} s, {out.stats.steps} steps for {out.tokens.shape[1]} tokens")
        out, best = timed(run_once, self.dev, self.args.repeats, warmup=1 if self.cap else 0)
        return out, best, first

    def step_ms(self, width: int) -> float:
        """ms of one target step of ``width`` tokens on the two rows, timed alone (once per
        width: the methods at one window verify the same step)."""
        if width not in self.steps_ms:
            self.steps_ms[width] = 1e3 * step_cost(self.pipe.target.model, 2, width, self.dev,
                                                   self.cap, prompt_len=self.context)
        return self.steps_ms[width]

    def plain(self) -> tuple[PlainRow, float]:
        """The plain row and its call's best seconds."""
        progress(f"{self.mode}: plain decoding, {self.args.new_tokens} tokens")
        out, t, first = self.best("plain")
        step = self.step_ms(1)
        n, steps = out.tokens.shape[1], out.stats.steps
        return PlainRow(self.mode, n, out.tokens.shape[0], steps, 1e3 * t / n,
                        1e3 * t / steps, step, step / self.floor_ms,
                        1e3 * t / steps / self.floor_ms, first), t

    def jacobi(self, label: str, window: int | None, plain: PlainRow, t_plain: float,
               bundled: float) -> JacobiRow:
        method, params = METHODS[label]
        params = dict(params) if window is None else {**params, "window": window}
        spec = parse_method(method, params, has_draft=False)
        k = spec.num_draft_tokens(self.pipe.target.jacobi_defaults)
        progress(f"{self.mode}: {label}, window {k}")
        out, t, first = self.best(method, **params)
        win = self.step_ms(k + 1)
        s, n = out.stats, out.tokens.shape[1]
        c = self.args.new_tokens / s.steps
        bound = c * plain.step_ms / win
        return JacobiRow(self.mode, label, k, spec.lossless, n, out.tokens.shape[0], s.steps,
                         c, s.tokens_per_step, s.acceptance_rate, 1e3 * t / n,
                         1e3 * t / s.steps, win, plain.step_ms, t_plain / t, bound,
                         (t_plain / t) / bound, bundled, bundled * plain.step_ms / win, first)


def jacobi_row(bench: Bench, label: str, window, plain: PlainRow, t_plain: float,
               bundled: float) -> dict:
    """The method's row; a call that fails gives an ``error`` row (its traceback on stderr)
    and the run goes on with the next method, so one failure leaves the others' figures."""
    try:
        return asdict(bench.jacobi(label, window, plain, t_plain, bundled))
    except Exception as e:  # noqa: BLE001  (reported in the row and on stderr)
        traceback.print_exc()
        return dict(kind="error", mode=bench.mode, method=label, window=window,
                    error=f"{type(e).__name__}: {e}".splitlines()[0].replace("|", "/"))


def progress(text: str) -> None:
    print(f"# {text}", flush=True)


def check(args) -> None:
    """Refused before any work: a compression per method, windows within the image."""
    if len(args.compressions) != len(METHODS):
        raise ValueError(f"--compressions: {len(args.compressions)} values; accepted one per "
                         f"method, {len(METHODS)} in the order {', '.join(METHODS)}")
    big = [w for w in args.windows or [] if w > args.new_tokens]
    if big:
        raise ValueError(f"--windows {big[0]}: accepted at most --new-tokens "
                         f"({args.new_tokens}): drafts past the image are never used")


def setup(args, target, dev, emit) -> float:
    """The setup row; the HBM floor in ms returned."""
    bw = copy_bandwidth(dev)
    wbytes = step_bytes([target])
    floor_ms = 1e3 * wbytes / bw if bw == bw else float("nan")
    emit(dict(kind="setup", device=torch.cuda.get_device_name(dev) if dev.type == "cuda"
              else "cpu", shape=args.shape, weight_gb=wbytes / 1e9, copy_tb_s=bw / 1e12,
              floor_ms=floor_ms, new_tokens=args.new_tokens, grid=list(grid(args.new_tokens)),
              prompt=args.prompt, guidance=args.guidance, temperature=args.temperature,
              top_k=args.top_k, seed=args.seed, repeats=args.repeats,
              compressions=dict(zip(METHODS, args.compressions)),
              transformers=__import__("transformers").__version__, torch=torch.__version__))
    return floor_ms


def main(argv=None) -> list[dict]:
    args = build_parser().parse_args(argv)
    check(args)
    dev = torch.device(args.device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    rows, emit = open_log(args.out)
    progress(f"building the {args.shape} shape on {dev}")
    target = build(args.shape, dev, dtype)[0]     # the draft and eps copies are not used
    floor_ms = setup(args, target, dev, emit)
    pipe = pipeline(target, args.new_tokens, args.guidance)
    bundled = dict(zip(METHODS, args.compressions))
    for mode in args.modes if dev.type == "cuda" else ["eager"]:
        bench = Bench(args, pipe, mode, dev, floor_ms)
        plain, t_plain = bench.plain()
        emit(asdict(plain))
        for label in args.methods:
            for window in args.windows or [None]:
                emit(jacobi_row(bench, label, window, plain, t_plain, bundled[label]))
        write_report(args.out, rows)
        mmspec.release_graphs()
    write_report(args.out, rows)
    return rows


def write_report(out_dir: str, rows: list[dict]) -> None:
    s = rows[0]
    lines = ["# Speculative Jacobi decoding on the GPU", "",
             f"{s['device']}, {s['shape']} shape (random weights), {s['weight_gb']:.1f} GB read "
             f"per step, copy bandwidth {s['copy_tb_s']:.2f} TB/s, HBM floor {s['floor_ms']:.2f} "
             f"ms per step; one image of {s['new_tokens']} tokens ({s['grid'][0]} x "
             f"{s['grid'][1]}), guidance {s['guidance']} (two rows), temperature "
             f"{s['temperature']}, top-k {s['top_k']}, seed {s['seed']}, best of "
             f"{s['repeats']} calls; torch {s['torch']}, transformers {s['transformers']}.", "",
             "| mode | method | window | steps | compression | tokens/step | acceptance | "
             "ms/token | ms/step (call) | step alone, ms | step / floor | speedup | bound | "
             "efficiency | bundled compression | bound at bundled |", "|" + "---|" * 16]
    for r in rows[1:]:
        if r["kind"] == "error":
            cells = (r["mode"], r["method"], r["window"] or "", f"failed: {r['error']}")
        elif r["kind"] == "plain":
            cells = (r["mode"], "plain", "", r["steps"], _f(r["tokens"] / r["steps"]), "", "",
                     _f(r["ms_per_token"]), _f(r["ms_per_step"]), _f(r["step_ms"]),
                     _f(r["step_over_floor"]), "1.00", "", "", "", "")
        else:
            cells = (r["mode"], r["method"] + ("" if r["lossless"] else " (relaxed)"),
                     r["window"], r["steps"], _f(r["compression"]), _f(r["tokens_per_step"]),
                     _f(r["acceptance"], 3), _f(r["ms_per_token"]), _f(r["ms_per_step"]),
                     _f(r["window_step_ms"]), _f(r["window_step_ms"] / s["floor_ms"]),
                     _f(r["speedup"]), _f(r["bound"]), _f(r["efficiency"]),
                     _f(r["bundled_compression"]), _f(r["bound_bundled"]))
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    lines += ["", "bound = compression x plain step / window step (steps timed alone); "
              "efficiency = speedup / bound; bound at bundled: the same at the compression the "
              "bundled shapes-t2i model measured for the method (docs/image.md)."]
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def _f(v, nd=2) -> str:
    return "" if v is None else f"{v:.{nd}f}"


if __name__ == "__main__":
    run(main, "eval.bench_jacobi_gpu")
