"""Image-token targets: what the pipeline and the core need from each generator.

Every adapter exposes the same small surface, in a *compact id space* where ids
[0, num_visual) are codebook entries (Emu3 adds one id for its end-of-row token):

    grid              (rows, cols) of the generated span (cols counts Emu3's EOL column)
    vocab_size        size of the compact space the rules see
    session(params, guidance_scale) -> a Session (guided as a doubled batch)
    prompt_batch(prompts, negative, guided) -> input_ids / masks for the session's prefill
    codebook_embeddings() -> [vocab_size, d] table for LANTERN / GSD / PCG neighbourhoods
    decode(tokens [B, N]) -> images [B, 3, H, W] in [0, 1]
    jacobi_defaults  the span, grid width and id range Jacobi initialises from

Guidance lives here: unconditional rows are the adapter's null prompt (Janus: every prompt
token but BOS/BOI replaced by pad, as transformers does; Emu3 and token-span models: the
negative prompt or an empty caption; LlamaGen: the null class / null caption), and the rule
only ever sees u + s (c - u) after top-k.
"""

from __future__ import annotations

import torch

from mmspec.sampling import SamplingParams
from mmspec.sessions import CausalLMSession, TokenSpanSession
from modalities.padding import left_pad  # noqa: F401  (re-exported)
from modalities.registry import register_adapter

from .vq import VQTokenizer


def pad_together(rows: list[list[int]], other: list[list[int]], pad: int):
    """Left-pad two row lists to one common width (conditional and unconditional prompts)."""
    ids, mask = left_pad(rows + other, pad)
    n = len(rows)
    return ids[:n], mask[:n], ids[n:], mask[n:]


def _device(model) -> torch.device:
    return next(model.parameters()).device


class ImageAdapter:
    """Base class of image-token adapters: the surface the module docstring lists, in the compact
    id space; subclasses provide ``session``, ``prompt_batch``, ``codebook_embeddings`` and
    ``decode`` and register themselves with ``register_adapter``."""
    kind = "image"
    class_conditional = False
    jacobi_init = "uniform"

    def check_prompts(self, prompts: list, name: str = "prompt") -> None:
        """Refuse prompts this adapter cannot encode, naming them (``name``: the parameter,
        ``prompt`` or ``negative_prompt``), before any model runs: strings or token-id lists
        (adapters check their vocabulary on top)."""
        for i, p in enumerate(prompts):
            if isinstance(p, str):
                continue
            if not isinstance(p, (list, tuple)) or not all(
                    isinstance(t, int) and not isinstance(t, bool) for t in p):
                raise ValueError(f"{name} {i}: {p!r:.60}: accepted a string or a list of token "
                                 "ids")

    def __init__(self, model, grid: tuple[int, int], num_visual: int):
        self.model = model
        self.grid = tuple(grid)
        self.num_visual = int(num_visual)

    # -- shape -------------------------------------------------------------------------------
    @property
    def num_tokens(self) -> int:
        """Tokens of one image: rows x cols of the grid."""
        return self.grid[0] * self.grid[1]

    @property
    def vocab_size(self) -> int:
        """Size of the compact id space the rules see."""
        return self.num_visual

    @property
    def device(self) -> torch.device:
        """The device of the model's parameters."""
        return _device(self.model)

    @property
    def jacobi_defaults(self) -> dict:
        """What Jacobi drafts of this model initialise from: the initialisation, id range, grid
        width and span."""
        return dict(init=self.jacobi_init, init_range=(0, self.num_visual),
                    grid_width=self.grid[1], span_length=self.num_tokens)

    def to(self, device=None, dtype=None) -> "ImageAdapter":
        """Move the model (and ``dtype``: cast it) and its VQ decoder (kept float32)."""
        self.model.to(device=device, dtype=dtype)
        vq = getattr(self, "vq", None)
        if isinstance(vq, VQTokenizer) and device is not None:
            vq.vq.to(device)
        return self

    def check_compatible(self, draft: "ImageAdapter") -> None:
        """A draft must share the codebook (ids and grid) with the target."""
        if draft.vocab_size != self.vocab_size or draft.grid != self.grid:
            raise ValueError(
                f"draft codebook/grid ({draft.vocab_size} ids, grid {draft.grid}) differs from the "
                f"target's ({self.vocab_size} ids, grid {self.grid}): accepted a draft with the "
                "target's codebook")

    def max_positions(self) -> int | None:
        """The text decoder's ``max_position_embeddings`` (None where the config has none)."""
        cfg = self.model.config
        cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
        return getattr(cfg, "max_position_embeddings", None)

    # -- what subclasses provide ----------------------------------------------------------------
    def session(self, params: SamplingParams, guidance_scale: float | None,
                **engine) -> CausalLMSession:
        """engine: ``static_len`` and ``compile`` (CausalLMSession's static cache and
        captured steps)."""
        raise NotImplementedError

    def prompt_batch(self, prompts: list, negative: list | None, guided: bool) -> dict:
        """The session's prefill inputs (ids, masks; the unconditional rows' when ``guided``) for
        the prompts and negative prompts."""
        raise NotImplementedError

    def codebook_embeddings(self) -> torch.Tensor:
        """[vocab_size, d] embeddings of the compact ids: the geometry of LANTERN, GSD and PCG."""
        raise NotImplementedError

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """Images [B, 3, H, W] in [0, 1] from compact ids [B, num_tokens]."""
        raise NotImplementedError


