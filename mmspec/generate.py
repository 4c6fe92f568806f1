"""``mmspec.generate``: speculative decoding for any pair of transformers causal LMs."""

from __future__ import annotations

import math
import time

import torch

from .acceptance.base import Rule
from .drafters.base import NoDraft
from .drafters.model import ModelDrafter
from .loop import run, stream
from .registry import make_rule
from .sampling import SamplingParams, make_generator
from .session import CausalLMSession, max_positions, output_vocab_size
from .types import GenerateOutput, StepStats


def _check_prompt(input_ids, attention_mask) -> torch.Tensor:
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.dtype != torch.long:
        raise ValueError("input_ids must be a [B, P] long tensor (left-padded for batches)")
    if input_ids.shape[0] < 1 or input_ids.shape[1] < 1:
        raise ValueError(f"input_ids must have B >= 1 rows and P >= 1 tokens, got {tuple(input_ids.shape)}")
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    if attention_mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask must match input_ids {tuple(input_ids.shape)}, got "
                         f"{tuple(attention_mask.shape)}")
    attention_mask = attention_mask.to(device=input_ids.device, dtype=torch.long)
    if bool((attention_mask[:, -1] == 0).any()):
        raise ValueError("attention_mask: prompts must be left-padded (the last column real in "
                         "every row)")
    return attention_mask


def validate_pair(target, draft, *, input_ids, max_new_tokens, num_draft_tokens,
                  compile=False) -> None:
    """Every check that needs no forward pass; raises ValueError naming the parameter."""
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens!r}: accepted an integer >= 1")
    if draft is not None and (not isinstance(num_draft_tokens, int) or num_draft_tokens < 1):
        raise ValueError(f"num_draft_tokens={num_draft_tokens!r}: accepted an integer >= 1")
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
            if p + max_new_tokens + (num_draft_tokens if compile else 0) > limit:
                raise ValueError(f"max_new_tokens={max_new_tokens} with a {p}-token prompt "
                                 f"exceeds the {name}'s max_position_embeddings={limit}: "
                                 f"accepted max_new_tokens <= {limit - p}")
    if input_ids.numel() and (int(input_ids.max()) >= v_t or int(input_ids.min()) < 0):
        raise ValueError(f"input_ids must be ids in [0, {v_t - 1}]")


