"""Strings -> rules, drafters and methods: registration keeps the built-ins, methods are
parsed once and checked before any work, and a drafter passed as the draft is taken as one."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

import mmspec
from mmspec import registry
from mmspec.acceptance import Exact
from mmspec.registry import MethodContext, parse_method
from rule_checks import V, case, check_guarantee


@dataclass(frozen=True, repr=False)
class Doubtful(Exact):
    """A lossless claim with a wrong residual (a fresh draw from p): what the suite catches."""

    name = "doubtful"

    def residual(self, x, p, q, pos):
        return p


def test_register_rule_keeps_the_built_ins(monkeypatch):
    monkeypatch.setattr(registry, "_RULES", {})
    monkeypatch.setattr(registry, "_DRAFTERS", {})
    mmspec.register_rule("doubtful", Doubtful)
    assert isinstance(mmspec.make_rule("exact"), Exact)
    assert isinstance(mmspec.make_rule("doubtful"), Doubtful)
    assert {"exact", "greedy", "lantern", "doubtful"} <= set(mmspec.rule_names())
    with pytest.raises(ValueError, match="accepted a Rule subclass"):
        mmspec.register_rule("nothing", object)


def test_a_registered_rule_meets_the_conformance_check():
    p, q, emb = case(0)
    check_guarantee(Exact(), p, q, 0)
    with pytest.raises(AssertionError):
        check_guarantee(Doubtful(), p, q, 0)


def test_rules_list_their_event_kind_and_guarantee():
    info = {r.name: r for r in mmspec.rules()}
    assert (info["exact"].event, info["exact"].lossless) == ("token", True)
    assert (info["lantern"].event, info["lantern"].lossless) == ("token", False)
    assert info["frame"].event == "frame" and info["frame"].lossless is None
    assert info["continuous"].event == "vector"


def test_methods_are_parsed_once_and_checked_before_any_work():
    m = parse_method("sjd+lantern", {"delta": 0.2, "window": 8}, has_draft=False)
    assert (m.drafter, m.rule, m.num_draft_tokens(), m.uses_draft_model) == ("sjd", "lantern", 8, False)
    assert parse_method("lantern++", has_draft=True).params == {"lam": 2.0}
    assert parse_method("gsd", has_draft=True).drafter == "sjd"
    assert parse_method("exact", has_draft=True).uses_draft_model
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) \['detla'\]"):
        parse_method("lantern", {"detla": 0.1}, has_draft=True)
    with pytest.raises(ValueError, match="unknown rule 'foo'"):
        parse_method("sjd+foo", has_draft=False)
    with pytest.raises(ValueError, match="needs a draft model"):
        parse_method("exact", has_draft=False)
    with pytest.raises(ValueError, match="num_draft_tokens=0"):
        parse_method("sjd", {"num_draft_tokens": 0}, has_draft=False)


def test_a_method_builds_its_drafter_and_rule_from_parameters():
    emb = torch.randn(V, 3)
    ctx = MethodContext(embeddings=emb, jacobi={"init_range": (0, 5)})
    drafter, rule, k = registry.build_method("sjd-maximal+lantern", {"delta": 0.3, "window": 4}, ctx)
    assert isinstance(drafter, mmspec.Jacobi) and drafter.coupling == "maximal" and k == 4
    assert drafter.init_range == (0, 5) and rule.delta == 0.3 and rule.k == V - 1
    with pytest.raises(ValueError, match="needs an embedding table"):
        registry.build_method("sjd+pcg", {}, MethodContext())


def test_a_drafter_passed_as_the_draft_is_taken_as_the_drafter(pair):
    target, _ = pair
    ids = torch.tensor([[1, 2, 3]])
    kw = dict(max_new_tokens=12, temperature=0)
    plain = mmspec.generate(target, None, ids, **kw)
    jac = mmspec.generate(target, mmspec.Jacobi(window=4), ids, **kw)
    assert torch.equal(jac.sequences, plain.sequences) and jac.stats.drafted > 0
    with pytest.raises(ValueError, match="accepted one drafter"):
        mmspec.generate(target, mmspec.Jacobi(window=4), ids, drafter=mmspec.NoDraft(), **kw)
    with pytest.raises(ValueError, match="a draft model goes in draft="):
        mmspec.generate(target, None, ids, drafter=target, **kw)


def test_an_unknown_method_lists_the_methods():
    with pytest.raises(ValueError, match=r"method='sjd-max': accepted one of plain, exact, draft, "
                                         r"head, sjd, .*tree, .*lantern\+\+, <drafter>\+<rule>"):
        parse_method("sjd-max", has_draft=True)


def test_a_method_is_lossless_when_its_rule_and_its_drafter_declare_it(monkeypatch):
    """``Method.lossless``: the rule's ``lossless`` and the drafter's ``lossless_for(params)``
    (default True), so a registered drafter can declare itself relaxed for some parameters."""
    monkeypatch.setattr(registry, "_DRAFTERS", dict(registry._DRAFTERS))

    class Loose(mmspec.NoDraft):
        param_names = ("loose",)

        @classmethod
        def lossless_for(cls, params):
            return not params.get("loose", False)

    mmspec.register_drafter("loose", Loose)
    assert parse_method("loose", has_draft=False).lossless is True
    assert parse_method("loose", {"loose": True}, has_draft=False).lossless is False
    assert parse_method("loose+lantern", has_draft=False).lossless is False
    assert parse_method("plain", has_draft=False).lossless is True
    assert parse_method("sjd-continue", has_draft=False).lossless is False
