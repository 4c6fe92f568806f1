"""Summary, Markdown report and plots from a sweep's results.jsonl (see eval/sweep.py).

Speedup of a unit (method x setting x seed x prompt chunk) = plain seconds / method seconds
for the same prompts and seed, measured in the same run. Its analytic bound uses the unit's
own measurements: (plain prefill + plain steps x plain cost per step) / (method prefill +
method steps x method cost per step),
where a method's cost per step is its measured draft + verify time per step (tokens per step
and the cost ratio, docs/METHODS.md section 1); efficiency = measured / bound is what the engine
loses outside the models' forwards.
"""

from __future__ import annotations

import csv
import json
import os
from collections import defaultdict

import numpy as np

from eval.metrics import bootstrap_ci, fid, fid_delta_ci, paired_delta_ci, token_tv_test
from eval.results import read_rows


def _label(r):
    return r["method"] if r["setting"] == "default" else f"{r['method']}[{r['setting']}]"


def _lossless(method: str, params=None) -> bool:
    """Whether a method (with a setting's parameters) is lossless, rule and drafter together
    (``Method.lossless``): a relaxed one is reported as such, not checked against plain."""
    from mmspec.registry import parse_method

    try:
        return parse_method(method, params, has_draft=True, has_head=True).lossless
    except ValueError:
        return False


def _q(v, q):
    v = [x for x in v if x is not None]
    return float(np.quantile(v, q)) if v else float("nan")


def summarize(rows: list[dict], task, prompts) -> tuple[list[dict], dict]:
    by = defaultdict(list)
    for r in rows:
        by[_label(r)].append(r)
    plain_units = {}
    for r in by.get("plain", []):
        plain_units[(r["seed"], r["chunk"])] = r
    plain_rows = {(r["seed"], r["prompt_index"]): r for r in by.get("plain", [])}
    ref = task.reference_features(prompts) if hasattr(task, "reference_features") else None
    summary, extras = [], {}
    for label, rs in by.items():
        units = {}
        for r in rs:
            units.setdefault((r["seed"], r["chunk"]), r)
        speed, bound, eff = [], [], []
        for key, u in units.items():
            p = plain_units.get(key)
            if p is None:
                continue
            sp = p["seconds_batch"] / u["seconds_batch"]
            t_plain = (p["seconds_draft"] + p["seconds_verify"]) / max(p["batch_steps"], 1)
            t_step = (u["seconds_draft"] + u["seconds_verify"]) / max(u["batch_steps"], 1)
            # The prompt's cost (measured) on both sides: it dominates short outputs (VLM answers).
            pre_p, pre_u = p.get("seconds_prefill", 0.0), u.get("seconds_prefill", 0.0)
            b = ((pre_p + p["batch_steps"] * t_plain) / (pre_u + u["batch_steps"] * t_step)
                 if t_step > 0 else float("nan"))
            speed.append(sp)
            bound.append(b)
            eff.append(sp / b if b == b and b > 0 else float("nan"))
        s = dict(method=label, rows=len(rs), units=len(units),
                 nfe_median=_q([r["nfe"] for r in rs], 0.5),
                 tokens_per_step_median=_q([r["tokens_per_step"] for r in rs], 0.5),
                 tokens_per_step_q25=_q([r["tokens_per_step"] for r in rs], 0.25),
                 tokens_per_step_q75=_q([r["tokens_per_step"] for r in rs], 0.75),
                 acceptance_median=_q([r["acceptance"] for r in rs], 0.5),
                 speedup_median=_q(speed, 0.5), speedup_q25=_q(speed, 0.25),
                 speedup_q75=_q(speed, 0.75), bound_median=_q(bound, 0.5),
                 efficiency_median=_q(eff, 0.5), lossless=_lossless(rs[0]["method"], rs[0].get("params")))
        for m in getattr(task, "quality_metrics", ()):
            vals = [r[m] for r in rs if m in r]
            if not vals:
                continue
            est, lo, hi = bootstrap_ci(vals)
            s[m] = est
            s[f"{m}_ci"] = (lo, hi)
            pairs = [(r[m], plain_rows[(r["seed"], r["prompt_index"])][m]) for r in rs
                     if (r["seed"], r["prompt_index"]) in plain_rows and m in plain_rows[(r["seed"], r["prompt_index"])]]
            if pairs and label != "plain":
                d, dlo, dhi = paired_delta_ci([a for a, _ in pairs], [b for _, b in pairs])
                s[f"{m}_delta"] = d
                s[f"{m}_delta_ci"] = (dlo, dhi)
        feats = [r["features"] for r in rs if "features" in r]
        # FID needs more samples than feature dimensions for a usable covariance.
        if ref is not None and len(feats) >= 2 * len(feats[0]) if feats else False:
            s["fid"] = fid(np.array(feats), ref)
            pf = [r["features"] for r in by.get("plain", []) if "features" in r]
            if label != "plain" and len(pf) >= 2:
                d, lo, hi = fid_delta_ci(np.array(feats), np.array(pf), ref, n=100)
                s["fid_delta"] = d
                s["fid_delta_ci"] = (lo, hi)
        if s["lossless"] and label != "plain" and by.get("plain"):
            t = token_tv_test([r["ids"] for r in rs], [r["ids"] for r in by["plain"]], task.vocab)
            s["distribution_check"] = "pass" if t["passed"] else "FAIL"
            s["distribution_tv"] = t["tv"]
            s["distribution_p"] = t["p_value"]
        summary.append(s)
        extras[label] = rs
    return summary, extras