def static_length(prompt_len: int, batch: int, max_new_tokens: int, k: int,
                  holes: bool = False) -> int:
    """Slots a static cache needs: one row uses prompt + new + K + 1; ragged rows (or
    ``holes``: every step keeps its K + 1 slots) leave at most K holes per step, bounded by
    (K + 1) slots per generated token and one more step; rounded up to 64."""
    if batch == 1 and not holes:
        need = prompt_len + max_new_tokens + k + 1
    else:
        need = prompt_len + (k + 1) * (max_new_tokens + 1)
    return -(-need // 64) * 64


def check_engine(compile, static_cache, pipeline, model=None) -> bool:
    """Check the engine switches (``compile``, ``static_cache``, ``pipeline``) before any work;
    returns whether the caches are static."""
    if compile not in (False, True, "inductor"):
        raise ValueError(f"compile={compile!r}: accepted False, True or 'inductor'")
    if static_cache not in (None, False, True):
        raise ValueError(f"static_cache={static_cache!r}: accepted None, True or False")
    if pipeline is not None and not isinstance(pipeline, bool):
        raise ValueError(f"pipeline={pipeline!r}: accepted None, True or False")
    static = bool(compile) if static_cache is None else static_cache
    if compile and not static:
        raise ValueError("compile=True needs static_cache=True (fixed shapes)")
    if compile and model is not None and next(model.parameters()).device.type != "cuda":
        raise ValueError("compile=True captures CUDA graphs: accepted a model on a CUDA device")
    return static


def pipelines_by_default(compile, profile: bool = False) -> bool:
    """Whether a draft model's steps are queued ahead when ``pipeline`` is not given: with
    captured steps (``compile=True``; measured faster on an H100, README "GPU path"), not
    under ``profile`` (which synchronises between phases) nor ``"inductor"`` (not measured)."""
    return compile is True and not profile


def queues_drafts(pipeline, compile, uses_draft: bool, positions: int, limits,
                  profile: bool = False) -> bool:
    """Whether an adapter queues a draft model's steps ahead (``ModelDrafter(host_free=True)``):
    ``pipeline=True`` asks for it, None leaves it to ``pipelines_by_default``. Each step drafts
    K tokens, so the last step reaches ``positions`` (prompt + new tokens + K): queued only where
    that fits every one of ``limits`` (the models' max_position_embeddings, None for none);
    ``pipeline=True`` raises otherwise."""
    if not uses_draft:
        return False
    limits = [m for m in limits if m is not None]
    fits = all(positions <= m for m in limits)
    if pipeline and not fits:
        raise ValueError(f"pipeline=True: the last drafts would pass max_position_embeddings="
                         f"{min(limits)} ({positions} positions needed): accepted fewer new "
                         "tokens or drafts, or pipeline=None")
    return fits and (pipelines_by_default(compile, profile) if pipeline is None else pipeline)


def _prepare(target, draft, input_ids, attention_mask, rule, num_draft_tokens, max_new_tokens,
             temperature, top_k, top_p, min_p, seed, drafter, guidance_scale=None,
             uncond_input_ids=None, uncond_attention_mask=None, compile=False, static_cache=None,
             pipeline=None):
    attention_mask = _check_prompt(input_ids, attention_mask)
    prompt = {}
    if guidance_scale is not None:
        if not (isinstance(guidance_scale, (int, float)) and math.isfinite(guidance_scale)
                and guidance_scale >= 0):
            raise ValueError(f"guidance_scale={guidance_scale!r}: accepted a finite float >= 0")
        if uncond_input_ids is None:
            raise ValueError("guidance_scale needs uncond_input_ids (the unconditional prompts, "
                             "left-padded to the prompt's shape)")
        uncond_attention_mask = _check_prompt(uncond_input_ids, uncond_attention_mask)
        prompt = dict(uncond_ids=uncond_input_ids, uncond_mask=uncond_attention_mask)
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    rule_obj: Rule = make_rule(rule)
    validate_pair(target, draft, input_ids=input_ids, max_new_tokens=max_new_tokens,
                  num_draft_tokens=num_draft_tokens, compile=bool(compile) or bool(pipeline))
    generator = make_generator(seed, input_ids.device)
    static = check_engine(compile, static_cache, pipeline, target)
    k = num_draft_tokens if (draft is not None or drafter is not None) else 0
    k = getattr(drafter, "num_tokens", k)
    if pipeline and drafter is not None:
        raise ValueError("pipeline=True builds its own drafter: pass draft=, not drafter= "
                         "(or a ModelDrafter(host_free=True))")
    host_free = bool(pipeline)
    holes = k > 0 and (host_free if drafter is None else bool(getattr(drafter, "host_free", False)))
    slen = (static_length(input_ids.shape[1], input_ids.shape[0], max_new_tokens, k, holes)
            if static else None)
    tgt = CausalLMSession(target, params, guidance_scale, static_len=slen, compile=compile)
    if drafter is None:
        drafter = (NoDraft() if draft is None else
                   ModelDrafter(CausalLMSession(draft, params, guidance_scale, static_len=slen,
                                                compile=compile), num_draft_tokens,
                                host_free=host_free))
    if hasattr(drafter, "generator"):
        drafter.generator = generator
    return attention_mask, tgt, drafter, rule_obj, generator, prompt


def _default_stops(target) -> list[int]:
    cfg = getattr(target, "generation_config", None)
    eos = getattr(cfg, "eos_token_id", None)
    return [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))


