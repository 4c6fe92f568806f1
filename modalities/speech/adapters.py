"""Codec-token speech targets: what ``TextToSpeech`` and the core need from each layout.

Every adapter owns what differs between layouts, so the pipeline never asks which one it has:

    prompt(texts, guided) -> dict        the session's prefill inputs (unconditional rows too)
    session(params, guidance, frames, **cache) -> Session
    check_engine(engine), check_method(method)   refusals, before any model runs
    steps(frames)                        loop steps for ``frames`` frames
    first_tokens(batch) -> [B, *event]   what the first step feeds
    stops() -> Stops                     what ends a row
    rule(scalar) -> Rule                 the method's rule, lifted to this layout's events
    codes(row, frames) -> [N, C]         a row's generated events back to codec frames
    jacobi_defaults, max_positions(), codebook_embeddings(c), decode(frames)
    teacher_forcing(batch, codes)        fed events, targets and which count (``code_nll``)

Layouts: ``SingleCodebookAdapter`` (Llasa-style: a plain token stream), ``DelayPatternAdapter``
(MusicGen-style: one C-tuple per step, verified codebook by codebook with ``Frame``) and
``modalities.speech.csm.CsmAdapter`` (a depth decoder: ``DepthFrame``).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from mmspec.acceptance import Frame
from mmspec.distributed import whole
from mmspec.loop import Stops
from mmspec.sessions import TokenSpanSession, max_positions
from modalities.registry import register_adapter

from .delay import (DecoderWithTextEncoder, DelayPatternSession, apply_delay, event_width,
                    undo_delay)


class CodecAdapter:
    """What every speech adapter shares: ``model``, ``codec``, C ``codebooks`` of
    ``vocab_size`` ids; a draft must be of the same kind with the same codebooks and codec
    rate. Subclasses override the layout hooks below."""

    codebooks = 1
    text_padding = "left"          # decoder-only prompts; a text encoder's input: "right"
    prefix: tuple = ()
    suffix: tuple = ()
    eos: int | None = None
    frame_rule = Frame             # verifies events of several ids
    head_kind = "token"            # the draft heads its target takes (mmspec.drafters.HEAD_KINDS)

    def text_ids(self, t) -> list[int]:
        """A text (through ``tokenizer``) or a list of ids -> ids, refusing empty input."""
        if isinstance(t, str):
            if not t.strip():
                raise ValueError("text: accepted non-empty strings")
            if self.tokenizer is None:
                raise ValueError("string texts need a tokenizer")
            enc = self.tokenizer.encode(t)
            body = list(enc["input_ids"] if isinstance(enc, dict) else enc)
        else:
            body = [int(x) for x in t]
            vocab = self.text_vocab_size()
            bad = [x for x in body if not 0 <= x < vocab]
            if bad:
                raise ValueError(f"text holds token ids {bad[:4]}: accepted ids in [0, "
                                 f"{vocab - 1}] (the model's text vocabulary)")
        if not body:
            raise ValueError("text: accepted non-empty token lists")
        return body

    def text_vocab_size(self) -> int:
        """The ids a text may hold (the embedding table its ids index)."""
        return int(self.model.get_input_embeddings().weight.shape[0])

    def encode_text(self, texts) -> dict:
        """Texts -> the padded text batch (``input_ids``, ``attention_mask``) with the model's
        prefix and suffix ids."""
        from modalities.padding import pad_rows

        rows = [list(self.prefix) + self.text_ids(t) + list(self.suffix) for t in texts]
        ids, mask = pad_rows(rows, getattr(self, "pad_id", 0), self.text_padding, self.device)
        return dict(input_ids=ids, attention_mask=mask)

    @property
    def device(self):
        """The device of the model's parameters."""
        return next(self.model.parameters()).device

    @property
    def sample_rate(self) -> int:
        """The codec's audio sample rate in Hz."""
        return int(self.codec.sample_rate)

    def check_compatible(self, draft) -> None:
        """Refuse a draft of another kind, other codebooks or another sample rate (named)."""
        if type(draft) is not type(self):
            raise ValueError(f"a {type(self).__name__} target needs a draft of the same kind, got "
                             f"{type(draft).__name__}")
        if (draft.codebooks, draft.vocab_size) != (self.codebooks, self.vocab_size):
            raise ValueError(f"draft has {draft.codebooks} codebooks of {draft.vocab_size} ids, "
                             f"the target {self.codebooks} of {self.vocab_size}: accepted a draft "
                             "with the target's codebooks")
        if draft.sample_rate != self.sample_rate:
            raise ValueError(f"sample-rate mismatch: draft codec {draft.sample_rate} Hz, "
                             f"target {self.sample_rate} Hz")

    # -- layout hooks (defaults: one event per step, frames of C ids) --------------------------
    def prompt(self, texts, guided: bool) -> dict:
        """The prefill batch for texts (the unconditional rows' too when ``guided``)."""
        return self.encode_text(texts)

    def check_engine(self, engine):
        """The engine this layout can run (refusing what it cannot, with the reason)."""
        return engine

    def check_method(self, method) -> None:
        """Refuse a method this layout cannot run (default: every method runs)."""
        pass

    def steps(self, frames: int) -> int:
        """Decoding steps that make ``frames`` frames (the delay pattern adds C - 1)."""
        return frames

    def stops(self) -> Stops:
        """The stop rule: end-of-speech id(s) and which codebooks must emit them."""
        return Stops(() if self.eos is None else (self.eos,))

    @property
    def jacobi_defaults(self) -> dict:
        """Jacobi windows of whole frames over the codes (end-of-speech excluded)."""
        return dict(init_range=(0, self.vocab_size - 1), event_shape=(self.codebooks,))

    def max_positions(self) -> int | None:
        """The decoder's position limit (None where positions have no table)."""
        return max_positions(self.model)

    def rule(self, scalar):
        """A codebook-level rule lifted to frames; relaxed rules get each codebook's table."""
        if "embeddings" not in type(scalar).param_names() or scalar.embeddings is None:
            return self.frame_rule(rules=[scalar])
        return self.frame_rule(rules=[dataclasses.replace(scalar, embeddings=self.codebook_embeddings(c))
                                      for c in range(self.codebooks)])

    def waveform(self, codes: torch.Tensor) -> np.ndarray:
        """[N, C] codes -> float32 samples (empty for no frames)."""
        if not len(codes):
            return np.zeros(0, np.float32)
        return self.decode(codes[None].to(self.device))[0]


