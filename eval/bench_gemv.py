"""Matrix-vector products of the 7B Llama decode step: cuBLAS, inductor and a Triton kernel.

    python -m eval.bench_gemv                         # one GPU; rows 1 and 5
    python -m eval.bench_gemv --rows 5,16 --out out/gemv

What a decode step spends its time on (``eval.profile_gpu``: the projections' reductions) at
its best: each weight shape of the 7B Llama step (q/k/v fused, the output projection,
gate/up fused, down, the output head), bf16, times M rows, by three kernels: ``F.linear``
(cuBLAS), ``torch.compile(F.linear)`` with coordinate-descent tuning (inductor's fused
reduction, as ``compile=True`` lowers it; rows 1 only) and a plain Triton kernel (each
program reduces BLOCK_N rows of the weight over its share of K in BLOCK_K tiles, K split
over 1, 2 or 4 programs summed by atomic adds; the best of 54 launch settings; M > 1 reads
the weight once per row); for up to 16 rows also a skinny-matrix Triton kernel that reads
the weight once for all rows (``_skinny_kernel``: tensor cores on the rows padded to 16, K
split over up to four programs; the best of 24 settings). Each is
timed as 20 calls inside one CUDA graph, the best of 20 replays, so launches cost nothing.
Prints JSON lines with the weight bytes read per second (GB/s); writes ``OUT/gemv.json``.
"""

from __future__ import annotations

import json
import os

import torch
import torch.nn.functional as F

from recipes.cli import COUNT, Numbers, Parser, describe, run

SHAPES = {"qkv 4096->12288": (12288, 4096), "o 4096->4096": (4096, 4096),
          "gate_up 4096->22016": (22016, 4096), "down 11008->4096": (4096, 11008),
          "head 4096->32000": (32000, 4096)}
CONFIGS = [(bn, bk, warps, 3, split) for bn in (8, 16, 32) for bk in (128, 256, 512)
           for warps in (4, 8) for split in (1, 2, 4)]


def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def gemv(x_ptr, w_ptr, y_ptr, N, K: tl.constexpr, M: tl.constexpr, BLOCK_N: tl.constexpr,
             BLOCK_K: tl.constexpr, SPLIT: tl.constexpr):
        pid = tl.program_id(0)
        rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        nmask = rn < N
        share: tl.constexpr = K // SPLIT
        start = tl.program_id(1) * share
        for m in tl.static_range(M):
            acc = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
            for i in range(0, share, BLOCK_K):
                k0 = start + i
                w = tl.load(w_ptr + rn[:, None] * K + (k0 + rk)[None, :], mask=nmask[:, None],
                            other=0.0, eviction_policy="evict_first")
                x = tl.load(x_ptr + m * K + k0 + rk)
                acc += w.to(tl.float32) * x[None, :].to(tl.float32)
            if SPLIT == 1:
                tl.store(y_ptr + m * N + rn, tl.sum(acc, 1).to(y_ptr.dtype.element_ty),
                         mask=nmask)
            else:
                tl.atomic_add(y_ptr + m * N + rn, tl.sum(acc, 1), mask=nmask, sem="relaxed")

    def call(x, w, block_n, block_k, warps, stages, split):
        m, k = x.shape
        n = w.shape[0]
        y = (torch.empty if split == 1 else torch.zeros)(
            m, n, device=x.device, dtype=x.dtype if split == 1 else torch.float32)
        gemv[(triton.cdiv(n, block_n), split)](x, w, y, n, k, m, BLOCK_N=block_n,
                                               BLOCK_K=block_k, SPLIT=split, num_warps=warps,
                                               num_stages=stages)
        return y if split == 1 else y.to(x.dtype)

    return call


SKINNY_CONFIGS = [(bn, bk, 4, stages, split) for bn in (32, 64) for bk in (128, 256)
                  for stages in (3, 5) for split in (1, 2, 4)]


