"""Tiny image-generation models built from configs (no downloads): Janus, Emu3, LlamaGen, token
spans; pipelines of each with a one-layer draft (``PIPES``)."""

from __future__ import annotations

import os

import torch
from transformers import (Emu3Config, Emu3ForConditionalGeneration, JanusConfig,
                          JanusForConditionalGeneration)


def tiny_janus(seed: int = 0, codebook: int = 32, text_vocab: int = 64, hidden: int = 32,
               layers: int = 2, grid: int = 4) -> JanusForConditionalGeneration:
    """A Janus with a grid x grid image-token canvas and a 32-entry codebook."""
    torch.manual_seed(seed)
    cfg = JanusConfig(
        text_config=dict(model_type="llama", vocab_size=text_vocab, hidden_size=hidden,
                         intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=2, num_key_value_heads=2,
                         max_position_embeddings=128, pad_token_id=0),
        vision_config=dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                           image_size=16 * grid, patch_size=16, projection_dim=hidden,
                           num_image_tokens=grid * grid, depth=1),
        vq_config=dict(embed_dim=8, num_embeddings=codebook, latent_channels=32, base_channels=32,
                       channel_multiplier=[1, 2], num_res_blocks=1, num_patches=grid,
                       projection_dim=hidden, image_token_embed_dim=hidden, num_hidden_layers=1),
        image_token_id=text_vocab - 1)
    return JanusForConditionalGeneration(cfg).eval()


def tiny_emu3(seed: int = 0, codebook: int = 24, text_words: int = 40, hidden: int = 32,
              layers: int = 2, codes=None) -> Emu3ForConditionalGeneration:
    """An Emu3 whose vocabulary holds text ids, specials and one id per visual token;
    ``codes``: the VQ codes its vocabulary names (default all; a partial map as in
    transformers' own Emu3 tester configurations)."""
    torch.manual_seed(seed)
    vocab = {f"w{i}": i for i in range(text_words)}
    nxt = text_words
    for name in ("<|extra_200|>", "<|extra_201|>", "<|image start|>", "<|image end|>",
                 "<|image token|>", "<image>"):
        vocab[name] = nxt
        nxt += 1
    for i in (range(codebook) if codes is None else codes):
        vocab[f"<|visual token {i:06d}|>"] = nxt
        nxt += 1
    cfg = Emu3Config(
        text_config=dict(vocab_size=nxt, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=2,
                         max_position_embeddings=256, pad_token_id=0, bos_token_id=1,
                         eos_token_id=2),
        vq_config=dict(codebook_size=codebook, embed_dim=4, latent_channels=4, base_channels=32,
                       channel_multiplier=[1, 1], num_res_blocks=1, attn_resolutions=[],
                       temporal_downsample_factor=1, hidden_size=32),
        vocabulary_map=vocab)
    return Emu3ForConditionalGeneration(cfg).eval()


def tiny_vq(codebook: int = 16, seed: int = 0, latent: int = 4):
    """A diffusers VQModel: 16x16 images -> 4x4 token grids."""
    from diffusers import VQModel

    from modalities.image import VQTokenizer

    torch.manual_seed(seed)
    vq = VQModel(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 3,
                 up_block_types=("UpDecoderBlock2D",) * 3, block_out_channels=(8, 8, 8),
                 layers_per_block=1, latent_channels=latent, num_vq_embeddings=codebook,
                 vq_embed_dim=latent, norm_num_groups=4, sample_size=16).eval()
    return VQTokenizer(vq)


def tiny_llamagen(seed: int = 0, codebook: int = 16, grid: int = 4, dim: int = 32, layers: int = 2,
                  cond: str = "c2i"):
    from modalities.image import LlamaGenConfig, LlamaGenForImageGeneration

    torch.manual_seed(seed)
    cfg = LlamaGenConfig(vocab_size=codebook, dim=dim, n_layer=layers, n_head=2, multiple_of=16,
                         model_type_cond=cond, num_classes=5, caption_dim=12,
                         cls_token_num=1 if cond == "c2i" else 3, block_size=grid * grid)
    m = LlamaGenForImageGeneration(cfg).eval()
    with torch.no_grad():   # LlamaGen zero-inits the output; give it some signal
        m.output.weight.normal_(0, 0.5)
    return m


