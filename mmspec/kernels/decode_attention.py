"""Attention of a decode step over a static cache's first W slots (``compile=True`` on CUDA).

A decode step attends a few queries to a cache of a few hundred slots: the work is reading
the slots' keys and values once, and a general attention kernel spends more on its launch
and tiling than on that (cuDNN's flash kernel: 5.9 us per layer of a 7B step at batch 1 on
an H200, for 2 MB of keys and values). Here one Triton program per (row, kv head, split of
the slots) reads its slots once for every query of its kv head.

Terms:
    q      [B, H, n, D]: the step's queries (n <= ``MAX_QUERIES``).
    k, v   [B, Hkv, S, D], [B, Hkv, S, Dv]: the cache; H = G Hkv (grouped-query heads share
           a kv head).
    mask   [B or 1, 1, n, W] additive (0 visible; the dtype's minimum or -inf hidden), W <= S:
           the slots read.
    scale  the scores' factor (default D^-0.5).
    out    [B, n, H, Dv] (the layout transformers' attention functions return) = softmax(scale
           q k^T + mask) v over the first W slots: scores, softmax and sums in float32 (the
           weights rounded to v's dtype for their product with v, as flash attention rounds
           them), the output rounded to q's dtype.

Each program holds the G n queries of its kv head as the rows of one tile, walks its slots in
BLOCK_N blocks with the online softmax (running maximum m, normaliser l, sums acc) and
writes its output; when W needs more than one split (``SPLIT`` slots each), each writes m,
l and acc, and a second kernel combines them (flash-decoding). No atomics: the same bits on
every call. On GPUs with programmatic dependent launch (Hopper and later) both kernels are
launched with it and let the next kernel launch as soon as they start (the decode step's
next kernel, the output projection in ``mmspec.kernels.gemv``, then loads its first weight tiles
while the attention runs on a few of the GPU's multiprocessors).

``attend(q, k, v, mask, scale)`` is the custom op ``torch.ops.mmspec.decode_attention`` (a
fake implementation for tracing, the kernels on CUDA, the reference elsewhere);
``mmspec.engine.attention`` calls it for the steps it ``applies`` to.
"""

from __future__ import annotations

import contextlib
import functools
import math

import torch

MAX_QUERIES = 16        # n per step: a decode step, a chain's or a small tree's verification
MAX_ROWS = 64           # G n per program
SPLIT = 256             # slots per program
BLOCK_N = 64            # slots per block


def applies(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask,
            kwargs: dict) -> bool:
    """Does the kernel compute this call of an attention function: CUDA, a 4-D additive mask
    of one head, at most ``MAX_QUERIES`` queries and ``MAX_ROWS`` per kv head, and none of
    the options it does not implement (dropout, sliding windows, soft-capping, sinks)?"""
    b, h, n, d = query.shape
    hkv = key.shape[1]
    return (query.is_cuda and isinstance(mask, torch.Tensor) and mask.dim() == 4
            and mask.is_floating_point() and mask.shape[1] == 1 and mask.shape[2] == n
            and mask.shape[0] in (1, b) and mask.shape[-1] <= min(key.shape[2], value.shape[2])
            and n <= MAX_QUERIES and h % hkv == 0
            and (h // hkv) * n <= MAX_ROWS and d <= 256
            and query.stride(-1) == key.stride(-1) == value.stride(-1) == mask.stride(-1) == 1
            and not kwargs.get("dropout") and kwargs.get("sliding_window") is None
            and kwargs.get("softcap") is None and kwargs.get("s_aux") is None)


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
              scale: float | None = None) -> torch.Tensor:
    """The same attention by matrix products, in q's dtype: [B, n, H, Dv]."""
    w, g = mask.shape[-1], q.shape[1] // k.shape[1]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    k = k[:, :, :w].repeat_interleave(g, 1)
    v = v[:, :, :w].repeat_interleave(g, 1)
    scores = (q @ k.transpose(-1, -2)) * scale + mask.to(q.dtype)
    return (torch.softmax(scores.float(), -1).to(q.dtype) @ v).transpose(1, 2).contiguous()


