"""mmspec's Triton kernels for decode steps, each a custom op the compiled layers call
(``mmspec.engine.grouping``) or an attention function (``mmspec.engine.attention``):

    gemv.py              one-row products (a split-K matrix-vector product), with the RMSNorm
                         before a product inside it; row_kernel.py holds the Triton kernel
    qkv_rope.py          the same kernel's rotary mode: q/k/v, its rotary embedding and the
                         cache writes of k and v in one launch
    decode_attention.py  attention of a few queries over a static cache's slots in use
"""
