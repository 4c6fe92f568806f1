"""gpt-fast on ``eval.bench_gpu``'s 7B Llama shape and draft, for side-by-side figures.

    python -m eval.peer_gptfast DIR --eps 0.0,0.05      # DIR: gpt-fast's generate.py, model.py

Run by ``python -m eval.bench_gpu --peer-gptfast DIR`` in a child process (gpt-fast's
generate.py sets inductor flags when imported). DIR is a checkout of pytorch-labs/gpt-fast
that the user fetched (nothing of it is part of mmspec); at 32971d3 its batch-1 speculative
path needs the three one-line fixes listed in docs/benchmarks.md.

The model, the draft and the prompts are ``eval.bench_gpu``'s: its 7B Llama (random bf16
weights, seed 0) is built and its weights moved into gpt-fast's ``Transformer`` at the "7B"
config (32 layers, hidden 4096, vocabulary 32000; the query and key rows reordered from
transformers' half-split rotary layout to gpt-fast's interleaved one, ``interleaved_rows``),
so both sides compute the same function on the same prompt ids and their greedy drafts
are accepted alike. The draft is the first two layers (embeddings, norm and head shared),
the target's layers >= 2 writing into the residual stream scaled by eps. Both are compiled as
gpt-fast's own ``main`` does (``decode_one_token`` and ``model_forward`` with mode
"reduce-overhead", fullgraph). Greedy, batch 1, ``--prompts`` 128-token prompts (one call
each), 128 new tokens; prints JSON lines: ms per generated token of the calls (the prompt
passes included, as ``bench_gpu``'s ``ms_per_token``), tokens per step, and the first
round's seconds (compilation and capture); then, after the calls of every eps, per eps the
compiled steps alone (``step_costs``: the target's one-token step, its K + 1 token
verification, the draft's step), as ``bench_gpu`` times its own.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass

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


def interleaved_rows(w: torch.Tensor, heads: int) -> torch.Tensor:
    """A query or key projection's weight [heads * head_dim, dim] with each head's rows
    reordered from the half-split rotary layout (transformers' ``rotate_half``: pairs (i,
    i + head_dim / 2)) to the interleaved one (gpt-fast's: pairs (2i, 2i + 1))."""
    out, dim = w.shape
    return w.view(heads, 2, out // heads // 2, dim).transpose(1, 2).reshape(out, dim)


def gptfast_state(hf) -> dict:
    """gpt-fast's ``Transformer`` state dict holding a transformers Llama's weights (the same
    tensors, but for the fused q/k/v weights, which are new)."""
    c, m = hf.config, hf.model
    state = {"tok_embeddings.weight": m.embed_tokens.weight, "norm.weight": m.norm.weight,
             "output.weight": hf.lm_head.weight}
    for i, layer in enumerate(m.layers):
        a, f, pre = layer.self_attn, layer.mlp, f"layers.{i}."
        state |= {
            pre + "attention.wqkv.weight": torch.cat([
                interleaved_rows(a.q_proj.weight, c.num_attention_heads),
                interleaved_rows(a.k_proj.weight, c.num_key_value_heads), a.v_proj.weight]),
            pre + "attention.wo.weight": a.o_proj.weight,
            pre + "feed_forward.w1.weight": f.gate_proj.weight,
            pre + "feed_forward.w3.weight": f.up_proj.weight,
            pre + "feed_forward.w2.weight": f.down_proj.weight,
            pre + "attention_norm.weight": layer.input_layernorm.weight,
            pre + "ffn_norm.weight": layer.post_attention_layernorm.weight}
    return {k: v.detach() for k, v in state.items()}


def build(Transformer, ModelArgs, dev):
    """The target (``eval.bench_gpu``'s 7B weights), its first-two-layers draft and the
    target's later layers' write weights."""
    from .bench_gpu import build as build_hf

    hf = build_hf("7b", torch.device(dev), torch.bfloat16)[0]   # its draft and copies let go
    args = ModelArgs.from_name("7B")
    args = ModelArgs(**{**vars(args), "norm_eps": hf.config.rms_norm_eps})
    with torch.device("meta"):
        target = Transformer(args)
    target.load_state_dict(gptfast_state(hf), assign=True)
    del hf
    with torch.device(dev):
        draft = Transformer(ModelArgs(**{**vars(args), "n_layer": 2})).to(torch.bfloat16)
    draft.tok_embeddings, draft.norm = target.tok_embeddings, target.norm
    draft.output = target.output
    for mine, theirs in zip(draft.layers, target.layers):   # copies: each keeps its own cache
        mine.load_state_dict(theirs.state_dict())
    target.eval()
    draft.eval()
    writes = [(layer.attention.wo.weight, layer.feed_forward.w2.weight) for layer in target.layers[2:]]
    originals = [(wo.detach().clone(), w2.detach().clone()) for wo, w2 in writes]
    return target, draft, writes, originals


def set_eps(writes, originals, eps: float) -> None:
    with torch.no_grad():
        for (wo, w2), (wo0, w20) in zip(writes, originals):
            wo.copy_(wo0 * eps)
            w2.copy_(w20 * eps)


def timed_calls(G, target, draft, prompts, n, k, repeats):
    """(seconds of each round of one call per prompt, the last round's speculative steps)."""
    times, steps = [], 0
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        stats = [G.generate(target, p, n, batch_size=1, interactive=False, draft_model=draft,
                            speculate_k=k, temperature=0.0, top_k=None)[1] for p in prompts]
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        steps = sum(sum(s["accept_counts"]) for s in stats)
    return times, steps


@dataclass
class StepInputs:
    """What gpt-fast's own loops pass its compiled steps, in the same dtypes, shapes and
    layouts (torch.compile guards on them: other ones would compile the steps anew, a minute
    or two each, and time other compilations than its calls ran): tokens int32 (its
    sampler's), contiguous; the plain loop's position int32 [1]; the draft loop's int64 [1];
    the verification's positions int64 [k + 1]."""

    token: torch.Tensor
    tokens: torch.Tensor
    plain_pos: torch.Tensor
    draft_pos: torch.Tensor
    verify_pos: torch.Tensor

    @classmethod
    def at(cls, k: int, pos: int, dev) -> "StepInputs":
        return cls(token=torch.ones(1, 1, dtype=torch.int, device=dev),
                   tokens=torch.ones(1, k + 1, dtype=torch.int, device=dev),
                   plain_pos=torch.tensor([pos], dtype=torch.int, device=dev),
                   draft_pos=torch.tensor([pos], dtype=torch.int64, device=dev),
                   verify_pos=torch.arange(pos, pos + k + 1, device=dev))


def step_costs(G, target, draft, k: int, pos: int, reps: int = 50) -> dict:
    """Milliseconds of gpt-fast's compiled steps alone at cache position ``pos`` (the caches
    set up by a call): the target's one-token step, its ``k`` + 1 token verification
    (``model_forward``, as ``speculative_decode`` calls it) and the draft's step, each called
    as its loops call it (``StepInputs``; the one-token steps under the math attention its
    ``decode_n_tokens`` selects)."""
    from .bench_gpu import sync

    dev = target.output.weight.device
    x = StepInputs.at(k, pos, dev)

    def one_token(model, position):     # gpt-fast's own (deprecated) context, as its loop
        with torch.backends.cuda.sdp_kernel(enable_flash=False, enable_mem_efficient=False,
                                            enable_math=True):
            return G.decode_one_token(model, x.token, position, temperature=0.0, top_k=None)

    calls = dict(step_ms=lambda: one_token(target, x.plain_pos),
                 verify_ms=lambda: G.model_forward(target, x.tokens, x.verify_pos),
                 draft_step_ms=lambda: one_token(draft, x.draft_pos))
    out = {}
    for name, call in calls.items():
        for _ in range(5):
            call()
        sync(dev)
        t0 = time.perf_counter()
        for _ in range(reps):
            call()
        sync(dev)
        out[name] = 1e3 * (time.perf_counter() - t0) / reps
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", help="gpt-fast checkout")
    ap.add_argument("--eps", default="0.0,0.05", help="comma-separated eps values")
    ap.add_argument("--k", type=int, default=4, help="drafts per step")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--prompts", type=int, default=1,
                    help="random prompts per row (bench_gpu's --prompts: the same prompts)")
    ap.add_argument("--repeats", type=int, default=4, help="calls per row (the first compile)")
    args = ap.parse_args(argv)
    G, Transformer, ModelArgs = load(args.folder)
    dev = "cuda"
    target, draft, writes, originals = build(Transformer, ModelArgs, dev)
    G.decode_one_token = torch.compile(G.decode_one_token, mode="reduce-overhead", fullgraph=True)
    G.model_forward = torch.compile(G.model_forward, mode="reduce-overhead", fullgraph=True)
    from .bench_gpu import prompts as bench_prompts

    # bench_gpu's prompts at batch 1
    prompts = [p[0].int() for p in bench_prompts(32000, 1, args.prompt, args.prompts, dev)]
    n, calls = args.new_tokens, len(prompts)
    eps_values = [float(e) for e in args.eps.split(",")]
    for i, eps in enumerate(eps_values):
        set_eps(writes, originals, eps)
        for d in ((None, draft) if i == 0 else (draft,)):
            times, steps = timed_calls(G, target, d, prompts, n, args.k, args.repeats)
            # gpt-fast's prompt pass emits the first token, its steps the other n - 1 (mmspec's
            # steps emit all n after a prompt pass that emits none)
            per_step = (n - 1) * calls / steps if d is not None else 1.0
            print(json.dumps(dict(
                kind="gptfast-" + ("spec" if d is not None else "plain"), eps=eps, batch=1,
                k=args.k if d is not None else None, prompts=calls,
                ms_per_token=1e3 * min(times[2:]) / (n * calls), tokens_per_step=per_step,
                first_call_s=times[0])), flush=True)
    for eps in eps_values:                 # after every call's row: a cut call keeps them
        set_eps(writes, originals, eps)
        with torch.no_grad():
            costs = step_costs(G, target, draft, args.k, args.prompt + n // 2)
        print(json.dumps(dict(kind="gptfast-steps", eps=eps, batch=1, k=args.k, **costs)),
              flush=True)


if __name__ == "__main__":
    main()
