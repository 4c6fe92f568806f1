"""``mmspec.generate``: speculative decoding for any pair of transformers causal LMs."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .acceptance.base import Rule
from .checks import check_count, check_guidance_scale
from .distributed import whole
from .drafters.base import Drafter, NoDraft
from .drafters.model import ModelDrafter
from .engine.plan import Engine
from .loop import Stops
from .registry import MethodContext, make_rule, rule_class
from .runner import Run, prepare
from .model_facts import max_positions, output_vocab_size
from .sampling import SamplingParams, sampling_params
from .sessions.causal_lm import CausalLMSession
from .types import GenerateOutput


def _check_prompt(input_ids, attention_mask, pad_token_id: int | None = None) -> torch.Tensor:
    """The prompt's [B, P] mask: the given one, checked; else inferred from ``pad_token_id``
    as transformers does (pad ids at the left of a row are padding), refusing a row whose
    pad ids are not all at its left (ambiguous: pass attention_mask)."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.dtype != torch.long:
        raise ValueError("input_ids must be a [B, P] long tensor (left-padded for batches)")
    if input_ids.shape[0] < 1 or input_ids.shape[1] < 1:
        raise ValueError(f"input_ids must have B >= 1 rows and P >= 1 tokens, got {tuple(input_ids.shape)}")
    if attention_mask is None:
        attention_mask = _infer_mask(input_ids, pad_token_id)
    if attention_mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask must match input_ids {tuple(input_ids.shape)}, got "
                         f"{tuple(attention_mask.shape)}")
    attention_mask = attention_mask.to(device=input_ids.device, dtype=torch.long)
    if bool((attention_mask[:, -1] == 0).any()):
        raise ValueError("attention_mask: prompts must be left-padded (the last column real in "
                         "every row)")
    return attention_mask


def _infer_mask(input_ids: torch.Tensor, pad: int | None) -> torch.Tensor:
    if pad is None or input_ids.shape[0] == 1 or not bool((input_ids == pad).any()):
        return torch.ones_like(input_ids)
    is_pad = input_ids == pad
    left = is_pad.long().cumprod(1).bool()                  # the run of pad ids at each row's left
    if bool((is_pad & ~left).any()) or bool(left[:, -1].any()):
        row = int((is_pad & ~left).any(1).long().argmax())
        raise ValueError(f"attention_mask: input_ids row {row} holds the pad id {pad} after a "
                         "real token, so its padding is ambiguous: accepted an attention_mask "
                         "(1 = real token) for left-padded batches")
    return (~left).long()


def validate_pair(target, draft, *, input_ids, max_new_tokens, num_draft_tokens,
                  ahead: bool = False) -> None:
    """Every check that needs no forward pass; raises ValueError naming the parameter.
    ``ahead``: steps may draft K positions past the last new token (captured or queued)."""
    check_count("max_new_tokens", max_new_tokens)
    if draft is not None:
        check_count("num_draft_tokens", num_draft_tokens)
    v_t = output_vocab_size(target)
    if draft is not None:
        v_d = output_vocab_size(draft)
        if v_d != v_t:
            raise ValueError(f"vocabulary mismatch: the draft's vocabulary has {v_d} ids, the "
                             f"target's {v_t}; accepted a draft with the target's vocabulary")
    for name, model in (("target", target), ("draft", draft)):
        if model is None:
            continue
        limit = max_positions(model)
        if limit is not None:
            p = input_ids.shape[1]
            if p > limit:
                raise ValueError(f"input_ids has {p} tokens, longer than the {name}'s "
                                 f"max_position_embeddings={limit}: accepted prompts of at "
                                 f"most {limit} tokens")
            if p + max_new_tokens + (num_draft_tokens if ahead else 0) > limit:
                raise ValueError(f"max_new_tokens={max_new_tokens} with a {p}-token prompt "
                                 f"exceeds the {name}'s max_position_embeddings={limit}: "
                                 f"accepted max_new_tokens <= {limit - p}")
    if input_ids.numel() and (int(input_ids.max()) >= v_t or int(input_ids.min()) < 0):
        raise ValueError(f"input_ids must be ids in [0, {v_t - 1}]")


