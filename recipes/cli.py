"""What the command lines share: the device flag, numbers parsed with their accepted range,
every flag's help stating its default and range, the method checked before any model runs,
and errors as one line (exit 2) rather than a traceback; Ctrl-C as one line (exit 130)."""

from __future__ import annotations

import argparse
import math
import os
import sys
from dataclasses import dataclass

import torch

from mmspec.drafters.jacobi import COUPLINGS, INITS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Parser(argparse.ArgumentParser):
    """argparse without abbreviations (``--prompt`` is never ``--prompts-file``) whose errors
    are one line: ``prog: error: argument --k: 0: accepted an integer >= 1 (prog --help)``."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("prog", _module_name())
        super().__init__(*args, **kwargs)

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} ({self.prog} --help lists the flags)\n")


def _module_name() -> str | None:
    """``recipes.tts`` for ``python -m recipes.tts`` (argparse would say ``tts.py``); None
    (argparse's own choice) otherwise, e.g. under the ``mmspec`` console script."""
    path = os.path.abspath(sys.argv[0])
    if path.endswith(".py") and path.startswith(ROOT + os.sep):
        return os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
    return None


@dataclass(frozen=True)
class Number:
    """An argparse ``type``: a number in [low, high] (``open_low``: low itself refused).

    A value outside the range is refused by argparse in one line that names the flag and the
    range, before any work starts; ``str(Number(int, 1))`` is the range as help text shows it.
    """

    kind: type = int
    low: float | None = None
    high: float | None = None
    open_low: bool = False

    def __call__(self, text: str):
        try:
            value = self.kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: accepted {self}") from None
        below = self.low is not None and (value < self.low or (self.open_low and value == self.low))
        above = self.high is not None and value > self.high
        if below or above or not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text}: accepted {self}")
        return value

    def __str__(self) -> str:
        name = "an integer" if self.kind is int else "a number"
        lo, hi = self.low, self.high
        if lo is not None and hi is not None:
            return f"{name} in {'(' if self.open_low else '['}{lo:g}, {hi:g}]"
        if lo is not None:
            return f"{name} {'>' if self.open_low else '>='} {lo:g}"
        return name if hi is None else f"{name} <= {hi:g}"


@dataclass(frozen=True)
class Numbers:
    """An argparse ``type``: comma-separated values, each accepted by ``item`` (``2,4,8``;
    ``5x2x4,8x2x8`` with ``TreeShape()``)."""

    item: Number | TreeShape

    def __call__(self, text: str) -> list:
        parts = [p.strip() for p in str(text).split(",")]
        if not all(parts):
            raise argparse.ArgumentTypeError(f"{text!r}: accepted comma-separated {self.item}s")
        return [self.item(p) for p in parts]

    def __str__(self) -> str:
        return f"comma-separated, each {self.item}"


@dataclass(frozen=True)
class Names:
    """An argparse ``type``: comma-separated names, each one of ``allowed`` (``eager,captured``)."""

    allowed: tuple[str, ...]

    def __call__(self, text: str) -> list[str]:
        names = [p.strip() for p in str(text).split(",")]
        bad = [n for n in names if n not in self.allowed]
        if bad:
            raise argparse.ArgumentTypeError(f"{','.join(bad)}: accepted {self}")
        return names

    def __str__(self) -> str:
        return f"comma-separated, each one of {', '.join(self.allowed)}"


@dataclass(frozen=True)
class TreeShape:
    """An argparse ``type``: a draft tree's shape, ``DEPTHxCHILDRENxWIDTH`` (``5x2x4``: depth
    5, 2 children per expanded node, 4 nodes expanded per level) -> the front doors' tree
    parameters (``tree_depth``, ``tree_branch``, ``tree_width``)."""

    def __call__(self, text: str) -> dict:
        parts = str(text).strip().split("x")
        if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise argparse.ArgumentTypeError(f"{text!r}: accepted {self}")
        depth, branch, width = map(int, parts)
        return dict(tree_depth=depth, tree_branch=branch, tree_width=width)

    def __str__(self) -> str:
        return "DEPTHxCHILDRENxWIDTH, each an integer >= 1 (e.g. 5x2x4)"


