"""What the recipes' command lines share: the device flag, the method checked before any
model runs, and errors as one line (exit 2) rather than a traceback."""

from __future__ import annotations

import sys

import torch


def add_common(ap) -> None:
    """``--device`` and ``--verbose`` (third-party loading bars and warnings; quiet by default)."""
    ap.add_argument("--device", default=None,
                    help="cpu, cuda, cuda:1 ... (default: cuda when available, else cpu)")
    ap.add_argument("--verbose", action="store_true",
                    help="show transformers' and diffusers' loading progress and warnings")


def configure(args) -> str:
    """Apply ``--verbose``; returns the device (``--device``, else cuda when available)."""
    from modalities.registry import set_verbose

    set_verbose(args.verbose)
    return args.device or ("cuda" if torch.cuda.is_available() else "cpu")


def check_method(method: str, params: dict, has_draft: bool, embeddings=None) -> None:
    """The method and its parameters, parsed and its rule built, before the plain baseline
    runs (``--method sjd-max`` or ``--k 5000`` fail here, not after minutes)."""
    from mmspec.registry import MethodContext, parse_method

    spec = parse_method(method, params, has_draft=has_draft)
    spec.build_rule(MethodContext(embeddings=embeddings))


def run(main, name: str) -> None:
    """``main()``, with bad input reported as one line and exit status 2."""
    try:
        main()
    except ValueError as e:
        print(f"{name}: error: {e}", file=sys.stderr)
        sys.exit(2)
