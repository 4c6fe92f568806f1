"""The ``mmspec`` console script: every command and benchmark reachable, every flag's help
stating its default and accepted range, ranges enforced before any work, errors in one line
with exit status 2."""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys

import pytest

from mmspec_cli import BENCHES, COMMANDS, main, resolve
from recipes.cli import Names, Number, Numbers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EVERY = [("mmspec " + n, c) for n, c in COMMANDS.items()] + \
        [("mmspec bench " + n, c) for n, c in BENCHES.items()]


def _console(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "mmspec_cli", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def test_the_console_script_is_installed_with_the_package():
    """``make`` installs the package; its ``mmspec`` script sits beside the interpreter."""
    script = os.path.join(os.path.dirname(sys.executable), "mmspec")
    assert os.path.exists(script), "pip install -e . did not install the mmspec script"
    res = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0
    for name in [*COMMANDS, *BENCHES]:
        assert f"  {name} " in res.stdout


@pytest.mark.parametrize("prog,command", EVERY, ids=[p for p, _ in EVERY])
def test_every_flag_states_its_default_and_range(prog, command):
    parser = importlib.import_module(command.module).build_parser()
    assert not parser.allow_abbrev, f"{prog}: abbreviations turn --prompt into --prompts-file"
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or not action.option_strings:
            continue
        flag, text = action.option_strings[-1], action.help or ""
        assert "default" in text, f"{prog} {flag}: help gives no default: {text!r}"
        if action.type in (int, float):
            raise AssertionError(f"{prog} {flag}: a bare {action.type.__name__}, no range")
        if isinstance(action.type, (Number, Numbers, Names)):
            assert f"accepted: {action.type}" in text, f"{prog} {flag}: range not in help"
        if action.choices:
            assert "accepted: " + ", ".join(map(str, action.choices)) in text


@pytest.mark.parametrize("args,line", [
    (("t2i", "--num-images", "0"), "mmspec t2i: error: argument --num-images: 0: accepted an "
                                   "integer >= 1"),
    (("t2i", "--top-p", "1.5"), "mmspec t2i: error: argument --top-p: 1.5: accepted a number "
                                "in (0, 1]"),
    (("tts", "--temperature", "-1"), "mmspec tts: error: argument --temperature: -1: accepted a "
                                     "number >= 0"),
    (("vlm", "x.png", "q?", "--max-new-tokens", "ten"), "mmspec vlm: error: argument "
                                                        "--max-new-tokens: 'ten': accepted an "
                                                        "integer >= 1"),
    (("eval", "--seeds", "0", "--batch", "0"), "mmspec eval: error: argument --batch: 0"),
    (("bench", "core", "--ks", "2,0"), "mmspec bench core: error: argument --ks: 0: accepted "
                                       "an integer >= 1"),
    (("bench", "gpu", "--modes", "eager,fast"), "mmspec bench gpu: error: argument --modes: "
                                                "fast: accepted comma-separated, each one of "
                                                "eager, captured, graphs, inductor"),
    (("t2i", "--prompts-f", "x.txt"), "mmspec t2i: error: unrecognized arguments: --prompts-f"),
    (("paint",), "mmspec: error: 'paint': accepted one of t2i, tts, vlm, demo, serve, eval, "
                 "bench"),
    (("bench", "fast"), "mmspec: error: bench 'fast': accepted one of core, overhead"),
    (("vlm", "missing.png", "What colour?"), "mmspec vlm: error: "),
])
def test_bad_input_is_one_line_and_exit_2(args, line):
    res = _console(*args)
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr and "usage:" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert res.stderr.startswith(line), res.stderr


def test_commands_resolve_to_the_recipes_python_m_runs():
    assert resolve(["t2i", "--prompt", "x"]) == ("mmspec t2i", COMMANDS["t2i"], ["--prompt", "x"])
    assert resolve(["bench", "core"])[:2] == ("mmspec bench core", BENCHES["core"])
    for command in [*COMMANDS.values(), *BENCHES.values()]:
        assert callable(importlib.import_module(command.module).main)


def test_a_command_runs_end_to_end_through_the_console(tmp_path, capsys, monkeypatch):
    """``mmspec t2i`` on the bundled pair writes the images and prints the table."""
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    main(["t2i", "--prompt", "a large red circle at the top left", "--method", "sjd",
          "--device", "cpu", "--no-progress", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "tokens/step" in out and "plain" in out and "sjd" in out
    assert (tmp_path / "comparison.png").exists() and (tmp_path / "plain_000.png").exists()


def test_version():
    res = _console("--version")
    assert res.returncode == 0 and res.stdout.startswith("mmspec ")