@dataclass(frozen=True)
class Device:
    """An argparse ``type``: a torch device this machine has. The text is parsed by
    ``torch.device`` (``cpu``, ``cpu:0``, ``cuda``, ``cuda:N``, ``mps``, ``xpu`` ...); refused,
    in one line naming what this machine has, before any model loads: what torch does not
    parse, and a backend (or a device index) this machine lacks."""

    def __call__(self, text: str) -> str:
        name = str(text).strip()
        try:
            device = torch.device(name)
        except (RuntimeError, ValueError, TypeError):
            raise self._refused(text, f"{name!r} is not a torch device") from None
        why = missing_device(device)
        if why:
            raise self._refused(text, why)
        return str(device)

    def _refused(self, text, why: str) -> argparse.ArgumentTypeError:
        return argparse.ArgumentTypeError(f"{text!r}: accepted {self} (this machine has: "
                                          f"{', '.join(available_devices())}); {why}")

    def __str__(self) -> str:
        return "cpu, cuda, cuda:N or mps, where the machine has them"


# Backends besides cpu, cuda and mps whose torch module says whether the machine has them.
OTHER_BACKENDS = ("xpu", "mtia", "hpu")


def missing_device(device: torch.device) -> str | None:
    """Why ``device`` cannot work on this machine, or None where it can."""
    kind, index = device.type, device.index
    if kind == "cpu":
        return None
    if kind == "cuda":
        if not torch.cuda.is_available():
            return "this machine has no CUDA device"
        count = torch.cuda.device_count()
        if index is not None and index >= count:
            return f"this machine has {count} CUDA device{'s' if count != 1 else ''}"
        return None
    if kind == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            return "this machine has no MPS device"
        return "this machine has one MPS device, mps:0" if index else None
    module = getattr(torch, kind, None)
    available = getattr(module, "is_available", None)
    if callable(available) and not available():
        return f"this machine has no {kind} device"
    count = getattr(module, "device_count", None)
    if index is not None and callable(count) and index >= count():
        return f"this machine has {count()} {kind} device{'s' if count() != 1 else ''}"
    return None


