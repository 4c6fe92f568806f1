"""Continuous-token autoregressive image models (GIVT / MAR pattern) and CSpD on them.

A "token" is a latent vector x in R^D of an autoencoder's grid (raster order); the model's
transformer (a transformers ``LlamaModel``) reads the conditioning ids, a start-of-image id
and the previous latents (through a linear ``latent_in``), and a density head turns each hidden
state into the distribution of the next latent:

- ``head="mixture"`` (GIVT): a diagonal Gaussian mixture with M components, an exact density.
  Temperature scales every component's standard deviation.
- ``head="diffusion"`` (MAR): a small MLP denoiser (v-prediction) conditioned on the hidden state, S DDPM
  steps on a cosine schedule. Sampling runs the reverse chain from the noise bank (one
  [S, D] block of standard normal noise per generated position) down to the last step, whose
  Gaussian N(mu_1, tau^2 beta_1) is the density the acceptance rule sees. Temperature tau
  scales the per-step noise (MAR's convention); classifier-free guidance mixes the
  conditional and unconditional predictions, v_u + s (v_c - v_u).

The diffusion head declares itself approximate (``density_exact = False``): plain decoding
here ends the chain with the last step's Gaussian, which the rule needs, where MAR's sampler
adds no noise at its last step (x = mu_1). Relative to the chain that ends with that Gaussian
the speculative output is exact, with or without trajectory alignment (each position's
noise is drawn once, independent of the tokens before it); relative to MAR's sampler it
differs by that last Gaussian of standard deviation tau sqrt(beta_1). Trajectory alignment
(draft and target reading the same noise bank) changes acceptance only.

Conditioning ids: ``0 .. cond_vocab_size - 1`` are class labels or text ids; ``null_id``
(= cond_vocab_size) is the dropped/unconditional condition and ``bos_id`` (+1) starts the
image. A prompt is ``[cond ids..., bos_id]``.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaModel, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutputWithPast

from mmspec.cache import cache_argument
from mmspec.densities import GaussianMixture
from mmspec.sampling import SamplingParams
from mmspec.session import CausalLMSession

HEADS = ("mixture", "diffusion")


class ContinuousARConfig(LlamaConfig):
    model_type = "mmspec_continuous_ar"

    def __init__(self, latent_dim: int = 8, grid=(16, 16), cond_vocab_size: int = 16,
                 head: str = "mixture", num_components: int = 4, diffusion_steps: int = 25,
                 head_width: int = 128, head_depth: int = 2, min_log_scale: float = -7.0,
                 latent_mean: float = 0.0, latent_std: float = 1.0, **kwargs):
        if head not in HEADS:
            raise ValueError(f"head={head!r}: accepted one of {HEADS}")
        self.latent_dim, self.grid = int(latent_dim), list(grid)
        self.cond_vocab_size, self.head = int(cond_vocab_size), head
        self.num_components, self.diffusion_steps = int(num_components), int(diffusion_steps)
        self.head_width, self.head_depth = int(head_width), int(head_depth)
        self.min_log_scale = float(min_log_scale)
        self.latent_mean, self.latent_std = float(latent_mean), float(latent_std)
        kwargs["vocab_size"] = self.cond_vocab_size + 2
        super().__init__(**kwargs)

    @property
    def null_id(self) -> int:
        return self.cond_vocab_size

    @property
    def bos_id(self) -> int:
        return self.cond_vocab_size + 1

    @property
    def num_tokens(self) -> int:
        return int(self.grid[0] * self.grid[1])


# -- heads ------------------------------------------------------------------------------------
class MixtureHead(nn.Module):
    """hidden [..., H] -> GaussianMixture with batch shape [...] (GIVT)."""

    density_exact = True

    def __init__(self, cfg: ContinuousARConfig):
        super().__init__()
        m, d = cfg.num_components, cfg.latent_dim
        self.m, self.d, self.min_log_scale = m, d, cfg.min_log_scale
        self.net = nn.Sequential(nn.Linear(cfg.hidden_size, cfg.head_width), nn.SiLU(),
                                 nn.Linear(cfg.head_width, m * (1 + 2 * d)))

    def params(self, h: torch.Tensor):
        w = self.net[0].weight
        out = self.net(h.to(w.dtype)).float()        # densities in float32 whatever the weights' dtype
        logits, rest = out[..., : self.m], out[..., self.m:].unflatten(-1, (2, self.m, self.d))
        means, raw = rest.unbind(-3)
        # A smooth floor keeps every scale positive and trainable (a parameterisation of the
        # head's output, not a clamp of anything the user passes).
        log_scales = self.min_log_scale + F.softplus(raw - self.min_log_scale)
        return logits, means, log_scales

    def density(self, h: torch.Tensor, temperature: float = 1.0) -> GaussianMixture:
        logits, means, log_scales = self.params(h)
        return GaussianMixture(logits, means, log_scales + math.log(temperature))

    def loss(self, h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Mean negative log-likelihood per latent dimension (nats)."""
        logits, means, log_scales = self.params(h)
        nll = -GaussianMixture(logits, means, log_scales, validate=False).log_prob(x.float())
        return nll.mean() / self.d


