"""Train the bundled TTS models: MusicGen-layout delay-pattern decoders over the shapes codec.

    python -m recipes.train.speech_data --n 8000          # once, on a machine with espeak-ng
    python -m recipes.train.tts --size target --time-budget 300
    python -m recipes.train.tts --size draft --time-budget 200

MusicgenForConditionalGeneration (the transformers class): a character-level T5 encoder reads
"<speaker tag> <sentence>", a decoder predicts 4 codebooks of samples/models/shapes-codec in
the delay pattern (codebook c lags c steps), with an end-of-speech id so the model decides
the duration. Trained with teacher forcing from data/speech/speech.npz. Writes bf16
safetensors, config and mmspec_speech.json (codec folder, alphabet, token ids, defaults); the
model card's quality figures (MCD against espeak-ng, duration ratio) come from
``python -m recipes.train.tts --evaluate``, run where espeak-ng is installed.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import torch
import torch.nn.functional as F

from recipes.train.data import load_in_float32, count_params, device, fit, write_card
from recipes.train.speech_data import ALPHABET

CODES, PAD, EOS = 256, 256, 257
SIZES = {"target": dict(hidden=256, layers=5, heads=8, ffn=1024, enc=128, enc_layers=2),
         "draft": dict(hidden=96, layers=2, heads=4, ffn=384, enc=64, enc_layers=1)}


def build(size: str, codebooks: int = 4):
    from transformers import MusicgenConfig, MusicgenForConditionalGeneration

    s = SIZES[size]
    t5 = dict(model_type="t5", vocab_size=len(ALPHABET) + 1, d_model=s["enc"], d_kv=s["enc"] // 4,
              d_ff=2 * s["enc"], num_layers=s["enc_layers"], num_heads=4, decoder_start_token_id=0,
              pad_token_id=0)
    enc = dict(model_type="encodec", target_bandwidths=[1.5], sampling_rate=16000,
               audio_channels=1, num_filters=4, num_residual_layers=1, upsampling_ratios=[2],
               hidden_size=8, codebook_size=8, codebook_dim=8, num_lstm_layers=1)
    dec = dict(model_type="musicgen_decoder", vocab_size=CODES + 2, max_position_embeddings=512,
               num_hidden_layers=s["layers"], ffn_dim=s["ffn"], num_attention_heads=s["heads"],
               hidden_size=s["hidden"], num_codebooks=codebooks, pad_token_id=PAD,
               bos_token_id=PAD, decoder_start_token_id=PAD)
    model = MusicgenForConditionalGeneration(MusicgenConfig(text_encoder=t5, audio_encoder=enc,
                                                            decoder=dec))
    model.generation_config.decoder_start_token_id = PAD
    return model


def delayed(frames: np.ndarray, c: int) -> np.ndarray:
    """[N, C] frames -> [N + C, C] delayed targets with pad before and EOS after each codebook."""
    n = len(frames)
    y = np.full((n + c, c), EOS, dtype=np.int64)
    for k in range(c):
        y[:k, k] = PAD
        y[k:k + n, k] = frames[:, k]
    return y


def load(path: str):
    d = np.load(path)
    codes, lengths = d["codes"], d["lengths"]          # read each array once
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    frames = [codes[s:s + n] for s, n in zip(starts, lengths)]
    return [str(t) for t in d["texts"]], frames


def encode_texts(texts, dev):
    from modalities.speech.bundled import CharTokenizer

    tok = CharTokenizer(ALPHABET, 1)
    from modalities.padding import pad_rows

    return pad_rows([tok.encode(t) for t in texts], 0, "right", dev)


def batch_tensors(frames_list, c, dev):
    ys = [delayed(f.astype(np.int64), c) for f in frames_list]
    t = max(len(y) for y in ys)
    tgt = torch.full((len(ys), t, c), -100, dtype=torch.long)
    inp = torch.full((len(ys), t, c), PAD, dtype=torch.long)
    mask = torch.zeros(len(ys), t, dtype=torch.long)
    for i, y in enumerate(ys):
        yt = torch.from_numpy(y)
        tgt[i, : len(y)] = yt
        inp[i, 1: len(y)] = yt[:-1]
        mask[i, : len(y)] = 1
    return inp.to(dev), tgt.to(dev), mask.to(dev)


def train(args):
    dev = device()
    torch.manual_seed(0)
    texts, frames = load(os.path.join(args.data, "speech.npz"))
    c = frames[0].shape[1]
    model = build(args.size, c).to(dev)
    rng = np.random.default_rng(0)
    t0 = time.time()

    def step_loss():
        idx = rng.integers(0, len(texts), args.batch)
        ids, mask = encode_texts([texts[i] for i in idx], dev)
        inp, tgt, dmask = batch_tensors([frames[i] for i in idx], c, dev)
        b, t, _ = inp.shape
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            logits = model(input_ids=ids, attention_mask=mask,
                           decoder_input_ids=inp.permute(0, 2, 1).reshape(b * c, t),
                           decoder_attention_mask=dmask).logits
        logits = logits.float().view(b, c, t, -1).permute(0, 2, 1, 3)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), ignore_index=-100)

    steps, loss = fit(model, step_loss, args.steps, args.lr, args.time_budget, f"tts {args.size}")
    out_dir = args.out
    model.to(torch.bfloat16).save_pretrained(out_dir, safe_serialization=True)
    load_in_float32(out_dir)
    meta = dict(codec=args.codec_ref,
                alphabet=ALPHABET, char_offset=1, pad_id=PAD, eos_id=EOS,
                max_frames=int(max(len(f) for f in frames) * 1.5),
                defaults={"guidance_scale": args.guidance, "description": "us"})
    with open(os.path.join(out_dir, "mmspec_speech.json"), "w") as f:
        json.dump(meta, f, indent=1)
    metrics = dict(size=args.size, params=count_params(model), steps=steps, batch=args.batch,
                   final_loss=float(loss.detach()), train_seconds=round(time.time() - t0, 1))
    with open(os.path.join(out_dir, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=1)
    write_card(out_dir, f"{os.path.basename(os.path.normpath(out_dir))}: text-to-speech "
               f"{args.size}", card_fields(metrics))
    print(json.dumps(metrics), flush=True)


def card_fields(metrics: dict) -> dict:
    """The card's training fields (``evaluate`` adds the quality line)."""
    s = SIZES[metrics["size"]]
    return {
        "architecture": f"MusicgenForConditionalGeneration: character T5 encoder ({s['enc_layers']} "
                        f"layers, d {s['enc']}) + decoder ({s['layers']} layers, hidden {s['hidden']}) "
                        "over 4 codebooks of shapes-codec in the delay pattern, end-of-speech id 257",
        "parameters": f"{metrics['params']:,} (stored in bfloat16)",
        "data": "espeak-ng speech of shapes-world sentences (data/speech, recipes/train/speech_data.py)",
        "steps": f"{metrics['steps']} at batch {metrics['batch']}",
        "final loss": f"{metrics['final_loss']:.4f}",
        "trained by": f"`python -m recipes.train.tts --size {metrics['size']} --steps {metrics['steps']}` "
                      f"({metrics['train_seconds']} s)",
    }