@torch.library.custom_op("mmspec::decode_attention", mutates_args=())
def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
           scale: float | None = None) -> torch.Tensor:
    """softmax(scale q k^T + mask) v over the mask's W slots: [B, n, H, Dv] (module
    docstring)."""
    if q.device.type != "cuda":
        return reference(q, k, v, mask, scale)
    return launch(q, k, v, mask, scale)


@attend.register_fake
def _(q, k, v, mask, scale=None):
    b, h, n, _ = q.shape
    return q.new_empty(b, n, h, v.shape[-1])


def launch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
           scale: float | None = None, split: int = SPLIT) -> torch.Tensor:
    """The kernels (also on the CPU under ``TRITON_INTERPRET=1``); ``split``: slots per
    program (a multiple of ``BLOCK_N``)."""
    import triton

    b, h, n, d = q.shape
    hkv, dv, w = k.shape[1], v.shape[-1], mask.shape[-1]
    g = h // hkv
    pdl = q.device.type == "cuda" and torch.cuda.get_device_capability(q.device)[0] >= 9
    split = min(split, triton.cdiv(w, BLOCK_N) * BLOCK_N)     # one split: no empty blocks
    splits = triton.cdiv(w, split)
    scale = d ** -0.5 if scale is None else scale
    out = q.new_empty(b, n, h, dv)
    rows = max(16, triton.next_power_of_2(g * n))
    part = (torch.empty(b, hkv, splits, rows, dv + 2, dtype=torch.float32, device=q.device)
            if splits > 1 else out)
    on = torch.cuda.device(q.device) if q.device.type == "cuda" else contextlib.nullcontext()
    sizes = dict(G=g, N_Q=n, D=d, DV=dv, BLOCK_M=rows, BLOCK_N=BLOCK_N,
                 BLOCK_D=max(16, triton.next_power_of_2(d)),
                 BLOCK_DV=max(16, triton.next_power_of_2(dv)), IEEE=q.dtype == torch.float32)
    with on:
        _attend()[(b * hkv, splits)](
            q, k, v, mask, out, part, w, scale * math.log2(math.e), hkv,
            *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
            mask.stride(0) if mask.shape[0] > 1 else 0, mask.stride(2),
            SPLIT=split, SPLITS=splits, num_warps=4, PDL=pdl, launch_pdl=pdl, **sizes)
        if splits > 1:
            _combine()[(b * hkv,)](part, out, hkv, SPLITS=splits, G=g, N_Q=n, DV=dv,
                                   BLOCK_M=rows, BLOCK_DV=sizes["BLOCK_DV"],
                                   BLOCK_S=triton.next_power_of_2(splits), num_warps=4,
                                   PDL=pdl, launch_pdl=pdl)
    return out


