"""The EAGLE-3 draft head, exactly the architecture of the field's checkpoints (SafeAILab EAGLE,
SpecForge / SGLang, Tencent AngelSlim, vLLM's ``speculators``).

Terms (H: the head's width, N: its draft vocabulary, V: the target's vocabulary):

    f_t = fc(concat(h_t^l for l in feature_layers))      the target's hidden states fused;
                                                          ``norm_before_fc``: one RMSNorm over
                                                          the concatenation first (``input_norm``),
                                                          ``fc_norm``: one per layer
    x   = concat(input_layernorm(embed(x_{t+1})), hidden_norm(f_t))      [.., 2H]
    g_t = f_t + attention(x)  (the residual: ``hidden_norm(f_t)`` with
          ``norm_before_residual``), then g_t + mlp(post_attention_layernorm(g_t)),
          then the other decoder layers, if any (plain Llama layers)
    q   = softmax(lm_head(norm(g_t)))                     over the N draft ids; the draft id i
                                                          is the target id i + d2t[i], the
                                                          rest of the V ids get -inf

Drafting further, g_t (``norm_output``: norm(g_t)) stands in for the next position's f. The
pair (f_t, x_{t+1}) sits at the target's position of t (``first_pair``: no pair for the
prompt's first token), with M-RoPE positions where the config gives ``mrope_section`` (the
target's 3-D positions; sections contiguous, or ``mrope_interleaved``).

``Eagle3Head`` keeps mmspec's head protocol (``reduce_features``, ``inputs``, ``decoder``,
``full_logits``), so it drafts chains and trees through ``FeatureDrafter`` and the captured
engine like ``DraftHead``. Its ``decoder`` is a ``LlamaForCausalLM`` whose first layer is an
``Eagle3DecoderLayer`` (2H-wide q/k/v); the decoder's own norm is the head's ``norm`` with
``norm_output`` (else an identity: the fed-back output is g_t itself) and its output layer
applies ``norm`` then ``lm_head``. Tensors are named as vLLM's ``speculators`` names them
(``state_to_save``); ``mmspec.drafters.layouts`` reads and writes every layout.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pathlib import Path

import torch
from torch import nn
from transformers.models.llama.modeling_llama import (LlamaDecoderLayer, LlamaRMSNorm,
                                                      LlamaRotaryEmbedding)

from .files import WEIGHTS, local_config, read_config, read_tensors, write
from .head import DraftHead


# -- which target layers (module docstring of mmspec.drafters.layouts) ------------------------

def default_feature_layers(num_layers: int) -> tuple[int, ...]:
    """The field's default fused layers for a target of ``num_layers`` layers: hidden_states
    indices [2, N/2, N - 3] (vLLM's ids; SpecForge's [1, N/2 - 1, N - 4] as outputs)."""
    layers = (2, num_layers // 2, num_layers - 3)
    if len(set(layers)) != 3 or not 0 < min(layers) or sorted(layers) != list(layers):
        raise ValueError(f"a target of {num_layers} layers: the field's default layers [2, N/2, "
                         f"N - 3] = {list(layers)} are not three distinct layers in order: "
                         "accepted feature layers given explicitly (--feature-layers)")
    return layers


def check_feature_layers(layers, num_layers: int) -> tuple[int, ...]:
    """``layers`` (hidden_states indices) checked against a target of ``num_layers`` layers."""
    layers = tuple(layers)
    if num_layers in layers:
        raise ValueError(f"feature layer {num_layers} (the last layer's output): vLLM's id "
                         f"{num_layers} is taken before the final norm, transformers' "
                         f"hidden_states[{num_layers}] after it; accepted indices in [0, "
                         f"{num_layers - 1}]")
    if any(not 0 <= i < num_layers for i in layers) or len(set(layers)) != len(layers):
        raise ValueError(f"feature layers {list(layers)}: accepted distinct indices in [0, "
                         f"{num_layers - 1}] (a target of {num_layers} layers)")
    return layers


def hidden_indices(ids, outputs: bool) -> tuple[int, ...]:
    """hidden_states indices of the field's layer ``ids``: vLLM's as they are, SGLang's
    (``outputs``: layer outputs) + 1; ascending, as the engines fuse them."""
    out = sorted(int(i) + int(outputs) for i in ids)
    if len(set(out)) != len(out):
        raise ValueError(f"layer ids {list(ids)}: accepted distinct ids")
    return tuple(out)


# -- settings in the field's spelling ------------------------------------------------------------

def _rope(config: dict) -> tuple[float, dict | None, tuple | None, bool]:
    """(rope_theta, other scaling or None, mrope_section or None, interleaved) of a Llama
    config dict in any transformers version's spelling."""
    scaling = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    theta = float(scaling.pop("rope_theta", config.get("rope_theta", 10000.0)))
    section = scaling.pop("mrope_section", None)
    interleaved = bool(scaling.pop("mrope_interleaved", False))
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind in ("default", "mrope"):
        scaling = None
    return theta, scaling, tuple(section) if section else None, interleaved


