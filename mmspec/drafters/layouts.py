"""Checkpoint layouts of draft heads: recognised from a folder, read into a head, written back.

Every front door's ``head=`` takes a folder in any registered layout (``load``);
``export(head, folder, layout)`` writes one. The registered layouts (``LAYOUTS``, in the
order a folder is tried against them):

    mmspec        mmspec's own ``DraftHead`` (config with ``feature_layers``)
    vllm          mmspec's own ``DraftHead`` for vLLM through mmspec's plugin
                  (``mmspec_vllm``: architecture ``MmspecDraftHeadEagle3``)
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

Which target layers an EAGLE-3 head fuses (``mmspec.drafters.eagle3.hidden_indices``): mmspec's ``feature_layers``
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

from dataclasses import dataclass
from pathlib import Path

from .eagle3 import (NARROWER, Eagle3Head, config_from_layer, default_feature_layers,
                     hidden_indices, layer_config)
from .files import CONFIG, WEIGHTS, local_config, read_config, read_tensors, tensor_names, write


class Layout:
    """A checkpoint layout: ``matches`` a folder's config, ``read`` it into a head attached to
    ``target``; layouts a head can be written in also ``write`` (``export``)."""

    name: str = ""
    writes: bool = False               # EAGLE-3 heads are written in it
    writes_draft_head: bool = False    # mmspec's own DraftHead is written in it

    def matches(self, config: dict, folder: Path) -> bool:
        """The folder (its ``config``) is in this layout."""
        raise NotImplementedError

    def read(self, folder: Path, config: dict, target):
        """The head in ``folder``, attached to ``target``."""
        raise NotImplementedError

    def check_head(self, head) -> None:
        """Refuse a head this layout does not write (default: EAGLE-3 heads only)."""
        if not isinstance(head, Eagle3Head):
            raise ValueError(f"export to {self.name!r}: accepted an Eagle3Head, not a "
                             f"{type(head).__name__} (mmspec's own DraftHead exports to "
                             "'vllm', for mmspec's vLLM plugin, and saves with save_pretrained)")

    def write(self, head, folder: Path, **kw) -> None:
        """Write ``head`` to ``folder`` in this layout."""
        raise ValueError(f"layout {self.name!r}: heads are read from it, not written "
                         f"(accepted layouts to write: {', '.join(writable())})")


LAYOUTS: list[Layout] = []


def register_layout(layout: Layout) -> Layout:
    """Add ``layout`` (tried after the ones before it)."""
    if any(known.name == layout.name for known in LAYOUTS):
        raise ValueError(f"layout {layout.name!r} is registered already")
    LAYOUTS.append(layout)
    return layout


def layout_named(name: str) -> Layout:
    for layout in LAYOUTS:
        if layout.name == name:
            return layout
    raise ValueError(f"layout {name!r}: accepted one of {', '.join(x.name for x in LAYOUTS)}")


def writable(arch: str = "eagle3") -> list[str]:
    """The layouts a head of ``arch`` can be written in: "eagle3" (an ``Eagle3Head``) or
    "draft-head" (mmspec's own ``DraftHead``: 'vllm', for mmspec's vLLM plugin)."""
    if arch not in ("eagle3", "draft-head"):
        raise ValueError(f"arch={arch!r}: accepted eagle3 or draft-head")
    return [x.name for x in LAYOUTS if (x.writes if arch == "eagle3" else x.writes_draft_head)]


def recognise(folder) -> Layout:
    """The layout of the head (or checkpoint) in ``folder``."""
    folder = Path(folder)
    config = read_config(folder)
    for layout in LAYOUTS:
        if layout.matches(config, folder):
            return layout
    raise ValueError(f"{folder}: a config of no known draft-head layout (accepted "
                     f"{', '.join(x.name for x in LAYOUTS)}; an EAGLE-3 head's config names "
                     "draft_vocab_size or speculators_model_type)")


def load(path, target):
    """The head in folder ``path``, in any registered layout, attached to ``target``."""
    folder = Path(path)
    return recognise(folder).read(folder, read_config(folder), target)


def export(head, folder, layout: str = "speculators", **kw) -> None:
    """Write ``head`` to ``folder`` in ``layout`` (one of ``writable()`` for an ``Eagle3Head``,
    'vllm' for mmspec's own ``DraftHead``): a folder the layout's engine reads without edits
    (a head of variants or layers that engine does not run is refused, naming them).
    Keywords: ``target`` (the verifier's name or path written in it; default the head's;
    'vllm': the target's local folder, read for its layer count and final norm),
    ``speculative_tokens`` (speculators: the chain length vLLM drafts; default 3)."""
    unknown = set(kw) - {"target", "speculative_tokens"}
    if unknown:
        raise ValueError(f"export: unknown keywords {sorted(unknown)} (accepted target, "
                         "speculative_tokens)")
    chosen = layout_named(layout)
    chosen.check_head(head)
    chosen.write(head, Path(folder), **kw)


class MmspecLayout(Layout):
    name = "mmspec"

    def matches(self, config, folder):
        return "feature_layers" in config and "speculators_model_type" not in config

    def read(self, folder, config, target):
        from .head import DraftHead

        return DraftHead.from_pretrained(folder, target)


class VllmLayout(Layout):
    """mmspec's own ``DraftHead`` for vLLM through mmspec's plugin (``mmspec_vllm``: the
    ``vllm.general_plugins`` entry point registers the architecture; its docstring lists the
    keys): the head's tensors as they are, its config nested under ``mmspec_head`` beside
    the keys vLLM reads, and a copy of the target's final norm where the head fuses
    ``hidden_states[N]`` (vLLM captures layer N before that norm)."""

    name, writes_draft_head = "vllm", True
    architecture = "MmspecDraftHeadEagle3"        # mmspec_vllm.ARCHITECTURE

    def matches(self, config, folder):
        return self.architecture in (config.get("architectures") or [])

    def read(self, folder, config, target):
        from .head import DraftHead, HeadConfig

        raw = dict(config.get("mmspec_head") or {})
        try:
            raw["feature_layers"] = tuple(raw["feature_layers"])
            head = DraftHead(HeadConfig(**raw))
        except (KeyError, TypeError) as e:
            raise ValueError(f"{folder / CONFIG}: no DraftHead config under mmspec_head "
                             f"({e})") from None
        tensors = read_tensors(folder)
        norm = tensors.pop("target_norm.weight", None)
        if (norm is None) != (config.get("mmspec_final_norm") is None):
            raise ValueError(f"{folder / WEIGHTS}: target_norm.weight and the config's "
                             "mmspec_final_norm: accepted both or neither")
        missing, unexpected = head.load_state_dict(tensors, strict=False)
        own_missing = [k for k in missing if not k.startswith(("decoder.model.embed_tokens",
                                                               "decoder.lm_head"))]
        if own_missing or unexpected:
            raise ValueError(f"{folder / WEIGHTS}: missing {own_missing}, unexpected "
                             f"{unexpected}")
        return head.attach(target) if target is not None else head

    def check_head(self, head):
        from .head import DraftHead

        if type(head) is not DraftHead or head.config.uncond_features:
            kind = ("a head fusing the unconditional branch (vLLM has no guidance)"
                    if type(head) is DraftHead else f"a {type(head).__name__}")
            raise ValueError(f"export to 'vllm': accepted mmspec's own token DraftHead "
                             f"(conditional features only), not {kind}"
                             + (" (an Eagle3Head exports to 'speculators', which vLLM serves "
                                "as it is)" if isinstance(head, Eagle3Head) else ""))

    def write(self, head, folder, target=None, speculative_tokens: int = 3):
        from dataclasses import asdict

        c = head.config
        name = target or c.target
        text = check_vllm_target(name, c.feature_layers)
        layers = text["num_hidden_layers"]
        llama = c.llama().to_dict()
        config = {k: llama[k] for k in (
            "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "rms_norm_eps", "hidden_act", "attention_bias",
            "mlp_bias", "max_position_embeddings", "vocab_size", "rope_parameters")}
        mine = asdict(c)
        mine["feature_layers"] = list(c.feature_layers)
        config.update(
            architectures=[self.architecture], model_type="llama", tie_word_embeddings=False,
            eagle_aux_hidden_state_layer_ids=sorted(set(c.feature_layers)),
            target_hidden_size=c.hidden_size, mmspec_head=mine,
            mmspec_final_norm=None, dtype=str(head.dtype).removeprefix("torch."))
        tensors = dict(head.state_to_save())
        if layers in c.feature_layers:
            config["mmspec_final_norm"] = {"layer": layers, "eps": _final_norm_eps(text, name)}
            tensors["target_norm.weight"] = _final_norm(Path(name))
        write(folder, config, tensors)


# the target's final norm (a text decoder's, or a VLM's language model's) by tensor name
FINAL_NORMS = ("model.norm.weight", "model.language_model.norm.weight",
               "language_model.model.norm.weight", "model.text_model.norm.weight")


def check_vllm_target(name, feature_layers=None) -> dict:
    """The text config of a target a head exports to 'vllm' for (its folder ``name``; the
    head's ``feature_layers``, default low, middle and high with the last), refused where
    vLLM cannot serve the head: not a local folder, M-RoPE positions (vLLM hands the drafter
    the temporal axis), or the last layer fused without a Llama-style final norm."""
    from .head import feature_layers_of

    text = local_config(name)
    text = text.get("text_config") or text
    layers = text.get("num_hidden_layers")
    if layers is None:
        raise ValueError(f"export to 'vllm': the target {name!r} is not a local folder with "
                         "a config.json (accepted target=its folder: its layer count, and "
                         "its final norm where the head fuses the last layer)")
    rope = [text.get(k) or {} for k in ("rope_parameters", "rope_scaling")]
    if any(isinstance(r, dict) and "mrope_section" in r for r in rope):
        raise ValueError(f"export to 'vllm': the target {name!r} takes M-RoPE positions, of "
                         "which vLLM hands a drafter the temporal axis where mmspec's head "
                         "counts tokens; accepted a target of 1-D positions")
    if layers in feature_layers_of(layers, feature_layers):
        _final_norm_eps(text, name)
    return text


def _final_norm_eps(text: dict, name: str) -> float:
    if "gemma" in str(text.get("model_type", "")) or "rms_norm_eps" not in text:
        raise ValueError(f"export to 'vllm': the target {name!r} ({text.get('model_type')}) has "
                         "no Llama-style final RMSNorm (weight x normalised, rms_norm_eps), "
                         "which the head's last fused layer is taken after")
    return float(text["rms_norm_eps"])


def _final_norm(folder: Path):
    names = set(tensor_names(folder))
    for name in FINAL_NORMS:
        if name in names:
            return read_tensors(folder, keep=lambda k, n=name: k == n)[name]
    raise ValueError(f"export to 'vllm': the target in {folder} has none of {list(FINAL_NORMS)} "
                     "(its final norm, which the head's last fused layer is taken after)")


# -- EAGLE-3 -------------------------------------------------------------------------------

class SpeculatorsLayout(Layout):
    """vLLM's ``speculators`` layout, the one ``Eagle3Head.save_pretrained`` writes."""

    name, writes = "speculators", True

    def matches(self, config, folder):
        return "speculators_model_type" in config

    def read(self, folder, config, target):
        return Eagle3Head.from_pretrained(folder, target)

    def write(self, head, folder, target=None, speculative_tokens: int = 3):
        head.save_pretrained(folder, target, speculative_tokens)


@dataclass
class FlatLayout(Layout):
    """The flat layouts (SafeAILab, SpecForge / SGLang, AngelSlim): the head's Llama config
    with ``draft_vocab_size``, one decoder layer named ``midlayer.*``; explicit layer ids in
    ``eagle_config`` are SGLang's (layer outputs)."""

    name: str = ""
    architecture: str = "LlamaForCausalLMEagle3"
    writes: bool = True
    default_layers_only: bool = False      # names no layers: heads of the default ones only

    def read(self, folder, config, target):
        if target is None:
            raise ValueError(f"{folder}: an EAGLE-3 head reads its target's sizes: accepted a "
                             "target model")
        tensors = {_canonical(k): v for k, v in read_tensors(folder).items()}
        try:
            head = Eagle3Head(self.head_config(config, target))
        except KeyError as e:
            raise ValueError(f"{folder / CONFIG}: the {self.name} layout's config lacks "
                             f"{e.args[0]!r}") from None
        return head.attach(target).load_checked(tensors, str(folder / WEIGHTS))

    def head_config(self, config, target):
        from ..sessions.causal_lm import _decoder_config

        if config.get("target_hidden_size") not in (None, config["hidden_size"]):
            raise ValueError(f"target_hidden_size {config['target_hidden_size']} != hidden_size "
                             f"{config['hidden_size']}: {NARROWER}")
        if config.get("num_hidden_layers", 1) != 1:
            raise ValueError(f"num_hidden_layers {config['num_hidden_layers']}: the {self.name} "
                             "layout holds one decoder layer (midlayer); accepted 1")
        if config.get("norm_output") is False:
            raise ValueError("norm_output false (SpecForge: logits from the un-normed output): "
                             "no serving engine draws logits that way; accepted true or absent")
        ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        layers = (hidden_indices(ids, outputs=True) if ids
                  else default_feature_layers(_decoder_config(target).num_hidden_layers))
        return config_from_layer(
            config, vocab_size=config["vocab_size"],
            draft_vocab_size=config.get("draft_vocab_size"), feature_layers=layers,
            norm_before_residual=bool(config.get("norm_before_residual", False)),
            norm_before_fc=bool(config.get("norm_before_fc", False)),
            fc_norm=bool(config.get("fc_norm", False)),
            merged_embeds=bool(config.get("mmspec_merged_embeds", False)))

    def flat_config(self, head, target=None) -> dict:
        c = head.config
        if c.norm_output or c.norm_before_fc or c.fc_norm or c.norm_before_residual \
                or c.num_layers != 1:
            raise ValueError(f"the {self.name} layout's engine runs one decoder layer whose "
                             "output is fed back before the final norm, with no norm before "
                             "fc, no fc_norm and the residual normed after it: accepted such "
                             "a head (export this one to 'speculators')")
        if self.default_layers_only and (head.target_layers is None or c.feature_layers !=
                                         default_feature_layers(head.target_layers)):
            raise ValueError(f"the {self.name} layout names no layers (its engine fuses [2, N/2, "
                             f"N - 3]): accepted a head of those layers attached to its target; "
                             f"this one fuses {list(c.feature_layers)} (export it to "
                             "'speculators' or 'sglang', which name them)")
        config = layer_config(c, "rope_scaling")
        config.update(architectures=[self.architecture], draft_vocab_size=c.draft_vocab_size,
                      torch_dtype=str(head.fc.weight.dtype).removeprefix("torch."))
        if c.merged_embeds:
            config["mmspec_merged_embeds"] = True
        return config

    def write(self, head, folder, target=None, speculative_tokens: int = 3):
        tensors = {("midlayer." + k[len("layers.0."):] if k.startswith("layers.0.") else k): v
                   for k, v in head.state_to_save().items()}
        write(folder, self.flat_config(head, target), tensors)


def _canonical(name: str) -> str:
    """A flat layout's tensor name as ``Eagle3Head.state_to_save`` names it."""
    return "layers.0." + name[len("midlayer."):] if name.startswith("midlayer.") else name


class SglangLayout(FlatLayout):
    """SpecForge's export, read by SGLang: explicit layer ids written in ``eagle_config`` as
    SGLang counts them (layer outputs), and the target's model type."""

    def __init__(self):
        super().__init__(name="sglang")

    def matches(self, config, folder):
        return (self.architecture in (config.get("architectures") or [])
                and ("target_model_type" in config or "eagle_config" in config))

    def flat_config(self, head, target=None):
        c = head.config
        config = super().flat_config(head, target)
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids":
                                  [i - 1 for i in c.feature_layers],
                                  "use_aux_hidden_state": True}
        config["target_model_type"] = local_config(target or c.target).get("model_type", "")
        return config


class AngelSlimLayout(FlatLayout):
    def __init__(self):
        super().__init__(name="angelslim", architecture="Eagle3LlamaForCausalLM",
                         default_layers_only=True)

    def matches(self, config, folder):
        archs = config.get("architectures") or []
        return "modal_type" in config or any(a.endswith("Eagle3LlamaForCausalLM") and
                                             a != "LlamaForCausalLMEagle3" for a in archs)

    def flat_config(self, head, target=None):
        config = super().flat_config(head, target)
        config["modal_type"] = "VLM" if head.config.mrope_section else "LLM"
        return config


class SafeAILabLayout(FlatLayout):
    def __init__(self):
        super().__init__(name="safeailab", default_layers_only=True)

    def matches(self, config, folder):
        return "draft_vocab_size" in config and "feature_layers" not in config


# -- MTP modules -------------------------------------------------------------------------------

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


for _layout in (MmspecLayout(), VllmLayout(), SpeculatorsLayout(), AngelSlimLayout(),
                SglangLayout(), SafeAILabLayout(), QwenMtpLayout(), DeepSeekMtpLayout()):
    register_layout(_layout)