@dataclass(frozen=True)
class Guidance:
    """Classifier-free guidance of a text front door: scale s >= 0 and the unconditional
    prompts [B, P] (left-padded like the prompt); the rows' prompt extras."""

    scale: float
    uncond_ids: torch.Tensor
    uncond_mask: torch.Tensor

    @classmethod
    def from_arguments(cls, scale, uncond_ids, uncond_mask) -> "Guidance | None":
        if scale is None:
            return None
        check_guidance_scale(scale)
        if uncond_ids is None:
            raise ValueError("guidance_scale needs uncond_input_ids (the unconditional prompts, "
                             "left-padded to the prompt's shape)")
        return cls(float(scale), uncond_ids, _check_prompt(uncond_ids, uncond_mask))

    def prompt(self) -> dict:
        return dict(uncond_ids=self.uncond_ids, uncond_mask=self.uncond_mask)


def _rule(rule, target) -> Rule:
    """A Rule as given, or built from its name; rules that need an embedding table get the
    target's token embeddings (one row per output id)."""
    if not isinstance(rule, str):
        return make_rule(rule)
    cls, emb = rule_class(rule), None
    if "embeddings" in cls.param_names():
        emb = whole(target.get_input_embeddings().weight).detach().float()[
            :output_vocab_size(target)]
    return cls.from_params({}, MethodContext(embeddings=emb))


def _drafter_argument(draft, drafter):
    """A drafter object passed where the draft model goes is taken as ``drafter=``."""
    if isinstance(draft, Drafter):
        if drafter is not None:
            raise ValueError(f"draft={type(draft).__name__}(...) and drafter= both given: "
                             "accepted one drafter (pass a drafter object as drafter=)")
        return None, draft
    if drafter is not None and not isinstance(drafter, Drafter):
        raise ValueError(f"drafter={type(drafter).__name__}: accepted a mmspec Drafter "
                         "(Jacobi, ModelDrafter ...); a draft model goes in draft=")
    return draft, drafter


def _setup(target, draft, input_ids, attention_mask, rule, num_draft_tokens, max_new_tokens,
           sampling: SamplingParams, seed, drafter, guidance: Guidance | None,
           engine: Engine, pad_token_id: int | None = None) -> tuple[Run, dict]:
    """Every check, then the run and the prompt (nothing has run on a model yet)."""
    draft, drafter = _drafter_argument(draft, drafter)
    for name, model in (("target", target), ("draft", draft)):
        if not (model is None and name == "draft") and not isinstance(model, torch.nn.Module):
            raise ValueError(f"{name}={model!r:.60}: accepted a transformers causal LM object "
                             "(load a folder or id with AutoModelForCausalLM.from_pretrained)")
    attention_mask = _check_prompt(input_ids, attention_mask,
                                   _pad_id(target, pad_token_id, default=None))
    rule_obj = _rule(rule, target)
    engine.check(target)
    ahead = engine.captures or bool(engine.pipeline)      # steps may draft K past the end
    validate_pair(target, draft, input_ids=input_ids, max_new_tokens=max_new_tokens,
                  num_draft_tokens=num_draft_tokens, ahead=ahead)
    k = drafter.num_tokens if drafter is not None else (num_draft_tokens if draft is not None else 0)
    plan = engine.plan(max_new_tokens=max_new_tokens, num_draft_tokens=k,
                       draft_model=draft is not None and drafter is None,
                       holes=drafter is not None and drafter.host_free,
                       positions=input_ids.shape[1] + max_new_tokens + k,
                       limits=[max_positions(m) for m in (target, draft) if m is not None])
    g = None if guidance is None else guidance.scale
    cache = plan.cache(input_ids.shape[1], input_ids.shape[0])
    tgt = CausalLMSession(target, sampling, g, **cache)
    if drafter is None:
        drafter = (NoDraft() if draft is None else
                   ModelDrafter(CausalLMSession(draft, sampling, g, **cache), num_draft_tokens,
                                host_free=plan.queue_drafts))
    run = prepare(tgt, drafter, rule_obj, plan=plan, seed=seed, device=input_ids.device)
    prompt = dict(input_ids=input_ids, attention_mask=attention_mask,
                  **({} if guidance is None else guidance.prompt()))
    return run, prompt