# --------------------------------------------------------------------------------------------
# Decoder-only models whose vocabulary contains the image tokens (Emu3, Lumina-mGPT pattern,
# the bundled shapes-world model).
# --------------------------------------------------------------------------------------------

class TokenSpanAdapter(ImageAdapter):
    """A causal LM over [text ids | image ids]; the prompt ends with the begin-of-image id.

    image_ids:  [num_visual] vocabulary id of each codebook entry (codebook order).
    grid:       (rows, cols) of codebook tokens.
    tokenizer:  object with ``encode(str) -> list[int]`` for string prompts (optional).
    vq:         a VQTokenizer (or anything with ``decode(ids, grid)`` and ``codebook``).
    prefix / suffix: ids around each prompt (BOS before, BOI after).
    """

    def __init__(self, model, image_ids, grid, vq, *, prefix=(), suffix=(), pad_id=0,
                 tokenizer=None, eol_id: int | None = None, codes=None):
        super().__init__(model, grid if eol_id is None else (grid[0], grid[1] + 1), len(image_ids))
        self.image_grid = tuple(grid)
        self.image_ids = torch.as_tensor(image_ids, dtype=torch.long)
        # The VQ code of each compact id (default: compact id i is code i).
        self.codes = None if codes is None else torch.as_tensor(codes, dtype=torch.long)
        self.eol_id = eol_id
        ids = self.image_ids if eol_id is None else torch.cat([self.image_ids, torch.tensor([eol_id])])
        self.to_vocab = ids
        self.vq = vq
        self.prefix, self.suffix = list(prefix), list(suffix)
        self.pad_id = pad_id
        self.tokenizer = tokenizer

    @property
    def vocab_size(self) -> int:
        return int(self.to_vocab.numel())

    def session(self, params, guidance_scale, **engine):
        return TokenSpanSession(self.model, params, guidance_scale, self.to_vocab,
                                None if self.eol_id is None else self.grid[1], **engine)

    def check_prompts(self, prompts: list, name: str = "prompt") -> None:
        """Strings, or token-id lists of the model's vocabulary."""
        super().check_prompts(prompts, name)
        vocab = self.model.get_input_embeddings().weight.shape[0]
        for i, p in enumerate(prompts):
            bad = [] if isinstance(p, str) else [t for t in p if not 0 <= t < vocab]
            if bad:
                raise ValueError(f"{name} {i} holds token ids {bad[:4]}: accepted ids in [0, "
                                 f"{vocab - 1}] (the target's vocabulary)")

    def _encode(self, prompt) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("string prompts need a tokenizer: pass token id lists, or load "
                                 "the model with its tokenizer")
            body = self.tokenizer.encode(prompt)
        else:
            body = [int(t) for t in prompt]
        return self.prefix + body + self.suffix

    def prompt_batch(self, prompts, negative, guided):
        rows = [self._encode(p) for p in prompts]
        if not guided:
            ids, mask = left_pad(rows, self.pad_id)
            return dict(input_ids=ids.to(self.device), attention_mask=mask.to(self.device))
        empty = [""] * len(prompts) if isinstance(prompts[0], str) else [[]] * len(prompts)
        neg = [self._encode(n) for n in (negative if negative is not None else empty)]
        ids, mask, uids, umask = pad_together(rows, neg, self.pad_id)
        dev = self.device
        return dict(input_ids=ids.to(dev), attention_mask=mask.to(dev),
                    uncond_ids=uids.to(dev), uncond_mask=umask.to(dev))

    def codebook_embeddings(self):
        cb = self.vq.codebook.detach().float()
        if self.codes is not None:
            cb = cb[self.codes.to(cb.device)]
        if self.eol_id is None:
            return cb
        far = cb.abs().max() * 1e3 + 1.0            # the EOL id is nobody's neighbour
        return torch.cat([cb, torch.full((1, cb.shape[1]), float(far), device=cb.device)])

    def image_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """[B, N] generated compact ids -> [B, h * w] codebook ids (EOL column removed)."""
        if self.eol_id is not None:
            tokens = tokens.view(tokens.shape[0], self.grid[0], self.grid[1])[..., :-1].reshape(
                tokens.shape[0], -1)
        return tokens if self.codes is None else self.codes.to(tokens.device)[tokens]

    def decode(self, tokens):
        pix = self.vq.decode(self.image_tokens(tokens).to(self.vq.device), self.image_grid)
        return ((pix.float() + 1) / 2).clamp(0, 1)