def config_from_layer(layer: dict, *, vocab_size: int, draft_vocab_size: int | None,
                  feature_layers, target: str = "", **variants):
    """An ``Eagle3Config`` from a Llama config dict of the head's layers (flat layouts: the
    config itself; speculators: ``transformer_layer_config``)."""
    if layer.get("model_type", "llama") != "llama":
        raise ValueError(f"model_type {layer.get('model_type')!r} decoder layers: accepted "
                         "llama (EAGLE-3 heads in the Llama layout)")
    theta, scaling, section, interleaved = _rope(layer)
    h = layer["hidden_size"]
    heads = layer["num_attention_heads"]
    return Eagle3Config(
        hidden_size=h, intermediate_size=layer["intermediate_size"], num_attention_heads=heads,
        num_key_value_heads=layer.get("num_key_value_heads") or heads,
        head_dim=layer.get("head_dim"), num_layers=layer.get("num_hidden_layers", 1),
        rms_norm_eps=layer.get("rms_norm_eps", 1e-6), hidden_act=layer.get("hidden_act", "silu"),
        attention_bias=bool(layer.get("attention_bias", False)),
        mlp_bias=bool(layer.get("mlp_bias", False)), rope_theta=theta, rope_scaling=scaling,
        max_position_embeddings=layer.get("max_position_embeddings", 4096),
        vocab_size=vocab_size, draft_vocab_size=draft_vocab_size or vocab_size,
        feature_layers=feature_layers, mrope_section=section, mrope_interleaved=interleaved,
        target=target, **variants)


def layer_config(c, rope_key: str = "rope_parameters") -> dict:
    """The Llama config dict of an ``Eagle3Config``'s layers, as the field writes it: rotary
    settings under ``rope_parameters`` (transformers 5, speculators) or, with ``rope_key``
    "rope_scaling", beside ``rope_theta`` (the flat layouts' transformers-4 spelling)."""
    rope = dict(c.rope_scaling or {})
    rope.setdefault("rope_type", "default")
    if c.mrope_section is not None:
        rope.update(mrope_section=list(c.mrope_section), mrope_interleaved=c.mrope_interleaved)
    out = dict(model_type="llama", architectures=["LlamaForCausalLM"],
               hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
               num_hidden_layers=c.num_layers, num_attention_heads=c.num_attention_heads,
               num_key_value_heads=c.num_key_value_heads, head_dim=c.dim,
               rms_norm_eps=c.rms_norm_eps, hidden_act=c.hidden_act,
               attention_bias=c.attention_bias, mlp_bias=c.mlp_bias,
               max_position_embeddings=c.max_position_embeddings, vocab_size=c.vocab_size,
               tie_word_embeddings=False)
    if rope_key == "rope_parameters":
        out["rope_parameters"] = dict(rope, rope_theta=c.rope_theta)
    else:
        out.update(rope_theta=c.rope_theta,
                   rope_scaling=None if rope == {"rope_type": "default"} else rope)
    return out


