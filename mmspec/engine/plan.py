"""How a call runs on the device: the ``Engine`` a user picks and the ``Plan`` it makes for
one call. Every front door takes the same switches, turns them into an ``Engine`` once, and
asks it for a ``Plan``; sessions, drafters and the loop read the plan, never the switches.

Modes:
    eager     dynamic caches (cropped on rollback), each step run op by op: the reference.
    static    static, position-indexed caches: rollback moves a length, nothing is copied;
              steps pass 4-D masks, so every step of one width has fixed shapes.
    graphs    static caches, each step width captured once as a CUDA graph and replayed
              (``compile="graphs"``; CUDA only).
    regional  as graphs, each decoder layer fused by torch.compile (traced once per width for
              all layers and every cache length) before the step is captured
              (``compile=True``, or ``"regional"``; mmspec.engine.regions).
    inductor  as graphs, each step fused whole by torch.compile before it is captured
              (``compile="inductor"``; about a minute of compilation per width for a 7B model).

Speed switches: every one a field of the ``Engine`` a call is given (docs/engine.md measures
each), on by default; they act on static caches (``shared_pointer``) and captured steps. ``Engine(mode="regional",
row_kernels=False)`` turns one off for one call; nothing in the process changes.

Pipelining: the loop queues step t + 1 on the device before the host reads step t, so the
device never waits for the host between steps. It needs a drafter whose steps need no host
value of the previous one (``Drafter.host_free``): plain decoding, or a draft model that keeps
rejected slots as holes (the plan's ``queue_drafts``; caches then need K + 1 slots per step,
``holes``). ``pipeline=None`` pipelines plain decoding (unless ``profile``) and queues a draft
model's steps under ``graphs`` and ``regional`` (measured faster on an H100,
docs/benchmarks.md) where every draft position fits the models' positions; ``True`` asks for
it, ``False`` turns both off.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Mapping, Sequence

MODES = ("eager", "static", "graphs", "regional", "inductor")
# The captured modes, each its compile= value (compile=True is "regional").
CAPTURED = ("graphs", "regional", "inductor")
# Plain greedy decoding under captured engines: steps per launch, one graph (Engine.plain_steps).
PLAIN_STEPS = 4


def compile_mode(compile) -> str | bool:
    """A ``compile=`` switch as its captured mode's name (True is ``"regional"``), or False."""
    if compile is True:
        return "regional"
    if compile is not False and compile not in CAPTURED:
        raise ValueError(f"compile={compile!r}: accepted False, True, 'graphs', 'regional' or "
                         "'inductor'")
    return compile


# torch.compile options of ``compile="inductor"`` and of the layers under ``"regional"``.
# Decode steps: matrix-vector reductions tuned by coordinate descent (7B, H100: 6.3 -> 5.6 ms
# per step; compilation 34 -> 53 s per width; ``python -m eval.profile_gpu --modes
# inductor-untuned,inductor`` compares); on GPUs that have it (Hopper and later),
# programmatic dependent launch, so each kernel's launch overlaps the end of the one before
# (a 7B step alone 4.66 -> 4.38 ms, one H200); element-wise producers of more than 6
# operations that read two or more tensors (an MLP's silu(gate) * up, an RMSNorm's scaling)
# stored once, not recomputed by every row block of the reduction that reads them (4.54 ->
# 3.99 ms; docs/benchmarks.md).
INDUCTOR_OPTIONS = (("coordinate_descent_tuning", True), ("realize_opcount_threshold", 6),
                    ("triton.enable_pdl", True))


# The Engine fields a captured graph depends on.
GRAPH_SWITCHES = ("group_projections", "row_kernels", "row_norms", "row_rope", "shared_pointer",
                  "decode_kernel", "compiled_tail", "inductor_options", "prompt_inductor_options")


def _options(value, name: str) -> tuple:
    """torch.compile options as sorted (name, value) pairs (hashable, frozen)."""
    if isinstance(value, Mapping):
        value = value.items()
    try:
        pairs = tuple(sorted((str(k), v) for k, v in value))
        hash(pairs)
    except (TypeError, ValueError):
        raise ValueError(f"{name}={value!r}: accepted a mapping of torch.compile option "
                         "names to hashable values (numbers, strings, booleans, tuples)") from None
    return pairs


