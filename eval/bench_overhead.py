"""The engine's own cost per draft token, without the model: a session over a stub network.

    python -m eval.bench_overhead            # CPU; --device cuda on a GPU

A ``CausalLMSession`` on the static-cache path drafts K tokens greedily through
``ModelDrafter`` while its network is replaced by a function that returns fixed logits, so
what is timed is everything mmspec does around a forward: sequence plan, the 4-D mask,
sampling, bookkeeping, the commit. Prints microseconds per draft token (best of ``--repeats``).
"""

from __future__ import annotations

import argparse
import time
import types

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import mmspec
from mmspec.drafters import ModelDrafter
from mmspec.session import CausalLMSession


def overhead_us(device: str = "cpu", k: int = 8, tokens: int = 400, vocab: int = 32000) -> float:
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, pad_token_id=0)
    model = LlamaForCausalLM(cfg).to(device).eval()
    s = CausalLMSession(model, mmspec.SamplingParams(temperature=0), static_len=16 + tokens + 2 * k)
    ids = torch.randint(1, vocab, (1, 16), device=device)
    with torch.inference_mode():
        s.prefill(ids, torch.ones_like(ids))
        logits = torch.randn(1, 1, vocab, device=device)
        s.net = lambda **kw: types.SimpleNamespace(logits=logits)
        drafter = ModelDrafter(s, k)
        ones = torch.ones(1, k, dtype=torch.long, device=device)
        rounds = tokens // k
        if device != "cpu":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(rounds):
            drafter.propose(ids[:, -1], 10**9)
            s.commit(k, ones)
        if device != "cpu":
            torch.cuda.synchronize()
    return (time.perf_counter() - t0) / (rounds * k) * 1e6


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args(argv)
    best = min(overhead_us(a.device, a.k) for _ in range(a.repeats))
    print(f"{best:.1f} us of engine time per draft token (K = {a.k}, {a.device}, stub network)")
    return best


if __name__ == "__main__":
    main()
