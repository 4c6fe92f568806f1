"""A separate small autoregressive draft model sharing the target's vocabulary.

Each step the draft feeds its pending tokens, then samples K tokens one forward at a time
(processed exactly as the target: same SamplingParams), recording q_1..q_K (``Session.chain``:
one captured graph for the K steps where the session captures greedy chains). After the target
verifies, the draft's cache keeps the slots of the tokens that were accepted and drops the
rest (holes for rows that accepted fewer). Whatever the session returns (probabilities,
densities over vectors, frame distributions) is drawn from through ``mmspec.distributions``.
The K-th draft token is sampled but never fed; if a row accepts all K it is fed, with the new
last token, at the start of the next step.
"""

from __future__ import annotations

import torch

from ..checks import check_count
from ..sessions.base import Session
from ..types import Draft
from .base import Drafter


class ModelDrafter(Drafter):
    """Draft with a ``Session`` (usually ``CausalLMSession`` over a small causal LM).

    session:    the draft model's session (prefilled by ``begin`` with the prompt).
    num_tokens: K, drafts per step (>= 1).
    generator:  the torch.Generator used for draft sampling (the runner sets the call's).
    host_free:  keep every slot fed in a step (rejected drafts become holes) and always feed
                the K-th draft back as a (possibly masked) first input, so that ``observe``
                needs no host value: the loop then queues step t + 1 before reading step t.
                It drafts K every step; caches need K + 1 slots per step (``Plan.holes``).
    """

    needs_model = True
    param_names = ("num_draft_tokens",)

    def __init__(self, session: Session, num_tokens: int = 4, generator=None,
                 host_free: bool = False):
        self.session = session
        self.num_tokens = check_count("num_draft_tokens", num_tokens)
        self.generator = generator
        # A recurrent draft cannot keep rejected slots as holes: its steps need the counts.
        self.host_free = bool(host_free) and not session.recurrent
        # Committed tokens not yet in the draft's cache ([B, P] ids and 0/1 validity).
        self._backlog: torch.Tensor | None = None
        self._backlog_valid: torch.Tensor | None = None
        self._fed = 0
        self._k = 0

    @classmethod
    def width(cls, params, context) -> int:
        return check_count("num_draft_tokens", params.get("num_draft_tokens", 4))

    @classmethod
    def from_params(cls, params, context) -> "ModelDrafter":
        if context.draft_session is None:
            raise ValueError("a draft-model method needs a draft model: pass draft=... or use a "
                             "Jacobi method ('sjd', 'sjd-maximal')")
        return cls(context.draft_session(), cls.width(params, context),
                   host_free=context.queue_drafts)

    def begin(self, input_ids, attention_mask, vocab_size=None, **prompt) -> None:
        self.session.prefill(input_ids, attention_mask, **prompt)
        self._backlog = self._backlog_valid = None

    def _feed_with(self, last: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        one = torch.ones(last.shape[0], 1, dtype=torch.long, device=last.device)
        if self._backlog is None:
            return last[:, None], one
        return (torch.cat([self._backlog, last[:, None]], 1),
                torch.cat([self._backlog_valid, one], 1))

    def propose(self, last: torch.Tensor, k_max: int, active=None) -> Draft:
        k = min(self.num_tokens, k_max)
        self._k = k
        feed, valid = self._feed_with(last)
        on = (torch.ones(last.shape[0], dtype=torch.long, device=last.device) if active is None
              else active.long())
        valid = valid * on[:, None]
        if k == 0:  # nothing to draft: remember ``last`` for the next step
            self._backlog, self._backlog_valid = feed, valid
            self._fed = 0
            return Draft(tokens=last.new_zeros(last.shape[0], 0, *last.shape[1:]), probs=None)
        self._fed = feed.shape[1]
        self._fed_valid = valid
        self._on = on
        # K steps, each drawing from its q (greedy: the argmax of a one-hot q, no race).
        tokens, probs = self.session.chain(feed, valid, k, on, self.generator)
        return Draft(tokens=tokens, probs=probs)

    def _rep(self, t: torch.Tensor) -> torch.Tensor:
        """Per-row values as the session's rows (one block here; an ensemble repeats them)."""
        return t

    def observe(self, out, target_probs, num_accepted) -> None:
        k = self._k
        if k == 0:
            return
        n = out.num_accepted                                                 # [B]
        # Slots fed this step: the backlog and last token, then draft tokens 1..K-1.
        max_n = k if self.host_free else max(num_accepted)     # host-free: keep all, holes
        kept_drafts = min(max_n, k - 1)
        cols = torch.arange(kept_drafts, device=n.device)
        kept = self._rep((cols[None] < n[:, None]).long() * self._on[:, None])
        valid = torch.cat([self._fed_valid, kept], 1)
        all_in = self._rep((n == k).long()[:, None] * self._on[:, None])    # accepted all K
        fill = self._rep(out.tokens[:, k - 1 : k])       # their K-th token, not cached yet
        fill = torch.where(all_in.view(*all_in.shape, *[1] * (fill.dim() - 2)).bool(), fill, 0)
        if max_n == k and self.session.recurrent:
            # Recurrent states take no hole before a real token: the K-th tokens are fed now
            # (the other rows' slot, a trailing hole, is replayed away by the commit) rather
            # than at the front of the next step.
            self.session.step(fill, all_in)
            self.session.commit(self._fed + k, torch.cat([valid, all_in], 1))
            self._backlog = self._backlog_valid = None
        elif max_n == k:
            self.session.commit(self._fed + kept_drafts, valid)
            self._backlog, self._backlog_valid = fill, all_in    # 0: masked filler
        else:
            self.session.commit(self._fed + kept_drafts, valid)
            self._backlog = self._backlog_valid = None
