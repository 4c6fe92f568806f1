"""mmspec's own draft head (``mmspec.DraftHead``) served by vLLM as an EAGLE-3 drafter.

vLLM loads this package's ``register`` through its ``vllm.general_plugins`` entry point (in
pyproject.toml) in every process it starts, once mmspec is installed in vLLM's environment
(``pip install --no-deps -e .``; ``make vllm-env`` does). ``register`` adds the architecture
``MmspecDraftHeadEagle3`` to vLLM's model registry, lazily: vLLM imports
``mmspec_vllm.model`` (the model class) only when a head of that architecture is served.
Nothing here imports mmspec (whose package import loads its whole engine) and mmspec imports
no vLLM: this package sits beside it.

A ``DraftHead`` folder serves after ``mmspec.drafters.layouts.export(head, DIR, "vllm",
target=TARGET)`` (or ``python -m recipes.train.draft_head ... --export vllm DIR``) writes
its config for vLLM (the head's tensors as they are, plus a copy of the target's final norm
when the head fuses the target's last layer), then

    LLM(model=TARGET, speculative_config={"model": DIR, "method": "eagle3",
                                          "num_speculative_tokens": 3})

The exported ``config.json`` (every key the model reads is written):

    architectures         [ARCHITECTURE]
    model_type            "llama", with the head decoder's Llama settings (hidden_size,
                          num_hidden_layers = the head's layers, heads, head_dim,
                          intermediate_size, rms_norm_eps, rope_parameters, vocab_size = V)
    eagle_aux_hidden_state_layer_ids
                          the distinct feature layers, ascending (vLLM's id k is the residual
                          stream entering layer k = transformers' ``hidden_states[k]``; id N,
                          the last layer's output, vLLM captures before the final norm)
    target_hidden_size    the target's width (= hidden_size)
    mmspec_head           the head's own ``HeadConfig`` (feature_layers in the head's order)
    mmspec_final_norm     null, or {"layer": N, "eps": the target's rms_norm_eps}: the head
                          fuses transformers' ``hidden_states[N]``, the output after the
                          target's final norm; the tensor ``target_norm.weight`` is that norm
"""

from __future__ import annotations

ARCHITECTURE = "MmspecDraftHeadEagle3"
MODEL_CLASS = "mmspec_vllm.model:MmspecDraftHeadForVLLM"


def register() -> None:
    """Register ``ARCHITECTURE`` with vLLM's model registry (idempotent; vLLM calls it in
    every process it starts)."""
    from vllm import ModelRegistry

    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCHITECTURE, MODEL_CLASS)
