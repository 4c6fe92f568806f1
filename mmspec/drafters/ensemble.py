"""In-batch ensemble drafting (IbED / TABED): several draft modes as one draft batch.

One draft session holds M blocks of B rows, block m prefilled with mode m's prompt (for a
vision-language target: image + text, text only, text + caption, ...). Each draft step feeds
the same token to every block, so one forward computes all modes; the draft distribution is
the mixture q = sum_m w_m q_m, from which the token is sampled (so exactness holds: the rule
sees the q the token was drawn from). Weights are fixed, or adapted per row to how well each
mode matched the target so far: w_m proportional to exp(mean log q_m(y) / temperature) over
the tokens y the target emitted (``adapt=True``).
"""

from __future__ import annotations

import torch

from ..sampling import sample
from ..types import Draft
from .model import ModelDrafter


class EnsembleDrafter(ModelDrafter):
    """session: a Session over M * B rows (block m = mode m); modes: M; weights: [M] or None."""

    def __init__(self, session, modes: int, num_tokens: int = 4, weights=None, adapt: bool = True,
                 temperature: float = 1.0, generator=None):
        super().__init__(session, num_tokens, generator)
        if not isinstance(modes, int) or modes < 1:
            raise ValueError(f"modes={modes!r}: accepted an integer >= 1")
        if weights is not None:
            w = torch.as_tensor(weights, dtype=torch.float32)
            if w.shape != (modes,) or bool((w < 0).any()) or float(w.sum()) <= 0:
                raise ValueError(f"weights={weights!r}: accepted {modes} non-negative numbers "
                                 "with a positive sum")
        self.modes = modes
        self.init_weights = weights
        self.adapt = adapt
        self.temperature = temperature
        self.score = None      # [M, B] running sum of log q_m(y) over target tokens
        self.count = 0

    def begin(self, input_ids, attention_mask, vocab_size=None, **prompt) -> None:
        """input_ids, attention_mask: [M * B, P] (block m = mode m's prompts)."""
        super().begin(input_ids, attention_mask, **prompt)
        m = self.modes
        b = input_ids.shape[0] // m
        if b * m != input_ids.shape[0]:
            raise ValueError(f"ensemble prompts have {input_ids.shape[0]} rows: accepted "
                             f"modes x batch = {m} x B rows")
        self.b = b
        base = (torch.full((m,), 1.0 / m) if self.init_weights is None
                else torch.as_tensor(self.init_weights, dtype=torch.float32))
        self.base = (base / base.sum()).to(input_ids.device)
        self.score = torch.zeros(m, b, device=input_ids.device)
        self.count = 0
        self._q_modes = []

    def weights(self) -> torch.Tensor:
        """[M, B] current mixture weights."""
        if not self.adapt or self.count == 0:
            return self.base[:, None].expand(self.modes, self.b)
        logits = self.base.log()[:, None] + self.score / (self.count * self.temperature)
        return torch.softmax(logits, 0)

    def _rep(self, t: torch.Tensor) -> torch.Tensor:
        return t.repeat(self.modes, *([1] * (t.dim() - 1)))

    def propose(self, last, k_max, active=None) -> Draft:
        k = min(self.num_tokens, k_max)
        self._k = k
        m, b = self.modes, self.b
        on = (torch.ones(last.shape[0], dtype=torch.long, device=last.device) if active is None
              else active.long())
        feed, valid = self._feed_with(self._rep(last))
        valid = valid * self._rep(on)[:, None]
        if k == 0:
            self._backlog, self._backlog_valid = feed, valid
            self._fed = 0
            return Draft(tokens=last.new_zeros(b, 0, *last.shape[1:]), probs=None)
        self._fed = feed.shape[1]
        self._fed_valid = valid
        self._on = on
        w = self.weights()                                                   # [M, B]
        tokens, probs, per_mode = [], [], []
        for i in range(k):
            qm = self.session.step(feed, valid)[:, -1].view(m, b, -1)        # [M, B, V]
            q = (w[..., None] * qm).sum(0)                                   # [B, V]
            x = sample(q, self.generator)
            tokens.append(x)
            probs.append(q)
            per_mode.append(qm)
            if i < k - 1:
                feed, valid = self._rep(x)[:, None], self._rep(on)[:, None]
        self._q_modes = per_mode
        return Draft(tokens=torch.stack(tokens, 1), probs=torch.stack(probs, 1))

    def observe(self, out, target_probs, num_accepted) -> None:
        k = self._k
        if k == 0:
            return
        if self.adapt:   # score each mode on the target's emitted tokens it had a q for
            n = out.num_accepted
            for i, qm in enumerate(self._q_modes):
                y = out.tokens[:, i].clamp(min=0)                            # [B]
                hit = (i <= n).float() * self._on.float()
                lq = qm.gather(-1, y[None, :, None].expand(self.modes, -1, 1)).squeeze(-1)
                self.score += hit[None] * lq.clamp_min(1e-12).log()
            self.count += 1
        super().observe(out, target_probs, num_accepted)
