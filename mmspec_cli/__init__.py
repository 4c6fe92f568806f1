"""``mmspec``: one command for the recipes, the web demo, the sweep and the benchmarks.

    mmspec t2i --prompt "a large red circle at the top left" --method sjd
    mmspec tts --text "a small blue star at the bottom" --method exact
    mmspec vlm photo.png "What colour is the circle?"
    mmspec serve                         # the web demo on http://127.0.0.1:7860
    mmspec eval --modality image --methods plain,sjd
    mmspec bench core --ks 2,4

Each command runs a module of the repository (``mmspec t2i`` is ``python -m
recipes.text_to_image``, which keeps working); ``mmspec COMMAND --help`` lists its flags,
each with its default and accepted range. Bad input is one line on stderr and exit status 2;
Ctrl-C one line and exit status 130.
This package sits above ``eval`` and ``recipes`` in the import order: nothing imports it.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    """A command of the console script: the module whose ``main()`` it runs, and one line."""

    module: str
    summary: str


COMMANDS = {
    "t2i": Command("recipes.text_to_image", "text to image: plain and speculative, side by side"),
    "tts": Command("recipes.tts", "text to speech: plain and speculative, side by side"),
    "vlm": Command("recipes.vlm", "ask a vision-language model about images"),
    "demo": Command("recipes.demo", "the demo of `make demo` on the bundled models"),
    "serve": Command("recipes.serve", "the web demo in a browser"),
    "eval": Command("eval.sweep", "quality-versus-speedup sweep with report and plots"),
}
BENCHES = {
    "core": Command("eval.bench_core", "the core loop on a small Llama"),
    "overhead": Command("eval.bench_overhead", "the engine's own cost per step"),
    "relaxed": Command("eval.bench_relaxed", "relaxed rules: TV against speed"),
    "jacobi": Command("eval.bench_jacobi", "Jacobi decoding windows"),
    "continuous": Command("eval.bench_continuous", "continuous-token speculative decoding"),
    "gpu": Command("eval.bench_gpu", "7B-shape engine benchmark (GPU)"),
    "adapters": Command("eval.bench_adapters_gpu", "VLM and TTS adapters at scale (GPU)"),
    "profile": Command("eval.profile_gpu", "kernel tables of the engine's steps (GPU)"),
    "trees": Command("eval.bench_trees_gpu", "tree steps and tree drafting against chains (GPU)"),
    "tree-sizes": Command("eval.tree_sizes", "tokens per step of a T2I draft and head by tree size"),
}


def usage() -> str:
    """The top-level help: every command and benchmark with its line."""
    lines = ["usage: mmspec COMMAND [flags]     (mmspec COMMAND --help: its flags)", "",
             "commands:"]
    lines += [f"  {name:12} {c.summary}" for name, c in COMMANDS.items()]
    lines += ["  bench NAME   a benchmark (mmspec bench NAME --help):"]
    lines += [f"    {name:10} {c.summary}" for name, c in BENCHES.items()]
    return "\n".join(lines)


def resolve(argv: list[str]) -> tuple[str, Command, list[str]]:
    """(prog, command, its arguments) from the console's arguments; ValueError names the
    accepted commands."""
    if argv and argv[0] == "bench":
        if len(argv) < 2 or argv[1] not in BENCHES:
            got = repr(argv[1]) if len(argv) > 1 else "nothing"
            raise ValueError(f"bench {got}: accepted one of {', '.join(BENCHES)}")
        return f"mmspec bench {argv[1]}", BENCHES[argv[1]], argv[2:]
    if not argv or argv[0] not in COMMANDS:
        got = repr(argv[0]) if argv else "no command"
        raise ValueError(f"{got}: accepted one of {', '.join(COMMANDS)}, bench")
    return f"mmspec {argv[0]}", COMMANDS[argv[0]], argv[1:]


def main(argv: list[str] | None = None) -> None:
    """The ``mmspec`` console script."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] in (["-h"], ["--help"]):
        print(usage())
        return
    if argv[:1] == ["--version"]:
        from mmspec import __version__

        print(f"mmspec {__version__}")
        return
    try:
        prog, command, rest = resolve(argv)
    except ValueError as e:
        print(f"mmspec: error: {e} (mmspec --help lists them)", file=sys.stderr)
        sys.exit(2)
    try:                      # importing torch and the command takes seconds: Ctrl-C there too
        from recipes.cli import run

        module = importlib.import_module(command.module)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        sys.exit(130)
    # argparse names a command after sys.argv[0]; the command reads its flags from sys.argv.
    sys.argv = [prog, *rest]
    run(module.main, prog)
