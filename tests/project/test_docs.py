"""The documentation: every public name has a docstring and a place in the API reference,
the site builds with ``mkdocs build --strict`` (``make docs``), and the code blocks of
docs/extending.md run as written."""

from __future__ import annotations

import importlib
import inspect
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
API = sorted((ROOT / "docs" / "api").glob("*.md"))
ENTRIES = [line[4:].strip() for page in API for line in page.read_text().splitlines()
           if line.startswith("::: ")]
# the modules whose __all__ is the public surface
PUBLIC = ("mmspec", "mmspec.acceptance", "mmspec.drafters", "modalities.image",
          "modalities.image.continuous", "modalities.speech", "modalities.vlm")


def _resolve(path: str):
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _undocumented(obj) -> list[str]:
    """The object itself (a class: its own docstring) and its public methods and properties
    (a docstring of their own or of the method they override)."""
    missing = [] if (obj.__dict__.get("__doc__") if inspect.isclass(obj) else obj.__doc__) \
        else [obj.__qualname__]
    if inspect.isclass(obj):
        for name in vars(obj):
            attr = inspect.getattr_static(obj, name)
            fn = attr.__func__ if isinstance(attr, (classmethod, staticmethod)) else attr
            fn = fn.fget if isinstance(fn, property) else fn
            if name.startswith("_") or not inspect.isfunction(fn) or fn.__doc__:
                continue
            inherited = any(getattr(vars(base).get(name), "__doc__", None)
                            for base in obj.__mro__[1:])
            if not inherited:
                missing.append(f"{obj.__qualname__}.{name}")
    return missing


@pytest.mark.parametrize("path", ENTRIES)
def test_every_documented_name_has_docstrings(path):
    assert not _undocumented(_resolve(path)), f"{path}: public names without a docstring"


@pytest.mark.parametrize("module", PUBLIC)
def test_every_public_name_is_in_the_api_reference(module):
    mod = importlib.import_module(module)
    objs = [getattr(mod, n) for n in mod.__all__]
    paths = {f"{o.__module__}.{o.__qualname__}" for o in objs
             if inspect.isclass(o) or inspect.isfunction(o)}
    assert not paths - set(ENTRIES), f"missing from docs/api/*.md: {sorted(paths - set(ENTRIES))}"


def test_the_check_finds_a_missing_docstring():
    class Documented:
        """A class."""

        def method(self):
            return 1
    assert _undocumented(Documented) == [f"{Documented.__qualname__}.method"]


def test_the_site_builds_strictly(tmp_path):
    """``make docs``: broken links, missing pages and unresolved API entries fail the build."""
    mkdocs = pathlib.Path(sys.executable).parent / "mkdocs"
    res = subprocess.run([str(mkdocs), "build", "--strict", "--quiet", "-d", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    page = (tmp_path / "api" / "core" / "index.html").read_text()
    assert "Speculative decoding of" in page          # generate's docstring, rendered


def test_extending_examples_run(tmp_path):
    """The rule and drafter examples register names, so they run in their own process."""
    text = (ROOT / "docs" / "extending.md").read_text()
    code = "\n\n".join(re.findall(r"```python\n(.*?)```", text, re.S))
    assert "register_rule" in code and "register_drafter" in code
    script = tmp_path / "extending.py"
    script.write_text(code)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    res = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True,
                         text=True, timeout=600, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "lenient" in res.stdout and "tokens/step" in res.stdout
