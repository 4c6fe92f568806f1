"""Tiny vision-language models and a processor built offline from configs."""

from __future__ import annotations

import torch

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