@dataclass
class Eagle3Config:
    """hidden_size:        H, the head's width (the target's: heads narrower than their target
                        carry their own embeddings, not supported).
    intermediate_size, num_attention_heads, num_key_value_heads, head_dim, rms_norm_eps,
    hidden_act, attention_bias, mlp_bias, rope_theta, rope_scaling, max_position_embeddings:
                        the decoder layers' (a Llama layer's settings).
    vocab_size:         V, the target's output width.
    draft_vocab_size:   N <= V, the ids the head drafts (``d2t`` maps them).
    feature_layers:     indices into the target's ``hidden_states`` that are fused, kept in
                        ascending order as the engines fuse them (``hidden_indices``: the
                        field's layer ids mapped to them).
    num_layers:         the head's decoder layers (the first takes 2H-wide q/k/v).
    norm_before_residual, norm_before_fc, fc_norm, norm_output: the variants (module docstring).
    mrope_section:      None (1-D rotary positions), or three section sizes (time, height,
                        width) of M-RoPE heads (Qwen2.5-VL, Qwen3-VL targets).
    mrope_interleaved:  the sections interleaved (Qwen3-VL) rather than contiguous.
    target:             the target's name or path (informational; written as the verifier).
    merged_embeds:      the prompt's token embeddings are the target's merged input embeddings
                        (``HeadConfig.merged_embeds``; written as ``mmspec_merged_embeds``
                        where true).
    """

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    draft_vocab_size: int
    feature_layers: tuple[int, ...]
    head_dim: int | None = None
    num_layers: int = 1
    rms_norm_eps: float = 1e-6
    hidden_act: str = "silu"
    attention_bias: bool = False
    mlp_bias: bool = False
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 4096
    norm_before_residual: bool = False
    norm_before_fc: bool = False
    fc_norm: bool = False
    norm_output: bool = False
    mrope_section: tuple[int, ...] | None = None
    mrope_interleaved: bool = False
    target: str = ""
    merged_embeds: bool = False
    # mmspec's head protocol (a token head over the conditional features)
    uncond_features: bool = field(default=False, init=False)
    codebooks: None = field(default=None, init=False)
    depth_decoder: bool = field(default=False, init=False)

    def __post_init__(self):
        # fused in ascending order, as vLLM and SGLang capture them
        self.feature_layers = tuple(sorted(int(i) for i in self.feature_layers))
        if self.mrope_section is not None:
            self.mrope_section = tuple(int(s) for s in self.mrope_section)
        checks = (
            ("num_layers", self.num_layers, 1, None),
            ("draft_vocab_size", self.draft_vocab_size, 1, self.vocab_size),
            ("feature_layers", len(self.feature_layers), 1, None),
        )
        for name, value, low, high in checks:
            if not isinstance(value, int) or value < low or (high is not None and value > high):
                span = f"[{low}, {high}]" if high is not None else f">= {low}"
                raise ValueError(f"{name}={value!r}: accepted an integer {span}")
        if self.norm_before_fc and self.fc_norm:
            raise ValueError("norm_before_fc and fc_norm: accepted one of them (one RMSNorm "
                             "over the fused features, or one per layer), not both")
        if self.mrope_section is not None and (
                len(self.mrope_section) != 3 or 2 * sum(self.mrope_section) != self.dim):
            raise ValueError(f"mrope_section={list(self.mrope_section)}: accepted three sizes "
                             f"summing to head_dim / 2 = {self.dim // 2}")

    @property
    def dim(self) -> int:
        """Each attention head's width."""
        return self.head_dim or self.hidden_size // self.num_attention_heads

    def llama(self):
        """The decoder's ``LlamaConfig`` (its layers' settings; the output layer is the head's)."""
        from transformers import LlamaConfig

        rope = dict(self.rope_scaling or {}, rope_theta=self.rope_theta)
        rope.setdefault("rope_type", rope.pop("type", "default"))
        return LlamaConfig(vocab_size=self.vocab_size, hidden_size=self.hidden_size,
                           intermediate_size=self.intermediate_size,
                           num_hidden_layers=self.num_layers,
                           num_attention_heads=self.num_attention_heads,
                           num_key_value_heads=self.num_key_value_heads, head_dim=self.dim,
                           rms_norm_eps=self.rms_norm_eps, hidden_act=self.hidden_act,
                           attention_bias=self.attention_bias, mlp_bias=self.mlp_bias,
                           rope_parameters=rope,
                           max_position_embeddings=self.max_position_embeddings,
                           tie_word_embeddings=False, bos_token_id=None, eos_token_id=None,
                           pad_token_id=None)


