"""Tiny vision-language models and a processor built offline from configs."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

WORDS = ["<pad>", "<s>", "</s>", "<unk>", "<image>", "USER:", "ASSISTANT:", "what", "colour",
         "is", "the", "circle", "square", "red", "blue", "green", "a", "it", "?", "."] + \
        [f"w{i}" for i in range(24)]

CHAT_TEMPLATE = ("{% for m in messages %}{% if m['role'] == 'user' %}USER: "
                 "{% for c in m['content'] %}{% if c['type'] == 'image' %}<image> {% else %}"
                 "{{ c['text'] }} {% endif %}{% endfor %}{% endif %}{% endfor %}"
                 "{% if add_generation_prompt %}ASSISTANT:{% endif %}")


def word_tokenizer(words=WORDS):
    from recipes.train.vlm import tokenizer

    return tokenizer(words, chat_template=None)


def tiny_processor(image_size: int = 32, patch: int = 8):
    from transformers import CLIPImageProcessor, LlavaProcessor

    ip = CLIPImageProcessor(size={"shortest_edge": image_size},
                            crop_size={"height": image_size, "width": image_size})
    return LlavaProcessor(image_processor=ip, tokenizer=word_tokenizer(), patch_size=patch,
                          vision_feature_select_strategy="default", chat_template=CHAT_TEMPLATE,
                          num_additional_image_tokens=1)


def tiny_llava(seed: int = 0, hidden: int = 32, layers: int = 2, vocab: int | None = None,
               image_size: int = 32, patch: int = 8):
    from transformers import LlavaConfig, LlavaForConditionalGeneration

    torch.manual_seed(seed)
    cfg = LlavaConfig(
        vision_config=dict(model_type="clip_vision_model", hidden_size=16, intermediate_size=32,
                           num_hidden_layers=1, num_attention_heads=2, image_size=image_size,
                           patch_size=patch, projection_dim=16),
        text_config=dict(model_type="llama", vocab_size=vocab or len(WORDS), hidden_size=hidden,
                         intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=2, num_key_value_heads=2,
                         max_position_embeddings=128, pad_token_id=0, bos_token_id=1,
                         eos_token_id=2),
        image_token_index=WORDS.index("<image>"), vision_feature_select_strategy="default",
        vision_feature_layer=-1, projector_hidden_act="gelu")
    return LlavaForConditionalGeneration(cfg).eval()


def tiny_text_lm(seed: int = 1, hidden: int = 16, vocab: int | None = None):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab or len(WORDS), hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                      max_position_embeddings=128, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return LlamaForCausalLM(cfg).eval()


def images(n: int, size: int = 32, seed: int = 0):
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)) for _ in range(n)]


def tiny_next_processor(image_size: int = 32, patch: int = 8):
    from transformers import LlavaNextImageProcessor, LlavaNextProcessor

    ip = LlavaNextImageProcessor(size={"shortest_edge": image_size},
                                 crop_size={"height": image_size, "width": image_size},
                                 image_grid_pinpoints=[[image_size, image_size],
                                                       [image_size, 2 * image_size],
                                                       [2 * image_size, image_size]])
    return LlavaNextProcessor(image_processor=ip, tokenizer=word_tokenizer(), patch_size=patch,
                              vision_feature_select_strategy="default",
                              chat_template=CHAT_TEMPLATE, num_additional_image_tokens=1)


def tiny_llava_next(seed: int = 0, hidden: int = 32, layers: int = 2, image_size: int = 32,
                    patch: int = 8):
    from transformers import LlavaNextConfig, LlavaNextForConditionalGeneration

    torch.manual_seed(seed)
    cfg = LlavaNextConfig(
        vision_config=dict(model_type="clip_vision_model", hidden_size=16, intermediate_size=32,
                           num_hidden_layers=1, num_attention_heads=2, image_size=image_size,
                           patch_size=patch, projection_dim=16),
        text_config=dict(model_type="llama", vocab_size=len(WORDS), hidden_size=hidden,
                         intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=2, num_key_value_heads=2,
                         max_position_embeddings=512, pad_token_id=0, bos_token_id=1,
                         eos_token_id=2),
        image_token_index=WORDS.index("<image>"), vision_feature_select_strategy="default",
        vision_feature_layer=-1,
        image_grid_pinpoints=[[image_size, image_size], [image_size, 2 * image_size],
                              [2 * image_size, image_size]])
    return LlavaNextForConditionalGeneration(cfg).eval()


# -- Qwen-VL (M-RoPE) ----------------------------------------------------------------------------
QWEN_SPECIAL = ["<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>"]
QWEN_WORDS = WORDS[:4] + QWEN_SPECIAL + [w for w in WORDS[4:] if w != "<image>"]


QWEN_KINDS = {  # adapter name -> transformers' class prefix
    "qwen2-vl": "Qwen2VL", "qwen2.5-vl": "Qwen2_5_VL", "qwen3-vl": "Qwen3VL", "qwen3.5": "Qwen3_5",
}


def tiny_qwen_processor(kind: str = "qwen2-vl", patch: int = 4):
    from recipes.train.vlm import qwen_processor

    return qwen_processor(QWEN_WORDS, kind, patch)


def tiny_qwen_vl(kind: str = "qwen2-vl", seed: int = 0, hidden: int = 32, layers: int = 2,
                 patch: int = 4, vocab: int | None = None):
    import transformers

    torch.manual_seed(seed)
    ids = {k: QWEN_WORDS.index(w) for k, w in (("image_token_id", "<|image_pad|>"),
                                                ("video_token_id", "<|video_pad|>"),
                                                ("vision_start_token_id", "<|vision_start|>"),
                                                ("vision_end_token_id", "<|vision_end|>"))}
    text = dict(vocab_size=vocab or len(QWEN_WORDS), hidden_size=hidden, intermediate_size=2 * hidden,
                num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=2,
                max_position_embeddings=512, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                initializer_range=0.3,        # positions move the argmax (0.02 hides them)
                rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                                     mrope_section=[2, 3, 3]))
    if kind == "qwen2-vl":
        vision = dict(depth=1, embed_dim=16, hidden_size=hidden, num_heads=2, patch_size=patch,
                      spatial_merge_size=2, temporal_patch_size=2)
    elif kind == "qwen2.5-vl":
        vision = dict(depth=1, hidden_size=16, intermediate_size=32, out_hidden_size=hidden,
                      num_heads=2, patch_size=patch, spatial_merge_size=2, temporal_patch_size=2,
                      window_size=16, fullatt_block_indexes=[0])
    else:
        text.update(head_dim=hidden // 2)
        text["rope_parameters"].update(mrope_section=[3, 3, 2], mrope_interleaved=True)
        if kind == "qwen3.5":           # 3 Gated DeltaNet layers, then full attention
            text.update(num_hidden_layers=max(layers, 2) * 2, linear_num_key_heads=2,
                        linear_num_value_heads=2, linear_key_head_dim=8,
                        linear_value_head_dim=8, linear_conv_kernel_dim=4, full_attention_interval=2)
            text["rope_parameters"].update(partial_rotary_factor=1.0)
        vision = dict(depth=2, hidden_size=16, intermediate_size=32, out_hidden_size=hidden,
                      num_heads=2, patch_size=patch, spatial_merge_size=2, temporal_patch_size=2,
                      num_position_embeddings=64,
                      **({} if kind == "qwen3.5" else dict(deepstack_visual_indexes=[0])))
    prefix = QWEN_KINDS[kind]
    cfg = getattr(transformers, f"{prefix}Config")(text_config=text, vision_config=vision, **ids)
    return getattr(transformers, f"{prefix}ForConditionalGeneration")(cfg).eval()


# -- LLaVA-OneVision (anyres, SigLIP + Qwen2) ----------------------------------------------------
OV_WORDS = WORDS + ["<video>"]
OV_PINPOINTS = [[32, 32], [32, 64], [64, 32]]


def tiny_onevision_processor():
    from transformers import (LlavaOnevisionImageProcessor, LlavaOnevisionProcessor,
                              LlavaOnevisionVideoProcessor)

    tok = word_tokenizer(OV_WORDS)
    tok.add_special_tokens({"additional_special_tokens": ["<image>", "<video>"]})
    ip = LlavaOnevisionImageProcessor(size={"height": 32, "width": 32},
                                      crop_size={"height": 32, "width": 32},
                                      image_grid_pinpoints=OV_PINPOINTS)
    vp = LlavaOnevisionVideoProcessor(size={"height": 32, "width": 32})
    return LlavaOnevisionProcessor(image_processor=ip, tokenizer=tok, video_processor=vp,
                                   chat_template=CHAT_TEMPLATE, num_image_tokens=16,
                                   vision_feature_select_strategy="full",
                                   vision_aspect_ratio="anyres_max_9")


def tiny_onevision(seed: int = 0, hidden: int = 32, layers: int = 2):
    from transformers import LlavaOnevisionConfig, LlavaOnevisionForConditionalGeneration

    torch.manual_seed(seed)
    cfg = LlavaOnevisionConfig(
        vision_config=dict(model_type="siglip_vision_model", hidden_size=16, intermediate_size=32,
                           num_hidden_layers=1, num_attention_heads=2, image_size=32,
                           patch_size=8),
        text_config=dict(model_type="qwen2", vocab_size=len(OV_WORDS), hidden_size=hidden,
                         intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=2, num_key_value_heads=2,
                         max_position_embeddings=1024, pad_token_id=0, bos_token_id=1,
                         eos_token_id=2, initializer_range=0.3),
        image_token_index=OV_WORDS.index("<image>"), video_token_index=OV_WORDS.index("<video>"),
        vision_feature_select_strategy="full", vision_feature_layer=-1,
        image_grid_pinpoints=OV_PINPOINTS)
    return LlavaOnevisionForConditionalGeneration(cfg).eval()


# -- Mistral3 (Pixtral vision tower + Mistral) ---------------------------------------------------
PIXTRAL_SPECIAL = ["[IMG]", "[IMG_BREAK]", "[IMG_END]"]
PIXTRAL_WORDS = [w for w in WORDS if w != "<image>"] + PIXTRAL_SPECIAL


def tiny_mistral3_processor():
    from transformers import PixtralImageProcessor, PixtralProcessor

    from recipes.train.vlm import special_tokenizer

    return PixtralProcessor(image_processor=PixtralImageProcessor(size={"longest_edge": 32},
                                                                  patch_size=8),
                            tokenizer=special_tokenizer(PIXTRAL_WORDS, PIXTRAL_SPECIAL),
                            patch_size=8, spatial_merge_size=2,
                            chat_template=CHAT_TEMPLATE.replace("<image> ", "[IMG] "))


def tiny_mistral3(seed: int = 0, hidden: int = 32, layers: int = 2):
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration

    torch.manual_seed(seed)
    cfg = Mistral3Config(
        vision_config=dict(model_type="pixtral", hidden_size=16, intermediate_size=32,
                           num_hidden_layers=1, num_attention_heads=2, image_size=32,
                           patch_size=8, head_dim=8),
        text_config=dict(model_type="mistral", vocab_size=len(PIXTRAL_WORDS), hidden_size=hidden,
                         intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=2, num_key_value_heads=2, head_dim=hidden // 2,
                         max_position_embeddings=1024, pad_token_id=0, bos_token_id=1,
                         eos_token_id=2, initializer_range=0.3),
        image_token_index=PIXTRAL_WORDS.index("[IMG]"), spatial_merge_size=2,
        vision_feature_layer=-1)
    return Mistral3ForConditionalGeneration(cfg).eval()


# -- InternVL (InternViT + Qwen2) ---------------------------------------------------------------
INTERN_SPECIAL = ["<img>", "</img>", "<IMG_CONTEXT>", "<video>"]
INTERN_WORDS = [w for w in WORDS if w != "<image>"] + INTERN_SPECIAL


def tiny_internvl_processor():
    from transformers import GotOcr2ImageProcessor, InternVLProcessor, InternVLVideoProcessor

    from recipes.train.vlm import special_tokenizer

    tok = special_tokenizer(INTERN_WORDS, INTERN_SPECIAL, extra_special_tokens={
        "start_image_token": "<img>", "end_image_token": "</img>",
        "context_image_token": "<IMG_CONTEXT>", "video_token": "<video>"})
    size = {"height": 32, "width": 32}
    return InternVLProcessor(image_processor=GotOcr2ImageProcessor(size=size, crop_to_patches=False),
                             tokenizer=tok, video_processor=InternVLVideoProcessor(size=size),
                             image_seq_length=4,
                             chat_template=CHAT_TEMPLATE.replace("<image> ", "<IMG_CONTEXT> "))


def tiny_internvl(seed: int = 0, hidden: int = 32, layers: int = 2):
    from transformers import InternVLConfig, InternVLForConditionalGeneration

    torch.manual_seed(seed)
    cfg = InternVLConfig(
        vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                           num_attention_heads=2, image_size=[32, 32], patch_size=[8, 8]),
        text_config=dict(model_type="qwen2", vocab_size=len(INTERN_WORDS), hidden_size=hidden,
                         intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=2, num_key_value_heads=2,
                         max_position_embeddings=1024, pad_token_id=0, bos_token_id=1,
                         eos_token_id=2, initializer_range=0.3),
        image_token_id=INTERN_WORDS.index("<IMG_CONTEXT>"), image_seq_length=4,
        downsample_ratio=0.5)
    return InternVLForConditionalGeneration(cfg).eval()


# -- Idefics3 (SigLIP + pixel shuffle + Llama) ---------------------------------------------------
IDEFICS_SPECIAL = (["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"]
                   + [f"<row_{i + 1}_col_{j + 1}>" for i in range(6) for j in range(6)])
IDEFICS_WORDS = [w for w in WORDS if w != "<image>"] + IDEFICS_SPECIAL


def tiny_idefics3_processor():
    from transformers import Idefics3ImageProcessor, Idefics3Processor

    from recipes.train.vlm import special_tokenizer

    ip = Idefics3ImageProcessor(do_image_splitting=False, size={"longest_edge": 32},
                                max_image_size={"longest_edge": 32}, resample=3)
    return Idefics3Processor(image_processor=ip,
                             tokenizer=special_tokenizer(IDEFICS_WORDS, IDEFICS_SPECIAL),
                             image_seq_len=4, chat_template=CHAT_TEMPLATE)


def tiny_idefics3(seed: int = 0, hidden: int = 32, layers: int = 2, family: str = "Idefics3"):
    """An Idefics3 (or, ``family="SmolVLM"``, a SmolVLM: the same architecture, whose own
    processor needs the num2words package; the Idefics3 processor's outputs feed it)."""
    import transformers

    torch.manual_seed(seed)
    cfg = getattr(transformers, f"{family}Config")(
        vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                           num_attention_heads=2, image_size=32, patch_size=8),
        text_config=dict(model_type="llama", vocab_size=len(IDEFICS_WORDS), hidden_size=hidden,
                         intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=2, num_key_value_heads=2,
                         max_position_embeddings=1024, pad_token_id=0, bos_token_id=1,
                         eos_token_id=2, initializer_range=0.3),
        image_token_id=IDEFICS_WORDS.index("<image>"), scale_factor=2)
    return getattr(transformers, f"{family}ForConditionalGeneration")(cfg).eval()


