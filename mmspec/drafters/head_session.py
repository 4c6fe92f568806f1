"""The head's session: a draft head's decoder run as a session over the target session's ids,
and its prefill with the prompt's (token, feature) pairs. Shared by the drafters of token heads
(``feature``) and depth heads (``depth``)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ..sessions.causal_lm import CausalLMSession
from .head import DraftHead


@dataclass
class _HeadOutput:
    """The head decoder's output as the target session's ``logits`` hook reads outputs."""

    logits: torch.Tensor
    last_hidden_state: torch.Tensor


def prompt_layers(config) -> tuple[int, ...]:
    """The target layers kept for the prompt pass of a head of ``config``: its feature layers,
    then ``hidden_states[0]`` (the decoder's input embeddings) where it reads the prompt's
    merged embeddings (``merged_embeds``); ``split_prompt`` takes them apart."""
    return tuple(config.feature_layers) + ((0,) if config.merged_embeds else ())


def split_prompt(config, features: torch.Tensor | None):
    """The prompt pass's kept ``features`` [B, P - 1, F (+ d)] (``prompt_layers``) -> (the
    head's features [B, P - 1, F], the target's input embeddings [B, P - 1, d] or None)."""
    if features is None or not config.merged_embeds:
        return features, None
    d = config.hidden_size
    return features[..., :-d], features[..., -d:]


def prompt_embeds(target, input_ids: torch.Tensor, merged: torch.Tensor | None) -> torch.Tensor:
    """The prompt's token embeddings [B, P, d] as a head reads them: those of the target
    session's prompt inputs (``token_embeds``), with ``merged`` [B, P - 1, d] (the target's
    ``hidden_states[0]`` of its prompt pass: a VLM's merged image features at its image
    placeholders) in place of the columns the pass fed; the last column is the first step's."""
    e = token_embeds(target, target.prompt_inputs(target._rows(input_ids)), input_ids.shape[0])
    if merged is None:
        return e
    return torch.cat([merged.to(e.dtype), e[:, merged.shape[1]:]], 1)


def token_embeds(session, inputs: dict, rows: int) -> torch.Tensor:
    """The token embeddings [rows, n, d] of a target session's model inputs (its ``embed`` or
    ``prompt_inputs``): their ``inputs_embeds``, or the model's input embeddings of their
    ``input_ids``; the first ``rows`` rows (the conditional ones under guidance)."""
    if "inputs_embeds" in inputs:
        return inputs["inputs_embeds"][:rows]
    return session.model.get_input_embeddings()(inputs["input_ids"][:rows])


class HeadSession(CausalLMSession):
    """The head's decoder as a session over the target session's ids (``template``): the
    target's hooks turn ids into token embeddings (``embed``, ``prompt_inputs``) and outputs
    into logits (``logits``, ``mask_logits``: image-token spans, generation heads), so the
    head drafts in the ids the rules see. ``feed`` [B, n, d] are the features of the tokens
    of the next forward; ``features`` after it are the head's outputs."""

    def __init__(self, head: DraftHead, template: CausalLMSession, **engine):
        super().__init__(head.decoder, template.params, **engine)
        self.head, self.template = head, template
        self.vocab_size = template.vocab_size
        self.feed: torch.Tensor | None = None
        self.prompt_embeds: torch.Tensor | None = None     # [B, P, d] set before prefill
        self.keep_features((head.config.num_layers,))     # the last layer's (normed) output
        if head.mrope:              # the prompt's 3-D positions are the call's
            self.capture = replace(self.capture, prompt_graphs=False)
        self._offset: torch.Tensor | None = None

    def prefill(self, input_ids, attention_mask, **model_kwargs) -> None:
        """As ``CausalLMSession.prefill``; an M-RoPE head then keeps its rows' offsets from
        1-D to the target's 3-D positions (every later slot's: pos + offset, as the target's)."""
        super().prefill(input_ids, attention_mask, **model_kwargs)
        if self.head.mrope:
            p = self.template.position_ids(input_ids.new_zeros(input_ids.shape[0], 1))
            self._offset = self.persistent("mrope_offset",
                                           p if p.dim() == 3 else p[None].expand(3, -1, -1))

    def position_ids(self, pos, prompt=False):
        """1-D positions, or an M-RoPE head's target positions: in the prompt each pair (f_t,
        x_{t+1}) at the target's position of t (the target's prompt positions shifted one
        column), later slots ``pos + offset``."""
        if not self.head.mrope:
            return pos
        if prompt:
            p = self.template.position_ids(pos, prompt=True)
            return torch.cat([p[..., :1], p[..., :-1]], -1) if p.dim() == 3 else p
        return self._offset + pos[None]

    def embed(self, tokens, first_step=False):
        t = self.template.embed(self.template._rows(tokens), first_step)
        e = token_embeds(self.template, t, tokens.shape[0])
        return {"inputs_embeds": self.head.inputs(e, self.feed)}

    def prompt_inputs(self, tokens):
        e = self.prompt_embeds[:, :tokens.shape[1]]
        return {"inputs_embeds": self.head.inputs(e, self.feed)}

    def logits(self, out):
        return self.template.logits(_HeadOutput(self.head.full_logits(out.logits),
                                                out.hidden_states[-1]))

    def mask_logits(self, logits, gen_index):
        return self.template.mask_logits(logits, gen_index)


