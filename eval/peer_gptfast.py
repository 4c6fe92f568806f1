"""gpt-fast on ``eval.bench_gpu``'s 7B Llama shape and draft, for side-by-side figures.

    python -m eval.peer_gptfast DIR --eps 0.0,0.05      # DIR: gpt-fast's generate.py, model.py

Run by ``python -m eval.bench_gpu --peer-gptfast DIR`` in a child process (gpt-fast's
generate.py sets inductor flags when imported). DIR is a checkout of pytorch-labs/gpt-fast
that the user fetched (nothing of it is part of mmspec); at 32971d3 its batch-1 speculative
path needs the three one-line fixes listed in docs/benchmarks.md.

The shape and the draft are ``eval.bench_gpu``'s: gpt-fast's ``Transformer`` at its "7B"
config (32 layers, hidden 4096, vocabulary 32000) with random bf16 weights, the draft its
first two layers (shared embeddings, norm and head), the target's layers >= 2 writing into
the residual stream scaled by eps. Both are compiled as gpt-fast's own ``main`` does
(``decode_one_token`` and ``model_forward`` with mode "reduce-overhead", fullgraph). Greedy,
batch 1, a 128-token prompt, 128 new tokens; prints JSON lines: ms per generated token of the
whole call (the prompt pass included, as ``bench_gpu``'s ``ms_per_token``), tokens per step,
and the first call's seconds (compilation and capture).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch


def load(folder: str):
    """gpt-fast's ``generate`` module and ``Transformer``, ``ModelArgs`` from ``folder``."""
    sys.path.insert(0, folder)
    try:
        import generate
        from model import ModelArgs, Transformer
    except ImportError as e:
        raise ValueError(f"{folder}: accepted a gpt-fast checkout (generate.py, model.py, "
                         f"tokenizer.py): {e}") from None
    return generate, Transformer, ModelArgs


def build(Transformer, ModelArgs, dev):
    """The target, its first-two-layers draft and the target's later layers' write weights."""
    torch.manual_seed(0)
    args = ModelArgs.from_name("7B")
    with torch.device(dev):
        target = Transformer(args).to(torch.bfloat16).eval()
        draft = Transformer(ModelArgs(**{**vars(args), "n_layer": 2})).to(torch.bfloat16).eval()
    with torch.no_grad():
        for name, p in target.named_parameters():
            p.fill_(1.0) if name.endswith("norm.weight") else p.normal_(0.0, 0.02)
        draft.tok_embeddings, draft.norm, draft.output = target.tok_embeddings, target.norm, target.output
        for mine, theirs in zip(draft.layers, target.layers):
            mine.load_state_dict(theirs.state_dict())
    writes = [(layer.attention.wo.weight, layer.feed_forward.w2.weight) for layer in target.layers[2:]]
    originals = [(wo.detach().clone(), w2.detach().clone()) for wo, w2 in writes]
    return target, draft, writes, originals


def set_eps(writes, originals, eps: float) -> None:
    with torch.no_grad():
        for (wo, w2), (wo0, w20) in zip(writes, originals):
            wo.copy_(wo0 * eps)
            w2.copy_(w20 * eps)


def timed_calls(G, target, draft, prompt, n, k, repeats):
    """(seconds of each call, the last call's stats)."""
    times, stats = [], None
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        _, stats = G.generate(target, prompt, n, batch_size=1, interactive=False,
                              draft_model=draft, speculate_k=k, temperature=0.0, top_k=None)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return times, stats


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", help="gpt-fast checkout")
    ap.add_argument("--eps", default="0.0,0.05", help="comma-separated eps values")
    ap.add_argument("--k", type=int, default=4, help="drafts per step")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=4, help="calls per row (the first compile)")
    args = ap.parse_args(argv)
    G, Transformer, ModelArgs = load(args.folder)
    dev = "cuda"
    target, draft, writes, originals = build(Transformer, ModelArgs, dev)
    G.decode_one_token = torch.compile(G.decode_one_token, mode="reduce-overhead", fullgraph=True)
    G.model_forward = torch.compile(G.model_forward, mode="reduce-overhead", fullgraph=True)
    prompt = torch.randint(0, 32000, (args.prompt,), device=dev, dtype=torch.int,
                           generator=torch.Generator(device=dev).manual_seed(1))
    n = args.new_tokens
    for i, eps in enumerate(float(e) for e in args.eps.split(",")):
        set_eps(writes, originals, eps)
        for d in ((None, draft) if i == 0 else (draft,)):
            times, st = timed_calls(G, target, d, prompt, n, args.k, args.repeats)
            steps = sum(st["accept_counts"]) if d is not None else n
            print(json.dumps(dict(
                kind="gptfast-" + ("spec" if d is not None else "plain"), eps=eps, batch=1,
                k=args.k if d is not None else None, ms_per_token=1e3 * min(times[2:]) / n,
                tokens_per_step=n / steps, first_call_s=times[0])), flush=True)


if __name__ == "__main__":
    main()
