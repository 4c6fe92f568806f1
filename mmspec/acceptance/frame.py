"""Frame-level acceptance for multi-codebook events (codec frames from parallel heads).

A delay-pattern decoder (MusicGen, Parler, Dia) emits one C-tuple per step from C heads that
are independent given the prefix: p(frame) = prod_c p_c, and a draft of the same pattern has
q(frame) = prod_c q_c. docs/METHODS.md section 7: verify codebook by codebook with a scalar rule:
codebook c is kept with that rule's acceptance probability (independent uniforms); the frame
is accepted when every codebook is; at the first rejected codebook c* of the first rejected
frame, y_{c*} is drawn from the rule's residual, codebooks before c* keep the draft, and
codebooks after c* are drawn fresh from p_c.

Lossless with the exact rule: codebook by codebook this is exact speculative sampling of
independent variables (x_c ~ q_c independently of the earlier codebooks' tests, so y_c ~ p_c;
after a rejection the rest are fresh draws from p), so the emitted frame ~ prod_c p_c; the
next frame is only verified when the whole frame was accepted. With relaxed rules (PCG groups
from each codebook's embedding table) the frame inherits their declared properties per
codebook.

Shapes: draft_tokens [B, K, C], draft_probs [B, K, C, V] or None, target_probs
[B, K+1, C, V]; tokens [B, K+1, C] padded with PAD.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..sampling import check_probs, sample
from ..types import PAD, VerifyOutput
from .base import Rule
from .exact import Exact


@dataclass(frozen=True, repr=False, eq=False)
class Frame(Rule):
    """``Frame()`` (exact per codebook) or ``Frame(rules=[rule_0, ..., rule_{C-1}])``."""

    rules: tuple = field(default_factory=lambda: (Exact(),))
    name = "frame"
    event = "frame"

    def __post_init__(self):
        rules = tuple(self.rules) if isinstance(self.rules, (list, tuple)) else (self.rules,)
        if not rules or not all(isinstance(r, Rule) for r in rules):
            raise ValueError("rules: accepted a Rule or a list of Rules (one per codebook)")
        object.__setattr__(self, "rules", rules)

    @property
    def lossless(self) -> bool:   # type: ignore[override]
        return all(r.lossless for r in self.rules)

    def rule(self, c: int) -> Rule:
        """The rule of codebook ``c`` (one rule shared by every codebook, or one per codebook)."""
        return self.rules[c] if len(self.rules) > 1 else self.rules[0]

    def validate(self, draft_tokens, draft_probs, target_probs, values: bool = True) -> None:
        if draft_tokens.dim() != 3 or draft_tokens.dtype != torch.long:
            raise ValueError(f"draft_tokens must be a [B, K, C] long tensor (frames of C "
                             f"codebooks), got {tuple(draft_tokens.shape)}")
        b, k, c = draft_tokens.shape
        if target_probs.dim() != 4 or target_probs.shape[:3] != (b, k + 1, c):
            raise ValueError(f"target_probs must be [B, K+1, C, V] = [{b}, {k + 1}, {c}, V], got "
                             f"{tuple(target_probs.shape)}")
        if len(self.rules) > 1 and len(self.rules) != c:
            raise ValueError(f"{len(self.rules)} rules for {c} codebooks: accepted one rule or one "
                             "per codebook")
        v = target_probs.shape[-1]
        if draft_probs is not None and tuple(draft_probs.shape) != (b, k, c, v):
            raise ValueError(f"draft_probs must be None or [B, K, C, V] = [{b}, {k}, {c}, {v}], "
                             f"got {tuple(draft_probs.shape)}")
        if values:
            check_probs("target_probs", target_probs)
            if draft_probs is not None:
                check_probs("draft_probs", draft_probs)

    def accept_probs(self, x, p, q) -> torch.Tensor:
        """[B, K, C] per-codebook acceptance probabilities."""
        cols = []
        for c in range(x.shape[-1]):
            qc = None if q is None else q[:, :, c]
            cols.append(self.rule(c).accept_prob(x[..., c], p[:, :, c], qc))
        return torch.stack(cols, -1)

    def residuals(self, x, p, q, pos) -> torch.Tensor:
        """x [N, C], p and q [N, C, V] -> [N, C, V] each codebook's residual."""
        return torch.stack([self.rule(c).residual(x[:, c], p[:, c], None if q is None else q[:, c], pos)
                            for c in range(x.shape[-1])], 1)

    # -- what the target is asked: overridden by DepthFrame ---------------------------------
    def along(self, target, draft_tokens, validate: bool):
        """Each codebook's target distribution at the drafted frames [B, K, C, V]."""
        return target[:, :draft_tokens.shape[1]]

    def complete(self, target, pos, frame, first_free, generator):
        """frame [B, C] with codebooks >= first_free [B] drawn from the target at frame position
        pos [B] (parallel heads: each from its own p_c)."""
        rows = torch.arange(frame.shape[0], device=frame.device)
        fresh = sample(target[rows, pos], generator)                               # [B, C]
        cc = torch.arange(frame.shape[1], device=frame.device)[None]
        return torch.where(cc >= first_free[:, None], fresh, frame)

    def __call__(self, draft_tokens, draft_probs, target_probs, generator=None, *, validate=True):
        self.validate(draft_tokens, draft_probs, target_probs, values=validate)
        b, k, c = draft_tokens.shape
        t = target_probs
        dev = draft_tokens.device
        rows = torch.arange(b, device=dev)
        zeros = torch.zeros(b, dtype=torch.long, device=dev)
        if k == 0:
            frame = self.complete(t, zeros, torch.zeros(b, c, dtype=torch.long, device=dev), zeros,
                                  generator)
            return VerifyOutput(tokens=frame[:, None], num_accepted=zeros)
        p = self.along(t, draft_tokens, validate)                                  # [B, K, C, V]
        a = self.accept_probs(draft_tokens, p, draft_probs)                       # [B, K, C]
        u = torch.rand(a.shape, generator=generator, device=a.device, dtype=a.dtype)
        ok = u < a
        n = ok.all(-1).long().cumprod(1).sum(1)                                   # [B]
        j = n.clamp(max=k - 1)
        x_j, ok_j, p_j = draft_tokens[rows, j], ok[rows, j], p[rows, j]           # [B, C], [B, C, V]
        q_j = None if draft_probs is None else draft_probs[rows, j]
        first_bad = torch.where(~ok_j, torch.arange(c, device=dev), c).amin(1)   # [B]
        fb = first_bad.clamp(max=c - 1)
        y_res = sample(self.residuals(x_j, p_j, q_j, j)[rows, fb], generator)
        rejected = n < k
        frame = x_j.clone()
        frame[rows, fb] = torch.where(rejected, y_res, frame[rows, fb])
        # Rejected rows: codebooks after the first rejected one fresh at that frame; rows that
        # accepted every frame: a whole bonus frame at position K.
        last = self.complete(t, torch.where(rejected, j, k), frame,
                             torch.where(rejected, first_bad + 1, 0), generator)
        tokens = torch.cat([draft_tokens, draft_tokens.new_full((b, 1, c), PAD)], 1)
        cols = torch.arange(k + 1, device=dev)
        tokens = torch.where((cols[None] < n[:, None])[..., None], tokens, PAD)
        tokens[rows, n] = last
        return VerifyOutput(tokens=tokens, num_accepted=n)


