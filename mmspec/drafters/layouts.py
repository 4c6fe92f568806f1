"""Checkpoint layouts of draft heads: recognised from a folder, read into a head, written back.

Every front door's ``head=`` takes a folder in any registered layout (``load``);
``export(head, folder, layout)`` writes one. The registered layouts (``LAYOUTS``, in the
order a folder is tried against them):

    mmspec        mmspec's own ``DraftHead`` (config with ``feature_layers``)
    speculators   vLLM's ``speculators`` EAGLE-3 (``speculators_model_type: eagle3``,
                  ``transformer_layer_config``, ``layers.{i}.*``); vLLM serves it as it is
    angelslim     Tencent AngelSlim EAGLE-3 (``Eagle3LlamaForCausalLM``, ``modal_type``)
    sglang        SpecForge's export for SGLang (``LlamaForCausalLMEagle3`` with
                  ``target_model_type`` or ``eagle_config``, ``midlayer.*``)
    safeailab     SafeAILab EAGLE-3 (a flat Llama config with ``draft_vocab_size``,
                  ``midlayer.*``)
    qwen-mtp      a Qwen3.5 / Qwen3-Next checkpoint's own ``mtp.*`` module
    deepseek-mtp  a DeepSeek-V3 / GLM-4.5-style checkpoint's MTP layers
                  (``model.layers.{N+k}.{enorm, hnorm, eh_proj, shared_head}`` + a block)

Which target layers an EAGLE-3 head fuses (``hidden_indices``): mmspec's ``feature_layers``
are indices into transformers' ``hidden_states``, where index k is the residual stream
entering layer k (0: the embeddings). The field names them three ways:

- vLLM and ``speculators`` (``eagle_aux_hidden_state_layer_ids``): id k = index k;
- SGLang's explicit ids (``eagle_config.eagle_aux_hidden_state_layer_ids``, as SpecForge and
  AngelSlim write them) are layer outputs: id k = index k + 1;
- with no ids, every engine fuses vLLM's default [2, N/2, N - 3] (SpecForge's and AngelSlim's
  trainers: [1, N/2 - 1, N - 4] as outputs, the same layers).

Index N is refused: vLLM's id N is the last layer's output before the final norm,
transformers' ``hidden_states[N]`` the one after it. Layers are fused in ascending order, as
the engines capture them. A tensor the layout does not use, or one it needs and lacks, is an
error naming it; so is a head made for another target (sizes named).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

CONFIG = "config.json"
WEIGHTS = "model.safetensors"


# -- which layers --------------------------------------------------------------------------

def default_feature_layers(num_layers: int) -> tuple[int, ...]:
    """The field's default fused layers for a target of ``num_layers`` layers: hidden_states
    indices [2, N/2, N - 3] (vLLM's ids; SpecForge's [1, N/2 - 1, N - 4] as outputs)."""
    layers = (2, num_layers // 2, num_layers - 3)
    if len(set(layers)) != 3 or not 0 < min(layers) or sorted(layers) != list(layers):
        raise ValueError(f"a target of {num_layers} layers: the field's default layers [2, N/2, "
                         f"N - 3] = {list(layers)} are not three distinct layers in order: "
                         "accepted feature layers given explicitly (--feature-layers)")
    return layers


def check_feature_layers(layers, num_layers: int) -> tuple[int, ...]:
    """``layers`` (hidden_states indices) checked against a target of ``num_layers`` layers."""
    layers = tuple(layers)
    if num_layers in layers:
        raise ValueError(f"feature layer {num_layers} (the last layer's output): vLLM's id "
                         f"{num_layers} is taken before the final norm, transformers' "
                         f"hidden_states[{num_layers}] after it; accepted indices in [0, "
                         f"{num_layers - 1}]")
    if any(not 0 <= i < num_layers for i in layers) or len(set(layers)) != len(layers):
        raise ValueError(f"feature layers {list(layers)}: accepted distinct indices in [0, "
                         f"{num_layers - 1}] (a target of {num_layers} layers)")
    return layers


def hidden_indices(ids, outputs: bool) -> tuple[int, ...]:
    """hidden_states indices of the field's layer ``ids``: vLLM's as they are, SGLang's
    (``outputs``: layer outputs) + 1; ascending, as the engines fuse them."""
    out = sorted(int(i) + int(outputs) for i in ids)
    if len(set(out)) != len(out):
        raise ValueError(f"layer ids {list(ids)}: accepted distinct ids")
    return tuple(out)


# -- files -----------------------------------------------------------------------------------

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


# -- the layouts ------------------------------------------------------------------------------

class Layout:
    """A checkpoint layout: ``matches`` a folder's config, ``read`` it into a head attached to
    ``target``; layouts a head can be written in also ``write`` (``export``)."""

    name: str = ""
    writes: bool = False

    def matches(self, config: dict, folder: Path) -> bool:
        raise NotImplementedError

    def read(self, folder: Path, config: dict, target):
        raise NotImplementedError

    def write(self, head, folder: Path, **kw) -> None:
        raise ValueError(f"layout {self.name!r}: heads are read from it, not written "
                         f"(accepted layouts to write: {', '.join(writable())})")


LAYOUTS: list[Layout] = []


def register_layout(layout: Layout) -> Layout:
    """Add ``layout`` (tried after the ones before it)."""
    if any(l.name == layout.name for l in LAYOUTS):
        raise ValueError(f"layout {layout.name!r} is registered already")
    LAYOUTS.append(layout)
    return layout


def layout_named(name: str) -> Layout:
    for layout in LAYOUTS:
        if layout.name == name:
            return layout
    raise ValueError(f"layout {name!r}: accepted one of {', '.join(l.name for l in LAYOUTS)}")


def writable() -> list[str]:
    return [l.name for l in LAYOUTS if l.writes]


def recognise(folder) -> Layout:
    """The layout of the head (or checkpoint) in ``folder``."""
    folder = Path(folder)
    config = read_config(folder)
    for layout in LAYOUTS:
        if layout.matches(config, folder):
            return layout
    raise ValueError(f"{folder}: a config of no known draft-head layout (accepted "
                     f"{', '.join(l.name for l in LAYOUTS)}; an EAGLE-3 head's config names "
                     "draft_vocab_size or speculators_model_type)")


def load(path, target):
    """The head in folder ``path``, in any registered layout, attached to ``target``."""
    folder = Path(path)
    return recognise(folder).read(folder, read_config(folder), target)


def export(head, folder, layout: str = "speculators", **kw) -> None:
    """Write ``head`` to ``folder`` in ``layout`` (one of ``writable()``): a folder the layout's
    engine reads without edits. Keywords: ``target`` (the verifier's name or path written in
    it; default the head's), ``speculative_tokens`` (speculators: the chain length vLLM drafts;
    default 3)."""
    layout_named(layout).write(head, Path(folder), **kw)


class MmspecLayout(Layout):
    name = "mmspec"

    def matches(self, config, folder):
        return "feature_layers" in config and "speculators_model_type" not in config

    def read(self, folder, config, target):
        from .head import DraftHead

        return DraftHead.from_pretrained(folder, target)


# -- EAGLE-3 -------------------------------------------------------------------------------

FLAT_REFUSED = {"target_hidden_size": "a head narrower or wider than its target (its own "
                                      "embeddings)"}


def _rope(config: dict) -> tuple[float, dict | None, tuple | None, bool]:
    """(rope_theta, other scaling or None, mrope_section or None, interleaved) of a Llama
    config dict in any transformers version's spelling."""
    scaling = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    theta = float(scaling.pop("rope_theta", config.get("rope_theta", 10000.0)))
    section = scaling.pop("mrope_section", None)
    interleaved = bool(scaling.pop("mrope_interleaved", False))
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind in ("default", "mrope"):
        scaling = None
    return theta, scaling, tuple(section) if section else None, interleaved


