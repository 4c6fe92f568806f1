"""``TextToSpeech``: codec-token speech generation with any method.

    tts = TextToSpeech.from_pretrained("samples/models/shapes-tts", draft="samples/models/shapes-tts-draft")
    out = tts("a small blue star at the bottom", method="exact", seed=0)
    out.save("out/tts")          # WAV files (soundfile) and spectrogram PNGs

Targets (``modalities.speech.adapters``; each owns its layout's differences):
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

import time

import torch

from mmspec.checks import check_count, check_guidance_scale, guided
from mmspec.drafters.load import load_head
from mmspec.engine import Engine
from mmspec.registry import MethodContext, parse_method
from mmspec.runner import prepare
from mmspec.sampling import SamplingParams
from modalities.registry import serialized

from .audio import AudioOutput
from .bundled import load_speech_adapter


class TextToSpeech:
    """Codec-token speech generation with any method: ``TextToSpeech.from_pretrained(path,
    draft=)``, then ``tts(text, method=..., seed=...)`` -> ``AudioOutput`` (``audio``,
    ``sampling_rate``, codes, stats); ``head``: a ``mmspec.DraftHead`` trained for the target
    (method ``"head"``)."""
    def __init__(self, target, draft=None, defaults=None, head=None):
        if draft is not None:
            target.check_compatible(draft)
        self.target, self.draft = target, draft
        self.head = load_head(head, target.model)
        self.defaults = dict(defaults or {})

    @property
    def head_kind(self) -> str:
        """The kind of draft head the target takes (its adapter's: token, frame or depth)."""
        return self.target.head_kind

    @classmethod
    @serialized
    def from_pretrained(cls, target, draft=None, device=None, head=None, **load_kwargs):
        """``target`` / ``draft``: a folder or Hugging Face id, a model object, or an adapter;
        ``device``: where to put them; ``head``: a draft head's folder (or ``DraftHead``);
        ``load_kwargs`` go to transformers' ``from_pretrained``."""
        t, defaults = load_speech_adapter(target, **load_kwargs)
        d = load_speech_adapter(draft, **load_kwargs)[0] if draft is not None else None
        tts = cls(t, d, defaults).to(device)
        tts.head = load_head(head, tts.target.model)
        return tts

    def to(self, device=None, dtype=None) -> "TextToSpeech":
        """Move (and cast) the models of target and draft, and their codecs (device only)."""
        for a in (self.target, self.draft):
            if a is not None and (device is not None or dtype is not None):
                a.model.to(device=device, dtype=dtype)
                if device is not None:
                    a.codec.to(device)
        if getattr(self, "head", None) is not None:
            self.head.attach(self.target.model)
        return self

    @property
    def device(self) -> torch.device:
        """The device of the target's parameters."""
        return self.target.device

    def _texts(self, text, description) -> list:
        if not isinstance(text, (str, list, tuple)):
            raise ValueError(f"text={type(text).__name__}: accepted a string, a list of ids, "
                             "or a list of those")
        texts = [text] if isinstance(text, str) or (isinstance(text, list) and text
                                                     and isinstance(text[0], int)) else list(text)
        if not texts:
            raise ValueError("text: accepted at least one text")
        for i, t in enumerate(texts):
            if not (isinstance(t, str) or isinstance(t, (list, tuple)) and all(
                    isinstance(x, int) and not isinstance(x, bool) for x in t)):
                raise ValueError(f"text {i}: {t!r:.60}: accepted a string or a list of token ids")
        if any(isinstance(t, str) and not t.strip() for t in texts):
            raise ValueError("text: accepted non-empty strings")
        if description is None:
            description = self.defaults.get("description")     # e.g. the bundled speaker tag
        if description is not None:
            self._check_description(description)
            texts = [f"{description} {t}" if isinstance(t, str) else t for t in texts]
        return texts

    def _check_description(self, description) -> None:
        """A non-blank string the model's text encoder takes (named, not taken for a text)."""
        if not isinstance(description, str) or not description.strip():
            raise ValueError(f"description={description!r:.60}: accepted a non-blank string (put "
                             "before each text), or None")
        try:
            self.target.text_ids(description)
        except ValueError as e:
            raise ValueError(f"description={description!r:.60}: refused by the model's text "
                             f"encoder ({e})") from None

    @torch.inference_mode()
    def code_nll(self, text, codes: torch.Tensor) -> float:
        """Mean negative log-likelihood (nats per code) of ``codes`` [N, C] (as returned in
        ``AudioOutput.codes``) given ``text`` under the target, teacher-forced at temperature 1
        without top-k or guidance; end-of-speech included when the model has one. Codes
        outside each codebook's frames (the delay pattern's padding) are not counted."""
        tgt = self.target
        codes = torch.as_tensor(codes, dtype=torch.long).to(tgt.device)
        batch = tgt.prompt(self._texts(text, None), guided=False)
        fed, ids, counted = tgt.teacher_forcing(batch, codes)
        session = tgt.session(SamplingParams(temperature=1.0), None, codes.shape[0] + 1)
        session.prefill(**batch)
        probs = session.step(fed[None])[0]                                     # [T, (C,) V]
        lp = torch.log(probs.gather(-1, ids[..., None]).squeeze(-1))
        return float(-lp[counted].mean())

    @torch.inference_mode()
    def __call__(self, text, *, method: str = "plain", temperature: float = 1.0,
                 top_k: int | None = None, seed: int | None = None, description=None,
                 guidance_scale: float | None = None, max_frames: int | None = None,
                 progress: bool = True, decode: bool = True, compile: bool | str = False,
                 static_cache: bool | None = None, pipeline: bool | None = None,
                 engine: Engine | None = None, drafter=None, **method_params) -> AudioOutput:
        """drafter: a ``mmspec`` Drafter object instead of the method's (the method then names
        the rule). compile / static_cache / pipeline, or ``engine``: as in ``mmspec.generate`` (static caches, steps
        captured as CUDA graphs, draft steps queued ahead), for single-codebook and CSM targets
        (CSM: the backbone's steps; the depth decoder runs eagerly). Delay-pattern models
        (MusicGen) decode eagerly on a dynamic cache."""
        tgt = self.target
        # 1. Inputs, checked before any model runs.
        texts = self._texts(text, description)
        g = guided(check_guidance_scale(self.defaults.get("guidance_scale") if guidance_scale
                                        is None else guidance_scale))
        top_k = self.defaults.get("top_k") if top_k is None else top_k
        frames = check_count("max_frames", tgt.max_frames if max_frames is None else max_frames)
        params = SamplingParams(temperature=temperature, top_k=top_k)
        engine = tgt.check_engine(Engine.from_switches(compile, static_cache, pipeline,
                                                       engine=engine).check(tgt.model))
        spec = parse_method(method, method_params, has_draft=self.draft is not None,
                            has_head=self.head is not None)
        tgt.check_method(spec)
        batch = tgt.prompt(texts, g is not None)
        dbatch = self.draft.prompt(texts, g is not None) if spec.uses_draft_model else None

        # 2. The plan, the sessions, the drafter and the rule (lifted to the layout's events).
        k, width = spec.num_draft_tokens(tgt.jacobi_defaults), batch["input_ids"].shape[1]
        limits = [tgt.max_positions(), self.draft.max_positions() if dbatch is not None else None]
        plan = engine.plan(max_new_tokens=tgt.steps(frames), num_draft_tokens=k,
                           draft_model=spec.uses_draft_model,
                           positions=width + tgt.steps(frames) + spec.reach(tgt.jacobi_defaults),
                           limits=limits)
        session = tgt.session(params, g, frames, **plan.cache(width, len(texts)))
        context = MethodContext(
            draft_session=None if dbatch is None else lambda: self.draft.session(
                params, g, frames, **plan.cache(dbatch["input_ids"].shape[1], len(texts))),
            embeddings=tgt.codebook_embeddings(0), jacobi=tgt.jacobi_defaults,
            queue_drafts=plan.queue_drafts, head=self.head)
        scalar = spec.build_rule(context)
        drafter = spec.build_drafter(context) if drafter is None else drafter
        run = prepare(session, drafter, tgt.rule(scalar), plan=plan, seed=seed, device=tgt.device)

        # 3. Prefill and the loop.
        t0 = time.perf_counter()
        run.prefill(batch, dbatch)
        res = run.collect(tgt.first_tokens(batch), stops=tgt.stops(),
                          progress=method if progress else None)

        # 4. Codes and audio.
        codes = [tgt.codes(row, frames) for row in res.tokens]
        waves = [tgt.waveform(c) for c in codes] if decode else []
        return AudioOutput(waveforms=waves, sample_rate=tgt.sample_rate, codes=codes,
                           stats=run.stats, seconds=time.perf_counter() - t0)
