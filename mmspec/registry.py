"""Strings -> rule and drafter classes, in one place at the edge (CLI, config files).

The loop never branches on names; recipes and ``generate(rule="...")`` look them up here.
"""

from __future__ import annotations

from .acceptance.base import Rule

_RULES: dict[str, type] = {}


def register_rule(name: str, cls: type) -> None:
    _RULES[name] = cls


def rule_names() -> list[str]:
    _load()
    return sorted(_RULES)


def _load() -> None:
    if _RULES:
        return
    from . import acceptance

    for name in acceptance.__all__:
        cls = getattr(acceptance, name)
        if isinstance(cls, type) and issubclass(cls, Rule) and cls.name not in (None, "rule"):
            _RULES[cls.name] = cls


def make_rule(rule: str | Rule, **params) -> Rule:
    """A rule object from a name (``"exact"``, ``"greedy"``, ``"lantern"`` ...) or as is."""
    if isinstance(rule, Rule):
        if params:
            raise ValueError("rule parameters are only accepted with a rule name")
        return rule
    _load()
    if rule not in _RULES:
        raise ValueError(f"rule={rule!r}: accepted one of {sorted(_RULES)} or a Rule object")
    return _RULES[rule](**params)


# -- methods: a drafter with a rule ----------------------------------------------------------

DRAFTER_NAMES = ("plain", "draft", "sjd", "sjd-maximal", "sjd-gumbel")
_RULE_ALIASES = {"lantern++": ("lantern", {"lam": 2.0})}


def method_names() -> list[str]:
    return ["plain", "exact", "draft", "sjd", "sjd-maximal", "sjd-gumbel"] + [
        r for r in rule_names() if r != "exact"] + ["lantern++", "<drafter>+<rule>"]


def parse_method(spec: str, has_draft: bool) -> tuple[str, str]:
    """``"plain"``, ``"exact"``, ``"sjd-maximal"``, ``"lantern"``, ``"sjd+gsd"`` ...
    -> (drafter name, rule name). A rule named alone drafts with the draft model when there
    is one, else with Jacobi (GSD always runs on SJD, as in its paper)."""
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"method={spec!r}: accepted a method name ({', '.join(method_names())})")
    if "+" in spec and spec not in _RULE_ALIASES:
        drafter, rule = spec.split("+", 1)
    elif spec in DRAFTER_NAMES:
        drafter, rule = spec, "exact"
    elif spec == "exact":
        drafter, rule = "draft", "exact"
    else:
        drafter, rule = ("sjd" if spec == "gsd" or not has_draft else "draft"), spec
    if drafter not in DRAFTER_NAMES:
        raise ValueError(f"method={spec!r}: unknown drafter {drafter!r}, accepted {DRAFTER_NAMES}")
    _load()
    if rule not in _RULES and rule not in _RULE_ALIASES:
        raise ValueError(f"method={spec!r}: unknown rule {rule!r}, accepted {rule_names()} or "
                         f"{sorted(_RULE_ALIASES)}")
    if drafter == "draft" and not has_draft:
        raise ValueError(f"method={spec!r} needs a draft model: pass draft=... or use a Jacobi "
                         f"method ('sjd', 'sjd-maximal', 'sjd+{rule}')")
    return drafter, rule


def build_method(spec: str, params: dict | None = None, *, draft_session=None,
                 embeddings=None, jacobi_defaults: dict | None = None, host_free: bool = False):
    """(drafter, rule) for a method name and its parameters.

    params:          rule and drafter parameters by name (``delta``, ``k``, ``window``,
                     ``coupling``, ``num_draft_tokens`` ...); unknown names raise.
    draft_session:   a zero-argument callable returning the draft model's Session (or None).
    embeddings:      the [V, d] table for rules that need one (codebook or token embeddings).
    jacobi_defaults: the adapter's Jacobi settings (init_range, grid_width, init ...).
    host_free:       a draft model's drafter keeps rejected slots as holes, so the loop can
                     queue each step before reading the last (``ModelDrafter(host_free=True)``).
    """
    import dataclasses

    from .drafters import Jacobi, ModelDrafter, NoDraft

    params = dict(params or {})
    drafter_name, rule_name = parse_method(spec, draft_session is not None)
    if rule_name in _RULE_ALIASES:
        rule_name, extra = _RULE_ALIASES[rule_name]
        for k, v in extra.items():
            params.setdefault(k, v)
    cls = _RULES[rule_name]
    fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    rule_kw = {k: params.pop(k) for k in list(params) if k in fields and not k.startswith("_")}
    if "embeddings" in fields and "embeddings" not in rule_kw:
        if embeddings is None:
            raise ValueError(f"rule {rule_name!r} needs an embedding table (codebook)")
        rule_kw["embeddings"] = embeddings
    if rule_name == "lantern" and "lam" in rule_kw:
        rule_kw.setdefault("delta", None)
    if rule_name == "lantern" and "k" not in rule_kw:
        rule_kw["k"] = min(1000, rule_kw["embeddings"].shape[0] - 1)
    rule = cls(**rule_kw)

    if drafter_name == "plain":
        drafter = NoDraft()
    elif drafter_name == "draft":
        k = params.pop("num_draft_tokens", 4)
        drafter = ModelDrafter(draft_session(), k, host_free=host_free)
    else:
        jkw = dict(jacobi_defaults or {})
        if drafter_name != "sjd":
            jkw["coupling"] = drafter_name.split("-", 1)[1]
        for name in ("window", "init", "coupling", "init_range", "grid_width"):
            if name in params:
                jkw[name] = params.pop(name)
        drafter = Jacobi(**jkw)
    if params:
        raise ValueError(f"unknown parameter(s) {sorted(params)} for method {spec!r}")
    return drafter, rule