@torch.inference_mode()
def generate(target, draft=None, input_ids=None, *, attention_mask=None, rule="exact",
             num_draft_tokens: int = 4, max_new_tokens: int = 64, temperature: float = 1.0,
             top_k: int | None = None, top_p: float | None = None, min_p: float | None = None,
             seed: int | None = None, stop_token_ids=None, pad_token_id: int | None = None,
             drafter=None, guidance_scale: float | None = None, uncond_input_ids=None,
             uncond_attention_mask=None, compile: bool = False, static_cache: bool | None = None,
             pipeline: bool | None = None, profile: bool = False) -> GenerateOutput:
    """Speculative decoding of ``target`` with ``draft`` (or plain decoding if both ``draft``
    and ``drafter`` are None).

    target, draft:  transformers causal LMs with one vocabulary (``draft`` may be None).
    input_ids:      [B, P] long, left-padded; attention_mask [B, P] (1 = real token).
    rule:           a rule name (``"exact"``, ``"greedy"``, the relaxed rules) or a Rule.
    num_draft_tokens: K, drafts per step (>= 1).
    temperature, top_k, top_p, min_p: processing applied to target and draft alike;
                    temperature 0 is greedy decoding.
    seed:           seeds a torch.Generator on the prompt's device (None: global RNG).
    stop_token_ids: ids that end a row (default: the target's eos_token_id).
    drafter:        a drafter object instead of ``draft`` (``Jacobi``, ensembles ...).
    guidance_scale: classifier-free guidance u + s (c - u) on the logits of target and draft;
                    ``uncond_input_ids`` [B, P] (left-padded like the prompt) are the
                    unconditional rows, rolled back together with the conditional ones.
    compile:        static caches and decoding steps captured as CUDA graphs (one per step
                    width, replayed every step; CUDA only); ``"inductor"`` also fuses each
                    step with torch.compile first (coordinate-descent tuned; about 55 s of
                    compilation per width for a 7B model, once per process). The eager path
                    is the reference and gives identical tokens under greedy decoding in
                    float32. K stays fixed to the end (one width).
    static_cache:   static, position-indexed caches without compiling (default: = compile).
                    Static caches and captured steps are kept for the next call with the same
                    rows and cache length (``mmspec.release_graphs(model)`` frees them).
    pipeline:       each step queued before the previous one is read, so the device never
                    waits for the host between steps (``stream``). Speculative steps then keep
                    rejected slots as holes (no host value is needed between steps; caches get
                    K + 1 slots per step). None: plain decoding pipelined, and speculative
                    decoding too with ``compile=True`` (captured steps: measured faster on an
                    H100 at batch 1 and 16, README "GPU path"; not with ``"inductor"``, whose
                    steps attend over the whole cache, nor eagerly or with ``profile``);
                    False: neither. Same tokens either way.

    Rows keep independent accepted lengths (ragged, DESIGN.md); each row stops at its own
    stop token or after max_new_tokens. Returns GenerateOutput(sequences [B, P + T],
    num_generated [B], prompt_length, stats).
    """
    if pipeline is None and draft is not None and drafter is None \
            and pipelines_by_default(compile, profile):
        pipeline = True
    attention_mask, tgt, drafter, rule_obj, generator, prompt = _prepare(
        target, draft, input_ids, attention_mask, rule, num_draft_tokens, max_new_tokens,
        temperature, top_k, top_p, min_p, seed, drafter, guidance_scale, uncond_input_ids,
        uncond_attention_mask, compile, static_cache, pipeline)
    if stop_token_ids is None:
        stop_token_ids = _default_stops(target)
    stats = StepStats()
    t0 = time.perf_counter()
    tgt.prefill(input_ids, attention_mask, **prompt)
    drafter.begin(input_ids, attention_mask, vocab_size=tgt.vocab_size, **prompt)
    stats.seconds_prefill = time.perf_counter() - t0
    res = run(tgt, drafter, rule_obj, input_ids[:, -1], max_new_tokens=max_new_tokens,
              stop_token_ids=set(stop_token_ids), generator=generator, stats=stats,
              profile=profile, fixed_k=bool(compile), pipeline=pipeline)
    if pad_token_id is None:
        pad_token_id = getattr(target.config, "pad_token_id", None)
        pad_token_id = 0 if pad_token_id is None else pad_token_id
    width = max(len(t) for t in res.tokens)
    gen = torch.full((input_ids.shape[0], width), pad_token_id, dtype=torch.long)
    for i, toks in enumerate(res.tokens):
        gen[i, : len(toks)] = torch.tensor(toks, dtype=torch.long)
    sequences = torch.cat([input_ids, gen.to(input_ids.device)], 1)
    num = torch.tensor([len(t) for t in res.tokens], dtype=torch.long)
    return GenerateOutput(sequences=sequences, num_generated=num,
                          prompt_length=input_ids.shape[1], stats=stats)


@torch.inference_mode()
def generate_stream(target, draft=None, input_ids=None, *, attention_mask=None, rule="exact",
                    num_draft_tokens: int = 4, max_new_tokens: int = 64,
                    temperature: float = 1.0, top_k=None, top_p=None, min_p=None, seed=None,
                    stop_token_ids=None, drafter=None, guidance_scale=None,
                    uncond_input_ids=None, uncond_attention_mask=None):
    """Like ``generate`` but yields ``StepEvent``s (new token ids per row) as they are accepted."""
    attention_mask, tgt, drafter, rule_obj, generator, prompt = _prepare(
        target, draft, input_ids, attention_mask, rule, num_draft_tokens, max_new_tokens,
        temperature, top_k, top_p, min_p, seed, drafter, guidance_scale, uncond_input_ids,
        uncond_attention_mask)
    if stop_token_ids is None:
        stop_token_ids = _default_stops(target)
    tgt.prefill(input_ids, attention_mask, **prompt)
    drafter.begin(input_ids, attention_mask, vocab_size=tgt.vocab_size, **prompt)
    yield from stream(tgt, drafter, rule_obj, input_ids[:, -1], max_new_tokens=max_new_tokens,
                      stop_token_ids=set(stop_token_ids), generator=generator)