def eagle3_config(layer: dict, *, vocab_size: int, draft_vocab_size: int | None,
                  feature_layers, target: str = "", **variants):
    """An ``Eagle3Config`` from a Llama config dict of the head's layers (flat layouts: the
    config itself; speculators: ``transformer_layer_config``)."""
    from .eagle3 import Eagle3Config

    if layer.get("model_type", "llama") != "llama":
        raise ValueError(f"model_type {layer.get('model_type')!r} decoder layers: accepted "
                         "llama (EAGLE-3 heads in the Llama layout)")
    theta, scaling, section, interleaved = _rope(layer)
    h = layer["hidden_size"]
    heads = layer["num_attention_heads"]
    return Eagle3Config(
        hidden_size=h, intermediate_size=layer["intermediate_size"], num_attention_heads=heads,
        num_key_value_heads=layer.get("num_key_value_heads") or heads,
        head_dim=layer.get("head_dim"), num_layers=layer.get("num_hidden_layers", 1),
        rms_norm_eps=layer.get("rms_norm_eps", 1e-6), hidden_act=layer.get("hidden_act", "silu"),
        attention_bias=bool(layer.get("attention_bias", False)),
        mlp_bias=bool(layer.get("mlp_bias", False)), rope_theta=theta, rope_scaling=scaling,
        max_position_embeddings=layer.get("max_position_embeddings", 4096),
        vocab_size=vocab_size, draft_vocab_size=draft_vocab_size or vocab_size,
        feature_layers=feature_layers, mrope_section=section, mrope_interleaved=interleaved,
        target=target, **variants)


