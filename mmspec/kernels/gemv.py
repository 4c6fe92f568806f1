"""One-row matrix products of decode steps (``compile=True`` on CUDA): a Triton kernel.

At one row a linear layer is a matrix-vector product, bound by reading its weight. Inductor
lowers it to a reduction tuned by coordinate descent and fused with its neighbours; in a 7B
Llama step on an H200 (copy rate 4.25 TB/s) the q/k/v reductions, fused with the value
cache's write, read their weights at 3.0-3.9 TB/s and the down projection's at 2.9-4.0,
depending on the compilation's tuning. With this kernel a layer's four products read 3.86
TB/s in all and the step alone takes 3.85 ms against 3.87-4.25 (``python -m
eval.step_kernels``; docs/benchmarks.md). It reads a span of back-to-back weights
(``grouping``: q/k/v; an MLP's gate/up, gated) or one weight at one row, with the residual
add that follows it.

Terms:
    x         the input [..., K], one row in all (the leading dimensions' product is 1).
    w         the weight [N, K] (row-major), b its bias [N] or None.
    residual  None, or a tensor like y added to it (a decoder layer's ``residual + out``).
    y         [..., N] = x w^T + b (+ residual), rounded to x's dtype before the residual is
              added, as the unfused layers round.
    gated     w (and b) hold two halves, gate then up, [2H, K]: y [..., H] = silu(gate) * up
              (an MLP's ``act(gate(x)) * up(x)``), each product and the silu rounded to x's
              dtype first.
    norm      None, or an RMSNorm's weight [K] (and ``eps``): the product is of ``rms_norm(x,
              norm, eps)``: each program reduces ``norm * x`` and x's squares alongside (it
              reads all of x anyway) and scales its sums by rsqrt(mean square + eps) at the
              end. The normed x is not rounded to its dtype before the product, as the
              unfused RMSNorm rounds it: in bf16 the last bits differ from the unfused
              layers' (as inductor's fusions make them differ). The step has no norm kernel.
    ROPE      (``mmspec.kernels.qkv_rope``) w a q/k/v span; N pairs of rows (j, j + D/2) of each
              head, reduced together as gate and up are; the epilogue rotates the q and k
              pairs by cos/sin and stores q to y, k and v into the cache's slot ``pos``.

Each program reduces BLOCK_N rows of w (of both halves when gated) over K in BLOCK_K tiles,
accumulating in float32, and writes its rows of y: no atomics, the same bits on every call.
Launch settings are tuned per (N, K, gated, normed, rotary) on the first call (``triton.autotune``,
among six of one to four rows per program and tiles of 1,024 to 4,096 columns: on a 7B step
on one H200 the down product took two rows in 1,024-column tiles, the others one or two rows
in tiles of all 4,096 columns). On GPUs with programmatic dependent launch (Hopper and
later) the kernel is launched with it, as inductor launches its own under
``triton.enable_pdl``: each program loads its first tile of w (which no kernel of the step
writes) before it waits for the kernel before it, so with tiles as wide as K a program's
whole share of the weight is in flight while that kernel finishes; it lets the next launch
once its loads are done.

``row_product(x, w, b, residual, gated, norm, eps)`` is the custom op
``torch.ops.mmspec.row_product`` (a fake implementation for tracing, the kernel on CUDA,
``F.linear`` elsewhere); ``grouping``'s graph pass puts it in place of one-row linear calls.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F


def rms_norm(h: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Transformers' RMSNorm (Llama, Qwen2, Mistral ...): ``weight * (h * rsqrt(mean(h^2) +
    eps)).to(h.dtype)``, the statistics in float32."""
    h32 = h.float()
    return weight * (h32 * torch.rsqrt(h32.pow(2).mean(-1, keepdim=True) + eps)).to(h.dtype)


def _reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None,
               residual: torch.Tensor | None, gated: bool = False,
               norm: torch.Tensor | None = None, eps: float = 0.0) -> torch.Tensor:
    y = F.linear(x if norm is None else rms_norm(x, norm, eps), w, b)
    if gated:
        gate, up = y.chunk(2, dim=-1)
        y = F.silu(gate) * up
    return y if residual is None else y + residual


@torch.library.custom_op("mmspec::row_product", mutates_args=())
def row_product(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None,
                residual: torch.Tensor | None, gated: bool, norm: torch.Tensor | None = None,
                eps: float = 0.0) -> torch.Tensor:
    """y = x w^T + b (+ residual), or silu(gate) * up; x RMS-normed first when ``norm`` is
    given (module docstring)."""
    if x.device.type != "cuda" or x.numel() != x.shape[-1]:
        return _reference(x, w, b, residual, gated, norm, eps)
    return launch(x, w, b, residual, gated, norm=norm, eps=eps)


@row_product.register_fake
def _(x, w, b, residual, gated, norm=None, eps=0.0):
    return x.new_empty(*x.shape[:-1], w.shape[0] // 2 if gated else w.shape[0])


def launch(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None,
           residual: torch.Tensor | None, gated: bool = False, pdl: bool | None = None,
           norm: torch.Tensor | None = None, eps: float = 0.0) -> torch.Tensor:
    """The kernel on one row (also on the CPU under ``TRITON_INTERPRET=1``, without PDL)."""
    import triton

    n, k = w.shape[0] // 2 if gated else w.shape[0], w.shape[1]
    if pdl is None:
        pdl = x.device.type == "cuda" and torch.cuda.get_device_capability(x.device)[0] >= 9
    y = x.new_empty(*x.shape[:-1], n)
    on = torch.cuda.device(x.device) if x.device.type == "cuda" else contextlib.nullcontext()
    with on:                              # Triton launches on the current device's stream
        _kernel()[lambda meta: (triton.cdiv(n, meta["BLOCK_N"]),)](
            x.contiguous(), w.contiguous(), y if b is None else b,
            y if residual is None else residual.contiguous(), y if norm is None else norm, y,
            y, y, y, y, y, 0, 0, 0, 0, n, eps, K=k, HAS_BIAS=b is not None,    # no rotary
            HAS_RESIDUAL=residual is not None,
            GATED=gated, NORM=norm is not None, PDL=pdl, launch_pdl=pdl)
    return y


def _kernel():
    """The autotuned kernel (``mmspec.kernels.row_kernel``: importing it imports Triton)."""
    from .row_kernel import row_product_kernel

    return row_product_kernel
