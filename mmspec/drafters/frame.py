"""Drafting with a head over a delay-pattern decoder's frames (MusicGen, Parler-TTS style):
the frame as one event.

The head (``mmspec.drafters.head.FrameHead``, a ``DraftHead`` with ``codebooks`` = C) drafts
frame t + 2 from the pair (feature of step t, frame t + 1), as the token head does, with the
frame's parts shared from the target's decoder:

    e     = sum_c embed_c(x_{t+1, c})              the target's codebook embeddings, summed
                                                   as its decoder sums them
    g_t   = decoder(fuse(concat(e, reduce(f_t))))  one Llama layer, its own cache
    q_c   = softmax(lm_head_c(g_t))                the target's C codebook heads

``FrameDrafter`` drafts a chain of K frames per step (delay-pattern targets take no tree
steps): each frame's C codebooks are drawn from q_c independently (the ``Frame`` rule's
factorised event), with the target's own pattern forced on the logits (pad before a
codebook's delay, end-of-speech after the last frame: ``force`` of the target session), so q
is zero exactly where p is. After verification the head keeps only the slots fed with the
target's real features; the accepted frames and the new last frame are fed next step with
the target's features of the accepted path (rows of a delay-pattern call commit the same
count). Verification is the target's: lossless with ``exact``.

The target session provides ``keep_features(layers)`` / ``features``, ``event_embeds``,
``force``, ``length``, ``vocab_size`` and ``params``
(``modalities.speech.delay.DelayPatternSession``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import distributions
from ..cache import cache_argument, crop
from ..checks import check_count
from ..types import Draft
from .base import Drafter
from .head import FrameHead

HOOKS = ("keep_features", "event_embeds", "force", "vocab_size")


def frame_logits(head: FrameHead, target, g: torch.Tensor, fed: torch.Tensor,
                 start: int) -> torch.Tensor:
    """The head's logits [B, n, C, V] in the target's ids for its outputs g [B, n, d] (or
    [B, 1, d]: the last position's): the codebook heads, padded to the target's event width
    (the pad id past the logits), the target's pattern forced as on the frames ``fed``
    [B, n, C] fed at slots ``start``..."""
    logits = head.event_logits(g).float()
    if target.vocab_size > logits.shape[-1]:
        logits = F.pad(logits, (0, target.vocab_size - logits.shape[-1]), value=float("-inf"))
    return target.force(logits.expand(-1, fed.shape[1], -1, -1), fed, start)[0]


def check_chain(shape: dict, why: str) -> None:
    """Refuse a tree's shape (``branch``/``width`` other than None or 1, any ``nodes``) where
    the head drafts chains, saying ``why``."""
    given = {f"tree_{k}": shape.get(k) for k in ("branch", "width", "nodes")}
    tree = {k: v for k, v in given.items()
            if v is not None and not (k != "tree_nodes" and v == 1)}
    if tree:
        raise ValueError(f"{', '.join(f'{k}={v}' for k, v in tree.items())}: {why}: accepted "
                         "tree_branch and tree_width 1 (or left out) and no tree_nodes")


class HeadChainDrafter(Drafter):
    """Chains of ``depth`` frames per step drafted by a head of ``head_class`` from a target
    session with the ``hooks`` (``what``: the session it needs, for the refusal)."""

    needs_head = True
    head_class: type = FrameHead
    hooks: tuple[str, ...] = HOOKS
    what = "a frame head drafts from a delay-pattern target session"
    chains = "a frame head drafts chains (delay-pattern targets take no tree steps)"

    @classmethod
    def from_params(cls, params, context) -> "HeadChainDrafter":
        """Method ``head`` with a head of ``head_class`` (``mmspec.registry``): a chain of
        ``tree_depth`` frames; a tree's shape is refused (``chains``: why)."""
        check_chain({k: params.get(f"tree_{k}") for k in ("branch", "width", "nodes")},
                    cls.chains)
        return cls(context.head, params.get("tree_depth", 4))

    def __init__(self, head, depth: int = 4, generator=None):
        if not isinstance(head, self.head_class):
            raise ValueError(f"head={type(head).__name__}: accepted a {self.head_class.__name__}")
        self.head = head
        self.num_tokens = check_count("tree_depth", depth)
        self.generator = generator
        self.target = None

    def attach(self, target) -> None:
        missing = [h for h in self.hooks if not hasattr(target, h)]
        if missing:
            raise ValueError(f"{self.what}; {type(target).__name__} has no "
                             f"{', '.join(missing)}")
        target.keep_features(self.head.config.feature_layers)
        self.target = target


class FrameDrafter(HeadChainDrafter):
    """Draft a chain of ``depth`` frames per step with a ``FrameHead`` (module docstring)."""

    def begin(self, input_ids, attention_mask, vocab_size=None, **prompt) -> None:
        from transformers import DynamicCache

        if self.target is None:
            raise RuntimeError("FrameDrafter.begin before attach(target)")
        d = self.head.config.hidden_size
        self.cache = DynamicCache()
        self._backlog = self._backlog_f = None      # accepted frames not yet fed, features
        # the first frame fed (the start frame) pairs with a zero feature
        self._root = input_ids.new_zeros(input_ids.shape[0], 1, d,
                                         dtype=self.head.fuse.weight.dtype)
        self._k = 0

    def _forward(self, frames: torch.Tensor, feats: torch.Tensor) -> torch.Tensor:
        """Feed frames [B, n, C] with their features [B, n, d]: the head's outputs [B, n, d]."""
        x = self.head.inputs(self.target.event_embeds(frames).to(feats.dtype), feats)
        return self.head.decoder(inputs_embeds=x, use_cache=True,
                                 **{cache_argument(self.head.decoder): self.cache}).logits

    def _q(self, g: torch.Tensor, fed: torch.Tensor, start: int):
        """q [B, C, V] of the frame after ``fed`` [B, m, C] (fed at slots ``start``..), from
        the head's output g [B, 1, d]: forced as the target's, its processing."""
        logits = frame_logits(self.head, self.target, g, fed, start)[:, -1:]
        return self.target.params.probs(logits)[:, 0]

    def propose(self, last: torch.Tensor, k_max: int, active=None) -> Draft:
        k = self._k = min(self.num_tokens, k_max)
        frames, feats = last[:, None], self._root
        if self._backlog is not None:
            frames = torch.cat([self._backlog, frames], 1)
            feats = torch.cat([self._backlog_f, feats], 1)
        if k == 0:                      # nothing drafted: the frames wait for the next step
            self._backlog, self._backlog_f = frames, feats
            return Draft(tokens=last.new_zeros(last.shape[0], 0, *last.shape[1:]))
        g = self._forward(frames, feats)[:, -1:]
        start, fed = self.target.length, last[:, None]
        tokens, probs = [], []
        for i in range(k):
            x, q = distributions.draw(self._q(g, fed, start), self.generator,
                                      self.target.greedy)
            tokens.append(x)
            probs.append(q)
            if i < k - 1:
                g = self._forward(x[:, None], g)
                fed = torch.cat([fed, x[:, None]], 1)
        return Draft(tokens=torch.stack(tokens, 1), probs=distributions.stack(probs))

    def observe(self, out, target_probs, num_accepted) -> None:
        f = self.head.reduce_features(self.target.features)                  # [B, K + 1, d]
        if self._k == 0:
            self._root = f[:, :1]
            return
        crop(self.cache, self._k - 1)          # the drafts fed on the head's own outputs
        n = min(num_accepted)                  # a delay-pattern call commits one count
        self._backlog = out.tokens[:, :n] if n else None
        self._backlog_f = f[:, :n] if n else None
        self._root = f[:, n:n + 1]
