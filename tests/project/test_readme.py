"""Every Python code block of README.md runs as written (from the repository's root, on the
bundled models), and README stays a quickstart."""

from __future__ import annotations

import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = open(os.path.join(ROOT, "README.md")).read()
BLOCKS = re.findall(r"```python\n(.*?)```", README, re.S)


def test_readme_is_a_quickstart():
    assert len(README.splitlines()) < 170
    assert "make demo" in README and "make test" in README and len(BLOCKS) >= 4


@pytest.mark.parametrize("i", range(len(BLOCKS)))
def test_readme_code_block_runs(i, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    code = BLOCKS[i].replace('"out/tts"', repr(str(tmp_path / "tts"))).replace(
        '"red_circle.png"', repr(str(tmp_path / "red_circle.png")))
    exec(compile(code, f"README.md block {i}", "exec"), {"__name__": "readme"})