@dataclass(frozen=True, repr=False, eq=False)
class DepthFrame(Frame):
    """Frames whose codebooks are generated one after another (a depth decoder: CSM).

    ``target_probs`` is not a tensor but an autoregressive frame distribution over [B, K+1]
    positions with ``along(x [B, K, C]) -> [B, K, C, V]`` (each codebook's conditional given
    the drafted frame's earlier codebooks, teacher-forced) and ``complete(pos [B], frame
    [B, C], first_free [B], generator) -> [B, C]`` (codebooks >= first_free drawn from the
    target's conditionals at frame position pos, the others kept). Draft probabilities are
    the draft's conditionals along its own frames, [B, K, C, V].

    The rule is ``Frame``'s over the flattened stream of codebooks: codebook c of a drafted
    frame is kept with the scalar rule's probability for p_c(. | x_<c) against q_c(. | x_<c);
    at the first rejected codebook c* the residual is drawn, and codebooks after c* are drawn
    fresh from the target given the new prefix (the depth decoder runs again), so the emitted
    frame is exactly p(frame) = prod_c p_c(x_c | x_<c) with the exact rule: this is exact
    speculative sampling of the token sequence x_0, x_1, ... of codebooks (each accepted token
    is distributed as the target's conditional given the same prefix). Lossless with
    ``Exact`` per codebook; relaxed rules carry their declared properties per codebook.
    """

    name = "depth-frame"

    def validate(self, draft_tokens, draft_probs, target_probs, values: bool = True) -> None:
        if draft_tokens.dim() != 3 or draft_tokens.dtype != torch.long:
            raise ValueError(f"draft_tokens must be a [B, K, C] long tensor (frames of C "
                             f"codebooks), got {tuple(draft_tokens.shape)}")
        b, k, c = draft_tokens.shape
        if not (hasattr(target_probs, "along") and hasattr(target_probs, "complete")):
            raise ValueError("target_probs must be an autoregressive frame distribution (along, "
                             "complete): depth-decoder targets verify frames with their depth "
                             "decoder")
        if tuple(target_probs.batch_shape) != (b, k + 1) or target_probs.codebooks != c:
            raise ValueError(f"target frames must cover [B, K+1] = [{b}, {k + 1}] positions of "
                             f"{c} codebooks, got {tuple(target_probs.batch_shape)} of "
                             f"{target_probs.codebooks}")
        if k and (draft_probs is None or draft_probs.dim() != 4
                  or tuple(draft_probs.shape[:3]) != (b, k, c)):
            raise ValueError(f"draft_probs must be [B, K, C, V] = [{b}, {k}, {c}, V] (the draft's "
                             f"conditionals along its frames), got "
                             f"{None if draft_probs is None else tuple(draft_probs.shape)}")
        if values and k:
            check_probs("draft_probs", draft_probs)

    def along(self, target, draft_tokens, validate: bool):
        p = target.along(draft_tokens)
        if validate:
            check_probs("target_probs", p)
        return p

    def complete(self, target, pos, frame, first_free, generator):
        return target.complete(pos, frame, first_free, generator)
