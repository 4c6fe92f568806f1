"""Analytic and Monte Carlo checks of the Jacobi drafter family (``mmspec.drafters.jacobi``),
shared by the Jacobi conformance suite (tests/suites/test_jacobi_conformance.py).

The target is given as explicit float64 tables of order 2: p(x_{t+1} | x_{<=t}) =
T[x_{t-1}, x_t], so a distribution computed given stale drafts differs from the one given the
emitted tokens, and a context that differs two tokens back differs too (the trees' spines).

- ``enumerate_method``: the exact distribution of the first m emitted tokens of a Jacobi
  method, following the drafter's steps over every branch, written from the docstrings
  (not from the code): uniform initial drafts with one-hot q; the step's chain or proactive
  tree (the window's draft as child 0, the other children drawn from its q without
  replacement, a child left without mass repeating child 0 as a point mass); the exact rule's
  walk (each child accepted with min(1, r(x) / q(x)), else r <- norm(max(0, r - q)); the last
  token drawn from r); the window shifted and refreshed from the distributions along the
  spine by the coupling (keep / redraw, or an independent draw), forced slots (continuation:
  q = 0), fresh uniform drafts. Couplings ``"none"`` and ``"maximal"``; the Gumbel coupling
  keeps a continuous table per position across steps, which no finite enumeration follows
  (``ENUMERABLE``): it is checked by Monte Carlo only.
- ``drive``: the registered drafter itself with the method's rule, on n rows of the same
  tables: counts of the first m emitted tokens.
"""

from __future__ import annotations

import itertools
from collections import defaultdict

import numpy as np
import torch

S1, S0 = 1, 0                # the prompt's last two tokens
ENUMERABLE = ("none", "maximal")


def ratio(num: float, den: float) -> float:
    """min(1, num / den) with 0/0 -> 0 and c/0 -> 1 (``Rule.ratio``)."""
    if den > 0:
        return min(1.0, num / den)
    return 1.0 if num > 0 else 0.0


def residual(p: tuple, q: tuple) -> tuple:
    """norm(max(0, p - q)); p where nothing is left (``mmspec.sampling.residual``)."""
    r = [max(0.0, a - b) for a, b in zip(p, q)]
    s = sum(r)
    return tuple(x / s for x in r) if s > 0 else tuple(p)


def tv(a: dict, b: dict) -> float:
    return 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


def tables(v: int, seed: int, sharp: float = 2.0, order: int = 2) -> np.ndarray:
    """Random [V, V, V] tables T[a, b] (order 1: rows that ignore a)."""
    g = np.random.default_rng(seed)
    t = np.exp(sharp * g.standard_normal((v, v, v)))
    if order == 1:
        t = np.broadcast_to(t[:1], (v, v, v)).copy()
    return t / t.sum(-1, keepdims=True)


def target(T: np.ndarray, m: int) -> dict:
    """The target's distribution of its first m tokens after the prompt (S1, S0)."""
    out = {}
    for path in itertools.product(range(T.shape[0]), repeat=m):
        w, a, b = 1.0, S1, S0
        for x in path:
            w, a, b = w * float(T[a, b, x]), b, x
        out[path] = w
    return out


def sensitivity(T: np.ndarray) -> float:
    """The largest TV between next-token distributions of two contexts (the continuation's
    delta for these tables)."""
    rows = T.reshape(-1, T.shape[-1])
    return max(0.5 * float(np.abs(a - b).sum()) for a in rows for b in rows)


# -- the step's shape -----------------------------------------------------------------------

def layout(k: int, branch: int, depth: int, spines: int):
    """Nodes of a step over k window positions: a list of (parent, depth, child index) with
    the root as node 0 (child index 0: the window's draft), and each node's children. Chain
    steps are depth 0."""
    nodes = [(-1, 0, 0)]
    level = [0]
    d = min(depth, k)
    for lev in range(1, d + 1):
        level = [_add(nodes, parent, lev, j) for parent in level for j in range(branch)]
    tips = level[:spines] if d else [0]
    for lev in range(d + 1, k + 1):
        tips = [_add(nodes, tip, lev, 0) for tip in tips]
    kids = defaultdict(list)
    for i, (parent, _, _) in enumerate(nodes):
        if i:
            kids[parent].append(i)
    return nodes, kids


def _add(nodes, parent, depth, j) -> int:
    nodes.append((parent, depth, j))
    return len(nodes) - 1


def _siblings(token, q, branch):
    """[((tokens, qs), probability)]: child 0 the window's draft, then branch - 1 children
    drawn from q without replacement (a child left without mass: child 0 as a point mass)."""
    v = len(q)
    out = []

    def go(toks, qs, w):
        if len(toks) == branch:
            out.append(((tuple(toks), tuple(qs)), w))
            return
        left = [0.0 if y in toks else q[y] for y in range(v)]
        s = sum(left)
        if s <= 0:
            point = tuple(1.0 if y == token else 0.0 for y in range(v))
            go(toks + [token], qs + [point], w)
            return
        qj = tuple(x / s for x in left)
        for y in range(v):
            if qj[y] > 0:
                go(toks + [y], qs + [qj], w * qj[y])

    go([token], [tuple(q)], 1.0)
    return out


