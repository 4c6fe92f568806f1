"""The contract every acceptance rule follows, and the one place that turns a rule's
per-position acceptance probabilities and residuals into emitted tokens.

A rule is called as

    rule(draft_tokens [B, K] long, draft_probs [B, K, V] or None,
         target_probs [B, K+1, V], generator=None) -> VerifyOutput

``draft_probs=None`` is a point-mass draft (q(x) = 1 at the drafted token: n-gram lookup,
argmax drafts, fresh Jacobi tokens). A subclass supplies two pure tensor functions:

- ``accept_prob(x, p, q) -> [B, K]``: probability of keeping draft token x_i given that
  x_1..x_{i-1} were kept;
- ``residual(x, p, q, pos) -> [N, V]``: the distribution of the recovered token when the
  draft token at (0-based) position ``pos`` is the first rejected one.

``__call__`` then, for all rows at once and with no host synchronisation: draws
u ~ U[0, 1) per position, keeps x_i while u_i < a_i (strict, so a_i = 0 never accepts),
and samples one recovered token at the first rejection or a bonus token from p_{K+1}.
Rules never call a model, touch a cache or read a tokenizer.
"""

from __future__ import annotations

import dataclasses

import torch

from ..sampling import check_probs, sample
from ..types import PAD, VerifyOutput


