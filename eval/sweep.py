"""Quality versus speedup, across methods, measured side by side in one run.

    python -m eval.sweep --modality image --methods plain,exact,sjd,sjd-maximal,lantern,gsd \\
        --param lantern.delta=0.05,0.1,0.2 --num-prompts 32 --seeds 0-1 --out out/sweep
    python -m eval.sweep --config eval/configs/image.yaml
    accelerate launch --num_processes 2 -m eval.sweep --config eval/configs/image.yaml

Work is split into units (method x setting x seed x chunk of --batch prompts); each unit is
seeded on its own, so a unit gives the same rows whichever process runs it. Every run writes,
under --out:
- results.jsonl: one row per prompt x method x setting x seed (timings, NFE, tokens per step,
  acceptance histogram, quality metrics, seed, generated ids);
- summary.csv and report.md (see eval/report.py): medians and spreads over prompts, the
  analytic speedup bound next to the measured speedup, quality deltas against plain decoding
  with bootstrap confidence intervals, and a pass/fail distribution check for each lossless
  method;
- plots: quality versus speedup with the Pareto front, acceptance by draft position,
  tokens-per-step histograms, and a grid comparing methods at the same seed.
An interrupted sweep resumes from results.jsonl (finished units are skipped). With several
processes (accelerate), units are dealt round-robin, each process appends to its own file,
and the main process merges and writes the report.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import math
import os
import sys

import torch
from tqdm.auto import tqdm

from eval.results import read_rows
from eval.tasks import TASKS, load_prompts, resolve_models
from mmspec.checks import check_count
from mmspec.registry import parse_method
from recipes.cli import (COUNT, GUIDANCE, TEMPERATURE, Device, Interrupted, Parser, check_device,
                         check_head, check_vocab, describe, run)


def parse_seeds(text: str) -> list[int]:
    """``"0-3"``, ``"0,5"``, ``"0-2,7"`` -> seeds; anything else raises naming --seeds."""
    out = []
    try:
        for part in str(text).split(","):
            if "-" in part.strip()[1:]:
                a, b = (int(x) for x in part.split("-"))
                if b < a:
                    raise ValueError
                out.extend(range(a, b + 1))
            elif part.strip():
                out.append(int(part))
    except ValueError:
        raise ValueError(f"--seeds {text!r}: accepted integers and ascending ranges, e.g. 0-3 "
                         "or 0,5") from None
    if not out:
        raise ValueError(f"--seeds {text!r}: accepted at least one seed")
    return out


def _value(v: str):
    for cast in (int, float):
        try:
            return cast(v)
        except ValueError:
            pass
    return v


def parse_params(items: list[str]) -> dict[str, dict[str, list]]:
    """["lantern.delta=0.05,0.1", "sjd.window=16"] -> {"lantern": {"delta": [0.05, 0.1]}, ...}"""
    grid: dict[str, dict[str, list]] = {}
    for item in items or []:
        if "=" not in item or "." not in item.split("=")[0]:
            raise ValueError(f"--param {item!r}: accepted METHOD.NAME=V1,V2,...")
        key, vals = item.split("=", 1)
        method, name = key.split(".", 1)
        grid.setdefault(method, {})[name] = [_value(v) for v in vals.split(",")]
    return grid


def settings(method: str, grid: dict) -> list[dict]:
    g = grid.get(method, {})
    if not g:
        return [{}]
    names = sorted(g)
    return [dict(zip(names, combo)) for combo in itertools.product(*(g[n] for n in names))]


def setting_id(params: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(params.items())) or "default"


def load_config(path: str) -> dict:
    import yaml

    with open(path) as f:
        cfg = yaml.safe_load(f) or {}
    if not isinstance(cfg, dict):
        raise ValueError(f"{path}: a mapping of option names to values is expected")
    return cfg


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(description="quality-versus-speedup sweep")
    ap.add_argument("--config", help="YAML file with any of these options; the command line wins "
                                     "(default: none)")
    ap.add_argument("--modality", choices=sorted(TASKS), default=None, help="(default: image)")
    ap.add_argument("--model", default=None, help="folder or id (default: the bundled model)")
    ap.add_argument("--draft", default=None,
                    help="draft folder or id (default: the bundled draft with the bundled model)")
    ap.add_argument("--head", default=None,
                    help="a draft head for method 'head' (a folder in any layout "
                         "docs/drafters.md lists; default: none)")
    ap.add_argument("--methods", default=None,
                    help="comma-separated method names (default: plain,exact,sjd,sjd-maximal,"
                         "lantern,gsd)")
    ap.add_argument("--param", action="append", default=None,
                    help="METHOD.NAME=V1,V2, a grid of one method parameter (repeatable; "
                         "default: each method's own values)")
    ap.add_argument("--prompts", default=None,
                    help="file with one prompt per line (default: the task's held-out prompts)")
    ap.add_argument("--num-prompts", type=COUNT, default=None,
                    help="(default: every prompt of the file)")
    ap.add_argument("--seeds", default=None, help="e.g. 0-3 or 0,5 (default: 0)")
    ap.add_argument("--batch", type=COUNT, default=None,
                    help="prompts per generation batch (default: 8)")
    ap.add_argument("--guidance", type=GUIDANCE, default=None, help="(default: the model's)")
    ap.add_argument("--temperature", type=TEMPERATURE, default=None,
                    help="(default: the task's, 1 for images and speech, 0 for the VLM)")
    ap.add_argument("--device", type=Device(), default=None,
                    help="where the models run (default: cuda when available, else cpu)")
    ap.add_argument("--out", default=None, help="output folder (default: out/sweep)")
    ap.add_argument("--overwrite", action="store_true",
                    help="start afresh in an --out made with other options (its rows are "
                         "deleted); without it such a run is refused")
    ap.add_argument("--no-report", action="store_true", help="no report and plots at the end")
    ap.add_argument("--deterministic", action="store_true",
                    help="deterministic GPU kernels where available (CUBLAS_WORKSPACE_CONFIG, "
                         "torch.use_deterministic_algorithms, math attention), at some cost "
                         "in speed")
    return describe(ap)


DEFAULTS = dict(modality="image", methods="plain,exact,sjd,sjd-maximal,lantern,gsd", seeds="0",
                batch=8, out="out/sweep", num_prompts=None, param=[])


def resolve(argv=None) -> argparse.Namespace:
    ap = build_parser()
    args = ap.parse_args(argv)
    cfg = load_config(args.config) if args.config else {}
    for k, v in DEFAULTS.items():
        cfg.setdefault(k, v)
    if args.methods is not None and args.param is None and isinstance(cfg.get("param"), dict):
        # --methods on the command line picks among the config's methods: its settings for
        # the methods left out are dropped (an explicit --param still has to match).
        chosen = {m.strip() for m in args.methods.split(",")}
        cfg["param"] = {m: d for m, d in cfg["param"].items() if m in chosen}
    for k, v in vars(args).items():
        if v is not None and k != "config":
            cfg[k.replace("-", "_")] = v
    known = {a.dest for a in ap._actions}
    unknown = set(cfg) - known
    if unknown:
        raise ValueError(f"unknown option(s) {sorted(unknown)} in the config: accepted {sorted(known)}")
    ns = argparse.Namespace(**{k: cfg.get(k) for k in known if k not in ("help",)})
    if isinstance(ns.param, dict):      # YAML: {lantern: {delta: [0.05, 0.1]}}
        ns.param = [f"{m}.{n}={','.join(map(str, v if isinstance(v, list) else [v]))}"
                    for m, d in ns.param.items() for n, v in d.items()]
    if isinstance(ns.methods, list):
        ns.methods = ",".join(ns.methods)
    return ns


def units(methods, grid, seeds, n_prompts, batch):
    for method in methods:
        for params in settings(method, grid):
            for seed in seeds:
                for chunk in range((n_prompts + batch - 1) // batch):
                    yield dict(method=method, params=params, seed=seed, chunk=chunk)


def unit_key(u: dict) -> str:
    return f"{u['method']}|{setting_id(u['params'])}|{u['seed']}|{u['chunk']}"


def run_unit(task, u: dict, prompts: list, batch: int, profile: bool) -> list[dict]:
    chunk = prompts[u["chunk"] * batch:(u["chunk"] + 1) * batch]
    seed = u["seed"] * 100_003 + u["chunk"]
    res = task.run(chunk, u["method"], u["params"], seed, profile)
    scores = task.score(chunk, res["outputs"])
    st = res["stats"]
    rows = []
    for i, prompt in enumerate(chunk):
        nfe = st.row_nfe[i] if st.row_nfe else 0
        acc = st.row_accepted[i] if st.row_accepted else 0
        drafted = st.row_drafted[i] if st.row_drafted else 0
        tokens = res["tokens"][i]
        row = dict(modality=task.modality, method=u["method"], setting=setting_id(u["params"]),
                   params=u["params"], seed=u["seed"], chunk=u["chunk"], key=unit_key(u),
                   prompt_index=u["chunk"] * batch + i, prompt=prompt if isinstance(prompt, (str, int)) else str(prompt),
                   batch=len(chunk), seconds_batch=res["seconds"], batch_steps=st.steps,
                   seconds_prefill=st.seconds_prefill,
                   seconds_draft=st.seconds_draft, seconds_verify=st.seconds_verify,
                   seconds_accept=st.seconds_accept,
                   nfe=nfe, tokens=len(tokens) if isinstance(tokens, list) else None,
                   tokens_per_step=(len(tokens) / nfe) if nfe and isinstance(tokens, list) else None,
                   drafted=drafted, accepted=acc,
                   acceptance=acc / drafted if drafted else None,
                   histogram=st.row_histogram[i] if st.row_histogram else [],
                   accepted_by_position=st.accepted_by_position,
                   drafted_by_position=st.drafted_by_position,
                   ids=tokens)
        row.update(scores[i])
        rows.append(row)
    return rows


def set_deterministic() -> None:
    """Towards bitwise-reproducible GPU runs: cuBLAS with a fixed workspace (set before its
    first use), deterministic algorithms where PyTorch has them (a warning where it has not),
    attention through the math kernel. Measured on two H200s: without it, plain sampling of
    the bundled image model repeated in one process gave identical ids in 37-43 of 50 rows (a
    fixed-shape forward was bitwise identical; the fused attention kernels over a growing cache
    are what varied); with it, 50/50, and a 600-row sweep gave identical ids on one GPU and
    across two processes (docs/benchmarks.md, "Several GPUs")."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False
    for name in ("enable_flash_sdp", "enable_mem_efficient_sdp", "enable_cudnn_sdp"):
        if hasattr(torch.backends.cuda, name):
            getattr(torch.backends.cuda, name)(False)