def _skinny_kernel():
    """Y [M, N] = X [M, K] W [N, K]^T for M <= 16 rows, the weight read once: each program
    multiplies all rows (padded to 16, tensor cores) by BLOCK_N rows of W over its share of K
    (``split`` shares, summed by atomic adds into a float32 buffer, then cast)."""
    import triton
    import triton.language as tl

    @triton.jit
    def skinny(x_ptr, w_ptr, y_ptr, M, N, K: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_K: tl.constexpr, SPLIT: tl.constexpr):
        rm = tl.arange(0, 16)
        rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        share: tl.constexpr = K // SPLIT
        start = tl.program_id(1) * share
        acc = tl.zeros((16, BLOCK_N), tl.float32)
        for i in range(0, share, BLOCK_K):
            k0 = start + i
            x = tl.load(x_ptr + rm[:, None] * K + (k0 + rk)[None, :], mask=rm[:, None] < M,
                        other=0.0)
            w = tl.load(w_ptr + rn[:, None] * K + (k0 + rk)[None, :], mask=rn[:, None] < N,
                        other=0.0, eviction_policy="evict_first")
            acc += tl.dot(x, tl.trans(w))
        out = y_ptr + rm[:, None] * N + rn[None, :]
        ok = (rm[:, None] < M) & (rn[None, :] < N)
        if SPLIT == 1:
            tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=ok)
        else:
            tl.atomic_add(out, acc, mask=ok, sem="relaxed")

    def call(x, w, block_n, block_k, warps, stages, split):
        m, k = x.shape
        n = w.shape[0]
        y = (torch.empty if split == 1 else torch.zeros)(
            m, n, device=x.device, dtype=x.dtype if split == 1 else torch.float32)
        skinny[(triton.cdiv(n, block_n), split)](x, w, y, m, n, k, BLOCK_N=block_n,
                                                  BLOCK_K=block_k, SPLIT=split,
                                                  num_warps=warps, num_stages=stages)
        return y if split == 1 else y.to(x.dtype)

    return call


def timed(fn, reps: int = 20, inner: int = 20) -> float:
    """Seconds per call: ``inner`` calls captured in one CUDA graph, the best of ``reps``."""
    fn()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(inner):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        best = min(best, a.elapsed_time(b) / inner)
    return best * 1e-3


def best_triton(gemv, x, w, ref, configs=CONFIGS):
    """The fastest launch setting whose result matches ``ref`` (2% of its largest value)."""
    best = (float("inf"), None)
    for cfg in configs:
        if w.shape[1] % (cfg[1] * (cfg[4] if len(cfg) > 4 else 1)):
            continue
        y = gemv(x, w, *cfg)
        if (y.float() - ref).abs().max().item() > 2e-2 * ref.abs().max().item():
            continue
        best = min(best, (timed(lambda: gemv(x, w, *cfg), reps=5, inner=10), cfg))
    return best[1]


def measure(m: int, name: str, n: int, k: int, gemv, skinny) -> dict:
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    ref = F.linear(x.float(), w.float())
    gb = w.numel() * 2 / 1e9
    row = dict(m=m, shape=name, cublas_gbs=gb / timed(lambda: F.linear(x, w)))
    row["inductor_gbs"] = float("nan")
    if m == 1:
        torch._dynamo.reset()
        comp = torch.compile(lambda a: F.linear(a, w), options={"coordinate_descent_tuning": True})
        row["inductor_gbs"] = gb / timed(lambda: comp(x))
    cfg = best_triton(gemv, x, w, ref)
    row["triton_gbs"] = gb / timed(lambda: gemv(x, w, *cfg)) if cfg else float("nan")
    row["triton_cfg"] = cfg
    if m <= 16:
        cfg = best_triton(skinny, x, w, ref, SKINNY_CONFIGS)
        row["skinny_gbs"] = gb / timed(lambda: skinny(x, w, *cfg)) if cfg else float("nan")
        row["skinny_cfg"] = cfg
    return row


def build_parser():
    ap = Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=Numbers(COUNT), default="1,5", help="rows M of the input")
    ap.add_argument("--out", default="out/gemv", help="output folder")
    return describe(ap)


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    if not torch.cuda.is_available():
        raise ValueError("eval.bench_gemv times CUDA kernels: accepted a machine with a CUDA GPU")
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True
    gemv, skinny, rows = _kernel(), _skinny_kernel(), []
    for m in args.rows:
        for name, (n, k) in SHAPES.items():
            rows.append(measure(m, name, n, k, gemv, skinny))
            print(json.dumps(rows[-1]), flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "gemv.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    run(main, "eval.bench_gemv")
