"""A draft model that proposes a tree per row (EAGLE-2 style dynamic trees).

Per step, all rows at once (terms of ``mmspec.tree``):

1. Root: the draft feeds its pending tokens and the last emitted token (the root) and gets
   q at the root.
2. Levels 1..D: every node of the frontier gets ``branch`` children (below), scored by path
   log-probability (the sum over its path); the ``width`` best
   children of a level form the next frontier, fed to the draft as one tree step (each sees
   its own ancestors among the slots fed this step) so that they get their own q. The last
   level is not fed.
3. The tree: the ``nodes`` best nodes by score (a child never outscores its parent, so the
   kept set is closed under parents), renumbered level by level.

Children: at temperature 0 (or ``sample=False``) the top-k of q, verified as point masses
(``Draft.probs`` None), lossless for any shape and any pruning. A greedy draft session's q
is one-hot, whose top-k would be its argmax beside arbitrary ids at the score floor (a
chain with dead siblings): a tree of top-k children (``branch`` > 1) from a greedy session
has the session process q at temperature 1 instead (the draft's softmax, which EAGLE-2
ranks by; ``soften``), which changes which nodes are drafted, never what is emitted;
otherwise drawn from q
without replacement (the exponential race's order), each with the q it was drawn from (q
without its earlier siblings), verified by recursive rejection (``mmspec.acceptance.tree``):
lossless as long as no node is dropped for its own value, so sampled trees keep every node
(``nodes`` is refused) while frontiers may still be chosen by score (a node's children are
drawn given its path, whatever chose it).

After verification the draft keeps its pending slots and the accepted path's fed nodes
(moved to the front, ``Session.commit(path=)``); an accepted node that was never fed (the
last level, or a node outside every frontier) waits to be fed first in the next step.
"""

from __future__ import annotations

import torch

from ..cache import TreeMask
from ..checks import check_count
from ..sampling import SamplingParams
from ..sessions.base import PaddedSession, Session
from ..tree import Tree
from ..types import Draft
from .base import Drafter

_FLOOR = -1e4          # log q floor: scores stay finite (a zero-probability child still ranks)