# -- Chameleon as a vision-language model (a VQ image tokenizer inside the model) -----------------
def _code_name(i: int) -> str:
    """Chameleon's vocabulary names image code i as IMGIMG + its digits as letters + Z."""
    return "IMGIMG" + "".join(chr(ord("A") + int(d)) for d in str(i)) + "Z"


CHAMELEON_SPECIAL = ["<image>", "<racm3:break>", "<eoss>", "<reserved08706>"]
CHAMELEON_WORDS = ([w for w in WORDS if w != "<image>"] + CHAMELEON_SPECIAL
                   + [_code_name(i) for i in range(16)])


def tiny_chameleon_processor():
    from transformers import ChameleonImageProcessor, ChameleonProcessor

    from recipes.train.vlm import special_tokenizer

    tok = special_tokenizer(CHAMELEON_WORDS, CHAMELEON_SPECIAL, sep_token="<reserved08706>")
    ip = ChameleonImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    proc = ChameleonProcessor(image_processor=ip, tokenizer=tok, image_seq_length=16)
    proc.chat_template = CHAT_TEMPLATE
    return proc


def tiny_chameleon(seed: int = 0, hidden: int = 32, layers: int = 2):
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration

    torch.manual_seed(seed)
    cfg = ChameleonConfig(
        vocab_size=len(CHAMELEON_WORDS), hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=2,
        max_position_embeddings=1024, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        initializer_range=0.3, vocabulary_map={w: i for i, w in enumerate(CHAMELEON_WORDS)},
        image_token_id=CHAMELEON_WORDS.index("<image>"),
        vq_config=dict(embed_dim=32, num_embeddings=16, latent_channels=32, resolution=32,
                       base_channels=32, channel_multiplier=[1, 1, 1, 1], num_res_blocks=1))
    return ChameleonForConditionalGeneration(cfg).eval()


