"""Depth-decoder speech models (Sesame CSM, ``CsmForConditionalGeneration``): one event is a
frame of C codebooks, codebook 0 from the backbone's head and codebooks 1..C-1 from a small
depth decoder that reads the backbone's hidden state and the frame's earlier codebooks.

``FrameDistribution`` is what a CSM session returns for [B, n] positions: the backbone's
hidden states plus the model, so that the ``DepthFrame`` rule can ask for each codebook's
conditional along a drafted frame (``along``, one depth-decoder forward for every frame at
once) and for fresh codebooks given a prefix (``complete``, one incremental depth-decoder
step per codebook on its own cache), and a draft can draw a frame with its conditionals
(``draw``, the same walk: ``mmspec.distributions``).
Lossless with the exact rule (see ``mmspec.acceptance.DepthFrame``).
"""

from __future__ import annotations

import numpy as np
import torch

from mmspec.acceptance import DepthFrame
from mmspec.distributed import whole
from mmspec.distributions import Distribution
from mmspec.loop import Stops
from mmspec.sampling import SamplingParams, sample
from mmspec.sessions import CaptureTraits, CausalLMSession
from modalities.registry import register_adapter

from .adapters import CodecAdapter
from .codec import TransformersCodec


class FrameDistribution(Distribution):
    """Autoregressive frame distributions at batch positions ``batch_shape`` ([B, n] or [B])."""

    def __init__(self, model, hidden: torch.Tensor, params: SamplingParams):
        self.model, self.h, self.params = model, hidden, params
        self.codebooks = int(model.config.num_codebooks)

    @property
    def batch_shape(self) -> torch.Size:
        return self.h.shape[:-1]

    def __getitem__(self, idx) -> "FrameDistribution":
        return FrameDistribution(self.model, self.h[idx], self.params)

    def _p0(self, h: torch.Tensor) -> torch.Tensor:
        return self.params.probs(self.model.lm_head(h).float())

    def _depth_logits(self, h: torch.Tensor, frame: torch.Tensor) -> torch.Tensor:
        """h [N, H], frame [N, C] -> logits of codebooks 1..C-1 given the frame's earlier
        codebooks, [N, C-1, V] (teacher-forced)."""
        inp = torch.cat([torch.zeros_like(frame[:, :1]), frame[:, :-1]], 1)   # slot 0: the hidden state
        out = self.model.depth_decoder(input_ids=inp, backbone_last_hidden_state=h)
        return out.logits.float()

    def along(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, k, C] drafted frames at positions 0..k-1 -> [B, k, C, V]."""
        return self.params.probs(self.along_logits(x))

    def along_logits(self, x: torch.Tensor) -> torch.Tensor:
        """``along``'s logits before processing, [B, k, C, V] (what a draft head learns)."""
        b, k, c = x.shape
        h = self.h[:, :k]
        l0 = self.model.lm_head(h).float()                                     # [B, k, V]
        rest = self._depth_logits(h.reshape(b * k, -1), x.reshape(b * k, c))
        return torch.cat([l0[:, :, None], rest.view(b, k, c - 1, -1)], 2)

    def _walk(self, h: torch.Tensor, frame: torch.Tensor, first_free: torch.Tensor, generator):
        """Codebooks >= first_free [N] drawn one after another from h [N, H], the others kept;
        the depth decoder runs incrementally on its own cache (one token per codebook).
        -> (frame [N, C], the conditionals used [N, C, V])."""
        from transformers import DynamicCache

        from mmspec.cache import cache_argument

        depth = self.model.depth_decoder
        frame = frame.clone()
        p0 = self._p0(h)
        frame[:, 0] = torch.where(first_free <= 0, sample(p0, generator), frame[:, 0])
        probs = [p0]
        cache = {cache_argument(depth): DynamicCache(config=depth.config)}
        inp = torch.stack([torch.zeros_like(frame[:, 0]), frame[:, 0]], 1)   # slot 0: h
        kw = dict(backbone_last_hidden_state=h)
        for c in range(1, self.codebooks):
            out = depth(input_ids=inp, use_cache=True, logits_to_keep=1, **kw, **cache)
            pc = self.params.probs(out.logits[:, -1].float())
            frame[:, c] = torch.where(first_free <= c, sample(pc, generator), frame[:, c])
            probs.append(pc)
            inp, kw = frame[:, c:c + 1], {}
        return frame, torch.stack(probs, 1)

    def complete(self, pos: torch.Tensor, frame: torch.Tensor, first_free: torch.Tensor,
                 generator=None) -> torch.Tensor:
        """Codebooks >= first_free [B] drawn from the conditionals at position pos [B] given the
        frame's earlier codebooks; the others kept. -> [B, C]."""
        rows = torch.arange(frame.shape[0], device=frame.device)
        h = self.h[rows, pos] if self.h.dim() == 3 else self.h
        return self._walk(h, frame, first_free, generator)[0]

    def draw(self, generator=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Batch [B]: a frame [B, C] and the conditionals it was drawn from [B, C, V]."""
        if self.h.dim() != 2:
            raise ValueError("draw takes one frame per row: index a position first")
        b = self.h.shape[0]
        zeros = torch.zeros(b, dtype=torch.long, device=self.h.device)
        return self._walk(self.h, torch.zeros(b, self.codebooks, dtype=torch.long,
                                              device=self.h.device), zeros, generator)


class CsmSession(CausalLMSession):
    """The backbone of a CSM model with its cache; steps take frames [B, n, C] (the first step
    after the prompt feeds the prompt's last text token in column 0) and return
    ``FrameDistribution``s over [B, n]."""

    capture = CaptureTraits(chain_hooks=False)  # a frame's draw runs the depth decoder

    def __init__(self, model, params: SamplingParams, **engine):
        super().__init__(model, params, net=model.backbone_model, **engine)
        self.vocab_size = int(model.config.vocab_size)

    def prefill(self, input_ids, attention_mask, **kw):
        self._last_text = input_ids[:, -1]
        super().prefill(input_ids, attention_mask, **kw)

    def prompt_inputs(self, tokens):
        return {"inputs_embeds": self.model.embed_text_tokens(tokens)}

    def embed(self, tokens, first_step=False):
        emb = self.net.embed_tokens(tokens.clamp(min=0))                       # sum over codebooks
        if first_step:
            text = self.model.embed_text_tokens(self._last_text)[:, None].to(emb.dtype)
            emb = torch.cat([text, emb[:, 1:]], 1)
        return {"inputs_embeds": emb}

    def logits(self, out):
        return out.last_hidden_state

    def distributions(self, h, gen_index):
        # A captured step's output buffer is overwritten by the next replay: keep a copy.
        return FrameDistribution(self.model, h.clone() if self.compile else h, self.params)


class CsmAdapter(CodecAdapter):
    """``CsmForConditionalGeneration`` for ``TextToSpeech``.

    Prompts are text ids (lists of ints, or strings through ``tokenizer``/processor, e.g.
    ``"[0]Hello there."`` with CSM's processor); frames are decoded by the model's own codec
    (Mimi) unless ``codec`` is given. Each row stops at its first end-of-audio frame (every
    codebook but the last = ``codebook_eos_token_id``, transformers' CSM stopping rule) or
    after ``max_frames``; the returned codes end before that frame.
    """

    frame_rule = DepthFrame
    head_kind = "depth"

    def __init__(self, model, codec=None, tokenizer=None, max_frames: int = 128):
        cfg = model.config
        self.model, self.tokenizer, self.max_frames = model, tokenizer, max_frames
        self.codebooks = int(cfg.num_codebooks)
        self.vocab_size = int(cfg.vocab_size)
        self.frame_eos = cfg.codebook_eos_token_id     # a frame of these ends the row
        pad = cfg.pad_token_id
        self.pad_id = pad if pad is not None and 0 <= pad < cfg.text_vocab_size else 0
        self.codec = codec if codec is not None else TransformersCodec(model.codec_model)

    def text_vocab_size(self) -> int:
        return int(self.model.config.text_vocab_size)

    def session(self, params, guidance_scale, num_frames=None, **cache):
        if guidance_scale is not None:
            raise ValueError("guidance_scale: CSM has no unconditional branch; accepted None")
        return CsmSession(self.model, params, **cache)

    def check_method(self, method) -> None:
        if not (method.uses_draft_model or method.uses_head) and method.drafter != "plain":
            raise ValueError(f"method={method.spec!r}: depth-decoder targets draft with a model, "
                             "a draft head or plain decoding (Jacobi windows over depth-decoder "
                             "frames are not supported: their drafts need the conditionals "
                             "along each frame)")

    def first_tokens(self, batch) -> torch.Tensor:
        """Zeros: the first step feeds the prompt's last text token (the session knows it)."""
        b = batch["input_ids"].shape[0]
        return torch.zeros((b, self.codebooks), dtype=torch.long, device=self.device)

    def stops(self) -> Stops:
        """A row ends with a frame whose codebooks but the last are end-of-audio (the model's
        own rule: transformers' CSM generation)."""
        return Stops((self.frame_eos,), on="all-but-last")

    def codebook_embeddings(self, c: int) -> torch.Tensor:
        table = whole(self.model.backbone_model.embed_tokens.embed_audio_tokens.weight).detach().float()
        return table[c * self.vocab_size:(c + 1) * self.vocab_size]

    def codes(self, row: list, frames: int) -> torch.Tensor:
        """Generated frames of one row up to (excluding) its end-of-audio frame."""
        codes = torch.tensor(row, dtype=torch.long).view(-1, self.codebooks)
        end = (codes[:, :-1] == self.frame_eos).all(1)
        n = int(end.nonzero()[0]) if bool(end.any()) else len(codes)
        return codes[:n]

    def teacher_forcing(self, batch, codes):
        raise ValueError("code_nll: not available for depth-decoder models (CSM)")

    def decode(self, frames: torch.Tensor) -> np.ndarray:
        with torch.no_grad():
            return self.codec.decode(frames)


register_adapter("csm", "speech", CsmAdapter, ("CsmForConditionalGeneration",))
