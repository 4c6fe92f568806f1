"""``TextToSpeech``: codec-token speech generation with any method.

    tts = TextToSpeech.from_pretrained("samples/models/shapes-tts", draft="samples/models/shapes-tts-draft")
    out = tts("a small blue star at the bottom", method="exact", seed=0)
    out.save("out/tts")          # WAV files (soundfile) and spectrogram PNGs

Targets (adapters in this package):
- delay-pattern multi-codebook decoders (``MusicgenForConditionalGeneration``, or
  ``MusicgenForCausalLM`` with a text encoder): one event per decoding step = a C-tuple,
  verified codebook by codebook with ``Frame`` (lossless with the exact rule); drafts from a
  smaller model or Jacobi windows of whole frames;
- single-codebook decoder-only models over codec ids (Llasa-style): an ordinary token stream
  (``SingleCodebookAdapter``), where every drafter works, Jacobi included;
- depth-decoder models (CSM, ``modalities.speech.csm.CsmAdapter``): a frame is drafted by a
  smaller CSM and verified with ``DepthFrame`` (lossless with the exact rule).
Codecs: transformers' Encodec, DAC, Mimi and X-codec2 (``codec_for``) or the bundled one.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm

from mmspec.acceptance import DepthFrame, Frame
from mmspec.drafters import ModelDrafter
from mmspec.generate import check_engine, queues_drafts, static_length
from mmspec.loop import stream
from mmspec.registry import build_method, parse_method
from mmspec.sampling import SamplingParams, make_generator
from mmspec.session import max_positions
from mmspec.types import StepStats

from .delay import DelayPatternSession, undo_delay


@dataclass
class AudioOutput:
    """waveforms: one float32 array per text; codes: [frames, C] per text; stats."""

    waveforms: list
    sample_rate: int
    codes: list
    stats: StepStats
    seconds: float

    def save(self, path: str, spectrogram: bool = True, prefix: str = "speech") -> list[str]:
        """Write ``prefix_XXX.wav`` (and ``.png`` spectrograms) into the folder ``path``."""
        import soundfile as sf

        os.makedirs(path, exist_ok=True)
        written = []
        for i, w in enumerate(self.waveforms):
            f = os.path.join(path, f"{prefix}_{i:03d}.wav")
            sf.write(f, np.asarray(w, np.float32), self.sample_rate)
            written.append(f)
            if spectrogram:
                written.append(save_spectrogram(w, self.sample_rate, f[:-4] + ".png"))
        return written


def mel_db(wave, sample_rate: int) -> np.ndarray:
    import torchaudio

    w = torch.as_tensor(np.asarray(wave, np.float32))
    n_fft = 512
    while n_fft > 16 and n_fft // 2 >= w.numel():       # very short clips
        n_fft //= 2
    if w.numel() <= n_fft // 2:
        w = torch.nn.functional.pad(w, (0, n_fft // 2 + 1 - w.numel()))
    mel = torchaudio.transforms.MelSpectrogram(sample_rate=sample_rate, n_fft=n_fft,
                                               hop_length=max(1, min(n_fft // 4, sample_rate // 100)),
                                               n_mels=min(64, n_fft // 8))
    m = mel(w)
    return (10 * torch.log10(m + 1e-8)).numpy()


def save_spectrogram(wave, sample_rate: int, path: str, title: str | None = None) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 2.4))
    ax.imshow(mel_db(wave, sample_rate), origin="lower", aspect="auto", cmap="magma")
    ax.set_xlabel("frame (10 ms)")
    ax.set_ylabel("mel bin")
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


class DecoderWithTextEncoder(torch.nn.Module):
    """A ``MusicgenForCausalLM`` (the delay-pattern decoder alone) and a separate text encoder,
    called the way ``MusicgenForConditionalGeneration`` is: the encoder states (projected by
    ``enc_to_dec_proj`` when given, zeroed on padding) feed the decoder's cross-attention."""

    def __init__(self, decoder, text_encoder, enc_to_dec_proj=None):
        super().__init__()
        self.decoder, self.text_encoder, self.enc_to_dec_proj = decoder, text_encoder, enc_to_dec_proj
        self.generation_config = decoder.generation_config
        from mmspec.cache import cache_argument

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
                            use_cache=use_cache, **{self._cache_arg: cache})