def _timestep_embedding(t: torch.Tensor, dim: int = 64) -> torch.Tensor:
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=t.device) / half)
    a = t.float()[..., None] * freqs
    return torch.cat([torch.cos(a), torch.sin(a)], -1)


class _AdaBlock(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width, elementwise_affine=False, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(width, width), nn.SiLU(), nn.Linear(width, width))
        self.ada = nn.Sequential(nn.SiLU(), nn.Linear(width, 3 * width))
        nn.init.zeros_(self.ada[1].weight)
        nn.init.zeros_(self.ada[1].bias)

    def forward(self, x, c):
        shift, scale, gate = self.ada(c).chunk(3, -1)
        return x + gate * self.mlp(self.norm(x) * (1 + scale) + shift)


class DiffusionHead(nn.Module):
    """MAR's diffusion loss head, small: an MLP denoiser with adaLN blocks predicting
    v(x_t, t, z) (Salimans & Ho; MAR predicts eps over 1000 steps, v stays stable with the
    few steps a draft-verify loop can afford)."""

    density_exact = False

    def __init__(self, cfg: ContinuousARConfig):
        super().__init__()
        d, w, s = cfg.latent_dim, cfg.head_width, cfg.diffusion_steps
        self.d, self.steps = d, s
        self.inp = nn.Linear(d, w)
        self.time = nn.Sequential(nn.Linear(64, w), nn.SiLU(), nn.Linear(w, w))
        self.cond = nn.Linear(cfg.hidden_size, w)
        self.blocks = nn.ModuleList(_AdaBlock(w) for _ in range(cfg.head_depth))
        self.norm = nn.LayerNorm(w, elementwise_affine=False, eps=1e-6)
        self.out = nn.Linear(w, d)
        self._sched: dict = {}

    def schedule(self, device) -> tuple[torch.Tensor, torch.Tensor]:
        """Cosine schedule (Nichol & Dhariwal): abar[t], beta[t] for t = 0..S (beta[0] = 0)."""
        key = str(device)
        if key not in self._sched:
            s = self.steps
            f = torch.cos((torch.arange(s + 1, dtype=torch.float64) / s + 0.008) / 1.008
                          * math.pi / 2) ** 2
            beta = (1 - f[1:] / f[:-1]).clamp(max=0.999)
            abar = torch.cat([torch.ones(1, dtype=torch.float64), torch.cumprod(1 - beta, 0)])
            beta = torch.cat([beta.new_zeros(1), beta]).float()
            self._beta1 = float(beta[1])     # on the host: the density's scale needs no sync
            self._sched[key] = (abar.float().to(device), beta.to(device))
        return self._sched[key]

    def eps(self, x, t, z):
        """The network's prediction (v) in float32, whatever the weights' dtype."""
        dt = self.inp.weight.dtype
        c = F.silu(self.time(_timestep_embedding(t).to(dt)) + self.cond(z.to(dt)))
        h = self.inp(x.to(dt))
        for blk in self.blocks:
            h = blk(h, c)
        return self.out(self.norm(h)).float()

    def loss(self, h: torch.Tensor, x: torch.Tensor, generator=None) -> torch.Tensor:
        """v-prediction MSE (v = sqrt(abar) eps - sqrt(1 - abar) x0) at a uniform step t."""
        x = x.float().reshape(-1, self.d)
        z = h.float().reshape(-1, h.shape[-1])
        t = torch.randint(1, self.steps + 1, (x.shape[0],), device=x.device, generator=generator)
        noise = torch.randn(x.shape, device=x.device, generator=generator)
        abar, _ = self.schedule(x.device)
        a = abar[t][:, None]
        xt = a.sqrt() * x + (1 - a).sqrt() * noise
        v = a.sqrt() * noise - (1 - a).sqrt() * x
        return F.mse_loss(self.eps(xt, t, z), v)

    def density(self, h_c: torch.Tensor, noise: torch.Tensor, temperature: float = 1.0,
                h_u: torch.Tensor | None = None, guidance_scale: float | None = None) -> GaussianMixture:
        """h_c (and h_u) [..., H], noise [..., S, D] -> the last reverse step's Gaussian [...].

        Ancestral sampling with the posterior mean from the predicted x0 (v-prediction keeps
        every coefficient bounded, so few steps stay stable); noise[..., 0, :] is x_S and
        noise[..., i, :] the noise of step t = S - i + 1 -> t - 1."""
        shape = h_c.shape[:-1]
        z = h_c.float().reshape(-1, h_c.shape[-1])
        guided = guidance_scale is not None
        if guided:
            z = torch.cat([z, h_u.float().reshape(-1, h_u.shape[-1])], 0)
        n = z.shape[0] // (2 if guided else 1)
        e = noise.float().reshape(n, self.steps, self.d)
        abar, beta = self.schedule(z.device)
        x = e[:, 0]
        for i, t in enumerate(range(self.steps, 0, -1)):
            tt = torch.full((z.shape[0],), t, device=z.device, dtype=torch.long)
            v = self.eps(torch.cat([x, x], 0) if guided else x, tt, z)
            if guided:
                v = v[n:] + guidance_scale * (v[:n] - v[n:])
            ab, ab_prev, b = abar[t], abar[t - 1], beta[t]
            x0 = ab.sqrt() * x - (1 - ab).sqrt() * v
            mu = (ab_prev.sqrt() * b * x0 + (1 - b).sqrt() * (1 - ab_prev) * x) / (1 - ab)
            if t > 1:
                var = b * (1 - ab_prev) / (1 - ab)                      # posterior variance
                x = mu + temperature * var.sqrt() * e[:, i + 1]
        log_scale = torch.full_like(mu, 0.5 * math.log(self._beta1) + math.log(temperature))
        return GaussianMixture.gaussian(mu.reshape(*shape, self.d), log_scale.reshape(*shape, self.d))


