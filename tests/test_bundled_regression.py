"""Seeded generations of the bundled models reproduce committed references, in float32, with
and without oneDNN (tests/bundled_regression.py says why both)."""

from __future__ import annotations

import pytest
import torch

import bundled_regression as reg


@pytest.mark.parametrize("mkldnn", [True, False], ids=["onednn", "no-onednn"])
@pytest.mark.parametrize("name", sorted(reg.CHECKS))
def test_bundled_generation_reproduces_committed_reference(name, mkldnn):
    key, fn = reg.CHECKS[name]
    ref = reg.load(name)
    before = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = mkldnn
    try:
        got = fn(ref)
    finally:
        torch.backends.mkldnn.enabled = before
    assert got == ref[key]
