"""``mmspec.kernels.decode_attention``: the decode steps' attention kernel and where it applies."""

import os
import subprocess
import sys

import pytest
import torch

from conftest import attention_inputs as _inputs
from mmspec.kernels import decode_attention


def test_reference_is_sdpa_over_the_masks_slots():
    """The reference (the op's CPU path) is SDPA over the first W slots with the kv heads
    repeated for their query heads, in the [B, n, H, Dv] layout attention functions return."""
    q, k, v, mask = _inputs(2, 4, 2, 3, 8, 20, 12, True)
    out = torch.ops.mmspec.decode_attention(q, k, v, mask, 0.5)
    kk, vv = (t[:, :, :12].repeat_interleave(2, 1) for t in (k, v))
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, kk, vv, mask, scale=0.5)
    torch.testing.assert_close(out, sdpa.transpose(1, 2))
    assert out.shape == (2, 3, 4, 8)


def test_the_kernel_applies_on_cuda_only():
    """Off CUDA (the CPU, the meta device) ``applies`` says no and SDPA computes (on CUDA
    the decode shapes say yes: tests/engine/test_gpu.py)."""
    q, k, v, mask = _inputs(1, 4, 2, 1, 8, 20, 12, False)
    assert not decode_attention.applies(q, k, v, mask, {})           # the CPU
    meta = [t.to("meta") for t in (q, k, v, mask)]
    assert not decode_attention.applies(*meta, {})


def test_decode_attention_kernel_under_the_triton_interpreter():
    """The kernels run by Triton's interpreter on the CPU (a child process: the interpreter
    is chosen when Triton is imported): grouped-query heads, several queries, strided
    queries, one split and several (the combining kernel), a mask shared by the rows and one
    per row; float32 against the reference in float64."""
    code = (
        "import torch\n"
        "from tests.conftest import attention_inputs as _inputs\n"
        "from mmspec.kernels import decode_attention as da\n"
        "for b, h, hkv, n, d, s, w, split, per_row in [(1, 2, 2, 1, 16, 96, 70, 256, False),"
        " (2, 4, 2, 3, 32, 300, 200, 64, True), (1, 6, 2, 5, 24, 130, 130, 128, False),"
        " (2, 2, 1, 2, 16, 64, 64, 64, True)]:\n"
        "    q, k, v, mask = _inputs(b, h, hkv, n, d, s, w, per_row)\n"
        "    y = da.launch(q, k, v, mask, 0.3, split=split)\n"
        "    ref = da.reference(*(t.double() for t in (q, k, v, mask)), 0.3)\n"
        "    assert y.shape == ref.shape == (b, n, h, d), (y.shape, ref.shape)\n"
        "    err = (y.double() - ref).abs().max().item()\n"
        "    assert err < 1e-5, (b, h, hkv, n, d, s, w, split, err)\n"
        "print('ok')\n")
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", code], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


@pytest.mark.parametrize("kwargs", [dict(dropout=0.1), dict(sliding_window=8),
                                    dict(softcap=30.0), dict(s_aux=torch.zeros(4))])
def test_options_the_kernel_lacks_are_left_to_sdpa(kwargs, monkeypatch):
    """On CUDA (here pretended), an option the kernel does not implement, a bool mask, a
    mask wider than the cache or more than 16 queries send the call on to SDPA."""
    q, k, v, mask = _inputs(1, 4, 2, 1, 8, 20, 12, False)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: True))
    assert decode_attention.applies(q, k, v, mask, {})
    assert not decode_attention.applies(q, k, v, mask, kwargs)
    assert not decode_attention.applies(q, k, v, mask > -1, {})            # a bool mask
    assert not decode_attention.applies(q, k, v, torch.zeros(1, 1, 1, 21), {})  # past S
    q17, _, _, mask17 = _inputs(1, 4, 2, 17, 8, 20, 12, False)
    assert not decode_attention.applies(q17, k, v, mask17, {})               # 17 queries


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_kernels_compile_for_hopper(dtype):
    """The attention kernel (one split and several; grouped-query rows of a verification step)
    and the combining kernel compile for sm_90 without a GPU, with programmatic dependent
    launch: each waits on the kernel before it and lets the next one launch."""
    from conftest import hopper_ptx

    ptr = "*" + dtype
    sig = {"q_ptr": ptr, "k_ptr": ptr, "v_ptr": ptr, "m_ptr": ptr, "o_ptr": ptr,
           "part_ptr": "*fp32", "W": "i32", "scale": "fp32", "HKV": "i32",
           **{name: "i32" for name in ("sq_b", "sq_h", "sq_n", "sk_b", "sk_h", "sk_s", "sv_b",
                                       "sv_h", "sv_s", "sm_b", "sm_n")}}
    for splits in (1, 4):
        ptx = hopper_ptx(decode_attention._attend(), sig, dict(
            SPLIT=256, SPLITS=splits, G=4, N_Q=5, D=128, DV=128, BLOCK_M=32,
            BLOCK_N=decode_attention.BLOCK_N, BLOCK_D=128, BLOCK_DV=128, IEEE=dtype == "fp32",
            PDL=True))
        assert "griddepcontrol.wait" in ptx and "griddepcontrol.launch_dependents" in ptx
    ptx = hopper_ptx(decode_attention._combine(), {"part_ptr": "*fp32", "o_ptr": ptr,
                                                   "HKV": "i32"},
                     dict(SPLITS=4, G=4, N_Q=5, DV=128, BLOCK_M=32, BLOCK_DV=128, BLOCK_S=4,
                          PDL=True))
    assert "griddepcontrol.wait" in ptx and "griddepcontrol.launch_dependents" in ptx