# -- one step, every branch -----------------------------------------------------------------

def enumerate_method(T: np.ndarray, m: int, *, window: int, coupling: str = "maximal",
                     continuation: int = 0, branch: int = 1, depth: int = 0,
                     spines: int = 1) -> dict:
    """The exact distribution {first m tokens: probability} of a Jacobi method on T."""
    if coupling not in ENUMERABLE:
        raise ValueError(f"coupling={coupling!r} is not enumerable: accepted {ENUMERABLE}")
    v, L = T.shape[0], window
    onehot = [tuple(1.0 if i == j else 0.0 for i in range(v)) for j in range(v)]
    nodes, kids = layout(L, branch, depth, spines)
    out: dict = defaultdict(float)
    frontier: dict = defaultdict(float)
    for xs in itertools.product(range(v), repeat=L):
        frontier[((), tuple((x, onehot[x]) for x in xs))] += v ** -L
    while frontier:
        (path, win), w0 = frontier.popitem()
        for (emitted, spine), w1 in _step(T, path, win, nodes, kids, branch, depth):
            new = path + emitted
            if len(new) >= m:
                out[new[:m]] += w0 * w1
                continue
            n = len(emitted) - 1
            for slots, w2 in _refresh(win, spine, n, coupling, continuation, onehot):
                frontier[(new, slots)] += w0 * w1 * w2
    return dict(out)


def _context(path):
    full = (S1, S0) + tuple(path)
    return full[-2], full[-1]


def _step(T, path, win, nodes, kids, branch, depth):
    """[((emitted tokens, the distributions along the spine, depth 0..L), probability)]."""
    a, b = _context(path)
    d = min(depth, len(win))
    per_level = [_siblings(win[c][0], win[c][1], branch) for c in range(d)] if branch > 1 else []
    results = []
    for choice in itertools.product(*per_level):
        w = 1.0
        for _, cw in choice:
            w *= cw

        def token_q(i):
            _, dep, j = nodes[i]
            if dep <= d and branch > 1:
                return choice[dep - 1][0][0][j], choice[dep - 1][0][1][j]
            return win[dep - 1]

        tok = {0: b}
        for i in range(1, len(nodes)):
            tok[i] = token_q(i)[0]

        def p_at(i):
            parent = nodes[i][0]
            before = a if parent < 0 else tok[parent]
            return tuple(float(x) for x in T[before, tok[i]])

        for (emitted, trail), ww in _walk(0, p_at(0), kids, token_q, p_at):
            spine = _spine(trail, nodes, kids, len(win))
            results.append(((emitted, tuple(p_at(i) for i in spine)), w * ww))
    return results


def _walk(node, r, kids, token_q, p_at):
    """Recursive rejection over the node's children: [((emitted, accepted path), prob)]."""
    out = []

    def go(children, r, w):
        if not children:
            out.extend((((y,), [node]), w * r[y]) for y in range(len(r)) if r[y] > 0)
            return
        child, rest = children[0], children[1:]
        x, q = token_q(child)
        acc = ratio(r[x], q[x])
        if acc > 0:
            for (em, trail), ww in _walk(child, p_at(child), kids, token_q, p_at):
                out.append((((x,) + em, [node] + trail), w * acc * ww))
        if acc < 1:
            go(rest, residual(r, q), w * (1 - acc))

    go(kids[node], r, 1.0)
    return out


def _spine(trail, nodes, kids, L):
    """The node each depth 0..L is read from: the accepted path, then child 0 below it,
    then the chain of all the window's drafts."""
    main = [0]
    for _ in range(L):
        main.append(kids[main[-1]][0])
    spine = list(trail)
    while len(spine) <= L:
        cur = spine[-1]
        nxt = kids[cur][0] if kids[cur] else -1
        spine.append(nxt if nxt >= 0 and nodes[nxt][2] == 0 else main[len(spine)])
    return spine


