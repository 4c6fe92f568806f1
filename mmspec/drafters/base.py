"""The drafter interface: two methods, like Hugging Face's candidate generators.

    begin(input_ids [B, P], attention_mask [B, P], vocab_size=V, **prompt)   once, first
    propose(last [B], k_max, active [B] bool) -> Draft          up to k_max tokens per row
    observe(out: VerifyOutput, target_probs [B, K+1, V], num_accepted: list[int])

``last`` holds each row's last emitted token (fed to the target first in this step, not yet
in any cache); ``active`` is False for rows that already finished (they ride along as
padding and must not advance). ``observe`` sees the outcome of the step (and the host copy of the accepted
counts, read at the loop's one synchronisation) so the drafter can roll back its own state
or, for Jacobi drafters, keep the target's samples as its next drafts.
"""

from __future__ import annotations

from typing import Protocol

import torch

from ..types import Draft, VerifyOutput


class Drafter(Protocol):
    def begin(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
              vocab_size: int, **prompt) -> None: ...

    def propose(self, last: torch.Tensor, k_max: int, active: torch.Tensor | None = None) -> Draft: ...

    def observe(self, out: VerifyOutput, target_probs: torch.Tensor,
                num_accepted: list[int]) -> None: ...


class NoDraft:
    """Plain decoding: no draft tokens, one target token per step (the baseline)."""

    num_tokens = 0
    host_free = True     # no step needs a host value of the previous one: the loop pipelines

    def begin(self, input_ids, attention_mask, vocab_size=None, **prompt) -> None:
        pass

    def propose(self, last, k_max, active=None):
        return Draft(tokens=last.new_zeros(last.shape[0], 0, *last.shape[1:]))

    def observe(self, out, target_probs, num_accepted) -> None:
        pass