def _default_stops(target) -> list[int]:
    cfg = getattr(target, "generation_config", None)
    eos = getattr(cfg, "eos_token_id", None)
    return [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))


@torch.inference_mode()
def generate(target, draft=None, input_ids=None, *, attention_mask=None, rule="exact",
             num_draft_tokens: int = 4, max_new_tokens: int = 64, temperature: float | None = None,
             top_k: int | None = None, top_p: float | None = None, min_p: float | None = None,
             seed: int | None = None, stop_token_ids=None, pad_token_id: int | None = None,
             drafter=None, guidance_scale: float | None = None, uncond_input_ids=None,
             uncond_attention_mask=None, compile: bool = False, static_cache: bool | None = None,
             pipeline: bool | None = None, profile: bool = False,
             engine: Engine | None = None, generation_config=None) -> GenerateOutput:
    """Speculative decoding of ``target`` with ``draft`` (or plain decoding if both ``draft``
    and ``drafter`` are None).

    target, draft:  transformers causal LMs with one vocabulary (``draft`` may be None).
    input_ids:      [B, P] long, left-padded; attention_mask [B, P] (1 = real token).
    rule:           a rule name (``"exact"``, ``"greedy"``, the relaxed rules, built at their
                    defaults on the target's token embeddings) or a Rule.
    num_draft_tokens: K, drafts per step (>= 1).
    temperature, top_k, top_p, min_p: processing applied to target and draft alike;
                    temperature 0 is greedy decoding (default: temperature 1, no
                    truncation; ``model.generate`` differs, see ``generation_config``).
    generation_config: a transformers GenerationConfig, or ``"model"`` for the target's own:
                    its sampling settings (greedy unless do_sample; top-k 50 when unset, as
                    transformers) under any of the four arguments above that are given.
    seed:           seeds a torch.Generator on the prompt's device (None: global RNG).
    stop_token_ids: ids that end a row (default: the target's eos_token_id).
    pad_token_id:   fills each row after its end in ``sequences``, and marks the left padding
                    when ``attention_mask`` is not given (default: the target's pad id).
    drafter:        a drafter object instead of ``draft`` (``Jacobi``, ensembles ...); a
                    drafter passed as ``draft`` is taken as ``drafter``.
    guidance_scale: classifier-free guidance u + s (c - u) on the logits of target and draft;
                    ``uncond_input_ids`` [B, P] (left-padded like the prompt) are the
                    unconditional rows, rolled back together with the conditional ones.
    compile:        True (or ``"regional"``): static caches, each decoder layer fused by
                    torch.compile (traced once per step width for all layers; about 40 s
                    before a 7B model's first token, once per process) and the decoding steps
                    captured as CUDA graphs (one per step width, replayed every step; CUDA
                    only; docs/engine.md). ``"graphs"``: captured without compiling (ready in
                    about a second, slower steps); ``"inductor"``: each whole step fused
                    (coordinate-descent tuned; about 55 s of compilation per width for a 7B
                    model). The eager path is the reference and gives identical tokens under
                    greedy decoding in float32. K stays fixed to the end (one width).
    static_cache:   static, position-indexed caches without compiling (default: = compile).
                    Static caches and captured steps are kept for the next call with the same
                    rows and cache length (``mmspec.release_graphs(model)`` frees them).
    pipeline:       each step queued before the previous one is read, so the device never
                    waits for the host between steps (``stream``). Speculative steps then keep
                    rejected slots as holes (no host value is needed between steps; caches get
                    K + 1 slots per step). None: plain decoding pipelined, and speculative
                    decoding too with ``compile=True`` or ``"graphs"`` (captured steps:
                    measured faster on an H100 at batch 1 and 16, docs/benchmarks.md; not with
                    ``"inductor"``, whose
                    steps attend over the whole cache, nor eagerly or with ``profile``);
                    False: neither. Same tokens either way.
    engine:         an ``mmspec.Engine`` instead of compile, static_cache, pipeline and profile
                    (docs/engine.md).

    Rows keep independent accepted lengths (ragged, docs/DESIGN.md); each row stops at its own
    stop token or after max_new_tokens. Returns GenerateOutput(sequences [B, P + T],
    num_generated [B], prompt_length, stats).
    """
    run, stops = _start(**locals())
    res = run.collect(input_ids[:, -1], stops=stops)
    return _output(input_ids, res.tokens, run.stats, _pad_id(target, pad_token_id))


