"""A checkpoint's own multi-token-prediction module as a draft head: Qwen3.5 and Qwen3-Next
(``MtpHead``), DeepSeek-V3 style (``DeepSeekMtpHead``).

Qwen3.5 checkpoints ship one MTP layer next to the model's weights (``mtp.*`` tensors), which
transformers drops when it loads the model. It is a draft head of the same shape as
``DraftHead`` (module ``mmspec.drafters.head``), with the checkpoint's own weights:

    e   = pre_fc_norm_embedding(embed(x_{t+1}))     the target's input embeddings
    f   = pre_fc_norm_hidden(h_t)                   the target's last hidden state (normed
                                                    output), or the head's own output
    g_t = norm(layer(fc(concat(e, f))))             one full-attention decoder layer of the
                                                    target's kind, its own cache
    q   = softmax(lm_head(g_t))                     the target's output head

``MtpHead.from_checkpoint(folder, target)`` reads the ``mtp.*`` tensors from the folder's
safetensors files (one file or a sharded index) and attaches the head to ``target``; it
drafts through ``FeatureDrafter`` (``method="head"``, ``head=``) like a trained head: chains
on Qwen3.5, whose linear-attention layers take no tree steps. Checkpoint names:
``mtp.fc``, ``mtp.pre_fc_norm_embedding``, ``mtp.pre_fc_norm_hidden``, ``mtp.layers.0.*``
(the decoder layer) and ``mtp.norm``.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from torch import nn

from .files import read_config, read_tensors
from .head import DraftHead, HeadConfig

PREFIX = "mtp."
# checkpoint name -> the head's (``mtp.layers.0.*`` -> ``decoder.model.layers.0.*``)
NAMES = {"fc.": "fuse.", "pre_fc_norm_embedding.": "norm_embed.",
         "pre_fc_norm_hidden.": "norm_hidden.", "norm.": "decoder.model.norm.",
         "layers.0.": "decoder.model.layers.0."}


def head_name(name: str) -> str | None:
    """The head's parameter for a checkpoint tensor ``mtp.*`` (None: not one of its)."""
    rest = name[len(PREFIX):]
    for src, dst in NAMES.items():
        if rest.startswith(src):
            return dst + rest[len(src):]
    return None


def mtp_tensors(folder) -> dict[str, torch.Tensor]:
    """The ``mtp.*`` tensors of a checkpoint folder (``model.safetensors`` or the files a
    ``model.safetensors.index.json`` names for them), read without loading the rest."""
    out = read_tensors(Path(folder), keep=lambda name: name.startswith(PREFIX))
    if not out:
        raise ValueError(f"{folder}: the checkpoint holds no {PREFIX}* tensors (no native MTP "
                         f"module{_held(folder)}): accepted a checkpoint that ships one (Qwen3.5, "
                         "Qwen3-Next), or train a head with recipes.train.draft_head")
    return out


# Config keys of the draft-head layouts (mmspec's own; the EAGLE-3 checkpoints')
HEAD_KEYS = ("feature_layers", "draft_vocab_size", "speculators_model_type", "eagle_config")


def _held(folder) -> str:
    """What a folder without MTP tensors holds instead, when its config is a draft head's:
    how to pass it (an empty string otherwise)."""
    try:
        config = read_config(Path(folder))
    except ValueError:
        return ""
    if not any(key in config for key in HEAD_KEYS):
        return ""
    return ("; it holds a draft head: pass the folder as head= (--head on the command line), "
            "which reads every head layout")