def check_options(args) -> list[str]:
    """Every option checked before any model loads; returns the methods (plain first)."""
    if args.modality not in TASKS:
        raise ValueError(f"--modality {args.modality!r}: accepted one of {', '.join(TASKS)}")
    if args.num_prompts is not None:
        check_count("--num-prompts", args.num_prompts)
    check_count("--batch", args.batch)
    parse_seeds(args.seeds)
    for name in ("temperature", "guidance"):
        v = getattr(args, name)
        if v is not None and not (math.isfinite(v) and v >= 0):
            raise ValueError(f"--{name} {v!r}: accepted a finite number >= 0")
    check_device(args.device)
    if args.head is not None and not os.path.isfile(os.path.join(args.head, "config.json")):
        raise ValueError(f"--head {args.head}: accepted a folder with a saved head")
    check_head(args.head)
    methods = [m.strip() for m in str(args.methods).split(",") if m.strip()]
    if not methods:
        raise ValueError(f"--methods {args.methods!r}: accepted one or more method names")
    return methods if "plain" in methods else ["plain"] + methods   # the baseline


def check_methods(methods: list[str], grid: dict, has_draft: bool, has_head: bool = False) -> None:
    """Every method and setting parsed (unknown names and parameters raise) before any unit."""
    for m in grid:
        if m not in methods:
            raise ValueError(f"--param for {m!r}, which is not among --methods {methods}")
    for method in methods:
        for params in settings(method, grid):
            parse_method(method, params, has_draft=has_draft, has_head=has_head)