class Emu3VQ:
    """Emu3's own VQ-VAE behind the VQTokenizer surface."""

    def __init__(self, model):
        self.vqmodel = model.model.vqmodel

    @property
    def codebook(self):
        return self.vqmodel.quantize.embedding.weight

    @property
    def device(self):
        return self.codebook.device

    @torch.no_grad()
    def decode(self, ids, grid):
        return self.vqmodel.decode(ids.view(ids.shape[0], grid[0], grid[1]))


class Emu3Adapter(TokenSpanAdapter):
    """Emu3ForConditionalGeneration: visual tokens live in the text vocabulary; each row of
    ``width`` tokens ends with the EOL token (forced by the adapter's logits mask); the
    negative prompt is the unconditional branch. A vocabulary map that names only some VQ
    codes (transformers' test configurations) generates those codes only. Prompts are id
    lists that already hold Emu3's image prompt (``<|image start|>{h}*{w}<|image token|>``),
    or strings with a processor."""

    def __init__(self, model, height: int, width: int, processor=None, pad_id: int = 0):
        vm = model.vocabulary_mapping
        codes = sorted(vm.img2bpe)      # the VQ codes the vocabulary names (maybe not all)
        size = int(model.config.vq_config.codebook_size)
        if not codes or codes[-1] >= size:
            bad = [c for c in codes if c >= size][:8] or "none"
            raise ValueError(f"Emu3 vocabulary map: visual tokens {bad} for a VQ codebook of "
                             f"{size} codes: accepted a map naming codes in [0, {size - 1}]")
        super().__init__(model, [vm.img2bpe[c] for c in codes], (height, width), Emu3VQ(model),
                         pad_id=pad_id, eol_id=vm.eol_token_id,
                         codes=None if codes == list(range(size)) else codes)
        self.processor = processor

    def _encode(self, prompt):
        if isinstance(prompt, str):
            if self.processor is None:
                raise ValueError("string prompts need the Emu3 processor (from_pretrained loads "
                                 "it); or pass id lists ending with the image prompt")
            h, w = self.image_grid
            text = f"{prompt}{self.processor.image_start_token}{h}*{w}{self.processor.fake_token_around_image}"
            return self.processor.tokenizer(text)["input_ids"]
        return [int(t) for t in prompt]