def tiny_token_span(seed: int = 0, codebook: int = 16, words: int = 10, hidden: int = 32,
                    layers: int = 2):
    """A Llama over [pad, bos, boi, words..., image tokens...] (the bundled models' layout)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    vocab = 3 + words + codebook
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=2,
                      max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
                      eos_token_id=None)
    return LlamaForCausalLM(cfg).eval(), 3 + words


def save_tiny_bundled_pair(root) -> tuple[str, str]:
    """A tiny target and draft over the shapes-world words, saved in the bundled token-span
    format (with a tiny VQ) under ``root``: what the sweep and the recipes load by path."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from modalities.image.pipeline import save_bundled
    from recipes.train.t2i import WORD_OFFSET, WORDS

    vq = tiny_vq()
    vq.vq.save_pretrained(os.path.join(root, "vq"))
    paths = []
    for name, hidden, seed in (("shapes-tiny", 32, 0), ("shapes-tiny-draft", 16, 1)):
        torch.manual_seed(seed)
        cfg = LlamaConfig(vocab_size=WORD_OFFSET + len(WORDS) + 16, hidden_size=hidden,
                          intermediate_size=2 * hidden, num_hidden_layers=1, num_attention_heads=2,
                          num_key_value_heads=2, max_position_embeddings=96, pad_token_id=0)
        meta = dict(image_token_offset=WORD_OFFSET + len(WORDS), codebook_size=16, grid=[4, 4],
                    prefix=[1], suffix=[2], pad_id=0, words=WORDS, word_offset=WORD_OFFSET,
                    defaults={"guidance_scale": 2.0})
        save_bundled(os.path.join(root, name), LlamaForCausalLM(cfg).eval(), fmt="token-span",
                     vq_folder=os.path.join(root, "vq"), meta=meta)
        paths.append(os.path.join(root, name))
    return paths[0], paths[1]


# -- pipelines of a target and a one-layer draft, with two prompts --------------------------------
def janus_pipe():
    from modalities.image import JanusAdapter, TextToImage

    mk = lambda m: JanusAdapter(m, bos_id=1, boi_id=9, pad_id=0)  # noqa: E731
    return TextToImage(mk(tiny_janus()), mk(tiny_janus(seed=1, hidden=16, layers=1))), \
        [[1, 5, 6, 9], [1, 7, 9]]


def emu3_pipe():
    from modalities.image import Emu3Adapter, TextToImage

    return TextToImage(Emu3Adapter(tiny_emu3(), 2, 3),
                       Emu3Adapter(tiny_emu3(seed=1, hidden=16, layers=1), 2, 3)), \
        [[1, 5, 6, 42, 44], [1, 7, 42, 44]]


def llamagen_pipe(vq):
    from modalities.image import LlamaGenAdapter, TextToImage

    return TextToImage(LlamaGenAdapter(tiny_llamagen(), vq),
                       LlamaGenAdapter(tiny_llamagen(seed=1, dim=16, layers=1), vq)), [1, 3]


def token_span_pipe(vq):
    from modalities.image import TextToImage, TokenSpanAdapter

    m, off = tiny_token_span()
    d, _ = tiny_token_span(seed=1, hidden=16, layers=1)
    mk = lambda x: TokenSpanAdapter(x, list(range(off, off + 16)), (4, 4), vq, prefix=[1],  # noqa: E731
                                    suffix=[2], pad_id=0)
    return TextToImage(mk(m), mk(d)), [[3, 4, 5], [6]]


PIPES = {"janus": lambda vq: janus_pipe(), "emu3": lambda vq: emu3_pipe(),
         "llamagen": llamagen_pipe, "token-span": token_span_pipe}