def next_pairs(on_path: torch.Tensor, tokens: torch.Tensor, n: torch.Tensor, m: int,
               on: torch.Tensor):
    """After a verified step, what the head is fed next: each row's accepted drafts (the
    first ``m`` = the most any row accepted; a row's past its ``n`` [B] are padding) with
    their validity (``on`` [B]: the rows still running), and their features: the target's
    features along the accepted path ``on_path`` [B, D + 1, d], then the one paired with the
    new last token. ``tokens`` [B, D + 1, *event] are the step's output tokens.
    -> (backlog [B, m, *event] or None, its validity [B, m] or None, pending [B, m + 1, d])."""
    d = on_path.shape[-1]
    root = on_path.gather(1, n[:, None, None].expand(-1, 1, d))
    pending = torch.cat([on_path[:, :m], root], 1)
    if m == 0:
        return None, None, pending
    taken = torch.arange(m, device=n.device)[None] < n[:, None]                  # [B, m]
    wide = taken.view(*taken.shape, *[1] * (tokens.dim() - 2))
    return torch.where(wide, tokens[:, :m], 0), taken.long() * on[:, None], pending


def prefill_pairs(session: HeadSession, input_ids, attention_mask) -> torch.Tensor:
    """Prefill the head's ``session`` with the prompt's pairs, each token with its target's
    feature of the token before it (zeros for the first; the target session has run the
    prompt, keeping ``prompt_layers``); returns the feature paired with the first root,
    [B, 1, d]."""
    tgt, head, b = session.template, session.head, input_ids.shape[0]
    f = input_ids.new_zeros(b, 1, head.config.hidden_size, dtype=head.dtype)
    feats, merged = split_prompt(head.config, tgt.features if input_ids.shape[1] > 1 else None)
    if feats is not None:
        f = torch.cat([f, head.reduce_features(feats)], 1)                       # [B, P, d]
    session.prompt_embeds = prompt_embeds(tgt, input_ids, merged)
    session.feed = f[:, :-1]
    session.prefill(input_ids, attention_mask if head.first_pair else
                    without_first_pair(attention_mask))
    return f[:, -1:]


def without_first_pair(attention_mask: torch.Tensor) -> torch.Tensor:
    """``attention_mask`` [B, P] with each row's first real token marked padding where it is
    among the prompt's pairs (not the last column, which the first step feeds): the head sees
    no (zero feature, first token) pair (``DraftHead.first_pair``)."""
    p = attention_mask.shape[1]
    first = attention_mask.long().argmax(1)
    drop = torch.nn.functional.one_hot(first, p).bool() & (first < p - 1)[:, None]
    return attention_mask.masked_fill(drop, 0)