def spectrogram_grid(waves_by_name: dict, sample_rate: int, path: str, show: int | None = None,
                     dpi: int = 100) -> str:
    """Mel spectrograms, one row per name (a method), one column per waveform (at the same
    seed), written to ``path``; empty waveforms leave their cell blank."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(waves_by_name)
    n = max(len(w) for w in waves_by_name.values()) if show is None else show
    fig, axes = plt.subplots(len(names), n, figsize=(4 * n, 2.2 * len(names)), squeeze=False)
    for r, name in enumerate(names):
        for i in range(n):
            ax = axes[r][i]
            waves = waves_by_name[name]
            if i < len(waves) and len(waves[i]):
                ax.imshow(mel_db(waves[i], sample_rate), origin="lower", aspect="auto", cmap="magma")
            ax.set_title(f"{name[:24]} #{i}", fontsize=8)
            ax.set_xticks([])
            ax.set_yticks([])
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


class CodecAdapter:
    """What every speech adapter shares: ``model``, ``codec``, C ``codebooks`` of
    ``vocab_size`` ids; a draft must be of the same kind with the same codebooks and codec
    rate."""

    codebooks = 1
    text_padding = "left"          # decoder-only prompts; a text encoder's input: "right"
    prefix: tuple = ()
    suffix: tuple = ()

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
        if not body:
            raise ValueError("text: accepted non-empty token lists")
        return body

    def encode_text(self, texts) -> dict:
        from modalities.padding import pad_rows

        rows = [list(self.prefix) + self.text_ids(t) + list(self.suffix) for t in texts]
        ids, mask = pad_rows(rows, getattr(self, "pad_id", 0), self.text_padding, self.device)
        return dict(input_ids=ids, attention_mask=mask)

    @property
    def device(self):
        return next(self.model.parameters()).device

    @property
    def sample_rate(self) -> int:
        return int(self.codec.sample_rate)

    def check_compatible(self, draft) -> None:
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


class DelayPatternAdapter(CodecAdapter):
    """A MusicGen-layout model: ``model.text_encoder``, ``model.decoder`` with C codebooks,
    a codec with ``decode(frames [B, N, C]) -> [B, samples]`` and ``sample_rate``.

    model:     ``MusicgenForConditionalGeneration``, or ``MusicgenForCausalLM`` (the decoder
               alone) with ``text_encoder=`` (and ``enc_to_dec_proj=`` when its hidden size
               differs from the decoder's).
    tokenizer: ``encode(str) -> ids`` (or a transformers tokenizer); pad_token_id: the
    decoder's pad / start id; eos_token_id: end-of-speech id (None: fixed length).
    """

    text_padding = "right"         # the text encoder's input

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
        self.vocab_size = int(dcfg.vocab_size)
        self.pad = dcfg.pad_token_id if pad_token_id is None else pad_token_id
        self.start = getattr(model.generation_config, "decoder_start_token_id", None) or self.pad
        self.eos = eos_token_id
        self.max_frames = max_frames
        self.frames_per_char = frames_per_char

    def session(self, params, guidance_scale, num_frames, **engine):
        if engine.get("static_len") is not None:
            raise ValueError("static_cache / compile: not available for delay-pattern models "
                             "(MusicGen, Parler-TTS): their decoder takes its positions from the "
                             "cache's length, which a static cache does not roll back; accepted "
                             "compile=False, static_cache=None")
        return DelayPatternSession(self.model, params, guidance_scale, num_frames, self.pad, self.eos)

    def codebook_embeddings(self, c: int) -> torch.Tensor:
        emb = self.model.decoder.get_input_embeddings()
        table = emb[c] if isinstance(emb, torch.nn.ModuleList) else emb
        return table.weight.detach().float()[: self.vocab_size]

    def decode(self, frames: torch.Tensor) -> np.ndarray:
        with torch.no_grad():
            return self.codec.decode(frames.clamp(0, self.codec.codebook_size - 1))


class SingleCodebookAdapter(CodecAdapter):
    """A decoder-only LM over [text ids | codec ids] (Llasa-style): an ordinary token stream.

    codec_ids: vocabulary id of each codec code (codec order); end_id: end-of-speech id;
    prefix / suffix: ids around the text; codec: ``decode(frames [B, N, 1])``.
    """

    def __init__(self, model, codec, codec_ids, end_id: int, tokenizer=None, prefix=(), suffix=(),
                 pad_id: int = 0, max_frames: int = 256):
        self.model, self.codec, self.tokenizer = model, codec, tokenizer
        self.to_vocab = torch.cat([torch.as_tensor(list(codec_ids)), torch.tensor([end_id])])
        self.vocab_size = int(self.to_vocab.numel())          # codes + end-of-speech
        self.eos = self.vocab_size - 1
        self.prefix, self.suffix, self.pad_id = list(prefix), list(suffix), pad_id
        self.max_frames = max_frames

    def session(self, params, guidance_scale, num_frames=None, **engine):
        from mmspec.session import TokenSpanSession

        return TokenSpanSession(self.model, params, guidance_scale, self.to_vocab, **engine)

    def codebook_embeddings(self, c: int = 0) -> torch.Tensor:
        return self.model.get_input_embeddings().weight.detach().float()[self.to_vocab]

    def decode(self, frames):
        with torch.no_grad():
            return self.codec.decode(frames)


class EncodecCodec:
    """transformers' EncodecModel behind the codec surface (e.g. MusicGen's audio encoder)."""

    def __init__(self, model):
        self.model = model
        self.sample_rate = int(model.config.sampling_rate)
        self.codebook_size = int(model.config.codebook_size)

    def to(self, device):
        self.model.to(device)
        return self

    def decode(self, frames: torch.Tensor) -> np.ndarray:
        codes = frames.permute(0, 2, 1)[None]                          # [1, B, C, N]
        audio = self.model.decode(codes, [None]).audio_values           # [B, 1, samples]
        return audio[:, 0].float().cpu().numpy()


class TransformersCodec:
    """A transformers neural codec behind the codec surface: ``DacModel``, ``MimiModel``
    (residual codebooks, ``audio_codes`` [B, C, N]) or ``Xcodec2Model`` (Llasa's codec: one
    FSQ codebook of prod(quantization_levels) ids, [B, 1, N]); ``EncodecModel`` goes through
    ``EncodecCodec``. ``decode(frames [B, N, C]) -> [B, samples]`` float32 at
    ``sample_rate``; ``codebook_size`` ids per codebook."""

    def __init__(self, model):
        cfg = model.config
        self.model = model
        rate = getattr(cfg, "sampling_rate", None) or getattr(cfg, "sample_rate", None)
        if rate is None:
            raise ValueError(f"{type(model).__name__}: its config names no sampling rate")
        self.sample_rate = int(rate)
        levels = getattr(cfg, "quantization_levels", None)       # X-codec2: one FSQ codebook
        self.codebook_size = (int(np.prod(levels)) if getattr(cfg, "codebook_size", None) is None
                              and levels else int(cfg.codebook_size))

    def to(self, device):
        self.model.to(device)
        return self

    @torch.no_grad()
    def decode(self, frames: torch.Tensor) -> np.ndarray:
        if frames.dim() != 3:
            raise ValueError(f"frames must be [B, N, C] codes, got {tuple(frames.shape)}")
        codes = frames.permute(0, 2, 1).to(next(self.model.parameters()).device)   # [B, C, N]
        out = self.model.decode(audio_codes=codes)
        audio = out.audio_values if hasattr(out, "audio_values") else out[0]
        if audio.dim() == 3:                                                     # [B, 1, samples]
            audio = audio[:, 0]
        return audio.float().cpu().numpy()


def codec_for(model):
    """The codec surface for a transformers codec model (Encodec, DAC, Mimi, X-codec2). X-codec
    (version 1) is not wired: untested here."""
    name = type(model).__name__
    if name == "EncodecModel":
        return EncodecCodec(model)
    if name in ("DacModel", "MimiModel", "Xcodec2Model"):
        return TransformersCodec(model)
    raise ValueError(f"codec {name}: accepted EncodecModel, DacModel, MimiModel or Xcodec2Model")


def _unconditional(adapter, batch) -> dict:
    """Unconditional prompts of ``batch``'s shape for a single-codebook model: the empty
    text (prefix, pad id, suffix), left-padded."""
    empty = adapter.encode_text([[adapter.pad_id]] * batch["input_ids"].shape[0])
    un = torch.full_like(batch["input_ids"], adapter.pad_id)
    um = torch.zeros_like(batch["attention_mask"])
    w = empty["input_ids"].shape[1]
    un[:, -w:], um[:, -w:] = empty["input_ids"], empty["attention_mask"]
    return dict(uncond_ids=un, uncond_mask=um)


class TextToSpeech:
    def __init__(self, target, draft=None, defaults=None):
        if draft is not None:
            target.check_compatible(draft)
        self.target, self.draft = target, draft
        self.defaults = dict(defaults or {})

    @classmethod
    def from_pretrained(cls, target, draft=None, **load_kwargs):
        from .bundled import load_speech_adapter

        t, defaults = load_speech_adapter(target, **load_kwargs)
        d = load_speech_adapter(draft, **load_kwargs)[0] if draft is not None else None
        return cls(t, d, defaults)

    @torch.inference_mode()
    def code_nll(self, text, codes: torch.Tensor) -> float:
        """Mean negative log-likelihood (nats per code) of ``codes`` [N, C] (as returned in
        ``AudioOutput.codes``) given ``text`` under the target, teacher-forced at temperature 1
        without top-k or guidance; end-of-speech included when the model has one. Codes
        outside each codebook's frames (the delay pattern's padding) are not counted."""
        tgt = self.target
        description = self.defaults.get("description")
        if description is not None and isinstance(text, str):
            text = f"{description} {text}"
        codes = torch.as_tensor(codes, dtype=torch.long).to(tgt.device)
        n = codes.shape[0]
        session = tgt.session(SamplingParams(temperature=1.0), None, n + 1)
        session.prefill(**tgt.encode_text([text]))
        if isinstance(tgt, SingleCodebookAdapter):
            stream_ids = codes[:, 0]
            if tgt.eos is not None:
                stream_ids = torch.cat([stream_ids, stream_ids.new_tensor([tgt.eos])])
            fed = torch.cat([tgt.encode_text([text])["input_ids"][0, -1:], stream_ids[:-1]])
            probs = session.step(fed[None])[0]                                  # [T, V]
            lp = torch.log(probs.gather(-1, stream_ids[:, None]).squeeze(-1))
            return float(-lp.mean())
        c = tgt.codebooks
        frames = codes
        if tgt.eos is not None:   # the end-of-speech frame: eos on every codebook, delayed
            frames = torch.cat([codes, codes.new_full((1, c), tgt.eos)])
        from .delay import apply_delay

        delayed = apply_delay(frames[None], tgt.pad)[0]                         # [T, C]
        start = torch.full((1, c), tgt.start, dtype=torch.long, device=tgt.device)
        fed = torch.cat([start, delayed[:-1]])
        probs = session.step(fed[None])[0]                                      # [T, C, V]
        lp = torch.log(probs.gather(-1, delayed[..., None]).squeeze(-1))          # [T, C]
        t = torch.arange(delayed.shape[0], device=lp.device)[:, None]
        k = torch.arange(c, device=lp.device)[None]
        inside = (t >= k) & (t < k + frames.shape[0])
        return float(-lp[inside].mean())

    @torch.inference_mode()
    def __call__(self, text, *, method: str = "plain", temperature: float = 1.0,
                 top_k: int | None = None, seed: int | None = None, description=None,
                 guidance_scale: float | None = None, max_frames: int | None = None,
                 progress: bool = True, decode: bool = True, compile: bool | str = False,
                 static_cache: bool | None = None, pipeline: bool | None = None,
                 **method_params) -> AudioOutput:
        """compile / static_cache / pipeline: as in ``mmspec.generate`` (static caches, steps
        captured as CUDA graphs, draft steps queued ahead), for single-codebook and CSM targets
        (CSM: the backbone's steps; the depth decoder runs eagerly). Delay-pattern models
        (MusicGen) decode eagerly on a dynamic cache."""
        tgt = self.target
        static = check_engine(compile, static_cache, pipeline, tgt.model)
        texts = [text] if isinstance(text, str) or (isinstance(text, list) and text
                                                     and isinstance(text[0], int)) else list(text)
        if not texts:
            raise ValueError("text: accepted at least one text")
        if description is None:
            description = self.defaults.get("description")     # e.g. the bundled speaker tag
        if description is not None:
            texts = [f"{description} {t}" if isinstance(t, str) else t for t in texts]
        if guidance_scale is None:
            guidance_scale = self.defaults.get("guidance_scale")
        if guidance_scale is not None and not (math.isfinite(guidance_scale) and guidance_scale >= 0):
            raise ValueError(f"guidance_scale={guidance_scale!r}: accepted a finite float >= 0")
        if top_k is None:
            top_k = self.defaults.get("top_k")
        frames = max_frames or tgt.max_frames
        if not isinstance(frames, int) or frames < 1:
            raise ValueError(f"max_frames={frames!r}: accepted an integer >= 1")
        params = SamplingParams(temperature=temperature, top_k=top_k)
        g = guidance_scale if guidance_scale not in (None, 1.0) else None
        batch = tgt.encode_text(texts)
        c = tgt.codebooks
        uses_draft = parse_method(method, self.draft is not None)[0] == "draft"
        num = method_params.get("num_draft_tokens", 4)
        if uses_draft and (not isinstance(num, int) or num < 1):
            raise ValueError(f"num_draft_tokens={num!r}: accepted an integer >= 1")
        # (Delay-pattern sessions refuse static caches when they are built, before any forward.)
        delay = isinstance(tgt, DelayPatternAdapter)
        if pipeline and delay:
            raise ValueError("pipeline=True: not available for delay-pattern models (every row "
                             "is committed to the shortest accepted length); accepted None or False")
        width = batch["input_ids"].shape[1]
        dbatch = self.draft.encode_text(texts) if uses_draft else None
        host_free = queues_drafts(pipeline, compile, uses_draft and not delay, width + frames + num,
                                  [] if delay else [max_positions(tgt.model),
                                                    uses_draft and max_positions(self.draft.model)])

        def engine(prompt_width, k):
            if not static:
                return {}
            return dict(static_len=static_length(prompt_width, len(texts), frames, k, host_free),
                        compile=compile)

        draft_session = None
        if self.draft is not None:
            dwidth = dbatch["input_ids"].shape[1] if uses_draft else 0
            draft_session = lambda: self.draft.session(params, g, frames,  # noqa: E731
                                                       **engine(dwidth, num))
        single = isinstance(tgt, SingleCodebookAdapter)
        depth = getattr(tgt, "depth", False)
        jd = dict(init_range=(0, tgt.vocab_size - 1))
        if not single:
            jd["event_shape"] = (c,)          # Jacobi windows of whole frames (delay patterns)
        drafter, scalar = build_method(method, method_params, draft_session=draft_session,
                                       embeddings=tgt.codebook_embeddings(0), jacobi_defaults=jd,
                                       host_free=host_free)
        frame_rule = DepthFrame if depth else Frame
        if single:
            rule = scalar
        elif hasattr(scalar, "embeddings"):   # relaxed rules: each codebook its own table
            rule = frame_rule(rules=[dataclasses.replace(scalar, embeddings=tgt.codebook_embeddings(k))
                                     for k in range(c)])
        else:
            rule = frame_rule(rules=[scalar])
        if depth and not isinstance(drafter, ModelDrafter) and type(drafter).__name__ != "NoDraft":
            raise ValueError(f"method={method!r}: depth-decoder targets draft with a model or "
                             "plain decoding (Jacobi windows over depth-decoder frames are not "
                             "supported: their drafts need the conditionals along each frame)")
        gen = make_generator(seed, tgt.device)
        if hasattr(drafter, "generator"):
            drafter.generator = gen
        stats = StepStats()
        t0 = time.perf_counter()
        session = tgt.session(params, g, frames, **engine(width, getattr(drafter, "num_tokens", 0)))
        uncond = single and g is not None       # the unconditional rows: an empty text
        session.prefill(**batch, **(_unconditional(tgt, batch) if uncond else {}))
        if isinstance(drafter, ModelDrafter):
            drafter.begin(vocab_size=tgt.vocab_size, **dbatch,
                          **(_unconditional(self.draft, dbatch) if uncond else {}))
        else:
            drafter.begin(batch["input_ids"], batch["attention_mask"], vocab_size=tgt.vocab_size)
        stats.seconds_prefill = time.perf_counter() - t0
        if single:
            first = batch["input_ids"][:, -1]
            steps = frames
        elif depth:   # the first step feeds the prompt's last text token (the session knows it)
            first = torch.zeros((len(texts), c), dtype=torch.long, device=tgt.device)
            steps = frames
        else:
            first = torch.full((len(texts), c), tgt.start, dtype=torch.long, device=tgt.device)
            steps = frames + c - 1
        rows = [[] for _ in texts]
        stops = {tgt.eos} if tgt.eos is not None else set()
        stop_on = "last"
        if depth:     # CSM: a row ends with its first frame of end-of-audio ids
            stops, stop_on = {tgt.frame_eos}, "all"
        bar = tqdm(total=steps, desc=method, disable=None if progress else True, leave=False)
        for ev in stream(session, drafter, rule, first, max_new_tokens=steps, stop_token_ids=stops,
                         stop_on=stop_on, generator=gen, stats=stats, fixed_k=bool(compile),
                         pipeline=False if pipeline is False else None):
            for i, new in enumerate(ev.new_tokens):
                rows[i].extend(new)
            bar.update(min(len(r) for r in rows) - bar.n)
        bar.close()
        codes = []
        for r in rows:
            if depth:    # frames up to the first end-of-audio frame
                codes.append(tgt.frames_of(r))
                continue
            if single:   # a plain stream: codes up to end-of-speech
                ids = [t for t in r if t != tgt.eos]
                codes.append(torch.tensor(ids, dtype=torch.long).view(-1, 1))
                continue
            delayed = torch.tensor(r, dtype=torch.long)[None]                  # [1, T, C]
            if tgt.eos is not None:
                col0 = delayed[0, :, 0]
                n_frames = int((col0 == tgt.eos).nonzero()[0]) if bool((col0 == tgt.eos).any()) else delayed.shape[1] - c + 1
            else:
                n_frames = frames
            n_frames = max(0, min(n_frames, delayed.shape[1] - c + 1))
            codes.append(undo_delay(delayed, n_frames)[0] if n_frames else
                         torch.zeros(0, c, dtype=torch.long))
        waves = []
        if decode:
            for cd in codes:
                waves.append(tgt.decode(cd[None].to(tgt.device))[0] if len(cd) else np.zeros(0, np.float32))
        return AudioOutput(waveforms=waves, sample_rate=tgt.sample_rate, codes=codes, stats=stats,
                           seconds=time.perf_counter() - t0)
