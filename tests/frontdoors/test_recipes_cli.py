"""The recipes' command lines: diffusers' --prompt, no abbreviations, --device, the method
checked before the plain baseline runs, and one-line errors (exit 2)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.parametrize("args,line", [
    (("recipes.text_to_image", "--prompt", "a large red circle at the top left", "--method",
      "sjd-max"), "recipes.text_to_image: error: method='sjd-max': accepted one of plain, "),
    (("recipes.text_to_image", "--prompt", "a red circle", "--method", "lantern", "--k", "5000"),
     "recipes.text_to_image: error: k=5000: accepted an integer in [0, 511]"),
    (("recipes.tts", "--text", "a red circle", "--method", "pcg", "--theta", "7"),
     "recipes.tts: error: argument --theta: 7: accepted a number in [-1, 1]"),
])
def test_bad_methods_fail_in_one_line_before_the_baseline(args, line):
    res = _cli(*args)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines()[-1].startswith(line)


def test_prompt_flags_are_not_abbreviations(tmp_path):
    from recipes.text_to_image import parse

    a = parse(["--prompt", "a large red circle at the top left", "--device", "cpu"])
    assert a.prompt == ["a large red circle at the top left"] and a.prompts_file is None
    with pytest.raises(SystemExit):
        parse(["--prompts-f", "x.txt"])                 # abbreviations are refused


def test_pipelines_move_with_to_and_from_pretrained_device():
    from modalities.image import TextToImage
    from modalities.speech import TextToSpeech
    from modalities.vlm import VisionLanguageGenerator

    models = os.path.join(ROOT, "samples", "models")
    t2i = TextToImage.from_pretrained(os.path.join(models, "shapes-t2i"), device="cpu")
    assert t2i.to("cpu") is t2i and t2i.device == torch.device("cpu")
    tts = TextToSpeech.from_pretrained(os.path.join(models, "shapes-tts"), device="cpu")
    assert tts.to("cpu") is tts and tts.device.type == "cpu"
    vlm = VisionLanguageGenerator.from_pretrained(os.path.join(models, "shapes-vlm"), device="cpu")
    assert vlm.to(dtype=torch.float64) is vlm and vlm.target.dtype == torch.float64


def test_demo_timings_are_medians_of_warm_runs_with_their_range():
    from recipes.demo import speedups, timed

    calls = []
    out, secs = timed(lambda: calls.append(1) or len(calls), repeats=3)
    assert out == 1 and len(secs) == 3 and len(calls) == 3       # the first run's output
    rows = [dict(seconds=[2.0, 4.0, 3.0]), dict(seconds=[1.0, 1.5, 2.0])]
    speedups(rows)
    assert rows[1]["speedup"] == 2.0 and rows[1]["spread"] == (1.0, 4.0)
    assert rows[0]["speedup"] == 1.0


def test_from_pretrained_passes_dtype_and_device_map_to_transformers():
    from modalities.image import TextToImage

    pipe = TextToImage.from_pretrained(os.path.join(ROOT, "samples", "models", "shapes-t2i"),
                                       torch_dtype=torch.bfloat16, device_map="cpu")
    assert pipe.target.model.dtype == torch.bfloat16 and pipe.device.type == "cpu"


def test_text_demo_trains_with_gradients_on(monkeypatch):
    """``python -m recipes.demo --text`` trains its pair first (it crashed with gradients off)."""
    import recipes.demo as demo

    seen = []
    monkeypatch.setattr(demo, "text_demo", lambda seed=0: seen.append(torch.is_grad_enabled()))
    demo.main(["--text"])
    assert seen == [True]


def test_loading_is_quiet_unless_verbose(capfd):
    from modalities.image import TextToImage
    from modalities.registry import set_verbose

    path = os.path.join(ROOT, "samples", "models", "shapes-t2i")
    TextToImage.from_pretrained(path)
    assert "Loading weights" not in capfd.readouterr().err
    set_verbose(True)
    try:
        TextToImage.from_pretrained(path)
    finally:
        set_verbose(False)
    assert "Loading weights" in capfd.readouterr().err


def test_compile_flags_map_to_the_front_doors_switch():
    """--compile alone is compile=True (regional); --compile-mode graphs/inductor implies
    --compile."""
    from recipes.cli import Parser, add_compile, compile_switch

    ap = Parser()
    add_compile(ap)
    assert [compile_switch(ap.parse_args(a)) for a in
            ([], ["--compile"], ["--compile-mode", "graphs"], ["--compile-mode", "regional"],
             ["--compile", "--compile-mode", "inductor"])] == [
        False, True, "graphs", True, "inductor"]
    with pytest.raises(SystemExit):
        ap.parse_args(["--compile-mode", "fast"])
