"""Delay-pattern multi-codebook decoders (MusicGen, Parler-TTS style): the adapter owns the
pattern.

In the delayed stream, codebook c of frame f sits at decoding step t = f + c, so one step
emits a C-tuple whose entries belong to different frames; every entry is predicted by its own
head from the same prefix, so a step is one event with factorised p = prod_c p_c and the
``Frame`` rule verifies it exactly. Steps where codebook c is outside its frames (t < c, or
t >= N + c after the last frame N - 1) are forced to the pad token (end-of-speech token for
models that stop on their own) by the adapter's logits mask, as part of the target
distribution; where the pad id lies past the logits (transformers' layout: pad id = vocab
size), the distributions get one more column for it. ``apply_delay`` / ``undo_delay`` convert between frames and the delayed stream;
``DecoderWithTextEncoder`` calls a decoder-only MusicGen with a separate text encoder.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mmspec.cache import cache_argument, crop
from mmspec.sampling import SamplingParams, guide
from mmspec.sessions import Session


def apply_delay(frames: torch.Tensor, pad: int) -> torch.Tensor:
    """[B, N, C] frames -> [B, N + C - 1, C] delayed stream (pad outside each codebook's span)."""
    b, n, c = frames.shape
    out = frames.new_full((b, n + c - 1, c), pad)
    for k in range(c):
        out[:, k:k + n, k] = frames[:, :, k]
    return out


def undo_delay(stream: torch.Tensor, frames: int) -> torch.Tensor:
    """[B, T, C] delayed stream -> [B, frames, C] (needs T >= frames + C - 1)."""
    b, t, c = stream.shape
    if t < frames + c - 1:
        raise ValueError(f"a delayed stream of {t} steps holds at most {t - c + 1} frames of "
                         f"{c} codebooks, not {frames}")
    return torch.stack([stream[:, k:k + frames, k] for k in range(c)], -1)


def event_width(logits: int, pad: int, eos: int | None) -> int:
    """Ids a codebook's distribution covers: the logits, and the pad / end-of-speech ids the
    pattern forces, which transformers' MusicGen layout puts one past the logits
    (vocab_size = codebook size = pad id)."""
    return max(logits, pad + 1, -1 if eos is None else eos + 1)


class DelayPatternSession(Session):
    """MusicgenForConditionalGeneration-style model: text encoder + multi-codebook decoder.

    The decoder's positions follow its cache length (sinusoidal embeddings take no position
    ids), so rows cannot keep holes: ``ragged = False`` and the loop commits every row to the
    shortest accepted length (still exact: each row emits a prefix of its valid run).
    Guidance: the unconditional rows see zeroed encoder states (as transformers' MusicGen).

    num_frames: fixed frame count (MusicGen), or the cap when ``eos_token_id`` is set: the
                frame count is then where codebook 0 emits end-of-speech, and codebook c is
                forced to it from step N + c on.
    """

    ragged = False
    _feature_layers: tuple[int, ...] = ()
    features: torch.Tensor | None = None    # ``keep_features``: the last step's

    def __init__(self, model, params: SamplingParams, guidance_scale: float | None,
                 num_frames: int, pad_token_id: int, eos_token_id: int | None = None):
        self.model = model
        self.params = params
        self.guidance_scale = guidance_scale
        self.codebooks = int(model.decoder.num_codebooks)
        self.logit_width = int(model.decoder.config.vocab_size)
        self.vocab_size = event_width(self.logit_width, pad_token_id, eos_token_id)
        self.num_frames = num_frames
        self.pad = pad_token_id
        self.eos = eos_token_id
        self.cache = None

    def keep_features(self, layers, uncond: bool = False) -> None:
        """Keep the decoder's hidden states at ``layers`` (indices into its hidden states: 0
        the embeddings) of every step, concatenated, as ``features`` [B, n, F] (the
        conditional rows): what a frame head drafts from (``mmspec.drafters.frame``).
        ``uncond`` (the unconditional rows' too) is refused: frame heads read one branch."""
        if uncond:
            raise ValueError("uncond features: a delay-pattern session keeps the conditional "
                             "rows' features only (frame heads read one branch)")
        self._feature_layers = tuple(layers)

    def event_embeds(self, tokens: torch.Tensor) -> torch.Tensor:
        """The decoder's input embeddings [B, n, d] of events [B, n, C]: the sum of each
        codebook's embedding (as the decoder embeds its inputs; no positions)."""
        tables = self.model.decoder.model.decoder.embed_tokens
        return sum(tables[k](tokens[..., k].clamp(min=0)) for k in range(tokens.shape[-1]))

    @property
    def guided(self) -> bool:
        """Classifier-free guidance is on (a doubled batch)."""
        return self.guidance_scale is not None

    def prefill(self, input_ids, attention_mask, **kw) -> None:
        from transformers.cache_utils import DynamicCache, EncoderDecoderCache

        self.batch_size = input_ids.shape[0]
        enc = self.model.text_encoder(input_ids=input_ids, attention_mask=attention_mask)
        hidden, mask = enc.last_hidden_state, attention_mask
        if self.guided:
            hidden = torch.cat([hidden, torch.zeros_like(hidden)], 0)
            mask = torch.cat([mask, mask], 0)
        self.encoder_outputs = (hidden,)
        self.encoder_mask = mask
        self.cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        self.length = 0
        self._since = 0
        dev = input_ids.device
        self.eos_step = torch.full((self.batch_size,), 1 << 30, dtype=torch.long, device=dev)
        self._pending_eos = self.eos_step

    def step(self, tokens: torch.Tensor, valid=None, tree=None) -> torch.Tensor:
        """tokens [B, n, C] (the last committed step, then drafts) -> probs [B, n, C, V]
        (no tree steps: ``trees`` is False, so the loop never passes one)."""
        b, n, c = tokens.shape
        rows = torch.cat([tokens, tokens], 0) if self.guided else tokens
        r = rows.shape[0]
        dec = rows.clamp(min=0).permute(0, 2, 1).reshape(r * c, n)
        out = self.model(encoder_outputs=self.encoder_outputs, attention_mask=self.encoder_mask,
                         decoder_input_ids=dec,
                         decoder_attention_mask=torch.ones(r, self.length + n, dtype=torch.long,
                                                           device=tokens.device),
                         cache=self.cache, use_cache=True,
                         output_hidden_states=bool(self._feature_layers))
        logits = out.logits.view(r, c, n, -1).permute(0, 2, 1, 3)              # [R, n, C, V]
        if self.vocab_size > self.logit_width:     # the pad id is past the logits (MusicGen)
            logits = F.pad(logits, (0, self.vocab_size - self.logit_width), value=float("-inf"))
        if self.guided:
            logits = guide(logits[:b], logits[b:], self.guidance_scale)
        if self._feature_layers:
            hs = out.decoder_hidden_states if hasattr(out, "decoder_hidden_states") \
                else out.hidden_states
            self.features = torch.cat([hs[i] for i in self._feature_layers], -1)[:b]
        logits, self._pending = self.force(logits, tokens, self.length)
        self._since += n
        self.length += n
        return self.params.probs(logits)

    def force(self, logits: torch.Tensor, tokens: torch.Tensor, start: int):
        """The pattern's forced ids on logits [B, n, C, V] predicted from the events ``tokens``
        [B, n, C] fed at slots ``start``.. (slot s predicts step s): (logits, the end-of-speech
        steps seen in the fed events, their steps). Reads the committed end-of-speech step,
        changes nothing (a draft head forces its own logits the same way)."""
        b, n, c = tokens.shape
        dev = tokens.device
        t = (start + torch.arange(n, device=dev))[None].expand(b, n)            # predicted steps
        eos = self.eos_step[:, None].expand(b, n)
        pending = None
        if self.eos is not None:   # codebook 0 emitting end-of-speech at fed step s ends frames
            fed_steps = t - 1
            hit = (tokens[..., 0] == self.eos) & (fed_steps >= 0)
            first = torch.where(hit, fed_steps, 1 << 30).cummin(1).values
            eos = torch.minimum(eos, first)
            pending = (first, fed_steps)
        c_idx = torch.arange(c, device=dev)
        end = torch.minimum(eos, torch.full_like(eos, self.num_frames))        # [B, n]
        # codebook c is outside its frames at step t: before its delay (pad) or after the last
        # frame (end-of-speech; pad for fixed-length models)
        head = t[..., None] < c_idx                                             # [B, n, C]
        tail = t[..., None] >= end[..., None] + c_idx
        forced = head | tail
        logits = torch.where(forced[..., None], torch.full_like(logits, float("-inf")), logits)
        logits[..., self.pad] = torch.where(head, 0.0, logits[..., self.pad])
        fill = self.pad if self.eos is None else self.eos
        logits[..., fill] = torch.where(tail, 0.0, logits[..., fill])
        if self.eos is not None:   # inside the frames, end-of-speech only from codebook 0
            ban = ~forced
            ban[..., 0] = False
            logits[..., self.eos] = torch.where(ban, float("-inf"), logits[..., self.eos])
            # pad only in the head
            logits[..., self.pad] = torch.where(head, logits[..., self.pad], float("-inf"))
        return logits, pending

    def commit(self, keep: int, valid, path=None) -> None:
        n = self._since
        if not 0 <= keep <= n:
            raise ValueError(f"keep={keep}: accepted 0..{n}")
        crop(self.cache, n - keep)
        self.length -= n - keep
        if self.eos is not None and keep:
            first, fed_steps = self._pending
            kept_first = torch.where(fed_steps[:, :keep] < self.length, first[:, :keep], 1 << 30)
            self.eos_step = torch.minimum(self.eos_step, kept_first.min(1).values)
        self._since = 0


class DecoderWithTextEncoder(torch.nn.Module):
    """A ``MusicgenForCausalLM`` (the delay-pattern decoder alone) and a separate text encoder,
    called the way ``MusicgenForConditionalGeneration`` is: the encoder states (projected by
    ``enc_to_dec_proj`` when given, zeroed on padding) feed the decoder's cross-attention."""

    def __init__(self, decoder, text_encoder, enc_to_dec_proj=None):
        super().__init__()
        self.decoder, self.text_encoder, self.enc_to_dec_proj = decoder, text_encoder, enc_to_dec_proj
        self.generation_config = decoder.generation_config
        self._cache_arg = cache_argument(decoder)

    def forward(self, encoder_outputs=None, attention_mask=None, decoder_input_ids=None,
                decoder_attention_mask=None, cache=None, use_cache=None, **kw):
        h = encoder_outputs[0]
        if self.enc_to_dec_proj is not None:
            h = self.enc_to_dec_proj(h)
        if attention_mask is not None:
            h = h * attention_mask[..., None]
        return self.decoder(input_ids=decoder_input_ids, attention_mask=decoder_attention_mask,
                            encoder_hidden_states=h, encoder_attention_mask=attention_mask,
                            use_cache=use_cache, **{self._cache_arg: cache}, **kw)
