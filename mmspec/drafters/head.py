"""A draft head trained on a target's own features (EAGLE-3 style), its config and files.

The head drafts token t + 2 from the pair (feature of position t, token t + 1):

    f_t   = reduce(concat(h_t^l for l in feature_layers))     the target's hidden states,
                                                              low/mid/high layers fused
                                                              (under guidance, optionally the
                                                              unconditional branch's too)
    e     = fuse(concat(embed(x_{t+1}), f_t))
    g_t   = decoder(e)                                        Llama decoder layers (one by
                                                              default), their own cache
                                                              (causal over pairs)
    q     = softmax(lm_head(g_t))                             the target's output head

With a reduced draft vocabulary (``draft_vocab_size`` = N, EAGLE-3's draft vocabulary) the
head's output layer is the target's output rows of N ids (``draft_ids``, chosen in training:
the ids with the most target probability mass): its logits over those N ids are scattered
back into the target's width with -inf elsewhere, so q is zero outside them (exact
verification stays lossless; the rows are copied from the target's head at ``attach``, the
ids are stored).

Drafting further than one token, the head's own output g_t stands in for the target's
feature of the next position (the head learns this with a multi-step loss,
``recipes.train.draft_head``). ``embed`` and ``lm_head`` are the target's (shared, not
stored); the head stores ``reduce``, ``fuse`` and its decoder (a ``LlamaForCausalLM`` of
``num_layers`` layers whose embeddings and output head are tied to the target's at
``attach``). Files: ``config.json`` (``HeadConfig``) and ``model.safetensors``.

``FrameHead`` is the same head over a delay-pattern decoder's frames: the frame's codebook
embeddings summed as its input, the target's C codebook heads as its output
(``mmspec.drafters.frame`` drafts with it). ``DepthHead`` is the same head over a
depth-decoder model's frames (CSM): its output stands in for the backbone's hidden state, and
the frame is drawn from it by the target's own backbone head and depth decoder
(``mmspec.drafters.depth`` drafts with it).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from ..model_facts import decoder_config, output_vocab_size
from .files import CONFIG, WEIGHTS, read_config, read_tensors, write


def default_layers(num_layers: int) -> tuple[int, ...]:
    """Low, middle and high layers' outputs (indices into ``hidden_states``: 0 is the
    embeddings, L the last layer's normed output)."""
    return tuple(sorted({1, (num_layers + 1) // 2, num_layers}))


def feature_layers_of(num_layers: int, feature_layers=None) -> tuple[int, ...]:
    """``feature_layers`` checked against a decoder of ``num_layers`` layers (default: low,
    middle and high, ``default_layers``)."""
    layers = tuple(feature_layers or default_layers(num_layers))
    if any(not 0 <= i <= num_layers for i in layers):
        raise ValueError(f"feature_layers={layers}: accepted indices in [0, {num_layers}] (0: "
                         "embeddings, L: the last layer)")
    return layers


@dataclass
class HeadConfig:
    """hidden_size:     the target's hidden size (the head's width).
    feature_layers:  indices into the target's ``hidden_states`` that are fused.
    num_heads, intermediate_size, rope_theta: the decoder layer's.
    vocab_size:      the target's output width.
    max_position_embeddings: positions the decoder layer's rotary embedding serves.
    target:          the target it was trained for (a name or path; informational).
    draft_vocab_size: None (the target's whole output head) or N < vocab_size: the head
                     drafts only ``draft_ids`` (module docstring).
    codebooks:       None (a token head) or C: a frame head over a delay-pattern decoder's C
                     codebooks (``mmspec.drafters.frame.FrameHead``; vocab_size is a
                     codebook's).
    depth_decoder:   a frame head over a depth-decoder model's C codebooks (``DepthHead``:
                     CSM), not a delay-pattern decoder's.
    uncond_features: for targets sampled with classifier-free guidance: the unconditional
                     branch's features of the same layers are fused too (the guided
                     distribution is (1 - s) l_u + s l_c in logits: the head sees both
                     branches); such a head drafts only with guidance on.
    num_layers:      the head's decoder layers (EAGLE-3's: one).
    merged_embeds:   the prompt's token embeddings are the target's decoder inputs
                     (``hidden_states[0]`` of its prompt pass): at a VLM's image placeholders
                     the merged image features, as vLLM hands its EAGLE-3 drafter, where the
                     placeholder id's embedding carries nothing; elsewhere each id's
                     embedding. False (heads trained before it, and SpecForge's VLM heads):
                     the placeholder id's embedding. A head drafts as it was trained
                     (``recipes.train.draft_head --merged-embeds``).
    """

    hidden_size: int
    feature_layers: tuple[int, ...]
    vocab_size: int
    num_heads: int = 4
    intermediate_size: int | None = None
    rope_theta: float = 10000.0
    max_position_embeddings: int = 4096
    target: str = ""
    draft_vocab_size: int | None = None
    codebooks: int | None = None
    depth_decoder: bool = False
    uncond_features: bool = False
    num_layers: int = 1
    merged_embeds: bool = False

    def llama(self):
        """The head decoder's ``LlamaConfig`` (``num_layers`` layers)."""
        from transformers import LlamaConfig

        return LlamaConfig(vocab_size=self.vocab_size, hidden_size=self.hidden_size,
                           intermediate_size=self.intermediate_size or 2 * self.hidden_size,
                           num_hidden_layers=self.num_layers, num_attention_heads=self.num_heads,
                           num_key_value_heads=self.num_heads, rope_theta=self.rope_theta,
                           max_position_embeddings=self.max_position_embeddings,
                           tie_word_embeddings=False, bos_token_id=None, eos_token_id=None,
                           pad_token_id=None)


class DraftHead(nn.Module):
    """The head (module docstring). Build it for a target with ``DraftHead.for_target``,
    load one with ``DraftHead.from_pretrained``; ``attach(target)`` shares the target's
    embeddings and output head before use.

    ``first_pair``: the prompt's first token is paired with a zero feature (mmspec's heads
    train so); heads trained elsewhere (EAGLE-3 checkpoints, MTP modules) see no pair for it,
    so the pair (f_t, x_{t+1}) sits at the target's position of t, as in vLLM and SGLang.
    ``mrope``: the head's positions are its target's 3-D rotary positions (M-RoPE heads)."""

    first_pair = True
    mrope = False

    def __init__(self, config: HeadConfig):
        super().__init__()
        from transformers import LlamaForCausalLM

        self.config = config
        d, n = config.hidden_size, len(config.feature_layers)
        n *= 2 if config.uncond_features else 1         # the unconditional branch's after them
        vd = config.draft_vocab_size
        if isinstance(config.num_layers, bool) or not isinstance(config.num_layers, int) \
                or config.num_layers < 1:
            raise ValueError(f"num_layers={config.num_layers!r}: accepted an integer >= 1 (the "
                             "head's decoder layers)")
        if config.merged_embeds and (config.uncond_features or config.codebooks):
            raise ValueError("merged_embeds: accepted for token heads over the conditional "
                             "features (a VLM's), not with uncond_features or codebooks")
        if vd is not None and not (isinstance(vd, int) and 1 <= vd < config.vocab_size):
            raise ValueError(f"draft_vocab_size={vd!r}: accepted None or an integer in [1, "
                             f"{config.vocab_size - 1}] (fewer ids than the target's "
                             f"{config.vocab_size})")
        self.reduce = nn.Linear(n * d, d, bias=False)
        self.fuse = nn.Linear(2 * d, d, bias=False)
        self.decoder = LlamaForCausalLM(config.llama())
        if vd is not None:
            self.register_buffer("draft_ids", torch.arange(vd))

    @classmethod
    def for_target(cls, target, feature_layers=None, **kw) -> "DraftHead":
        """A fresh head for a transformers causal LM or VLM (its text decoder's sizes)."""
        cfg = decoder_config(target)
        layers = feature_layers_of(cfg.num_hidden_layers, feature_layers)
        head = cls(HeadConfig(hidden_size=cfg.hidden_size, feature_layers=layers,
                              target=getattr(target, "name_or_path", "") or "",
                              vocab_size=output_vocab_size(target),
                              num_heads=kw.pop("num_heads", max(1, cfg.hidden_size // 64)),
                              max_position_embeddings=getattr(cfg, "max_position_embeddings",
                                                              4096) or 4096, **kw))
        head.attach(target)
        return head

    def attach(self, target) -> "DraftHead":
        """Share ``target``'s input embeddings and output head (checked against the config;
        ``shared`` holds them)."""
        emb, out = target.get_input_embeddings(), target.get_output_embeddings()
        if not isinstance(emb, nn.Embedding) or not isinstance(out, nn.Linear):
            raise ValueError(f"a draft head shares one input embedding table and one output head "
                             f"with its target; {type(target).__name__} has "
                             f"{type(emb).__name__} and {type(out).__name__} (multi-codebook "
                             "models are not supported)")
        v, d = self.config.vocab_size, self.config.hidden_size
        if tuple(out.weight.shape) != (v, d) or emb.weight.shape[1] != d:
            raise ValueError(f"this head was made for an output head of [{v}, {d}] (target "
                             f"{self.config.target or '?'}); the target has "
                             f"{tuple(out.weight.shape)}: accepted the target it was trained for")
        # the target's modules, kept in a tuple (not registered: not the head's weights)
        self.shared = (emb, out)
        dec = self.decoder
        dec.model.embed_tokens = emb
        self.to(device=out.weight.device, dtype=out.weight.dtype)
        dec.lm_head = out if self.config.draft_vocab_size is None else self._reduced(out)
        return self

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the head's weights (its target's, once attached)."""
        return next(self.parameters()).dtype

    def own_parameters(self) -> list[nn.Parameter]:
        """What training updates: the head's weights, not the target's shared embeddings and
        output head (nor the rows copied from it)."""
        return [p for n, p in self.named_parameters() if not n.startswith(
            ("decoder.model.embed_tokens", "decoder.lm_head"))]

    def set_draft_ids(self, ids: torch.Tensor) -> None:
        """Draft only ``ids`` (distinct ids of the target's output head, ``draft_vocab_size``
        of them); the output rows are copied from the attached target's head."""
        vd, v = self.config.draft_vocab_size, self.config.vocab_size
        ids = torch.as_tensor(ids, dtype=torch.long).flatten()
        if vd is None or ids.numel() != vd or ids.unique().numel() != vd or int(ids.min()) < 0 \
                or int(ids.max()) >= v:
            raise ValueError(f"ids: accepted {vd} distinct ids in [0, {v - 1}] (the head's "
                             "draft_vocab_size)")
        self.draft_ids.copy_(ids.sort().values.to(self.draft_ids.device))
        self.decoder.lm_head = self._reduced(self.shared[1])

    def _reduced(self, out: nn.Linear) -> nn.Linear:
        """An output layer of the target's rows at ``draft_ids`` (derived, not trained)."""
        layer = nn.Linear(out.in_features, len(self.draft_ids), bias=out.bias is not None,
                          device=out.weight.device, dtype=out.weight.dtype)
        with torch.no_grad():
            layer.weight.copy_(out.weight[self.draft_ids.to(out.weight.device)])
            if out.bias is not None:
                layer.bias.copy_(out.bias[self.draft_ids.to(out.weight.device)])
        layer.requires_grad_(False)
        return layer

    def full_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The decoder's logits [..., N or V] in the target's width [..., V]: with a reduced
        vocabulary, -inf outside ``draft_ids``."""
        if self.config.draft_vocab_size is None:
            return logits
        full = logits.new_full((*logits.shape[:-1], self.config.vocab_size), float("-inf"))
        ids = self.draft_ids.to(logits.device).expand(*logits.shape[:-1], -1)
        return full.scatter(-1, ids, logits)

    def reduce_features(self, features: torch.Tensor) -> torch.Tensor:
        """The target's fused features [..., F] (``feature_layers`` concatenated) -> [..., d]."""
        return self.reduce(features)

    def inputs(self, token_embeds: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """Decoder inputs [B, n, d] for the tokens' embeddings [B, n, d] (the target's input
        embeddings of them) and their features [B, n, d] (reduced target features, or the
        head's own outputs)."""
        return self.fuse(torch.cat([token_embeds, features], -1))

    # -- files -------------------------------------------------------------------------
    def state_to_save(self) -> dict:
        """The head's own weights (the target's shared embeddings and output head left out)."""
        return {k: v for k, v in self.state_dict().items()
                if not k.startswith(("decoder.model.embed_tokens", "decoder.lm_head"))}

    def save_pretrained(self, path) -> None:
        """Write ``config.json`` and ``model.safetensors`` (the head's own weights) to ``path``."""
        cfg = asdict(self.config)
        cfg["feature_layers"] = list(cfg["feature_layers"])
        write(path, cfg, self.state_to_save())

    def reload(self, path) -> None:
        """Load the head's own weights saved in ``path`` (``save_pretrained``) into it."""
        self.load_state_dict(type(self).from_pretrained(path).state_to_save(), strict=False)

    @classmethod
    def from_pretrained(cls, path, target=None) -> "DraftHead":
        """A saved head (a folder with config.json and model.safetensors); ``target``:
        attach to it now. A config or weights file that cannot be read is named."""
        path = Path(path)
        if not (path / CONFIG).is_file() or not (path / WEIGHTS).is_file():
            raise ValueError(f"{path}: accepted a folder with {CONFIG} and {WEIGHTS} (a head "
                             "saved by DraftHead.save_pretrained)")
        raw = read_config(path)
        try:
            raw["feature_layers"] = tuple(raw["feature_layers"])
            if raw.get("depth_decoder"):                      # frame heads: their own attach
                cls = DepthHead
            elif raw.get("codebooks"):
                cls = FrameHead
            config = HeadConfig(**raw)
        except (KeyError, TypeError) as e:
            raise ValueError(f"{path / CONFIG}: not a DraftHead config ({e})") from None
        head = cls(config)
        missing, unexpected = head.load_state_dict(read_tensors(path), strict=False)
        own_missing = [k for k in missing if not k.startswith(("decoder.model.embed_tokens",
                                                               "decoder.lm_head"))]
        if own_missing or unexpected:
            raise ValueError(f"{path / WEIGHTS}: missing {own_missing}, unexpected {unexpected}")
        return head.attach(target) if target is not None else head


def find_delay_decoder(target) -> nn.Module | None:
    """The delay-pattern decoder (a module with ``lm_heads`` and ``model.decoder.embed_tokens``)
    of a ``MusicgenForConditionalGeneration``, a decoder with a separate text encoder, or the
    decoder itself; None for other models."""
    for m in (target, getattr(target, "decoder", None)):
        if m is not None and isinstance(getattr(m, "lm_heads", None), nn.ModuleList):
            return m
    return None


def delay_decoder(target) -> nn.Module:
    """``find_delay_decoder``, refusing other models."""
    dec = find_delay_decoder(target)
    if dec is None:
        raise ValueError(f"a frame head shares a delay-pattern decoder's codebook embeddings and "
                         f"heads; {type(target).__name__} has no lm_heads: accepted a "
                         "MusicGen-style model")
    return dec


class FrameHead(DraftHead):
    """A draft head over the frames of a delay-pattern decoder (module docstring). Build one
    with ``FrameHead.for_target``; files as ``DraftHead`` (``codebooks`` in the config)."""

    def __init__(self, config: HeadConfig):
        if not config.codebooks or config.draft_vocab_size is not None \
                or config.uncond_features:
            raise ValueError(f"codebooks={config.codebooks!r}, draft_vocab_size="
                             f"{config.draft_vocab_size!r}, uncond_features="
                             f"{config.uncond_features!r}: a frame head needs codebooks >= 1, "
                             "the codebooks' whole vocabulary and the conditional features only")
        super().__init__(config)
        self.decoder.lm_head = nn.Identity()      # the decoder's output is g; heads shared

    @classmethod
    def for_target(cls, target, feature_layers=None, **kw) -> "FrameHead":
        """A fresh frame head for a delay-pattern model (its decoder's sizes)."""
        dec = delay_decoder(target)
        cfg = dec.config
        layers = feature_layers_of(cfg.num_hidden_layers, feature_layers)
        head = cls(HeadConfig(hidden_size=cfg.hidden_size, feature_layers=layers,
                              vocab_size=cfg.vocab_size, codebooks=len(dec.lm_heads),
                              target=getattr(target, "name_or_path", "") or "",
                              num_heads=kw.pop("num_heads", max(1, cfg.hidden_size // 64)),
                              max_position_embeddings=kw.pop("max_position_embeddings", 4096),
                              **kw))
        return head.attach(target)

    def attach(self, target) -> "FrameHead":
        """Share the target decoder's codebook embeddings and heads (checked against the
        config; ``shared`` holds them)."""
        dec = delay_decoder(target)
        tables, heads = dec.model.decoder.embed_tokens, dec.lm_heads
        c, v, d = self.config.codebooks, self.config.vocab_size, self.config.hidden_size
        shapes = [tuple(h.weight.shape) for h in heads]
        if len(heads) != c or any(s != (v, d) for s in shapes):
            raise ValueError(f"this head was made for {c} codebook heads of [{v}, {d}] (target "
                             f"{self.config.target or '?'}); the target has {shapes}: accepted "
                             "the target it was trained for")
        self.shared = (tables, heads)
        self.to(device=heads[0].weight.device, dtype=heads[0].weight.dtype)
        self.decoder.model.embed_tokens = tables[0]          # unused: inputs are embeddings
        return self

    def event_logits(self, g: torch.Tensor) -> torch.Tensor:
        """The codebook heads on the head's outputs [..., d] -> [..., C, V]."""
        return torch.stack([h(g) for h in self.shared[1]], -2)


DEPTH_PARTS = ("backbone_model", "lm_head", "depth_decoder")


def is_depth_model(target) -> bool:
    """A depth-decoder speech model (a backbone with ``embed_tokens`` summing the codebooks,
    ``lm_head`` for codebook 0 and a ``depth_decoder``: CSM)."""
    return all(hasattr(target, p) for p in DEPTH_PARTS)


def depth_model(target) -> nn.Module:
    """``target`` when ``is_depth_model``, else refused by name."""
    parts = DEPTH_PARTS
    if not is_depth_model(target):
        raise ValueError(f"a depth head shares a depth-decoder model's backbone embeddings, head "
                         f"and depth decoder; {type(target).__name__} has no "
                         f"{', '.join(p for p in parts if not hasattr(target, p))}: accepted a "
                         "CSM-style model (CsmForConditionalGeneration)")
    return target


class DepthHead(DraftHead):
    """A draft head over the frames of a depth-decoder speech model (CSM): it drafts the
    backbone's hidden state of the next frame from the pair (feature of frame t, frame t + 1);
    codebook 0 is drawn from the target's backbone head on it, codebooks 1..C-1 from the
    target's own depth decoder (``mmspec.drafters.depth``). Build one with
    ``DepthHead.for_target``; files as ``DraftHead`` (``codebooks``, ``depth_decoder`` in the
    config)."""

    def __init__(self, config: HeadConfig):
        if not config.codebooks or not config.depth_decoder \
                or config.draft_vocab_size is not None or config.uncond_features:
            raise ValueError(f"codebooks={config.codebooks!r}, depth_decoder="
                             f"{config.depth_decoder!r}, draft_vocab_size="
                             f"{config.draft_vocab_size!r}, uncond_features="
                             f"{config.uncond_features!r}: a depth head needs codebooks >= 1, "
                             "depth_decoder=True, the codebooks' whole vocabulary and the "
                             "conditional features only")
        super().__init__(config)
        self.decoder.lm_head = nn.Identity()      # the decoder's output is the hidden state

    @classmethod
    def for_target(cls, target, feature_layers=None, **kw) -> "DepthHead":
        """A fresh depth head for a CSM-style model (its backbone's sizes)."""
        cfg = depth_model(target).config
        layers = feature_layers_of(cfg.num_hidden_layers, feature_layers)
        head = cls(HeadConfig(hidden_size=cfg.hidden_size, feature_layers=layers,
                              vocab_size=cfg.vocab_size, codebooks=int(cfg.num_codebooks),
                              depth_decoder=True,
                              target=getattr(target, "name_or_path", "") or "",
                              num_heads=kw.pop("num_heads", max(1, cfg.hidden_size // 64)),
                              max_position_embeddings=kw.pop("max_position_embeddings", 4096),
                              **kw))
        return head.attach(target)

    def attach(self, target) -> "DepthHead":
        """Share the target's backbone head (checked against the config; ``shared`` holds the
        target, whose backbone embeddings, head and depth decoder draw the frames)."""
        out = depth_model(target).lm_head
        c, v, d = self.config.codebooks, self.config.vocab_size, self.config.hidden_size
        have = (int(target.config.num_codebooks), *out.weight.shape)
        if have != (c, v, d):
            raise ValueError(f"this head was made for {c} codebooks and a head of [{v}, {d}] "
                             f"(target {self.config.target or '?'}); the target has "
                             f"{have[0]} and {list(have[1:])}: accepted the target it was "
                             "trained for")
        self.shared = (target,)
        self.to(device=out.weight.device, dtype=out.weight.dtype)
        self.decoder.model.embed_tokens = target.backbone_model.embed_tokens.embed_audio_tokens
        return self