# -- the model ----------------------------------------------------------------------------------
class ContinuousARModel(PreTrainedModel):
    """Decoder-only transformer over continuous latents with a density head.

    forward(input_ids=None, latents=None, bos_first=False, attention_mask, position_ids,
    past_key_values / cache, use_cache) -> BaseModelOutputWithPast (hidden states):
    ``input_ids`` [B, n] for conditioning tokens; ``latents`` [B, n, D] for image tokens, with
    ``bos_first`` replacing column 0 by the start-of-image embedding (the first step after the
    prompt). ``density(hidden, ...)`` turns hidden states into next-latent densities.
    """

    config_class = ContinuousARConfig
    base_model_prefix = "model"
    _supports_cache_class = True
    _no_split_modules = ["LlamaDecoderLayer"]

    def __init__(self, config: ContinuousARConfig):
        super().__init__(config)
        self.model = LlamaModel(config)
        self.latent_in = nn.Linear(config.latent_dim, config.hidden_size)
        self.head = MixtureHead(config) if config.head == "mixture" else DiffusionHead(config)
        self.post_init()

    @property
    def density_exact(self) -> bool:
        return self.head.density_exact

    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, _AdaBlock):
            nn.init.zeros_(module.ada[1].weight)
            nn.init.zeros_(module.ada[1].bias)

    def embed(self, input_ids=None, latents=None, bos_first=False) -> torch.Tensor:
        if latents is None:
            return self.model.embed_tokens(input_ids)
        dtype = self.latent_in.weight.dtype
        emb = self.latent_in(latents.to(dtype))
        if bos_first:
            bos = torch.full(latents.shape[:1], self.config.bos_id, device=latents.device)
            emb = torch.cat([self.model.embed_tokens(bos)[:, None].to(emb.dtype), emb[:, 1:]], 1)
        return emb

    def forward(self, input_ids=None, latents=None, bos_first: bool = False, attention_mask=None,
                position_ids=None, past_key_values=None, use_cache=None, **kwargs):
        if (input_ids is None) == (latents is None):
            raise ValueError("pass exactly one of input_ids (conditioning ids) and latents")
        cache = kwargs.pop("cache", past_key_values)
        return self.model(inputs_embeds=self.embed(input_ids, latents, bos_first),
                          attention_mask=attention_mask, position_ids=position_ids,
                          use_cache=use_cache, **{cache_argument(self.model): cache}, **kwargs)

    def training_loss(self, prompt_ids: torch.Tensor, latents: torch.Tensor,
                      prompt_mask: torch.Tensor | None = None, generator=None,
                      input_noise: float = 0.0) -> torch.Tensor:
        """Teacher forcing: prompt_ids [B, P] ending with bos_id (left-padded, ``prompt_mask``
        0 on padding, as the generator builds prompts), latents [B, L, D] (normalised) -> the
        head's loss on all L positions. ``input_noise`` > 0 adds Gaussian noise of that
        standard deviation to the latents the model reads (not to its targets): training
        against its own sampling noise, a remedy for exposure bias."""
        p = prompt_ids.shape[1]
        inp = latents[:, :-1]
        if input_noise:
            inp = inp + input_noise * torch.randn(inp.shape, device=inp.device, dtype=inp.dtype,
                                                  generator=generator)
        emb = torch.cat([self.embed(prompt_ids), self.embed(latents=inp)], 1)
        kw = {}
        if prompt_mask is not None:
            mask = torch.cat([prompt_mask.long(), prompt_mask.new_ones(latents.shape[0],
                                                                      latents.shape[1] - 1).long()], 1)
            kw = dict(attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0))
        h = self.model(inputs_embeds=emb, **kw).last_hidden_state[:, p - 1:]
        if isinstance(self.head, DiffusionHead):
            return self.head.loss(h, latents, generator)
        return self.head.loss(h, latents)