def _refresh(win, spine_p, n, coupling, continuation, onehot):
    """[(the next window, probability)]: Jacobi's shift by n + 1 and refresh."""
    L, v = len(win), len(onehot)
    zero = (0.0,) * v
    partial = [((), 0, 1.0)]                 # (slots, redraws among covered, probability)
    for s in range(L):
        j = s + n + 1
        nxt = []
        for slots, red, w in partial:
            if j <= L:
                pn = spine_p[j]
                choices = []
                if j < L and coupling == "maximal":
                    x, q = win[j]
                    keep = ratio(pn[x], q[x])
                    if keep > 0:
                        choices.append((x, False, keep))
                    if keep < 1:
                        r = residual(pn, q)
                        choices += [(y, True, (1 - keep) * r[y]) for y in range(v) if r[y] > 0]
                else:
                    old = win[j][0] if j < L else None
                    choices = [(y, y != old, pn[y]) for y in range(v) if pn[y] > 0]
                for y, redrawn, cw in choices:
                    forced = continuation > 0 and red < continuation
                    nxt.append((slots + ((y, zero if forced else pn),), red + redrawn, w * cw))
            elif j < L:
                nxt.append((slots + (win[j],), red, w))
            else:
                nxt += [(slots + ((y, onehot[y]),), red, w / v) for y in range(v)]
        partial = nxt
    return [(slots, w) for slots, _, w in partial]


# -- the drafter itself ---------------------------------------------------------------------

def drive(drafter, rule, T: np.ndarray, m: int, n: int, seed: int) -> np.ndarray:
    """The drafter (built by the registry) with its rule on n rows of T: counts of the first
    m emitted tokens, indexed as itertools.product(range(V), repeat=m)."""
    v = T.shape[0]
    Tt = torch.tensor(T, dtype=torch.float32)
    g = torch.Generator().manual_seed(seed)
    drafter.generator = g
    ids = torch.tensor([[S1, S0]]).expand(n, 2).contiguous()
    drafter.begin(ids, torch.ones_like(ids), vocab_size=v)
    prev, last = ids[:, 0].clone(), ids[:, 1].clone()
    emitted = torch.full((n, m + drafter.window + 1), -1)
    count = torch.zeros(n, dtype=torch.long)
    rows = torch.arange(n)
    while int(count.min()) < m:
        draft = drafter.propose(last, drafter.window)
        fed = torch.cat([last[:, None], draft.tokens], 1)                # [n, K + 1]
        if draft.tree is None:
            before = torch.cat([prev[:, None], fed[:, :-1]], 1)
        else:
            par = draft.tree.full_parents()
            before = torch.where(torch.arange(fed.shape[1]) == 0, prev[:, None], fed.gather(1, par))
        p = Tt[before, fed]
        out = (rule(draft.tokens, draft.probs, p, g) if draft.tree is None else
               rule.verify_tree(draft.tree, draft.tokens, draft.probs, p, g))
        k = out.num_accepted
        for i in range(out.tokens.shape[1]):
            ok = (i <= k) & (count < emitted.shape[1])
            emitted[rows[ok], count[ok]] = out.tokens[ok, i]
            count = count + ok.long()
        drafter.observe(out, p, None)
        prev = torch.where(k > 0, out.tokens.gather(1, (k - 1).clamp(min=0)[:, None])[:, 0], last)
        last = out.last_tokens
    code = (emitted[:, :m] * torch.tensor([v ** (m - 1 - i) for i in range(m)])).sum(1)
    return np.bincount(code.numpy(), minlength=v ** m).astype(float)


def as_array(dist: dict, v: int, m: int) -> np.ndarray:
    return np.array([dist.get(k, 0.0) for k in itertools.product(range(v), repeat=m)])


# -- a tiny model end to end ----------------------------------------------------------------

def model_distribution(model, prompt: list[int], m: int = 3, guidance=None, uncond=None):
    """The model's exact (float64) distribution of its first m tokens after ``prompt``, guided
    u + s (c - u) by the ``uncond`` prompt where ``guidance`` is given."""
    from mmspec.sampling import guide

    v = model.config.vocab_size
    seqs = torch.tensor(list(itertools.product(range(v), repeat=m)))

    def logits(p):
        with torch.no_grad():
            out = model(torch.cat([torch.tensor(p).expand(len(seqs), -1), seqs], 1)).logits
        return out.double()[:, len(p) - 1:-1]

    c = logits(prompt)
    if guidance is not None:
        c = guide(c, logits(uncond), guidance)
    logp = torch.log_softmax(c, -1).gather(-1, seqs[..., None]).squeeze(-1).sum(-1)
    return logp.exp().numpy()


def model_counts(model, prompt: list[int], drafter, n: int, seed: int, m: int = 3,
                 rule="exact", **kw):
    """Counts of the first m generated tokens of n rows through ``mmspec.generate`` (and the
    run's stats)."""
    import mmspec

    ids = torch.tensor(prompt).expand(n, -1).contiguous()
    out = mmspec.generate(model, None, ids, drafter=drafter, max_new_tokens=m + 4, seed=seed,
                          stop_token_ids=[], rule=rule, **kw)
    v = model.config.vocab_size
    gen = out.sequences[:, len(prompt): len(prompt) + m]
    code = (gen * torch.tensor([v ** (m - 1 - i) for i in range(m)])).sum(1)
    return np.bincount(code.numpy(), minlength=v ** m).astype(float), out.stats
