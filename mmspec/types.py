"""The vocabulary of mmspec, fixed once.

Terms (per row of a batch, per step):

- **step**: one target forward over ``[last emitted token, draft_1 .. draft_K]``.
- **drafted**: the K draft tokens proposed for the step.
- **accepted**: the leading draft tokens the rule keeps (``num_accepted``, 0..K).
- **recovered**: the token sampled at the first rejected position (from the rule's
  residual distribution) when ``num_accepted < K``.
- **bonus**: the token sampled from the target at position K+1 when all K drafts pass.
- **emitted**: accepted tokens followed by exactly one recovered or bonus token, so
  ``emitted = num_accepted + 1`` per step.
- **tokens per step**: mean emitted per step (= mean accepted length + 1), counting only
  what a row keeps (its last step is cut at its budget or stop token); the headline
  efficiency figure, with *step compression* = tokens / steps against the
  one-token-per-step plain decoding.
- **lossless** / **relaxed**: declared by each rule (``rule.lossless``); lossless means the
  emitted tokens are distributed exactly as the processed target (after guidance,
  temperature, top-k/top-p).

Letters follow Leviathan et al.: ``p`` = target distribution, ``q`` = draft distribution.
An "event" is whatever the adapter says one token is (a text id, a VQ id, a codec frame);
the core only sees integer ids and probability tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

PAD = -1
"""Fill value of ``VerifyOutput.tokens`` after the last emitted token of a row."""


@dataclass
class Draft:
    """What a drafter proposes for one step.

    tokens: [B, K] long   draft token ids (K may be 0: plain decoding).
    probs:  [B, K, V]     processed draft distributions the tokens were sampled from,
                          or None for a point-mass draft (q(x) = 1 at the drafted token).
    tree:   None for a chain; else the ``mmspec.tree.Tree`` the K tokens are the nodes of
            (each token's q given its path and earlier siblings).
    """

    tokens: torch.Tensor
    probs: torch.Tensor | None = None
    tree: object = None

    @property
    def num_tokens(self) -> int:
        """K, the drafted tokens per row."""
        return int(self.tokens.shape[1])


@dataclass
class TargetOutput:
    """The target's processed distributions for one verify pass.

    probs: [B, K+1, V]  p_1..p_K for the draft positions, p_{K+1} for the bonus.
    """

    probs: torch.Tensor


@dataclass
class VerifyOutput:
    """What a rule returns for one step.

    tokens:       [B, K+1] long  emitted tokens (accepted drafts, then one recovered or
                                 bonus token), padded with PAD (-1) after the last one.
                                 Events of several ids (codec frames) add trailing dims:
                                 [B, K+1, C].
    num_accepted: [B] long       0..K accepted drafts; a row emits num_accepted + 1 tokens.
    """

    tokens: torch.Tensor
    num_accepted: torch.Tensor
    fallbacks: torch.Tensor | None = None   # [B] bool: residual draws that hit a bound
    residual_proposals: torch.Tensor | None = None   # [B] long: proposals drawn at a rejection
    path: torch.Tensor | None = None   # trees: [B, D+1] node of each kept slot (``mmspec.tree``)

    @property
    def num_emitted(self) -> torch.Tensor:
        """[B] tokens each row emits this step: the accepted drafts and one more."""
        return self.num_accepted + 1

    @property
    def last_tokens(self) -> torch.Tensor:
        """[B, *event] the final emitted event of each row (the recovered or bonus one)."""
        if self.tokens.shape[1] == 1:              # one emitted event per row (plain decoding)
            return self.tokens[:, 0]
        rows = torch.arange(self.tokens.shape[0], device=self.tokens.device)
        return self.tokens[rows, self.num_accepted]


@dataclass
class StepStats:
    """Counters accumulated over a generation (all rows together).

    steps:        target forwards (NFE of the target), prefill excluded.
    drafted:      draft tokens proposed, summed over rows and steps.
    accepted:     draft tokens accepted, summed over rows and steps.
    emitted:      tokens emitted and kept, summed over rows and steps (after max_new_tokens
                  and stop-token truncation: a row's last step counts only what it kept).
    row_steps:    rows x steps that produced output (a row stops counting once finished).
    histogram:    histogram[n] = number of (row, step) pairs with n accepted drafts.
    accepted_by_position: accepted_by_position[i] = how often draft position i (0-based)
                  was accepted; drafted_by_position likewise for proposals.
    seconds_*:    wall-clock spent in each phase (CUDA phases are timed at the one
                  synchronisation per step, so they are attributed to 'verify' on GPU
                  unless profile=True).
    row_*:        the same counters per row (row_nfe[b] = steps row b took part in).
    """

    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    row_steps: int = 0
    histogram: list[int] = field(default_factory=list)
    accepted_by_position: list[int] = field(default_factory=list)
    drafted_by_position: list[int] = field(default_factory=list)
    seconds_prefill: float = 0.0
    seconds_draft: float = 0.0
    seconds_verify: float = 0.0
    seconds_accept: float = 0.0
    seconds_total: float = 0.0
    row_nfe: list[int] = field(default_factory=list)
    row_drafted: list[int] = field(default_factory=list)
    row_accepted: list[int] = field(default_factory=list)
    row_histogram: list[list[int]] = field(default_factory=list)
    extra: dict = field(default_factory=dict)

    @property
    def acceptance_rate(self) -> float:
        """accepted / drafted (0 when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Accepted drafts per row-step (row-steps: steps summed over the rows that were active)."""
        return self.accepted / self.row_steps if self.row_steps else 0.0

    @property
    def tokens_per_step(self) -> float:
        """Mean kept tokens per row per target forward (= mean accepted length + 1 but for
        the rows' last steps, cut at their budgets and stop tokens)."""
        return self.emitted / self.row_steps if self.row_steps else 0.0

    def record(self, num_accepted: list[int], num_drafted: int, active: list[bool],
               kept: list[int]) -> None:
        """Add one step. ``num_accepted`` and ``kept`` (the tokens each row keeps: its
        accepted drafts and one more, cut at its budget or stop token) per row, host ints;
        inactive rows are skipped."""
        self.steps += 1
        if len(self.histogram) < num_drafted + 1:
            self.histogram.extend([0] * (num_drafted + 1 - len(self.histogram)))
        if len(self.drafted_by_position) < num_drafted:
            grow = num_drafted - len(self.drafted_by_position)
            self.drafted_by_position.extend([0] * grow)
            self.accepted_by_position.extend([0] * grow)
        if not self.row_nfe:
            b = len(num_accepted)
            self.row_nfe, self.row_drafted, self.row_accepted = [0] * b, [0] * b, [0] * b
            self.row_histogram = [[] for _ in range(b)]
        for i, (n, on) in enumerate(zip(num_accepted, active)):
            if not on:
                continue
            self.row_nfe[i] += 1
            self.row_drafted[i] += num_drafted
            self.row_accepted[i] += n
            h = self.row_histogram[i]
            if len(h) <= n:
                h.extend([0] * (n + 1 - len(h)))
            h[n] += 1
            self.row_steps += 1
            self.drafted += num_drafted
            self.accepted += n
            self.emitted += kept[i]
            self.histogram[n] += 1
            for i in range(num_drafted):
                self.drafted_by_position[i] += 1
                if i < n:
                    self.accepted_by_position[i] += 1

    def record_residuals(self, proposals: list[int], fallbacks: list[int],
                         active: list[bool]) -> None:
        """Add one step's residual draws (continuous rules): per row, the proposals drawn at
        a rejection and whether the draw hit its bound (a fallback)."""
        for n, fb, on in zip(proposals, fallbacks, active):
            if on and n:
                self.extra["rejections"] = self.extra.get("rejections", 0) + 1
                self.extra["residual_proposals"] = self.extra.get("residual_proposals", 0) + n
                self.extra["residual_fallbacks"] = self.extra.get("residual_fallbacks", 0) + fb

    def add_phases(self, draft: float, verify: float, accept: float, elapsed: float) -> None:
        """Add one step's seconds per phase (disjoint intervals); ``elapsed``: since the
        loop started (the total adds the prefill)."""
        self.seconds_draft += draft
        self.seconds_verify += verify
        self.seconds_accept += accept
        self.seconds_total = elapsed + self.seconds_prefill

    def as_dict(self) -> dict:
        """The totals as a flat dict (JSON-ready; per-row lists left out), with the derived rates."""
        out = {k: getattr(self, k) for k in self.__dataclass_fields__
               if k != "extra" and not k.startswith("row_")}
        out.update(
            acceptance_rate=self.acceptance_rate,
            mean_accepted_length=self.mean_accepted_length,
            tokens_per_step=self.tokens_per_step,
        )
        out.update(self.extra)
        return out

    def __str__(self) -> str:
        return (
            f"steps={self.steps} tokens/step={self.tokens_per_step:.3f} "
            f"acceptance={self.acceptance_rate:.3f} "
            f"draft={self.seconds_draft:.3f}s verify={self.seconds_verify:.3f}s "
            f"accept={self.seconds_accept:.3f}s total={self.seconds_total:.3f}s"
        )


@dataclass
class GenerateOutput:
    """Result of ``mmspec.generate``.

    sequences:     [B, P + T] long  the (left-padded) prompt followed by generated tokens,
                                    padded with ``pad_token_id`` after each row's end.
    num_generated: [B] long         generated tokens per row (stop token included).
    prompt_length: int              P, the padded prompt width.
    stats:         StepStats
    """

    sequences: torch.Tensor
    num_generated: torch.Tensor
    prompt_length: int
    stats: StepStats

    def generated(self, row: int) -> torch.Tensor:
        """The generated tokens of one row, without padding."""
        start = self.prompt_length
        return self.sequences[row, start : start + int(self.num_generated[row])]
