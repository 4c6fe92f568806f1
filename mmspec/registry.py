"""Strings -> rules, drafters and methods, in one place at the edge (CLI, config files).

A *method* is a drafter with a rule: ``"plain"``, ``"exact"`` (the draft model with the exact
rule), ``"sjd-maximal"``, ``"lantern"``, ``"sjd+gsd"``. ``parse_method`` reads the string and
its parameters once into a ``Method``, checking both before any model runs; ``Method.build``
then builds the drafter and the rule, each class from its own parameters (``from_params``).
The loop never branches on names.

    method = parse_method("sjd+lantern", {"delta": 0.2, "window": 8}, has_draft=False)
    method.num_draft_tokens()              # 8: sizes static caches before anything is built
    drafter, rule = method.build(context)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

import torch

from .acceptance.base import Rule
from .checks import check_count
from .drafters.base import Drafter

_RULES: dict[str, type] = {}
_DRAFTERS: dict[str, tuple[type, dict]] = {}
# A method that drafts with a head (``Drafter.needs_head``) given a head of one of these kinds
# drafts with that kind's drafter (frames of a delay pattern, a depth decoder's codebooks).
_HEAD_DRAFTERS: list[tuple[type, type]] = []
# Names that stand for a rule with preset parameters.
_RULE_ALIASES = {"lantern++": ("lantern", {"lam": 2.0})}
# Parameters every method accepts: K of a draft model, ignored by drafters without one (so a
# front door's ``num_draft_tokens`` works with every method).
SHARED_PARAMS = ("num_draft_tokens",)


def _load() -> None:
    """The built-in rules and drafters, registered once (user registrations come after)."""
    if _DRAFTERS:
        return
    from . import acceptance
    from .drafters import (DepthDrafter, DepthHead, FeatureDrafter, FrameDrafter, FrameHead,
                           Jacobi, ModelDrafter, NoDraft, ProactiveJacobi, TreeDrafter)

    for name in acceptance.__all__:
        cls = getattr(acceptance, name)
        if isinstance(cls, type) and issubclass(cls, Rule) and cls.name not in (None, "rule"):
            _RULES.setdefault(cls.name, cls)
    _HEAD_DRAFTERS.extend([(DepthHead, DepthDrafter), (FrameHead, FrameDrafter)])
    _DRAFTERS.update({"plain": (NoDraft, {}), "draft": (ModelDrafter, {}),
                      "tree": (TreeDrafter, {}), "head": (FeatureDrafter, {}),
                      "sjd": (Jacobi, {}),
                      "sjd-maximal": (Jacobi, {"coupling": "maximal"}),
                      "sjd-gumbel": (Jacobi, {"coupling": "gumbel"}),
                      # relaxed (Jacobi's docstring): commits past the first rejection
                      "sjd-continue": (Jacobi, {"coupling": "maximal", "continuation": 1}),
                      # lossless: SJD-PAC's proactive tree at the window's start
                      "sjd-proactive": (ProactiveJacobi, {"coupling": "maximal"})})


def register_rule(name: str, cls: type) -> None:
    """Make ``cls`` (a Rule subclass) available by ``name``, beside the built-in rules."""
    if not (isinstance(cls, type) and issubclass(cls, Rule)):
        raise ValueError(f"register_rule({name!r}, {cls!r}): accepted a Rule subclass")
    _load()
    _RULES[name] = cls


def register_drafter(name: str, cls: type, **preset) -> None:
    """Make a Drafter subclass available by ``name`` (``preset``: parameters it always gets)."""
    if not (isinstance(cls, type) and issubclass(cls, Drafter)):
        raise ValueError(f"register_drafter({name!r}, {cls!r}): accepted a Drafter subclass")
    _load()
    _DRAFTERS[name] = (cls, dict(preset))


@dataclass(frozen=True)
class RuleInfo:
    """A registered rule: its name, class, event kind (``"token"``, ``"frame"``: a tuple of
    codebook ids, ``"vector"``: a continuous token) and whether it is lossless (None: as the
    rules it wraps, as ``Frame``'s codebook rules)."""

    name: str
    cls: type
    event: str
    lossless: bool | None


def rules() -> list[RuleInfo]:
    """Every registered rule, by name."""
    _load()
    return [RuleInfo(n, c, c.event, c.lossless if isinstance(c.lossless, bool) else None)
            for n, c in sorted(_RULES.items())]


def rule_names() -> list[str]:
    """The registered rules' names, sorted (built-ins and ``register_rule``'s)."""
    _load()
    return sorted(_RULES)


def drafter_names() -> list[str]:
    _load()
    return sorted(_DRAFTERS)


def rule_class(name: str) -> type:
    _load()
    if name not in _RULES:
        raise ValueError(f"rule={name!r}: accepted one of {sorted(_RULES)} or a Rule object")
    return _RULES[name]


def make_rule(rule: str | Rule, **params) -> Rule:
    """A rule object from a name (``"exact"``, ``"greedy"``, ``"lantern"`` ...) or as is."""
    if isinstance(rule, Rule):
        if params:
            raise ValueError("rule parameters are only accepted with a rule name")
        return rule
    return rule_class(rule)(**params)


def method_names() -> list[str]:
    _load()
    return (["plain", "exact"] + [d for d in sorted(_DRAFTERS) if d != "plain"]
            + [r for r in sorted(_RULES) if r != "exact"] + sorted(_RULE_ALIASES)
            + ["<drafter>+<rule>"])


@dataclass(frozen=True)
class MethodContext:
    """What a method's drafter and rule are built from, given by the adapter.

    draft_session: a zero-argument callable returning the draft model's Session (None: no
                   draft model); called only by drafters that need one.
    embeddings:    the [V, d] table for rules that need one (codebook or token embeddings).
    jacobi:        the adapter's Jacobi settings (init, init_range, grid_width, span_length,
                   event_shape ...), under the method's and the user's.
    queue_drafts:  a draft model's drafter keeps rejected slots as holes, so the loop can
                   queue each step before reading the last (``Plan.queue_drafts``).
    head:          a ``DraftHead`` for drafters on the target's features (method ``"head"``).
    """

    draft_session: Callable[[], object] | None = None
    head: object = None
    embeddings: torch.Tensor | None = None
    jacobi: Mapping = field(default_factory=dict)
    queue_drafts: bool = False


@dataclass(frozen=True)
class Method:
    """A parsed method: drafter and rule names and the parameters for them (aliases applied)."""

    spec: str
    drafter: str
    rule: str
    params: Mapping = field(default_factory=dict)

    @property
    def drafter_class(self) -> type:
        return _DRAFTERS[self.drafter][0]

    @property
    def rule_class(self) -> type:
        return _RULES[self.rule]

    @property
    def lossless(self) -> bool:
        """Whether the method is lossless: its rule declares it (``Rule.lossless`` True; a
        rule whose guarantee depends on its parts, as ``Frame``, does not) and its drafter,
        built from these parameters, keeps it (``Drafter.lossless_for``: ``sjd-continue``
        does not)."""
        return (self.rule_class.lossless is True
                and bool(self.drafter_class.lossless_for(self._drafter_params())))

    @property
    def uses_draft_model(self) -> bool:
        return self.drafter_class.needs_model

    @property
    def uses_head(self) -> bool:
        return self.drafter_class.needs_head

    def _drafter_params(self) -> dict:
        cls, preset = _DRAFTERS[self.drafter]
        mine = {k: v for k, v in self.params.items() if k in cls.param_names}
        return {**preset, **mine}

    def num_draft_tokens(self, jacobi: Mapping | None = None) -> int:
        """K, drafts per step, before anything is built (sizes static caches); ``jacobi``:
        the adapter's Jacobi settings."""
        return self.drafter_class.width(self._drafter_params(), MethodContext(jacobi=jacobi or {}))

    def reach(self, jacobi: Mapping | None = None) -> int:
        """Positions a step's drafts run past the last token (a chain's K, a tree's depth)."""
        return self.drafter_class.reach(self._drafter_params(), MethodContext(jacobi=jacobi or {}))

    def build_rule(self, context: MethodContext) -> Rule:
        cls = self.rule_class
        return cls.from_params({k: v for k, v in self.params.items() if k in cls.param_names()},
                               context)

    def build_drafter(self, context: MethodContext) -> Drafter:
        cls = self.drafter_class
        if cls.needs_head:
            cls = next((d for h, d in _HEAD_DRAFTERS if isinstance(context.head, h)), cls)
        return cls.from_params(self._drafter_params(), context)

    def build(self, context: MethodContext) -> tuple[Drafter, Rule]:
        return self.build_drafter(context), self.build_rule(context)


def _split(spec: str, has_draft: bool) -> tuple[str, str]:
    """``"sjd+gsd"`` -> ("sjd", "gsd"); a drafter alone runs the exact rule; a rule alone
    drafts with the draft model when there is one, else with Jacobi (GSD always on SJD, as in
    its paper); ``"exact"`` is the draft model with the exact rule."""
    if "+" in spec and spec not in _RULE_ALIASES:
        return tuple(spec.split("+", 1))
    if spec in _DRAFTERS:
        return spec, "exact"
    if spec == "exact":
        return "draft", "exact"
    return ("sjd" if spec == "gsd" or not has_draft else "draft"), spec


def parse_method(spec: str, params: Mapping | None = None, *, has_draft: bool,
                 has_head: bool = False) -> Method:
    """A ``Method`` from a method string and its parameters, checked before any work:
    unknown drafters, rules and parameter names raise ValueError naming them; ``has_draft``
    / ``has_head``: a draft model / a ``DraftHead`` was given."""
    _load()
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"method={spec!r}: accepted a method name ({', '.join(method_names())})")
    drafter, rule = _split(spec, has_draft)
    params = dict(params or {})
    if rule in _RULE_ALIASES:
        rule, preset = _RULE_ALIASES[rule]
        params = {**preset, **params}
    if drafter not in _DRAFTERS:
        raise ValueError(f"method={spec!r}: unknown drafter {drafter!r}, accepted {sorted(_DRAFTERS)}")
    if rule not in _RULES and "+" not in spec:
        raise ValueError(f"method={spec!r}: accepted one of {', '.join(method_names())}")
    if rule not in _RULES:
        raise ValueError(f"method={spec!r}: unknown rule {rule!r}, accepted {sorted(_RULES)} or "
                         f"{sorted(_RULE_ALIASES)}")
    if "num_draft_tokens" in params:
        check_count("num_draft_tokens", params["num_draft_tokens"])
    method = Method(spec, drafter, rule, params)
    if method.uses_draft_model and not has_draft:
        raise ValueError(f"method={spec!r} needs a draft model: pass draft=... or use a Jacobi "
                         f"method ('sjd', 'sjd-maximal', 'sjd+{rule}')")
    if method.uses_head and not has_head:
        raise ValueError(f"method={spec!r} drafts with a head on the target's features: pass "
                         "head= a head's folder (any layout docs/drafters.md lists) or a head, "
                         "--head FOLDER on the command line (recipes.train.draft_head trains "
                         "one)")
    known = set(SHARED_PARAMS) | set(method.drafter_class.param_names) | set(
        method.rule_class.param_names())
    unknown = sorted(set(params) - known)
    if unknown:
        raise ValueError(f"unknown parameter(s) {unknown} for method {spec!r}: accepted "
                         f"{sorted(known)}")
    return method


def build_method(spec: str, params: Mapping | None = None,
                 context: MethodContext | None = None) -> tuple[Drafter, Rule, int]:
    """(drafter, rule, K) for a method string: ``parse_method`` then ``Method.build``."""
    context = context or MethodContext()
    method = parse_method(spec, params, has_draft=context.draft_session is not None,
                          has_head=context.head is not None)
    drafter, rule = method.build(context)
    return drafter, rule, drafter.num_tokens
