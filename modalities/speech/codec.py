"""Codecs: codec frames [B, N, C] <-> audio.

Every codec has ``decode(frames [B, N, C]) -> [B, samples]``, ``sample_rate`` and
``codebook_size``.

- ``EncodecCodec``: transformers' EncodecModel (MusicGen's audio encoder).
- ``TransformersCodec``: transformers' DacModel, MimiModel (CSM's codec) and Xcodec2Model
  (Llasa's); ``codec_for`` picks the wrapper for a codec model.
- ``MelRVQCodec``: the bundled codec trained here: log-mel frames (16 kHz, hop 256, 80
  bins) quantised by a residual VQ of C codebooks fitted with k-means on spoken shapes-world
  captions; decoding sums the codewords back to a log-mel frame and inverts it with
  torchaudio's InverseMelScale and Griffin-Lim. No neural vocoder, so it is small, exact to
  reproduce, and its quality is what Griffin-Lim gives (reconstruction MCD in its card).
"""

from __future__ import annotations

import json
import os

import numpy as np
import torch
from safetensors.torch import load_file, save_file


class MelRVQCodec:
    def __init__(self, codebooks: torch.Tensor, mean: torch.Tensor, std: torch.Tensor,
                 sample_rate: int = 16000, n_fft: int = 1024, hop: int = 256, n_mels: int = 80,
                 griffin_lim_iters: int = 32):
        self.codebooks = codebooks            # [C, K, n_mels] in normalised log-mel units
        self.mean, self.std = mean, std       # [n_mels]
        self.sample_rate, self.n_fft, self.hop, self.n_mels = sample_rate, n_fft, hop, n_mels
        self.iters = griffin_lim_iters
        self.codebook_size = int(codebooks.shape[1])
        self.num_codebooks = int(codebooks.shape[0])
        self._inv = None

    # -- analysis ------------------------------------------------------------------------------
    def mel(self, wave) -> torch.Tensor:
        """[samples] -> [frames, n_mels] normalised log-mel."""
        import torchaudio

        m = torchaudio.transforms.MelSpectrogram(sample_rate=self.sample_rate, n_fft=self.n_fft,
                                                 hop_length=self.hop, n_mels=self.n_mels, power=1.0)
        x = m(torch.as_tensor(np.asarray(wave, np.float32)))
        return ((torch.log(x.clamp_min(1e-5)).T - self.mean) / self.std)

    def encode(self, wave) -> torch.Tensor:
        """[samples] -> [frames, C] codes (greedy residual quantisation)."""
        r = self.mel(wave).to(self.codebooks.device)
        codes = []
        for cb in self.codebooks:
            idx = torch.cdist(r, cb).argmin(-1)
            codes.append(idx)
            r = r - cb[idx]
        return torch.stack(codes, -1)

    # -- synthesis -----------------------------------------------------------------------------
    def frames_to_mel(self, frames: torch.Tensor) -> torch.Tensor:
        """[N, C] codes -> [N, n_mels] normalised log-mel."""
        out = 0
        for c in range(frames.shape[-1]):
            out = out + self.codebooks[c][frames[:, c].long()]
        return out

    def decode(self, frames: torch.Tensor) -> np.ndarray:
        """[B, N, C] -> [B, N * hop] float32 waveforms (Griffin-Lim)."""
        import torchaudio

        if self._inv is None:
            self._inv = (torchaudio.transforms.InverseMelScale(n_stft=self.n_fft // 2 + 1,
                                                               n_mels=self.n_mels,
                                                               sample_rate=self.sample_rate),
                         torchaudio.transforms.GriffinLim(n_fft=self.n_fft, hop_length=self.hop,
                                                          power=1.0, n_iter=self.iters))
        inv, gl = self._inv
        waves = []
        g = torch.Generator().manual_seed(0)    # Griffin-Lim's random phase, fixed
        for f in frames.cpu():
            logmel = self.frames_to_mel(f.to(self.codebooks.device)).cpu() * self.std + self.mean
            spec = inv(torch.exp(logmel).T)
            torch.manual_seed(int(torch.randint(1 << 30, (1,), generator=g)))
            w = gl(spec)
            n = f.shape[0] * self.hop
            w = torch.nn.functional.pad(w, (0, max(0, n - w.numel())))[:n]
            waves.append(w.numpy().astype(np.float32))
        return np.stack(waves) if waves else np.zeros((0, 0), np.float32)

    def to(self, device):
        self.codebooks = self.codebooks.to(device)
        self.mean, self.std = self.mean.to(device), self.std.to(device)
        return self

    # -- files ---------------------------------------------------------------------------------
    def save(self, folder: str, card: dict | None = None) -> None:
        os.makedirs(folder, exist_ok=True)
        save_file({"codebooks": self.codebooks.cpu().contiguous(), "mean": self.mean.cpu(),
                   "std": self.std.cpu()}, os.path.join(folder, "codec.safetensors"))
        cfg = dict(type="mel-rvq", sample_rate=self.sample_rate, n_fft=self.n_fft, hop=self.hop,
                   n_mels=self.n_mels, griffin_lim_iters=self.iters)
        with open(os.path.join(folder, "mmspec_codec.json"), "w") as f:
            json.dump(cfg, f, indent=1)

    @classmethod
    def load(cls, folder: str) -> "MelRVQCodec":
        with open(os.path.join(folder, "mmspec_codec.json")) as f:
            cfg = json.load(f)
        t = load_file(os.path.join(folder, "codec.safetensors"))
        return cls(t["codebooks"], t["mean"], t["std"], cfg["sample_rate"], cfg["n_fft"],
                   cfg["hop"], cfg["n_mels"], cfg["griffin_lim_iters"])


