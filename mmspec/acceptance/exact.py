"""Exact speculative sampling (Leviathan et al. 2023; Chen et al. 2023) and greedy verification.

Exact: accept x_i iff u_i < min(1, p_i(x_i) / q_i(x_i)); at the first rejection emit a token
from norm(max(0, p_i - q_i)); if all K pass, a bonus token from p_{K+1}. The emitted tokens are
distributed exactly as the (processed) target. A point-mass draft has q = one-hot(x): accept
with probability p(x), residual = p with x removed, renormalised.

Greedy: accept while x_i == argmax p_i, then emit argmax p at the first mismatch (or the bonus
position). Equals plain greedy decoding of the target for any draft (when both compute the
target's logits alike: in float32; bf16 kernels of other widths can break near-ties);
deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..sampling import residual as _residual
from ..types import PAD, VerifyOutput
from .base import Rule
from .tree import exact_tree, greedy_tree


@dataclass(frozen=True, repr=False)
class Exact(Rule):
    """Speculative sampling; lossless with respect to the processed target distribution."""

    lossless = True
    name = "exact"
    trees = True

    def verify_tree(self, tree, draft_tokens, draft_probs, target_probs, generator=None):
        return exact_tree(tree, draft_tokens, draft_probs, target_probs, generator)

    def accept_prob(self, x, p, q):
        px = p.gather(-1, x[..., None]).squeeze(-1)
        return self.ratio(px, self.draft_mass(x, q, p))

    def residual(self, x, p, q, pos):
        return _residual(p, self.dense_q(x, q, p))

    def for_target(self, greedy: bool) -> Rule:
        # A greedy target's p is one-hot, where exact verification is the argmax chain for any
        # q: the same tokens without the generic rule's draws, residuals and sampling.
        return Greedy() if greedy else self


@dataclass(frozen=True, repr=False)
class Greedy(Rule):
    """Greedy verification: lossless with respect to greedy decoding of the target
    (the emitted tokens are exactly the target's argmax chain), whatever the temperature
    the draft used."""

    lossless = True
    name = "greedy"
    trees = True
    fuses = True

    def verify_tree(self, tree, draft_tokens, draft_probs, target_probs, generator=None):
        return greedy_tree(tree, draft_tokens, draft_probs, target_probs, generator)

    def for_target(self, greedy: bool) -> Rule:
        # Sampling at temperature > 0 with this rule would emit the argmax chain anyway:
        # greedy decoding the caller did not ask for, refused rather than done silently.
        if not greedy:
            raise ValueError("rule 'greedy' emits the target's argmax chain: accepted with "
                             "temperature=0 (sampling at temperature > 0: rule 'exact', "
                             "lossless at any temperature)")
        return self

    def accept_prob(self, x, p, q):
        return (x == p.argmax(-1)).to(p.dtype)

    def reference(self, p):
        return torch.zeros_like(p).scatter_(-1, p.argmax(-1, keepdim=True), 1.0)

    def residual(self, x, p, q, pos):
        return torch.zeros_like(p).scatter_(-1, p.argmax(-1, keepdim=True), 1.0)

    def __call__(self, draft_tokens, draft_probs, target_probs, generator=None, *, validate=True):
        # The argmax chain directly (a handful of kernels; the generic path would build a
        # one-hot p and draw numbers it cannot use): no randomness, the generator is untouched.
        self.validate(draft_tokens, draft_probs, target_probs, values=validate)
        k = draft_tokens.shape[1]
        best = target_probs.argmax(-1)                                           # [B, K+1]
        if k == 0:                                   # plain decoding: the argmax is the token
            return VerifyOutput(tokens=best, num_accepted=best.new_zeros(best.shape[0]))
        n = (draft_tokens == best[:, :k]).long().cumprod(1).sum(1)               # [B]
        cols = torch.arange(k + 1, device=best.device)
        tokens = torch.where(cols[None] <= n[:, None], best, PAD)
        return VerifyOutput(tokens=tokens, num_accepted=n)
