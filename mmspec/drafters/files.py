"""A head's files: its config and its safetensors tensors (one file, or shards with an index),
read without loading anything else; pickle files are never opened."""

from __future__ import annotations

import json
from pathlib import Path

import torch

CONFIG = "config.json"
WEIGHTS = "model.safetensors"


def read_config(folder: Path) -> dict:
    path = folder / CONFIG
    if not path.is_file():
        raise ValueError(f"{folder}: accepted a folder with {CONFIG} (a draft head or a "
                         "checkpoint with an MTP module; a Hugging Face id: download it first "
                         "with huggingface_hub.snapshot_download)")
    try:
        return json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a JSON config ({e})") from None


def read_tensors(folder: Path, keep=lambda name: True) -> dict[str, torch.Tensor]:
    """The tensors ``keep`` selects from ``model.safetensors`` or the files a
    ``model.safetensors.index.json`` names for them (nothing else read)."""
    from safetensors import SafetensorError, safe_open

    index = folder / "model.safetensors.index.json"
    if index.is_file():
        files = sorted({f for k, f in json.loads(index.read_text())["weight_map"].items()
                        if keep(k)})
    elif (folder / WEIGHTS).is_file():
        files = [WEIGHTS]
    else:
        pickled = [p.name for p in folder.glob("*.bin")] + [p.name for p in folder.glob("*.pt")]
        why = (f" ({', '.join(pickled)} are pickle files, which mmspec does not open: convert "
               "them to safetensors where you trust them)") if pickled else ""
        raise ValueError(f"{folder}: accepted a folder with {WEIGHTS} or "
                         f"model.safetensors.index.json{why}")
    out = {}
    for name in files:
        try:
            with safe_open(str(folder / name), framework="pt") as f:
                out.update({k: f.get_tensor(k) for k in f.keys() if keep(k)})
        except (SafetensorError, OSError) as e:
            raise ValueError(f"{folder / name}: not a readable safetensors file ({e})") from None
    return out


def write(folder, config: dict, tensors: dict[str, torch.Tensor]) -> None:
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()},
              str(folder / WEIGHTS))


def tensor_names(folder: Path) -> list[str]:
    """The tensor names of a checkpoint folder (its index, or its file's header), [] if none."""
    from safetensors import SafetensorError, safe_open

    index = folder / "model.safetensors.index.json"
    if index.is_file():
        return list(json.loads(index.read_text())["weight_map"])
    if not (folder / WEIGHTS).is_file():
        return []
    try:
        with safe_open(str(folder / WEIGHTS), framework="pt") as f:
            return list(f.keys())
    except (SafetensorError, OSError):
        return []


def local_config(name: str | None) -> dict:
    """The ``config.json`` of ``name`` where it is a local folder (a target's path), else {}."""
    path = Path(name) / CONFIG if name else None
    return json.loads(path.read_text()) if path is not None and path.is_file() else {}
