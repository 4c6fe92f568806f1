"""GPU benchmark of draft trees: a tree step's cost against a chain step's at the same number
of tokens, and tree drafting against chain drafting, at batch 1 and 16, next to the bound.

    python -m eval.bench_trees_gpu --out out/bench_trees        # 7B Llama shape, H100 / H200
    python -m eval.bench_trees_gpu --shape tiny --device cpu    # a smoke run on CPU

Target and draft as ``eval.bench_gpu``: a Llama with random bf16 weights, the draft the
target's first two layers, the target's later layers writing into the residual stream scaled
by ``eps`` (so acceptance is set on purpose and measured). Greedy decoding: trees of top-k
children, verified by the greedy walk; every output is checked token for token against plain
decoding.

- ``step`` rows: one target step over N tokens as a chain and as a tree (the uniform tree of
  two children per node, N = 3, 7, 15, 31), eager, captured under ``compile=True`` or
  captured unfused (``graphs``).
- ``gen`` rows: plain decoding, a chain of K = 4 drafts (``ModelDrafter``) and a tree
  (``TreeDrafter``: depth 4, two children per node, four nodes expanded per level: 22 nodes):
  ms per token, tokens per step, the speedup against plain decoding in the same mode and the
  analytic bound tokens/step x a plain step / (the verification step + the draft's steps:
  K single steps for the chain; for the tree its root step and three frontier steps of
  four tokens), timed on static caches.

On a recurrent target (``--shape qwen3.5-9b``: Gated DeltaNet layers) a tree step is fed as
its root-to-leaf paths (``CausalLMSession.tree_verify``), uncaptured; its draft (the first
layers, recurrent too) takes no tree steps, so only the ``step`` rows are measured.
"""

from __future__ import annotations

import argparse

import torch

import mmspec
from eval.bench_gpu import (COMPILE, SHAPES, build, copy_bandwidth, open_log, set_eps, step_cost,
                            sync, timed)
from mmspec.drafters import TreeDrafter
from mmspec.engine import static_length
from mmspec.sessions import CausalLMSession
from mmspec.tree import Tree
from recipes.cli import COUNT, Names, Number, Numbers, Parser, describe, run

TREE = dict(depth=4, branch=2, width=4)


def tree_step_cost(model, batch, tree_branching, dev, compile, prompt_len=128, reps=20) -> float:
    """Seconds of one target step over a uniform tree (``tree_branching`` per level)."""
    import time

    tree = Tree.uniform(tree_branching, batch, dev)
    n = tree.num_nodes
    s = CausalLMSession(model, mmspec.SamplingParams(temperature=0),
                        static_len=prompt_len + n + 64, compile=compile)
    ids = torch.randint(1, model.config.vocab_size, (batch, prompt_len + n), device=dev)
    empty = torch.ones(batch, 0, dtype=torch.bool, device=dev)
    no_path = torch.zeros(batch, 0, dtype=torch.long, device=dev)      # nothing of the tree kept
    with torch.inference_mode():
        s.prefill(ids[:, :prompt_len], torch.ones_like(ids[:, :prompt_len]))
        tok = ids[:, prompt_len:]
        for _ in range(3):
            s.step(tok, tree=tree)
            s.commit(0, empty, path=no_path)
        sync(dev)
        t0 = time.perf_counter()
        for _ in range(reps):
            s.step(tok, tree=tree)
            s.commit(0, empty, path=no_path)
        sync(dev)
    return (time.perf_counter() - t0) / reps


def tree_drafter(draft, batch, prompt, new, compile):
    width = TreeDrafter.width({f"tree_{k}": v for k, v in TREE.items()})
    sess = CausalLMSession(draft, mmspec.SamplingParams(temperature=0),
                           static_len=static_length(prompt, batch, new, width, holes=True),
                           compile=compile)
    return TreeDrafter(sess, **TREE)


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=list(SHAPES), default="7b", help="model shape")
    ap.add_argument("--device", default="cuda", help="cuda, cuda:1 ... (cpu: eager only)")
    ap.add_argument("--batches", type=Numbers(COUNT), default="1,16", help="rows per call")
    ap.add_argument("--eps", type=Numbers(Number(float, 0)), default="0.02,0.05",
                    help="scale of the draft's dropped layers' residual writes")
    ap.add_argument("--modes", type=Names(("eager", "captured", "graphs")), default="captured",
                    help="eager, captured (compile=True) or graphs (captured, not compiled)")
    ap.add_argument("--new-tokens", type=COUNT, default=128)
    ap.add_argument("--prompt", type=COUNT, default=128, help="prompt tokens")
    ap.add_argument("--out", default="out/bench_trees", help="output folder")
    return describe(ap)