def prompt_rows(rows: list[list[int]], cfg: ContinuousARConfig, drop: torch.Tensor | None = None,
                width: int | None = None):
    """(ids, mask) [N, W]: ``[cond ids..., bos]`` left-padded (mask 0, null ids); a dropped
    row (``drop`` [N] bool) has null ids in place of its condition: the unconditional prompt
    of guidance and of caption dropout in training."""
    width = width or max(len(r) for r in rows) + 1
    ids = torch.full((len(rows), width), cfg.null_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        if drop is None or not bool(drop[i]):
            ids[i, width - 1 - len(r): width - 1] = torch.tensor(r, dtype=torch.long)
        mask[i, width - 1 - len(r):] = 1
    ids[:, -1] = cfg.bos_id
    return ids, mask


# -- the session the loop drives ----------------------------------------------------------------
class ContinuousSession(CausalLMSession):
    """A ``CausalLMSession`` whose step returns densities [B, n] over latents (vectors in,
    densities out; the first step after the prompt feeds the start-of-image embedding).

    temperature: > 0. guidance_scale: diffusion heads only. noise: the diffusion head's noise
    bank [B, L, S, D] (the same tensor for draft and target: trajectory alignment).
    """

    def __init__(self, model, temperature: float, guidance_scale=None, noise=None):
        super().__init__(model, SamplingParams(temperature=1.0), guidance_scale)
        self.temperature, self.noise = temperature, noise

    def prefill(self, input_ids, attention_mask, uncond_ids=None, uncond_mask=None):
        super().prefill(input_ids, attention_mask, uncond_ids, uncond_mask)
        self._uncond_last = None          # both branches start with bos_id: rows are duplicated

    def embed(self, tokens, first_step=False):
        return {"latents": tokens, "bos_first": first_step}

    def logits(self, out):
        return out.last_hidden_state

    def distributions(self, h, gen_index):
        """Hidden states [R, n, H] -> next-latent densities [B, n]."""
        head = self.model.head
        if isinstance(head, MixtureHead):
            return head.density(h, self.temperature)
        b = self.batch_size
        # Rows that already finished ride along past the last index; their output is never
        # read, so they reuse the last block of noise.
        idx = gen_index.clamp(max=self.noise.shape[1] - 1)
        noise = self.noise[torch.arange(b, device=idx.device)[:, None], idx]
        return head.density(h[:b], noise, self.temperature, h[b:] if self.guided else None,
                            self.guidance_scale)


# -- the user API ---------------------------------------------------------------------------------
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
        unknown = [w for w in text.split() if w not in self.index]
        if unknown:
            raise ValueError(f"prompt words outside the model's vocabulary: {unknown}; accepted "
                             f"words: {' '.join(self.words)}")
        return [self.index[w] for w in text.split()]


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
            target = ContinuousARModel.from_pretrained(target, dtype=torch.float32)
        if isinstance(draft, (str, os.PathLike)):
            draft = ContinuousARModel.from_pretrained(draft, dtype=torch.float32)
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
    def from_pretrained(cls, target, draft=None, **load_kwargs) -> "ContinuousImageGenerator":
        """Folders written by ``recipes.train.continuous`` (or any ContinuousARModel folder).

        A ``mmspec_continuous.json`` next to the weights names the decoder (a diffusers
        VQModel or AutoencoderKL folder, relative to the model's) and the caption words of a
        text-conditional model; without it, no decoder and no tokenizer are attached."""
        load_kwargs.setdefault("dtype", torch.float32)
        t = ContinuousARModel.from_pretrained(target, **load_kwargs)
        d = None if draft is None else ContinuousARModel.from_pretrained(draft, **load_kwargs)
        decoder = tokenizer = None
        meta_path = os.path.join(str(target), "mmspec_continuous.json")
        if os.path.exists(meta_path):
            with open(meta_path) as f:
                meta = json.load(f)
            if meta.get("decoder"):
                import diffusers

                dpath = os.path.normpath(os.path.join(str(target), meta["decoder"]))
                kind = getattr(diffusers, meta.get("decoder_class", "VQModel"))
                decoder = kind.from_pretrained(dpath, torch_dtype=torch.float32).eval()
            if meta.get("words"):
                tokenizer = WordIds(meta["words"])
        return cls(t, d, decoder=decoder, tokenizer=tokenizer)

    def to(self, device) -> "ContinuousImageGenerator":
        for m in (self.target, self.draft, self.decoder):
            if m is not None:
                m.to(device)
        return self

    @property
    def device(self) -> torch.device:
        return next(self.target.parameters()).device

    def _prompts(self, class_labels, prompts, prompt_ids) -> list[list[int]]:
        given = [x is not None for x in (class_labels, prompts, prompt_ids)]
        if sum(given) != 1:
            raise ValueError("pass exactly one of class_labels, prompts (text) and prompt_ids")
        cv = self.target.config.cond_vocab_size
        if class_labels is not None:
            rows = [[int(c)] for c in (class_labels if isinstance(class_labels, (list, tuple))
                                       else [class_labels])]
        elif prompts is not None:
            if self.tokenizer is None:
                raise ValueError("text prompts need a tokenizer (ContinuousImageGenerator("
                                 "tokenizer=...)); or pass prompt_ids")
            rows = [list(self.tokenizer.encode(t)) for t in ([prompts] if isinstance(prompts, str)
                                                               else prompts)]
        else:
            rows = [list(map(int, r)) for r in prompt_ids]
        if not rows or any(len(r) == 0 for r in rows):
            raise ValueError("empty prompt: accepted at least one conditioning id per image")
        for r in rows:
            if min(r) < 0 or max(r) >= cv:
                raise ValueError(f"conditioning ids must be in [0, {cv - 1}] (class labels or "
                                 f"text ids), got {r}")
        return rows

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
        from mmspec.acceptance.continuous import ContinuousExact
        from mmspec.drafters import ModelDrafter, NoDraft, Prefilled
        from mmspec.loop import stream
        from mmspec.sampling import make_generator
        from mmspec.types import StepStats

        cfg = self.target.config
        rows = self._prompts(class_labels, prompts, prompt_ids)
        if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature > 0):
            raise ValueError(f"temperature={temperature!r}: accepted a finite float > 0 (continuous "
                             "tokens are sampled from densities; there is no greedy mode)")
        if not (isinstance(prefill_fraction, (int, float)) and 0 <= prefill_fraction <= 1):
            raise ValueError(f"prefill_fraction={prefill_fraction!r}: accepted a float in [0, 1]")
        spec = use_draft and self.draft is not None
        if spec and (not isinstance(num_draft_tokens, int) or num_draft_tokens < 1):
            raise ValueError(f"num_draft_tokens={num_draft_tokens!r}: accepted an integer >= 1")
        models = [self.target] + ([self.draft] if spec else [])
        if guidance_scale is not None:
            if not (isinstance(guidance_scale, (int, float)) and math.isfinite(guidance_scale)
                    and guidance_scale >= 0):
                raise ValueError(f"guidance_scale={guidance_scale!r}: accepted a finite float >= 0")
            for m in models:
                if m.config.head != "diffusion":
                    raise ValueError("guidance_scale needs diffusion heads (a guided mixture is not "
                                     "a mixture): accepted guidance_scale=None for head='mixture'")
        rule = ContinuousExact(max_proposals=max_proposals) if rule is None else rule
        dev = self.device
        b, n_tok = len(rows), cfg.num_tokens
        ids, mask = (t.to(dev) for t in prompt_rows(rows, cfg))
        prompt = {}
        if guidance_scale is not None:
            un, _ = prompt_rows(rows, cfg, drop=torch.ones(b, dtype=torch.bool))
            prompt = dict(uncond_ids=un.to(dev), uncond_mask=mask.clone())
        gen = make_generator(seed, dev)

        def bank(model):
            if model.config.head != "diffusion":
                return None
            s, d = model.config.diffusion_steps, model.config.latent_dim
            return torch.randn((b, n_tok, s, d), generator=gen, device=dev)

        noise_t = bank(self.target)
        tgt = ContinuousSession(self.target, temperature, guidance_scale, noise_t)
        if spec:
            dc = self.draft.config
            aligned = (trajectory_alignment and cfg.head == dc.head == "diffusion"
                       and cfg.diffusion_steps == dc.diffusion_steps)
            if trajectory_alignment and cfg.head == dc.head == "diffusion" and not aligned:
                raise ValueError(f"trajectory_alignment=True needs one diffusion schedule: target "
                                 f"diffusion_steps={cfg.diffusion_steps}, draft "
                                 f"{dc.diffusion_steps}; accepted equal steps or "
                                 "trajectory_alignment=False")
            noise_d = noise_t if aligned else bank(self.draft)
            drafter = ModelDrafter(ContinuousSession(self.draft, temperature, guidance_scale,
                                                     noise_d), num_draft_tokens, gen)
        else:
            drafter = NoDraft()
        m = int(round(prefill_fraction * n_tok))
        if m:
            drafter = Prefilled(drafter, m)
        stats = StepStats()
        t0 = time.perf_counter()
        tgt.prefill(ids, mask, **prompt)
        drafter.begin(ids, mask, **prompt)
        stats.seconds_prefill = time.perf_counter() - t0
        first = torch.zeros((b, cfg.latent_dim), device=dev)
        out = [[] for _ in range(b)]
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=b * n_tok, desc="latents", unit="tok")
        for ev in stream(tgt, drafter, rule, first, max_new_tokens=n_tok, generator=gen,
                         stats=stats):
            for i, new in enumerate(ev.new_tokens):
                out[i].extend(new)
            if bar is not None:
                bar.update(sum(len(x) for x in ev.new_tokens))
        if bar is not None:
            bar.close()
        z = torch.tensor(out, dtype=torch.float32) * cfg.latent_std + cfg.latent_mean
        stats.extra.setdefault("rejections", 0)
        stats.extra.setdefault("residual_proposals", 0)
        stats.extra.setdefault("residual_fallbacks", 0)
        stats.extra["density_exact"] = all(mm.density_exact for mm in models)
        images = self.decode(z) if (decode and self.decoder is not None) else None
        return ContinuousImageOutput(latents=z, images=images, stats=stats)

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> list:
        """latents [B, L, D] -> PIL images through the attached decoder."""
        from .pipeline import to_pil

        h, w = self.target.config.grid
        dec = self.decoder
        ddev = next(dec.parameters()).device
        z = latents.to(ddev).reshape(latents.shape[0], h, w, -1).permute(0, 3, 1, 2)
        if hasattr(dec, "quantize"):        # VQModel: decode the pre-quantisation latents
            img = dec.decode(z, force_not_quantize=True, return_dict=False)[0]
        else:                               # AutoencoderKL
            img = dec.decode(z, return_dict=False)[0]
        return to_pil((img.float() + 1) / 2)
