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

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaModel, PreTrainedModel

from mmspec.cache import cache_argument
from mmspec.densities import GaussianMixture

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
        """The unconditional (null) prompt id, after the condition vocabulary."""
        return self.cond_vocab_size

    @property
    def bos_id(self) -> int:
        """The id that starts the image span."""
        return self.cond_vocab_size + 1

    @property
    def num_tokens(self) -> int:
        """Continuous tokens per image: rows x cols of the grid."""
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
        """(logits, means, log-scales) of the Gaussian mixture for hidden states h [..., H], in
        float32."""
        w = self.net[0].weight
        out = self.net(h.to(w.dtype)).float()        # densities in float32 whatever the weights' dtype
        logits, rest = out[..., : self.m], out[..., self.m:].unflatten(-1, (2, self.m, self.d))
        means, raw = rest.unbind(-3)
        # A smooth floor keeps every scale positive and trainable (a parameterisation of the
        # head's output, not a clamp of anything the user passes).
        log_scales = self.min_log_scale + F.softplus(raw - self.min_log_scale)
        return logits, means, log_scales

    def density(self, h: torch.Tensor, temperature: float = 1.0) -> GaussianMixture:
        """The mixture density for hidden states h at ``temperature`` (scales multiplied by it)."""
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
        """The head gives exact densities (a mixture) rather than a bound (a diffusion head's last
        step)."""
        return self.head.density_exact

    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, _AdaBlock):
            nn.init.zeros_(module.ada[1].weight)
            nn.init.zeros_(module.ada[1].bias)

    def embed(self, input_ids=None, latents=None, bos_first=False) -> torch.Tensor:
        """Input embeddings: condition ids through the token table, or continuous latents [B, n, D]
        through the latent projection (``bos_first``: the span's start embedding first)."""
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