def main(argv=None):
    args = build_parser().parse_args(argv)
    dev = torch.device(args.device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    rows, emit = open_log(args.out)
    target, draft, originals = build(args.shape, dev, dtype)
    emit(dict(kind="setup", device=torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
              dtype=str(dtype).removeprefix("torch."),
              shape=args.shape, copy_tb_s=copy_bandwidth(dev) / 1e12, torch=torch.__version__))
    modes = [m for m in args.modes if dev.type == "cuda" or m == "eager"]
    n, k = args.new_tokens, 4
    for mode in modes:
        cap = COMPILE[mode]
        for b in args.batches:
            for branching in ((2,), (2, 2), (2, 2, 2), (2, 2, 2, 2)):
                nodes = Tree.uniform(branching).num_nodes
                emit(dict(kind="step", mode=mode, batch=b, tokens=nodes,
                          chain_ms=1e3 * step_cost(target, b, nodes, dev, cap),
                          tree_ms=1e3 * tree_step_cost(target, b, branching, dev, cap)))
            mmspec.release_graphs()
    trees = CausalLMSession(draft, mmspec.SamplingParams(temperature=0)).trees
    for eps in args.eps if trees else ():          # a recurrent draft drafts no trees
        set_eps(originals, eps)
        for mode in modes:
            cap = COMPILE[mode]
            for b in args.batches:
                generate_rows(target, draft, b, eps, mode, cap, args, emit, dev, n, k)
                mmspec.release_graphs()
    write_report(args.out, rows)


def generate_rows(target, draft, b, eps, mode, cap, args, emit, dev, n, k):
    ids = torch.randint(2, target.config.vocab_size, (b, args.prompt), device=dev,
                        generator=torch.Generator(device=dev).manual_seed(b))
    gen = dict(attention_mask=torch.ones_like(ids), temperature=0, max_new_tokens=n,
               stop_token_ids=[], compile=cap, static_cache=True)
    nodes = TreeDrafter.made(**TREE)
    c = dict(t1=step_cost(target, b, 1, dev, cap), tk=step_cost(target, b, k + 1, dev, cap),
             tn=step_cost(target, b, nodes + 1, dev, cap), d1=step_cost(draft, b, 1, dev, cap),
             d2=step_cost(draft, b, 2, dev, cap), dw=step_cost(draft, b, TREE["width"], dev, cap))
    plain, t_plain = timed(lambda: mmspec.generate(target, None, ids, **gen), dev)
    emit(dict(kind="gen", mode=mode, eps=eps, batch=b, method="plain",
              ms_per_token=1e3 * t_plain / n))
    chain, t_chain = timed(lambda: mmspec.generate(target, draft, ids, num_draft_tokens=k,
                                                   pipeline=False, **gen), dev)
    tree, t_tree = timed(lambda: mmspec.generate(
        target, input_ids=ids, drafter=tree_drafter(draft, b, args.prompt, n, cap), **gen), dev)
    costs = {"chain": c["tk"] + k * c["d1"],
             "tree": c["tn"] + c["d2"] + (TREE["depth"] - 1) * c["dw"]}
    for name, out, t in (("chain K=4", chain, t_chain), (f"tree {nodes} nodes", tree, t_tree)):
        st = out.stats
        bound = st.tokens_per_step * c["t1"] / costs[name.split()[0]]
        emit(dict(kind="gen", mode=mode, eps=eps, batch=b, method=name,
                  tokens_per_step=st.tokens_per_step, ms_per_token=1e3 * t / n,
                  speedup=t_plain / t, bound=bound, efficiency=t_plain / t / bound,
                  verify_over_step=(c["tk"] if name.startswith("chain") else c["tn"]) / c["t1"],
                  identical=bool(torch.equal(out.sequences, plain.sequences))))


def write_report(out_dir, rows):
    import os

    s = rows[0]
    lines = ["# Draft trees on the GPU", "",
             f"{s['device']}, {s['shape']} shape, {s['dtype']} random weights, torch {s['torch']}.",
             "",
             "| batch | mode | tokens | chain step ms | tree step ms | tree / chain |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        if r["kind"] == "step":
            lines.append(f"| {r['batch']} | {r['mode']} | {r['tokens']} | {r['chain_ms']:.2f} | "
                         f"{r['tree_ms']:.2f} | {r['tree_ms'] / r['chain_ms']:.2f} |")
    lines += ["", "| eps | batch | mode | method | tokens/step | ms/token | speedup | bound | "
              "efficiency | verify / plain step | identical |", "|" + "---|" * 11]
    for r in rows:
        if r["kind"] == "gen":
            f = lambda key: "" if key not in r else (f"{r[key]:.2f}" if isinstance(r[key], float)  # noqa: E731
                                                      else str(r[key]))
            lines.append(f"| {r['eps']} | {r['batch']} | {r['mode']} | {r['method']} | "
                         + " | ".join(f(x) for x in ("tokens_per_step", "ms_per_token", "speedup",
                                                     "bound", "efficiency", "verify_over_step",
                                                     "identical")) + " |")
    with open(os.path.join(out_dir, "report.md"), "w") as fh:
        fh.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    run(main, "eval.bench_trees_gpu")