@dataclass(frozen=True)
class Engine:
    """How one call runs.

    mode:     one of MODES; ``pipeline``: None (decide), True or False; ``profile``:
              synchronise the device between phases so the per-phase seconds are exact
              (costs speed).

    Speed switches of the captured modes (each on by default; docs/engine.md):
    group_projections: under "regional", each layer's sibling projections laid out back to
              back (same Parameters and values) and those reading one input (q/k/v, gate/up)
              run as one product at more than one row (``mmspec.engine.grouping``).
    row_kernels: under "regional" with grouped projections, one-row products (q/k/v, gate/up
              with silu(gate) * up, o and down with their residual adds, output heads) in
              ``mmspec.kernels.gemv``'s kernel instead of inductor's reductions; ``row_norms``: the
              RMSNorm before q/k/v and gate/up inside it; ``row_rope``: q/k/v with its rotary
              embedding and cache writes as one kernel (``mmspec.kernels.qkv_rope``).
    shared_pointer: static caches' full-attention layers share one write pointer, moved once
              per step (``mmspec.cache.SharedPointerLayer``).
    decode_kernel: attention of a few queries over the slots in use through
              ``mmspec.kernels.decode_attention``'s kernel (models whose attention is SDPA).
    compiled_tail: under "regional", a step's work outside the layers (the sequence mask's
              update, the distributions) compiled rather than captured op by op.
    sampled_chains: sampled chains (temperature > 0) captured as one graph too, the call's
              generator followed through one registered with the graph; False: step by step.
    capture_prompts_up_to: prompt passes of at most this many tokens in all (rows x length,
              at least 2 long) on a reused static cache replayed from a CUDA graph, one per
              prompt shape, at most ``captured_prompts`` per cache (later shapes run
              uncaptured): a 127-token pass of a 7B Llama launches some 590 kernels whose host
              time was four times their device time. 0 turns it off.
    plain_steps: plain greedy decoding's target steps per launch, one captured chain
              (``Plan.steps_per_launch``; 1: a step per launch, as vLLM's multi-step decoding).
    fused_settle: each step's settling (stop tokens, budgets, the rule where it draws
              nothing) in one compiled function (``mmspec.loop.settler``) on CUDA.
    inductor_options: torch.compile options of the steps' compiled layers (INDUCTOR_OPTIONS);
              ``prompt_inductor_options``: of prompt passes (bound by compute: none).
    """

    mode: str = "eager"
    pipeline: bool | None = None
    profile: bool = False
    group_projections: bool = True
    row_kernels: bool = True
    row_norms: bool = True
    row_rope: bool = True
    shared_pointer: bool = True
    decode_kernel: bool = True
    compiled_tail: bool = True
    sampled_chains: bool = True
    capture_prompts_up_to: int = 512
    captured_prompts: int = 8
    plain_steps: int = PLAIN_STEPS
    fused_settle: bool = True
    inductor_options: Mapping | tuple = INDUCTOR_OPTIONS
    prompt_inductor_options: Mapping | tuple = ()

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode={self.mode!r}: accepted one of {MODES}")
        if self.pipeline is not None and not isinstance(self.pipeline, bool):
            raise ValueError(f"pipeline={self.pipeline!r}: accepted None, True or False")
        values = vars(self)
        for f in fields(self)[2:]:
            value = values[f.name]
            if f.type == "bool" and not isinstance(value, bool):
                raise ValueError(f"{f.name}={value!r}: accepted True or False")
            low = 1 if f.name == "plain_steps" else 0
            if f.type == "int" and (isinstance(value, bool) or not isinstance(value, int)
                                    or value < low):
                raise ValueError(f"{f.name}={value!r}: accepted an integer >= {low}")
        for name in ("inductor_options", "prompt_inductor_options"):
            object.__setattr__(self, name, _options(values[name], name))

    @property
    def speed(self) -> tuple:
        """The switches a captured step's graph depends on: part of the key of the static
        caches and the steps captured on them (the others only say which are captured)."""
        values = vars(self)
        return tuple(values[name] for name in GRAPH_SWITCHES)

    @classmethod
    def from_switches(cls, compile=False, static_cache=None, pipeline=None,
                      profile: bool = False, engine: "Engine | None" = None) -> "Engine":
        """The front doors' switches: ``compile`` (False; True or ``"regional"``: CUDA graphs
        of steps whose decoder layers torch.compile fused; ``"graphs"``: CUDA graphs alone;
        ``"inductor"``: CUDA graphs of steps fused whole), ``static_cache`` (None: =
        bool(compile)), ``pipeline`` and ``profile``; or ``engine``, an Engine given instead
        of them."""
        if engine is not None:
            if not isinstance(engine, Engine) or (compile, static_cache, pipeline, profile) != (
                    False, None, None, False):
                raise ValueError("engine: accepted an Engine, given instead of compile=, "
                                 "static_cache=, pipeline= and profile= (not with them)")
            return engine
        compile = compile_mode(compile)
        if static_cache not in (None, False, True):
            raise ValueError(f"static_cache={static_cache!r}: accepted None, True or False")
        if compile and static_cache is False:
            raise ValueError("compile=True needs static_cache=True (fixed shapes)")
        mode = compile or ("static" if static_cache else "eager")
        return cls(mode, pipeline, profile)

    @property
    def static(self) -> bool:
        """Static, position-indexed caches."""
        return self.mode != "eager"

    @property
    def captures(self) -> bool:
        """Steps captured as CUDA graphs (K then stays fixed to the end: one width)."""
        return self.mode in CAPTURED

    @property
    def compile(self) -> bool | str:
        """The sessions' ``compile`` argument: the captured mode's name, or False."""
        return self.mode if self.captures else False

    def check(self, model) -> "Engine":
        """Refuse what the model's device cannot do, before any work."""
        if self.captures and next(model.parameters()).device.type != "cuda":
            raise ValueError(f"compile={self.compile!r} captures CUDA graphs: accepted a model "
                             "on a CUDA device")
        return self

    def plan(self, *, max_new_tokens: int, num_draft_tokens: int = 0, draft_model: bool = False,
             holes: bool = False, positions: int | None = None,
             limits: Sequence[int | None] = ()) -> "Plan":
        """The plan of one call.

        max_new_tokens:   events per row (the loop's budget).
        num_draft_tokens: K, drafts per step (0: plain decoding).
        draft_model:      K comes from a draft model whose steps may be queued ahead.
        holes:            the drafter keeps rejected slots as holes whatever the plan (a
                          ``ModelDrafter(host_free=True)`` given by the user).
        positions:        the last position a queued step reaches (prompt + new + K);
                          ``limits``: the models' max_position_embeddings (None: none).
        """
        limits = [m for m in limits if m is not None]
        fits = positions is None or all(positions <= m for m in limits)
        if self.pipeline and draft_model and not fits:
            raise ValueError(f"pipeline=True: the last drafts would pass max_position_embeddings="
                             f"{min(limits)} ({positions} positions needed): accepted fewer new "
                             "tokens or drafts, or pipeline=None")
        default = self.mode in ("graphs", "regional") and not self.profile
        queue = draft_model and fits and (default if self.pipeline is None else self.pipeline)
        return Plan(self, max_new_tokens, num_draft_tokens, queue,
                    num_draft_tokens > 0 and (queue or holes), positions is not None and fits)


