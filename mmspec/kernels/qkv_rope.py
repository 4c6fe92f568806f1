"""A decode step's q/k/v product with the rotary embedding and the cache writes after it, in
one kernel (``compile=True`` on CUDA: ``grouping`` puts it in place of the traced pattern).

In a 7B Llama step the q/k/v product (``gemv.row_product`` over the span) is followed by
two small kernels per layer: the rotary embedding with the key cache's write, and the value
cache's write (1.3 and 1.0 µs on an H200, 74 µs a step). ``gemv``'s kernel with its rotary
epilogue (``ROPE``) reduces the span's rows in pairs (j, j + D/2) of each head, as it reduces
gate and up together, so each program holds both halves the rotation mixes, and writes q
rotated to its output, k rotated and v into the layer's cache slot.

Terms:
    x          the input [..., K], one row in all; ``norm``/``eps`` as in ``gemv``.
    w          the weight [NQ + 2 NK, K]: the q rows, the k rows, the v rows (grouping's
               span); b its bias [NQ + 2 NK] or None.
    D          the head dimension (even); a head's rows j and j + D/2 are a pair.
    cos, sin   the step's rotary tables [D] (transformers' position embeddings at its slot).
    keys, values   the layer's cache [1, KV heads, S, D] (contiguous in D); ``pos`` the slot
               written (a one-element integer tensor: the shared write pointer).
    returns    q rotated [1, NQ / D, 1, D] (transformers' ``q_embed``): q = x w_q^T + b_q
               rounded to x's dtype, then ``q * cos + rotate_half(q) * sin`` in float32,
               rounded once (as inductor's fused rotary rounds); k the same into
               ``keys[0, :, pos]``, v as computed into ``values[0, :, pos]``.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from . import gemv
from .gemv import rms_norm


def rotate(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' ``t * cos + rotate_half(t) * sin`` over the last dimension."""
    half = t.shape[-1] // 2
    return t * cos + torch.cat([-t[..., half:], t[..., :half]], -1) * sin


def _reference(x, w, b, norm, eps, cos, sin, keys, values, pos, nq: int, head_dim: int):
    nk = (w.shape[0] - nq) // 2
    y = F.linear(x if norm is None else rms_norm(x, norm, eps), w, b)
    q, k, v = (t.reshape(1, -1, 1, head_dim) for t in y.split([nq, nk, nk], -1))
    c, s = cos.reshape(1, 1, 1, head_dim), sin.reshape(1, 1, 1, head_dim)
    keys.index_copy_(2, pos.reshape(1), rotate(k, c, s).to(keys.dtype))
    values.index_copy_(2, pos.reshape(1), v.to(values.dtype))
    return rotate(q, c, s)


@torch.library.custom_op("mmspec::qkv_rope", mutates_args=("keys", "values"))
def qkv_rope(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None,
             norm: torch.Tensor | None, eps: float, cos: torch.Tensor, sin: torch.Tensor,
             keys: torch.Tensor, values: torch.Tensor, pos: torch.Tensor, nq: int,
             head_dim: int) -> torch.Tensor:
    """q rotated; k rotated and v written into ``keys``/``values`` at ``pos`` (module
    docstring)."""
    if x.device.type != "cuda" or x.numel() != x.shape[-1]:
        return _reference(x, w, b, norm, eps, cos, sin, keys, values, pos, nq, head_dim)
    return launch(x, w, b, norm, eps, cos, sin, keys, values, pos, nq, head_dim)


@qkv_rope.register_fake
def _(x, w, b, norm, eps, cos, sin, keys, values, pos, nq, head_dim):
    return x.new_empty(1, nq // head_dim, 1, head_dim)


def check(w: torch.Tensor, nq: int, head_dim: int, keys: torch.Tensor,
          values: torch.Tensor) -> None:
    nk = (w.shape[0] - nq) // 2
    if head_dim % 2 or nq % head_dim or nk % head_dim or w.shape[0] != nq + 2 * nk:
        raise ValueError(f"qkv_rope: w has {w.shape[0]} rows; accepted nq + 2 nk rows, nq and "
                         f"nk multiples of an even head_dim (nq={nq}, head_dim={head_dim})")
    for name, cache in (("keys", keys), ("values", values)):
        if cache.stride(-1) != 1 or cache.shape[-1] != head_dim or cache.shape[0] != 1:
            raise ValueError(f"qkv_rope: {name} {tuple(cache.shape)}; accepted [1, heads, S, "
                             f"{head_dim}] contiguous in its last dimension")


def launch(x, w, b, norm, eps, cos, sin, keys, values, pos, nq: int, head_dim: int,
           pdl: bool | None = None) -> torch.Tensor:
    """``gemv``'s kernel with its rotary epilogue on one row (also on the CPU under
    ``TRITON_INTERPRET=1``, without PDL)."""
    import triton

    check(w, nq, head_dim, keys, values)
    if pdl is None:
        pdl = x.device.type == "cuda" and torch.cuda.get_device_capability(x.device)[0] >= 9
    pairs = w.shape[0] // 2
    y = x.new_empty(1, nq // head_dim, 1, head_dim)
    on = torch.cuda.device(x.device) if x.device.type == "cuda" else contextlib.nullcontext()
    with on:
        gemv._kernel()[lambda meta: (triton.cdiv(pairs, meta["BLOCK_N"]),)](
            x.contiguous(), w.contiguous(), y if b is None else b, y,
            y if norm is None else norm, y, cos.contiguous(), sin.contiguous(), keys, values,
            pos, keys.stride(1), keys.stride(2), values.stride(1), values.stride(2), pairs, eps,
            K=w.shape[1], HAS_BIAS=b is not None, HAS_RESIDUAL=False, GATED=False,
            NORM=norm is not None, PDL=pdl, ROPE=True, NQ=nq, NK=(w.shape[0] - nq) // 2,
            D=head_dim, launch_pdl=pdl)
    return y
