"""Scale-out on one host with several GPUs: the data-parallel sweep and a sharded target.

    python -m eval.multigpu sweep --config eval/configs/image.yaml --num-prompts 100 \\
        --methods plain,exact,sjd --out out/multigpu-sweep
    python -m eval.multigpu sharded --shape 1b --out out/multigpu-sharded

``sweep`` runs ``python -m eval.sweep`` on one GPU and ``accelerate launch --num_processes N
-m eval.sweep`` on N GPUs with the same options, times both, and checks that every row
(method x setting x seed x prompt) generated the same ids in both runs. Both runs get
``--deterministic`` (math attention, deterministic cuBLAS) unless ``--fast-kernels`` is given:
with the fused attention kernels, even two runs on one GPU differ in late tokens.

``sharded`` builds a Llama target (random float32 weights; acceptance is set on purpose as in
eval/bench_gpu.py: layers >= 2 write into the residual stream scaled by ``--eps``, the draft is
a copy of the first two layers with the embeddings, final norm and head), saves it, and loads
it twice: on GPU 0, and with ``device_map="auto"`` across the GPUs (``max_memory`` caps GPU 0
so the layers really are split). The draft stays on GPU 0. Speculative greedy decoding must
give identical tokens in both placements (and equal plain greedy decoding); per-step
milliseconds of plain and speculative decoding are reported for both.

NVLink multicast stays off in every launch (NCCL_NVLS_ENABLE=0,
TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1): this module sets them before
anything starts.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                "NVSHMEM_DISABLE_NVLS": "1"}
os.environ.update(NO_MULTICAST)


def _rows(path: str) -> dict:
    out = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                out[(r["key"], r["prompt_index"])] = r
    return out


def compare_runs(one: str, two: str) -> dict:
    """Rows of two sweeps: how many keys match and how many generated identical ids."""
    a, b = _rows(one), _rows(two)
    common = sorted(set(a) & set(b))
    same = sum(a[k].get("ids") == b[k].get("ids") for k in common)
    by_key: dict = {}
    for k in common:
        tot, eq = by_key.get(k[0], (0, 0))
        by_key[k[0]] = (tot + 1, eq + (a[k].get("ids") == b[k].get("ids")))
    return dict(rows_one=len(a), rows_two=len(b), common=len(common), identical_ids=same,
                identical_by_unit={k: f"{eq}/{tot}" for k, (tot, eq) in sorted(by_key.items())},
                only_one=len(set(a) - set(b)), only_two=len(set(b) - set(a)))


def generation_seconds(path: str) -> float:
    """Seconds spent generating (each unit's batch counted once), summed over a run's rows."""
    units = {r["key"]: r.get("seconds_batch", 0.0) for r in _rows(path).values()}
    return round(sum(units.values()), 1)


def cmd_sweep(a, rest: list[str]) -> dict:
    env = {**os.environ, **NO_MULTICAST}
    out1, out2 = os.path.join(a.out, "one"), os.path.join(a.out, "many")
    if not a.fast_kernels and "--deterministic" not in rest:
        rest = [*rest, "--deterministic"]
    base = ["-m", "eval.sweep", *rest]
    runs = {}
    for name, cmd, out in (
            ("one", [sys.executable, *base, "--out", out1], out1),
            ("many", [sys.executable, "-m", "accelerate.commands.launch", "--num_processes",
                      str(a.processes), "--num_machines", "1", "--mixed_precision", "no",
                      "--dynamo_backend", "no", *base, "--out", out2], out2)):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, env=env)
        runs[name] = time.perf_counter() - t0
        print(json.dumps({"run": name, "seconds": round(runs[name], 1)}), flush=True)
    res = dict(kind="sweep", processes=a.processes, deterministic="--deterministic" in rest,
               seconds_one=round(runs["one"], 1),
               seconds_many=round(runs["many"], 1),
               speedup=round(runs["one"] / runs["many"], 2),
               generation_seconds_one=generation_seconds(os.path.join(out1, "results.jsonl")),
               generation_seconds_many=generation_seconds(os.path.join(out2, "results.jsonl")),
               **compare_runs(os.path.join(out1, "results.jsonl"),
                              os.path.join(out2, "results.jsonl")))
    return res


def cmd_sharded(a) -> dict:
    import torch
    from transformers import LlamaForCausalLM

    import mmspec
    from eval.bench_gpu import build, set_eps

    n = torch.cuda.device_count()
    if n < 2:
        raise SystemExit(f"sharded needs at least 2 CUDA devices, found {n}")
    dev0 = torch.device("cuda:0")
    target, draft_view, originals = build(a.shape, torch.device("cpu"), torch.float32)
    set_eps(originals, a.eps)
    path = a.work                      # weights stay out of --out (it holds results only)
    target.save_pretrained(path)
    # The draft: its own copy of the first two layers, embeddings, final norm and head.
    import copy

    draft = copy.deepcopy(draft_view).to(dev0).eval()
    del target, draft_view, originals
    size_gb = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path)) / 1e9

    torch.manual_seed(0)
    ids = torch.randint(1, 32000, (a.batch, a.prompt), device=dev0)
    res = dict(kind="sharded", shape=a.shape, dtype="float32", weights_gb=round(size_gb, 2),
               eps=a.eps, batch=a.batch, k=a.k, new_tokens=a.new_tokens)

    def run(model, tag):
        out = {}
        for name, dr in (("plain", None), ("spec", draft)):
            torch.cuda.synchronize()
            mmspec.generate(model, dr, ids, num_draft_tokens=a.k, max_new_tokens=8,
                            temperature=0, stop_token_ids=[])          # warm-up
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            g = mmspec.generate(model, dr, ids, num_draft_tokens=a.k, max_new_tokens=a.new_tokens,
                                temperature=0, stop_token_ids=[])
            torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            st = g.stats
            out[name] = g.sequences.cpu()
            res[f"{tag}_{name}_ms_per_step"] = round(1000 * dt / max(1, st.steps), 2)
            res[f"{tag}_{name}_ms_per_token"] = round(1000 * dt / a.new_tokens, 2)
            if dr is not None:
                res[f"{tag}_acceptance"] = round(st.acceptance_rate, 3)
                res[f"{tag}_tokens_per_step"] = round(st.emitted / max(1, st.row_steps), 3)
        return out

    one = LlamaForCausalLM.from_pretrained(path, torch_dtype=torch.float32).to(dev0).eval()
    r1 = run(one, "one_gpu")
    del one
    torch.cuda.empty_cache()
    cap = f"{max(1, int(size_gb * 0.45))}GiB"
    many = LlamaForCausalLM.from_pretrained(path, torch_dtype=torch.float32, device_map="auto",
                                            max_memory={0: cap, **{i: "70GiB" for i in range(1, n)}}).eval()
    placement = {}
    for k, v in many.hf_device_map.items():
        placement[str(v)] = placement.get(str(v), 0) + 1
    res["device_map_modules_per_device"] = placement
    r2 = run(many, "sharded")
    res["spec_equals_plain_one_gpu"] = bool(torch.equal(r1["spec"], r1["plain"]))
    res["sharded_equals_one_gpu_spec"] = bool(torch.equal(r2["spec"], r1["spec"]))
    res["sharded_equals_one_gpu_plain"] = bool(torch.equal(r2["plain"], r1["plain"]))
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sweep", help="one GPU vs N processes (unknown options go to eval.sweep)")
    s.add_argument("--processes", type=int, default=2)
    s.add_argument("--out", default="out/multigpu-sweep")
    s.add_argument("--fast-kernels", action="store_true",
                   help="leave eval.sweep's --deterministic off (fused attention kernels; rows "
                        "then differ between runs, even on one GPU)")
    h = sub.add_parser("sharded", help="a target across GPUs with device_map='auto'")
    h.add_argument("--shape", default="1b")
    h.add_argument("--eps", type=float, default=0.3)
    h.add_argument("--batch", type=int, default=1)
    h.add_argument("--prompt", type=int, default=64)
    h.add_argument("--k", type=int, default=4)
    h.add_argument("--new-tokens", type=int, default=64)
    h.add_argument("--out", default="out/multigpu-sharded")
    h.add_argument("--work", default="/tmp/mmspec-sharded-target", help="where the weights go")
    a, rest = ap.parse_known_args(argv)
    os.makedirs(a.out, exist_ok=True)
    if a.cmd == "sharded" and rest:
        ap.error(f"unknown options {rest}")
    res = cmd_sweep(a, rest) if a.cmd == "sweep" else cmd_sharded(a)
    print(json.dumps(res), flush=True)
    with open(os.path.join(a.out, f"{a.cmd}.json"), "w") as f:
        json.dump(res, f, indent=1)
    return res


if __name__ == "__main__":
    main()
