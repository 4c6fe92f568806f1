"""The evaluation sweep: end to end on tiny models, resume, two CPU processes, and metrics
against hand-computed values."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from eval import metrics
from eval.sweep import main as sweep_main, read_rows
from tiny_image import save_tiny_bundled_pair

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    """Tiny shapes-world-vocabulary models saved in the bundled format."""
    root = tmp_path_factory.mktemp("models")
    target, draft = save_tiny_bundled_pair(str(root))
    prompts = root / "prompts.txt"
    prompts.write_text("a large red circle at the top left\na small blue star at the bottom\n"
                       "a large black cross at the centre\n")
    return target, draft, str(prompts)


def _args(models, out, methods="plain,exact", extra=()):
    t, d, p = models
    return ["--model", t, "--draft", d, "--prompts", p, "--methods", methods, "--num-prompts",
            "3", "--batch", "2", "--seeds", "0", "--out", str(out), *extra]


def test_sweep_runs_end_to_end_and_writes_report(tiny_models, tmp_path):
    out = tmp_path / "sweep"
    sweep_main(_args(tiny_models, out, "plain,exact,sjd-maximal+lantern",
                     ["--param", "sjd-maximal+lantern.delta=0.1,0.3"]))
    rows = read_rows(out / "results.jsonl")
    assert len(rows) == 3 * 4        # 3 prompts x (plain, exact, two lantern settings)
    r = rows[-1]
    for key in ("nfe", "tokens_per_step", "acceptance", "histogram", "seconds_batch", "seed",
                "compositional_accuracy", "ids"):
        assert key in r
    for f in ("summary.csv", "report.md", "quality_vs_speedup.png", "acceptance_by_position.png",
              "tokens_per_step_hist.png", "comparison.png"):
        assert (out / f).exists(), f
    report = (out / "report.md").read_text()
    assert "| exact |" in report and "pass" in report and "relaxed" in report


def test_sweep_resumes_without_duplicating_rows(tiny_models, tmp_path, capsys):
    out = tmp_path / "sweep"
    sweep_main(_args(tiny_models, out, extra=["--no-report"]))
    full = read_rows(out / "results.jsonl")
    lines = (out / "results.jsonl").read_text().splitlines()
    # interrupted: the last unit lost (one of its rows written, then a cut line)
    (out / "results.jsonl").write_text("\n".join(lines[:-2]) + "\n" + lines[-2][:40])
    sweep_main(_args(tiny_models, out, extra=["--no-report"]))
    assert "discarded a torn last line" in capsys.readouterr().err
    again = read_rows(out / "results.jsonl")
    assert len(again) == len(full)              # no row glued onto the torn line
    keys = [(r["key"], r["prompt_index"]) for r in again]
    assert sorted(set(keys)) == sorted((r["key"], r["prompt_index"]) for r in full)
    assert len(set(keys)) == len(keys)          # the partial unit was re-run, not duplicated
    # a second resume has nothing left to do
    sweep_main(_args(tiny_models, out, extra=["--no-report"]))
    assert len(read_rows(out / "results.jsonl")) == len(again)


def test_two_process_cpu_run_merges_identical_rows(tiny_models, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    sweep_main(_args(tiny_models, one, extra=["--no-report"]))
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
               PYTHONPATH=os.path.join(ROOT, "tests") + os.pathsep + ROOT)
    # torchrun: two CPU processes over gloo (``accelerate launch --cpu`` starts one)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
           "2", "-m", "eval.sweep", *_args(tiny_models, two, extra=["--no-report"])]
    res = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    a = {(r["key"], r["prompt_index"]): r for r in read_rows(one / "results.jsonl")}
    b = {(r["key"], r["prompt_index"]): r for r in read_rows(two / "results.jsonl")}
    assert a.keys() == b.keys()
    for k in a:
        assert a[k]["ids"] == b[k]["ids"] and a[k]["nfe"] == b[k]["nfe"]
    assert not list(two.glob("results.rank*.jsonl"))


def test_metrics_against_hand_computed_values():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 4))
    assert metrics.fid(x, x) == pytest.approx(0.0, abs=1e-6)
    shifted = x + np.array([1.0, 0, 0, 0])
    assert metrics.fid(x, shifted) == pytest.approx(1.0, abs=1e-6)   # |mu| difference only
    sig = np.sin(np.linspace(0, 200, 16000)) * np.linspace(0, 1, 16000)
    assert metrics.mel_cepstral_distortion(sig, sig) == pytest.approx(0.0, abs=1e-6)
    assert metrics.mel_cepstral_distortion(sig, rng.normal(size=16000)) > 1.0
    from modalities import shapes_world as sw

    scene, img, cap = sw.sample(5)
    assert sw.compositional_accuracy([img], [cap]) == 1.0
    est, lo, hi = metrics.bootstrap_ci([1.0] * 10)
    assert est == lo == hi == 1.0
    same = metrics.token_tv_test([[1, 2, 3]] * 20, [[1, 2, 3]] * 20, 5)
    assert same["passed"] and same["tv"] == 0
    diff = metrics.token_tv_test([[1, 1, 1]] * 20, [[3, 3, 3]] * 20, 5)
    assert not diff["passed"]
    assert metrics.leviathan_bound(0.0, 4, 0.0) == 1.0
    assert metrics.leviathan_bound(1.0, 4, 0.0) == 5.0


def test_config_file_and_bad_options(tiny_models, tmp_path):
    t, d, p = tiny_models
    cfg = tmp_path / "sweep.yaml"
    cfg.write_text(f"model: {t}\ndraft: {d}\nprompts: {p}\nmethods: [plain, sjd]\n"
                   f"param:\n  sjd:\n    window: [4, 8]\nnum_prompts: 2\nbatch: 2\n"
                   f"out: {tmp_path / 'c'}\nno_report: true\n")
    sweep_main(["--config", str(cfg)])
    rows = read_rows(tmp_path / "c" / "results.jsonl")
    assert sorted({r["setting"] for r in rows}) == ["default", "window=4", "window=8"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("methodz: [plain]\n")
    with pytest.raises(ValueError, match="unknown option"):
        sweep_main(["--config", str(bad)])
    with pytest.raises(ValueError, match="accepted METHOD.NAME"):
        sweep_main(_args(tiny_models, tmp_path / "x", extra=["--param", "delta=0.1"]))


def test_speech_metrics_against_hand_computed_values():
    sr = 16000
    t = np.arange(sr) / sr
    tone = 0.5 * np.sin(2 * np.pi * 200 * t)
    f0 = metrics.f0_track(tone, sr)
    voiced = f0[f0 > 0]
    assert len(voiced) > 0.8 * len(f0)
    assert np.median(voiced) == pytest.approx(200, rel=0.01)
    low = 0.5 * np.sin(2 * np.pi * 100 * t)
    assert np.median(metrics.f0_track(low, sr)[metrics.f0_track(low, sr) > 0]) == pytest.approx(100, rel=0.01)
    assert (metrics.f0_track(np.zeros(sr), sr) == 0).all()             # silence is unvoiced
    assert metrics.log_f0_rmse(tone, tone, sr) == pytest.approx(0.0, abs=1e-9)
    # An octave apart: |log 200 - log 100| = log 2 on every voiced frame.
    assert metrics.log_f0_rmse(tone, low, sr) == pytest.approx(np.log(2), rel=0.02)
    assert metrics.duration_ratio(tone[:8000], tone) == 0.5
    cost = np.abs(np.arange(5)[:, None] - np.arange(5)[None]).astype(float)
    assert metrics.dtw_path(cost) == [(i, i) for i in range(5)]
    frames = [[[1, 2], [3, 4]]] * 10      # codec frames count each id
    h = metrics.token_histograms(frames, 5)
    assert h[0].tolist() == [0, 0.25, 0.25, 0.25, 0.25]


def test_vlm_sweep_on_the_bundled_models(tmp_path):
    out = tmp_path / "vlm"
    sweep_main(["--modality", "vlm", "--methods", "plain,exact", "--num-prompts", "4",
                "--batch", "2", "--seeds", "0", "--out", str(out)])
    rows = read_rows(out / "results.jsonl")
    assert len(rows) == 8
    for r in rows:
        assert r["greedy_agreement"] in (0.0, 1.0) and r["answer_accuracy"] in (0.0, 1.0)
    exact = [r for r in rows if r["method"] == "exact"]
    # Greedy speculative decoding is token-identical to plain greedy: agreement 1.
    assert all(r["greedy_agreement"] == 1.0 for r in exact)
    report = (out / "report.md").read_text()
    assert "answer_accuracy" in report and (out / "comparison.png").exists()


def test_a_sweep_evaluates_a_draft_head_given_on_the_command_line(tmp_path):
    """--head: the bundled VLM's EAGLE-3 head as method 'head' beside plain decoding, its
    greedy answers plain greedy's; the head is named in the run's options."""
    out = tmp_path / "head"
    sweep_main(["--modality", "vlm", "--methods", "plain,head", "--num-prompts", "2",
                "--batch", "2", "--seeds", "0", "--out", str(out), "--no-report",
                "--head", os.path.join(ROOT, "samples", "models", "shapes-vlm-eagle3")])
    rows = read_rows(out / "results.jsonl")
    assert {r["method"] for r in rows} == {"plain", "head"}
    assert all(r["greedy_agreement"] == 1.0 for r in rows if r["method"] == "head")
    assert "shapes-vlm-eagle3" in (out / "run.json").read_text()


def test_speech_sweep_on_the_bundled_models(tmp_path):
    out = tmp_path / "speech"
    sweep_main(["--modality", "speech", "--methods", "plain,pcg", "--param", "pcg.theta=0.45",
                "--num-prompts", "2", "--batch", "2", "--seeds", "0", "--out", str(out)])
    rows = read_rows(out / "results.jsonl")
    assert len(rows) == 4
    for r in rows:
        assert 0 < r["mcd"] < 40 and 0.3 < r["duration_ratio"] < 3 and r["code_nll"] >= 0
        assert all(len(frame) == 4 for frame in r["ids"])            # frames of 4 codebooks
    report = (out / "report.md").read_text()
    assert "mcd" in report and "code_nll" in report and (out / "comparison.png").exists()


def test_multigpu_compare_runs_counts_identical_rows(tmp_path):
    from eval.multigpu import NO_MULTICAST, compare_runs

    assert NO_MULTICAST["NCCL_NVLS_ENABLE"] == "0" and os.environ["NCCL_NVLS_ENABLE"] == "0"
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    rows = [dict(key="plain|default|0|0", prompt_index=i, ids=[i, i + 1]) for i in range(3)]
    a.write_text("".join(json.dumps(r) + "\n" for r in rows))
    rows[1]["ids"] = [9]
    b.write_text("".join(json.dumps(r) + "\n" for r in rows[:2]) + json.dumps(
        dict(key="exact|default|0|0", prompt_index=0, ids=[1])) + "\n")
    res = compare_runs(str(a), str(b))
    assert res["common"] == 2 and res["identical_ids"] == 1
    assert res["only_one"] == 1 and res["only_two"] == 1
    assert res["identical_by_unit"] == {"plain|default|0|0": "1/2"}


@pytest.mark.parametrize("fast", [False, True])
def test_multigpu_sweep_runs_both_sweeps_deterministic_unless_told(tmp_path, monkeypatch, fast):
    import eval.multigpu as mg

    calls = []

    def fake_run(cmd, check, env):
        calls.append((cmd, env))
        out = cmd[cmd.index("--out") + 1]
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "results.jsonl"), "w") as f:
            for i in range(2):     # two rows of one unit: its batch's seconds count once
                f.write(json.dumps(dict(key="plain|default|0|0", prompt_index=i, ids=[1, 2],
                                        seconds_batch=1.5)) + "\n")

    monkeypatch.setattr(mg.subprocess, "run", fake_run)
    res = mg.main(["sweep", "--out", str(tmp_path), "--num-prompts", "2"]
                  + (["--fast-kernels"] if fast else []))
    assert len(calls) == 2 and "accelerate.commands.launch" in calls[1][0]
    for cmd, env in calls:
        assert ("--deterministic" in cmd) is not fast
        assert env["NCCL_NVLS_ENABLE"] == "0" and env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    assert res["deterministic"] is not fast and res["identical_ids"] == 2
    assert res["generation_seconds_one"] == res["generation_seconds_many"] == 1.5


def test_methods_on_the_command_line_drop_the_configs_settings_of_other_methods():
    from eval.sweep import resolve

    cfg = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "eval",
                       "configs", "image.yaml")
    assert resolve(["--config", cfg]).param == ["lantern.delta=0.05,0.1,0.2"]
    assert resolve(["--config", cfg, "--methods", "plain,exact"]).param == []
    assert resolve(["--config", cfg, "--methods", "plain,lantern"]).param == ["lantern.delta=0.05,0.1,0.2"]
    # an explicit --param still has to name a chosen method (main refuses it otherwise)
    assert resolve(["--config", cfg, "--methods", "plain", "--param", "gsd.k=2"]).param == ["gsd.k=2"]


def test_an_out_made_with_other_options_is_refused_and_the_report_states_them(tiny_models, tmp_path):
    out = tmp_path / "sweep"
    sweep_main(_args(tiny_models, out))
    report = (out / "report.md").read_text()
    assert "temperature None" in report and "guidance None" in report and "shapes-tiny" in report
    with pytest.raises(ValueError, match=r"other options \(temperature None -> 0.5; "
                                         r"guidance None -> 6.0\)"):
        sweep_main(_args(tiny_models, out, extra=["--temperature", "0.5", "--guidance", "6"]))
    with pytest.raises(ValueError, match=r"batch 2 -> 1"):
        sweep_main(_args(tiny_models, out, extra=["--batch", "1"]))
    sweep_main(_args(tiny_models, out, extra=["--temperature", "0.5", "--overwrite"]))
    rows = read_rows(out / "results.jsonl")
    assert len(rows) == 6 and "temperature 0.5" in (out / "report.md").read_text()


@pytest.mark.parametrize("extra,match", [
    (["--seeds", "3-1"], r"--seeds '3-1': accepted integers and ascending ranges"),
    (["--seeds", "a"], r"--seeds 'a'"),
    (["--methods", "plain,foo"], r"method='foo'"),
    (["--param", "lantern.detla=0.1", "--methods", "plain,lantern"],
     r"unknown parameter\(s\) \['detla'\]"),
    (["--methods", "plain,head"], r"method='head' drafts with a head.*--head FOLDER"),
    (["--head", "no-such-folder", "--methods", "plain,head"],
     r"--head no-such-folder: accepted a folder with a saved head"),
])
def test_bad_options_are_refused_before_any_unit_runs(tiny_models, tmp_path, extra, match):
    out = tmp_path / "bad"
    with pytest.raises(ValueError, match=match):
        sweep_main(_args(tiny_models, out, extra=extra))
    assert not (out / "results.jsonl").exists()


@pytest.mark.parametrize("option,value,match", [
    ("num_prompts", 0, r"--num-prompts=0: accepted an integer >= 1"),
    ("num_prompts", -2, r"--num-prompts=-2: accepted an integer >= 1"),
    ("batch", -1, r"--batch=-1: accepted an integer >= 1"),
    ("batch", 0, r"--batch=0: accepted an integer >= 1"),
    ("temperature", -1, r"--temperature -1: accepted a finite number >= 0"),
])
def test_bad_config_values_are_refused_before_any_unit_runs(tiny_models, tmp_path, option,
                                                            value, match):
    """A YAML config skips argparse's ranges: the sweep checks its options itself."""
    t, d, p = tiny_models
    cfg = tmp_path / "sweep.yaml"
    cfg.write_text(f"{option}: {value}\n")
    out = tmp_path / "bad"
    argv = ["--config", str(cfg), "--model", t, "--draft", d, "--prompts", p, "--methods",
            "plain", "--seeds", "0", "--out", str(out)]
    with pytest.raises(ValueError, match=match):
        sweep_main(argv)
    assert not (out / "results.jsonl").exists()


@pytest.mark.parametrize("flag,value", [("--num-prompts", "0"), ("--batch", "-1"),
                                        ("--temperature", "-1")])
def test_bad_numbers_on_the_command_line_stop_at_parsing(tiny_models, tmp_path, capsys, flag,
                                                        value):
    with pytest.raises(SystemExit) as stop:
        sweep_main(_args(tiny_models, tmp_path / "bad", extra=[flag, value]))
    assert stop.value.code == 2
    assert f"argument {flag}: {value}: accepted" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def test_the_sweep_command_reports_bad_options_in_one_line(tiny_models, tmp_path):
    res = subprocess.run([sys.executable, "-m", "eval.sweep", *_args(tiny_models, tmp_path / "o",
                          extra=["--batch", "0"])], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines() == ["eval.sweep: error: argument --batch: 0: accepted an "
                                               "integer >= 1 (eval.sweep --help lists the flags)"]