def check_image_settings(model, methods, grid, prompts) -> None:
    """Image targets: every setting's sizes against the codebook and an image's tokens, the
    prompts against the bundled models' words, read from the config files."""
    from modalities.image.pipeline import check_draft_sizes, read_layout

    layout = read_layout(model)
    if layout is None:
        return
    for method in methods:
        for params in settings(method, grid):
            check_vocab(params, layout.vocab_size)
            check_draft_sizes(params, layout.num_tokens)
    layout.check_prompts(prompts)


def check_vlm_prompts(model, methods, grid, prompts) -> None:
    """VLM prompt lines (``modalities.vlm.questions``): their format and images."""
    from modalities.vlm.questions import Question

    for line in prompts:
        try:
            Question.parse(line).check_image()
        except ValueError as e:
            raise ValueError(f"--prompts line {line[:60]!r}: {e}") from None


# What a modality checks from its config files and prompts before its models load
BEFORE_LOADING = {"image": check_image_settings, "vlm": check_vlm_prompts}


def read_prompts(args, task_cls) -> list:
    """The prompts file's lines (the task's own by default); a binary file named in one line."""
    try:
        prompts = load_prompts(args.prompts, task_cls, args.num_prompts)
    except UnicodeDecodeError:
        raise ValueError(f"--prompts {args.prompts}: not a UTF-8 text file: accepted one prompt "
                         "per line") from None
    if not prompts:
        raise ValueError("no prompts: accepted a non-empty --prompts file")
    return prompts