class Eagle3DecoderLayer(LlamaDecoderLayer):
    """The head's first decoder layer: its input [.., 2H] is (token embedding, feature),
    each half normed by its own RMSNorm (``input_layernorm``, ``hidden_norm``), q/k/v read
    both halves; the residual is the feature (normed first with ``norm_before_residual``).
    A Llama layer otherwise (its attention, MLP and post-attention norm), so transformers
    records its output as a decoder layer's."""

    def __init__(self, config, layer_idx: int = 0, norm_before_residual: bool = False):
        super().__init__(config, layer_idx)
        self.hidden_norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.norm_before_residual = norm_before_residual
        wide = 2 * config.hidden_size
        for name in ("q_proj", "k_proj", "v_proj"):
            old = getattr(self.self_attn, name)
            setattr(self.self_attn, name, nn.Linear(wide, old.out_features,
                                                    bias=old.bias is not None))

    def forward(self, hidden_states: torch.Tensor, **kwargs) -> torch.Tensor:
        embeds, feature = hidden_states.chunk(2, -1)
        normed = self.hidden_norm(feature)
        residual = normed if self.norm_before_residual else feature
        x = torch.cat([self.input_layernorm(embeds), normed], -1)
        x, _ = self.self_attn(hidden_states=x, **kwargs)
        h = residual + x
        return h + self.mlp(self.post_attention_layernorm(h))


class MRopeRotaryEmbedding(nn.Module):
    """Rotary embedding of 3-axis positions [3, B, n] (time, height, width): each frequency
    reads one axis's position, the axes in contiguous sections (Qwen2-VL, Qwen2.5-VL) or
    interleaved (Qwen3-VL); positions [B, n] are text (every axis the same)."""

    def __init__(self, config, section: tuple[int, ...], interleaved: bool):
        super().__init__()
        self.inner = LlamaRotaryEmbedding(config)
        half = sum(section)
        if interleaved:          # T H W T H W ... up to 3 * section[axis], then T
            i = torch.arange(half)
            axis = torch.where((i % 3 == 1) & (i < 3 * section[1]), 1,
                               torch.where((i % 3 == 2) & (i < 3 * section[2]), 2, 0))
        else:
            axis = torch.cat([torch.full((s,), a) for a, s in enumerate(section)])
        self.axis = nn.Buffer(axis, persistent=False)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor):
        if position_ids.dim() == 2:
            position_ids = position_ids[None].expand(3, -1, -1)
        inv = self.inner.inv_freq.to(device=x.device, dtype=torch.float)
        freqs = position_ids[..., None].float() * inv                    # [3, B, n, half]
        pick = self.axis.to(x.device).expand(1, *freqs.shape[1:])
        freqs = freqs.gather(0, pick)[0]                                 # [B, n, half]
        emb = torch.cat([freqs, freqs], -1)
        scale = self.inner.attention_scaling
        return (emb.cos() * scale).to(x.dtype), (emb.sin() * scale).to(x.dtype)


class NormedOutput(nn.Module):
    """The head's output layer: ``lm_head(norm(g))`` (``norm`` None: already normed)."""

    def __init__(self, norm: nn.Module | None, lm_head: nn.Linear):
        super().__init__()
        self.norm, self.lm_head = norm, lm_head

    @property
    def weight(self) -> torch.Tensor:
        return self.lm_head.weight

    def forward(self, g: torch.Tensor) -> torch.Tensor:
        return self.lm_head(g if self.norm is None else self.norm(g))



def _uniform(cfg, name: str):
    """``cfg.<name>``, or None where it is absent or differs between layers (Gemma 4's
    per-layer configs refuse a global read): the head then takes its own default."""
    try:
        return getattr(cfg, name, None)
    except RuntimeError:          # transformers' AmbiguousGlobalPerLayerAttributeError
        return None