def evaluate(args):
    """MCD (DTW) against espeak-ng and duration ratio on held-out sentences; updates the card."""
    import random

    from modalities.speech.metrics import mel_cepstral_distortion
    from modalities.speech import TextToSpeech
    from recipes.train.speech_data import HELD_OUT, reference, sentence

    tts = TextToSpeech.from_pretrained(args.out, draft=args.draft_dir)
    sents = [sentence(random.Random(HELD_OUT + i)) for i in range(args.eval)]
    refs = [reference(f"us {s}") for s in sents]
    rows = {}
    for method in (["plain"] + (["exact"] if args.draft_dir else []) + ["sjd-maximal+pcg"] * 0):
        out = tts(sents, method=method, seed=0, progress=False)    # the card's speaker tag: "us"
        mcd = [mel_cepstral_distortion(w, r) for w, r in zip(out.waveforms, refs)]
        dur = [len(w) / max(len(r), 1) for w, r in zip(out.waveforms, refs)]
        rows[method] = dict(mcd_db=float(np.mean(mcd)), duration_ratio_median=float(np.median(dur)),
                            within_20pct=float(np.mean([abs(d - 1) <= 0.2 for d in dur])),
                            acceptance=out.stats.acceptance_rate,
                            frames_per_step=out.stats.tokens_per_step, seconds=out.seconds)
    with open(os.path.join(args.out, "metrics.json")) as f:
        metrics = json.load(f)
    metrics["evaluation"] = rows
    with open(os.path.join(args.out, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=1)
    p = rows["plain"]
    fields = card_fields(metrics)
    fields["trained by"] += "; evaluated by `python -m recipes.train.tts --evaluate`"
    fields["quality"] = (f"{args.eval} held-out sentences, voice 'us', plain sampling: MCD (DTW) "
                         f"{p['mcd_db']:.2f} dB against espeak-ng, duration ratio median "
                         f"{p['duration_ratio_median']:.2f}, {100 * p['within_20pct']:.0f}% within 20%"
                         + "".join(f"; {m}: MCD {r['mcd_db']:.2f} dB, acceptance {r['acceptance']:.3f}, "
                                   f"{r['frames_per_step']:.2f} frames/step"
                                   for m, r in rows.items() if m != "plain"))
    write_card(args.out, f"{os.path.basename(os.path.normpath(args.out))}: text-to-speech {metrics['size']}",
               fields)
    print(json.dumps(rows), flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=list(SIZES), default="target")
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--time-budget", type=float, default=1e9,
                    help="seconds: training stops early past it (the card gives the steps run)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--guidance", type=float, default=1.0)
    ap.add_argument("--data", default="data/speech")
    ap.add_argument("--codec", default="samples/models/shapes-codec")
    ap.add_argument("--codec-ref", default="../shapes-codec",
                    help="the codec folder as the model folder will see it (relative path)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--evaluate", action="store_true")
    ap.add_argument("--draft-dir", default=None)
    ap.add_argument("--eval", type=int, default=50)
    args = ap.parse_args(argv)
    if args.out is None:
        args.out = "samples/models/shapes-tts" + ("" if args.size == "target" else "-draft")
    evaluate(args) if args.evaluate else train(args)


if __name__ == "__main__":
    main()
