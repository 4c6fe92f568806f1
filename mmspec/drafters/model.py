"""A separate small autoregressive draft model sharing the target's vocabulary.

Each step the draft feeds its pending tokens, then samples K tokens one forward at a time
(processed exactly as the target: same SamplingParams), recording q_1..q_K. After the target
verifies, the draft's cache keeps the slots of the tokens that were accepted and drops the
rest (holes for rows that accepted fewer). Sessions of continuous models return densities
(``log_prob``/``sample``/``stack``) instead of probability tensors; tokens are then vectors.
Sessions of depth-decoder models return frame distributions with ``sample_with_probs``: the
drafted frame and the draft's conditionals along it. The K-th draft token is sampled but never fed; if
a row accepts all K it is fed, with the new last token, at the start of the next step.
"""

from __future__ import annotations

import torch

from ..sampling import sample
from ..session import Session
from ..types import Draft


class ModelDrafter:
    """Draft with a ``Session`` (usually ``CausalLMSession`` over a small causal LM).

    session:    the draft model's session (prefilled by ``begin`` with the prompt).
    num_tokens: K, drafts per step (>= 1).
    generator:  the torch.Generator used for draft sampling (the loop sets its own).
    host_free:  keep every slot fed in a step (rejected drafts become holes) and always feed
                the K-th draft back as a (possibly masked) first input, so that ``observe``
                needs no host value: the loop then queues step t + 1 before reading step t.
                It drafts K every step; caches need K + 1 slots per step (``static_length``
                with ``holes``).
    """

    def __init__(self, session: Session, num_tokens: int = 4, generator=None,
                 host_free: bool = False):
        if not isinstance(num_tokens, int) or num_tokens < 1:
            raise ValueError(f"num_draft_tokens={num_tokens!r}: accepted an integer >= 1")
        self.session = session
        self.num_tokens = num_tokens
        self.generator = generator
        self.host_free = bool(host_free)
        # Committed tokens not yet in the draft's cache ([B, P] ids and 0/1 validity).
        self._backlog: torch.Tensor | None = None
        self._backlog_valid: torch.Tensor | None = None
        self._fed = 0
        self._k = 0

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
        params = getattr(self.session, "params", None)
        greedy = params is not None and params.greedy     # one-hot q: its argmax, no race
        tokens, probs = [], []
        for i in range(k):
            q = self.session.step(feed, valid)[:, -1]                      # [B, V] or densities
            if hasattr(q, "sample_with_probs"):    # autoregressive frames (a depth decoder)
                x, q = q.sample_with_probs(self.generator)                 # [B, C], [B, C, V]
            else:
                x = (q.sample(self.generator) if hasattr(q, "log_prob")
                     else q.argmax(-1) if greedy else sample(q, self.generator))
            tokens.append(x)
            probs.append(q)
            if i < k - 1:
                feed, valid = x[:, None], on[:, None]
        stack = type(probs[0]).stack if hasattr(probs[0], "log_prob") else torch.stack
        return Draft(tokens=torch.stack(tokens, 1), probs=stack(probs, 1))

    def observe(self, out, target_probs, num_accepted) -> None:
        k = self._k
        if k == 0:
            return
        n = out.num_accepted                                                 # [B]
        # Slots fed this step: the backlog and last token, then draft tokens 1..K-1.
        max_n = k if self.host_free else max(num_accepted)     # host-free: keep all, holes
        kept_drafts = min(max_n, k - 1)
        cols = torch.arange(kept_drafts, device=n.device)
        valid = torch.cat([self._fed_valid, (cols[None] < n[:, None]).long() * self._on[:, None]], 1)
        self.session.commit(self._fed + kept_drafts, valid)
        if max_n == k:  # rows that accepted every draft: their K-th token is not cached yet
            all_in = (n == k)[:, None]
            fill = out.tokens[:, k - 1 : k]
            mask = all_in.view(*all_in.shape, *([1] * (fill.dim() - 2)))
            self._backlog = torch.where(mask, fill, 0)  # 0: masked filler
            self._backlog_valid = all_in.long()
        else:
            self._backlog = self._backlog_valid = None
