"""Shared fixtures: tiny models built from configs (no downloads)."""

from __future__ import annotations

import os

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

if os.environ.get("PYTEST_XDIST_WORKER"):     # one thread per worker: the workers share the cores
    torch.set_num_threads(1)


def tiny_llama(vocab: int = 16, hidden: int = 32, layers: int = 2, heads: int = 2, seed: int = 0,
               max_positions: int = 256, scale: float = 1.0, dtype=torch.float32) -> LlamaForCausalLM:
    """A random tiny Llama; ``scale`` multiplies the output head (sharper or flatter p)."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=heads, max_position_embeddings=max_positions,
                      pad_token_id=0, bos_token_id=None, eos_token_id=None,
                      tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).to(dtype).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    return model


def hopper_ptx(kernel, signature: dict, constants: dict, num_warps: int = 4) -> str:
    """A Triton kernel compiled for Hopper (sm_90) on a machine without a GPU, through PTX to a
    cubin (Triton's bundled ptxas): what a launch there would compile, so type errors the
    interpreter lets through and register overflows fail here. Returns the PTX."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if isinstance(kernel, triton.runtime.Autotuner):
        kernel = kernel.fn
    src = ASTSource(kernel,
                    {**signature, **{name: "constexpr" for name in constants}}, constants)
    out = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                         options={"num_warps": num_warps, "num_stages": 2})
    assert out.asm["cubin"]
    return out.asm["ptx"]


def row_kernel_for_hopper(dtype: str, settings: list[dict]) -> None:
    """``mmspec.kernels.gemv``'s row kernel compiled for Hopper (``hopper_ptx``) with ``settings[0]``
    in every launch setting it tunes among, and with each of ``settings`` in the first:
    under PDL each program's first weight loads come before its wait on the kernel before
    it; without PDL there is no wait."""
    from mmspec.kernels import gemv, row_kernel

    ptr = "*" + dtype
    sig = {**{name: ptr for name in ("x_ptr", "w_ptr", "b_ptr", "r_ptr", "n_ptr", "y_ptr",
                                     "c_ptr", "s_ptr", "kc_ptr", "vc_ptr")}, "pos_ptr": "*i64",
           **{name: "i32" for name in ("k_head", "k_slot", "v_head", "v_slot", "N")},
           "eps": "fp32"}
    for i, cfg in enumerate(row_kernel.configs()):
        for f in settings if i == 0 else settings[:1]:
            ptx = hopper_ptx(gemv._kernel(), sig, dict(**f, **cfg.kwargs),
                             cfg.num_warps).splitlines()
            waits = [j for j, line in enumerate(ptx) if "griddepcontrol.wait" in line]
            loads = [j for j, line in enumerate(ptx) if "ld.global" in line]
            assert bool(waits) == f["PDL"], (cfg, f)
            assert not waits or loads[0] < waits[0], (cfg, f)


def random_pq(seed: int, v: int, d: int = 3, sharp: float = 2.0, zeros: bool = False):
    """A float64 target p, draft q (``zeros``: a third of q's ids impossible) and [v, d]
    embedding table, for the rules' exact checks."""
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(sharp * torch.randn(v, generator=g, dtype=torch.float64), -1)
    q = torch.softmax(sharp * torch.randn(v, generator=g, dtype=torch.float64), -1)
    if zeros:
        q[torch.randperm(v, generator=g)[: v // 3]] = 0
        q /= q.sum()
    return p, q, torch.randn(v, d, generator=g, dtype=torch.float64)


@pytest.fixture(scope="session")
def pair():
    """A tiny target and a smaller draft over a 16-id vocabulary."""
    return tiny_llama(seed=0), tiny_llama(hidden=16, layers=1, seed=1)


@pytest.fixture
def ragged_prompts():
    """Three left-padded prompts of lengths 3, 5 and 2."""
    ids = torch.tensor([[0, 0, 3, 4, 5], [2, 1, 2, 3, 4], [0, 0, 0, 7, 8]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 1, 1]])
    return ids, mask


def pytest_terminal_summary(terminalreporter):
    """The figures tests record as ``parity`` (``record_property``), printed after the run:
    what the field's own code gave beside mmspec's."""
    lines = [value for reports in terminalreporter.stats.values() for r in reports
             for name, value in getattr(r, "user_properties", ()) if name == "parity"
             and getattr(r, "when", "call") == "call"]
    if lines:
        terminalreporter.section("parity with the field's code")
        for line in lines:
            terminalreporter.write_line(line)


def tiny_qwen35(seed: int = 0, layers: int = 4, vocab: int = 48):
    """A Qwen3.5 text decoder: linear-attention and full-attention layers alternating."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    cfg = Qwen3_5TextConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=2, num_key_value_heads=2, head_dim=16, linear_num_key_heads=2,
        linear_num_value_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
        linear_conv_kernel_dim=4, full_attention_interval=2, max_position_embeddings=256,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, initializer_range=0.3)
    torch.manual_seed(seed)
    return Qwen3_5ForCausalLM(cfg).eval()


def tiny_windowed(seed: int = 0, layers: int = 2, hidden: int = 32):
    """A Gemma 3 text model: a 4-slot sliding-window layer beside a full one, no eos (its own
    ``generate`` stops nowhere)."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(seed)
    cfg = Gemma3TextConfig(hidden_size=hidden, intermediate_size=2 * hidden,
                           num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=1,
                           head_dim=hidden // 2, vocab_size=64, sliding_window=4,
                           max_position_embeddings=128,
                           layer_types=["sliding_attention", "full_attention"][:layers],
                           initializer_range=0.3, tie_word_embeddings=False, pad_token_id=0,
                           bos_token_id=None, eos_token_id=None)
    return Gemma3ForCausalLM(cfg).eval()


def qwen35_prompt():
    """Three ragged, left-padded prompts of ids 3-47 (width 9) and their mask."""
    ids = torch.randint(3, 48, (3, 9), generator=torch.Generator().manual_seed(0))
    ids[0, :3] = 0                                   # left padding: ragged prompts
    ids[2, :5] = 0
    return ids, (ids != 0).long()


def path_to(tree, node: int) -> list[int]:
    """The nodes from the root to ``node`` (row 0's shape), walked up by hand."""
    par, chain = (0,) + tuple(tree.parents[0].tolist()), [node]
    while chain[0]:
        chain.insert(0, par[chain[0]])
    return chain


def attention_inputs(b, h, hkv, n, d, s, w, batch_mask, seed=0, dtype=torch.float32,
                     device="cpu"):
    """Decode attention's inputs: q [b, h, n, d] (strided), k and v [b, hkv, s, d], an
    additive mask over the first w slots (per row with ``batch_mask``)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, n, h, d, generator=g).transpose(1, 2)     # strided, as transformers'
    k, v = torch.randn(2, b, hkv, s, d, generator=g)
    visible = torch.rand(b if batch_mask else 1, 1, n, w, generator=g) < 0.7
    visible[..., 0] = True                                        # every query sees a slot
    mask = torch.where(visible, 0.0, torch.finfo(dtype).min)
    return [t.to(device, dtype) for t in (q, k, v, mask)]
