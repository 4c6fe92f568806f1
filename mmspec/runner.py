"""The spine: every front door is inputs -> adapter -> runner -> adapter postprocess.

A front door (``generate``, ``TextToImage``, ``VisionLanguageGenerator``, ``TextToSpeech``,
``ContinuousImageGenerator``) checks its inputs, turns them into prompts with its adapter,
asks its ``Engine`` for a ``Plan``, builds the target's session and the drafter for it, and
hands them to ``prepare``:

    run = prepare(session, drafter, rule, plan=plan, seed=seed, device=device)
    run.prefill(prompt, draft_prompt)                          # timed: stats.seconds_prefill
    result = run.collect(first_tokens, stops=stops, progress="exact")    # or run.stream(...)

The runner owns the generator (its draws and the drafter's), the stats, the prefill timing,
the progress bar and the draining of the loop; it is where a rule meets its target
(``Rule.for_target``: the exact rule verifies a greedy target as the argmax chain). The
adapter turns the result back into text, images or audio.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterator, Mapping

import torch

from . import loop
from .acceptance.base import Rule
from .drafters.base import Drafter
from .engine import Plan
from .sampling import make_generator
from .sessions.base import Session
from .types import StepStats


@dataclass
class Run:
    """One call's wiring: target session, drafter, rule, plan, generator and stats."""

    target: Session
    drafter: Drafter
    rule: Rule
    plan: Plan
    generator: torch.Generator | None
    stats: StepStats = field(default_factory=StepStats)

    def prefill(self, prompt: Mapping, draft_prompt: Mapping | None = None) -> None:
        """Feed the prompt to the target and the drafter (``draft_prompt``: the draft model's
        own prompt where it differs; default the target's)."""
        t0 = time.perf_counter()
        self.target.prefill(**prompt)
        self.drafter.begin(vocab_size=self.target.vocab_size,
                           **(prompt if draft_prompt is None else draft_prompt))
        self.stats.seconds_prefill = time.perf_counter() - t0

    def stream(self, first_tokens: torch.Tensor, *, stops: loop.Stops | None = None,
               progress: str | None = None) -> Iterator[loop.StepEvent]:
        """The loop's events; ``progress``: a progress bar with this label over the slowest
        row's tokens (tqdm.auto: a widget in notebooks; hidden where output is no terminal)."""
        events = loop.stream(self.target, self.drafter, self.rule, first_tokens,
                             max_new_tokens=self.plan.max_new_tokens, stops=stops,
                             generator=self.generator, stats=self.stats,
                             profile=self.plan.engine.profile, fixed_k=self.plan.fixed_k,
                             overdraft=self.plan.overdraft,
                             pipeline=self.plan.pipelines(self.drafter),
                             plain_steps=self.plan.steps_per_launch(self.target, self.drafter),
                             fuse=self.plan.engine.fused_settle)
        return events if progress is None else _with_progress(events, self.plan.max_new_tokens,
                                                              progress)

    def collect(self, first_tokens: torch.Tensor, **kwargs) -> loop.LoopResult:
        """Drain ``stream``: every row's tokens, which rows finished, and the stats."""
        return loop.drain(self.stream(first_tokens, **kwargs), first_tokens.shape[0], self.stats)


def prepare(target: Session, drafter: Drafter, rule: Rule, *, plan: Plan, seed: int | None = None,
            device=None, generator: torch.Generator | None = None) -> Run:
    """A ``Run`` ready for its prompt. ``seed`` seeds a generator on ``device`` (None: the
    global RNG) unless ``generator`` is given; the drafter draws from the same one."""
    loop.check_pipeline(drafter, plan.engine.pipeline)
    rule = rule.for_target(target.greedy)
    if generator is None:
        generator = make_generator(seed, device, target.split_group)
    drafter.generator = generator
    drafter.attach(target)              # a drafter may settle its shape on the target here
    loop.check_trees(target, drafter, rule)
    return Run(target, drafter, rule, plan, generator)


def _with_progress(events: Iterator[loop.StepEvent], total: int, label: str):
    from tqdm.auto import tqdm

    bar = tqdm(total=total, desc=label, leave=False, unit="tok", disable=None)
    made: list[int] | None = None
    try:
        for ev in events:
            made = [n + len(t) for n, t in zip(made or [0] * len(ev.new_tokens), ev.new_tokens)]
            bar.update(min(made) - bar.n)
            yield ev
    finally:
        bar.close()
