"""The spine's shape, asserted: imports point one way (mmspec_cli -> eval -> recipes ->
modalities -> mmspec) without circles, functions fit on a screen, the loop and the runner read declared
capabilities instead of probing objects, and the wiring of a call exists once."""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
PACKAGES = ("mmspec", "modalities", "recipes", "eval", "mmspec_cli")
ORDER = {"mmspec": 0, "modalities": 1, "recipes": 2, "eval": 3, "mmspec_cli": 4}


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for pkg in PACKAGES:
        for p in (ROOT / pkg).rglob("*.py"):
            parts = p.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


MODULES = _modules()


def _top_level(tree: ast.Module):
    """The statements a module runs on import (its body, inside ``if`` and ``try`` too)."""
    for node in tree.body:
        yield node
        if isinstance(node, (ast.If, ast.Try)):
            yield from node.body + node.orelse


def _imports(name: str, path: pathlib.Path, lazy: bool = True) -> set[str]:
    """Modules of this repository that ``name`` imports, at any depth (lazy imports too), or
    with ``lazy=False`` on import only."""
    found = set()
    tree = ast.parse(path.read_text())
    for node in (ast.walk(tree) if lazy else _top_level(tree)):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                pkg = pkg[:len(pkg) - node.level + 1]
                base = ".".join(pkg + ([base] if base else []))
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for t in targets:
            while t and t not in MODULES:
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


GRAPH = {m: _imports(m, p) for m, p in MODULES.items()}


def test_packages_import_one_way():
    wrong = sorted((m, t) for m, ts in GRAPH.items() for t in ts
                   if ORDER[t.split(".")[0]] > ORDER[m.split(".")[0]])
    assert not wrong, f"imports against mmspec_cli -> eval -> recipes -> modalities -> mmspec: {wrong}"


def test_the_engine_and_the_kernels_are_a_wing_of_their_own():
    """mmspec/kernels imports nothing else of the package; mmspec/engine only the kernels
    (never a session, a drafter, the loop or a modality): sessions call the engine, not the
    other way round."""
    for m, ts in GRAPH.items():
        if m.startswith("mmspec.kernels"):
            assert all(t.startswith("mmspec.kernels") for t in ts), (m, ts)
        if m.startswith("mmspec.engine"):
            assert all(t.startswith(("mmspec.engine", "mmspec.kernels")) for t in ts), (m, ts)


def _layers(lazy: bool) -> dict[str, int]:
    """Each mmspec module's layer: one above every module it imports (1: imports none of
    mmspec; a package's __init__ re-exporting its own modules is above them)."""
    graph = {m: [t for t in _imports(m, MODULES[m], lazy) if t.startswith("mmspec")
                 and not m.startswith(t + ".")] for m in MODULES if m.split(".")[0] == "mmspec"}
    layer: dict[str, int] = {}

    def of(m):
        if m not in layer:
            layer[m] = 1 + max((of(t) for t in graph[m]), default=0)
        return layer[m]

    return {m: of(m) for m in graph}


def test_import_layers_stay_few():
    """mmspec's layers: at most 10 on import (the engine wing and the sessions' modules are
    imported by name, not through their packages; the head kinds map to drafters at the
    registry), at most 13 with lazy imports."""
    for lazy, most in ((False, 10), (True, 13)):
        layers = _layers(lazy)
        top = max(layers, key=layers.get)
        assert layers[top] <= most, f"{layers[top]} layers (lazy={lazy}), the top: {top}"


def test_no_import_circles():
    """No module reaches itself through imports (a package's __init__ re-exporting its own
    modules is not a circle: edges into a package from inside it are left out)."""
    def edges(m):
        return [t for t in GRAPH[m] if not m.startswith(t + ".")]

    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for t in edges(m):
            if state.get(t) == 1:
                raise AssertionError(f"import circle: {' -> '.join(stack[stack.index(t):] + [t])}")
            if t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(GRAPH):
        if m not in state:
            visit(m)