class MtpHead(DraftHead):
    """A checkpoint's MTP module (module docstring), a ``DraftHead`` for ``FeatureDrafter``."""

    first_pair = False          # trained without a pair for the first token (``DraftHead``)

    def __init__(self, target):
        nn.Module.__init__(self)
        from transformers import AutoModelForCausalLM

        from ..sessions.causal_lm import _decoder_config

        from ..model_facts import output_vocab_size

        text = _decoder_config(target)
        one = copy.deepcopy(text)
        one.num_hidden_layers = 1
        if hasattr(one, "layer_types"):
            one.layer_types = ["full_attention"]
        d = text.hidden_size
        self.config = HeadConfig(hidden_size=d, feature_layers=(text.num_hidden_layers,),
                                 vocab_size=output_vocab_size(target),
                                 target=getattr(target, "name_or_path", "") or "")
        self.decoder = AutoModelForCausalLM.from_config(one)
        norm = type(self.decoder.model.norm)
        eps = getattr(text, "rms_norm_eps", 1e-6)
        self.reduce = nn.Identity()        # the target's normed output, as the checkpoint's
        self.norm_embed, self.norm_hidden = norm(d, eps=eps), norm(d, eps=eps)
        self.fuse = nn.Linear(2 * d, d, bias=False)

    def inputs(self, token_embeds: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        return self.fuse(torch.cat([self.norm_embed(token_embeds), self.norm_hidden(features)],
                                   -1))

    @classmethod
    def from_checkpoint(cls, folder, target) -> "MtpHead":
        """The MTP module of the checkpoint in ``folder`` (the target's own), attached to
        ``target``."""
        tensors = mtp_tensors(folder)
        head = cls(target)
        own = head.state_to_save()
        state, unfit = {}, []
        for name, t in tensors.items():
            mapped = head_name(name)
            if mapped in own and tuple(own[mapped].shape) == tuple(t.shape):
                state[mapped] = t
            else:
                unfit.append(name)
        missing = sorted(set(own) - set(state))
        if unfit or missing:
            raise ValueError(f"{folder}: MTP tensors that do not fit one "
                             f"{type(head.decoder).__name__} layer of the target's sizes: "
                             f"unexpected or misshaped {unfit[:4]}, missing {missing[:4]} "
                             "(accepted the target's own checkpoint, one MTP layer)")
        head.load_state_dict(state, strict=False)
        return head.attach(target)

    def save_pretrained(self, path) -> None:
        raise ValueError("an MTP head is the checkpoint's own: load it again with "
                         "MtpHead.from_checkpoint(folder, target) (save_pretrained writes "
                         "trained heads)")


class DeepSeekMtpHead(DraftHead):
    """A DeepSeek-V3-style checkpoint's MTP layer as a draft head (DeepSeek-V3, GLM-4.5 and
    the other classes transformers gives ``num_mtp_layers``): checkpoint tensors
    ``model.layers.{N}.{enorm, hnorm, eh_proj, shared_head.norm}`` and a decoder block of the
    target's kind (an MoE block where the target's later layers are), read by transformers'
    own ``MtpModel`` (its renamings and expert packing):

        g_t = post_norm(block(eh_proj(concat(enorm(embed(x_{t+1})), hnorm(h_t)))))
        q   = softmax(lm_head(g_t))                 the target's output head, shared

    h_t is the target's last hidden state (normed output), then the head's own g for further
    drafts, as transformers' ``MTPCandidateGenerator`` and vLLM's MTP proposer chain it.
    Checkpoints of one MTP layer (DeepSeek-V3's, GLM-4.5's)."""

    first_pair = False

    def __init__(self, target, mtp_model):
        nn.Module.__init__(self)
        from transformers import AutoModelForCausalLM

        from ..sessions.causal_lm import _decoder_config

        from ..model_facts import output_vocab_size

        text = _decoder_config(target)
        one = target.config.get_mtp_config()       # transformers': one block of the MTP kind
        if one.num_hidden_layers != 1:
            raise ValueError(f"num_mtp_layers={one.num_hidden_layers}: accepted checkpoints of "
                             "one MTP layer (a head drafts by feeding its own output back)")
        layer = mtp_model.layers[0]
        self.config = HeadConfig(hidden_size=text.hidden_size,
                                 feature_layers=(text.num_hidden_layers,),
                                 vocab_size=output_vocab_size(target),
                                 target=getattr(target, "name_or_path", "") or "")
        # a one-layer model of the target's class around MtpModel's own modules (built on the
        # meta device: its tables and block are replaced, nothing of it is allocated)
        with torch.device("meta"):
            self.decoder = AutoModelForCausalLM.from_config(one)
        model = self.decoder.model
        model.layers[0] = layer.mtp_block
        model.rotary_emb = mtp_model.rotary_emb
        norm = layer.post_norm if layer.use_post_norm else (
            mtp_model.shared_post_norm if mtp_model.use_shared_post_norm else None)
        model.norm = nn.Identity() if norm is None else norm
        self.decoder.lm_head = nn.Identity()          # the target's, at ``attach``
        self.reduce = nn.Identity()        # the target's normed output, as the checkpoint's
        self.enorm, self.hnorm, self.fuse = layer.enorm, layer.hnorm, layer.eh_proj
        self.hidden_first = bool(getattr(one, "mtp_hidden_states_first", False))

    def inputs(self, token_embeds: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        parts = [self.enorm(token_embeds), self.hnorm(features)]
        return self.fuse(torch.cat(parts[::-1] if self.hidden_first else parts, -1))

    @classmethod
    def from_checkpoint(cls, folder, target) -> "DeepSeekMtpHead":
        """The MTP layer of the checkpoint in ``folder``: the target's own, loaded from it
        (``target.config.name_or_path`` must be ``folder``), attached to ``target``."""
        own = Path(getattr(target.config, "name_or_path", "") or "")
        if not own.is_dir() or own.resolve() != Path(folder).resolve():
            raise ValueError(f"{folder}: the deepseek-mtp layout reads the MTP layer from the "
                             "target's own checkpoint: accepted the folder the target was "
                             f"loaded from ({str(own) or 'unknown: load it with from_pretrained'})")
        if not hasattr(target.config, "get_mtp_config"):
            raise ValueError("this transformers version has no MTP models (get_mtp_config): "
                             "accepted transformers >= 5.24")
        from transformers.modeling_layers import MtpModel

        try:
            mtp = MtpModel.from_pretrained(target, device_map={"": str(target.device)})
        except (RuntimeError, ValueError) as e:
            raise ValueError(f"{folder}: MTP weights that do not fit the target's MTP layer "
                             f"({e})") from None
        return cls(target, mtp).attach(target)

    def save_pretrained(self, path) -> None:
        raise ValueError("an MTP head is the checkpoint's own: load it again with "
                         "DeepSeekMtpHead.from_checkpoint(folder, target)")
