"""Audio outputs and what people look at instead of listening: WAV files (soundfile) and
mel spectrograms (matplotlib)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch

from mmspec.types import StepStats


@dataclass
class AudioOutput:
    """waveforms: one float32 array per text; codes: [frames, C] per text; stats."""

    waveforms: list
    sample_rate: int
    codes: list
    stats: StepStats
    seconds: float

    @property
    def audio(self) -> list:
        """The waveforms (diffusers' and transformers' name)."""
        return self.waveforms

    @property
    def sampling_rate(self) -> int:
        """The sample rate (transformers' name)."""
        return self.sample_rate

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
    """Write the log-mel spectrogram of ``wave`` to ``path`` (PNG); returns the path."""
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
