"""Pre-filling: the first tokens come from the target alone, then a drafter takes over.

CSpD (docs/METHODS.md section 5) lets the target emit the first fraction of an image's tokens by
itself: early tokens set the layout and are where a small draft is least reliable. While
pre-filling, ``Prefilled`` asks its inner drafter for zero tokens (a model drafter queues the
target's tokens and feeds them all at once when drafting starts), so each of those steps is
one plain target step and emits exactly one token per row. Exact rules stay exact: a step with
no drafts samples the target's distribution.
"""

from __future__ import annotations

from ..types import Draft
from .base import Drafter


class Prefilled(Drafter):
    """``Prefilled(inner, num_tokens)``: the first ``num_tokens`` steps draft nothing."""

    def __init__(self, inner, num_tokens: int):
        if not isinstance(num_tokens, int) or num_tokens < 0:
            raise ValueError(f"prefill tokens={num_tokens!r}: accepted an integer >= 0")
        self.inner = inner
        self.prefill_tokens = num_tokens
        self._steps = 0

    @property
    def num_tokens(self) -> int:
        return self.inner.num_tokens

    @property
    def generator(self):
        """The wrapped drafter's generator (set by the runner to the call's)."""
        return self.inner.generator

    @generator.setter
    def generator(self, value) -> None:
        self.inner.generator = value

    def begin(self, input_ids, attention_mask, vocab_size=None, **prompt) -> None:
        self._steps = 0
        self.inner.begin(input_ids, attention_mask, vocab_size=vocab_size, **prompt)

    def propose(self, last, k_max: int, active=None) -> Draft:
        pre = self._steps < self.prefill_tokens
        self._steps += 1
        return self.inner.propose(last, 0 if pre else k_max, active)

    def observe(self, out, target_probs, num_accepted) -> None:
        self.inner.observe(out, target_probs, num_accepted)