def _functions(pkgs=("mmspec", "modalities")):
    for pkg in pkgs:
        for p in sorted((ROOT / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(p.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield p.relative_to(ROOT), node


def _code_lines(fn) -> int:
    """A function's lines, its docstring apart (front doors document every parameter)."""
    first = fn.body[0]
    doc = (first.end_lineno - first.lineno + 1 if isinstance(first, ast.Expr)
           and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str) else 0)
    return fn.end_lineno - fn.lineno + 1 - doc


def _triton_kernel(fn) -> bool:
    """A ``@triton.jit`` kernel: one launch, its body kept whole."""
    return any("jit" in ast.unparse(d) for d in fn.decorator_list)


def test_functions_fit_on_a_screen():
    """No function of mmspec/ or modalities/ over 60 lines of code (Triton kernels, and the
    functions that define one, apart: a kernel is one launch)."""
    long = []
    for p, n in _functions():
        kernels = [k for k in ast.walk(n) if isinstance(k, ast.FunctionDef) and _triton_kernel(k)]
        lines = _code_lines(n) - sum(k.end_lineno - k.lineno + 1 for k in kernels)
        if lines > 60:
            long.append(f"{p}:{n.lineno} {n.name} ({lines} lines)")
    assert not long, long


def test_classes_are_small():
    """No class of mmspec/ or modalities/ over 400 lines: a session is a model with its cache
    (its captured steps, recurrent rollback and prompt parts live beside it)."""
    big = [f"{p}:{n.lineno} {n.name} ({n.end_lineno - n.lineno + 1} lines)"
           for pkg in ("mmspec", "modalities") for p in sorted((ROOT / pkg).rglob("*.py"))
           for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.ClassDef)
           and n.end_lineno - n.lineno + 1 > 400]
    assert not big, big


def test_loop_drivers_are_short():
    tree = ast.parse((ROOT / "mmspec" / "loop.py").read_text())
    drivers = {n.name: n.end_lineno - n.lineno + 1 for n in tree.body
               if isinstance(n, ast.FunctionDef) and n.name in ("_synchronised", "_pipelined")}
    assert set(drivers) == {"_synchronised", "_pipelined"}
    assert all(n < 40 for n in drivers.values()), drivers


@pytest.mark.parametrize("module", ["loop", "runner", "engine/plan"])
def test_no_capability_probes_in_the_spine(module):
    """Capabilities are declared on Drafter and Session; the spine never asks getattr/hasattr."""
    tree = ast.parse((ROOT / "mmspec" / f"{module}.py").read_text())
    probes = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call)
              and isinstance(n.func, ast.Name) and n.func.id in ("getattr", "hasattr")]
    assert not probes, f"mmspec/{module}.py lines {probes}"


def _calls(attr: str) -> set[str]:
    """Files of mmspec/ and modalities/ that call ``<anything>.attr(...)`` or ``attr(...)``."""
    where = set()
    for p, fn in _functions():
        for n in ast.walk(fn):
            if isinstance(n, ast.Call):
                f = n.func
                name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
                if name == attr:
                    where.add(str(p))
    return where


def test_the_wiring_of_a_call_exists_once():
    """Front doors go through the runner: only it starts drafters, times the prefill with new
    stats and drains the loop."""
    assert _calls("begin") <= {"mmspec/runner.py", "mmspec/drafters/prefill.py",
                               "mmspec/drafters/ensemble.py"}
    assert _calls("StepStats") <= {"mmspec/runner.py", "mmspec/loop.py"}
    drivers = set()
    for p, _ in _functions():
        for n in ast.walk(ast.parse((ROOT / p).read_text())):
            if not isinstance(n, ast.ImportFrom):
                continue
            names = {a.name for a in n.names}
            if ((n.module or "").endswith("loop") and names & {"stream", "run", "Loop"}) or (
                    n.module in (None, "mmspec") and "loop" in names):
                drivers.add(str(p))
    assert drivers == {"mmspec/runner.py"}, drivers


def test_adapters_do_not_import_the_text_front_door():
    """Engine and sampling policy live in mmspec.engine and mmspec.sampling, not in generate."""
    wrong = sorted(m for m, ts in GRAPH.items() if m.startswith("modalities")
                   and "mmspec.generate" in ts)
    assert not wrong, wrong


