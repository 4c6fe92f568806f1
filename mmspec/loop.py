"""The draft -> verify -> accept -> commit -> observe loop (docs/DESIGN.md), once.

``stream`` yields one ``StepEvent`` per target forward; ``run`` drains it into a
``LoopResult``. The runner (``mmspec.runner``) calls them for every front door.

Per step, all rows together:
1. Draft:   ``drafter.propose(last, k_max, active)`` -> K tokens and their q (or a point mass),
            as a chain or as the nodes of a tree (``Draft.tree``).
2. Verify:  ``target.step([last, drafts])`` -> processed p for K+1 positions (a tree step:
            each node sees its ancestors).
3. Accept:  ``rule(drafts, q, p)`` (a tree: ``rule.verify_tree``) -> emitted tokens and
            accepted counts per row; each row's stop tokens and budget cut what counts, on
            the device (``account``). Under captured engines a rule that ``fuses`` (greedy)
            settles a chain step in one compiled function (``settler``).
4. Commit:  the one deliberate host synchronisation (``HostValues``: counts, cuts, running
            flags, a finiteness flag and the tokens, in one transfer). The drafter rolls back
            at once; the target's rollback (``Commit``: keep ``1 + max_b n_b`` slots, holes for
            rows that accepted less) waits until the next step's drafts are queued, so the
            device drafts meanwhile.
5. Observe: the drafter keeps what it needs of the outcome (Jacobi: the target's samples);
            stats are recorded.

Plain decoding of a greedy target may run several target steps per launch
(``Loop.plain_steps``, ``launch_chain``): the target's ``Session.chain`` draws them (under
captured engines one graph), and the launch settles them together as one step emitting them.

Two drivers: ``_synchronised`` launches step t + 1 as soon as step t's counts are read;
``_pipelined`` (drafters whose steps need no host value, ``Drafter.host_free``) queues step
t + 1 before step t is read, so the device never waits for the host between steps.

Rows stop at a stop token (``Stops``) or after ``max_new_tokens``; tokens emitted past either
are dropped (a prefix of a valid run is still exact). ``k_max`` shrinks so that no step drafts
past the smallest remaining budget of the running rows (with ``overdraft``, the largest:
where the models' positions have room for K more), unless ``fixed_k`` (captured steps keep
one width).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import Iterator

import torch

from .acceptance.base import Rule
from .checks import check_count
from .distributions import nonfinite
from .drafters.base import Drafter
from .engine.capture import compile_fixed
from .sessions.base import Session
from .types import PAD, StepStats, VerifyOutput


@dataclass
class StepEvent:
    """What one step added: ``new_tokens[b]`` (host values, after stop/budget truncation)."""

    new_tokens: list[list]
    finished: list[bool]
    stats: StepStats


@dataclass
class LoopResult:
    tokens: list[list]
    stats: StepStats
    finished: list[bool] = field(default_factory=list)


@dataclass(frozen=True)
class Stops:
    """Ids that end a row. For events of several ids, ``on="last"`` stops on a stop id in the
    event's last id (a delay pattern's last codebook ends last), ``on="all"`` when every id
    of the event is one, ``on="all-but-last"`` when every id but the last is one (CSM's
    end-of-audio frame, as transformers' CSM generation stops)."""

    ids: tuple[int, ...] = ()
    on: str = "last"

    def __post_init__(self):
        if self.on not in ("last", "all", "all-but-last"):
            raise ValueError(f"stop_on={self.on!r}: accepted 'last', 'all' or 'all-but-last'")
        ids = self.ids
        if not isinstance(ids, (list, tuple, set, frozenset)) or not all(
                isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise ValueError(f"stop_token_ids={ids!r}: accepted a list of token ids")
        object.__setattr__(self, "ids", tuple(sorted(set(ids))))

    def cut(self, tokens: torch.Tensor, emitted: torch.Tensor, ids: torch.Tensor):
        """tokens [B, K+1, *event], emitted [B], ids: ``self.ids`` on the device ->
        (done [B]: a stop among the emitted, count [B]: emitted up to the first stop)."""
        cols = torch.arange(tokens.shape[1], device=tokens.device)
        if tokens.dim() > 2 and self.on != "last":
            ids_ = tokens.flatten(2) if self.on == "all" else tokens.flatten(2)[..., :-1]
            hit = torch.isin(ids_, ids).all(-1)
        else:
            hit = torch.isin(tokens.flatten(2)[..., -1] if tokens.dim() > 2 else tokens, ids)
        hit = hit & (cols[None] < emitted[:, None])
        done = hit.any(1)
        return done, torch.where(done, hit.float().argmax(1) + 1, emitted)


@dataclass
class Rows:
    """The rows' state on the device between steps (no host value travels back for it)."""

    last: torch.Tensor        # [B, *event] each row's last emitted event, fed first next step
    produced: torch.Tensor    # [B] events each row has produced
    active: torch.Tensor      # [B] bool: rows still running (the others ride along as padding)


@dataclass
class Commit:
    """The target's deferred rollback: keep ``keep`` of the last step's slots, ``valid``
    [B, keep] marking the holes of rows that accepted less (None: the slots as fed); after a
    tree step, ``path`` [B, keep] the slots each row keeps."""

    keep: int
    valid: torch.Tensor | None
    path: torch.Tensor | None = None


_COLUMNS = ("accepted", "cut", "running", "bad", "fallbacks", "proposals")


@dataclass
class HostValues:
    """One step's transfer, decoded once by name (per row; ``bad`` for the whole step)."""

    accepted: list[int]
    cut: list[int]
    running: list[bool]
    bad: bool
    fallbacks: list[int]
    proposals: list[int]
    tokens: list[list]

    @staticmethod
    def pack(out: VerifyOutput, cut, running, bad) -> torch.Tensor:
        """[B, len(_COLUMNS) + tokens]: the columns, then each row's emitted tokens
        (``bad`` None: no flag)."""
        b, zeros = cut.shape[0], torch.zeros_like(cut)
        fb = out.fallbacks.long() if out.fallbacks is not None else zeros
        props = out.residual_proposals if out.residual_proposals is not None else zeros
        flag = zeros if bad is None else bad.long().expand(b)
        head = torch.stack([out.num_accepted, cut, running.long(), flag, fb, props], 1)
        body = out.tokens.reshape(b, -1)
        if body.is_floating_point():   # vector tokens: counts travel exactly as float64
            head, body = head.double(), body.double()
        return torch.cat([head, body], 1)

    @classmethod
    def unpack(cls, host: list[list], event_size: int | None) -> "HostValues":
        """``event_size``: ids per event (None: one id, kept flat)."""
        h = len(_COLUMNS)
        cols = {name: [int(row[i]) for row in host] for i, name in enumerate(_COLUMNS)}
        tokens, size = [], event_size or 1
        for row, n in zip(host, cols["cut"]):
            flat = row[h:h + n * size]
            tokens.append(flat if event_size is None else
                          [flat[j:j + size] for j in range(0, len(flat), size)])
        return cls(accepted=cols["accepted"], cut=cols["cut"],
                   running=[bool(r) for r in cols["running"]], bad=bool(cols["bad"][0]),
                   fallbacks=cols["fallbacks"], proposals=cols["proposals"], tokens=tokens)


@dataclass
class Launched:
    """One step on the device: its outcome and the tensor that travels to the host."""

    out: VerifyOutput
    p: object                 # the target's distributions [B, K+1, ...]
    k: int
    emitted: torch.Tensor     # [B]
    was_active: torch.Tensor  # [B] rows that ran this step
    host: torch.Tensor        # HostValues.pack
    times: tuple              # draft, verify, accept starts and the launch's end
    ready: object = None      # a CUDA event once the transfer is queued (pipelined)
    accept_seconds: float = 0.0
    steps: int = 1            # target steps (a plain chain's: ``Loop.launch_chain``)

    def send(self) -> None:
        """Queue the transfer to the host without waiting for it (pipelined steps)."""
        if self.host.device.type == "cuda":
            self.host = self.host.to("cpu", non_blocking=True)
            self.ready = torch.cuda.Event()
            self.ready.record()


def check_trees(target: Session, drafter: Drafter, rule: Rule) -> None:
    """A tree drafter needs a target that takes tree steps and a rule that verifies trees."""
    if not drafter.trees:
        return
    if not target.tree_verify:
        raise ValueError(f"{type(drafter).__name__} drafts trees: accepted a target session "
                         f"that takes tree steps ({type(target).__name__} does not: "
                         "sliding-window layers, recurrent layers under guidance, or "
                         "positions that follow the cache length); use a chain method")
    if not rule.trees:
        raise ValueError(f"rule {rule.name!r} does not verify draft trees: accepted 'exact', "
                         "'greedy' or a relaxed rule (lantern, gsd, annealed) with a tree "
                         "drafter")


def check_pipeline(drafter: Drafter, pipeline: bool | None) -> None:
    if pipeline and not drafter.host_free:
        raise ValueError("pipeline=True: accepted only with a drafter whose steps need no host "
                         "values (host_free: plain decoding, a draft model queued by the "
                         f"engine, ModelDrafter(host_free=True)); got {type(drafter).__name__}")


def check_plain_steps(target: Session, drafter: Drafter, plain_steps: int) -> None:
    check_count("plain_steps", plain_steps)
    if plain_steps > 1 and not (drafter.plain and target.greedy):
        raise ValueError(f"plain_steps={plain_steps}: accepted 1 unless plain decoding of a "
                         f"greedy target (got {type(drafter).__name__}, temperature "
                         f"{target.params.temperature})")


def _to_device(ids: tuple[int, ...], dev: torch.device) -> torch.Tensor:
    """A few host ids on ``dev`` without waiting for the device's queue (a copy from pageable
    memory would: pinned, then queued)."""
    t = torch.tensor(ids, dtype=torch.long)
    return t.pin_memory().to(dev, non_blocking=True) if dev.type == "cuda" and ids else t.to(dev)


def settle(rule: Rule, stops: Stops, ragged: bool, draft_tokens, draft_probs, p, produced,
           active, budget, stop_ids, *, generator=None):
    """A chain step's device work after the target's forward: ``rule`` accepts, then
    ``account``. Returns (VerifyOutput, the next Rows, emitted [B], the packed transfer)."""
    out = rule(draft_tokens, draft_probs, p, generator, validate=False)
    return account(stops, ragged, out, p, draft_probs, produced, active, budget, stop_ids)


def account(stops: Stops, ragged: bool, out: VerifyOutput, p, draft_probs, produced, active,
            budget, stop_ids):
    """Rows that cannot keep holes commit to the common prefix; stops and the budget
    (``budget`` and ``stop_ids``: device tensors) cut what counts; the rows move on; the
    finiteness flag and the counts packed for the one transfer."""
    if not ragged:
        out = _common_prefix(out, active)
    bad = nonfinite(p, draft_probs)            # None: densities validated themselves
    emitted = out.num_emitted
    done, first = (None, emitted) if not stops.ids else stops.cut(out.tokens, emitted, stop_ids)
    cut = torch.where(active, torch.minimum(first, budget - produced), 0)
    produced = produced + cut
    ended = produced >= budget if done is None else done | (produced >= budget)
    running = active & ~ended
    host = HostValues.pack(out, cut, running, bad)
    return out, Rows(out.last_tokens, produced, running), emitted, host


def settle_chain(stops: Stops, ragged: bool, tokens, p, produced, active, budget, stop_ids):
    """Plain steps drawn as one chain (``Loop.plain_steps``): every row emits its ``tokens``
    [B, n, *event] (the chain's draws under greedy processing, distributions ``p``), then
    ``account``."""
    out = VerifyOutput(tokens, torch.full_like(produced, tokens.shape[1] - 1))
    return account(stops, ragged, out, p, None, produced, active, budget, stop_ids)


_SETTLERS: dict = {}


def _fused(key: tuple, fn):
    """``fn`` compiled once per process for ``key`` (``compile_fixed``, whole)."""
    if key not in _SETTLERS:
        _SETTLERS[key] = compile_fixed(fn, fullgraph=True)
    return _SETTLERS[key]


def settler(rule: Rule, stops: Stops, ragged: bool, generator, fuse: bool):
    """``settle`` for one rule, stop set, ragged flag and generator. ``fuse`` (captured
    engines) and a rule that declares ``fuses`` (it draws nothing: no generator): one
    torch.compile'd function, made once per process for each (rule, stops, ragged) and
    traced once per shape, so the step's acceptance and bookkeeping run as a few fused
    kernels instead of a kernel per operation."""
    if not (fuse and rule.fuses):
        return functools.partial(settle, rule, stops, ragged, generator=generator)
    return _fused((rule, stops, ragged), functools.partial(settle, rule, stops, ragged))


def chain_settler(stops: Stops, ragged: bool, fuse: bool):
    """``settle_chain`` for one stop set and ragged flag; compiled as ``settler`` is."""
    fn = functools.partial(settle_chain, stops, ragged)
    return _fused(("chain", stops, ragged), fn) if fuse else fn


class Loop:
    """One generation's loop state; the drivers below run it. ``fuse``: under captured
    engines (``fixed_k``) on CUDA, settle each chain step in one compiled function
    (``settler``). ``plain_steps``: plain decoding's target steps per launch, drawn as one
    ``Session.chain`` (greedy targets; 1: a step per launch)."""

    def __init__(self, target: Session, drafter: Drafter, rule: Rule, first_tokens, *,
                 max_new_tokens: int, stops: Stops, generator, stats: StepStats,
                 profile: bool, fixed_k: bool, overdraft: bool = False, plain_steps: int = 1,
                 fuse: bool = True):
        self.target, self.drafter, self.rule = target, drafter, rule
        self.budget, self.stops, self.generator = max_new_tokens, stops, generator
        self.stats, self.profile, self.fixed_k = stats, profile, fixed_k
        self.overdraft, self.plain_steps = overdraft, plain_steps
        b, dev = first_tokens.shape[0], first_tokens.device
        self.b, self.device = b, dev
        self.rows = Rows(first_tokens, torch.zeros(b, dtype=torch.long, device=dev),
                         torch.ones(b, dtype=torch.bool, device=dev))
        self.pending: Commit | None = None             # the target's deferred rollback
        # Host copies per row: events produced, events the queued steps will have produced
        # (pipelined), rows ended.
        self.produced, self.planned, self.finished = [0] * b, [0] * b, [False] * b
        self._stop_ids = _to_device(stops.ids, dev)
        self._budget = torch.full((), max_new_tokens, dtype=torch.long, device=dev)
        fuse = fuse and fixed_k and dev.type == "cuda"
        self._settle = settler(rule, stops, target.ragged, generator, fuse)
        self._settle_chain = chain_settler(stops, target.ragged, fuse) if plain_steps > 1 else None
        self._t_start = time.perf_counter()

    def _sync(self) -> None:
        if self.profile and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def k_max(self, produced: list[int], finished: list[bool]) -> int:
        """Drafts a step may use: what the running row nearest its end can still emit after
        its one recovered token; with ``overdraft``, what the row with the most budget left
        can (rows nearer their end then draft past it and what they emit there is dropped:
        one row's end does not shorten every other row's drafts)."""
        if self.fixed_k:
            return self.budget
        left = [self.budget - n for n, f in zip(produced, finished) if not f]
        return (max(left) if self.overdraft else min(left)) - 1

    def steps(self, produced: list[int], finished: list[bool]) -> int:
        """Target steps of the next launch: ``plain_steps``, fewer where the running row
        nearest its end has fewer tokens left (no row is fed past its budget)."""
        if self.plain_steps == 1:
            return 1
        return max(1, min([self.plain_steps] + [self.budget - n for n, f
                                                 in zip(produced, finished) if not f]))

    def launch(self, k_max: int, steps: int = 1) -> Launched:
        """Draft, verify, accept and the device-side bookkeeping of one step (``steps`` > 1:
        that many plain steps, ``launch_chain``)."""
        if steps > 1:
            return self.launch_chain(steps)
        rows = self.rows
        t0 = time.perf_counter()
        draft = self.drafter.propose(rows.last, k_max, rows.active)
        self._apply_commit()           # the target's rollback, queued while the device drafts
        self._sync()
        t1 = time.perf_counter()
        fed = (rows.last[:, None] if draft.tokens.shape[1] == 0                 # [B, K+1, *event]
               else torch.cat([rows.last[:, None], draft.tokens], 1))
        valid = rows.active[:, None].expand(self.b, fed.shape[1])
        p = self.target.step(fed, valid, draft.tree)
        self._sync()
        t2 = time.perf_counter()
        state = (rows.produced, rows.active, self._budget, self._stop_ids)
        if draft.tree is None:
            settled = self._settle(draft.tokens, draft.probs, p, *state)
        else:
            out = self.rule.verify_tree(draft.tree, draft.tokens, draft.probs, p, self.generator)
            settled = account(self.stops, self.target.ragged, out, p, draft.probs, *state)
        out, self.rows, emitted, host = settled
        return Launched(out, p, draft.tokens.shape[1], emitted, rows.active, host,
                        (t0, t1, t2, time.perf_counter()))

    def launch_chain(self, steps: int) -> Launched:
        """``steps`` plain steps as one target chain (under captured engines one graph of
        the steps and their greedy draws, ``Session.chain``), settled at once: every running
        row emits ``steps`` tokens, cut at its stop tokens and budget."""
        rows = self.rows
        t0 = time.perf_counter()
        self._apply_commit()
        tokens, p = self.target.chain(rows.last[:, None], rows.active[:, None], steps,
                                      rows.active)
        self._sync()
        t1 = time.perf_counter()
        out, self.rows, emitted, host = self._settle_chain(
            tokens, p, rows.produced, rows.active, self._budget, self._stop_ids)
        return Launched(out, p, 0, emitted, rows.active, host, (t0, t0, t1, time.perf_counter()),
                        steps=steps)

    def read(self, step: Launched) -> HostValues:
        t = time.perf_counter()
        if step.ready is not None:
            step.ready.synchronize()
        tokens = step.out.tokens
        size = tokens[0, 0].numel() if tokens.dim() > 2 else None
        host = HostValues.unpack(step.host.tolist(), size)
        step.accept_seconds += time.perf_counter() - t
        return host

    def commit(self, step: Launched, accepted: list[int] | None) -> None:
        """The drafter's rollback now; the target's is deferred (``_apply_commit``).
        ``accepted`` None (pipelined: counts not read yet): every slot fed is kept, the
        rejected ones as holes."""
        t = time.perf_counter()
        keep = (step.out.tokens.shape[1] if accepted is None
                else max(n for n, f in zip(accepted, self.finished) if not f) + 1)
        if keep == 1 or step.k == 0:   # every row keeps every slot it was fed (one slot, or a
            valid = None               # plain chain's): the target leaves their validity as is
        else:
            kept = torch.arange(keep, device=self.device)
            valid = (kept[None] < step.emitted[:, None]) & step.was_active[:, None]
        path = None if step.out.path is None else step.out.path[:, :keep]
        self.pending = Commit(keep, valid, path)
        self.drafter.observe(step.out, step.p, accepted)
        step.accept_seconds += time.perf_counter() - t

    def _apply_commit(self) -> None:
        c = self.pending
        if c is not None:
            self.target.commit(c.keep, c.valid, c.path)
            self.pending = None

    def flush(self) -> None:
        """The last step's rollback (no next step to queue it behind)."""
        self._apply_commit()

    def event(self, step: Launched, host: HostValues) -> StepEvent | None:
        """Host side of one step: errors, stats and the new tokens; None for a step launched
        after every row had ended (pipelined only; discarded)."""
        t = time.perf_counter()
        if host.bad:
            raise ValueError("the model produced NaN or inf probabilities (check its logits "
                             "and dtype): accepted finite logits")
        if all(self.finished):
            return None
        running = [not f for f in self.finished]
        if step.out.residual_proposals is not None:
            self.stats.record_residuals(host.proposals, host.fallbacks, running)
        if step.steps == 1:
            self.stats.record(host.accepted, step.k, running, host.cut)
        else:                    # a plain chain: each target step, as plain decoding counts it
            for i in range(step.steps):
                ran = [on and i < n for on, n in zip(running, host.cut)]
                self.stats.record([0] * self.b, 0, ran, [int(r) for r in ran])
        new = [toks if on else [] for toks, on in zip(host.tokens, running)]
        for i in (i for i, on in enumerate(running) if on):
            self.produced[i] += host.cut[i]
            self.finished[i] = not host.running[i]
        t0, t1, t2, t3 = step.times
        accept = (t3 - t2) + step.accept_seconds + time.perf_counter() - t
        self.stats.add_phases(t1 - t0, t2 - t1, accept, time.perf_counter() - self._t_start)
        return StepEvent(new_tokens=new, finished=list(self.finished), stats=self.stats)

    # -- the pipelined driver's steps -----------------------------------------------------
    def queue(self) -> Launched:
        """Launch a full-width step and commit it without its counts (host-free drafters)."""
        steps = self.steps(self.planned, self.finished)
        step = self.launch(self.budget, steps)
        self.commit(step, None)
        self.planned = [n + (0 if f else steps) for n, f in zip(self.planned, self.finished)]
        step.send()
        return step

    def wants_more(self) -> bool:
        return any(not f and n < self.budget for f, n in zip(self.finished, self.planned))

    def may_end(self, step: Launched) -> bool:
        """The step may end every running row by its budget."""
        most = step.out.tokens.shape[1]               # K + 1 (a chain), depth + 1 (a tree)
        return all(f or n + most >= self.budget for f, n in zip(self.finished, self.produced))

    def emit(self, step: Launched) -> Iterator[StepEvent]:
        ev = self.event(step, self.read(step))
        if ev is not None:
            yield ev


def _synchronised(loop: Loop) -> Iterator[StepEvent]:
    """Step t + 1 is launched as soon as step t's counts are read (its rows' budgets and ends
    follow from them); step t's tokens are then handed out while the device works."""
    step = loop.launch(loop.k_max(loop.produced, loop.finished),
                       loop.steps(loop.produced, loop.finished))
    while step is not None:
        host = loop.read(step)
        loop.commit(step, host.accepted)
        finished = [f or not r for f, r in zip(loop.finished, host.running)]
        produced = [n + (0 if f else c) for n, f, c in zip(loop.produced, loop.finished, host.cut)]
        nxt = None if all(finished) else loop.launch(loop.k_max(produced, finished),
                                                     loop.steps(produced, finished))
        if nxt is None:
            loop.flush()
        yield loop.event(step, host)
        step = nxt


def _pipelined(loop: Loop) -> Iterator[StepEvent]:
    """Step t + 1 is queued before step t's values are read; ``loop.planned`` is a lower
    bound of each row's tokens (one per step), the rows' real ends arrive one step later, so
    rows ending on a stop token may cost one discarded step."""
    pending = None
    while True:
        if pending is not None and loop.may_end(pending):
            # Read the step in flight before queueing another: a step launched past the end
            # of every row would be discarded whole.
            yield from loop.emit(pending)
            pending = None
        step = loop.queue() if loop.wants_more() else None
        if pending is not None:
            yield from loop.emit(pending)
        if step is None:
            loop.flush()
            return
        pending = step


def stream(target: Session, drafter: Drafter, rule: Rule, first_tokens: torch.Tensor, *,
           max_new_tokens: int, stops: Stops | None = None,
           generator: torch.Generator | None = None, stats: StepStats | None = None,
           profile: bool = False, fixed_k: bool = False, overdraft: bool = False,
           pipeline: bool | None = None, plain_steps: int = 1,
           fuse: bool = True) -> Iterator[StepEvent]:
    """Run the loop after both target and drafter have seen the prompt.

    first_tokens: [B, *event] the last prompt token of each row (not yet fed to either model).
    stops:        what ends a row besides the budget (default: nothing).
    profile:      synchronise the device between phases so the per-phase seconds are exact
                  on CUDA (costs speed; CPU timings are always exact).
    fixed_k:      never shrink K near the end (captured steps keep one width).
    overdraft:    K follows the running row with the most budget left, not the least (rows
                  nearer their end draft past it, up to K positions: the caller checked that
                  they fit the models' positions).
    pipeline:     queue step t + 1 before reading step t (host-free drafters only); None: on
                  for host-free drafters unless ``profile``. Same tokens either way.
    plain_steps:  plain decoding (``NoDraft``) of a greedy target: target steps per launch,
                  drawn as one ``Session.chain`` (captured sessions: one graph). Same tokens.
    fuse:         with ``fixed_k`` on CUDA, settle each step in one compiled function.
    """
    check_count("max_new_tokens", max_new_tokens)
    check_pipeline(drafter, pipeline)
    check_trees(target, drafter, rule)
    check_plain_steps(target, drafter, plain_steps)
    pipe = (drafter.host_free and not profile) if pipeline is None else pipeline
    loop = Loop(target, drafter, rule, first_tokens, max_new_tokens=max_new_tokens,
                stops=stops or Stops(), generator=generator,
                stats=stats if stats is not None else StepStats(), profile=profile,
                fixed_k=fixed_k, overdraft=overdraft, plain_steps=plain_steps, fuse=fuse)
    return _pipelined(loop) if pipe else _synchronised(loop)


def _common_prefix(out: VerifyOutput, active: torch.Tensor) -> VerifyOutput:
    """Commit every running row to the shortest accepted length (for targets whose positions
    follow the cache length, so rows cannot keep holes): each row emits a prefix of its
    valid run, which is still exact."""
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
    stats = kwargs.pop("stats", None) or StepStats()
    events = stream(target, drafter, rule, first_tokens, stats=stats, **kwargs)
    return drain(events, first_tokens.shape[0], stats)


def drain(events: Iterator[StepEvent], rows: int, stats: StepStats) -> LoopResult:
    """Every row's tokens from a loop's ``events``, which rows finished, and ``stats``."""
    tokens: list[list] = [[] for _ in range(rows)]
    finished = [False] * rows
    for ev in events:
        for row, new in zip(tokens, ev.new_tokens):
            row.extend(new)
        finished = ev.finished
    return LoopResult(tokens=tokens, stats=stats, finished=finished)
