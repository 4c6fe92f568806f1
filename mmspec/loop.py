"""The draft -> verify -> accept -> commit -> observe loop (DESIGN.md), once.

``stream`` yields one ``StepEvent`` per target forward; ``run`` drains it into a
``LoopResult``. Everything else (text generation, image pipelines, TTS) calls one of them.

Per step, all rows together:
1. Draft:   ``drafter.propose(last, k_max)`` -> K tokens and their q (or a point mass).
2. Verify:  ``target.step([last, drafts])`` -> processed p for K+1 positions.
3. Accept:  ``rule(drafts, q, p)`` -> emitted tokens and accepted counts per row.
4. Commit:  the one deliberate host synchronisation (accepted counts, emitted ids and a
            finiteness flag in one transfer); the target keeps ``1 + max_b n_b`` slots with
            holes for rows that accepted less (ragged rows, no truncation to the shortest).
5. Observe: the drafter rolls back or keeps the target's samples; stats are recorded.

With a ``host_free`` drafter (plain decoding; ``ModelDrafter(host_free=True)``, whose steps
keep rejected slots as holes) the loop is pipelined: step t + 1 is queued on the device before
the host reads step t's transfer, so the host's work between steps overlaps the device's
instead of idling it.

Rows stop at a stop token (for multi-id events, in the event's last id: the last codebook
of a delay pattern ends last) or after ``max_new_tokens``; tokens emitted past either are
dropped (a prefix of a valid run is still exact). ``k_max`` shrinks so that no step drafts
past the smallest remaining budget of the rows still running.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterator

import torch

from .acceptance.base import Rule
from .acceptance.exact import Exact, Greedy
from .drafters.base import Drafter
from .session import Session
from .types import StepStats


@dataclass
class StepEvent:
    """What one step added: ``new_tokens[b]`` (host ints, after stop/budget truncation)."""

    new_tokens: list[list[int]]
    finished: list[bool]
    stats: StepStats


@dataclass
class LoopResult:
    tokens: list[list[int]]
    stats: StepStats
    finished: list[bool] = field(default_factory=list)


_HEAD = 6   # per-row host values before the tokens: n, cut, active, bad, fallback, proposals


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def stream(target: Session, drafter: Drafter, rule: Rule, first_tokens: torch.Tensor, *,
           max_new_tokens: int, stop_token_ids: set[int] | None = None,
           generator: torch.Generator | None = None, stats: StepStats | None = None,
           profile: bool = False, fixed_k: bool = False,
           stop_on: str = "last", pipeline: bool | None = None) -> Iterator[StepEvent]:
    """Run the loop after both target and drafter have seen the prompt.

    first_tokens: [B] the last prompt token of each row (not yet fed to either model).
    profile:      synchronise the device between phases so the per-phase seconds are exact
                  on CUDA (costs speed; CPU timings are always exact).
    fixed_k:      never shrink K near the end (captured steps keep one width; tokens past
                  max_new_tokens are dropped, positions may run K past it).
    stop_on:      for events of several ids: ``"last"`` (a stop id in the event's last id, as
                  a delay pattern's last codebook) or ``"all"`` (every id of the event a stop
                  id, as CSM's end-of-audio frame).
    pipeline:     launch step t + 1 before reading step t's host values, so the device never
                  waits for the host between steps. Only for drafters whose steps need no host
                  value of the previous step (``host_free``: plain decoding, or a
                  ``ModelDrafter(host_free=True)``; every slot of a step is kept, rejected ones
                  as holes); default: on for those unless ``profile``. Tokens are the same
                  either way. A step that may end every row by its budget is read before the
                  next is queued; rows ending on a stop token are learnt one step late, so
                  one step may be discarded.
    """
    if stop_on not in ("last", "all"):
        raise ValueError(f"stop_on={stop_on!r}: accepted 'last' or 'all'")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens!r}: accepted an integer >= 1")
    host_free = bool(getattr(drafter, "host_free", False))
    if pipeline and not host_free:
        raise ValueError("pipeline=True: accepted only with a drafter whose steps need no host "
                         f"values (host_free, e.g. NoDraft); got {type(drafter).__name__}")
    pipe = (host_free and not profile) if pipeline is None else bool(pipeline)
    if type(rule) is Exact and getattr(getattr(target, "params", None), "greedy", False):
        # A greedy target's p is one-hot, where exact verification is the argmax chain for any
        # q: the same tokens without the generic rule's draws, residuals and sampling.
        rule = Greedy()
    stats = stats if stats is not None else StepStats()
    b = first_tokens.shape[0]
    device = first_tokens.device
    stops = torch.tensor(sorted(set(stop_token_ids or ())), dtype=torch.long, device=device)
    state = dict(last=first_tokens,
                 # Row state lives on the device, so no host value has to travel back before a step.
                 produced=torch.zeros(b, dtype=torch.long, device=device),
                 active=torch.ones(b, dtype=torch.bool, device=device), commit=None)
    zeros = torch.zeros(b, dtype=torch.long, device=device)     # constants of every step
    no_rows = torch.zeros(b, dtype=torch.bool, device=device)
    produced_host = [0] * b
    planned = [0] * b          # pipelined: tokens the launched steps will have produced per row
    finished = [False] * b
    t_start = time.perf_counter()

    def launch(k_max: int) -> dict:
        """Draft, verify, accept and the device-side bookkeeping of one step; returns the
        step's record with the one tensor that travels to the host."""
        last, produced, active = state["last"], state["produced"], state["active"]
        # Finished rows ride along as padding: their inputs are masked and their positions
        # stop advancing (models with absolute position tables never see them overflow).
        t0 = time.perf_counter()
        draft = drafter.propose(last, k_max, active)
        # The target's rollback from the previous step, done while the device drafts.
        if state["commit"] is not None:
            target.commit(*state["commit"])
            state["commit"] = None
        if profile:
            _sync(device)
        t1 = time.perf_counter()
        k = draft.tokens.shape[1]
        fed = torch.cat([last[:, None], draft.tokens], 1)                    # [B, K+1, *event]
        p = target.step(fed, active[:, None].expand(b, fed.shape[1]))        # [B, K+1, *event, V]
        if profile:
            _sync(device)
        t2 = time.perf_counter()
        out = rule(draft.tokens, draft.probs, p, generator, validate=False)
        if not getattr(target, "ragged", True):
            out = _common_prefix(out, active)
        # Emitted tokens that count: up to the first stop token and the row's budget.
        emitted = out.num_emitted
        done = no_rows
        first_stop = emitted
        if stops.numel():
            cols = torch.arange(k + 1, device=device)
            if out.tokens.dim() > 2 and stop_on == "all":
                hit = torch.isin(out.tokens.flatten(2), stops).all(-1)
            else:                              # multi-id events stop on their last id
                ids = out.tokens.flatten(2)[..., -1] if out.tokens.dim() > 2 else out.tokens
                hit = torch.isin(ids, stops)
            hit = hit & (cols[None] < emitted[:, None])
            done = hit.any(1)
            first_stop = torch.where(done, hit.float().argmax(1) + 1, emitted)
        cut = torch.minimum(first_stop, max_new_tokens - produced)
        cut = torch.where(active, cut, 0)
        produced = produced + cut
        done = done | (produced >= max_new_tokens)
        state["produced"], state["active"] = produced, active & ~done
        # The one deliberate synchronisation: counts, ids, cuts and a finiteness flag together.
        bad = (~torch.isfinite(p).all() if isinstance(p, torch.Tensor)
               else torch.zeros((), dtype=torch.bool, device=device))   # densities validate themselves
        if isinstance(draft.probs, torch.Tensor):
            bad = bad | ~torch.isfinite(draft.probs).all()
        fb = out.fallbacks.long() if out.fallbacks is not None else zeros
        props = out.residual_proposals if out.residual_proposals is not None else zeros
        head = torch.cat([out.num_accepted[:, None], cut[:, None], state["active"][:, None].long(),
                          bad.to(torch.long).expand(b, 1), fb[:, None], props[:, None]], 1)
        body = out.tokens.reshape(b, -1)
        if body.is_floating_point():   # vector tokens: counts travel exactly as float64
            head, body = head.double(), body.double()
        return dict(out=out, p=p, k=k, emitted=emitted, was_active=active,
                    host=torch.cat([head, body], 1), t=[t0, t1, t2])

    def commit(rec: dict, n_host: list[int] | None) -> None:
        """The drafter's rollback now; the target's is queued for the next ``launch`` (after
        its drafts are queued) or ``flush``. ``n_host`` None (pipelined, counts not read yet):
        every slot fed this step is kept, the rejected ones as holes."""
        keep = (rec["k"] + 1 if n_host is None
                else max(n for n, f in zip(n_host, finished) if not f) + 1)
        if keep == 1:          # every row emits >= 1 token: its one slot is valid where it ran
            valid = rec["was_active"][:, None]
        else:
            kept = torch.arange(keep, device=device)
            valid = (kept[None] < rec["emitted"][:, None]) & rec["was_active"][:, None]
        state["commit"] = (keep, valid)
        drafter.observe(rec["out"], rec["p"], n_host)
        state["last"] = rec["out"].last_tokens

    def flush() -> None:
        if state["commit"] is not None:
            target.commit(*state["commit"])
            state["commit"] = None

    def to_host(rec: dict) -> list:
        host = rec["host"]
        if "event" in rec:
            rec["event"].synchronize()
        host = host.tolist()
        return [[int(x) for x in row[:_HEAD]] + row[_HEAD:] for row in host]

    def process(rec: dict, host: list, t3: float, t4: float) -> StepEvent | None:
        """Host side of one step: errors, stats and the new tokens; None for a step launched
        after every row had ended (pipelined only; discarded)."""
        out, k = rec["out"], rec["k"]
        if host[0][3]:
            raise ValueError("the model produced NaN or inf probabilities (check its logits "
                             "and dtype): accepted finite logits")
        if all(finished):
            return None
        if out.residual_proposals is not None:
            for i, row in enumerate(host):
                if not finished[i] and row[5]:
                    stats.extra["rejections"] = stats.extra.get("rejections", 0) + 1
                    stats.extra["residual_proposals"] = stats.extra.get("residual_proposals", 0) + row[5]
                    stats.extra["residual_fallbacks"] = stats.extra.get("residual_fallbacks", 0) + row[4]
        n_host = [row[0] for row in host]
        stats.record(n_host, k, [not f for f in finished])
        new_tokens: list[list[int]] = [[] for _ in range(b)]
        event = tuple(out.tokens.shape[2:])
        for i, row in enumerate(host):
            if finished[i]:
                continue
            if event:   # events of several ids: one list per event
                size = out.tokens[0, 0].numel()
                flat = row[_HEAD : _HEAD + row[1] * size]
                new_tokens[i] = [flat[j:j + size] for j in range(0, len(flat), size)]
            else:
                new_tokens[i] = row[_HEAD : _HEAD + row[1]]
            produced_host[i] += row[1]
            finished[i] = not row[2]
        t0, t1, t2 = rec["t"]
        stats.seconds_draft += t1 - t0
        stats.seconds_verify += t2 - t1
        stats.seconds_accept += (t3 - t2) + (t4 - t3)
        stats.seconds_total = time.perf_counter() - t_start + stats.seconds_prefill
        return StepEvent(new_tokens=new_tokens, finished=list(finished), stats=stats)

    def k_for(produced_: list[int], finished_: list[bool]) -> int:
        if fixed_k:
            return max_new_tokens
        return min(max_new_tokens - produced_[i] for i in range(b) if not finished_[i]) - 1

    if not pipe:
        # Step t + 1 is queued as soon as step t's counts are read (its rows' budgets and ends
        # follow from them); step t's tokens are then handed out while the device works.
        rec = launch(k_for(produced_host, finished))
        while True:
            host = to_host(rec)
            t3 = time.perf_counter()
            commit(rec, [row[0] for row in host])
            fin = [f or not row[2] for f, row in zip(finished, host)]
            nxt = None
            if not all(fin):
                made = [n + (0 if f else row[1]) for n, f, row in zip(produced_host, finished, host)]
                nxt = launch(k_for(made, fin))
            else:
                flush()
            ev = process(rec, host, t3, time.perf_counter())
            yield ev
            if nxt is None:
                return
            rec = nxt
    # Pipelined (host-free drafters: every fed slot kept). Step t + 1 is queued before step t's
    # values are read; ``planned`` is a lower bound of each row's tokens (one per step), the
    # rows' real ends arrive one step later.
    def read(rec: dict) -> Iterator[StepEvent]:
        t3 = time.perf_counter()
        host = to_host(rec)
        ev = process(rec, host, t3, time.perf_counter())
        if ev is not None:
            yield ev

    pending = None
    while True:
        if pending is not None and all(
                f or n + pending["k"] + 1 >= max_new_tokens for f, n in zip(finished, produced_host)):
            # The step in flight may end every row by its budget: read it before queueing
            # another (a step launched past the end would be discarded whole).
            yield from read(pending)
            pending = None
        rec = None
        if any(not f and n < max_new_tokens for f, n in zip(finished, planned)):
            rec = launch(max_new_tokens)     # host-free drafters draft K every step
            commit(rec, None)
            planned = [n + (not f) for n, f in zip(planned, finished)]
            if device.type == "cuda":
                rec["host"] = rec["host"].to("cpu", non_blocking=True)
                rec["event"] = torch.cuda.Event()
                rec["event"].record()
        if pending is not None:
            yield from read(pending)
        if rec is None:
            flush()
            return
        pending = rec


def _common_prefix(out, active):
    """Commit every running row to the shortest accepted length (for targets whose positions
    follow the cache length, so rows cannot keep holes): each row emits a prefix of its
    valid run, which is still exact."""
    from .types import PAD, VerifyOutput

    n = out.num_accepted
    big = torch.iinfo(n.dtype).max
    n_min = torch.where(active, n, big).min()
    n_min = torch.where(n_min == big, n.min(), n_min)
    cols = torch.arange(out.tokens.shape[1], device=n.device)
    keep = cols[None] <= n_min
    keep = keep.view(*keep.shape, *([1] * (out.tokens.dim() - 2)))
    tokens = torch.where(keep, out.tokens, PAD)
    return VerifyOutput(tokens=tokens, num_accepted=torch.minimum(n, n_min).expand_as(n).clone())


def run(target: Session, drafter: Drafter, rule: Rule, first_tokens: torch.Tensor,
        **kwargs) -> LoopResult:
    """Drain ``stream``: all generated tokens per row and the stats."""
    b = first_tokens.shape[0]
    tokens: list[list[int]] = [[] for _ in range(b)]
    stats = kwargs.pop("stats", None) or StepStats()
    finished = [False] * b
    for ev in stream(target, drafter, rule, first_tokens, stats=stats, **kwargs):
        for i, new in enumerate(ev.new_tokens):
            tokens[i].extend(new)
        finished = ev.finished
    return LoopResult(tokens=tokens, stats=stats, finished=finished)
