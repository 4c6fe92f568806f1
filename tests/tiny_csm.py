"""A tiny CSM (backbone + depth decoder + Mimi codec) built from configs."""

from __future__ import annotations

import torch


def tiny_csm(seed: int = 0, hidden: int = 16, layers: int = 1, codebooks: int = 3, vocab: int = 8,
             depth_hidden: int = 16, scale: float = 1.0):
    from transformers import CsmConfig, CsmForConditionalGeneration

    torch.manual_seed(seed)
    mimi = dict(model_type="mimi", hidden_size=16, num_filters=4, upsampling_ratios=[4, 2],
                codebook_size=vocab, codebook_dim=8, num_quantizers=codebooks,
                num_semantic_quantizers=1, vector_quantization_hidden_dimension=8,
                upsample_groups=16, num_hidden_layers=1, intermediate_size=32,
                num_attention_heads=2, num_key_value_heads=2, head_dim=8)
    depth = dict(num_codebooks=codebooks, backbone_hidden_size=hidden, vocab_size=vocab,
                 hidden_size=depth_hidden, intermediate_size=2 * depth_hidden, num_hidden_layers=1,
                 num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                 max_position_embeddings=codebooks + 1)
    cfg = CsmConfig(num_codebooks=codebooks, vocab_size=vocab, text_vocab_size=20, hidden_size=hidden,
                    intermediate_size=2 * hidden, num_hidden_layers=layers, num_attention_heads=2,
                    num_key_value_heads=1, head_dim=8, max_position_embeddings=128, pad_token_id=0,
                    bos_token_id=1, audio_token_id=2, audio_eos_token_id=3,
                    codebook_pad_token_id=vocab - 1, codebook_eos_token_id=0,
                    depth_decoder_config=depth, codec_config=mimi)
    model = CsmForConditionalGeneration(cfg).eval()
    if scale != 1.0:
        with torch.no_grad():
            model.lm_head.weight.mul_(scale)
            model.depth_decoder.codebooks_head.weight.mul_(scale)
    return model
