"""Targets split over several processes (tensor parallelism), as the loop sees them.

A target loaded with transformers' ``tp_plan="auto"`` under ``torchrun`` (one process per GPU,
or per CPU process on ``gloo``) runs in every process of its mesh; each layer's matrices are
split across them and its outputs all-reduced, and the output head gathers whole logits
(``colwise_gather_output``), so every process holds the same distributions. The loop then runs
unchanged in every process, with its draft (a model, a head, or Jacobi) beside it, as long as
every process of the mesh draws the same random numbers: a call without a ``seed`` on a split
target gets one drawn in the mesh's first process and broadcast over the mesh
(``shared_seed``); a call with one seeds every process alike. Other process groups (data
parallelism: each process its own prompts) are left alone.
"""

from __future__ import annotations

import torch


def split_group(model):
    """The process group a tensor-parallel plan split ``model`` over (the device mesh of its
    split parameters), or None for a model held whole in this process."""
    for p in model.parameters():
        mesh = getattr(p, "device_mesh", None)
        if mesh is not None and mesh.size() > 1:
            return mesh.get_group()
    return None


def shared_seed(group) -> int:
    """A seed drawn in ``group``'s first process from torch's global generator
    (``torch.manual_seed`` there decides it) and broadcast to the group's processes."""
    dist = torch.distributed
    device = (torch.device("cuda", torch.cuda.current_device())
              if dist.get_backend(group) == "nccl" else torch.device("cpu"))
    seed = torch.randint(0, 2**62, (1,), dtype=torch.long).to(device)
    dist.broadcast(seed, src=dist.get_global_rank(group, 0), group=group)
    return int(seed.item())


def whole(t: torch.Tensor) -> torch.Tensor:
    """``t`` in full in every process: a tensor-parallel plan's split parameter (a DTensor)
    gathered (a collective: every process calls it alike); any other tensor as it is. The
    gather runs outside inference mode (DTensor's redistribution has no inference-mode path)."""
    if not hasattr(t, "full_tensor"):
        return t
    with torch.inference_mode(False), torch.no_grad():
        return t.full_tensor()