class DelayPatternAdapter(CodecAdapter):
    """A MusicGen-layout model: ``model.text_encoder``, ``model.decoder`` with C codebooks,
    a codec with ``decode(frames [B, N, C]) -> [B, samples]`` and ``sample_rate``; its draft
    heads are frame heads (``FrameHead``).

    model:     ``MusicgenForConditionalGeneration``, or ``MusicgenForCausalLM`` (the decoder
               alone) with ``text_encoder=`` (and ``enc_to_dec_proj=`` when its hidden size
               differs from the decoder's).
    tokenizer: ``encode(str) -> ids`` (or a transformers tokenizer); pad_token_id: the
    decoder's pad / start id; eos_token_id: end-of-speech id (None: fixed length).
    Guidance: the session's unconditional rows see zeroed encoder states (as transformers).
    """

    text_padding = "right"         # the text encoder's input
    head_kind = "frame"

    def text_vocab_size(self) -> int:
        return int(self.model.text_encoder.get_input_embeddings().weight.shape[0])

    def __init__(self, model, codec, tokenizer=None, pad_token_id=None, eos_token_id=None,
                 max_frames: int = 256, frames_per_char: float | None = None, text_encoder=None,
                 enc_to_dec_proj=None):
        if not hasattr(model, "text_encoder"):
            if text_encoder is None:
                raise ValueError(f"{type(model).__name__} has no text encoder: accepted "
                                 "text_encoder= (e.g. MusicGen's T5 encoder) for a decoder-only model")
            model = DecoderWithTextEncoder(model, text_encoder, enc_to_dec_proj)
        self.model = model
        self.codec = codec
        self.tokenizer = tokenizer
        dcfg = model.decoder.config
        self.codebooks = int(model.decoder.num_codebooks)
        self.pad = dcfg.pad_token_id if pad_token_id is None else pad_token_id
        self.start = getattr(model.generation_config, "decoder_start_token_id", None) or self.pad
        self.eos = eos_token_id
        self.vocab_size = event_width(int(dcfg.vocab_size), self.pad, self.eos)   # ids per codebook
        self.max_frames = max_frames
        self.frames_per_char = frames_per_char

    def session(self, params, guidance_scale, num_frames, **cache):
        """A ``DelayPatternSession`` over the decoder (guided as a doubled batch)."""
        self.check_cache(cache)
        return DelayPatternSession(self.model, params, guidance_scale, num_frames, self.pad, self.eos)

    @staticmethod
    def check_cache(cache: dict) -> None:
        """Refuse static caches: the decoder takes positions from the cache's length."""
        if cache.get("static_len") is not None:
            raise ValueError("static_cache / compile: not available for delay-pattern models "
                             "(MusicGen, Parler-TTS): their decoder takes its positions from the "
                             "cache's length, which a static cache does not roll back; accepted "
                             "compile=False, static_cache=None")

    def check_engine(self, engine):
        if engine.static:
            self.check_cache({"static_len": 0})
        if engine.pipeline:
            raise ValueError("pipeline=True: not available for delay-pattern models (every row "
                             "is committed to the shortest accepted length); accepted None or False")
        return engine

    def steps(self, frames: int) -> int:
        return frames + self.codebooks - 1       # the last codebook lags C - 1 steps

    def first_tokens(self, batch) -> torch.Tensor:
        """The first event fed after the prompt: the decoder-start id on every codebook."""
        b = batch["input_ids"].shape[0]
        return torch.full((b, self.codebooks), self.start, dtype=torch.long, device=self.device)

    def max_positions(self) -> int | None:
        return None                              # sinusoidal positions: no table to overflow

    def codes(self, row: list, frames: int) -> torch.Tensor:
        """The delayed stream back to frames, up to end-of-speech on codebook 0."""
        c = self.codebooks
        delayed = torch.tensor(row, dtype=torch.long).view(1, -1, c)             # [1, T, C]
        n = frames
        if self.eos is not None:
            ends = (delayed[0, :, 0] == self.eos).nonzero()
            n = int(ends[0]) if len(ends) else delayed.shape[1] - c + 1
        n = max(0, min(n, delayed.shape[1] - c + 1))
        return undo_delay(delayed, n)[0] if n else torch.zeros(0, c, dtype=torch.long)

    def teacher_forcing(self, batch, codes: torch.Tensor):
        """(fed [T, C], target ids [T, C], counted [T, C]) for frames ``codes`` [N, C]: the
        delayed stream with end-of-speech, codes outside each codebook's frames not counted."""
        c = self.codebooks
        frames = codes if self.eos is None else torch.cat([codes, codes.new_full((1, c), self.eos)])
        delayed = apply_delay(frames[None], self.pad)[0]                           # [T, C]
        start = torch.full((1, c), self.start, dtype=torch.long, device=codes.device)
        t = torch.arange(delayed.shape[0], device=codes.device)[:, None]
        k = torch.arange(c, device=codes.device)[None]
        return torch.cat([start, delayed[:-1]]), delayed, (t >= k) & (t < k + frames.shape[0])

    def codebook_embeddings(self, c: int) -> torch.Tensor:
        """[vocab_size, d]: codebook c's input embeddings (MusicGen embeds its pad id too)."""
        emb = self.model.decoder.get_input_embeddings()
        table = emb[c] if isinstance(emb, torch.nn.ModuleList) else emb
        return whole(table.weight).detach().float()[: self.vocab_size]

    def decode(self, frames: torch.Tensor) -> np.ndarray:
        """Audio [B, samples] from frames [B, N, C] (ids past the codebook, the pad column of
        transformers layout, are clamped into it for the codec)."""
        with torch.no_grad():
            return self.codec.decode(frames.clamp(0, self.codec.codebook_size - 1))


