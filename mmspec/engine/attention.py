"""Attention over a prefix of a static cache.

A static cache has S slots, but a step only needs the slots written so far. Transformers'
SDPA attention reads all S keys (the 4-D mask hides the rest), so a step's attention costs
grow with S, not with the length: at batch 16 with ragged rows (K + 1 slots per step kept,
holes included) that is gigabytes per step. Here the sessions pass a 4-D mask only as wide as
a bucket W >= the slots in use (a multiple of 64, doubling: ``bucket``), and models whose
attention is ``"sdpa"`` run under ``"mmspec_sdpa"`` during the step: the same function on
the first W keys and values. With a mask as wide as the keys (or no 4-D mask) it is SDPA
unchanged. Each bucket is its own captured graph (a few per call). The sessions pass it an
additive mask, built once per step (SDPA turns a bool mask into one in every layer); one of
another dtype than the queries is cast.

Captured steps on CUDA run ``"mmspec_decode"`` instead (``prefix(..., kernel=True)``): steps
of a few queries go to ``mmspec.kernels.decode_attention``'s kernel, which reads the W slots once
for every query of a kv head; the others (prompt passes, wide trees, options the kernel does
not implement) to the prefix SDPA above.
"""

from __future__ import annotations

import contextlib

import torch

from ..kernels import decode_attention

NAME = "mmspec_sdpa"
DECODE = "mmspec_decode"
_registered = False


def _register() -> None:
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    def prefix_sdpa(module, query, key, value, attention_mask, **kwargs):
        if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 4:
            # no comparison with the cache's length: one trace for every width (a mask as
            # wide as the keys slices nothing)
            width = attention_mask.shape[-1]
            key, value = key[:, :, :width], value[:, :, :width]
            if attention_mask.is_floating_point() and attention_mask.dtype != query.dtype:
                attention_mask = attention_mask.to(query.dtype)
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    def decode(module, query, key, value, attention_mask, **kwargs):
        if decode_attention.applies(query, key, value, attention_mask, kwargs):
            out = torch.ops.mmspec.decode_attention(query, key, value, attention_mask,
                                                    kwargs.get("scaling"))
            return out, None
        return prefix_sdpa(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register(NAME, prefix_sdpa)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    AttentionInterface.register(DECODE, decode)
    AttentionMaskInterface.register(DECODE, sdpa_mask)
    _registered = True


def module_configs(net) -> tuple:
    """The configs of ``net``'s modules, each once, in module order."""
    seen, out = set(), []
    for m in net.modules():
        cfg = getattr(m, "config", None)
        if cfg is not None and id(cfg) not in seen:
            seen.add(id(cfg))
            out.append(cfg)
    return tuple(out)


def sdpa_configs(configs) -> list:
    """Of ``configs`` (``module_configs``), those whose attention is SDPA (what ``prefix``
    switches)."""
    return [cfg for cfg in configs
            if getattr(cfg, "_attn_implementation_internal", None) in ("sdpa", NAME, DECODE)]


@contextlib.contextmanager
def prefix(configs: list, kernel: bool = False):
    """Run the modules of ``configs`` with prefix attention, restoring SDPA after;
    ``kernel``: steps of a few queries through ``mmspec.kernels.decode_attention``.

    The configs' private ``_attn_implementation_internal`` is written directly: the public
    ``set_attn_implementation`` is model-wide, validates on every call and would leave the
    user's model switched between calls. No transformers code is patched; the function is
    registered through the public ``AttentionInterface``."""
    if not configs:
        yield
        return
    _register()
    for cfg in configs:
        cfg._attn_implementation_internal = DECODE if kernel else NAME
    try:
        yield
    finally:
        for cfg in configs:
            cfg._attn_implementation_internal = "sdpa"


def bucket(used: int, total: int) -> int:
    """The mask width for ``used`` slots of ``total``: 64, 128, 256, ... (capped at total)."""
    w = 64
    while w < used:
        w *= 2
    return min(w, total)