def _first_prompts(summary, by, seed, most: int = 8) -> dict:
    """The comparison's ids: per method, the first prompts (0, 1, ... over every chunk, up to
    ``most``) at the first seed, so a batch smaller than the comparison leaves no tile blank."""
    first = {}
    for s in summary:
        got = {r["prompt_index"]: r["ids"] for r in by[s["method"]] if r["seed"] == seed}
        ids = []
        while len(ids) < most and len(ids) in got:
            ids.append(got[len(ids)])
        if ids:
            first[s["method"]] = ids
    return first


def _fmt(v, nd=2):
    if v is None or (isinstance(v, float) and v != v):
        return "-"
    return f"{v:.{nd}f}"


def write_report(out_dir: str, task, prompts, options: dict) -> dict:
    rows = read_rows(os.path.join(out_dir, "results.jsonl"))
    summary, by = summarize(rows, task, prompts)
    # summary.csv
    keys = sorted({k for s in summary for k in s})
    with open(os.path.join(out_dir, "summary.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for s in summary:
            w.writerow({k: (json.dumps(v) if isinstance(v, tuple) else v) for k, v in s.items()})
    plots = _plots(out_dir, summary, by, task)
    first = _first_prompts(summary, by, rows[0]["seed"])
    if hasattr(task, "visual") and first:
        task.prompts = list(prompts)       # the prompts the ids belong to, in order
        task.visual(first, os.path.join(out_dir, "comparison.png"))
        plots.append("comparison.png")
    qm = [m for m in getattr(task, "quality_metrics", ()) if any(m in s for s in summary)]
    run = options.get("run") or {}
    settings = "; ".join(f"{k} {v}" for k, v in run.items() if k != "modality")
    lines = [f"# {task.modality} sweep", "",
             f"{len(rows)} rows; {len(prompts)} prompts; seeds {options.get('seeds')}; "
             f"methods {options.get('methods')}; {settings or 'settings not recorded'}.", "",
             "Medians over prompt chunks (speedup, bound, efficiency) and prompts (tokens per "
             "step, acceptance), interquartile range in brackets; quality deltas are against "
             "plain decoding at the same prompts and seeds, with 95% bootstrap intervals.", ""]
    head = ["method", "tokens/step", "acceptance", "speedup", "bound", "efficiency"]
    head += [f"{m} (delta)" for m in qm] + (["FID (delta)"] if any("fid" in s for s in summary) else [])
    head += ["lossless check"]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" * len(head))
    for s in summary:
        cells = [s["method"],
                 f"{_fmt(s['tokens_per_step_median'])} [{_fmt(s['tokens_per_step_q25'])}, {_fmt(s['tokens_per_step_q75'])}]",
                 _fmt(s["acceptance_median"], 3),
                 f"{_fmt(s['speedup_median'])}x [{_fmt(s['speedup_q25'])}, {_fmt(s['speedup_q75'])}]",
                 f"{_fmt(s['bound_median'])}x", _fmt(s["efficiency_median"])]
        for m in qm:
            if m in s:
                d = s.get(f"{m}_delta")
                ci = s.get(f"{m}_delta_ci")
                cells.append(f"{_fmt(s[m], 3)}" + (f" ({d:+.3f} [{ci[0]:+.3f}, {ci[1]:+.3f}])" if d is not None else ""))
            else:
                cells.append("-")
        if any("fid" in x for x in summary):
            if "fid" in s:
                d, ci = s.get("fid_delta"), s.get("fid_delta_ci")
                cells.append(f"{_fmt(s['fid'])}" + (f" ({d:+.2f} [{ci[0]:+.2f}, {ci[1]:+.2f}])" if d is not None else ""))
            else:
                cells.append("-")
        if s["method"] == "plain":
            cells.append("(baseline)")
        elif s["lossless"]:
            cells.append(f"{s.get('distribution_check', '-')} (TV {_fmt(s.get('distribution_tv'), 4)}, "
                         f"p {_fmt(s.get('distribution_p'), 3)})")
        else:
            cells.append("relaxed")
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Lossless check: permutation test of the token distribution against plain "
              "decoding (whole samples exchanged; pass when p > 0.01).", ""]
    lines += [f"![{p}]({p})" for p in plots]
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return dict(summary=summary, plots=plots)


def _cuda():
    import torch

    return torch.cuda.is_available()


def _ragged_sum(arrays) -> np.ndarray:
    """Element-wise sum of 1-D sequences of different lengths (zero-padded)."""
    out = np.zeros(max((len(a) for a in arrays), default=0))
    for a in arrays:
        out[: len(a)] += np.asarray(a, float)
    return out


def _plots(out_dir, summary, by, task) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []

    def save(fig, ax, name, xlabel, ylabel):
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, name), dpi=110)
        plt.close(fig)
        made.append(name)

    qm = next((m for m in getattr(task, "quality_metrics", ()) if any(m in s for s in summary)), None)
    if qm:
        fig, ax = plt.subplots(figsize=(6, 4))
        pts = [(s["speedup_median"], s[qm], s["method"]) for s in summary if qm in s]
        for x, y, name in pts:
            ax.scatter(x, y, s=30)
            ax.annotate(name, (x, y), fontsize=7)
        better = getattr(task, "higher_is_better", {}).get(qm, True)
        front, best = [], -np.inf
        for x, y, _ in sorted(pts, key=lambda p: -p[0]):
            val = y if better else -y
            if val > best:
                front.append((x, y))
                best = val
        if front:
            fx, fy = zip(*sorted(front))
            ax.plot(fx, fy, "k--", lw=1, label="Pareto front")
            ax.legend(fontsize=8)
        ax.set_title(f"{task.modality}: quality versus speedup")
        save(fig, ax, "quality_vs_speedup.png", "measured speedup against plain decoding",
             qm.replace("_", " "))
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, rs in by.items():
        units = {}
        for r in rs:
            units.setdefault(r["key"], r)
        acc = _ragged_sum([u["accepted_by_position"] for u in units.values()])
        dra = _ragged_sum([u["drafted_by_position"] for u in units.values()])
        if dra.sum() > 0:
            acc = np.pad(acc, (0, max(0, len(dra) - len(acc))))[: len(dra)]
            ok = dra > 0
            ax.plot(np.arange(1, len(dra) + 1)[ok], (acc / np.maximum(dra, 1))[ok],
                    marker="o", ms=3, label=label)
    ax.legend(fontsize=7)
    save(fig, ax, "acceptance_by_position.png", "draft position",
         "acceptance rate (given the earlier drafts were accepted)")
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, rs in by.items():
        h = _ragged_sum([r["histogram"] for r in rs])
        if h.sum() > 0 and len(h) > 1:
            ax.plot(np.arange(1, len(h) + 1), h / h.sum(), marker=".", label=label)
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    save(fig, ax, "tokens_per_step_hist.png", "tokens emitted in a step", "fraction of steps")
    return made