def _layer_config(c, rope_key: str = "rope_parameters") -> dict:
    """The Llama config dict of an ``Eagle3Config``'s layers, as the field writes it: rotary
    settings under ``rope_parameters`` (transformers 5, speculators) or, with ``rope_key``
    "rope_scaling", beside ``rope_theta`` (the flat layouts' transformers-4 spelling)."""
    rope = dict(c.rope_scaling or {})
    rope.setdefault("rope_type", "default")
    if c.mrope_section is not None:
        rope.update(mrope_section=list(c.mrope_section), mrope_interleaved=c.mrope_interleaved)
    out = dict(model_type="llama", architectures=["LlamaForCausalLM"],
               hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
               num_hidden_layers=c.num_layers, num_attention_heads=c.num_attention_heads,
               num_key_value_heads=c.num_key_value_heads, head_dim=c.dim,
               rms_norm_eps=c.rms_norm_eps, hidden_act=c.hidden_act,
               attention_bias=c.attention_bias, mlp_bias=c.mlp_bias,
               max_position_embeddings=c.max_position_embeddings, vocab_size=c.vocab_size,
               tie_word_embeddings=False)
    if rope_key == "rope_parameters":
        out["rope_parameters"] = dict(rope, rope_theta=c.rope_theta)
    else:
        out.update(rope_theta=c.rope_theta,
                   rope_scaling=None if rope == {"rope_type": "default"} else rope)
    return out


@dataclass
class Eagle3Layout(Layout):
    """An EAGLE-3 layout: how its config names the head's settings and layer ids, and its
    tensors' names (``prefix`` for the first decoder layer's, in place of ``layers.0.``)."""

    name: str = ""
    prefix: str = "layers.0."
    writes: bool = True

    def head_config(self, config: dict, target):
        raise NotImplementedError

    def read(self, folder, config, target):
        from .eagle3 import Eagle3Head

        if target is None:
            raise ValueError(f"{folder}: an EAGLE-3 head reads its target's sizes: accepted a "
                             "target model")
        tensors = {self.canonical(k): v for k, v in read_tensors(folder).items()}
        try:
            head = Eagle3Head(self.head_config(config, target))
        except KeyError as e:
            raise ValueError(f"{folder / CONFIG}: the {self.name} layout's config lacks "
                             f"{e.args[0]!r}") from None
        head.attach(target)
        _shared_embeddings(tensors, head, folder / WEIGHTS)
        head.load_state(tensors, str(folder / WEIGHTS))
        return head

    def canonical(self, name: str) -> str:
        return "layers.0." + name[len(self.prefix):] if name.startswith(self.prefix) else name

    def checkpoint_name(self, name: str) -> str:
        return self.prefix + name[len("layers.0."):] if name.startswith("layers.0.") else name

    def tensors(self, head) -> dict:
        return {self.checkpoint_name(k): v for k, v in head.state_to_save().items()}


def _target_layers(target) -> int:
    from ..session import _decoder_config

    return _decoder_config(target).num_hidden_layers


def _vocab(target) -> int:
    from ..session import output_vocab_size

    return output_vocab_size(target)


def _shared_embeddings(tensors: dict, head, where) -> None:
    """A checkpoint's ``embed_tokens.weight`` must be the target's input embeddings (a copy,
    as the field's trainers save it); it is checked and dropped, the target's shared."""
    emb = tensors.pop("embed_tokens.weight", None)
    if emb is None:
        return
    mine = head.shared[0].weight
    if emb.shape != mine.shape or not torch.equal(emb, mine.detach().to("cpu", emb.dtype)):
        raise ValueError(f"{where}: embed_tokens.weight {list(emb.shape)} is not the target's "
                         f"input embeddings {list(mine.shape)}: heads with their own trained "
                         "embeddings are not supported (accepted a head trained with the "
                         "target's embeddings frozen, as the field's trainers do by default)")


