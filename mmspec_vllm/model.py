"""vLLM's model class for mmspec's ``DraftHead`` (``mmspec_vllm``'s docstring: the files).

It computes what ``mmspec.drafters.head.DraftHead`` computes, with vLLM's layers:

    f_t = reduce(concat(h_t^l for l in feature_layers))     the target's hidden states, in
                                                             the head's order (vLLM hands
                                                             them ascending and distinct);
                                                             l = N normed by the target's
                                                             final norm (hidden_states[N])
    x   = fuse(concat(embed(x_{t+1}), f_t))
    g_t = norm(decoder layers(x))                            plain Llama layers, their own
                                                             KV cache in vLLM's
    q   = lm_head(g_t)                                       the target's embeddings and
                                                             output head (shared by vLLM's
                                                             proposer); a reduced head: -inf
                                                             outside ``draft_ids``

and feeds g_t back as the next position's feature, as the head drafts further. vLLM's
EAGLE-3 proposer calls ``combine_hidden_states`` on the target's captured states,
``forward`` on (tokens, positions, features), ``compute_logits`` on its output; it accepts
only subclasses of its EAGLE-3 classes (``llm_base_proposer.py``, ``propose``), so this is
one of ``Eagle3LlamaForCausalLM`` with every method it calls replaced.

One difference is vLLM's, not this class's: vLLM pairs the feature of position t with token
t + 1 from the target's position 0 on (``set_inputs_first_pass``: the draft's first slot is
(f_0, x_1)), so the prompt's first token is in no pair; mmspec's heads are trained with a
pair (zero feature, first token) before it (``DraftHead.first_pair``), which vLLM's KV
cache has no slot for. mmspec drafts the same head without it as
``head.first_pair = False``.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from vllm.compilation.decorators import support_torch_compile
from vllm.config import VllmConfig
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import ReplicatedLinear
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.vocab_parallel_embedding import (ParallelLMHead,
                                                                 VocabParallelEmbedding)
from vllm.model_executor.model_loader.weight_utils import default_weight_loader
from vllm.model_executor.models.llama import LlamaDecoderLayer
from vllm.model_executor.models.llama_eagle3 import Eagle3LlamaForCausalLM
from vllm.model_executor.models.utils import get_draft_quant_config, maybe_prefix

from . import ARCHITECTURE

# (the head's tensor name piece, vLLM's fused parameter, its shard)
_STACKED = ((".q_proj.", ".qkv_proj.", "q"), (".k_proj.", ".qkv_proj.", "k"),
            (".v_proj.", ".qkv_proj.", "v"), (".gate_proj.", ".gate_up_proj.", 0),
            (".up_proj.", ".gate_up_proj.", 1))


def _head_settings(config) -> tuple[dict, dict | None]:
    """The exported ``mmspec_head`` and ``mmspec_final_norm`` of a draft config, refused by
    name where absent (a folder not written by ``layouts.export(..., "vllm")``)."""
    head = getattr(config, "mmspec_head", None)
    if not isinstance(head, dict) or "feature_layers" not in head:
        raise ValueError(f"{ARCHITECTURE}: the draft config has no mmspec_head (accepted a "
                         "folder written by mmspec.drafters.layouts.export(head, DIR, 'vllm'))")
    if head.get("codebooks") or head.get("uncond_features"):
        raise ValueError(f"{ARCHITECTURE}: a frame, depth or guidance head (codebooks "
                         f"{head.get('codebooks')}, uncond_features "
                         f"{head.get('uncond_features')}): vLLM serves token heads only")
    return head, getattr(config, "mmspec_final_norm", None)


class _DraftHeadLayer(LlamaDecoderLayer):
    """A plain Llama layer of the head, under the draft's quantization config."""

    def get_quant_config(self, vllm_config):
        return get_draft_quant_config(vllm_config)


@support_torch_compile(dynamic_arg_dims={"input_ids": 0, "positions": -1,
                                         "hidden_states": 0, "input_embeds": 0})
class _DraftHeadModel(nn.Module):
    """``reduce``, ``fuse``, the decoder layers and the decoder's norm (``decoder.model.*``
    in the head's files); ``embed_tokens`` is replaced by the target's on load."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "",
                 start_layer_id: int = 0) -> None:
        super().__init__()
        config = vllm_config.speculative_config.draft_model_config.hf_config
        head, final = _head_settings(config)
        d, dtype = config.hidden_size, vllm_config.model_config.dtype
        self.feature_layers = [int(i) for i in head["feature_layers"]]
        captured = sorted(set(self.feature_layers))         # as vLLM captures them
        self.picks = [captured.index(i) for i in self.feature_layers]
        self.final_layer = int(final["layer"]) if final else None
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, d,
                                                   prefix=maybe_prefix(prefix, "embed_tokens"))
        quant = get_draft_quant_config(vllm_config)
        self.reduce = ReplicatedLinear(len(self.feature_layers) * d, d, bias=False,
                                       params_dtype=dtype, quant_config=quant,
                                       prefix=maybe_prefix(prefix, "reduce"), return_bias=False)
        self.fuse = ReplicatedLinear(2 * d, d, bias=False, params_dtype=dtype,
                                     quant_config=quant, prefix=maybe_prefix(prefix, "fuse"),
                                     return_bias=False)
        self.layers = nn.ModuleList(    # attention named after the target's layers
            _DraftHeadLayer(vllm_config, config=config,
                            prefix=maybe_prefix(prefix, f"layers.{start_layer_id + i}"))
            for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(d, eps=config.rms_norm_eps)
        self.target_norm = (RMSNorm(d, eps=float(final["eps"])) if final else None)

    def combine(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """The target's captured states [n, k * d] (distinct layers, ascending) -> f [n, d]."""
        chunks = hidden_states.chunk(len(set(self.feature_layers)), -1)
        parts = []
        for layer, i in zip(self.feature_layers, self.picks):
            part = chunks[i]
            if layer == self.final_layer:          # hidden_states[N]: after the final norm
                part = self.target_norm(part)
            parts.append(part)
        return self.reduce(torch.cat(parts, -1))

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                hidden_states: torch.Tensor, input_embeds: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        if input_embeds is None:
            input_embeds = self.embed_input_ids(input_ids)
        x = self.fuse(torch.cat([input_embeds, hidden_states], -1))
        residual = None
        for layer in self.layers:
            x, residual = layer(positions, x, residual)
        x, _ = self.norm(x, residual)
        return x, x               # logits read g_t; g_t (normed) is fed back


