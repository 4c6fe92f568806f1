"""Tiny speech targets built from configs (MusicGen layout: text encoder, 2-codebook decoder,
Encodec; a single-codebook Llama), a toy codec and two texts."""

from __future__ import annotations

import numpy as np
import torch

TEXTS = [[3, 4, 5, 6, 7], [8, 9]]      # two texts of token ids


def tiny_musicgen(seed: int = 0, hidden: int = 16, layers: int = 2, codebooks: int = 2,
                  codebook_size: int = 16, pad_outside: bool = False):
    """``pad_outside``: transformers' own MusicGen layout (``MusicgenDecoderConfig``'s
    defaults and the released checkpoints): vocab_size = codebook size and the pad / start id
    equal to it, one past the logits; else the pad id is the last logit (vocab = size + 1)."""
    from transformers import MusicgenConfig, MusicgenForConditionalGeneration

    torch.manual_seed(seed)
    t5 = dict(model_type="t5", vocab_size=40, d_model=16, d_kv=8, d_ff=32, num_layers=1,
              num_heads=2, decoder_start_token_id=0)
    enc = dict(model_type="encodec", target_bandwidths=[8.0], sampling_rate=16000,
               audio_channels=1, num_filters=4, num_residual_layers=1, upsampling_ratios=[4, 4],
               hidden_size=8, codebook_size=codebook_size, codebook_dim=8, num_lstm_layers=1)
    dec = dict(model_type="musicgen_decoder", vocab_size=codebook_size + (0 if pad_outside else 1),
               max_position_embeddings=256, num_hidden_layers=layers, ffn_dim=2 * hidden,
               num_attention_heads=2, hidden_size=hidden, num_codebooks=codebooks,
               pad_token_id=codebook_size, bos_token_id=codebook_size,
               decoder_start_token_id=codebook_size)
    cfg = MusicgenConfig(text_encoder=t5, audio_encoder=enc, decoder=dec)
    m = MusicgenForConditionalGeneration(cfg).eval()
    m.generation_config.decoder_start_token_id = codebook_size
    return m


def single_codebook(seed=0, hidden=32):
    """A one-layer Llama over 40 ids: a single-codebook TTS target (codes 20-35, end 36)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=40, hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                      max_position_embeddings=128, pad_token_id=0)
    return LlamaForCausalLM(cfg).eval()


class ToyCodec:
    """A codec that decodes a frame's first code as 80 samples of code / 16."""

    sample_rate = 8000
    codebook_size = 16

    def decode(self, frames):
        return np.repeat(frames[..., 0].cpu().numpy().astype(np.float32) / 16, 80, axis=1)
