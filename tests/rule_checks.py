"""Analytic checks shared by the rule suites: p and q tables (float64), a token rule's exact
emitted distribution composed from its ``accept_prob`` and ``residual``, and its declared
guarantee (lossless, a TV bound, or group-lossless)."""

from __future__ import annotations

import torch

from conftest import random_pq
from mmspec.acceptance import Relaxed

V = 16          # the rules' defaults fit (GSD groups of 14)


def case(seed: int, sharp: float = 2.0, zeros: bool = False):
    return random_pq(seed, V, sharp=sharp, zeros=zeros)


def emitted(rule, p, q, pos: int = 0) -> torch.Tensor:
    """Exact distribution of the token emitted at draft position ``pos`` (earlier drafts
    accepted): every draft x weighted by q(x) (a point mass at argmin p when q is None),
    accepted with the rule's accept_prob, else drawn from its residual."""
    xs = torch.arange(V)
    x = torch.zeros(V, pos + 1, dtype=torch.long)
    x[:, pos] = xs
    qq = None if q is None else q.expand(V, pos + 1, V)
    a = rule.accept_prob(x, p.expand(V, pos + 1, V), qq)[:, pos]
    res = rule.residual(xs, p.expand(V, V), None if q is None else q.expand(V, V),
                        torch.full((V,), pos))
    w = torch.zeros(V, dtype=torch.float64)
    if q is None:
        w[int(p.argmin())] = 1.0
    else:
        w = q
    return (w * a) + ((w * (1 - a))[:, None] * res).sum(0)


def check_guarantee(rule, p, q, pos: int) -> None:
    """The declared guarantee of a token rule for target p and draft q (None: point mass)."""
    o = emitted(rule, p, q, pos)
    assert abs(float(o.sum()) - 1) < 1e-12 and float(o.min()) >= -1e-15
    if rule.lossless:
        assert float((o - rule.reference(p)).abs().max()) < 1e-12
    elif isinstance(rule, Relaxed):
        bound = float(rule.tv_bound(p[None], None if q is None else q[None], pos)[0])
        assert 0.5 * float((o - p).abs().sum()) <= bound + 1e-12
    else:
        assert getattr(rule, "group_lossless", False), \
            f"{rule.name}: declares neither lossless, a TV bound nor groups"
        dense = q if q is not None else torch.zeros(V, dtype=torch.float64).index_fill_(
            0, p.argmin(), 1.0)                       # the point mass emitted() drafts
        assert float((emitted_groups(rule, p, dense) - rule.coarse(p[None])[0]).abs().max()) < 1e-12


def emitted_groups(rule, p, q) -> torch.Tensor:
    """A group rule's emitted group distribution, exactly: x ~ q, its owner group g uniform
    among the groups holding x, g accepted with the rule's group probability, else a group
    drawn from its coarse residual (the rule's group contract: groups, group_accept,
    coarse_residual)."""
    groups = rule.groups
    member = torch.zeros(V, V, dtype=torch.bool)                           # member[g, t]
    member[groups.rows, groups.cols] = True
    ga = rule.group_accept(p[None], q[None])[0]
    owner = member.double() * (q / groups.sizes.double())[None]            # [g, x]: q(x)/|S(x)|
    out = owner.sum(1) * ga
    return out + (owner.sum(1) * (1 - ga)).sum() * rule.coarse_residual(p[None], q[None])[0]


def _dist(v: int, gen: torch.Generator, kind: str) -> torch.Tensor:
    w = torch.rand(v, generator=gen, dtype=torch.float64) ** 3
    if kind == "zeros":
        w[torch.randperm(v, generator=gen)[: v // 2]] = 0
    elif kind == "onehot":
        w = torch.zeros(v, dtype=torch.float64)
        w[int(torch.randint(v, (1,), generator=gen))] = 1
    return w / w.sum()


class Tables:
    """Prefix-dependent p and q: one random distribution per (prefix, model)."""

    def __init__(self, v: int, seed: int, p_kind: str, q_kind: str, relation: str):
        self.v, self.seed, self.p_kind, self.q_kind, self.relation = v, seed, p_kind, q_kind, relation
        self._cache: dict = {}

    def get(self, prefix: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        if prefix not in self._cache:
            g = torch.Generator().manual_seed(hash((self.seed,) + prefix) % (2**31))
            p = _dist(self.v, g, self.p_kind)
            if self.relation == "equal":
                q = p.clone()
            elif self.relation == "disjoint":
                half = self.v // 2
                p = torch.cat([p[:half] + 1e-3, torch.zeros(self.v - half, dtype=torch.float64)])
                p /= p.sum()
                q = _dist(self.v, g, self.q_kind)
                q = torch.cat([torch.zeros(half, dtype=torch.float64), q[half:] + 1e-3])
                q /= q.sum()
            else:
                q = _dist(self.v, g, self.q_kind)
            self._cache[prefix] = (p, q)
        return self._cache[prefix]
