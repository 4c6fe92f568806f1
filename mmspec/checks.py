"""The checks every front door shares, each written once: bad input raises ValueError naming
the parameter and the accepted range, before any model runs."""

from __future__ import annotations

import math


def check_count(name: str, value, minimum: int = 1) -> int:
    """An integer >= ``minimum`` (bools refused: ``True`` is not a count)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name}={value!r}: accepted an integer >= {minimum}")
    return value


def check_guidance_scale(scale) -> float | None:
    """None (no guidance) or a finite float >= 0."""
    if scale is None:
        return None
    if not (isinstance(scale, (int, float)) and not isinstance(scale, bool)
            and math.isfinite(scale) and scale >= 0):
        raise ValueError(f"guidance_scale={scale!r}: accepted a finite float >= 0")
    return float(scale)


def guided(scale: float | None) -> float | None:
    """The scale a session applies: None for no guidance and for s = 1 (u + 1 (c - u) = c)."""
    return None if scale is None or scale == 1.0 else scale


def check_positions(name: str, new: int, prompt_len: int, limit: int | None,
                    model: str = "target", prompt: str = "") -> None:
    """prompt + ``new`` positions fit the model's max_position_embeddings (``limit``);
    ``name`` is the parameter that sets ``new``, ``prompt`` a note on the prompt's length."""
    if limit is not None and prompt_len + new > limit:
        raise ValueError(f"{name}={new} with a {prompt_len}-token prompt{prompt} exceeds the "
                         f"{model}'s max_position_embeddings={limit}: accepted {name} <= "
                         f"{limit - prompt_len}")


def check_at_most(name: str, value, limit: int, why: str) -> int:
    """An integer in [1, ``limit``], ``why`` saying what bounds it (a size past what the call
    can use: drafts past the tokens left, ids past the vocabulary)."""
    check_count(name, value)
    if value > limit:
        raise ValueError(f"{name}={value}: accepted an integer in [1, {limit}] ({why})")
    return value
