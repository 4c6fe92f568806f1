"""Drafting with a head over a depth-decoder speech model's frames (Sesame CSM): the frame as
one event, drawn by the target's own frame machinery.

The head (``mmspec.drafters.head.DepthHead``) drafts the backbone's hidden state of the next
frame from the pair (feature of frame t, frame t + 1), as the token head does:

    e     = embed(x_{t+1})                          the backbone's embedding of the frame
                                                    (its C codebooks' embeddings summed)
    g_t   = decoder(fuse(concat(e, reduce(f_t))))   one Llama layer, its own cache
    frame ~ p_target(. | h = g_t)                   codebook 0 from the backbone's head on
                                                    g_t, codebooks 1..C-1 one after another
                                                    from the target's depth decoder on g_t

so the draft's conditionals along its frame are the target's own frame distribution at a
stand-in hidden state (``distributions`` of the target session: ``draw`` returns the frame
and the conditionals it was drawn from, which the ``DepthFrame`` rule verifies codebook by
codebook). The closer g_t is to the backbone's hidden state, the closer every codebook's q is
to p; the head learns g_t through those conditionals (``recipes.train.draft_head``).

Per step, all rows at once, as ``FeatureDrafter``'s chains: the pending pairs (frames
committed by the last step with the target's features of the frames before them) and the
root are fed; the head's output at the root gives the first frame; each drafted frame is fed
with the head's own output as its feature. After verification the head keeps only the
pending pairs' slots; each row's accepted frames and its new last frame become its next
pending pairs with the target's features (rows commit their own counts). Verification is the
target's: lossless with ``exact``.

The target session provides ``keep_features(layers)`` / ``features``, ``embed``,
``prompt_inputs`` and ``distributions(h)`` returning a frame distribution with ``draw``
(``modalities.speech.csm.CsmSession``).
"""

from __future__ import annotations

import torch

from .. import distributions
from ..types import Draft
from .head_session import HeadSession, next_pairs, prefill_pairs
from .frame import HeadChainDrafter
from .head import DepthHead


class DepthHeadSession(HeadSession):
    """The head's decoder over a depth-decoder target's frames: its output g (the decoder's
    normed output; the head's output layer is the identity) is the stand-in hidden state, and
    a step returns the target session's frame distributions at it."""

    def logits(self, out):
        return out.logits

    def distributions(self, h, gen_index):
        return self.template.distributions(h, gen_index)


class DepthDrafter(HeadChainDrafter):
    """Draft a chain of ``depth`` frames per step with a ``DepthHead`` (module docstring)."""

    head_class = DepthHead
    hooks = ("keep_features", "embed", "prompt_inputs", "distributions")
    what = "a depth head drafts from a depth-decoder target session"
    chains = "a depth head drafts chains (depth-decoder frames are verified as chains)"

    def attach(self, target) -> None:
        super().attach(target)
        self.session = DepthHeadSession(self.head, target, static_len=target.static_len,
                                        engine=target.engine)

    def begin(self, input_ids, attention_mask, vocab_size=None, **prompt) -> None:
        if self.target is None:
            raise RuntimeError("DepthDrafter.begin before attach(target)")
        self._pending = prefill_pairs(self.session, input_ids, attention_mask)
        self._backlog = self._backlog_valid = None
        self._k = 0

    def propose(self, last: torch.Tensor, k_max: int, active=None) -> Draft:
        b = last.shape[0]
        on = (torch.ones(b, dtype=torch.long, device=last.device) if active is None
              else active.long())
        feed, valid = last[:, None], on[:, None]
        if self._backlog is not None:
            feed = torch.cat([self._backlog, feed], 1)
            valid = torch.cat([self._backlog_valid, valid], 1)
        self._f, self._valid, self._on = feed.shape[1], valid * on[:, None], on
        k = self._k = min(self.num_tokens, k_max)
        if k == 0:                      # nothing drafted: the frames wait for the next step
            self._backlog, self._backlog_valid = feed, self._valid
            return Draft(tokens=last.new_zeros(b, 0, *last.shape[1:]))
        self.session.feed = self._pending
        q = self.session.step(feed, self._valid)[:, -1]
        frames, probs = [], []
        for i in range(k):
            x, p = distributions.draw(q, self.generator, self.target.greedy)
            frames.append(x)
            probs.append(p)
            if i < k - 1:
                self.session.feed = q.h[:, None]               # the head's own output
                q = self.session.step(x[:, None], on[:, None])[:, -1]
        return Draft(tokens=torch.stack(frames, 1), probs=distributions.stack(probs))

    def observe(self, out, target_probs, num_accepted) -> None:
        feats = self.head.reduce_features(self.target.features)              # [B, K + 1, d]
        if self._k == 0:         # nothing fed: the pairs wait, the new last joins them
            self._pending = torch.cat([self._pending, feats[:, :1]], 1)
            return
        self.session.commit(self._f, self._valid)          # the pending pairs' slots only
        # a chain: the path is the fed slots in order
        self._backlog, self._backlog_valid, self._pending = next_pairs(
            feats, out.tokens, out.num_accepted, max(num_accepted), self._on)