# --------------------------------------------------------------------------------------------
# Janus: separate generation embeddings and head; the VQ decode of its own VQ-VAE.
# --------------------------------------------------------------------------------------------

class JanusSession(CausalLMSession):
    def __init__(self, model, params, guidance_scale, **engine):
        super().__init__(model, params, guidance_scale, net=model.model.language_model, **engine)
        self.janus = model
        self.vocab_size = int(model.config.vq_config.num_embeddings)

    def prompt_inputs(self, tokens):
        return {"inputs_embeds": self.janus.get_input_embeddings()(tokens)}

    def embed(self, tokens, first_step=False):
        img = self.janus.prepare_embeddings_for_image_generation(tokens[:, int(first_step):].clamp(min=0))
        if first_step:
            text = self.janus.get_input_embeddings()(tokens[:, :1])
            img = torch.cat([text, img], 1)
        return {"inputs_embeds": img}

    def logits(self, out):
        return self.janus.model.generation_head(out.last_hidden_state)


class JanusAdapter(ImageAdapter):
    """JanusForConditionalGeneration in image-generation mode.

    Prompts: id lists that end with the begin-of-image id, or strings with a processor
    (``processor.apply_chat_template`` output + ``<begin_of_image>`` is what Janus expects).
    """

    def __init__(self, model, processor=None, bos_id: int | None = None,
                 boi_id: int | None = None, pad_id: int | None = None):
        n = int(model.config.vision_config.num_image_tokens)
        side = int(round(n ** 0.5))
        super().__init__(model, (side, side), int(model.config.vq_config.num_embeddings))
        gc = getattr(model, "generation_config", None)
        kw = getattr(gc, "generation_kwargs", None) or {}
        self.bos_id = bos_id if bos_id is not None else getattr(gc, "bos_token_id", None)
        self.boi_id = boi_id if boi_id is not None else kw.get("boi_token_id")
        self.pad_id = pad_id if pad_id is not None else (getattr(gc, "pad_token_id", None) or 0)
        self.processor = processor

    def session(self, params, guidance_scale, **engine):
        return JanusSession(self.model, params, guidance_scale, **engine)

    def _encode(self, prompt):
        if isinstance(prompt, str):
            if self.processor is None:
                raise ValueError("string prompts need the Janus processor; or pass id lists "
                                 "ending with the begin-of-image id")
            return self.processor(text=[prompt], generation_mode="image")["input_ids"][0].tolist()
        return [int(t) for t in prompt]

    def prompt_batch(self, prompts, negative, guided):
        rows = [self._encode(p) for p in prompts]
        dev = self.device
        if guided and negative is not None:
            ids, mask, uids, umask = pad_together(rows, [self._encode(n) for n in negative],
                                                  self.pad_id)
        else:
            ids, mask = left_pad(rows, self.pad_id)
            if guided:   # transformers' Janus: pad every prompt token but BOS and BOI
                keep = torch.zeros_like(ids, dtype=torch.bool)
                for t in (self.bos_id, self.boi_id):
                    if t is not None:
                        keep |= ids == t
                uids, umask = torch.where(keep, ids, self.pad_id), mask
        out = dict(input_ids=ids.to(dev), attention_mask=mask.to(dev))
        if guided:
            out.update(uncond_ids=uids.to(dev), uncond_mask=umask.to(dev))
        return out

    def codebook_embeddings(self):
        return self.model.model.vqmodel.quantize.embedding.weight.detach().float()

    @torch.no_grad()
    def decode(self, tokens):
        pix = self.model.model.vqmodel.decode(tokens)
        return ((pix.float() + 1) / 2).clamp(0, 1)


# --------------------------------------------------------------------------------------------
# LlamaGen-style GPT (modalities/image/llamagen.py).
# --------------------------------------------------------------------------------------------

