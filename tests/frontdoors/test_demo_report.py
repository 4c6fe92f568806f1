"""What the demo prints: quality columns with 95% intervals (8 captions, 24 questions and 2
sentences are few, so a lossless method can differ from plain decoding by chance), speech
quality over several seeds, and the thread setting a busy machine needs."""

from __future__ import annotations

import pathlib
import subprocess
import types

import numpy as np
import pytest

from recipes import demo

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent


def test_wilson_interval_against_hand_computed_values():
    lo, hi = demo.wilson(6, 8)                 # p 0.75, n 8, z 1.96
    assert lo == pytest.approx(0.4093, abs=1e-4) and hi == pytest.approx(0.9285, abs=1e-4)
    assert demo.wilson(8, 8)[1] == 1.0 and demo.wilson(0, 24)[0] == 0.0
    assert demo.wilson(8, 8)[0] == pytest.approx(0.6756, abs=1e-4)


def test_bootstrap_interval_of_the_mean_holds_the_mean_and_widens_with_an_outlier():
    calm = [15.4, 14.2, 15.1, 14.2, 14.8, 13.8, 15.3, 14.2]
    lo, hi = demo.bootstrap_mean(calm)
    assert lo < np.mean(calm) < hi and hi - lo < 1.0
    wild = [15.4, 37.5, 19.6, 14.2, 14.8, 14.2, 15.4, 14.2]      # one bad sample
    wlo, whi = demo.bootstrap_mean(wild)
    assert wlo < np.mean(calm) and whi - wlo > 5
    assert demo.bootstrap_mean(wild) == (wlo, whi)                # seeded


def _row(method, quality, ci, **kw):
    return dict(method=method, nfe=10, compression=2.0, tokens_per_step=2.0, acceptance=0.5,
                speedup=1.0, spread=(0.9, 1.1), quality=quality, quality_ci=ci, **kw)


def test_the_tables_print_each_quality_with_its_interval(capsys):
    rows = [_row("plain", 0.75, demo.wilson(6, 8)), _row("sjd", 1.0, demo.wilson(8, 8))]
    for r in rows:
        r["seconds"] = [1.0, 1.1]
    demo.print_image_table(rows, 8)
    out = capsys.readouterr().out
    assert "0.75 (0.41-0.93)" in out and "1.00 (0.68-1.00)" in out and "Wilson" in out
    demo.print_rows([_row("plain", 26.437, (14.6, 38.0))], "MCD (dB)")
    assert "26.437 (14.60-38.00)" in capsys.readouterr().out


def test_speech_quality_counts_every_sentence_at_several_seeds(monkeypatch, tmp_path):
    """The MCD column is the mean over 2 sentences x SPEECH_SEEDS seeds with its interval (it
    was one seed, where one bad plain sample put plain decoding at 26 dB against 15)."""
    import modalities.speech
    import modalities.speech.metrics
    import recipes.train.speech_data
    import recipes.tts

    calls = []

    class Out:
        def __init__(self, seed):
            self.waveforms, self.sample_rate = [np.full(4, float(seed))], 16000
            self.stats = types.SimpleNamespace(drafted=4, accepted=2, steps=3, emitted=6,
                                               row_steps=3)

        def save(self, *a, **k):
            pass

    class FakeTTS:
        head = None

        def __call__(self, text, method, seed, progress=False, **kw):
            calls.append((method, seed, text))
            return Out(seed)

    monkeypatch.setattr(modalities.speech, "TextToSpeech",
                        types.SimpleNamespace(from_pretrained=lambda *a, **k: FakeTTS()))
    monkeypatch.setattr(recipes.train.speech_data, "reference", lambda text: np.zeros(4))
    # the seed-0 sample is bad (30 dB), the others 14 dB
    monkeypatch.setattr(modalities.speech.metrics, "mel_cepstral_distortion",
                        lambda w, r: 30.0 if w[0] == 0 else 14.0)
    monkeypatch.setattr(recipes.tts, "comparison", lambda *a, **k: None)
    rows = demo.tts_demo(str(tmp_path), seed=0)
    plain = rows[0]
    n = 2 * demo.SPEECH_SEEDS
    assert demo.SPEECH_SEEDS >= 4
    assert plain["quality"] == pytest.approx((2 * 30 + (n - 2) * 14) / n)
    lo, hi = plain["quality_ci"]
    assert lo < plain["quality"] < hi and hi - lo > 2
    assert {s for m, s, _ in calls if m == "plain"} == set(range(demo.SPEECH_SEEDS))


def test_make_demo_takes_the_thread_count():
    out = subprocess.run(["make", "-n", "demo", "THREADS=1"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60).stdout
    assert "-m recipes.demo --threads 1" in out
    out = subprocess.run(["make", "-n", "demo"], cwd=ROOT, capture_output=True, text=True,
                         timeout=60).stdout
    assert "--threads" not in out


def test_the_docs_state_the_demos_time_and_the_busy_machine_setting():
    readme, page = (ROOT / "README.md").read_text(), (ROOT / "docs" / "demo.md").read_text()
    assert "make demo THREADS=1" in readme and "make demo THREADS=1" in page
    assert "~3 min" not in readme
