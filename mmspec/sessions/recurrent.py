"""Steps of a session whose cache holds recurrent states (linear attention: Gated DeltaNet,
Mamba-style layers), which cannot drop slots: a commit that keeps fewer tokens than were fed
restores the states from a snapshot taken before the step and feeds the kept tokens again;
a draft tree is verified as its root-to-leaf paths, each a chain of its own.

``RecurrentSteps`` keeps what one step since the last commit needs for that (the snapshot,
the rows fed, whether they were a tree's paths) beside a ``CausalLMSession``, which calls it
from ``step`` and ``commit``.
"""

from __future__ import annotations

import weakref

import torch

from ..cache import StateSnapshot, crop, repeated_rows
from ..cache import take_slots as _take


class RecurrentSteps:
    """The rollback of one ``CausalLMSession`` with recurrent layers (``session._recurrent``)."""

    def __init__(self, session):
        self._session = weakref.ref(session)   # no cycle: a session given back at once
        self.snapshot: StateSnapshot | None = None
        self.fed: list = []                  # (rows, valid) fed since the commit
        self.fed_first = False               # the session's ``_first`` before them
        self.tree_fed = False                # the step since the commit fed a tree's paths

    @property
    def s(self):
        """The session (held weakly, as ``CapturedSteps`` holds it)."""
        session = self._session()
        if session is None:
            raise ReferenceError("RecurrentSteps: its session was collected (keep the session, "
                                 "which holds its helpers)")
        return session

    def record(self, rows: torch.Tensor, valid: torch.Tensor) -> None:
        """Before a chain step's forward: the states at the commit (first step after it), and
        the rows fed."""
        s = self.s
        if s._since_commit == 0:
            self.snapshot = StateSnapshot.take(s._recurrent)
            self.fed, self.fed_first = [], s._first
        self.fed.append((rows, valid))

    def paths_step(self, tokens: torch.Tensor, valid: torch.Tensor, tree):
        """A tree step (``tree_verify``): each row's root-to-leaf paths fed as rows of their
        own, each a chain from the committed state, on the cache's rows repeated
        (``repeated_rows``); node i's outputs are those of the first path through it, at its
        depth. The cache is left as it was: ``commit`` feeds the kept path. On a static cache
        the step runs uncaptured (its rows and the repeated cache's tensors are its own); the
        commit's forward is captured as any step."""
        s = self.s
        if s._since_commit:
            raise ValueError("a recurrent session takes one tree step after a commit (a "
                             "target's verification): accepted a chain")
        b, n = tokens.shape[:2]
        if tree.num_nodes != n or tree.parents.shape[0] != b:
            raise ValueError(f"tree of {tree.num_nodes} nodes x {tree.parents.shape[0]} rows for "
                             f"a step of {n} slots x {b} rows: accepted equal sizes")
        nodes, first = tree.paths()                                   # [B, L, D+1], [B, n]
        paths, depth = nodes.shape[1], nodes.shape[2]
        at = nodes.clamp(min=0).view(b, -1)
        fed = _take(tokens, at).reshape(b * paths, depth, *tokens.shape[2:])
        fed_valid = (_take(valid, at).view(b, paths, depth) * (nodes >= 0)).view(-1, depth)
        self.snapshot = StateSnapshot.take(s._recurrent)
        self.fed, self.fed_first, self.tree_fed = [(tokens, valid)], s._first, True
        out, pos = self._on_paths(fed, fed_valid, b, paths)
        row = torch.arange(b, device=tokens.device)[:, None] * paths + first
        col = tree.depths()
        if s.features is not None and s._feature_layers:
            s.features = s.features[row, col]
        s._first = False
        s._since_commit = n
        return s.distributions(out[row, col], pos[row, col] - s._base[:, None])

    def _on_paths(self, fed: torch.Tensor, fed_valid: torch.Tensor, b: int, paths: int):
        """The forward of ``paths`` rows for each of the ``b`` rows: the sequence mask, the
        per-row buffers the hooks read and the cache's rows repeated for it, uncaptured; all
        put back after."""
        s = self.s
        seq = s.seq
        saved = {k: getattr(s, k) for k in (*s.capture.row_buffers, "_prompt_embeds")
                 if getattr(s, k) is not None}
        s.seq, s._uncaptured = seq.repeat_rows(paths), True
        for k, v in saved.items():
            setattr(s, k, v.repeat_interleave(paths, 0))
        try:
            with repeated_rows(s.cache, b, paths):
                return s._forward(fed, fed_valid)
        finally:
            s.seq, s._uncaptured = seq, False
            for k, v in saved.items():
                setattr(s, k, v)

    def commit(self, n: int, keep: int, valid: torch.Tensor | None,
               path: torch.Tensor | None = None) -> None:
        """Commit ``keep`` of the ``n`` slots fed since the last commit.

        Each row r keeps m_r tokens of the step (``valid`` [R, keep]: a prefix of ones). Its
        recurrent states must be those after exactly m_r of the fed tokens: for every
        m_r < n that occurs, the step is undone (attention slots cropped, states restored
        from the snapshot taken before it) and its first m_r tokens fed again, at the same
        positions, and those rows' states kept; then the ``keep`` kept slots are fed once more
        for every row (holes marked as on any cache) and each row gets its own states back.
        Plain decoding of the kept tokens reaches the same states. One host read (the
        m_r) and one extra forward per distinct m_r < keep, plus one when keep < n.

        After a tree fed as its paths (``paths_step``) nothing of the step is in the cache:
        the kept ``path`` [R, keep] (node indices) is fed."""
        s = self.s
        tokens, fed_valid = (torch.cat(t, 1) for t in zip(*self.fed))
        if valid is None:                  # as fed (after a tree: along the kept path)
            tree = self.tree_fed and path is not None
            valid = _take(fed_valid, path[:, :keep]) if tree else fed_valid[:, :keep]
        kept = valid.sum(1).tolist()
        fed = n                            # this step's slots in the cache now
        if self.tree_fed:
            if path is None:
                raise ValueError("commit after a tree step: accepted the kept path (path=)")
            self.tree_fed, fed = False, 0
            tokens, fed_valid = _take(tokens, path[:, :keep]), _take(fed_valid, path[:, :keep])
        elif all(m == n for m in kept):
            s._since_commit = 0
            return
        own = {}
        for m in sorted(set(kept) - {keep}):
            self._undo(fed)
            if m:
                self._refeed(tokens[:, :m], fed_valid[:, :m])
            own[m], fed = StateSnapshot.take(s._recurrent), m
        self._undo(fed)
        if keep:
            self._refeed(tokens[:, :keep], fed_valid[:, :keep])
            s.seq.invalidate_tail(keep, valid)
        for m, states in own.items():
            states.restore(torch.tensor([r for r, k in enumerate(kept) if k == m],
                                        device=valid.device))
        s._since_commit = 0

    def _undo(self, fed: int) -> None:
        """Back to the state before this step's tokens: ``fed`` slots off every attention
        layer and the sequence mask, the recurrent states from the snapshot."""
        if fed:
            crop(self.s.cache, fed)
            self.s.seq.rollback(fed)
        self.snapshot.restore()

    def _refeed(self, tokens: torch.Tensor, valid: torch.Tensor) -> None:
        s = self.s
        first, s._first = s._first, self.fed_first
        s._forward(tokens, valid)
        s._first = first