class SpeculatorsLayout(Eagle3Layout):
    def __init__(self):
        super().__init__(name="speculators", prefix="layers.0.")

    def matches(self, config, folder):
        return "speculators_model_type" in config

    def head_config(self, config, target):
        kind = config.get("speculators_model_type")
        if kind != "eagle3":
            raise ValueError(f"speculators_model_type {kind!r}: accepted 'eagle3'")
        layer = config.get("transformer_layer_config")
        if not isinstance(layer, dict):
            raise ValueError("a speculators config without transformer_layer_config: accepted "
                             "the layout speculators writes")
        n = _target_layers(target)
        ids = config.get("eagle_aux_hidden_state_layer_ids")
        layers = hidden_indices(ids, outputs=False) if ids else default_feature_layers(n)
        th = config.get("target_hidden_size")
        if th is not None and th != layer["hidden_size"]:
            raise ValueError(f"target_hidden_size {th} != hidden_size {layer['hidden_size']}: "
                             f"{FLAT_REFUSED['target_hidden_size']} is not supported")
        verifier = config.get("speculators_config", {}).get("verifier", {})
        return eagle3_config(layer, vocab_size=layer["vocab_size"],
                             draft_vocab_size=config.get("draft_vocab_size"),
                             feature_layers=layers, target=verifier.get("name_or_path") or "",
                             norm_before_residual=bool(config.get("norm_before_residual", False)),
                             norm_before_fc=bool(config.get("norm_before_fc", False)),
                             fc_norm=bool(config.get("fc_norm", False)),
                             norm_output=bool(config.get("norm_output", False)))

    def write(self, head, folder, target=None, speculative_tokens: int = 3, **kw):
        _check_kw(kw)
        c = head.config
        name = target or c.target
        dtype = str(head.fc.weight.dtype).removeprefix("torch.")
        layer = _layer_config(c)
        config = {
            "architectures": ["Eagle3DraftModel"],
            "speculators_model_type": "eagle3",
            "speculators_version": "0.9.0",
            "speculators_config": {
                "algorithm": "eagle3",
                "proposal_methods": [{"proposal_type": "greedy",
                                      "speculative_tokens": int(speculative_tokens),
                                      "verifier_accept_k": 1, "accept_tolerance": 0.0}],
                "default_proposal_method": "greedy",
                "verifier": {"name_or_path": name, "architectures": _architectures(name)}},
            "transformer_layer_config": layer,
            "draft_vocab_size": c.draft_vocab_size,
            "target_hidden_size": c.hidden_size,
            "eagle_aux_hidden_state_layer_ids": list(c.feature_layers),
            # vLLM's reader defaults norm_before_residual to True: every flag written
            "norm_before_residual": c.norm_before_residual, "norm_before_fc": c.norm_before_fc,
            "fc_norm": c.fc_norm, "norm_output": c.norm_output,
            "embed_requires_grad": False, "dtype": dtype,
        }
        write(folder, config, self.tensors(head))


def _architectures(name: str) -> list:
    """The verifier's architectures from its config, where ``name`` is a local folder."""
    path = Path(name) / CONFIG if name else None
    if path is not None and path.is_file():
        return json.loads(path.read_text()).get("architectures") or []
    return []


def _check_kw(kw: dict) -> None:
    if kw:
        raise ValueError(f"export: unknown keywords {sorted(kw)} (accepted target, "
                         "speculative_tokens)")


class FlatLayout(Eagle3Layout):
    """The flat layouts (SafeAILab, SpecForge / SGLang, AngelSlim): the head's Llama config with
    ``draft_vocab_size``, its first layer named ``midlayer.*``; explicit layer ids in
    ``eagle_config`` are SGLang's (layer outputs)."""

    architecture = "LlamaForCausalLMEagle3"

    def head_config(self, config, target):
        for key, what in FLAT_REFUSED.items():
            if config.get(key) not in (None, config["hidden_size"]):
                raise ValueError(f"{key} {config[key]} != hidden_size {config['hidden_size']}: "
                                 f"{what} is not supported")
        if config.get("num_hidden_layers", 1) != 1:
            raise ValueError(f"num_hidden_layers {config['num_hidden_layers']}: the {self.name} "
                             "layout holds one decoder layer (midlayer); accepted 1")
        if config.get("norm_output") is False:
            raise ValueError("norm_output false (SpecForge: logits from the un-normed output): "
                             "no serving engine draws logits that way; accepted true or absent")
        ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        layers = (hidden_indices(ids, outputs=True) if ids
                  else default_feature_layers(_target_layers(target)))
        return eagle3_config(config, vocab_size=config["vocab_size"],
                             draft_vocab_size=config.get("draft_vocab_size"),
                             feature_layers=layers,
                             norm_before_residual=bool(config.get("norm_before_residual", False)),
                             norm_before_fc=bool(config.get("norm_before_fc", False)),
                             fc_norm=bool(config.get("fc_norm", False)))

    def flat_config(self, head, target=None) -> dict:
        c = head.config
        if c.norm_output or c.norm_before_fc or c.num_layers != 1:
            raise ValueError(f"the {self.name} layout holds one decoder layer whose output is "
                             "fed back before the final norm, with no norm before fc: "
                             "accepted such a head (export this one to 'speculators')")
        config = _layer_config(c, "rope_scaling")
        config.update(architectures=[self.architecture], draft_vocab_size=c.draft_vocab_size,
                      torch_dtype=str(head.fc.weight.dtype).removeprefix("torch."))
        if c.fc_norm:
            config["fc_norm"] = True
        if c.norm_before_residual:
            config["norm_before_residual"] = True
        return config

    def write(self, head, folder, target=None, **kw):
        kw.pop("speculative_tokens", None)
        _check_kw(kw)
        write(folder, self.flat_config(head, target), self.tensors(head))

    def check_default_layers(self, head) -> None:
        """This layout names no layers (its engine fuses the default ones): refuse others."""
        n = head.target_layers
        layers = head.config.feature_layers
        if n is None or layers != default_feature_layers(n):
            raise ValueError(f"the {self.name} layout names no layers (its engine fuses [2, N/2, "
                             f"N - 3]): accepted a head of those layers attached to its target; "
                             f"this one fuses {list(layers)} (export it to 'speculators' or "
                             "'sglang', which name them)")