class Eagle3Head(DraftHead):
    """The EAGLE-3 head (module docstring). Load one with ``mmspec.drafters.layouts.load``
    (or a front door's ``head=``); build a fresh one with ``Eagle3Head.for_target``."""

    first_pair = False          # no pair for the prompt's first token (module docstring)
    train_output = True         # training updates lm_head (``own_parameters``)

    @property
    def mrope(self) -> bool:
        """The head's positions are its target's 3-D rotary positions (``mrope_section``)."""
        return self.config.mrope_section is not None

    def __init__(self, config: Eagle3Config):
        nn.Module.__init__(self)
        from transformers import LlamaForCausalLM

        self.config = c = config
        llama = c.llama()
        llama.vocab_size = 1   # the decoder's own table and output layer are never used
        n, h, eps = len(c.feature_layers), c.hidden_size, c.rms_norm_eps
        # the head's own modules, registered first: their names are the checkpoints'
        self.input_norm = LlamaRMSNorm(n * h, eps=eps) if c.norm_before_fc else None
        self.fc_norm = (nn.ModuleList(LlamaRMSNorm(h, eps=eps) for _ in range(n))
                        if c.fc_norm else None)
        self.fc = nn.Linear(n * h, h, bias=False)
        self.norm = LlamaRMSNorm(h, eps=eps)
        self.lm_head = nn.Linear(h, c.draft_vocab_size, bias=False)
        self.d2t = nn.Buffer(torch.zeros(c.draft_vocab_size, dtype=torch.long))
        self._ids = nn.Buffer(torch.arange(c.draft_vocab_size), persistent=False)
        self._set_reduced()
        self.decoder = LlamaForCausalLM(llama)   # (embeddings: the target's; output: lm_head)
        model = self.decoder.model
        model.layers[0] = Eagle3DecoderLayer(llama, 0, c.norm_before_residual)
        if c.mrope_section is not None:
            model.rotary_emb = MRopeRotaryEmbedding(llama, c.mrope_section, c.mrope_interleaved)
        model.norm = self.norm if c.norm_output else nn.Identity()
        self.target_layers: int | None = None      # the attached target's decoder layers
        self.decoder.lm_head = NormedOutput(None if c.norm_output else self.norm, self.lm_head)

    @property
    def layers(self) -> nn.ModuleList:
        """The head's decoder layers (the first an ``Eagle3DecoderLayer``)."""
        return self.decoder.model.layers

    @property
    def draft_ids(self) -> torch.Tensor:
        """The target id of each draft id: i + d2t[i] (kept beside ``d2t``)."""
        return self._ids

    def _set_reduced(self) -> None:
        """After ``d2t`` changes: the target ids, and whether logits need mapping (a reduced
        vocabulary, or a permuted one), a host flag read by every step without a sync."""
        self._ids.copy_(torch.arange(len(self.d2t), device=self.d2t.device) + self.d2t)
        self.reduced = (self.config.draft_vocab_size < self.config.vocab_size
                        or bool(self.d2t.any()))

    @classmethod
    def for_target(cls, target, feature_layers=None, draft_vocab_size=None, num_layers=1,
                   **kw) -> "Eagle3Head":
        """A fresh head for a transformers causal LM or VLM: its text decoder's sizes (an MLP
        as wide as the target's, or 3H where its config names none, as ``speculators``), the
        field's default layers (``layouts.default_feature_layers``) unless given, and the
        target's M-RoPE sections where its rotary embedding is M-RoPE over whole heads."""
        from ..sessions.causal_lm import _decoder_config
        from ..model_facts import output_vocab_size

        cfg = _decoder_config(target)
        v = output_vocab_size(target)
        layers = tuple(feature_layers or default_feature_layers(cfg.num_hidden_layers))
        rope = getattr(cfg, "rope_parameters", None) or {}
        head_dim = _uniform(cfg, "head_dim")
        dim = head_dim or cfg.hidden_size // cfg.num_attention_heads
        section = rope.get("mrope_section")
        if section and 2 * sum(section) == dim:        # an M-RoPE target: its 3-D positions
            kw.setdefault("mrope_section", tuple(section))
            kw.setdefault("mrope_interleaved", bool(rope.get("mrope_interleaved", False)))
        head = cls(Eagle3Config(
            hidden_size=cfg.hidden_size,
            intermediate_size=_uniform(cfg, "intermediate_size") or 3 * cfg.hidden_size,
            num_attention_heads=cfg.num_attention_heads,
            num_key_value_heads=_uniform(cfg, "num_key_value_heads") or cfg.num_attention_heads,
            head_dim=head_dim,
            vocab_size=v, draft_vocab_size=draft_vocab_size or v, feature_layers=layers,
            num_layers=num_layers, rms_norm_eps=getattr(cfg, "rms_norm_eps", 1e-6),
            rope_theta=rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0)),
            max_position_embeddings=getattr(cfg, "max_position_embeddings", 4096) or 4096,
            target=getattr(target, "name_or_path", "") or "", **kw))
        head.check_layers(cfg.num_hidden_layers)
        return head.attach(target)

    def check_layers(self, num_layers: int) -> None:
        """Refuse ``feature_layers`` outside a decoder of ``num_layers`` layers."""
        check_feature_layers(self.config.feature_layers, num_layers)

    def attach(self, target) -> "Eagle3Head":
        """Share ``target``'s input embeddings (checked against the config: its hidden size
        and vocabulary named when they differ, the feature layers against its layer count)."""
        from ..sessions.causal_lm import _decoder_config
        from ..model_facts import output_vocab_size

        c, cfg = self.config, _decoder_config(target)
        emb = target.get_input_embeddings()
        have = dict(hidden_size=cfg.hidden_size, vocab_size=output_vocab_size(target))
        want = dict(hidden_size=c.hidden_size, vocab_size=c.vocab_size)
        if have != want or not isinstance(emb, nn.Embedding):
            raise ValueError(f"this EAGLE-3 head was made for a target with {want} (target "
                             f"{c.target or '?'}); {type(target).__name__} has {have}: "
                             "accepted the target it was trained for")
        self.check_layers(cfg.num_hidden_layers)
        self.shared = (emb,)
        self.target_layers = cfg.num_hidden_layers
        self.decoder.model.embed_tokens = emb
        self.to(device=emb.weight.device, dtype=emb.weight.dtype)
        self.d2t.data, self._ids.data = self.d2t.data.long(), self._ids.data.long()
        return self

    def set_draft_ids(self, ids: torch.Tensor) -> None:
        """Draft the target ids ``ids`` (distinct, ``draft_vocab_size`` of them, sorted here):
        ``d2t`` = ids - arange (``init_output`` then starts the output rows as the target's)."""
        c = self.config
        ids = torch.as_tensor(ids, dtype=torch.long).flatten().sort().values
        if ids.numel() != c.draft_vocab_size or ids.unique().numel() != ids.numel() \
                or int(ids.min()) < 0 or int(ids.max()) >= c.vocab_size:
            raise ValueError(f"ids: accepted {c.draft_vocab_size} distinct ids in [0, "
                             f"{c.vocab_size - 1}] (the head's draft_vocab_size)")
        self.d2t.copy_((ids - torch.arange(len(ids))).to(self.d2t.device))
        self._set_reduced()

    def init_output(self, target_head: nn.Linear) -> None:
        """Start ``lm_head`` from the target's output rows of the draft ids (training's start,
        as the field's trainers do)."""
        with torch.no_grad():
            self.lm_head.weight.copy_(target_head.weight[self.draft_ids.to(
                target_head.weight.device)])

    def full_logits(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.reduced:
            return logits
        full = logits.new_full((*logits.shape[:-1], self.config.vocab_size), float("-inf"))
        ids = self.draft_ids.to(logits.device).expand(*logits.shape[:-1], -1)
        return full.scatter(-1, ids, logits)

    def reduce_features(self, features: torch.Tensor) -> torch.Tensor:
        if self.input_norm is not None:
            features = self.input_norm(features)
        if self.fc_norm is not None:
            parts = features.chunk(len(self.fc_norm), -1)
            features = torch.cat([norm(p) for norm, p in zip(self.fc_norm, parts)], -1)
        return self.fc(features)

    def inputs(self, token_embeds: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        return torch.cat([token_embeds, features], -1)

    # -- files -------------------------------------------------------------------------
    def own_parameters(self) -> list[nn.Parameter]:
        """What training updates: everything but the target's shared embeddings, and with
        ``train_output`` False the output layer (kept at the target's rows, as ``speculators``
        trains)."""
        fixed = {id(p) for p in self.decoder.model.embed_tokens.parameters()}
        if not self.train_output:
            fixed.add(id(self.lm_head.weight))
        return [p for p in self.parameters() if id(p) not in fixed]

    def state_to_save(self) -> dict:
        """The head's tensors under the ``speculators`` names (``layers.{i}.*``, ``fc``,
        ``norm``, ``lm_head``; ``d2t`` and ``t2d`` where the vocabulary is reduced, as the
        field writes them; the optional norms), the target's embeddings left out."""
        out = {}
        for k, v in self.state_dict().items():
            if k.startswith("decoder."):
                if not k.startswith("decoder.model.layers."):
                    continue
                k = k[len("decoder.model."):]
            out[k] = v
        if not self.reduced:
            del out["d2t"]
            return out
        t2d = torch.zeros(self.config.vocab_size, dtype=torch.bool, device=self.d2t.device)
        out["t2d"] = t2d.index_fill(0, self.draft_ids, True)
        return out

    def load_state(self, tensors: dict[str, torch.Tensor], where: str = "") -> None:
        """Load tensors named as ``state_to_save`` names them (``d2t`` and ``t2d`` required
        where the draft vocabulary is reduced, optional otherwise); a missing or unexpected
        name, a tensor of another shape, or a ``t2d`` that disagrees with ``d2t`` is an error
        naming it (``where``: the file, for the message)."""
        cfg = self.config
        where = where or "tensors"
        tensors = dict(tensors)
        t2d = tensors.pop("t2d", None)
        own = {k: v for k, v in self.state_dict().items() if not k.startswith("decoder.")}
        own.update({k[len("decoder.model."):]: v for k, v in self.state_dict().items()
                    if k.startswith("decoder.model.layers.")})
        optional = {"d2t"} if cfg.draft_vocab_size == cfg.vocab_size else set()
        missing = sorted(k for k in own if k not in tensors and k not in optional)
        unexpected = sorted(k for k in tensors if k not in own)
        shapes = [f"{k} {list(tensors[k].shape)} (accepted {list(own[k].shape)})"
                  for k in tensors if k in own and tensors[k].shape != own[k].shape]
        if missing or unexpected or shapes:
            raise ValueError(f"{where}: " + "; ".join(
                f"{what} {names}" for what, names in (("missing", missing),
                                                      ("not read by this head", unexpected),
                                                      ("misshaped", shapes)) if names))
        d2t = tensors.setdefault("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        ids = torch.arange(cfg.draft_vocab_size) + d2t.long().cpu()
        if ids.unique().numel() != len(ids) or int(ids.min()) < 0 \
                or int(ids.max()) >= cfg.vocab_size:
            raise ValueError(f"{where}: d2t maps draft ids outside [0, {cfg.vocab_size - 1}] "
                             "or two draft ids to one target id")
        if t2d is not None:
            mask = torch.zeros(cfg.vocab_size, dtype=torch.bool).index_fill(0, ids, True)
            if t2d.shape != mask.shape or not torch.equal(t2d.bool().cpu(), mask):
                raise ValueError(f"{where}: t2d does not mark the target ids that d2t maps the "
                                 "draft ids to")
        with torch.no_grad():
            params = dict(self.named_parameters())
            params.update(self.named_buffers())
            for k, v in tensors.items():
                name = f"decoder.model.{k}" if k.startswith("layers.") else k
                params[name].copy_(v.to(params[name].dtype) if v.is_floating_point() else v)
        self._set_reduced()

    def speculators_config(self, target: str | None = None, speculative_tokens: int = 3) -> dict:
        """The head's ``config.json`` in the ``speculators`` layout, every key vLLM's reader
        needs written (it defaults ``norm_before_residual`` to true; the layer ids are its own;
        the target as the verifier)."""
        c = self.config
        name = target or c.target
        merged = {"mmspec_merged_embeds": True} if c.merged_embeds else {}
        return {
            "architectures": ["Eagle3DraftModel"],
            "speculators_model_type": "eagle3",
            "speculators_version": "0.9.0",
            "speculators_config": {
                "algorithm": "eagle3",
                "proposal_methods": [{"proposal_type": "greedy",
                                      "speculative_tokens": int(speculative_tokens),
                                      "verifier_accept_k": 1, "accept_tolerance": 0.0}],
                "default_proposal_method": "greedy",
                "verifier": {"name_or_path": name,
                             "architectures": local_config(name).get("architectures") or []}},
            "transformer_layer_config": layer_config(c),
            "draft_vocab_size": c.draft_vocab_size,
            "target_hidden_size": c.hidden_size,
            "eagle_aux_hidden_state_layer_ids": list(c.feature_layers),
            "norm_before_residual": c.norm_before_residual, "norm_before_fc": c.norm_before_fc,
            "fc_norm": c.fc_norm, "norm_output": c.norm_output,
            "embed_requires_grad": False, "dtype": str(self.fc.weight.dtype).removeprefix("torch."),
            **merged,
        }

    def save_pretrained(self, path, target: str | None = None, speculative_tokens: int = 3) -> None:
        """Write the head in vLLM's ``speculators`` layout (vLLM serves it as it is;
        ``mmspec.drafters.layouts.export`` writes the others): ``target`` the verifier's name
        or path written in it (default the head's), ``speculative_tokens`` the chain vLLM
        drafts by default."""
        write(path, self.speculators_config(target, speculative_tokens), self.state_to_save())

    def reload(self, path) -> None:
        """Load the head's tensors saved in ``path`` (``save_pretrained``) into it."""
        self.load_state(read_tensors(Path(path)), str(Path(path) / WEIGHTS))

    @classmethod
    def from_pretrained(cls, path, target=None) -> "Eagle3Head":
        """A head in the ``speculators`` layout (``save_pretrained``), attached to ``target``
        (needed: its layer count resolves default layer ids; ``mmspec.drafters.layouts.load``
        reads every layout)."""
        path = Path(path)
        if target is None:
            raise ValueError(f"{path}: an EAGLE-3 head reads its target's sizes: accepted a "
                             "target model")
        tensors = read_tensors(path)
        head = cls(config_from_speculators(read_config(path), target))
        return head.attach(target).load_checked(tensors, str(path / WEIGHTS))

    def load_checked(self, tensors: dict, where: str) -> "Eagle3Head":
        """``load_state`` after checking a checkpoint's ``embed_tokens.weight``: it must be the
        target's input embeddings (a copy, as the field's trainers save it), dropped for the
        target's shared table."""
        tensors = dict(tensors)
        emb = tensors.pop("embed_tokens.weight", None)
        mine = self.shared[0].weight.detach()
        # equal up to the rounding of the coarser of the two dtypes (a bf16 target, an fp16 file)
        eps = max(torch.finfo(emb.dtype).eps, torch.finfo(mine.dtype).eps) if emb is not None \
            and emb.is_floating_point() else 0.0
        if emb is not None and (emb.shape != mine.shape or not torch.allclose(
                emb.float(), mine.to("cpu").float(), rtol=eps, atol=eps)):
            raise ValueError(f"{where}: embed_tokens.weight {list(emb.shape)} is not the "
                             f"target's input embeddings {list(mine.shape)}: heads with their own "
                             "trained embeddings are not supported (accepted a head trained with "
                             "the target's embeddings frozen, as the field's trainers do by "
                             "default)")
        self.load_state(tensors, where)
        return self


def _target_layers(target) -> int:
    from ..sessions.causal_lm import _decoder_config

    return _decoder_config(target).num_hidden_layers


NARROWER = "a head narrower or wider than its target (its own embeddings) is not supported"


def config_from_speculators(config: dict, target) -> Eagle3Config:
    """An ``Eagle3Config`` from a ``speculators`` config (its ids are hidden_states indices;
    none: the default layers of ``target``)."""
    kind = config.get("speculators_model_type")
    if kind != "eagle3":
        raise ValueError(f"speculators_model_type {kind!r}: accepted 'eagle3'")
    layer = config.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise ValueError("a speculators config without transformer_layer_config: accepted the "
                         "layout speculators writes")
    ids = config.get("eagle_aux_hidden_state_layer_ids")
    layers = (hidden_indices(ids, outputs=False) if ids
              else default_feature_layers(_target_layers(target)))
    th = config.get("target_hidden_size")
    if th is not None and th != layer.get("hidden_size"):
        raise ValueError(f"target_hidden_size {th} != hidden_size {layer.get('hidden_size')}: "
                         f"{NARROWER}")
    if "norm_before_residual" not in config:
        raise ValueError("a speculators config without norm_before_residual: speculators "
                         "defaults it to false and vLLM to true, so the head is another in "
                         "each; accepted the key written")
    verifier = config.get("speculators_config", {}).get("verifier", {})
    try:
        return config_from_layer(
            layer, vocab_size=layer["vocab_size"],
            draft_vocab_size=config.get("draft_vocab_size"), feature_layers=layers,
            target=verifier.get("name_or_path") or "",
            norm_before_residual=bool(config.get("norm_before_residual", False)),
            norm_before_fc=bool(config.get("norm_before_fc", False)),
            fc_norm=bool(config.get("fc_norm", False)),
            norm_output=bool(config.get("norm_output", False)),
            merged_embeds=bool(config.get("mmspec_merged_embeds", False)))
    except KeyError as e:
        raise ValueError(f"the speculators config lacks {e.args[0]!r}") from None