def _model_identity(path) -> str | None:
    if path is None:
        return None
    path = os.path.abspath(str(path))
    if not os.path.isdir(path):
        return path
    size = sum(os.path.getsize(os.path.join(path, f)) for f in sorted(os.listdir(path))
               if f.endswith(".safetensors"))
    return f"{path} ({size} bytes of weights)"


def options_identity(args, model, draft, head, prompts: list) -> dict:
    """The part of ``run_identity`` known before any model loads (all but dtype and device)."""
    digest = hashlib.sha1("\n".join(map(str, prompts)).encode()).hexdigest()[:12]
    return dict(modality=args.modality, model=_model_identity(model),
                draft=_model_identity(draft), head=_model_identity(head),
                prompts=f"{len(prompts)} ({digest})",
                batch=args.batch, temperature=args.temperature, guidance=args.guidance,
                deterministic=bool(args.deterministic))


def run_identity(args, task, prompts: list) -> dict:
    """Every option that changes the rows besides a unit's method, setting and seed: what an
    --out is made with (run.json), and what its report states."""
    known = options_identity(args, task.model_path, task.draft_path, task.head_path, prompts)
    deterministic = known.pop("deterministic")
    return {**known, "dtype": task.dtype, "device": str(task.device),
            "deterministic": deterministic}


def check_out(out: str, identity: dict, overwrite: bool) -> None:
    """Refuse an --out whose rows were made with other options than ``identity``'s (all of
    them, or the part known before loading), naming them; --overwrite starts afresh."""
    results, record = os.path.join(out, "results.jsonl"), os.path.join(out, "run.json")
    if os.path.exists(results) and not overwrite:
        if not os.path.exists(record):
            raise ValueError(f"--out {out}: holds results with no record of the options they "
                             "were made with; accepted another --out, or --overwrite")
        with open(record) as f:
            old = json.load(f)
        diff = [f"{k} {old.get(k)!r} -> {v!r}" for k, v in identity.items() if old.get(k) != v]
        if diff:
            raise ValueError(f"--out {out}: its rows were made with other options "
                             f"({'; '.join(diff)}); accepted the same options, another --out, "
                             "or --overwrite")


def claim_out(out: str, identity: dict, overwrite: bool) -> None:
    """``check_out``, then the options recorded in run.json (--overwrite: old rows deleted)."""
    check_out(out, identity, overwrite)
    record = os.path.join(out, "run.json")
    if overwrite:
        for f in os.listdir(out) if os.path.isdir(out) else []:
            if f.startswith("results") and f.endswith(".jsonl"):
                os.remove(os.path.join(out, f))
    os.makedirs(out, exist_ok=True)
    with open(record, "w") as f:
        json.dump(identity, f, indent=1)


def repair_tail(path: str) -> None:
    """Drop a last line cut by an interrupted write (it would glue onto the next row)."""
    if not os.path.exists(path):
        return
    with open(path, "rb+") as f:
        data = f.read()
        end = data.rfind(b"\n") + 1
        if end < len(data):
            f.truncate(end)
            print(f"{path}: discarded a torn last line ({len(data) - end} bytes, an "
                  "interrupted write); its unit runs again", file=sys.stderr)