class MmspecDraftHeadForVLLM(Eagle3LlamaForCausalLM):
    """mmspec's ``DraftHead`` as vLLM's EAGLE-3 proposer drives it (module docstring)."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        nn.Module.__init__(self)
        spec = vllm_config.speculative_config
        self.config = config = spec.draft_model_config.hf_config
        head, _ = _head_settings(config)
        if spec.parallel_drafting:
            raise ValueError(f"{ARCHITECTURE}: parallel drafting (P-EAGLE) is another "
                             "architecture; accepted sequential drafting")
        if vllm_config.model_config.uses_mrope:
            raise ValueError(f"{ARCHITECTURE}: the target takes M-RoPE positions, of which "
                             "vLLM's proposer hands the drafter the temporal axis; mmspec's "
                             "DraftHead counts tokens (1-D), so it would see other positions "
                             "after an image: accepted targets with 1-D rotary positions")
        target_vocab = vllm_config.model_config.get_vocab_size()
        if config.vocab_size != target_vocab:
            raise ValueError(f"{ARCHITECTURE}: a head made for a vocabulary of "
                             f"{config.vocab_size}; the target has {target_vocab}")
        target_layers = vllm_config.model_config.get_total_num_hidden_layers()
        config.target_layer_count = target_layers
        config.draft_vocab_size = config.vocab_size
        self.model = _DraftHeadModel(vllm_config=vllm_config, prefix=maybe_prefix(prefix, "model"),
                                     start_layer_id=target_layers)
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size,
                                      prefix=maybe_prefix(prefix, "lm_head"))
        self.logits_processor = LogitsProcessor(config.vocab_size)
        self.draft_id_to_target_id = None
        self.use_parallel_drafting = False
        vd = head.get("draft_vocab_size")
        self.register_buffer("draft_ids", torch.zeros(vd, dtype=torch.long) if vd else None,
                             persistent=False)

    def combine_hidden_states(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.model.combine(hidden_states)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                hidden_states: torch.Tensor, inputs_embeds: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.model(input_ids, positions, hidden_states, inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        logits = self.logits_processor(self.lm_head, hidden_states)
        if logits is None or self.draft_ids is None:
            return logits
        out = torch.full_like(logits, float("-inf"))
        ids = self.draft_ids.expand(logits.shape[0], -1)
        return out.scatter(-1, ids, logits.gather(-1, ids))

    def get_top_tokens(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Greedy draft ids in the target's vocabulary (the reduced head's included)."""
        return self.compute_logits(hidden_states).argmax(-1)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """The head's tensors as ``DraftHead.save_pretrained`` names them (``reduce``,
        ``fuse``, ``decoder.model.layers.*``, ``decoder.model.norm``, ``draft_ids``) and
        ``target_norm.weight``; a missing or unexpected tensor is an error naming it."""
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        unexpected = []
        for name, tensor in weights:
            if name == "draft_ids":
                if self.draft_ids is None or tensor.shape != self.draft_ids.shape:
                    unexpected.append(name)
                    continue
                self.draft_ids.copy_(tensor.long())
                loaded.add(name)
                continue
            name = "model." + name.removeprefix("decoder.model.")
            shard = None
            for piece, fused, sid in _STACKED:
                if piece in name:
                    name, shard = name.replace(piece, fused), sid
                    break
            param = params.get(name)
            if param is None:
                unexpected.append(name)
                continue
            loader = getattr(param, "weight_loader", default_weight_loader)
            if shard is None:
                loader(param, tensor)
            else:
                loader(param, tensor, shard)
            loaded.add(name)
        shared = ("model.embed_tokens.", "lm_head.")       # the target's, shared on load
        missing = sorted(n for n in params if n not in loaded and not n.startswith(shared))
        if self.draft_ids is not None and "draft_ids" not in loaded:
            missing.append("draft_ids")
        if missing or unexpected:
            raise ValueError(f"{ARCHITECTURE}: tensors missing {missing}, not read by this "
                             f"head {sorted(set(unexpected))}")
        return loaded | {n for n in params if n.startswith(shared)}
