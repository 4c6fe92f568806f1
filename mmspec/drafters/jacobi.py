"""Speculative Jacobi decoding, SJD (Teng et al., ICLR 2025), and its marginal-preserving
couplings (SCD / MC-SJD, arXiv 2510.24211).

The target drafts for itself. The drafter keeps, per row, a window of L draft tokens after
the committed prefix together with the distributions q they were drawn from. Each step the
target verifies ``[last, window[:K]]`` (K = L unless the loop's budget is smaller) and
returns p_0..p_K; the rule accepts n drafts and emits one more token. Then the window
shifts by n + 1 and is refreshed:

- slots whose position the pass covered get a new draft x' with q' = p_new (the target's
  distribution there, conditioned on the stale drafts before it), drawn by the coupling:
    * ``"none"``    x' ~ p_new independently (plain SJD);
    * ``"maximal"`` keep the old draft x with probability min(1, p_new(x) / q_old(x)),
                    else draw from norm(max(0, p_new - q_old)) (so x' = x with probability
                    1 - TV, and x' ~ p_new exactly);
    * ``"gumbel"``  x' = argmax(log p_new + G_pos) with a persistent Gumbel table per
                    absolute position, shifted with the window (x' ~ p_new exactly, and
                    equal to the previous draft whenever the argmax does not move);
- slots the pass did not reach keep their old draft and q;
- new slots at the end get a fresh token from the initialisation with a one-hot q.

Lossless: each draft at position t is, given everything at positions < t, distributed as
the q recorded for it (fresh randomness, or a Gumbel row used only for position t), and the
acceptance test uses fresh uniforms, so the exact rule emits the target's distribution.
A fresh token with a one-hot q is a point-mass draft, lossless for any way it was chosen.

Continuation (``continuation=c``, method ``sjd-continue``: c = 1; maximal coupling only): SJD-PAC's
adaptive continuation (Kang et al., CVPR 2026) read as committing past the first rejection. The
coupling's keep test of a slot the pass covered is the exact test of its old draft against the
stale distribution (computed given the drafts before it, the rejected one included); the new
drafts of the covered slots, from the first up to and including the c-th redraw, are *forced*:
recorded with q = 0, which the exact rule accepts whenever the fresh target gives the token
any mass (ratio p/0 = 1; a token it excludes is redrawn from p, the residual against q = 0).
So the tokens the stale tests passed are emitted, as they would be if the window had gone on
verifying against its cached distributions, and the target sees them in their true context
when the next step feeds them (no stale cache entry survives). This is *not* lossless: a forced
token follows p(. | the stale drafts before it), not p(. | the emitted tokens before it).
Bound (hybrid argument over positions): TV(first m emitted, target) <= sum over forced tokens
of E[TV(p(. | stale context), p(. | emitted context))] <= (m - 1) delta_c, where delta_c is the
largest TV between the target's next-token distributions for two contexts that differ in at
most c of the window's tokens; ``tests/drafters/test_sjd_pac.py`` enumerates it in float64 and gives a
counterexample (docs/METHODS.md, section 3). ``continuation=0`` is the maximal coupling:
lossless, and the adaptive continuation of SJD-PAC's released code, which commits only up to
the first rejection and keeps the stale-tested tail as the next drafts.

Proactive trees (``ProactiveJacobi``, method ``sjd-proactive``): SJD-PAC's proactive drafting
in its lossless form. Each step proposes the window as a tree whose first positions offer K
children (the window's draft, then draws from its q without replacement), verified by the exact
tree rule; lossless with every coupling (the class docstring).

Initialisations (``init``): ``"uniform"`` over ``init_range`` = [lo, hi) (the adapter gives
the image-token span or codebook); spatial priors on a raster grid of ``grid_width``:
``"repeat_horizon"`` copies the token to the left, ``"sample_horizon"`` samples from the
left neighbour's distribution, ``"repeat_vertical"`` copies the token above (``grid_width``
positions back), ``"sample_vertical"`` samples from the distribution above when it is still
in the window (else copies it). Grid positions count generated tokens from the loop's start:
the adapter runs the loop over exactly the region it wants drafted (for images the
image-token span), so outside it decoding is ordinary.
"""