class LlamaGenSession(CausalLMSession):
    """Prompt positions index the conditioning embeddings set by the adapter (``cond``)."""

    def __init__(self, model, params, guidance_scale, **engine):
        super().__init__(model, params, guidance_scale, **engine)
        self.vocab_size = int(model.config.vocab_size)
        self.cond: torch.Tensor | None = None          # [R, T, dim], R = rows incl. uncond

    def prefill(self, input_ids, attention_mask, uncond_ids=None, uncond_mask=None, cond=None):
        if cond is None:
            raise ValueError("LlamaGen prompts need their conditioning embeddings (cond)")
        self.cond = cond
        super().prefill(input_ids, attention_mask, uncond_ids, uncond_mask)

    def prompt_inputs(self, tokens):
        return {"inputs_embeds": self.cond[:, : tokens.shape[1]]}

    def embed(self, tokens, first_step=False):
        if not first_step:
            return {"input_ids": tokens.clamp(min=0)}
        emb = self.model.tok_embeddings(tokens[:, 1:].clamp(min=0))
        return {"inputs_embeds": torch.cat([self.cond[:, -1:], emb], 1)}


class LlamaGenAdapter(ImageAdapter):
    """LlamaGenForImageGeneration: class ids (c2i) or caption embeddings (t2i) as prompts."""

    jacobi_init = "repeat_horizon"   # SJD's default for LlamaGen

    def __init__(self, model, vq):
        g = model.config.grid_size
        super().__init__(model, (g, g), int(model.config.vocab_size))
        self.vq = vq
        self.class_conditional = model.config.model_type_cond == "c2i"

    def check_prompts(self, prompts: list, name: str = "prompt") -> None:
        """Class ids or caption embeddings: ``prompt_batch`` checks them."""

    def session(self, params, guidance_scale, **engine):
        return LlamaGenSession(self.model, params, guidance_scale, **engine)

    def prompt_batch(self, prompts, negative, guided):
        cfg = self.model.config
        dev = self.device
        if self.class_conditional:
            cond = torch.as_tensor([int(p) for p in prompts], dtype=torch.long, device=dev)
            if bool((cond < 0).any()) or bool((cond >= cfg.num_classes).any()):
                raise ValueError(f"class labels must be in [0, {cfg.num_classes - 1}]")
        else:
            cond = torch.stack([torch.as_tensor(p, dtype=self.model.dtype) for p in prompts]).to(dev)
            if cond.shape[1:] != (cfg.cls_token_num, cfg.caption_dim):
                raise ValueError(f"caption embeddings must be [{cfg.cls_token_num}, "
                                 f"{cfg.caption_dim}] per prompt, got {tuple(cond.shape[1:])}")
        b, t = cond.shape[0], cfg.cls_token_num
        with torch.no_grad():
            emb = self.model.condition_embeddings(cond)
            if guided:
                drop = torch.ones(b, dtype=torch.bool, device=dev)
                emb = torch.cat([emb, self.model.condition_embeddings(cond, drop)], 0)
        ids = torch.arange(t, device=dev).expand(b, -1).contiguous()
        out = dict(input_ids=ids, attention_mask=torch.ones_like(ids), cond=emb)
        if guided:
            out.update(uncond_ids=ids.clone(), uncond_mask=torch.ones_like(ids))
        return out

    def codebook_embeddings(self):
        return self.vq.codebook.detach().float()

    def decode(self, tokens):
        pix = self.vq.decode(tokens.to(self.vq.device), self.grid)
        return ((pix.float() + 1) / 2).clamp(0, 1)


register_adapter("janus", "image", JanusAdapter, ("JanusForConditionalGeneration",))
register_adapter("emu3", "image", Emu3Adapter, ("Emu3ForConditionalGeneration",))
register_adapter("llamagen", "image", LlamaGenAdapter, ("LlamaGenForImageGeneration",))
register_adapter("token-span", "image", TokenSpanAdapter, ("LlamaForCausalLM",))
