"""The adapters mmspec ships, by name: which model classes each serves, and what the adapter
conformance suite (tests/suites/test_adapter_conformance.py) runs over. Each adapter module
registers its adapters where they are defined; a newly registered adapter fails the suite
until it has a tiny-model case there, so registering an adapter puts it under test."""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass

_ADAPTERS: dict[str, "AdapterInfo"] = {}
MODALITIES = ("image", "vlm", "speech")


@dataclass(frozen=True)
class AdapterInfo:
    """name; modality (``"image"``: TextToImage, ``"vlm"``: VisionLanguageGenerator,
    ``"speech"``: TextToSpeech); the adapter class; the model classes it serves (names)."""

    name: str
    modality: str
    adapter: type
    models: tuple[str, ...] = ()


def register_adapter(name: str, modality: str, adapter: type, models=()) -> None:
    """Register an adapter class under ``name`` for a modality (image, vlm, speech) and the model
    classes it serves; the adapter conformance suite then runs over it."""
    if modality not in MODALITIES:
        raise ValueError(f"modality={modality!r}: accepted one of {MODALITIES}")
    _ADAPTERS[name] = AdapterInfo(name, modality, adapter, tuple(models))


def adapters(modality: str | None = None) -> list[AdapterInfo]:
    """Every registered adapter (of one modality), by name (``import modalities`` registers
    the shipped ones)."""
    return [a for _, a in sorted(_ADAPTERS.items()) if modality in (None, a.modality)]


def generation_defaults(model) -> dict:
    """A model's own generation settings that a pipeline uses when the call gives none:
    ``guidance_scale`` from its generation config (MusicGen's released checkpoints: 3.0;
    None or 1 means no guidance)."""
    scale = getattr(getattr(model, "generation_config", None), "guidance_scale", None)
    return {} if scale is None else {"guidance_scale": float(scale)}


_VERBOSE = False


def set_verbose(on: bool) -> None:
    """Show transformers' and diffusers' loading progress bars and warnings (default: quiet;
    the recipes' ``--verbose``)."""
    global _VERBOSE
    _VERBOSE = bool(on)


@contextlib.contextmanager
def quiet_loading():
    """transformers' and diffusers' progress bars off and their logs at errors only, for the
    duration (restored after), unless ``set_verbose(True)``."""
    if _VERBOSE:
        yield
        return
    from diffusers.utils import logging as dlog
    from transformers.utils import logging as tlog

    saved = [(lib, lib.get_verbosity(), lib.is_progress_bar_enabled()) for lib in (tlog, dlog)]
    for lib, _, _ in saved:
        lib.set_verbosity_error()
        lib.disable_progress_bar()
    try:
        yield
    finally:
        for lib, level, bars in saved:
            lib.set_verbosity(level)
            if bars:
                lib.enable_progress_bar()


# transformers' loading is not safe to run beside other threads building modules (its
# empty-weights init patches torch.nn.Module process-wide: a module built meanwhile, or a
# concurrent load, can be left on the meta device); loads take turns.
_LOADING = threading.RLock()


def serialized(load):
    """A front door's ``from_pretrained`` made to take turns with every other load (safe to
    call from several threads: the web demo's concurrent first requests)."""
    import functools

    @functools.wraps(load)
    def call(*args, **kwargs):
        with _LOADING:
            return load(*args, **kwargs)
    return call


def load_pretrained(cls, path, **kwargs):
    """``cls.from_pretrained(path, **kwargs)``, quietly (``quiet_loading``), with errors that
    name the path: a local folder that does not exist, unreadable or truncated weights. Safe to
    call from several threads (loads take turns)."""
    import os

    path = os.fspath(path)
    # Hub ids are "name" or "org/name"; a path that starts like one or has more parts is local.
    looks_local = path.startswith((".", "/", "~")) or path.count("/") > 1
    if looks_local and not os.path.isdir(os.path.expanduser(path)):
        raise ValueError(f"{path!r}: no such model folder; accepted a folder that exists or a "
                         "Hugging Face id (org/name)")
    try:
        with _LOADING, quiet_loading():
            return cls.from_pretrained(path, **kwargs)
    except Exception as e:   # noqa: BLE001  (transformers, safetensors and OS errors alike)
        raise ValueError(f"{path}: could not load {cls.__name__}: {e}") from e
