"""Drafting with a head on the target's own features (``DraftHead``, EAGLE-3 style).

The target session keeps the features of every forward it runs anyway
(``CausalLMSession.keep_features``: no second forward); the head drafts from them. Per step,
all rows at once:

1. Pending pairs: the tokens committed by the last step, each with the target's feature of
   the position before it (for the root, the last emitted token, that is the feature of the
   last accepted slot). Fed to the head; its output at the root gives q for the first level.
2. A tree as ``TreeDrafter`` (a chain is ``branch = width = 1``): each frontier node is fed
   with its parent's head output as its feature (the head's own stand-in for the target's).
   The prompt's tokens are paired the same way (its first token with a zero feature); a
   head with ``merged_embeds`` reads the prompt's embeddings as the target's decoder read
   them (its ``hidden_states[0]``, kept from the prompt pass: a VLM's merged image features).
3. After verification the head keeps only the pending pairs' slots (real features); the
   accepted drafts and the new last token become the next pending pairs with the target's
   features of the accepted path (``VerifyOutput.path``), so the head never keeps a slot
   built on its own guesses.

Children as ``TreeDrafter``'s (top-k when greedy, ranked by the head's softmax at temperature
1, ``TreeDrafter.soften``; else sampled without replacement), so verification is lossless.
``attach`` (called by ``mmspec.runner.prepare``) ties the drafter to the target's session: the
target keeps the head's feature layers; the head's session gets the target's sampling and
cache settings.
"""

from __future__ import annotations

import torch

from ..sessions.base import Session
from ..types import Draft
from .frame import check_chain
from .head import DraftHead
from .head_session import HeadSession, next_pairs, prefill_pairs, prompt_layers
from .tree import TreeDrafter


class FeatureDrafter(TreeDrafter):
    """Draft with a ``DraftHead`` on the target's features.

    head:   a ``DraftHead`` (``DraftHead.from_pretrained(path, target)``).
    depth, branch, width, nodes: the tree (``TreeDrafter``; branch None: 2, width None: 4);
            ``branch = width = 1`` drafts a chain of ``depth`` tokens.

    A target that verifies no trees (sliding windows; recurrent layers under guidance)
    gets a chain of ``depth`` tokens, verified as a chain (``trees`` is then False): branch
    and width left out (or 1), no ``nodes``. Recurrent targets (Qwen3.5's linear attention)
    verify trees as their paths (``CausalLMSession.tree_verify``).
    """

    needs_model = False
    needs_head = True

    def __init__(self, head: DraftHead, depth: int = 4, branch: int | None = None,
                 width: int | None = None, nodes: int | None = None,
                 sample: bool | None = None):
        if not isinstance(head, DraftHead):
            raise ValueError(f"head={type(head).__name__}: accepted a mmspec DraftHead")
        self.head = head
        self._asked = dict(branch=branch, width=width, nodes=nodes)
        super().__init__(_Unattached(), depth=depth, branch=2 if branch is None else branch,
                         width=4 if width is None else width, nodes=nodes, sample=sample)
        self.check_branch(head.config.draft_vocab_size or head.config.vocab_size)
        self.target: Session | None = None

    @classmethod
    def from_params(cls, params, context) -> "FeatureDrafter":
        if context.head is None:
            raise ValueError("method 'head' drafts with a draft head: pass head= (a folder "
                             "saved by recipes.train.draft_head, or a DraftHead)")
        args = cls._args(params)
        args.update(branch=params.get("tree_branch"), width=params.get("tree_width"))
        return cls(context.head, **args)

    @classmethod
    def width(cls, params, context=None) -> int:
        """As ``TreeDrafter.width``, with room for up to ``depth`` pending pairs."""
        return TreeDrafter.width(params) + cls._args(params)["depth"]

    def attach(self, target: Session) -> None:
        if not hasattr(target, "keep_features"):
            raise ValueError(f"a draft head reads the target's features: accepted a target "
                             f"session that keeps them ({type(target).__name__} does not)")
        if not target.tree_verify:
            self._as_chain(target)
        target.keep_features(prompt_layers(self.head.config), self.head.config.uncond_features)
        self.target = target
        self.session = HeadSession(self.head, target, static_len=target.static_len,
                                   engine=target.engine)
        self._soft = False                      # a new session: ``begin`` softens it
        self.check_sampling()

    def _as_chain(self, target: Session) -> None:
        """Draft chains for a target without tree steps (refused with a tree's parameters)."""
        check_chain(self._asked, f"{type(target).__name__} takes no tree steps (sliding-window "
                                 "layers, or recurrent layers under guidance), so the head "
                                 "drafts a chain")
        self.branch = self.width = 1
        self.num_tokens = self.depth
        self.trees = False

    def propose(self, last, k_max, active=None) -> Draft:
        draft = super().propose(last, k_max, active)
        return draft if self.trees else Draft(tokens=draft.tokens, probs=draft.probs)

    def begin(self, input_ids, attention_mask, vocab_size=None, **prompt) -> None:
        if self.target is None:
            raise RuntimeError("FeatureDrafter.begin before attach(target)")
        self.soften()
        self._pending = prefill_pairs(self.session, input_ids, attention_mask)
        c = self.head.config           # the steps' features (the prompt's kept hidden_states[0])
        self.target.keep_features(c.feature_layers, c.uncond_features)
        self._backlog = self._backlog_valid = None

    def _feed_root(self, feed, valid):
        self.session.feed = self._pending
        out = self.session.step(feed, valid)[:, -1:]
        self._front = self.session.features[:, -1:]                        # [B, 1, d]
        return out

    def _feed_front(self, tokens, valid, tree, parent):
        d = self._front.shape[-1]
        self.session.feed = self._front.gather(1, parent[:, :, None].expand(*parent.shape, d))
        out = self.session.step(tokens, valid, tree=tree)
        self._front = self.session.features
        return out

    def observe(self, out, target_probs, num_accepted) -> None:
        feats = self.head.reduce_features(self.target.features)                # [B, K + 1, d]
        if self._depth == 0:     # nothing fed: the pairs wait, the new last joins them
            self._pending = torch.cat([self._pending, feats[:, :1]], 1)
            return
        self.session.commit(self._f, self._valid)          # the pending pairs' slots only
        n, path = out.num_accepted, out.path
        if path is None:             # a chain: the root, then the drafts in order
            path = torch.arange(out.tokens.shape[1], device=n.device).expand(n.shape[0], -1)
        on_path = feats.gather(1, path[:, :, None].expand(*path.shape, feats.shape[-1]))
        self._backlog, self._backlog_valid, self._pending = next_pairs(
            on_path, out.tokens, n, max(num_accepted), self._on)


class _Unattached(Session):
    """Stands in for the head's session until ``attach`` builds it (its sampling unknown)."""

    trees = True

    @property
    def greedy(self) -> bool:
        return True