# -- Gemma 3 (SigLIP + Gemma 3 text: sliding windows, bidirectional image blocks) ---------------
GEMMA_SPECIAL = ["<start_of_image>", "<end_of_image>", "<image_soft_token>"]
GEMMA_WORDS = [w for w in WORDS if w != "<image>"] + GEMMA_SPECIAL


def tiny_gemma3_processor(tokens: int = 4):
    from transformers import Gemma3ImageProcessor, Gemma3Processor

    from recipes.train.vlm import special_tokenizer

    tok = special_tokenizer(GEMMA_WORDS, GEMMA_SPECIAL, extra_special_tokens={
        "boi_token": "<start_of_image>", "eoi_token": "<end_of_image>",
        "image_token": "<image_soft_token>"})
    ip = Gemma3ImageProcessor(size={"height": 32, "width": 32}, do_pan_and_scan=False)
    return Gemma3Processor(image_processor=ip, tokenizer=tok, image_seq_length=tokens,
                           chat_template=CHAT_TEMPLATE.replace("<image> ", "<start_of_image> "))


def tiny_gemma3(seed: int = 0, hidden: int = 32, layers: int = 2, window: int = 6,
                tokens: int = 4):
    """Layers alternate sliding-window (``window`` slots) and full attention, as Gemma 3's;
    each image is ``tokens`` soft tokens, bidirectional among themselves."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    torch.manual_seed(seed)
    cfg = Gemma3Config(
        vision_config=dict(model_type="siglip_vision_model", hidden_size=16,
                           intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                           image_size=32, patch_size=8),
        text_config=dict(model_type="gemma3_text", vocab_size=len(GEMMA_WORDS),
                         hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=1,
                         head_dim=hidden // 2, max_position_embeddings=1024, pad_token_id=0,
                         bos_token_id=1, eos_token_id=2, sliding_window=window,
                         tie_word_embeddings=False,
                         layer_types=["sliding_attention", "full_attention"] * (layers // 2)
                         + ["sliding_attention"] * (layers % 2), initializer_range=0.3),
        mm_tokens_per_image=tokens, boi_token_index=GEMMA_WORDS.index("<start_of_image>"),
        eoi_token_index=GEMMA_WORDS.index("<end_of_image>"),
        image_token_index=GEMMA_WORDS.index("<image_soft_token>"), initializer_range=0.3,
        tie_word_embeddings=False)
    model = Gemma3ForConditionalGeneration(cfg).eval()
    with torch.no_grad():    # initialised to zeros: every image would be the same tokens
        model.model.multi_modal_projector.mm_input_projection_weight.normal_(0, 0.3)
    return model


def tiny_paligemma_processor(tokens: int = 4):
    """PaliGemma's processor over the word tokenizer: each prompt becomes its image tokens,
    ``<s>`` and the prompt (its whole prefix bidirectional in the model)."""
    from transformers import PaliGemmaProcessor, SiglipImageProcessor

    ip = SiglipImageProcessor(size={"height": 32, "width": 32})
    ip.image_seq_length = tokens
    return PaliGemmaProcessor(image_processor=ip, tokenizer=word_tokenizer(),
                              chat_template=CHAT_TEMPLATE)


def tiny_paligemma(seed: int = 0, hidden: int = 32, layers: int = 2, tokens: int = 4,
                   window: int | None = None):
    """A PaliGemma (SigLIP + Gemma): the image and the prompt one bidirectional prefix. With a
    ``window``, PaliGemma 2's: a Gemma 2 decoder whose layers alternate sliding-window
    (``window`` slots, less than a prompt's prefix) and full attention, logits soft-capped."""
    from transformers import PaliGemmaConfig, PaliGemmaForConditionalGeneration

    torch.manual_seed(seed)
    text = dict(model_type="gemma", vocab_size=len(WORDS), hidden_size=hidden,
                intermediate_size=2 * hidden, num_hidden_layers=layers,
                num_attention_heads=2, num_key_value_heads=1, head_dim=hidden // 2,
                max_position_embeddings=1024, pad_token_id=0, bos_token_id=1,
                eos_token_id=2, initializer_range=0.3, tie_word_embeddings=False)
    if window is not None:
        text.update(model_type="gemma2", sliding_window=window, final_logit_softcapping=3.0,
                    layer_types=["sliding_attention", "full_attention"] * (layers // 2)
                    + ["sliding_attention"] * (layers % 2))
    cfg = PaliGemmaConfig(
        vision_config=dict(model_type="siglip_vision_model", hidden_size=16,
                           intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                           image_size=32, patch_size=16, projection_dim=hidden,
                           num_image_tokens=tokens),
        text_config=text,
        image_token_index=WORDS.index("<image>"), projection_dim=hidden,
        tie_word_embeddings=False)
    return PaliGemmaForConditionalGeneration(cfg).eval()


# -- Gemma 4 (its vision tower + Gemma 4 text: per-layer inputs, image blocks on local layers) --
GEMMA4_SPECIAL = ["<start_of_image>", "<end_of_image>", "<|image|>", "<|audio|>",
                  "<start_of_audio>", "<end_of_audio>", "<|video|>"]
GEMMA4_WORDS = [w for w in WORDS if w != "<image>"] + GEMMA4_SPECIAL


def tiny_gemma4_processor():
    """Gemma 4's processor: 4-pixel patches pooled 2 x 2, at most 70 soft tokens an image."""
    from transformers import (
        Gemma4AudioFeatureExtractor,
        Gemma4ImageProcessor,
        Gemma4Processor,
        Gemma4VideoProcessor,
    )

    from recipes.train.vlm import special_tokenizer

    tok = special_tokenizer(GEMMA4_WORDS, GEMMA4_SPECIAL, extra_special_tokens={
        "boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<|image|>",
        "audio_token": "<|audio|>", "boa_token": "<start_of_audio>", "eoa_token": "<end_of_audio>"})
    patches = dict(patch_size=4, pooling_kernel_size=2)
    return Gemma4Processor(feature_extractor=Gemma4AudioFeatureExtractor(),
                           image_processor=Gemma4ImageProcessor(max_soft_tokens=70, **patches),
                           video_processor=Gemma4VideoProcessor(**patches), tokenizer=tok,
                           chat_template=CHAT_TEMPLATE.replace("<image> ", "<|image|> "),
                           image_seq_length=70)


def tiny_gemma4(seed: int = 0, hidden: int = 32, layers: int = 2, window: int = 6):
    """Sliding-window and full layers alternating, per-layer inputs, images bidirectional
    on the sliding-window layers (``use_bidirectional_attention="vision"``)."""
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration

    torch.manual_seed(seed)
    ids = {f"{k}_token_id": GEMMA4_WORDS.index(t) for k, t in (
        ("boi", "<start_of_image>"), ("eoi", "<end_of_image>"), ("image", "<|image|>"),
        ("video", "<|video|>"), ("boa", "<start_of_audio>"), ("audio", "<|audio|>"))}
    cfg = Gemma4Config(
        text_config=dict(vocab_size=len(GEMMA4_WORDS), hidden_size=hidden,
                         intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=hidden // 2,
                         max_position_embeddings=1024, pad_token_id=0, bos_token_id=1,
                         eos_token_id=2, sliding_window=window,
                         layer_types=["sliding_attention", "full_attention"] * (layers // 2)
                         + ["sliding_attention"] * (layers % 2), initializer_range=0.3,
                         tie_word_embeddings=False, vocab_size_per_layer_input=len(GEMMA4_WORDS),
                         hidden_size_per_layer_input=8, use_bidirectional_attention="vision"),
        vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                           num_attention_heads=2, num_key_value_heads=2, head_dim=8,
                           patch_size=4, pooling_kernel_size=2, position_embedding_size=64),
        audio_config=None, eoa_token_index=GEMMA4_WORDS.index("<end_of_audio>"),
        initializer_range=0.3, tie_word_embeddings=False, **ids)
    return Gemma4ForConditionalGeneration(cfg).eval()


# -- shared inputs of the VLM tests ------------------------------------------------------------
MSGS = [{"role": "user", "content": [{"type": "image"},
                                     {"type": "text", "text": "what colour is the circle ?"}]}]
QWEN_QUESTIONS = ["what colour is the circle ?", "a", "is it red ?"]


def qwen_pairs(n: int = 3):
    """Images of 32x32, 32x48 and 48x32 pixels: 16, 24 and 24 visual tokens."""
    rng = np.random.default_rng(0)
    sizes = [(32, 32), (32, 48), (48, 32)][:n]
    ims = [Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)) for h, w in sizes]
    msgs = [[{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": q}]}]
            for q in QWEN_QUESTIONS[:n]]
    return ims, msgs


def own_tokens(gen, target, ims, msgs, n):
    """Each (image, message) pair's greedy tokens from the model's own ``generate``."""
    rows = []
    for im, m in zip(ims, msgs):
        batch = gen.encode([im], [m])
        out = target.generate(**batch, do_sample=False, max_new_tokens=n)
        rows.append(out[0, batch["input_ids"].shape[1]:].tolist())
    return rows


def llava_pairs(kind):
    """Two (image, prompt) pairs for the LLaVA (``"llava"``) or LLaVA-NeXT kind."""
    if kind == "llava":
        return images(2), [MSGS, "USER: <image> a ASSISTANT:"]
    rng = np.random.default_rng(0)
    ims = [Image.fromarray(rng.integers(0, 255, (32, 64, 3), dtype=np.uint8)),
           Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8))]
    return ims, ["USER: <image> what colour is the circle ? ASSISTANT:", "USER: <image> a ASSISTANT:"]


def image_last_case(kind):
    """(target, one-layer image draft, processor, two images, prompts) of a LLaVA, LLaVA-NeXT
    or Qwen-VL kind: the first prompt ends on its image placeholder, the second on text."""
    if kind.startswith("llava"):
        return (*llava_models(kind), llava_pairs(kind)[0],
                ["USER: what colour is the circle ? <image>", "USER: <image> a ASSISTANT:"])
    rng = np.random.default_rng(0)
    ims = [Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8))] * 2
    return (tiny_qwen_vl(kind), tiny_qwen_vl(kind, seed=1, layers=1), tiny_qwen_processor(kind),
            ims, ["what colour is the circle ? <|vision_start|><|image_pad|>",
                  "<|vision_start|><|image_pad|><|vision_end|> a"])


def llava_models(kind):
    """(target, one-layer image draft, processor) of the LLaVA or LLaVA-NeXT kind."""
    if kind == "llava":
        return tiny_llava(), tiny_llava(seed=1, hidden=16, layers=1), tiny_processor()
    return tiny_llava_next(), tiny_llava_next(seed=1, hidden=16, layers=1), tiny_next_processor()