class SglangLayout(FlatLayout):
    """SpecForge's export, read by SGLang: explicit layer ids written in ``eagle_config`` as
    SGLang counts them (layer outputs), and the target's model type."""

    def __init__(self):
        super().__init__(name="sglang", prefix="midlayer.")

    def matches(self, config, folder):
        return (self.architecture in (config.get("architectures") or [])
                and ("target_model_type" in config or "eagle_config" in config))

    def flat_config(self, head, target=None):
        c = head.config
        if c.fc_norm or c.norm_before_residual:
            raise ValueError("SGLang's EAGLE-3 model reads no fc_norm and norms the residual "
                             "after it: accepted a head without fc_norm and "
                             "norm_before_residual (export this one to 'speculators')")
        config = super().flat_config(head, target)
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids":
                                  [i - 1 for i in c.feature_layers],
                                  "use_aux_hidden_state": True}
        name = target or c.target
        path = Path(name) / CONFIG if name else None
        if path is not None and path.is_file():
            config["target_model_type"] = json.loads(path.read_text()).get("model_type", "")
        else:
            config["target_model_type"] = ""
        return config


class AngelSlimLayout(FlatLayout):
    architecture = "Eagle3LlamaForCausalLM"

    def __init__(self):
        super().__init__(name="angelslim", prefix="midlayer.")

    def matches(self, config, folder):
        archs = config.get("architectures") or []
        return "modal_type" in config or any(a.endswith("Eagle3LlamaForCausalLM") and
                                             a != "LlamaForCausalLMEagle3" for a in archs)

    def flat_config(self, head, target=None):
        self.check_default_layers(head)
        config = super().flat_config(head, target)
        config["modal_type"] = "VLM" if head.config.mrope_section else "LLM"
        return config


class SafeAILabLayout(FlatLayout):
    def __init__(self):
        super().__init__(name="safeailab", prefix="midlayer.")

    def matches(self, config, folder):
        return "draft_vocab_size" in config and "feature_layers" not in config

    def flat_config(self, head, target=None):
        self.check_default_layers(head)
        return super().flat_config(head, target)


# -- MTP modules -------------------------------------------------------------------------------

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


class QwenMtpLayout(Layout):
    name = "qwen-mtp"

    def matches(self, config, folder):
        return any(k.startswith("mtp.") for k in tensor_names(folder))

    def read(self, folder, config, target):
        from .mtp import MtpHead

        return MtpHead.from_checkpoint(folder, target)


class DeepSeekMtpLayout(Layout):
    name = "deepseek-mtp"

    def matches(self, config, folder):
        text = config.get("text_config", config)
        return bool(text.get("num_nextn_predict_layers") or text.get("num_mtp_layers"))

    def read(self, folder, config, target):
        from .mtp import DeepSeekMtpHead

        return DeepSeekMtpHead.from_checkpoint(folder, target)


for _layout in (MmspecLayout(), SpeculatorsLayout(), AngelSlimLayout(), SglangLayout(),
                SafeAILabLayout(), QwenMtpLayout(), DeepSeekMtpLayout()):
    register_layout(_layout)