def available_devices() -> list[str]:
    """The devices this machine has: cpu, and cuda / cuda:N / mps / xpu ... where present."""
    names = ["cpu"]
    if torch.cuda.is_available():
        names += ["cuda"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        names.append("mps")
    for kind in OTHER_BACKENDS:
        available = getattr(getattr(torch, kind, None), "is_available", None)
        if callable(available) and available():
            names.append(kind)
    return names


def check_device(device: str | None, flag: str = "--device") -> None:
    """A device from a config file (the command line's goes through ``Device``)."""
    if device is not None:
        try:
            Device()(device)
        except argparse.ArgumentTypeError as e:
            raise ValueError(f"{flag} {e}") from None


def tree_name(params: dict) -> str:
    """``{"tree_depth": 5, "tree_branch": 2, "tree_width": 4}`` -> ``"5x2x4"``."""
    return f"{params['tree_depth']}x{params['tree_branch']}x{params['tree_width']}"


COUNT = Number(int, 1)                     # prompts, tokens, repeats, batch rows
SEED = Number(int, 0, 2**63 - 1)
TEMPERATURE = Number(float, 0)
GUIDANCE = Number(float, 0)

# Method parameters as flags: name -> (type, what it is). Their defaults are the method's own
# (docs/METHODS.md); the rule checks the bounds that depend on the model (k < V) when built.
METHOD_FLAGS = {
    "num_draft_tokens": (COUNT, "drafts per step K"),
    "window": (COUNT, "Jacobi window"),
    "coupling": (COUPLINGS, "SJD coupling of the Jacobi drafts"),
    "init": (INITS, "Jacobi initialisation of new window slots"),
    "k": (Number(int, 0), "LANTERN neighbourhood size (below the vocabulary size)"),
    "delta": (Number(float, 0), "LANTERN/annealed TV budget (LANTERN: at most 1)"),
    "lam": (Number(float, 1), "LANTERN++ multiplicative bound"),
    "group_size": (COUNT, "GSD group size (at most the vocabulary size)"),
    "p_threshold": (Number(float, 0, 1, open_low=True), "GSD probability threshold"),
    "embed_threshold": (Number(float, -1, 1), "GSD cosine threshold"),
    "theta": (Number(float, -1, 1), "PCG cosine threshold"),
    "nu": (Number(float, 0), "annealed decay"),
    "mu": (Number(float), "annealed offset"),
    "tree_depth": (COUNT, "tree and head methods: levels of drafts; sjd-proactive: levels "
                          "with children"),
    "tree_branch": (COUNT, "tree, head and sjd-proactive methods: children per expanded node"),
    "tree_spines": (COUNT, "sjd-proactive: nodes of the last tree level the window's chain "
                           "follows"),
    "tree_width": (COUNT, "tree and head methods: nodes expanded per level"),
    "tree_nodes": (COUNT, "tree and head methods: keep the best nodes (top-k children only)"),
}


def add_method_flags(ap, names=tuple(METHOD_FLAGS)) -> None:
    """``--k``, ``--delta`` ... for the method parameters ``names`` (default: the method's)."""
    for name in names:
        typ, what = METHOD_FLAGS[name]
        kind = dict(choices=typ) if isinstance(typ, tuple) else dict(type=typ)
        ap.add_argument("--" + name.replace("_", "-"), **kind, default=None,
                        help=f"{what} (default: the method's own)")


def describe(ap: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Every flag's help ends with its accepted range (``Number``, choices) and default.

    A default of None says nothing, so such a flag's help must say what it means itself
    (``(default: the model's)``); tests/frontdoors/test_recipes_cli.py checks every command's flags."""
    for action in ap._actions:  # argparse has no public iterator over its actions
        if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
            continue
        text, accepted = action.help or "", None
        if isinstance(action.type, (Number, Numbers, Names, TreeShape, Device)):
            accepted = str(action.type)
        elif action.choices:
            accepted = ", ".join(map(str, action.choices))
        if accepted and "accepted" not in text:
            head, sep, tail = text.rpartition(" (default")
            text = f"{head}; accepted: {accepted}{sep}{tail}" if sep else f"{text}; accepted: {accepted}"
        if "default" not in text:
            if isinstance(action, argparse._StoreTrueAction):
                text += " (default: off)"
            elif action.default not in (None, [], argparse.SUPPRESS):
                text += f" (default: {_shown(action.default)})"
        action.help = text.lstrip("; ").replace("%", "%%")
    return ap


def _shown(value) -> str:
    return ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


BUNDLED = os.path.join(ROOT, "samples", "models")


def add_models(ap, bundled: str, flag: str = "--model") -> None:
    """The model flag (``--model``; the VLM's ``--target``) and ``--draft``, bundled by
    default."""
    ap.add_argument(flag, default=None,
                    help=f"folder or Hugging Face id (default: the bundled {bundled})")
    ap.add_argument("--draft", default=None,
                    help="draft model folder or id (default: the bundled draft with the "
                         "bundled model, else none)")
    ap.add_argument("--head", default=None,
                    help="draft head folder for method 'head' (default: the bundled head with "
                         "the bundled model, else none)")


def bundled_pair(model: str | None, draft: str | None, bundled: str,
                 bundled_draft: str) -> tuple[str, str | None]:
    """(model, draft) from the flags: the bundled pair when no model is given (its draft when
    present), refusing a missing bundled model in one line."""
    if model is not None:
        return model, draft
    path = os.path.join(BUNDLED, bundled)
    if not os.path.exists(path):
        raise ValueError(f"the bundled model is missing ({path}); pass a model folder or id")
    if draft is None and os.path.exists(os.path.join(BUNDLED, bundled_draft)):
        draft = os.path.join(BUNDLED, bundled_draft)
    return path, draft


def bundled_head(model: str | None, head: str | None, bundled: str) -> str | None:
    """The ``--head`` flag, or the bundled model's head (``samples/models/<bundled>-head``)
    when no model is given and it exists."""
    if head is not None or model is not None:
        return head
    path = os.path.join(BUNDLED, f"{bundled}-head")
    return path if os.path.isdir(path) else None


def add_sampling(ap, top_p: bool = True) -> None:
    """``--guidance``, ``--temperature``, ``--top-k`` (``--top-p``) and ``--seed``."""
    ap.add_argument("--guidance", type=GUIDANCE, default=None,
                    help="classifier-free guidance scale (default: the model's)")
    ap.add_argument("--temperature", type=TEMPERATURE, default=1.0, help="0 is greedy")
    ap.add_argument("--top-k", type=COUNT, default=None, help="(default: no top-k filter)")
    if top_p:
        ap.add_argument("--top-p", type=Number(float, 0, 1, open_low=True), default=None,
                        help="(default: no top-p filter)")
    ap.add_argument("--seed", type=SEED, default=0)


def add_compile(ap) -> None:
    ap.add_argument("--compile", action="store_true",
                    help="static caches and CUDA-graph steps (CUDA only; same tokens under greedy)")
    ap.add_argument("--compile-mode", choices=("regional", "graphs", "inductor"), default=None,
                    help="with it, --compile is implied: 'regional' (--compile alone: each "
                         "decoder layer fused by torch.compile, then captured), 'graphs' "
                         "(captured without compiling: no compilation time, slower steps) or "
                         "'inductor' (the whole step fused, about a minute per step width) "
                         "(default: --compile's choice, regional)")


def compile_switch(args) -> bool | str:
    """The front doors' ``compile=`` from ``--compile`` and ``--compile-mode``."""
    if args.compile_mode is None:
        return bool(args.compile)
    return True if args.compile_mode == "regional" else args.compile_mode


def add_common(ap) -> None:
    """``--device`` and ``--verbose`` (third-party loading bars and warnings; quiet by default)."""
    ap.add_argument("--device", type=Device(), default=None,
                    help="where the models run (default: cuda when available, else cpu)")
    ap.add_argument("--verbose", action="store_true",
                    help="show transformers' and diffusers' loading progress and warnings")


def configure(args) -> str:
    """Apply ``--verbose``; returns the device (``--device``, else cuda when available)."""
    from modalities.registry import set_verbose

    set_verbose(args.verbose)
    return args.device or ("cuda" if torch.cuda.is_available() else "cpu")


def check_compile(args, device: str) -> None:
    """``--compile`` captures CUDA graphs: refused on another device before any model loads."""
    if compile_switch(args) and not str(device).startswith("cuda"):
        raise ValueError(f"--compile captures CUDA graphs: accepted with a CUDA --device, not "
                         f"{device}")


def check_head(head: str | None, flag: str = "--head") -> None:
    """A head folder in a layout mmspec reads, recognised from its config alone (no model)."""
    if head is not None:
        from mmspec.drafters.layouts import recognise

        try:
            recognise(head)
        except ValueError as e:
            raise ValueError(f"{flag} {e}") from None


def check_vocab(params: dict, vocab: int, what: str = "the codebook") -> None:
    """The method parameters (and ``top_k``) bounded by a vocabulary of ``vocab`` ids, checked
    from a model's config before it loads (the rules and drafters check them again when
    built)."""
    bounds = {"k": (0, vocab - 1, f"V - 1 for a {vocab}-row embedding table"),
              "group_size": (1, vocab, f"{what} has {vocab} ids"),
              "tree_branch": (1, vocab, f"a node's children are distinct ids of {what}'s {vocab}"),
              "top_k": (1, vocab, f"{what} has {vocab} ids")}
    for name, (low, high, why) in bounds.items():
        value = params.get(name)
        if isinstance(value, int) and not low <= value <= high:
            raise ValueError(f"{name}={value}: accepted an integer in [{low}, {high}] ({why})")


def read_lines(path: str, flag: str) -> list[str]:
    """The non-blank lines of a text file, stripped; a missing or binary file is refused in
    one line naming the flag and the file."""
    try:
        with open(path, encoding="utf-8") as f:
            return [line.strip() for line in f if line.strip()]
    except UnicodeDecodeError:
        raise ValueError(f"{flag} {path}: not a UTF-8 text file: accepted one prompt per "
                         "line") from None
    except OSError as e:
        raise ValueError(f"{flag} {path}: {e.strerror or e}: accepted an existing text "
                         "file") from None


def check_method(method: str, params: dict, has_draft: bool, embeddings=None,
                 has_head: bool = False) -> None:
    """The method and its parameters, parsed and its rule built, before the plain baseline
    runs (``--method sjd-max`` or ``--k 5000`` fail here, not after minutes)."""
    from mmspec.registry import MethodContext, parse_method

    spec = parse_method(method, params, has_draft=has_draft, has_head=has_head)
    spec.build_rule(MethodContext(embeddings=embeddings))


class Interrupted(Exception):
    """Ctrl-C, with what the command kept (``str``: e.g. "12 rows kept in out/results.jsonl;
    the same command resumes"); ``run`` reports it in one line, exit status 130."""


def run(main, name: str) -> None:
    """``main()``, with bad input (a bad value, a missing file) reported as one line and exit
    status 2, and Ctrl-C as one line (what was kept, when the command says) and status 130."""
    try:
        main()
    except (ValueError, OSError) as e:
        print(f"{name}: error: {e}", file=sys.stderr)
        sys.exit(2)
    except Interrupted as e:
        print(f"{name}: interrupted: {e}", file=sys.stderr)
        sys.exit(130)
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        sys.exit(130)