class SingleCodebookAdapter(CodecAdapter):
    """A decoder-only LM over [text ids | codec ids] (Llasa-style): an ordinary token stream.

    codec_ids: vocabulary id of each codec code (codec order); end_id: end-of-speech id;
    prefix / suffix: ids around the text; codec: ``decode(frames [B, N, 1])``. Guidance: the
    unconditional rows are the empty text (prefix, pad id, suffix).
    """

    def __init__(self, model, codec, codec_ids, end_id: int, tokenizer=None, prefix=(), suffix=(),
                 pad_id: int = 0, max_frames: int = 256):
        self.model, self.codec, self.tokenizer = model, codec, tokenizer
        self.to_vocab = torch.cat([torch.as_tensor(list(codec_ids)), torch.tensor([end_id])])
        self.vocab_size = int(self.to_vocab.numel())          # codes + end-of-speech
        self.eos = self.vocab_size - 1
        self.prefix, self.suffix, self.pad_id = list(prefix), list(suffix), pad_id
        self.max_frames = max_frames

    def session(self, params, guidance_scale, num_frames=None, **cache):
        """A token-span session over the codec ids of the decoder-only model."""
        return TokenSpanSession(self.model, params, guidance_scale, self.to_vocab, **cache)

    def prompt(self, texts, guided: bool) -> dict:
        """The prefill batch: the text prompt with the speech-start suffix."""
        batch = self.encode_text(texts)
        if not guided:
            return batch
        empty = self.encode_text([[self.pad_id]] * len(texts))
        un = torch.full_like(batch["input_ids"], self.pad_id)
        um = torch.zeros_like(batch["attention_mask"])
        w = empty["input_ids"].shape[1]
        un[:, -w:], um[:, -w:] = empty["input_ids"], empty["attention_mask"]
        return dict(batch, uncond_ids=un, uncond_mask=um)

    @property
    def jacobi_defaults(self) -> dict:
        return dict(init_range=(0, self.vocab_size - 1))

    def first_tokens(self, batch) -> torch.Tensor:
        """The prompt's last token, fed first after the prompt."""
        return batch["input_ids"][:, -1]

    def rule(self, scalar):
        return scalar

    def codes(self, row: list, frames: int) -> torch.Tensor:
        """A plain stream: the codes up to end-of-speech, one codebook."""
        return torch.tensor([t for t in row if t != self.eos], dtype=torch.long).view(-1, 1)

    def teacher_forcing(self, batch, codes: torch.Tensor):
        """(fed [T], target ids [T], counted [T]): the stream with end-of-speech."""
        ids = torch.cat([codes[:, 0], codes.new_tensor([self.eos])])
        fed = torch.cat([batch["input_ids"][0, -1:], ids[:-1]])
        return fed, ids, torch.ones_like(ids, dtype=torch.bool)

    def codebook_embeddings(self, c: int = 0) -> torch.Tensor:
        """[V, d] embeddings of the codec ids: the geometry of relaxed rules."""
        return whole(self.model.get_input_embeddings().weight).detach().float()[self.to_vocab]

    def decode(self, frames):
        """Audio samples from the generated codec ids."""
        with torch.no_grad():
            return self.codec.decode(frames)


register_adapter("delay-pattern", "speech", DelayPatternAdapter,
                 ("MusicgenForConditionalGeneration", "MusicgenForCausalLM"))
register_adapter("single-codebook", "speech", SingleCodebookAdapter, ("LlamaForCausalLM",))