def _start(target, draft, input_ids, *, attention_mask, rule, num_draft_tokens, max_new_tokens,
           temperature, top_k, top_p, min_p, seed, stop_token_ids, pad_token_id, drafter,
           guidance_scale, uncond_input_ids, uncond_attention_mask, compile, static_cache,
           pipeline, profile, engine, generation_config) -> tuple[Run, Stops]:
    """``generate``'s and ``generate_stream``'s arguments -> the run, its prompt fed, and the
    stops."""
    engine = Engine.from_switches(compile, static_cache, pipeline, profile, engine)
    sampling = sampling_params(target, generation_config, temperature=temperature, top_k=top_k,
                               top_p=top_p, min_p=min_p)
    guidance = Guidance.from_arguments(guidance_scale, uncond_input_ids, uncond_attention_mask)
    run, prompt = _setup(target, draft, input_ids, attention_mask, rule, num_draft_tokens,
                         max_new_tokens, sampling, seed, drafter, guidance, engine, pad_token_id)
    stops = Stops(_default_stops(target) if stop_token_ids is None else stop_token_ids)
    run.prefill(prompt)
    return run, stops


def _pad_id(target, pad_token_id: int | None, default: int | None = 0) -> int | None:
    """The pad id: given, else the target's generation config's or config's, else ``default``."""
    if pad_token_id is not None:
        return pad_token_id
    for cfg in (getattr(target, "generation_config", None), target.config):
        pad = getattr(cfg, "pad_token_id", None)
        if pad is not None:
            return pad
    return default


def _output(input_ids, rows: list[list[int]], stats, pad_token_id: int) -> GenerateOutput:
    width = max(len(t) for t in rows)
    gen = torch.full((input_ids.shape[0], width), pad_token_id, dtype=torch.long)
    for i, toks in enumerate(rows):
        gen[i, : len(toks)] = torch.tensor(toks, dtype=torch.long)
    sequences = torch.cat([input_ids, gen.to(input_ids.device)], 1)
    num = torch.tensor([len(t) for t in rows], dtype=torch.long)
    return GenerateOutput(sequences=sequences, num_generated=num,
                          prompt_length=input_ids.shape[1], stats=stats)


@torch.inference_mode()
def generate_stream(target, draft=None, input_ids=None, *, attention_mask=None, rule="exact",
                    num_draft_tokens: int = 4, max_new_tokens: int = 64,
                    temperature: float | None = None, top_k: int | None = None,
                    top_p: float | None = None, min_p: float | None = None,
                    seed: int | None = None, stop_token_ids=None, pad_token_id: int | None = None,
                    drafter=None, guidance_scale: float | None = None, uncond_input_ids=None,
                    uncond_attention_mask=None, compile: bool = False,
                    static_cache: bool | None = None, pipeline: bool | None = None,
                    profile: bool = False, engine: Engine | None = None,
                    generation_config=None):
    """``generate``, yielding ``StepEvent``s (each row's new token ids) as they are accepted;
    the same arguments and defaults (``pad_token_id`` marks the prompt's left padding when no
    mask is given)."""
    run, stops = _start(**locals())
    yield from run.stream(input_ids[:, -1], stops=stops)
