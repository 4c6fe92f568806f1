"""Speech data for the bundled TTS models: shapes-world sentences spoken by espeak-ng.

    python -m recipes.train.speech_data --n 8000 --out data/speech --codec samples/models/shapes-codec

Sentences (one-object captions and short statements about scenes) are spoken by espeak-ng
(the Debian package; ``make`` installs it) in three voices ("us", "gb", "sc": the speaker tag
the models read before the text) at two speeds, resampled to 16 kHz. The mel residual-VQ
codec (modalities/speech/codec.py) is fitted on them (k-means, 4 codebooks x 256) and every
utterance is encoded. Writes the codec folder (with its card and reconstruction MCD) and a
dataset file of texts and codes (data/, not committed: the training recipe reads it; the GPU
machine cannot run espeak-ng, so the codes travel instead of the audio).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import shutil
import subprocess
import time
from multiprocessing import Pool

import numpy as np
import torch

from modalities import shapes_world as sw

VOICES = {"us": "en-us", "gb": "en-gb", "sc": "en-gb-scotland"}
SPEEDS = (150, 180)
SAMPLE_RATE = 16000
ALPHABET = "abcdefghijklmnopqrstuvwxyz ."
HELD_OUT = 10_000_000


def sentence(rng: random.Random) -> str:
    o = sw.Obj(rng.randrange(9), rng.choice(sw.SHAPES), rng.choice(list(sw.COLOURS)),
               rng.choice(list(sw.SIZES)))
    kind = rng.random()
    if kind < 0.6:
        return o.phrase()
    if kind < 0.8:
        return f"the {o.shape} is {o.colour}"
    return f"there is a {o.colour} {o.shape}"


def need_espeak() -> str:
    exe = shutil.which("espeak-ng")
    if exe is None:
        raise RuntimeError("espeak-ng is not installed: run `make speech-deps` (apt-get install "
                           "-y espeak-ng)")
    return exe


def speak(text: str, voice: str, speed: int) -> np.ndarray:
    """espeak-ng -> float32 mono at 16 kHz."""
    import soundfile as sf
    import torchaudio

    raw = subprocess.run([need_espeak(), "-v", VOICES[voice], "-s", str(speed), "--stdout", text],
                         capture_output=True, check=True).stdout
    wave, sr = sf.read(io.BytesIO(raw), dtype="float32")
    w = torch.from_numpy(wave)
    if sr != SAMPLE_RATE:
        w = torchaudio.functional.resample(w, sr, SAMPLE_RATE)
    return w.numpy()


def utterance(seed: int):
    rng = random.Random(seed)
    text = sentence(rng)
    voice = rng.choice(list(VOICES))
    speed = rng.choice(SPEEDS)
    return f"{voice} {text}", speak(text, voice, speed)


def reference(text_with_tag: str, speed: int = SPEEDS[0]) -> np.ndarray:
    """The espeak-ng rendering of a tagged text (the MCD reference)."""
    voice, text = text_with_tag.split(" ", 1)
    return speak(text, voice, speed)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=8000)
    ap.add_argument("--out", default="data/speech")
    ap.add_argument("--codec", default="samples/models/shapes-codec")
    ap.add_argument("--codebooks", type=int, default=4)
    ap.add_argument("--size", type=int, default=256)
    args = ap.parse_args(argv)
    from modalities.speech.metrics import mel_cepstral_distortion
    from modalities.speech.codec import MelRVQCodec, fit_rvq
    from recipes.train.data import write_card

    need_espeak()
    t0 = time.time()
    with Pool(os.cpu_count() or 1) as pool:
        utts = pool.map(utterance, range(args.n), chunksize=32)
    print(f"{len(utts)} utterances in {time.time() - t0:.0f} s", flush=True)
    proto = MelRVQCodec(torch.zeros(1, 1, 80), torch.zeros(80), torch.ones(80))
    mels = [proto.mel(w) for _, w in utts]                      # unnormalised (mean 0, std 1)
    allm = torch.cat(mels)
    mean, std = allm.mean(0), allm.std(0).clamp_min(1e-3)
    sub = allm[torch.randperm(len(allm), generator=torch.Generator().manual_seed(0))[:200000]]
    books = fit_rvq((sub - mean) / std, args.codebooks, args.size)
    codec = MelRVQCodec(books, mean, std)
    codes = [codec.encode(w).to(torch.uint8).numpy() for _, w in utts]
    # reconstruction quality on 20 held-out utterances
    held = [utterance(HELD_OUT + i) for i in range(20)]
    mcd = [mel_cepstral_distortion(codec.decode(codec.encode(w)[None])[0], w) for _, w in held]
    codec.save(args.codec)
    frames = np.array([len(c) for c in codes])
    info = dict(utterances=args.n, codebooks=args.codebooks, size=args.size,
                frames_mean=float(frames.mean()), frames_max=int(frames.max()),
                reconstruction_mcd_db=float(np.mean(mcd)), seconds=round(time.time() - t0, 1))
    with open(os.path.join(args.codec, "metrics.json"), "w") as f:
        json.dump(info, f, indent=1)
    write_card(args.codec, "shapes-codec: mel residual-VQ speech codec", {
        "architecture": f"log-mel (16 kHz, n_fft 1024, hop 256, 80 bins) -> residual VQ of "
                        f"{args.codebooks} codebooks x {args.size} (k-means); decoder: codeword sum "
                        "-> InverseMelScale -> Griffin-Lim (torchaudio); 62.5 frames per second",
        "data": f"{args.n} sentences spoken by espeak-ng (voices {', '.join(VOICES.values())}; "
                f"speeds {SPEEDS} wpm)",
        "quality": f"reconstruction mel cepstral distortion (DTW) {info['reconstruction_mcd_db']:.2f} dB "
                   "on 20 held-out utterances",
        "trained by": f"`python -m recipes.train.speech_data --n {args.n}` ({info['seconds']} s on CPU)",
    })
    os.makedirs(args.out, exist_ok=True)
    np.savez_compressed(os.path.join(args.out, "speech.npz"),
                        texts=np.array([t for t, _ in utts]),
                        lengths=frames, codes=np.concatenate(codes))
    print(json.dumps(info), flush=True)


if __name__ == "__main__":
    main()