def fit_rvq(mels: torch.Tensor, codebooks: int, size: int, iters: int = 20, seed: int = 0):
    """Residual k-means: [N, d] normalised frames -> [C, size, d] codebooks."""
    g = torch.Generator(device=mels.device).manual_seed(seed)
    r = mels.clone()
    books = []
    for _ in range(codebooks):
        cb = r[torch.randperm(len(r), generator=g, device=r.device)[:size]].clone()
        for _ in range(iters):
            idx = torch.cdist(r, cb).argmin(-1)
            sums = torch.zeros_like(cb).index_add_(0, idx, r)
            counts = torch.bincount(idx, minlength=size).float()[:, None]
            dead = counts[:, 0] == 0
            cb = torch.where(dead[:, None], r[torch.randint(len(r), (size,), generator=g,
                                                            device=r.device)], sums / counts.clamp_min(1))
        idx = torch.cdist(r, cb).argmin(-1)
        r = r - cb[idx]
        books.append(cb)
    return torch.stack(books)


def load_codec(folder: str):
    if os.path.isfile(os.path.join(folder, "mmspec_codec.json")):
        return MelRVQCodec.load(folder)
    from transformers import EncodecModel

    return EncodecCodec(EncodecModel.from_pretrained(folder).eval())


class EncodecCodec:
    """transformers' EncodecModel behind the codec surface (e.g. MusicGen's audio encoder)."""

    def __init__(self, model):
        self.model = model
        self.sample_rate = int(model.config.sampling_rate)
        self.codebook_size = int(model.config.codebook_size)

    def to(self, device):
        """Move the codec model; returns the codec."""
        self.model.to(device)
        return self

    def decode(self, frames: torch.Tensor) -> np.ndarray:
        """Frames [B, N, C] of codes -> audio [B, samples] (float32)."""
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
        """Move the codec model; returns the codec."""
        self.model.to(device)
        return self

    @torch.no_grad()
    def decode(self, frames: torch.Tensor) -> np.ndarray:
        """Frames [B, N, C] of codes -> audio [B, samples] (float32)."""
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