def _layout_sections() -> dict[str, str]:
    """docs/DESIGN.md's layout block, by top-level folder: its text."""
    text = (ROOT / "docs" / "DESIGN.md").read_text()
    block = text.split("## Layout", 1)[1].split("```")[1]
    sections: dict[str, list[str]] = {}
    top = None
    for line in block.splitlines():
        if line[:1].strip() and "/" in line.split()[0]:
            top = line.split()[0].rstrip("/")
        if top is not None:
            sections.setdefault(top, []).append(line)
    return {k: "\n".join(v) for k, v in sections.items()}


def test_the_design_map_names_every_core_file_and_only_files_that_exist():
    """docs/DESIGN.md's layout: every file it names exists under its folder, and every file of
    mmspec/, modalities/ and mmspec_vllm/ is named there (a new file updates the map)."""
    import re

    sections = _layout_sections()
    for top, text in sections.items():
        assert (ROOT / top).is_dir(), top
        named = set(re.findall(r"\b\w+\.py\b", text))
        present = {p.name for p in (ROOT / top).rglob("*.py")}
        assert named <= present, (top, sorted(named - present))
        if top in ("mmspec", "modalities"):
            unnamed = sorted(str(p.relative_to(ROOT)) for p in (ROOT / top).rglob("*.py")
                             if p.name != "__init__.py" and p.name not in named)
            assert not unnamed, unnamed
    assert "mmspec_vllm" in sections


def test_the_vllm_plugin_imports_nothing_of_mmspec():
    """vLLM imports the plugin in every process it starts: it must not load mmspec."""
    for p in (ROOT / "mmspec_vllm").rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                     else [])
            assert not any(n.split(".")[0] in PACKAGES for n in names), (p, names)


def test_no_test_module_imports_another():
    """Shared test helpers live in the helper modules (conftest, tiny_*, stats_util,
    rule_checks, jacobi_checks), not in another test file (importing one runs its module again under another
    name and ties two suites together)."""
    tests = ROOT / "tests"
    names = {p.stem for p in tests.rglob("test_*.py")}
    for p in tests.rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            mods = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                    [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            other = [m for m in mods if m in names and m != p.stem]
            assert not other, (p.name, other)


def test_no_speed_switch_is_set_on_a_class_or_module():
    """Speed switches are per call (``mmspec.Engine``'s fields): no file of the package, the
    recipes, the benchmarks or the tests assigns or patches one on a class or a module
    (``Session.row_kernels = False``, ``monkeypatch.setattr(Loop, "fuse", ...)``), and the
    session and loop classes hold none."""
    from dataclasses import fields

    from mmspec.engine import Engine
    from mmspec.loop import Loop
    from mmspec.sessions import CausalLMSession

    names = {f.name for f in fields(Engine)} | {"fuse", "PLAIN_STEPS"}
    assert not [n for n in names if hasattr(CausalLMSession, n) or hasattr(Loop, n)]
    for p in [*(ROOT / "tests").rglob("*.py"), *(ROOT / d for d in PACKAGES)]:
        for f in ([p] if p.is_file() else p.rglob("*.py")):
            for node in ast.walk(ast.parse(f.read_text())):
                hit = (isinstance(node, ast.Assign) and any(
                    t.attr in names and (t.value.id[:1].isupper() or t.value.id == "engine")
                    for t in node.targets
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name))
                    or isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "setattr"
                    and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
                    and node.args[1].value in names)
                assert not hit, (f.relative_to(ROOT), node.lineno)


def test_tests_are_organised_like_the_code():
    """Test files live in folders named as the code's parts (no test at the top of tests/,
    where the shared helpers are)."""
    tests = ROOT / "tests"
    assert not list(tests.glob("test_*.py"))
    folders = {p.parent.name for p in tests.rglob("test_*.py")}
    assert folders == {"core", "engine", "kernels", "drafters", "modalities", "frontdoors",
                       "suites", "project"}, folders
