"""``ContinuousImageGenerator``: continuous speculative decoding (CSpD) on continuous-token
image models, from conditioning rows to latents and images."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

import torch

from mmspec.acceptance.continuous import ContinuousExact
from mmspec.checks import check_count, check_guidance_scale
from mmspec.drafters import ModelDrafter, NoDraft, Prefilled
from mmspec.engine import Engine
from mmspec.runner import prepare
from mmspec.sampling import make_generator

from modalities.registry import load_pretrained, serialized

from .model import ContinuousARModel, prompt_rows
from .session import ContinuousSession


@dataclass
class ContinuousImageOutput:
    latents: torch.Tensor          # [B, L, D] in the autoencoder's latent units
    images: list | None            # PIL images when a decoder is attached
    stats: object                  # mmspec StepStats (extra: rejections, residual proposals, fallbacks)


class WordIds:
    """Caption words -> conditioning ids 0..V-1 (whitespace-separated, a closed vocabulary)."""

    def __init__(self, words: list[str]):
        self.words = list(words)
        self.index = {w: i for i, w in enumerate(self.words)}

    def encode(self, text: str) -> list[int]:
        """A caption -> word ids, refusing words outside the vocabulary (named)."""
        unknown = [w for w in text.split() if w not in self.index]
        if unknown:
            raise ValueError(f"prompt words outside the model's vocabulary: {unknown}; accepted "
                             f"words: {' '.join(self.words)}")
        return [self.index[w] for w in text.split()]


DECODERS = ("VQModel", "AutoencoderKL")      # latents -> images, the decoders decode() handles


def _id_rows(prompt_ids) -> list[list[int]]:
    """``prompt_ids``: one list of conditioning ids per image (or a [B, L] tensor)."""
    rows = prompt_ids.tolist() if isinstance(prompt_ids, torch.Tensor) else prompt_ids
    if not isinstance(rows, (list, tuple)) or not all(
            isinstance(r, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool)
                                                 for t in r) for r in rows):
        raise ValueError(f"prompt_ids={prompt_ids!r:.60}: accepted lists of conditioning ids "
                         "(integers), one per image")
    return [list(r) for r in rows]


class ContinuousImageGenerator:
    """CSpD on continuous-token image models.

    ``ContinuousImageGenerator(target, draft=None, decoder=None, tokenizer=None)``; target
    and draft are ``ContinuousARModel``s (or folders) over the same latent space; ``decoder``
    maps latents [B, D, h, w] to images (a diffusers ``VQModel`` decoding its pre-quantisation
    latents, or an ``AutoencoderKL``); ``tokenizer`` (with ``encode(text) -> ids``) for
    text-conditional models.
    """

    def __init__(self, target, draft=None, decoder=None, tokenizer=None):
        if isinstance(target, (str, os.PathLike)):
            target = load_pretrained(ContinuousARModel, target, dtype=torch.float32)
        if isinstance(draft, (str, os.PathLike)):
            draft = load_pretrained(ContinuousARModel, draft, dtype=torch.float32)
        for name, m in (("target", target), ("draft", draft)):
            if m is not None and not isinstance(m, ContinuousARModel):
                raise ValueError(f"{name} must be a ContinuousARModel, got {type(m).__name__}")
        if draft is not None:
            dt, dd = target.config.latent_dim, draft.config.latent_dim
            if dt != dd:
                raise ValueError(f"latent dimension mismatch: the target's latents have D = {dt}, "
                                 f"the draft's {dd}; accepted a draft over the same latent space")
            if target.config.cond_vocab_size != draft.config.cond_vocab_size:
                raise ValueError(f"conditioning vocabularies differ: target "
                                 f"{target.config.cond_vocab_size}, draft "
                                 f"{draft.config.cond_vocab_size}")
        self.target, self.draft = target.eval(), (None if draft is None else draft.eval())
        self.decoder, self.tokenizer = decoder, tokenizer

    @classmethod
    @serialized
    def from_pretrained(cls, target, draft=None, **load_kwargs) -> "ContinuousImageGenerator":
        """Folders written by ``recipes.train.continuous`` (or any ContinuousARModel folder).

        A ``mmspec_continuous.json`` next to the weights names the decoder (a diffusers
        VQModel or AutoencoderKL folder, relative to the model's) and the caption words of a
        text-conditional model; without it, no decoder and no tokenizer are attached."""
        load_kwargs.setdefault("dtype", torch.float32)
        t = load_pretrained(ContinuousARModel, target, **load_kwargs)
        d = None if draft is None else load_pretrained(ContinuousARModel, draft, **load_kwargs)
        decoder = tokenizer = None
        meta_path = os.path.join(str(target), "mmspec_continuous.json")
        if os.path.exists(meta_path):
            with open(meta_path) as f:
                meta = json.load(f)
            if meta.get("decoder"):
                import diffusers

                dpath = os.path.normpath(os.path.join(str(target), meta["decoder"]))
                name = meta.get("decoder_class", "VQModel")
                if name not in DECODERS:
                    raise ValueError(f"{meta_path}: decoder_class {name!r}: accepted one of "
                                     f"{DECODERS}")
                kind = getattr(diffusers, name)
                decoder = kind.from_pretrained(dpath, torch_dtype=torch.float32).eval()
            if meta.get("words"):
                tokenizer = WordIds(meta["words"])
        return cls(t, d, decoder=decoder, tokenizer=tokenizer)

    def to(self, device) -> "ContinuousImageGenerator":
        """Move the target and the draft; returns the generator."""
        for m in (self.target, self.draft, self.decoder):
            if m is not None:
                m.to(device)
        return self

    @property
    def device(self) -> torch.device:
        """The device of the target's parameters."""
        return next(self.target.parameters()).device

    def _prompts(self, class_labels, prompts, prompt_ids) -> list[list[int]]:
        given = [x is not None for x in (class_labels, prompts, prompt_ids)]
        if sum(given) != 1:
            raise ValueError("pass exactly one of class_labels, prompts (text) and prompt_ids")
        cv = self.target.config.cond_vocab_size
        if class_labels is not None:
            labels = class_labels if isinstance(class_labels, (list, tuple)) else [class_labels]
            if not all(isinstance(c, int) and not isinstance(c, bool) for c in labels):
                raise ValueError(f"class_labels={class_labels!r:.60}: accepted class ids "
                                 "(integers); text prompts go in prompts=")
            rows = [[c] for c in labels]
        elif prompts is not None:
            if self.tokenizer is None:
                raise ValueError("text prompts need a tokenizer (ContinuousImageGenerator("
                                 "tokenizer=...)); or pass prompt_ids")
            texts = [prompts] if isinstance(prompts, str) else prompts
            if not isinstance(texts, (list, tuple)) or not all(isinstance(t, str) for t in texts):
                raise ValueError(f"prompts={prompts!r:.60}: accepted a string or a list of "
                                 "strings; conditioning ids go in prompt_ids=")
            rows = [list(self.tokenizer.encode(t)) for t in texts]
        else:
            rows = _id_rows(prompt_ids)
        if not rows or any(len(r) == 0 for r in rows):
            raise ValueError("empty prompt: accepted at least one conditioning id per image")
        for r in rows:
            if min(r) < 0 or max(r) >= cv:
                raise ValueError(f"conditioning ids must be in [0, {cv - 1}] (class labels or "
                                 f"text ids), got {r}")
        return rows

    def _check(self, temperature, prefill_fraction, guidance_scale, spec: bool,
               num_draft_tokens) -> None:
        if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature > 0):
            raise ValueError(f"temperature={temperature!r}: accepted a finite float > 0 (continuous "
                             "tokens are sampled from densities; there is no greedy mode)")
        if not (isinstance(prefill_fraction, (int, float)) and 0 <= prefill_fraction <= 1):
            raise ValueError(f"prefill_fraction={prefill_fraction!r}: accepted a float in [0, 1]")
        if spec:
            check_count("num_draft_tokens", num_draft_tokens)
        if check_guidance_scale(guidance_scale) is not None:
            for m in [self.target] + ([self.draft] if spec else []):
                if m.config.head != "diffusion":
                    raise ValueError("guidance_scale needs diffusion heads (a guided mixture is not "
                                     "a mixture): accepted guidance_scale=None for head='mixture'")

    def _drafter(self, spec: bool, num_draft_tokens, temperature, guidance_scale, noise_t,
                 bank, trajectory_alignment, prefill_tokens: int):
        """The draft model's drafter (its diffusion noise shared with the target's when
        ``trajectory_alignment``), or plain decoding; the first ``prefill_tokens`` steps
        draft nothing."""
        drafter = NoDraft()
        if spec:
            cfg, dc = self.target.config, self.draft.config
            both = cfg.head == dc.head == "diffusion"
            if trajectory_alignment and both and cfg.diffusion_steps != dc.diffusion_steps:
                raise ValueError(f"trajectory_alignment=True needs one diffusion schedule: target "
                                 f"diffusion_steps={cfg.diffusion_steps}, draft "
                                 f"{dc.diffusion_steps}; accepted equal steps or "
                                 "trajectory_alignment=False")
            noise_d = noise_t if (trajectory_alignment and both) else bank(self.draft)
            drafter = ModelDrafter(ContinuousSession(self.draft, temperature, guidance_scale,
                                                     noise_d), num_draft_tokens)
        return Prefilled(drafter, prefill_tokens) if prefill_tokens else drafter

    @torch.inference_mode()
    def __call__(self, class_labels=None, *, prompts=None, prompt_ids=None,
                 num_draft_tokens: int = 4, temperature: float = 1.0,
                 guidance_scale: float | None = None, seed: int | None = None,
                 prefill_fraction: float = 0.0, trajectory_alignment: bool = True,
                 max_proposals: int = 100, rule=None, use_draft: bool = True, decode: bool = True,
                 progress: bool = False) -> ContinuousImageOutput:
        """Generate one image per conditioning row; speculative when a draft is attached
        (``use_draft=False``: plain decoding of the target, the reference).

        class_labels / prompts / prompt_ids: one conditioning row per image (class ids, text
        through the tokenizer, or conditioning ids). num_draft_tokens: K >= 1.
        temperature: > 0. guidance_scale: classifier-free guidance (diffusion heads).
        prefill_fraction: the first round(f * L) tokens come from the target alone.
        trajectory_alignment: draft and target diffusion heads read one noise bank.
        max_proposals: bound on the residual's acceptance-rejection proposals (a step that
        reaches it draws from the target and is counted in stats.extra["residual_fallbacks"]).
        rule: another continuous rule object (default ContinuousExact(max_proposals)).
        """
        # 1. Inputs, checked before any model runs.
        cfg = self.target.config
        rows = self._prompts(class_labels, prompts, prompt_ids)
        spec = use_draft and self.draft is not None
        self._check(temperature, prefill_fraction, guidance_scale, spec, num_draft_tokens)
        rule = ContinuousExact(max_proposals=max_proposals) if rule is None else rule
        dev, b, n_tok = self.device, len(rows), cfg.num_tokens
        ids, mask = (t.to(dev) for t in prompt_rows(rows, cfg))
        prompt = dict(input_ids=ids, attention_mask=mask)
        if guidance_scale is not None:
            un, _ = prompt_rows(rows, cfg, drop=torch.ones(b, dtype=torch.bool))
            prompt.update(uncond_ids=un.to(dev), uncond_mask=mask.clone())

        # 2. Sessions (one noise bank per diffusion head, drawn from the call's generator).
        gen = make_generator(seed, dev)

        def bank(model):
            if model.config.head != "diffusion":
                return None
            s, d = model.config.diffusion_steps, model.config.latent_dim
            return torch.randn((b, n_tok, s, d), generator=gen, device=dev)

        noise_t = bank(self.target)
        tgt = ContinuousSession(self.target, temperature, guidance_scale, noise_t)
        drafter = self._drafter(spec, num_draft_tokens, temperature, guidance_scale, noise_t,
                                bank, trajectory_alignment, int(round(prefill_fraction * n_tok)))
        plan = Engine().plan(max_new_tokens=n_tok, num_draft_tokens=drafter.num_tokens)
        run = prepare(tgt, drafter, rule, plan=plan, generator=gen)

        # 3. Prefill and the loop.
        run.prefill(prompt)
        res = run.collect(torch.zeros((b, cfg.latent_dim), device=dev),
                          progress="latents" if progress else None)

        # 4. Latents and images.
        z = torch.tensor(res.tokens, dtype=torch.float32) * cfg.latent_std + cfg.latent_mean
        stats = run.stats
        for key in ("rejections", "residual_proposals", "residual_fallbacks"):
            stats.extra.setdefault(key, 0)
        stats.extra["density_exact"] = self.target.density_exact and (
            not spec or self.draft.density_exact)
        images = self.decode(z) if (decode and self.decoder is not None) else None
        return ContinuousImageOutput(latents=z, images=images, stats=stats)

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> list:
        """latents [B, L, D] -> PIL images through the attached decoder."""
        from ..pipeline import to_pil

        h, w = self.target.config.grid
        dec = self.decoder
        ddev = next(dec.parameters()).device
        z = latents.to(ddev).reshape(latents.shape[0], h, w, -1).permute(0, 3, 1, 2)
        if hasattr(dec, "quantize"):        # VQModel: decode the pre-quantisation latents
            img = dec.decode(z, force_not_quantize=True, return_dict=False)[0]
        else:                               # AutoencoderKL
            img = dec.decode(z, return_dict=False)[0]
        return to_pil((img.float() + 1) / 2)
