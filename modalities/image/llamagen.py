"""A LlamaGen-style GPT over VQ tokens (Sun et al. 2024), written as a transformers model.

LlamaGen lives outside transformers; this module reproduces its computation so that its
checkpoints run here, with transformers' ``PreTrainedModel`` plumbing (safetensors,
``from_pretrained``, ``save_pretrained``) and transformers caches (so mmspec's sessions roll it
back like any other model). Module names follow LlamaGen's ``Transformer`` so that a LlamaGen
state dict loads with the identity mapping (``load_llamagen_state_dict``):

    cls_embedding.embedding_table.weight   class-conditional: [num_classes (+1 null), dim]
    cls_embedding.cap_proj.fc1/fc2.weight  text-conditional: caption MLP (tanh-GELU)
    cls_embedding.uncond_embedding         text-conditional: null caption [token_num, caption_dim]
    tok_embeddings.weight                  [vocab_size, dim]
    layers.{i}.attention.wqkv.weight       fused q, k, v
    layers.{i}.attention.wo.weight
    layers.{i}.feed_forward.w1/w2/w3.weight SwiGLU
    layers.{i}.attention_norm.weight, layers.{i}.ffn_norm.weight   RMSNorm
    norm.weight, output.weight

Faithful details: 2-D rotary embedding over the token grid in LlamaGen's interleaved layout,
with the conditioning tokens' rotation table set to zero exactly as LlamaGen does (their q and
k vanish); RMSNorm in float32; logits in float32. Released LlamaGen weights are ``.pt``
pickles: mmspec never unpickles; convert them to safetensors with your own trusted tooling
and pass the state dict (or the safetensors file) here.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast


class LlamaGenConfig(PretrainedConfig):
    model_type = "mmspec_llamagen"

    def __init__(self, vocab_size=16384, dim=768, n_layer=12, n_head=12, n_kv_head=None,
                 multiple_of=256, ffn_dim_multiplier=None, rope_base=10000.0, norm_eps=1e-5,
                 model_type_cond="c2i", num_classes=1000, caption_dim=2048, cls_token_num=1,
                 class_dropout_prob=0.1, block_size=256, initializer_range=0.02, **kwargs):
        self.vocab_size, self.dim, self.n_layer, self.n_head = vocab_size, dim, n_layer, n_head
        self.n_kv_head = n_kv_head if n_kv_head is not None else n_head
        self.multiple_of, self.ffn_dim_multiplier = multiple_of, ffn_dim_multiplier
        self.rope_base, self.norm_eps = rope_base, norm_eps
        self.model_type_cond = model_type_cond
        self.num_classes, self.caption_dim = num_classes, caption_dim
        self.cls_token_num, self.class_dropout_prob = cls_token_num, class_dropout_prob
        self.block_size, self.initializer_range = block_size, initializer_range
        # transformers' cache helpers read these names
        self.num_hidden_layers = n_layer
        self.hidden_size = dim
        self.num_attention_heads = n_head
        self.num_key_value_heads = self.n_kv_head
        self.max_position_embeddings = cls_token_num + block_size
        super().__init__(**kwargs)
        grid = int(round(math.sqrt(block_size)))
        if grid * grid != block_size:
            raise ValueError(f"block_size={block_size}: accepted a square number of tokens")

    @property
    def grid_size(self) -> int:
        """Side of the square token grid: sqrt(block_size)."""
        return int(round(math.sqrt(self.block_size)))


def find_multiple(n: int, k: int) -> int:
    return n if n % k == 0 else n + k - (n % k)


def rope_2d(grid: int, head_dim: int, base: float, cls_tokens: int) -> torch.Tensor:
    """[cls + grid^2, head_dim // 2, 2] (cos, sin) table; zeros for conditioning tokens."""
    half = head_dim // 2
    freqs = 1.0 / (base ** (torch.arange(0, half, 2)[: half // 2].float() / half))
    t = torch.arange(grid).float()
    f = torch.outer(t, freqs)
    grid_f = torch.cat([f[:, None, :].expand(-1, grid, -1), f[None, :, :].expand(grid, -1, -1)], -1)
    cache = torch.stack([torch.cos(grid_f), torch.sin(grid_f)], -1).flatten(0, 1)
    return torch.cat([torch.zeros(cls_tokens, head_dim // 2, 2), cache])


def apply_rope(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """x [B, n, H, D], table [B, n, D/2, 2] -> rotated x (interleaved pairs, as LlamaGen)."""
    xs = x.float().reshape(*x.shape[:-1], -1, 2)
    t = table[:, :, None]
    out = torch.stack([xs[..., 0] * t[..., 0] - xs[..., 1] * t[..., 1],
                       xs[..., 1] * t[..., 0] + xs[..., 0] * t[..., 1]], -1)
    return out.flatten(3).type_as(x)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


class LabelEmbedder(nn.Module):
    def __init__(self, num_classes: int, dim: int, dropout_prob: float):
        super().__init__()
        self.embedding_table = nn.Embedding(num_classes + int(dropout_prob > 0), dim)


class CaptionMLP(nn.Module):
    def __init__(self, cin: int, hidden: int, cout: int):
        super().__init__()
        self.fc1 = nn.Linear(cin, hidden, bias=False)
        self.fc2 = nn.Linear(hidden, cout, bias=False)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class CaptionEmbedder(nn.Module):
    def __init__(self, caption_dim: int, dim: int, token_num: int):
        super().__init__()
        self.cap_proj = CaptionMLP(caption_dim, dim, dim)
        self.register_buffer("uncond_embedding", torch.randn(token_num, caption_dim) / caption_dim ** 0.5)


class Attention(nn.Module):
    def __init__(self, cfg: LlamaGenConfig, layer_idx: int):
        super().__init__()
        self.n_head, self.n_kv_head = cfg.n_head, cfg.n_kv_head
        self.head_dim = cfg.dim // cfg.n_head
        self.dim = cfg.dim
        self.layer_idx = layer_idx
        self.wqkv = nn.Linear(cfg.dim, (cfg.n_head + 2 * cfg.n_kv_head) * self.head_dim, bias=False)
        self.wo = nn.Linear(cfg.dim, cfg.dim, bias=False)

    def forward(self, x, rope, mask, cache):
        b, n, _ = x.shape
        kv = self.n_kv_head * self.head_dim
        q, k, v = self.wqkv(x).split([self.dim, kv, kv], dim=-1)
        q = apply_rope(q.view(b, n, self.n_head, self.head_dim), rope).transpose(1, 2)
        k = apply_rope(k.view(b, n, self.n_kv_head, self.head_dim), rope).transpose(1, 2)
        v = v.view(b, n, self.n_kv_head, self.head_dim).transpose(1, 2)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        k, v = k[:, :, :mask.shape[-1]], v[:, :, :mask.shape[-1]]   # a static cache's slots in use
        rep = self.n_head // self.n_kv_head
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.wo(out.transpose(1, 2).reshape(b, n, self.dim))


class FeedForward(nn.Module):
    def __init__(self, cfg: LlamaGenConfig):
        super().__init__()
        hidden = int(2 * (4 * cfg.dim) / 3)
        if cfg.ffn_dim_multiplier is not None:
            hidden = int(cfg.ffn_dim_multiplier * hidden)
        hidden = find_multiple(hidden, cfg.multiple_of)
        self.w1 = nn.Linear(cfg.dim, hidden, bias=False)
        self.w3 = nn.Linear(cfg.dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, cfg.dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, cfg: LlamaGenConfig, layer_idx: int):
        super().__init__()
        self.attention = Attention(cfg, layer_idx)
        self.feed_forward = FeedForward(cfg)
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)

    def forward(self, x, rope, mask, cache):
        h = x + self.attention(self.attention_norm(x), rope, mask, cache)
        return h + self.feed_forward(self.ffn_norm(h))


class LlamaGenForImageGeneration(PreTrainedModel):
    """LlamaGen's GPT. ``forward`` takes image-token ids and/or ready embeddings (conditioning
    tokens come from ``condition_embeddings``), a 2-D attention mask over every cache slot (or
    the 4-D mask of a static cache's slots in use, bool or additive), position ids into the
    (cls + grid) rotary table, and a transformers cache."""

    config_class = LlamaGenConfig
    base_model_prefix = "llamagen"
    _supports_sdpa = True

    def __init__(self, config: LlamaGenConfig):
        super().__init__(config)
        if config.model_type_cond == "c2i":
            self.cls_embedding = LabelEmbedder(config.num_classes, config.dim,
                                               config.class_dropout_prob)
        elif config.model_type_cond == "t2i":
            self.cls_embedding = CaptionEmbedder(config.caption_dim, config.dim,
                                                 config.cls_token_num)
        else:
            raise ValueError(f"model_type_cond={config.model_type_cond!r}: accepted 'c2i' or 't2i'")
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleList(Block(config, i) for i in range(config.n_layer))
        self.norm = RMSNorm(config.dim, config.norm_eps)
        self.output = nn.Linear(config.dim, config.vocab_size, bias=False)
        self.register_buffer("rope", rope_2d(config.grid_size, config.dim // config.n_head,
                                             config.rope_base, config.cls_token_num),
                             persistent=False)
        self.post_init()

    def _init_weights(self, module):
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, nn.Embedding)):
            module.weight.data.normal_(0.0, std)

    def get_input_embeddings(self):
        return self.tok_embeddings

    def get_output_embeddings(self):
        """The output head (codebook logits), as transformers models expose it."""
        return self.output

    # -- conditioning ---------------------------------------------------------------------
    def condition_embeddings(self, cond: torch.Tensor, drop: torch.Tensor | None = None) -> torch.Tensor:
        """Class ids [B] or caption embeddings [B, T, caption_dim] -> [B, cls_token_num, dim].

        drop [B] bool selects the null condition (the unconditional branch of guidance)."""
        cfg = self.config
        if cfg.model_type_cond == "c2i":
            labels = cond.long()
            if drop is not None:
                labels = torch.where(drop, cfg.num_classes, labels)
            return self.cls_embedding.embedding_table(labels)[:, None]
        cap = cond
        if drop is not None:
            cap = torch.where(drop[:, None, None], self.cls_embedding.uncond_embedding.to(cap.dtype), cap)
        return self.cls_embedding.cap_proj(cap)[:, : cfg.cls_token_num]

    # -- forward ----------------------------------------------------------------------------
    def forward(self, input_ids=None, inputs_embeds=None, attention_mask=None, position_ids=None,
                cache=None, use_cache=None, labels=None, output_hidden_states=None, **kwargs):
        h = self.tok_embeddings(input_ids) if inputs_embeds is None else inputs_embeds
        b, n, _ = h.shape
        past = cache.get_seq_length() if cache is not None else 0
        if position_ids is None:
            position_ids = torch.arange(past, past + n, device=h.device)[None].expand(b, -1)
        rope = self.rope.to(h.device)[position_ids]          # IndexError past the grid
        mask = (attention_mask if attention_mask is not None and attention_mask.dim() == 4
                else _causal_mask(attention_mask, b, n, past, h.device))                 # [B,1,n,L]
        states = [h]
        for layer in self.layers:
            h = layer(h, rope, mask, cache)
            states.append(h)
        h = self.norm(h)
        states[-1] = h                # as transformers: the last entry is the normed output
        logits = self.output(h).float()
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                   ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits,
                                      hidden_states=tuple(states) if output_hidden_states else None)


def _causal_mask(attention_mask, b: int, n: int, past: int, device) -> torch.Tensor:
    """[B, 1, n, past + n] bool from a 2-D mask over every slot (None: all real)."""
    total = past + n
    if attention_mask is None:
        attention_mask = torch.ones(b, total, dtype=torch.long, device=device)
    slots = torch.arange(total, device=device)
    causal = slots[None, :] <= (past + torch.arange(n, device=device))[:, None]          # [n, L]
    mask = causal[None] & attention_mask[:, None, :].bool()
    mask |= (slots[None, None, :] == (past + torch.arange(n, device=device))[None, :, None])
    return mask[:, None]


def load_llamagen_state_dict(model: LlamaGenForImageGeneration, state_dict_or_path) -> None:
    """Load LlamaGen weights (its key layout; a state dict or a safetensors file).

    The mapping is the identity on names (module names mirror LlamaGen's); a leading
    ``module.`` (DDP) or ``_orig_mod.`` (torch.compile) prefix is stripped, LlamaGen's
    non-persistent ``freqs_cis`` is ignored, and every other mismatch raises, naming the keys.
    """
    if isinstance(state_dict_or_path, (str, bytes)) or hasattr(state_dict_or_path, "__fspath__"):
        from safetensors.torch import load_file

        sd = load_file(str(state_dict_or_path))
    else:
        sd = dict(state_dict_or_path)
    clean = {}
    for k, v in sd.items():
        for prefix in ("module.", "_orig_mod."):
            if k.startswith(prefix):
                k = k[len(prefix):]
        if k == "freqs_cis":
            continue
        clean[k] = v
    own = model.state_dict()
    missing = sorted(set(own) - set(clean))
    unexpected = sorted(set(clean) - set(own))
    if missing or unexpected:
        raise ValueError(f"LlamaGen state dict does not match the config: missing {missing[:8]}, "
                         f"unexpected {unexpected[:8]}")
    for k, v in clean.items():
        if own[k].shape != v.shape:
            raise ValueError(f"{k}: checkpoint shape {tuple(v.shape)} != model {tuple(own[k].shape)}")
    model.load_state_dict(clean, strict=True)
