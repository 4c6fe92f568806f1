"""``mmspec.kernels.gemv``'s Triton kernel (imported on its first launch: importing this imports
Triton). Terms as in ``mmspec.kernels.gemv``."""

from __future__ import annotations

import os

import triton
import triton.language as tl


def configs(interpret: bool = False) -> list:
    """Launch settings tuned among (BLOCK_N, BLOCK_K, warps); one under the interpreter."""
    sizes = [(4, 128, 4)] if interpret else [
        (2, 1024, 4), (4, 1024, 4), (2, 2048, 4), (2, 4096, 4), (1, 4096, 8), (2, 4096, 8)]
    return [triton.Config({"BLOCK_N": n, "BLOCK_K": k}, num_warps=warps, num_stages=2)
            for n, k, warps in sizes]


@triton.jit
def _rows(idx, N, ROPE: tl.constexpr, D: tl.constexpr):
    """(row, second row, index within the half head) of each program index: ROPE, N pairs
    (a head's row j and its partner j + D/2); else N rows and the up half's, N further."""
    if ROPE:
        j = idx % (D // 2)
        rn = (idx // (D // 2)) * D + j
        return rn, rn + D // 2, j
    return idx, idx + N, idx


@triton.jit
def _rope_store(y, up, rows, rn, r2, j, y_ptr, c_ptr, s_ptr, kc_ptr, vc_ptr, pos_ptr, k_head,
                k_slot, v_head, v_slot, NQ: tl.constexpr, NK: tl.constexpr, D: tl.constexpr):
    """ROPE's epilogue: both rows rounded, the q and k pairs rotated in float32 (rounded
    once); q to y, k and v into the cache's slot."""
    dtype = y_ptr.dtype.element_ty
    a = y.to(dtype).to(tl.float32)
    b = up.to(dtype).to(tl.float32)
    half = D // 2
    c1 = tl.load(c_ptr + j, mask=rows, other=1.0).to(tl.float32)
    c2 = tl.load(c_ptr + j + half, mask=rows, other=1.0).to(tl.float32)
    s1 = tl.load(s_ptr + j, mask=rows, other=0.0).to(tl.float32)
    s2 = tl.load(s_ptr + j + half, mask=rows, other=0.0).to(tl.float32)
    turn = rn < NQ + NK
    ra = tl.where(turn, a * c1 - b * s1, a).to(dtype)
    rb = tl.where(turn, b * c2 + a * s2, b).to(dtype)
    is_q = rows & (rn < NQ)
    tl.store(y_ptr + rn, ra, mask=is_q)
    tl.store(y_ptr + r2, rb, mask=is_q)
    pos = tl.load(pos_ptr).to(tl.int64)
    is_k = rows & (rn >= NQ) & turn
    at = kc_ptr + ((rn - NQ) // D).to(tl.int64) * k_head + pos * k_slot + j
    tl.store(at, ra, mask=is_k)
    tl.store(at + half, rb, mask=is_k)
    is_v = rows & (rn >= NQ + NK)
    at = vc_ptr + ((rn - NQ - NK) // D).to(tl.int64) * v_head + pos * v_slot + j
    tl.store(at, ra, mask=is_v)
    tl.store(at + half, rb, mask=is_v)


@triton.autotune(configs=configs(os.environ.get("TRITON_INTERPRET") == "1"),
                 key=["N", "K", "GATED", "NORM", "ROPE"])
@triton.jit
def row_product_kernel(x_ptr, w_ptr, b_ptr, r_ptr, n_ptr, y_ptr, c_ptr, s_ptr, kc_ptr, vc_ptr,
                       pos_ptr, k_head, k_slot, v_head, v_slot, N, eps, K: tl.constexpr,
                       HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                       GATED: tl.constexpr, NORM: tl.constexpr, PDL: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ROPE: tl.constexpr = False,
                       NQ: tl.constexpr = 0, NK: tl.constexpr = 0, D: tl.constexpr = 2):
    idx = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = idx < N
    rn, r2, j = _rows(idx, N, ROPE, D)
    rk = tl.arange(0, BLOCK_K)
    w = w_ptr + rn[:, None].to(tl.int64) * K
    w_up = w_ptr + r2[:, None].to(tl.int64) * K           # GATED: the up half; ROPE: partners
    dtype = y_ptr.dtype.element_ty
    # 1. the first tile of w (no input of the step: loaded before the wait under PDL)
    ok = rows[:, None] & (rk < K)[None, :]
    w0 = tl.load(w + rk[None, :], mask=ok, other=0.0, eviction_policy="evict_first")
    u0 = w0
    if GATED or ROPE:
        u0 = tl.load(w_up + rk[None, :], mask=ok, other=0.0, eviction_policy="evict_first")
    if PDL:
        tl.extra.cuda.gdc_wait()
    # 2. the reduction over K (NORM: of norm * x, and x's squares alongside)
    x = tl.load(x_ptr + rk, mask=rk < K, other=0.0).to(tl.float32)
    squares = tl.zeros((BLOCK_K,), tl.float32)
    if NORM:
        squares += x * x
        x *= tl.load(n_ptr + rk, mask=rk < K, other=0.0).to(tl.float32)
    acc = w0.to(tl.float32) * x[None, :]
    acc_up = u0.to(tl.float32) * x[None, :]
    for k0 in range(BLOCK_K, K, BLOCK_K):
        kk = k0 + rk
        ok = rows[:, None] & (kk < K)[None, :]
        xk = tl.load(x_ptr + kk, mask=kk < K, other=0.0).to(tl.float32)
        if NORM:
            squares += xk * xk
            xk *= tl.load(n_ptr + kk, mask=kk < K, other=0.0).to(tl.float32)
        xk = xk[None, :]
        acc += tl.load(w + kk[None, :], mask=ok, other=0.0,
                       eviction_policy="evict_first").to(tl.float32) * xk
        if GATED or ROPE:
            acc_up += tl.load(w_up + kk[None, :], mask=ok, other=0.0,
                              eviction_policy="evict_first").to(tl.float32) * xk
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    # 3. the norm's scale, bias, gating and residual (rounded as the unfused layers round)
    scale = tl.math.rsqrt(tl.sum(squares, 0) / K + eps) if NORM else 1.0
    y = tl.sum(acc, 1) * scale
    up = tl.sum(acc_up, 1) * scale
    if HAS_BIAS:
        y += tl.load(b_ptr + rn, mask=rows, other=0.0).to(tl.float32)
        if GATED or ROPE:
            up += tl.load(b_ptr + r2, mask=rows, other=0.0).to(tl.float32)
    if GATED:
        gate = y.to(dtype).to(tl.float32)
        y = (gate * tl.sigmoid(gate)).to(dtype).to(tl.float32) * up.to(dtype).to(tl.float32)
    if HAS_RESIDUAL:
        y = y.to(dtype).to(tl.float32) + tl.load(r_ptr + rn, mask=rows, other=0.0).to(tl.float32)
    if ROPE:
        _rope_store(y, up, rows, rn, r2, j, y_ptr, c_ptr, s_ptr, kc_ptr, vc_ptr, pos_ptr, k_head,
                    k_slot, v_head, v_slot, NQ, NK, D)
    else:
        tl.store(y_ptr + rn, y.to(dtype), mask=rows)