@dataclass(frozen=True)
class Plan:
    """What the engine decided for one call.

    queue_drafts: a draft model's drafter keeps rejected slots as holes, so its steps can be
                  queued ahead (``ModelDrafter(host_free=True)``).
    holes:        every step keeps its K + 1 slots (static caches are sized for it).
    overdraft:    a row near its end may draft past its budget, K positions at most (they
                  fit the models' max_position_embeddings), so a step's K follows the row
                  with the most budget left (``mmspec.loop.Loop.k_max``).
    """

    engine: Engine
    max_new_tokens: int
    num_draft_tokens: int
    queue_drafts: bool
    holes: bool
    overdraft: bool = False

    @property
    def fixed_k(self) -> bool:
        """K never shrinks near the end: captured steps keep one width (tokens past the
        budget are dropped; positions may run K past it)."""
        return self.engine.captures

    def static_len(self, prompt_len: int, batch: int) -> int | None:
        """Slots of a static cache for a prompt of ``prompt_len`` (None: dynamic caches)."""
        if not self.engine.static:
            return None
        return static_length(prompt_len, batch, self.max_new_tokens, self.num_draft_tokens,
                             self.holes)

    def cache(self, prompt_len: int, batch: int) -> dict:
        """A session's cache arguments (``static_len``, ``engine``) for its prompt."""
        if not self.engine.static:
            return {}
        return dict(static_len=self.static_len(prompt_len, batch), engine=self.engine)

    def steps_per_launch(self, target, drafter) -> int:
        """Plain decoding's target steps per launch (``mmspec.loop.Loop.plain_steps``):
        ``Engine.plain_steps`` under captured engines where the drafter drafts nothing (``NoDraft``)
        and the target draws greedily in one captured chain (``Session.chains``), as vLLM's
        multi-step decoding; else 1."""
        chained = self.engine.captures and drafter.plain and target.greedy and target.chains
        return self.engine.plain_steps if chained else 1

    def pipelines(self, drafter) -> bool:
        """Whether the loop queues each step before reading the last, for this drafter."""
        if self.engine.pipeline is not None:
            return self.engine.pipeline
        return drafter.host_free and not self.engine.profile


def static_length(prompt_len: int, batch: int, max_new_tokens: int, k: int,
                  holes: bool = False) -> int:
    """Slots a static cache needs: one row uses prompt + new + K + 1; ragged rows (or
    ``holes``: every step keeps its K + 1 slots) leave at most K holes per step, bounded by
    (K + 1) slots per generated token and one more step; rounded up to 64."""
    if batch == 1 and not holes:
        need = prompt_len + max_new_tokens + k + 1
    else:
        need = prompt_len + (k + 1) * (max_new_tokens + 1)
    return -(-need // 64) * 64