from __future__ import annotations

import torch

from ..checks import check_count
from ..sampling import residual, sample
from ..tree import Tree
from ..types import Draft
from .base import Drafter

INITS = ("uniform", "repeat_horizon", "sample_horizon", "repeat_vertical", "sample_vertical")
COUPLINGS = ("none", "maximal", "gumbel")


def _gumbel(shape, device, dtype, generator) -> torch.Tensor:
    u = torch.rand(shape, device=device, dtype=dtype, generator=generator)
    tiny = torch.finfo(dtype).tiny
    e = (-torch.log(u.clamp_min(tiny))).clamp_min(tiny)     # Exp(1), never 0
    return -torch.log(e)


def _one_hot(x: torch.Tensor, v: int, dtype) -> torch.Tensor:
    return torch.zeros(*x.shape, v, dtype=dtype, device=x.device).scatter_(-1, x[..., None], 1.0)


class Jacobi(Drafter):
    """``Jacobi(window=16, init="uniform", coupling="none", init_range=None, grid_width=None,
    span_length=None)`` -- a drafter usable wherever a drafter is.

    window:      L, drafts kept per row (>= 1).
    init:        one of INITS.
    coupling:    one of COUPLINGS.
    init_range:  (lo, hi) ids for uniform initialisation (default: the whole vocabulary).
    grid_width:  tokens per grid row, for the spatial priors (required by them).
    span_length: the region's length, checked to be a multiple of grid_width when given.
    event_shape: () for token streams; (C,) for frames of C ids verified by ``Frame`` (a
                 delay pattern's parallel heads): every id of a frame is a draft of its own
                 with its own q, coupled per codebook; uniform initialisation only.
    continuation: c >= 0, rejections a window continues past against its stale
                 distributions (module docstring); c > 0 is a relaxed method
                 (``lossless_for`` False), with ``coupling="maximal"`` on token streams only.
    """

    param_names = ("window", "init", "coupling", "init_range", "grid_width", "continuation")

    def __init__(self, window: int = 16, init: str = "uniform", coupling: str = "none",
                 init_range: tuple[int, int] | None = None, grid_width: int | None = None,
                 span_length: int | None = None, generator=None, event_shape: tuple = (),
                 continuation: int = 0):
        if not isinstance(window, int) or window < 1:
            raise ValueError(f"window={window!r}: accepted an integer >= 1")
        if init not in INITS:
            raise ValueError(f"init={init!r}: accepted one of {INITS}")
        if coupling not in COUPLINGS:
            raise ValueError(f"coupling={coupling!r}: accepted one of {COUPLINGS}")
        if init != "uniform" and grid_width is None:
            raise ValueError(f"init={init!r} needs grid_width (tokens per grid row)")
        if grid_width is not None and (not isinstance(grid_width, int) or grid_width < 1):
            raise ValueError(f"grid_width={grid_width!r}: accepted an integer >= 1")
        if span_length is not None and grid_width is not None and span_length % grid_width:
            raise ValueError(f"grid_width={grid_width} does not divide span_length="
                             f"{span_length}: accepted a width that divides the span")
        if init_range is not None:
            lo, hi = init_range
            if not (isinstance(lo, int) and isinstance(hi, int) and 0 <= lo < hi):
                raise ValueError(f"init_range={init_range!r}: accepted (lo, hi) with 0 <= lo < hi")
        event_shape = tuple(event_shape)
        if event_shape and init != "uniform":
            raise ValueError(f"init={init!r}: events of several ids (codec frames) accept "
                             "init='uniform' only")
        if isinstance(continuation, bool) or not isinstance(continuation, int) or continuation < 0:
            raise ValueError(f"continuation={continuation!r}: accepted an integer >= 0")
        if continuation and coupling != "maximal":
            raise ValueError(f"continuation={continuation} needs coupling='maximal' (its keep "
                             f"test is the stale verification), got coupling={coupling!r}")
        if continuation and event_shape:
            raise ValueError(f"continuation={continuation}: accepted on token streams only, "
                             "not on events of several ids (codec frames)")
        self.continuation = continuation
        self.event_shape = event_shape
        self.window, self.init, self.coupling = window, init, coupling
        self.init_range, self.grid_width = init_range, grid_width
        self.generator = generator
        self.num_tokens = window

    @classmethod
    def lossless_for(cls, params) -> bool:
        """False with a continuation (c > 0 commits tokens tested against stale distributions:
        relaxed, module docstring's bound); True otherwise."""
        return not params.get("continuation", 0)

    @classmethod
    def width(cls, params, context) -> int:
        return params.get("window", context.jacobi.get("window", 16))

    @classmethod
    def from_params(cls, params, context) -> "Jacobi":
        """The adapter's settings (``context.jacobi``: span, grid, id range), then the
        method's (``coupling`` of ``sjd-maximal`` ...), then the user's."""
        return cls(**{**context.jacobi, **params})

    # -- state ----------------------------------------------------------------------------
    def begin(self, input_ids, attention_mask, vocab_size: int | None = None, **prompt) -> None:
        """Start a window after the prompt (``prompt`` extras such as guidance are unused)."""
        if vocab_size is None:
            raise ValueError("Jacobi.begin needs vocab_size (the loop passes the target's)")
        if self.init_range is not None and self.init_range[1] > vocab_size:
            raise ValueError(f"init_range={self.init_range}: accepted ids inside the vocabulary "
                             f"[0, {vocab_size})")
        b, L = input_ids.shape[0], self.window
        dev = input_ids.device
        self.v = vocab_size
        self.dtype = torch.float32
        self.gen_pos = torch.zeros(b, dtype=torch.long, device=dev)     # committed generated
        self.history = torch.zeros(b, 64, dtype=torch.long, device=dev)  # committed ids
        ev = self.event_shape
        self.gumbel = (_gumbel((b, L, *ev, vocab_size), dev, self.dtype, self.generator)
                       if self.coupling == "gumbel" else None)
        # The prompt's last token may live outside the drafted id space (a begin-of-image text
        # id): priors that copy it fall back to a uniform draw from init_range.
        last = input_ids[:, -1]
        inside = (last >= 0) & (last < vocab_size)
        lo, hi = self.init_range if self.init_range is not None else (0, vocab_size)
        last = torch.where(inside, last, torch.randint(lo, hi, last.shape, device=dev,
                                                       generator=self.generator))
        self.tokens = torch.zeros(b, L, *ev, dtype=torch.long, device=dev)
        self.q = torch.zeros(b, L, *ev, vocab_size, dtype=self.dtype, device=dev)
        start = torch.zeros(b, dtype=torch.long, device=dev)
        self._fill(start, last, prev_q=None if ev else _one_hot(last, vocab_size, self.dtype))

    def propose(self, last: torch.Tensor, k_max: int, active=None) -> Draft:
        k = max(0, min(self.window, k_max))
        return Draft(tokens=self.tokens[:, :k], probs=self.q[:, :k])

    # -- refresh ----------------------------------------------------------------------------
    def _take(self, t: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """t [B, L', ...] gathered at slots idx [B, L] along dim 1 -> [B, L, ...]."""
        view = idx.view(*idx.shape, *([1] * (t.dim() - 2)))
        return t.gather(1, view.expand(*idx.shape, *t.shape[2:]))

    def _ev(self, m: torch.Tensor) -> torch.Tensor:
        """A [B, L] mask broadcast over the event dims."""
        return m.view(*m.shape, *([1] * len(self.event_shape)))

    def observe(self, out, target_probs, num_accepted) -> None:
        b, L = self.tokens.shape[:2]
        dev = self.tokens.device
        k = target_probs.shape[1] - 1
        n = out.num_accepted
        shift = n + 1                                                        # [B]
        if not self.event_shape:
            self._record(out, n)
        slots = torch.arange(L, device=dev)
        j = slots[None] + shift[:, None]                                     # old slot index
        has_p = j <= k
        has_old = j < L
        jo = j.clamp(max=L - 1)
        old_tok = self._take(self.tokens, jo)
        old_q = self._take(self.q, jo)
        p_new = self._take(target_probs.to(self.dtype), j.clamp(max=k))
        if self.gumbel is not None:
            fresh = _gumbel(self.gumbel.shape, dev, self.dtype, self.generator)
            self.gumbel = torch.where(self._ev(has_old)[..., None], self._take(self.gumbel, jo), fresh)

        new_tok = self._couple(p_new, old_tok, old_q, self._ev(has_old))
        tokens = torch.where(self._ev(has_p), new_tok, old_tok)
        q = torch.where(self._ev(has_p)[..., None], p_new, old_q)
        if self.continuation:
            # The covered slots are a prefix of the window; force them up to and including
            # the c-th redraw (a draw without an old draft counts as one). A redraw is a new
            # draft that differs from the old one x: the keep test fails only where
            # p_new(x) < q_old(x) or both are 0 (a forced x the target excludes), and there
            # the residual (or p_new, where the residual is empty) gives x no mass.
            red = (has_p & (~has_old | (new_tok != old_tok))).long()
            forced = has_p & (red.cumsum(1) - red < self.continuation)
            q = torch.where(forced[..., None], torch.zeros_like(q), q)
        self.tokens, self.q = tokens, q
        # Fresh slots: neither a new distribution nor an old draft.
        start = torch.where(has_p | has_old, L, slots[None]).amin(1)          # first fresh
        prev_q = None
        if self.init in ("sample_horizon",):
            idx = (start - 1).clamp(min=0)
            prev_q = torch.where((start > 0)[:, None], self.q[torch.arange(b, device=dev), idx],
                                 _one_hot(out.last_tokens, self.v, self.dtype))
        self._fill(start, out.last_tokens, prev_q)

    def _couple(self, p_new, old_tok, old_q, has_old) -> torch.Tensor:
        """The new drafts of the slots the pass covered (``has_old``: an old draft there)."""
        g = self.generator
        if self.coupling == "none":
            return sample(p_new, g)
        if self.coupling == "gumbel":
            return (p_new.clamp_min(0).log() + self.gumbel).argmax(-1)
        # maximal coupling with the old draft, where there is one
        p_x = p_new.gather(-1, old_tok[..., None]).squeeze(-1)
        q_x = old_q.gather(-1, old_tok[..., None]).squeeze(-1)
        keep = torch.rand(p_x.shape, device=p_x.device, generator=g) * q_x < p_x
        redraw = sample(residual(p_new, old_q), g)
        coupled = torch.where(keep, old_tok, redraw)
        return torch.where(has_old, coupled, sample(p_new, g))

    def _record(self, out, n) -> None:
        """Append each row's emitted tokens to its committed history."""
        b = n.shape[0]
        width = int(out.tokens.shape[1])
        cap = self.history.shape[1]
        need = int(self.gen_pos.max()) + width
        if need > cap:
            grow = torch.zeros(b, need - cap + 64, dtype=torch.long, device=n.device)
            self.history = torch.cat([self.history, grow], 1)
        cols = self.gen_pos[:, None] + torch.arange(width, device=n.device)[None]
        valid = torch.arange(width, device=n.device)[None] <= n[:, None]
        cur = self.history.gather(1, cols)
        self.history.scatter_(1, cols, torch.where(valid, out.tokens.clamp(min=0), cur))
        self.gen_pos = self.gen_pos + n + 1

    def _fill(self, start: torch.Tensor, last: torch.Tensor, prev_q) -> None:
        """Initialise window slots s >= start[b] (fresh drafts, one-hot q)."""
        b, L = self.tokens.shape[:2]
        dev = self.tokens.device
        slots = torch.arange(L, device=dev)
        fresh = slots[None] >= start[:, None]                                   # [B, L]
        if not bool(fresh.any()):
            return
        rows = torch.arange(b, device=dev)
        if self.init == "uniform":
            lo, hi = self.init_range if self.init_range is not None else (0, self.v)
            if self.gumbel is not None:   # consistent with the coupling: argmax of the table
                tok = self.gumbel[..., lo:hi].argmax(-1) + lo
            else:
                tok = torch.randint(lo, hi, (b, L, *self.event_shape), device=dev,
                                    generator=self.generator)
        elif self.init in ("repeat_horizon", "sample_horizon"):
            prev = torch.where(start > 0, self.tokens[rows, (start - 1).clamp(min=0)], last)
            tok = prev[:, None].expand(b, L)
            if self.init == "sample_horizon":
                tok = sample(prev_q[:, None].expand(b, L, self.v), self.generator)
        else:
            tok = self._vertical(fresh, last)
        self.tokens = torch.where(self._ev(fresh), tok, self.tokens)
        self.q = torch.where(self._ev(fresh)[..., None], _one_hot(self.tokens, self.v, self.dtype),
                             self.q)

    def _vertical(self, fresh: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        """Token above each fresh slot (grid_width back), else the token to the left."""
        b, L = fresh.shape
        w = self.grid_width
        tok = self.tokens.clone()
        for s in range(L):
            col = fresh[:, s]
            if not bool(col.any()):
                continue
            pos = self.gen_pos + s                                    # generated index
            above = pos - w
            from_window = tok[:, s - w] if s >= w else tok[:, 0]
            in_window = above >= self.gen_pos
            idx = above.clamp(0, self.history.shape[1] - 1)
            from_hist = self.history.gather(1, idx[:, None]).squeeze(1)
            left = tok[:, s - 1] if s > 0 else last
            cand = torch.where(in_window, from_window, from_hist)
            cand = torch.where(above >= 0, cand, left)
            if self.init == "sample_vertical" and s >= w:
                sampled = sample(self.q[:, s - w], self.generator)
                cand = torch.where(in_window & (above >= 0), sampled, cand)
            tok[:, s] = torch.where(col, cand, tok[:, s])
        return tok


class ProactiveJacobi(Jacobi):
    """``ProactiveJacobi(window=16, tree_branch=4, tree_depth=2, tree_spines=1, **jacobi)`` --
    SJD-PAC's proactive drafting (Kang et al., CVPR 2026) in its lossless form, method
    ``sjd-proactive`` (any coupling; ``sjd-proactive`` itself: maximal).

    Each step proposes the window as a tree instead of a chain. The window's first
    ``tree_depth`` positions (just after the last rejection, where the window's distributions
    are stalest) are a product tree: every node of level d - 1 (the root: the last emitted
    token) has ``tree_branch`` children, the same tokens under every parent:

    - child 0: the window's own draft at that position (the coupling's; q its recorded q);
    - children 1..K-1: drawn from that q without replacement, the window's draft excluded
      (an exponential race; under the Gumbel coupling the next keys of the position's own
      persistent table), each recorded with q without the earlier children, renormalised:
      Jeon et al.'s recursive rejection sampling, which ``mmspec.acceptance.tree`` verifies.
      A child left without mass (q's support used up: a one-hot q of a fresh slot, a top-k
      cut) repeats child 0 as a point mass, which the rule never accepts once child 0 was
      rejected (the residual has no mass there).

    Below level ``tree_depth`` the window's remaining drafts follow as a chain under the first
    ``tree_spines`` nodes of that level (in level order: the first is the node whose path is
    all the window's drafts).
    Nodes per step: sum_{d <= D} K^d + spines (L - D).

    Lossless with the exact rule (``mmspec.acceptance.tree``'s proof): every node's children
    are drawn given only the history (the last pass's distributions, the old window, fresh
    randomness), never given the tokens at the levels above them, so whichever path the walk
    takes, a node's children are distributed as the q's recorded for them; the window's own
    drafts keep the coupling's marginals (a position is tested only in the step that commits
    it). ``tests/suites/test_jacobi_conformance.py`` enumerates it in float64.

    After the step the window shifts past the emitted tokens as Jacobi's does; its refreshed
    slots couple with the distributions computed along the *spine*: the accepted path, then
    child 0 of each node below it, then the chain (the nodes whose contexts are nearest the
    emitted one that the pass computed).
    """

    trees = True
    param_names = Jacobi.param_names + ("tree_branch", "tree_depth", "tree_spines")

    def __init__(self, window: int = 16, *, tree_branch: int = 4, tree_depth: int = 2,
                 tree_spines: int = 1, **jacobi):
        super().__init__(window, **jacobi)
        if self.continuation:
            raise ValueError(f"continuation={self.continuation}: a proactive tree verifies "
                             "every position against fresh distributions; accepted 0")
        if self.event_shape:
            raise ValueError("a proactive tree drafts token streams: events of several ids "
                             "(codec frames) accepted with the chain methods (sjd, sjd-maximal)")
        self.branch = check_count("tree_branch", tree_branch)
        self.depth = check_count("tree_depth", tree_depth)
        self.spines = check_count("tree_spines", tree_spines)
        self.num_tokens = self.nodes(window, self.branch, self.depth, self.spines)
        self._layouts: dict = {}
        self._layout = None

    @staticmethod
    def nodes(k: int, branch: int, depth: int, spines: int) -> int:
        """Nodes of a step over k window positions (the root apart)."""
        d = min(depth, k)
        tree = sum(branch ** i for i in range(1, d + 1))
        return tree + min(spines, branch ** d) * (k - d)

    @classmethod
    def _tree_args(cls, params) -> tuple[int, int, int]:
        return tuple(check_count(f"tree_{n}", params.get(f"tree_{n}", v))
                     for n, v in (("branch", 4), ("depth", 2), ("spines", 1)))

    @classmethod
    def width(cls, params, context) -> int:
        window = super().width(params, context)
        return cls.nodes(window, *cls._tree_args(params))

    @classmethod
    def reach(cls, params, context) -> int:
        """The window: the deepest node sits ``window`` positions past the root."""
        return Jacobi.width(params, context)

    # -- the tree ---------------------------------------------------------------------------
    def propose(self, last: torch.Tensor, k_max: int, active=None) -> Draft:
        k = max(0, min(self.window, k_max))
        if k == 0:
            self._layout = None
            return Draft(tokens=self.tokens[:, :0], probs=self.q[:, :0])
        lay = self._layout = self._layout_for(k, last.device)
        tok_tree, q_tree = self._siblings(lay["levels"])                # [B, D, K], [B, D, K, V]
        flat = lay["column"] * self.branch + lay["branch"]              # tree nodes
        tokens = [tok_tree.flatten(1)[:, flat]]
        probs = [q_tree.flatten(1, 2)[:, flat]]
        if lay["chain"].numel():
            tokens.append(self.tokens[:, lay["chain"]])
            probs.append(self.q[:, lay["chain"]])
        tree = Tree(lay["parents"].expand(self.tokens.shape[0], -1), k, lay["children"])
        return Draft(tokens=torch.cat(tokens, 1), probs=torch.cat(probs, 1), tree=tree)

    def _siblings(self, levels: int):
        """The K children at each of the first ``levels`` window positions: tokens [B, D, K]
        and the q each was drawn from [B, D, K, V] (class docstring)."""
        main, q = self.tokens[:, :levels], self.q[:, :levels]               # [B, D], [B, D, V]
        if self.branch == 1:
            return main[..., None], q[:, :, None]
        if self.gumbel is not None:       # the position's own keys: Gumbel-top-k
            key = q.clamp_min(0).log() + self.gumbel[:, :levels]
        else:                             # the exponential race: top-k of q / E
            e = torch.empty_like(q).exponential_(generator=self.generator)
            key = q / e.clamp_min(torch.finfo(e.dtype).tiny)
        key = key.scatter(-1, main[..., None], float("inf"))                # child 0: the draft
        drawn = min(self.branch, self.v)                  # more children than ids: the rest dead
        idx = key.topk(drawn, -1).indices                                   # [B, D, drawn]
        idx = torch.cat([idx, main[..., None].expand(*main.shape, self.branch - drawn)], -1)
        taken = torch.nn.functional.one_hot(idx, self.v).to(q.dtype)        # [B, D, K, V]
        qj = q[:, :, None] * (1 - (taken.cumsum(2) - taken))
        mass = qj.sum(-1, keepdim=True)
        qj = torch.where(mass > 0, qj / torch.where(mass > 0, mass, 1), qj)
        qj[:, :, 0] = q
        dead = (q.gather(-1, idx) <= 0) | (torch.arange(self.branch, device=q.device) >= drawn)
        dead[:, :, 0] = False
        tok = torch.where(dead, main[..., None], idx)
        qj = torch.where(dead[..., None], _one_hot(main, self.v, q.dtype)[:, :, None], qj)
        return tok, qj

    def _layout_for(self, k: int, device) -> dict:
        """The step's tree over k positions, the same for every row (cached per k): parents,
        each tree node's window column and child index, the chain's columns, each node's
        child 0 (-1: none) and the node of all the window's drafts at each depth."""
        key = (k, device)
        if key not in self._layouts:
            self._layouts[key] = self._build_layout(k, device)
        return self._layouts[key]

    def _build_layout(self, k: int, device) -> dict:
        kb, d = self.branch, min(self.depth, k)
        parents, column, branch, chain = [], [], [], []
        first = {0: -1}                                      # node -> its child 0
        main = [0]
        level = [0]                                          # the previous level's nodes
        for depth in range(1, d + 1):
            new = []
            for i in range(kb ** depth):
                node = len(parents) + 1
                parents.append(level[i // kb])
                column.append(depth - 1)
                branch.append(i % kb)
                if i % kb == 0:
                    first[level[i // kb]] = node
                first[node] = -1
                new.append(node)
            main.append(new[0])
            level = new
        tips = level[:min(self.spines, len(level))]
        for depth in range(d + 1, k + 1):
            new = []
            for tip in tips:
                node = len(parents) + 1
                parents.append(tip)
                chain.append(depth - 1)
                first[tip], first[node] = node, -1
                new.append(node)
            main.append(new[0])
            tips = new
        long = dict(dtype=torch.long, device=device)
        child0 = torch.tensor([first[i] for i in range(len(parents) + 1)], **long)
        return dict(levels=d, parents=torch.tensor(parents, **long)[None],
                    column=torch.tensor(column, **long), branch=torch.tensor(branch, **long),
                    chain=torch.tensor(chain, **long), child0=child0,
                    main=torch.tensor(main, **long), children=kb if d else 1)

    # -- after the step ---------------------------------------------------------------------
    def observe(self, out, target_probs, num_accepted) -> None:
        """The step's distributions along the spine (the class docstring), then Jacobi's
        refresh of the window as after a chain step over k positions."""
        lay = self._layout
        if lay is not None:
            target_probs = target_probs.gather(1, self._spine(out, lay)[..., None].expand(
                -1, -1, target_probs.shape[-1]))
        super().observe(out, target_probs, num_accepted)

    @staticmethod
    def _spine(out, lay) -> torch.Tensor:
        """[B, k + 1] the node each depth's distribution is read from: the accepted path,
        then child 0 below it (the chain of all the window's drafts where a node has none)."""
        n, path = out.num_accepted, out.path
        cur = torch.zeros_like(n)
        cols = [cur]
        for j in range(1, lay["main"].shape[0]):
            nxt = lay["child0"][cur]
            nxt = torch.where(nxt < 0, lay["main"][j], nxt)
            cur = torch.where(n >= j, path[:, j], nxt)
            cols.append(cur)
        return torch.stack(cols, 1)
