"""The q/k/v product with the rotary embedding and the cache writes in one kernel
(mmspec.kernels.qkv_rope): under Triton's interpreter against the unfused layers in float64, and
compiled for Hopper without a GPU."""

import os
import subprocess
import sys

import pytest
import torch

from mmspec.kernels import qkv_rope

CHILD = """
import torch
from mmspec.kernels import qkv_rope
torch.manual_seed(0)
for nq, nk, d, k, bias, norm, pos in [(32, 16, 8, 300, False, False, torch.tensor([3])),
                                      (16, 8, 8, 64, True, True, torch.tensor(3)),
                                      (24, 24, 4, 130, False, True, torch.tensor(9))]:
    n = nq + 2 * nk
    x, w = 3 * torch.randn(1, 1, k), torch.randn(n, k)
    b = torch.randn(n) if bias else None
    nw = torch.rand(k) + 0.5 if norm else None
    cos, sin = torch.randn(d), torch.randn(d)
    keys, values = torch.randn(1, nk // d, 10, d), torch.randn(1, nk // d, 10, d)
    kr, vr = keys.double().clone(), values.double().clone()
    dd = lambda t: None if t is None else t.double()
    ref = qkv_rope._reference(x.double(), w.double(), dd(b), dd(nw), 1e-5, cos.double(),
                              sin.double(), kr, vr, pos, nq, d)
    y = qkv_rope.launch(x, w, b, nw, 1e-5, cos, sin, keys, values, pos, nq, d, pdl=False)
    for got, want in ((y, ref), (keys, kr), (values, vr)):
        assert got.shape == want.shape
        err = (got.double() - want).abs().max().item()
        assert err < 1e-4 * want.abs().max().item(), (nq, nk, d, k, bias, norm, err)
print("ok")
"""


def test_the_kernel_gives_the_unfused_layers_under_the_triton_interpreter():
    """q rotated, k rotated and v written at the slot (the other slots untouched; the slot a
    one-element or a 0-d tensor, as the cache's write pointer is), with and without a bias
    and a norm, tails of K; float32 against float64 (a child process: the
    interpreter is chosen when Triton is imported)."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_the_custom_op_runs_the_unfused_layers_off_the_gpu():
    """``torch.ops.mmspec.qkv_rope`` on the CPU: the reference, cache slots written in place."""
    torch.manual_seed(0)
    x, w = torch.randn(1, 1, 16), torch.randn(8 + 2 * 4, 16)
    cos, sin = torch.randn(4), torch.randn(4)
    keys, values = torch.zeros(1, 1, 6, 4), torch.zeros(1, 1, 6, 4)
    q = torch.ops.mmspec.qkv_rope(x, w, None, None, 0.0, cos, sin, keys, values,
                                  torch.tensor([2]), 8, 4)
    y = torch.nn.functional.linear(x, w)
    c, s = cos.view(1, 1, 1, 4), sin.view(1, 1, 1, 4)
    torch.testing.assert_close(q, qkv_rope.rotate(y[..., :8].reshape(1, 2, 1, 4), c, s))
    torch.testing.assert_close(keys[0, 0, 2], qkv_rope.rotate(y[0, 0, 8:12], cos, sin))
    torch.testing.assert_close(values[0, 0, 2], y[0, 0, 12:])
    assert keys[0, 0, [0, 1, 3, 4, 5]].abs().sum() == 0 == values[0, 0, 3:].abs().sum()


def test_a_span_that_is_not_q_k_v_of_whole_heads_is_refused():
    keys = torch.zeros(1, 1, 6, 4)
    with pytest.raises(ValueError, match="accepted nq \\+ 2 nk rows"):
        qkv_rope.check(torch.zeros(17, 8), 8, 4, keys, keys)
    with pytest.raises(ValueError, match="keys .* contiguous in its last dimension"):
        qkv_rope.check(torch.zeros(16, 8), 8, 4, torch.zeros(1, 1, 4, 6).transpose(2, 3), keys)
    with pytest.raises(ValueError, match="values \\(1, 1, 6, 8\\); accepted"):
        qkv_rope.check(torch.zeros(16, 8), 8, 4, keys, torch.zeros(1, 1, 6, 8))
    with pytest.raises(ValueError, match="values \\(2, 1, 6, 4\\); accepted \\[1,"):
        qkv_rope.check(torch.zeros(16, 8), 8, 4, keys, torch.zeros(2, 1, 6, 4))
    qkv_rope.check(torch.zeros(16, 8), 8, 4, keys, keys)


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_the_kernel_compiles_for_hopper_in_every_setting(dtype):
    """``gemv``'s kernel with its rotary epilogue, in every launch setting, with a bias and
    the norm (and without), compiles for sm_90 without a GPU; under PDL the first weight
    loads come before the wait."""
    from conftest import row_kernel_for_hopper

    shape = dict(K=4096, ROPE=True, NQ=4096, NK=4096, D=128, HAS_RESIDUAL=False, GATED=False)
    flags = [dict(HAS_BIAS=True, NORM=True, PDL=True), dict(HAS_BIAS=False, NORM=False, PDL=False)]
    row_kernel_for_hopper(dtype, [dict(**shape, **f) for f in flags])