@functools.cache
def _attend():
    import triton
    import triton.language as tl

    @triton.jit
    def decode_attention_kernel(q_ptr, k_ptr, v_ptr, m_ptr, o_ptr, part_ptr, W, scale, HKV,
                                sq_b, sq_h, sq_n, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s, sm_b,
                                sm_n, SPLIT: tl.constexpr, SPLITS: tl.constexpr,
                                G: tl.constexpr, N_Q: tl.constexpr, D: tl.constexpr,
                                DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                                BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                                IEEE: tl.constexpr, PDL: tl.constexpr):
        if PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        b, hk, sp = tl.program_id(0) // HKV, tl.program_id(0) % HKV, tl.program_id(1)
        r = tl.arange(0, BLOCK_M)                       # rows: query i of head hk G + g
        g, i = r // N_Q, r % N_Q
        rows = r < G * N_Q
        head = hk * G + g
        rd, rdv = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV)
        # 1. the queries of the kv head, pre-scaled (base-2 exponentials below)
        q = tl.load(q_ptr + b * sq_b + head[:, None] * sq_h + i[:, None] * sq_n + rd[None, :],
                    mask=rows[:, None] & (rd < D)[None, :], other=0.0)
        # 2. the split's slots, block by block, with the online softmax
        m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
        l_i = tl.zeros((BLOCK_M,), tl.float32)
        acc = tl.zeros((BLOCK_M, BLOCK_DV), tl.float32)
        k_base = k_ptr + b * sk_b + hk * sk_h
        v_base = v_ptr + b * sv_b + hk * sv_h
        m_base = m_ptr + b * sm_b + i[:, None] * sm_n
        end = tl.minimum(sp * SPLIT + SPLIT, W)
        for s0 in range(0, SPLIT, BLOCK_N):
            s = sp * SPLIT + s0 + tl.arange(0, BLOCK_N)
            ok = s < end
            k = tl.load(k_base + s[:, None] * sk_s + rd[None, :],
                        mask=ok[:, None] & (rd < D)[None, :], other=0.0)
            if IEEE:
                x = tl.dot(q, tl.trans(k), input_precision="ieee")
            else:
                x = tl.dot(q, tl.trans(k))
            add = tl.load(m_base + s[None, :], mask=rows[:, None] & ok[None, :], other=0.0)
            x = x * scale + add.to(tl.float32) * 1.4426950408889634
            x = tl.where(ok[None, :], x, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(x, 1))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.math.exp2(m_i - m_use)
            p = tl.math.exp2(x - m_use[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            val = tl.load(v_base + s[:, None] * sv_s + rdv[None, :],
                          mask=ok[:, None] & (rdv < DV)[None, :], other=0.0)
            if IEEE:
                acc = acc * alpha[:, None] + tl.dot(p.to(val.dtype), val,
                                                    input_precision="ieee")
            else:
                acc = acc * alpha[:, None] + tl.dot(p.to(val.dtype), val)
            m_i = m_new
        # 3. the output, or the split's m, l and sums for the combining kernel
        if SPLITS == 1:
            o_off = ((b * N_Q + i[:, None]) * (HKV * G) + head[:, None]) * DV + rdv[None, :]
            tl.store(o_ptr + o_off, (acc / l_i[:, None]).to(o_ptr.dtype.element_ty),
                     mask=rows[:, None] & (rdv < DV)[None, :])
        else:
            base = part_ptr + ((tl.program_id(0) * SPLITS + sp) * BLOCK_M + r) * (DV + 2)
            tl.store(base[:, None] + rdv[None, :], acc, mask=(rdv < DV)[None, :])
            tl.store(base + DV, m_i)
            tl.store(base + DV + 1, l_i)

    return decode_attention_kernel


@functools.cache
def _combine():
    import triton
    import triton.language as tl

    @triton.jit
    def decode_combine_kernel(part_ptr, o_ptr, HKV, SPLITS: tl.constexpr, G: tl.constexpr,
                              N_Q: tl.constexpr, DV: tl.constexpr, BLOCK_M: tl.constexpr,
                              BLOCK_DV: tl.constexpr, BLOCK_S: tl.constexpr,
                              PDL: tl.constexpr):
        if PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        b, hk = tl.program_id(0) // HKV, tl.program_id(0) % HKV
        r = tl.arange(0, BLOCK_M)
        g, i = r // N_Q, r % N_Q
        rows = r < G * N_Q
        head = hk * G + g
        rdv = tl.arange(0, BLOCK_DV)
        rs = tl.arange(0, BLOCK_S)
        base = part_ptr + ((tl.program_id(0) * SPLITS + rs[:, None]) * BLOCK_M
                           + r[None, :]) * (DV + 2)                       # [S, M]
        live = (rs < SPLITS)[:, None]
        m = tl.load(base + DV, mask=live, other=float("-inf"))
        m_all = tl.max(m, 0)
        m_use = tl.where(m_all == float("-inf"), 0.0, m_all)
        wgt = tl.math.exp2(m - m_use[None, :])                             # [S, M]
        l_all = tl.sum(wgt * tl.load(base + DV + 1, mask=live, other=0.0), 0)
        acc = tl.zeros((BLOCK_M, BLOCK_DV), tl.float32)
        for s in range(SPLITS):
            row = part_ptr + ((tl.program_id(0) * SPLITS + s) * BLOCK_M + r) * (DV + 2)
            m_s = tl.load(row + DV)
            acc += tl.math.exp2(m_s - m_use)[:, None] * tl.load(
                row[:, None] + rdv[None, :], mask=(rdv < DV)[None, :], other=0.0)
        o_off = ((b * N_Q + i[:, None]) * (HKV * G) + head[:, None]) * DV + rdv[None, :]
        tl.store(o_ptr + o_off, (acc / l_all[:, None]).to(o_ptr.dtype.element_ty),
                 mask=rows[:, None] & (rdv < DV)[None, :])

    return decode_combine_kernel