def check_run(args) -> tuple:
    """Every check before any model loads; returns (methods, parameter grid, seeds, the
    task's class, prompts)."""
    methods = check_options(args)
    grid = parse_params(args.param)
    seeds = parse_seeds(args.seeds)
    task_cls = TASKS[args.modality]
    model, draft = resolve_models(task_cls, args.model, args.draft)
    check_methods(methods, grid, draft is not None, args.head is not None)
    prompts = read_prompts(args, task_cls)
    if args.modality in BEFORE_LOADING:
        BEFORE_LOADING[args.modality](model, methods, grid, prompts)
    check_out(args.out, options_identity(args, model, draft, args.head, prompts), args.overwrite)
    return methods, grid, seeds, task_cls, prompts


def main(argv=None) -> str:
    args = resolve(argv)
    methods, grid, seeds, task_cls, prompts = check_run(args)
    if getattr(args, "deterministic", False):
        set_deterministic()
    from accelerate import PartialState

    state = PartialState()
    device = args.device
    if device is None and torch.cuda.is_available():
        device = f"cuda:{state.local_process_index}"
    gen = {}
    if args.guidance is not None:
        gen["guidance_scale"] = args.guidance
    if args.temperature is not None:
        gen["temperature"] = args.temperature
    task = task_cls(args.model, args.draft, device=device, head=args.head, **gen)
    identity = run_identity(args, task, prompts)
    if state.is_main_process:
        claim_out(args.out, identity, args.overwrite)
    state.wait_for_everyone()
    main_file = os.path.join(args.out, "results.jsonl")
    my_file = main_file if state.num_processes == 1 else os.path.join(
        args.out, f"results.rank{state.process_index}.jsonl")
    work = list(units(methods, grid, seeds, len(prompts), args.batch))
    try:
        _run_units(task, work, prompts, args, state, main_file, my_file, device)
    except KeyboardInterrupt:
        raise Interrupted(f"{len(read_rows(my_file))} rows kept in {my_file}; the same command "
                          "runs the units left") from None
    state.wait_for_everyone()
    if state.is_main_process:
        _merge(args, state, work, main_file)
        if not args.no_report:
            from eval.report import write_report

            write_report(args.out, task, prompts, dict(vars(args), run=identity))
    state.wait_for_everyone()
    return main_file


def _run_units(task, work, prompts, args, state, main_file, my_file, device) -> None:
    """The units this process owns that are not on disk yet, appended a line per row."""
    for path in {main_file, my_file}:
        repair_tail(path)
    # A unit is done when all its rows are on disk (an interruption can cut one in half).
    seen: dict[str, set] = {}
    for r in read_rows(main_file) + (read_rows(my_file) if my_file != main_file else []):
        seen.setdefault(r["key"], set()).add(r["prompt_index"])
    size = lambda u: len(prompts[u["chunk"] * args.batch:(u["chunk"] + 1) * args.batch])  # noqa: E731
    done = {unit_key(u) for u in work if len(seen.get(unit_key(u), ())) == size(u)}
    mine = [u for i, u in enumerate(work) if i % state.num_processes == state.process_index]
    todo = [u for u in mine if unit_key(u) not in done]
    profile = bool(device and str(device).startswith("cuda"))
    with open(my_file, "a") as f:
        for u in tqdm(todo, desc=f"sweep[{state.process_index}]", disable=not state.is_local_main_process):
            for row in run_unit(task, u, prompts, args.batch, profile):
                f.write(json.dumps(row) + "\n")     # one write per row: a cut leaves one torn line
            f.flush()


def _merge(args, state, work, main_file) -> None:
    """Merge the processes' files (several processes) and de-duplicate (resumed units)."""
    merged = {(r["key"], r["prompt_index"]): r for r in read_rows(main_file)}
    ranks = [os.path.join(args.out, f"results.rank{k}.jsonl") for k in range(state.num_processes)]
    for path in ranks if state.num_processes > 1 else []:
        for r in read_rows(path):
            merged[(r["key"], r["prompt_index"])] = r
    order = {unit_key(u): i for i, u in enumerate(work)}
    rows = sorted(merged.values(), key=lambda r: (order.get(r["key"], 1e9), r["prompt_index"]))
    with open(main_file, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    for path in ranks if state.num_processes > 1 else []:
        if os.path.exists(path):
            os.remove(path)


if __name__ == "__main__":
    run(main, "eval.sweep")