class TreeDrafter(Drafter):
    """Draft a tree per row with a ``Session`` (a small causal LM sharing the vocabulary).

    session: the draft model's session (prefilled by ``begin``); needs ``trees``.
    depth:   D, levels of drafts (the longest path; >= 1).
    branch:  children per expanded node (>= 1).
    width:   nodes expanded per level (the frontier; >= 1).
    nodes:   drafts kept per row, the best by path probability (None: every node made,
             ``made``); top-k children only.
    sample:  children drawn from q (True) or its top-k (False); None: drawn unless the
             draft's distributions are greedy.
    """

    needs_model = True
    trees = True
    param_names = ("tree_depth", "tree_branch", "tree_width", "tree_nodes", "tree_sample")

    def __init__(self, session: Session, depth: int = 4, branch: int = 2, width: int = 4,
                 nodes: int | None = None, sample: bool | None = None):
        if not session.trees:
            raise ValueError(f"a tree drafter needs a draft session that takes tree steps "
                             f"({type(session).__name__} does not: recurrent or sliding-window "
                             "layers, or positions that follow the cache length): accepted a "
                             "chain method")
        self.session = session
        self.depth = check_count("tree_depth", depth)
        self.branch = check_count("tree_branch", branch)
        self.width = check_count("tree_width", width)
        made = self.made(self.depth, self.branch, self.width)
        if nodes is not None and (check_count("tree_nodes", nodes) > made):
            raise ValueError(f"tree_nodes={nodes} is out of range: accepted 1..{made} (the nodes "
                             f"a depth-{depth} tree of branch {branch} and width {width} makes)")
        if sample not in (None, True, False):
            raise ValueError(f"tree_sample={sample!r}: accepted None (sampled unless greedy), "
                             "True or False")
        self.nodes, self.sample = nodes, sample
        self._soft = False                  # the session's q softened (``soften``)
        self.num_tokens = made if nodes is None else nodes
        self._backlog = self._backlog_valid = None
        self.check_sampling()
        if session.vocab_size:              # 0: not known yet (a head's session, attached later)
            self.check_branch(session.vocab_size)

    def check_branch(self, vocab: int) -> None:
        """A node's children are distinct ids of the draft's ``vocab``: more are refused."""
        if self.branch > vocab:
            raise ValueError(f"tree_branch={self.branch}: accepted at most the draft's {vocab} "
                             "ids (a node's children are distinct ids)")

    def check_sampling(self) -> None:
        """Sampled children may not be pruned by their values (``nodes``): refused."""
        if self.nodes is not None and self.sampled:
            raise ValueError(f"tree_nodes={self.nodes} keeps the best nodes by their values, "
                             "which is lossless only for top-k children: accepted with "
                             "tree_sample=False or temperature 0 (sampled trees keep every node)")

    @staticmethod
    def level_sizes(depth: int, branch: int, width: int) -> list[int]:
        """Nodes made per level: ``branch`` at level 1, then ``branch`` children for each of
        the (at most ``width``) frontier nodes of the level above."""
        sizes = [branch]
        for _ in range(depth - 1):
            sizes.append(min(width, sizes[-1]) * branch)
        return sizes

    @classmethod
    def made(cls, depth: int, branch: int, width: int) -> int:
        """Nodes a full tree has."""
        return sum(cls.level_sizes(depth, branch, width))

    @classmethod
    def _args(cls, params) -> dict:
        return dict(depth=params.get("tree_depth", 4), branch=params.get("tree_branch", 2),
                    width=params.get("tree_width", 4), nodes=params.get("tree_nodes"),
                    sample=params.get("tree_sample"))

    @classmethod
    def width(cls, params, context=None) -> int:
        """Slots a step needs for these parameters: the tree's nodes in the target, the
        pending tokens, root and frontiers in the draft (static caches are sized by it)."""
        a = cls._args(params)
        d, br, w = (check_count(f"tree_{k}", a[k]) for k in ("depth", "branch", "width"))
        sizes = cls.level_sizes(d, br, w)
        # a step feeds the draft up to 2 + (its frontiers) slots: room for both
        fed = 2 + sum(min(w, s) for s in sizes[:-1])
        return max(sum(sizes) if a["nodes"] is None else a["nodes"], fed)

    @classmethod
    def reach(cls, params, context=None) -> int:
        """The tree's depth: its deepest node's position past the root."""
        return check_count("tree_depth", cls._args(params)["depth"])

    @classmethod
    def from_params(cls, params, context) -> "TreeDrafter":
        if context.draft_session is None:
            raise ValueError("method 'tree' drafts with a draft model: pass draft=...")
        return cls(context.draft_session(), **cls._args(params))

    def soften(self) -> None:
        """Top-k children (``branch`` > 1, not ``sampled``) from a greedy session: the session
        processes q at temperature 1, untruncated (its one-hot q ranks no sibling: module
        docstring); ``sampled`` still reads the session as greedy. Called with the call's
        session, before its prompt (``begin``)."""
        s = self.session
        if self._soft or self.branch == 1 or self.sampled or not s.greedy:
            return
        soft = SamplingParams()             # temperature 1, no truncation
        for one in (s, s.inner) if isinstance(s, PaddedSession) else (s,):
            one.params = soft
        self._soft = True

    def begin(self, input_ids, attention_mask, vocab_size=None, **prompt) -> None:
        self.soften()
        self.session.prefill(input_ids, attention_mask, **prompt)
        self._backlog = self._backlog_valid = None

    # -- propose ------------------------------------------------------------------------
    def propose(self, last: torch.Tensor, k_max: int, active=None) -> Draft:
        b, dev = last.shape[0], last.device
        on = torch.ones(b, dtype=torch.long, device=dev) if active is None else active.long()
        one = torch.ones(b, 1, dtype=torch.long, device=dev)
        feed, valid = last[:, None], one
        if self._backlog is not None:
            feed = torch.cat([self._backlog, feed], 1)
            valid = torch.cat([self._backlog_valid, valid], 1)
        valid = valid * on[:, None]
        self._f, self._valid, self._on = feed.shape[1], valid, on
        depth = min(self.depth, k_max)
        if depth < 1:
            self._backlog, self._backlog_valid = feed, valid
            self._depth = 0
            return Draft(tokens=last.new_zeros(b, 0), tree=Tree(last.new_zeros(b, 0), 0, 0))
        q = self._feed_root(feed, valid)                                         # [B, 1, V]
        tok, par, score, fed, probs = self._grow(q, depth, on)
        self._depth = depth
        return self._select(tok, par, score, fed, probs, depth)

    def _feed_root(self, feed: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Feed the pending tokens and the root; q at the root [B, 1, V]."""
        return self.session.step(feed, valid)[:, -1:]

    def _feed_front(self, tokens, valid, tree: TreeMask, parent: torch.Tensor) -> torch.Tensor:
        """Feed a frontier [B, W] as a tree step (``parent`` [B, W]: each node's parent among
        the previous frontier, the root's being 0); q at each [B, W, V]."""
        return self.session.step(tokens, valid, tree=tree)

    @staticmethod
    def _logq(q: torch.Tensor) -> torch.Tensor:
        return q.double().clamp_min(1e-300).log().clamp_min(_FLOOR)

    @property
    def sampled(self) -> bool:
        """Children are drawn from q (not its top-k): ``sample``, else when the session is not
        greedy (a softened session counts as the greedy one it was)."""
        greedy = self._soft or self.session.greedy
        return (not greedy) if self.sample is None else self.sample

    def _children(self, q: torch.Tensor):
        """``branch`` children of every node [B, F, V] -> tokens [B, F, branch], their
        log q, and the q each was drawn from ([B, F, branch, V]; None for top-k)."""
        if not self.sampled:
            top = q.topk(self.branch, -1)
            return top.indices, self._logq(top.values), None
        # without replacement: the exponential race's order (as Gumbel-top-k); child j was
        # drawn from q with its earlier siblings removed, renormalised
        e = torch.empty_like(q).exponential_(generator=self.generator).clamp_min(1e-30)
        idx = (q / e).topk(self.branch, -1).indices                               # [B, F, b]
        taken = torch.nn.functional.one_hot(idx, q.shape[-1]).to(q.dtype)         # [B, F, b, V]
        before = taken.cumsum(2) - taken                                         # earlier ones
        qj = q[:, :, None] * (1 - before)
        mass = qj.sum(-1, keepdim=True)
        # q's support used up by earlier siblings: the first child again, as a point mass (no
        # residual accepts it once the first child was rejected; a zero q would accept it)
        spent = mass[..., 0] <= 0
        qj = torch.where(spent[..., None], taken[:, :, :1], qj / mass.clamp_min(1e-30))
        idx = torch.where(spent, idx[..., :1], idx)
        return idx, self._logq(q.gather(-1, idx)), qj

    def _grow(self, q, depth, on):
        """Every node made, level by level: tokens, parents (0 = the root, i = node i),
        path scores [B, M], the slot each was fed at among this step's (-1: not fed) and the
        q each was drawn from ([B, M, V]; None for top-k children)."""
        b, dev = q.shape[0], q.device
        tok = par = fed = torch.zeros(b, 0, dtype=torch.long, device=dev)
        probs = []
        score = torch.zeros(b, 0, dtype=torch.float64, device=dev)
        front = torch.zeros(b, 1, dtype=torch.long, device=dev)          # frontier (0: root)
        front_score = score.new_zeros(b, 1)
        view = torch.ones(b, 1, self._f, dtype=torch.bool, device=dev)   # the slots each sees
        for level in range(1, depth + 1):
            idx, logq, qj = self._children(q)                               # [B, F, branch]
            if qj is not None:
                probs.append(qj.flatten(1, 2))
            first = tok.shape[1] + 1                     # node index of the level's first child
            child_score = (front_score[:, :, None] + logq).flatten(1)
            tok = torch.cat([tok, idx.flatten(1)], 1)
            par = torch.cat([par, front.repeat_interleave(self.branch, 1)], 1)
            score = torch.cat([score, child_score], 1)
            fed = torch.cat([fed, torch.full_like(tok[:, first - 1:], -1)], 1)
            if level == depth:
                break
            w = min(self.width, child_score.shape[1])
            best = child_score.topk(w, -1).indices                 # the next frontier [B, W]
            nodes, seen = first + best, view.shape[2]
            fed.scatter_(1, nodes - 1, (seen + torch.arange(w, device=dev)).expand(b, w))
            parent_view = view.gather(1, (best // self.branch)[:, :, None].expand(b, w, seen))
            view = torch.cat([parent_view, torch.eye(w, dtype=torch.bool, device=dev).expand(b, w, w)], 2)
            # positions: the root's + level; the draft has advanced 1 + (seen - f) past the root
            offsets = torch.full((b, w), level - 1 - (seen - self._f), dtype=torch.long, device=dev)
            q = self._feed_front(tok.gather(1, nodes - 1), on[:, None].expand(b, w),
                                 TreeMask(view, offsets), best // self.branch)
            front, front_score = nodes, child_score.gather(1, best)
        return tok, par, score, fed, torch.cat(probs, 1) if probs else None

    def _select(self, tok, par, score, fed, probs, depth: int) -> Draft:
        """The best ``nodes`` by score (all when None), renumbered in their made order (level
        by level: parents first)."""
        b, m = tok.shape
        n = m if self.nodes is None else self.nodes
        if n < m:
            sizes = self.level_sizes(depth, self.branch, self.width)
            level = torch.cat([torch.full((size,), d, device=tok.device)
                               for d, size in enumerate(sizes, 1)])
            # a child scores log q <= 0 below its parent; the depth term breaks ties for parents
            keep = (score - 1e-6 * level).topk(n, -1).indices.sort(-1).values
        else:
            keep = torch.arange(m, device=tok.device).expand(b, m)
        renumber = torch.zeros(b, m + 1, dtype=torch.long, device=tok.device)
        renumber.scatter_(1, keep + 1, torch.arange(1, n + 1, device=tok.device).expand(b, n))
        parents = renumber.gather(1, par.gather(1, keep))
        self._slot = torch.cat([torch.full((b, 1), self._f - 1, dtype=torch.long,
                                           device=tok.device), fed.gather(1, keep)], 1)
        if probs is not None:
            probs = probs.gather(1, keep[:, :, None].expand(b, n, probs.shape[-1]))
        return Draft(tokens=tok.gather(1, keep), probs=probs,
                     tree=Tree(parents, depth, self.branch))

    # -- observe ------------------------------------------------------------------------
    def observe(self, out, target_probs, num_accepted) -> None:
        if self._depth == 0:
            return
        n, path = out.num_accepted, out.path                                 # [B], [B, D + 1]
        b, dev = n.shape[0], n.device
        slot = self._slot.gather(1, path)                  # each path node's draft slot (-1)
        on_path = torch.arange(path.shape[1], device=dev)[None] <= n[:, None]
        fed = on_path & (slot >= 0) & self._on.bool()[:, None]            # a prefix of each path
        kept = min(max(num_accepted), self._depth - 1)     # deepest fed path node of any row
        index = torch.cat([torch.arange(self._f, device=dev).expand(b, self._f),
                           slot[:, 1:1 + kept].clamp(min=0)], 1)
        valid = torch.cat([self._valid, fed[:, 1:1 + kept].long()], 1)
        self.session.commit(self._f + kept, valid, index)
        # the first accepted node never fed (at most one: unfed nodes have no children)
        first_unfed = fed[:, 1:].sum(1)
        wait = (first_unfed < n) & self._on.bool()
        tok = out.tokens.gather(1, first_unfed[:, None].clamp(max=out.tokens.shape[1] - 1))
        self._backlog = torch.where(wait[:, None], tok, 0)
        self._backlog_valid = wait.long()[:, None]