def _one_hot(x: torch.Tensor, v: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.zeros(*x.shape, v, dtype=dtype, device=x.device).scatter_(-1, x[..., None], 1.0)


class Rule:
    """Base class of acceptance rules. Subclasses set ``lossless``, ``name`` and ``event``
    (what one drafted unit is: ``"token"`` an id, ``"frame"`` a tuple of codebook ids,
    ``"vector"`` a continuous token)."""

    lossless: bool = False
    name: str = "rule"
    event: str = "token"
    exact_at: dict | None = None      # relaxed rules: the parameters where they equal Exact
    trees: bool = False               # verifies draft trees (``verify_tree``)
    fuses: bool = False               # traceable whole by torch.compile (no generator draws)

    # -- built from a method's parameters (``mmspec.registry``) ----------------------------
    @classmethod
    def param_names(cls) -> tuple[str, ...]:
        """The parameters ``from_params`` reads: the dataclass fields a user may set."""
        if not dataclasses.is_dataclass(cls):
            return ()
        return tuple(f.name for f in dataclasses.fields(cls) if f.init and not f.name.startswith("_"))

    @classmethod
    def from_params(cls, params: dict, context) -> "Rule":
        """The rule for a method's parameters; a table the rule needs (``embeddings``) comes
        from ``context.embeddings`` when the user gave none."""
        kw = dict(params)
        if "embeddings" in cls.param_names() and kw.get("embeddings") is None:
            field = {f.name: f for f in dataclasses.fields(cls)}["embeddings"]
            required = field.default is dataclasses.MISSING
            if context.embeddings is None and required:
                raise ValueError(f"rule {cls.name!r} needs an embedding table (a codebook or "
                                 "token embeddings): this target gives none")
            kw["embeddings"] = context.embeddings
        return cls(**kw)

    def reference(self, p: torch.Tensor) -> torch.Tensor:
        """What a lossless rule's emitted tokens are distributed as, for target p [..., V]:
        p itself (``Greedy``: the argmax, as greedy decoding of the target)."""
        return p

    def for_target(self, greedy: bool) -> "Rule":
        """The rule to verify a target with (``greedy``: its distributions are one-hot)."""
        return self

    # -- what a subclass provides ------------------------------------------------------
    def accept_prob(self, x: torch.Tensor, p: torch.Tensor, q: torch.Tensor | None) -> torch.Tensor:
        """x [B, K], p [B, K, V], q [B, K, V] or None -> [B, K] in [0, 1]."""
        raise NotImplementedError

    def residual(self, x: torch.Tensor, p: torch.Tensor, q: torch.Tensor | None,
                 pos: torch.Tensor) -> torch.Tensor:
        """x [N], p [N, V], q [N, V] or None, pos [N] (0-based) -> [N, V] distribution."""
        raise NotImplementedError

    def verify_tree(self, tree, draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None,
                    target_probs: torch.Tensor, generator: torch.Generator | None = None
                    ) -> VerifyOutput:
        """Verify a draft tree (``mmspec.tree.Tree``; tokens [B, K], probs [B, K, V] or None,
        target_probs [B, K + 1, V]): the emitted tokens along the accepted path, with
        ``path``. Rules that declare ``trees`` implement it (``mmspec.acceptance.tree``)."""
        raise ValueError(f"rule {self.name!r} does not verify draft trees: accepted 'exact', "
                         "'greedy' or a relaxed rule (lantern, gsd, annealed)")

    # -- shared helpers ----------------------------------------------------------------
    @staticmethod
    def draft_mass(x: torch.Tensor, q: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
        """q(x) with the point-mass convention (1 where q is None)."""
        if q is None:
            return torch.ones(x.shape, dtype=like.dtype, device=like.device)
        return q.gather(-1, x[..., None]).squeeze(-1)

    @staticmethod
    def dense_q(x: torch.Tensor, q: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
        """q as a dense distribution (one-hot at x for a point-mass draft)."""
        return _one_hot(x, like.shape[-1], like.dtype) if q is None else q

    @staticmethod
    def ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
        """min(1, num / den), with 0/0 -> 0 and c/0 -> 1 for c > 0."""
        safe = torch.where(den > 0, den, torch.ones_like(den))
        r = torch.where(den > 0, num / safe, (num > 0).to(num.dtype))
        return r.clamp(0, 1)

    # -- the contract ------------------------------------------------------------------
    def validate(self, draft_tokens, draft_probs, target_probs, values: bool = True) -> None:
        """Shape checks (free) and, with ``values``, finiteness checks (one host sync)."""
        if draft_tokens.dim() != 2 or draft_tokens.dtype != torch.long:
            raise ValueError(
                f"draft_tokens must be a [B, K] long tensor, got {tuple(draft_tokens.shape)} "
                f"{draft_tokens.dtype}"
            )
        b, k = draft_tokens.shape
        if target_probs.dim() != 3 or target_probs.shape[:2] != (b, k + 1):
            raise ValueError(
                f"target_probs must be [B, K+1, V] = [{b}, {k + 1}, V], got "
                f"{tuple(target_probs.shape)}"
            )
        v = target_probs.shape[-1]
        if draft_probs is not None and tuple(draft_probs.shape) != (b, k, v):
            raise ValueError(
                f"draft_probs must be None or [B, K, V] = [{b}, {k}, {v}] (same vocabulary as "
                f"target_probs), got {tuple(draft_probs.shape)}"
            )
        if values:
            if k and (bool((draft_tokens < 0).any()) or bool((draft_tokens >= v).any())):
                raise ValueError(f"draft_tokens must be ids in [0, {v - 1}]")
            check_probs("target_probs", target_probs)
            if draft_probs is not None:
                check_probs("draft_probs", draft_probs)

    def __call__(self, draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None,
                 target_probs: torch.Tensor, generator: torch.Generator | None = None,
                 *, validate: bool = True) -> VerifyOutput:
        self.validate(draft_tokens, draft_probs, target_probs, values=validate)
        b, k = draft_tokens.shape
        p = target_probs
        rows = torch.arange(b, device=p.device)
        if k == 0:  # plain decoding: only the bonus token
            tok = sample(p[:, 0], generator)
            return VerifyOutput(tokens=tok[:, None], num_accepted=torch.zeros_like(tok))

        a = self.accept_prob(draft_tokens, p[:, :k], draft_probs)                  # [B, K]
        u = torch.rand(a.shape, generator=generator, device=a.device, dtype=a.dtype)
        kept = (u < a).to(torch.long)
        n = kept.cumprod(dim=1).sum(dim=1)                                          # [B]

        # Distribution of the final token: residual at the first rejection, else p_{K+1}.
        j = n.clamp(max=k - 1)
        x_j = draft_tokens[rows, j]
        q_j = None if draft_probs is None else draft_probs[rows, j]
        res = self.residual(x_j, p[rows, j], q_j, j)                                # [B, V]
        final = torch.where((n < k)[:, None], res, p[:, k])
        last = sample(final, generator)                                             # [B]

        cols = torch.arange(k + 1, device=p.device)
        tokens = torch.cat([draft_tokens, draft_tokens.new_full((b, 1), PAD)], dim=1)
        tokens = torch.where(cols[None] < n[:, None], tokens, PAD)
        tokens[rows, n] = last
        return VerifyOutput(tokens=tokens, num_accepted=n)

    def __repr__(self) -> str:
        fields = getattr(self, "__dataclass_fields__", None)
        if not fields:
            return f"{type(self).__name__}()"
        def show(v):
            if isinstance(v, torch.Tensor):
                return f"Tensor[{'x'.join(map(str, v.shape))}]"
            return repr(v)

        args = ", ".join(f"{f}={show(getattr(self, f))}" for f in fields if not f.startswith("_"))
        return f"{type(self).__name__}({args})"
