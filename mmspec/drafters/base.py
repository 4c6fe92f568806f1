"""The drafter interface: three methods and a hook, like Hugging Face's candidate generators,
and the capabilities every drafter declares.

    attach(target session)                                     before the prompt runs
    begin(input_ids [B, P], attention_mask [B, P], vocab_size=V, **prompt)   once, first
    propose(last [B], k_max, active [B] bool) -> Draft          up to k_max tokens per row
    observe(out: VerifyOutput, target_probs [B, K+1, V], num_accepted: list[int] | None)

``last`` holds each row's last emitted token (fed to the target first in this step, not yet
in any cache); ``active`` is False for rows that already finished (they ride along as
padding and must not advance). ``observe`` sees the outcome of the step (and the host copy of
the accepted counts, read at the loop's one synchronisation; None for host-free drafters,
whose steps are queued before the counts are read) so the drafter can roll back its own state
or, for Jacobi drafters, keep the target's samples as its next drafts.

Capabilities (class attributes, read by the engine and the runner, never probed):

- ``num_tokens``: K, drafts per step (0: plain decoding).
- ``plain``: drafts nothing and does nothing between target steps (``NoDraft``), so plain
  decoding may run several target steps per launch (``mmspec.engine.Plan.steps_per_launch``).
- ``host_free``: no step needs a host value of the previous one, so the loop may queue step
  t + 1 before reading step t (``mmspec.engine``).
- ``needs_model``: drafts with a draft model (a method builds it from the draft's session).
- ``needs_head``: drafts with a ``DraftHead`` on the target's features (``attach``).
- ``trees``: proposes trees (``Draft.tree``); the loop then needs a target session and a
  rule that declare ``trees``.
- ``generator``: the ``torch.Generator`` its draws use (the runner sets the call's).
- ``lossless_for(params)`` (a classmethod, since it may depend on the method's parameters):
  whether the drafter keeps a lossless rule lossless (default True: any draft whose q is the
  distribution it was drawn from). A method is lossless when its rule and its drafter both
  declare it (``mmspec.registry.Method.lossless``); Jacobi's continuation (``sjd-continue``)
  is not.

Methods name drafters by string (``mmspec.registry``); each class builds itself from the
method's parameters with ``from_params`` and says how many drafts per step it will make with
``width`` (so static caches are sized before anything is built).
"""

from __future__ import annotations

from typing import Mapping

import torch

from ..types import Draft, VerifyOutput


class Drafter:
    """Base class of drafters: the interface and the capabilities' defaults."""

    num_tokens: int = 0
    plain: bool = False
    host_free: bool = False
    needs_model: bool = False
    needs_head: bool = False
    trees: bool = False
    generator: torch.Generator | None = None
    param_names: tuple[str, ...] = ()          # method parameters ``from_params`` reads

    @classmethod
    def width(cls, params: Mapping, context) -> int:
        """Drafts per step that ``from_params(params, context)`` will make."""
        return 0

    @classmethod
    def reach(cls, params: Mapping, context) -> int:
        """Positions a step's drafts run past the last token (default: ``width``, a chain's
        K; a tree's nodes sit at the positions of their depths)."""
        return cls.width(params, context)

    @classmethod
    def lossless_for(cls, params: Mapping) -> bool:
        """Whether the drafter built from ``params`` keeps a lossless rule lossless (default
        True: its drafts are distributed as the q it records for them)."""
        return True

    @classmethod
    def from_params(cls, params: Mapping, context) -> "Drafter":
        """The drafter a method builds (``context``: ``mmspec.registry.MethodContext``)."""
        raise NotImplementedError(f"{cls.__name__} is not built from method parameters")

    def attach(self, target) -> None:
        """Meet the call's target session before its prompt runs (``mmspec.runner.prepare``):
        a drafter that reads the target's features asks for them here. Default: nothing."""

    def begin(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
              vocab_size: int | None = None, **prompt) -> None:
        """Start a call: the prompt ([B, P] ids, left-padded, with its mask), the target's
        vocabulary size V and any modality inputs (``pixel_values`` ...)."""
        raise NotImplementedError

    def propose(self, last: torch.Tensor, k_max: int, active: torch.Tensor | None = None) -> Draft:
        """Up to ``k_max`` draft tokens per row after ``last`` [B] (each row's last emitted token),
        with their draft distributions (None: a point mass); rows with ``active`` False must not
        advance."""
        raise NotImplementedError

    def observe(self, out: VerifyOutput, target_probs, num_accepted: list[int] | None) -> None:
        """The step's outcome: the verified tokens and accepted counts (``num_accepted``, host
        copies, None for host-free drafters), to roll back or reuse its own state."""
        raise NotImplementedError


class NoDraft(Drafter):
    """Plain decoding: no draft tokens, one target token per step (the baseline)."""

    plain = True
    host_free = True     # no step needs a host value of the previous one: the loop pipelines

    @classmethod
    def from_params(cls, params, context) -> "NoDraft":
        return cls()

    def begin(self, input_ids, attention_mask, vocab_size=None, **prompt) -> None:
        pass

    def propose(self, last, k_max, active=None):
        return Draft(tokens=last.new_zeros(last.shape[0], 0, *last.shape[1:]))

    def observe(self, out, target_probs, num_accepted) -> None:
        pass
