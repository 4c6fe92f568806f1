"""A model with its cache: what the loop verifies on and what a model drafter drafts with.

``Session`` is the small protocol the loop and the drafters use:

    step(tokens [B, n], valid [B, n] | None) -> probs [B, n, V]   processed distributions
    commit(keep: int, valid [B, keep])                             roll back since last commit

``step`` appends n slots per row (``valid`` marks padding among them); ``commit`` keeps the
first ``keep`` slots appended since the previous commit, marks which of them hold real tokens
(holes for rows that accepted less), and crops the rest. A tree step (``step(..., tree=)``,
sessions that declare ``trees``) feeds a draft tree's nodes, each seeing its ancestors only;
its commit names the slots kept per row (``path``: the accepted path, moved to the front).
``PaddedSession`` wraps a session whose vocabulary is a prefix of another's.
"""

from __future__ import annotations

import torch

from .. import distributions
from ..sampling import SamplingParams


class Session:
    """Base class of sessions: the protocol and the capabilities' defaults.

    vocab_size: the width V of the distributions a step returns.
    batch_size: B, rows of the prompt (set by ``prefill``).
    params:     the SamplingParams its distributions are processed with.
    ragged:     rows may keep holes after a commit (positions come from the sequence mask).
                False where positions follow the cache length (the loop then commits every
                row to the shortest accepted length, which is still exact).
    greedy:     its distributions are one-hot (temperature 0).
    recurrent:  its cache holds recurrent states (linear attention): a slot fed is consumed
                for good, so rollback replays (``commit``) and no step may feed a hole before
                a real token (drafts are not queued ahead with holes).
    trees:      ``step`` takes a draft tree (``tree=``) and ``commit`` a path (not with
                recurrent or sliding-window layers).
    tree_verify: ``step`` takes a draft tree as a target's verification: one tree step after
                a commit, then ``commit`` a path. Every session with ``trees``; recurrent
                ones on dynamic caches too (the tree fed as its root-to-leaf paths).
    chains:     ``chain`` may run its steps as one captured graph (see CausalLMSession).
    split_group: the processes a tensor-parallel plan split its model over, whose random
                draws must agree (``mmspec.distributed``); None for a model held whole.
    """

    vocab_size: int = 0
    batch_size: int = 0
    params: SamplingParams = SamplingParams()
    ragged: bool = True
    recurrent: bool = False
    trees: bool = False
    chains: bool = False

    @property
    def tree_verify(self) -> bool:
        """``step`` takes one tree after a commit, as a target's verification (class
        docstring); here: when it takes trees at all."""
        return self.trees

    @property
    def greedy(self) -> bool:
        """Its distributions are one-hot (its params are greedy)."""
        return self.params.greedy

    @property
    def split_group(self):
        """The process group its model is split over (class docstring); here: None."""
        return None

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **prompt) -> None:
        """Run the prompt ([B, P] ids, left-padded with its mask) and keep the cache; sets
        ``batch_size``."""
        raise NotImplementedError

    def step(self, tokens: torch.Tensor, valid: torch.Tensor | None = None, tree=None):
        """Append ``tokens`` [B, n] (``valid`` [B, n] marks padding) and return the processed
        distributions [B, n, V] at those n positions. ``tree``: a ``mmspec.tree.Tree`` over
        the n slots (sessions with ``trees``)."""
        raise NotImplementedError

    def commit(self, keep: int, valid: torch.Tensor | None,
               path: torch.Tensor | None = None) -> None:
        """Keep the first ``keep`` slots appended since the last commit (``valid`` [B, keep] marks
        the real tokens; holes for rows that accepted less; None: the kept slots are real where
        they were fed as real) and roll back the rest. ``path`` [B, keep]: after a tree step,
        the slots kept per row (indices among those appended)."""
        raise NotImplementedError

    def chain(self, tokens: torch.Tensor, valid: torch.Tensor, k: int, follow: torch.Tensor,
              generator: torch.Generator | None = None):
        """``k`` steps drawing one event each: ``tokens`` [B, n] (``valid`` [B, n]) first, then
        each step's draw fed back with validity ``follow`` [B]. Returns the draws [B, k, ...]
        and the distributions the rule reads for them (``distributions.draw``)."""
        draws, dists = [], []
        for _ in range(k):
            x, q = distributions.draw(self.step(tokens, valid)[:, -1], generator, self.greedy)
            draws.append(x)
            dists.append(q)
            tokens, valid = x[:, None], follow[:, None]
        return torch.stack(draws, 1), distributions.stack(dists)



class PaddedSession(Session):
    """A draft session whose vocabulary is a prefix of the target's (padded target
    vocabularies, e.g. llava-1.5-hf's 32064 over a 32000-id draft): probabilities are padded
    with zeros up to the target's size, so the draft never proposes the extra ids; if the
    target emits one, the draft reads ``fallback_id`` in its place (drafts are proposals, so
    this costs acceptance, never correctness)."""

    @classmethod
    def around(cls, session: Session, vocab_size: int) -> Session:
        """``session`` itself when its vocabulary is the target's (nothing to pad: no copy of
        each step's distributions), else wrapped."""
        return session if session.vocab_size == vocab_size else cls(session, vocab_size)

    def __init__(self, session: Session, vocab_size: int, fallback_id: int = 0):
        if session.vocab_size > vocab_size:
            raise ValueError(f"draft vocabulary ({session.vocab_size}) is larger than the "
                             f"target's ({vocab_size}): accepted a prefix of the target's")
        self.inner = session
        self.vocab_size = vocab_size
        self.fallback_id = fallback_id
        self.params = session.params

    @property
    def batch_size(self) -> int:
        return self.inner.batch_size

    @property
    def recurrent(self) -> bool:
        return self.inner.recurrent

    @property
    def trees(self) -> bool:
        return self.inner.trees

    @property
    def tree_verify(self) -> bool:
        """The wrapped session's."""
        return self.inner.tree_verify

    @property
    def chains(self) -> bool:
        """The wrapped session's: its ``chain`` runs as one captured graph."""
        return self.inner.chains

    def prefill(self, *args, **kwargs):
        return self.inner.prefill(*args, **kwargs)

    def step(self, tokens, valid=None, tree=None):
        return self._pad(self.inner.step(self._known(tokens), valid, tree))

    def chain(self, tokens, valid, k, follow, generator=None):
        """The wrapped session's chain (one captured graph where it has ``chains``): its draws
        are ids of its own vocabulary, their distributions padded."""
        draws, dists = self.inner.chain(self._known(tokens), valid, k, follow, generator)
        return draws, self._pad(dists)

    def commit(self, keep, valid, path=None):
        return self.inner.commit(keep, valid, path)

    def _known(self, tokens: torch.Tensor) -> torch.Tensor:
        return torch.where(tokens < self.inner.vocab_size, tokens, self.fallback_id)

    def _pad(self, p: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.pad(p, (0, self.vocab_size - p.shape[-1]))

