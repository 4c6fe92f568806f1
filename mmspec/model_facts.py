"""What mmspec reads of a model's config and output head: the width of its logits, its text
decoder's config, its positions."""

from __future__ import annotations


def output_vocab_size(model) -> int:
    """Rows of the output head (the width of the logits), falling back to the config."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and getattr(head, "weight", None) is not None:
        return int(head.weight.shape[0])
    return int(decoder_config(model).vocab_size)


def decoder_config(model):
    """The config of the model's text decoder (a VLM's language model; the model's own)."""
    cfg = model.config
    return cfg.get_text_config(decoder=True) if hasattr(cfg, "get_text_config") else cfg


def max_positions(model) -> int | None:
    """The text decoder's ``max_position_embeddings`` (None where its config has none)."""
    return getattr(decoder_config(model), "max_position_embeddings", None)
