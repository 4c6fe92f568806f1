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
