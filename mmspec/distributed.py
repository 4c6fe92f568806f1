"""Targets split over several processes (tensor parallelism), as the loop sees them.

A target loaded with transformers' ``tp_plan="auto"`` under ``torchrun`` (one process per GPU,
or per CPU process on ``gloo``) runs in every process; each layer's matrices are split across
them and its outputs all-reduced, and the output head gathers whole logits
(``colwise_gather_output``), so every process holds the same distributions. The loop then runs
unchanged in every process, with its draft (a model, a head, or Jacobi) beside it, as long as
every process draws the same random numbers: a call without a ``seed`` gets one drawn in the
first process and broadcast (``shared_seed``); a call with one seeds every process alike.
"""

from __future__ import annotations

import torch


def group_size() -> int:
    """Processes in the default process group (1 without one)."""
    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def shared_seed() -> int:
    """A seed drawn in the first process from torch's global generator (``torch.manual_seed``
    there decides it) and broadcast to every process of the default group."""
    dist = torch.distributed
    device = (torch.device("cuda", torch.cuda.current_device())
              if dist.get_backend() == "nccl" else torch.device("cpu"))
    seed = torch.randint(0, 2**62, (1,), dtype=torch.long).to(device)
    dist.broadcast(seed, src=0)
    return int(seed.item())


def whole(t: torch.Tensor) -> torch.Tensor:
    """``t`` in full in every process: a tensor-parallel plan's split parameter (a DTensor)
    gathered (a collective: every process calls it alike); any other tensor as it is."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t
