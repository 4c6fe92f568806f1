"""``VisionLanguageGenerator``: speculative decoding for LLaVA- and Qwen-VL-family models.

    gen = VisionLanguageGenerator.from_pretrained("llava-hf/llava-1.5-7b-hf", draft="...")
    out = gen.generate(image, "What is in the picture?", method="exact", max_new_tokens=64)
    print(out.texts[0], out.stats)
    for piece in gen.generate(image, "Describe it.", stream=True): print(piece, end="")

Targets: LlavaForConditionalGeneration, LlavaNextForConditionalGeneration,
LlavaOnevisionForConditionalGeneration, Mistral3ForConditionalGeneration (Pixtral),
InternVLForConditionalGeneration, Idefics3ForConditionalGeneration,
SmolVLMForConditionalGeneration, ChameleonForConditionalGeneration (its VQ image tokenizer
inside the model; ``image_sizes`` and per-image token counts come from the
processor), Gemma3ForConditionalGeneration, Gemma4ForConditionalGeneration and
PaliGemmaForConditionalGeneration (their prompts' bidirectional blocks, an image's tokens or
PaliGemma's whole prefix, opened in the prompt pass as the models' own; Gemma's sliding
windows in every step's mask), and Qwen2-VL,
Qwen2.5-VL, Qwen3-VL, Qwen3.5 and their MoE variants (3-D rotary positions:
``modalities.vlm.mrope``; images of any size and videos, as the processor gives them;
Qwen3.5's linear-attention layers roll back by snapshot and replay, ``mmspec.cache``), through
transformers' Auto classes and processors (chat templates). Image features are computed once,
in the prefill; verification passes carry no pixels. Other VLM classes are refused up front
with the reason (``check_supported``).

Drafts (``draft_mode``):
- ``"text"``: a causal LM that never sees the image: the prompt's text with the image
  placeholders removed (Gagrani et al.). A draft vocabulary that is a prefix of the target's
  (padded target vocabularies) is mapped by zero-padding; other mismatches are errors.
- ``"image"``: a small VLM that sees the image with its own vision tower.
- ``"ensemble"``: image + text and text-only prompts (and text + caption when ``captions``
  are given) run as one draft batch on a VLM draft, their distributions mixed with weights
  adapted to how well each mode matched the target so far (IbED / TABED).
- Jacobi self-drafting on the target's text (``method="sjd"`` ...) and every rule.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass

import torch

from mmspec.cache import Blocks
from mmspec.checks import check_count, check_positions
from mmspec.distributed import whole
from mmspec.drafters.ensemble import EnsembleDrafter
from mmspec.drafters.load import load_head
from mmspec.engine import Engine
from mmspec.loop import Stops
from mmspec.registry import MethodContext, parse_method
from mmspec.runner import prepare
from mmspec.sampling import sampling_params
from mmspec.sessions import CausalLMSession, PaddedSession, max_positions, output_vocab_size
from mmspec.types import StepStats
from modalities.registry import adapters, load_pretrained, register_adapter, serialized

from .decoder_session import DecoderSession, decodes_alone
from .deepstack import has_deepstack, split_trailing
from .mrope import POSITION_INPUTS, MRopeSession, uses_mrope


@dataclass
class VLMOutput:
    texts: list[str]
    token_ids: list[list[int]]
    stats: StepStats
    seconds: float


def _sees_images(config) -> bool:
    """A vision-language config: a vision tower (``vision_config``) or an image tokenizer
    (``vq_config``: Chameleon)."""
    return hasattr(config, "vision_config") or hasattr(config, "vq_config")


def _is_vlm(model) -> bool:
    return _sees_images(model.config)


# Processor outputs ``generate(**inputs)`` takes as keyword arguments.
PROCESSOR_OUTPUTS = ("input_ids", "attention_mask", "pixel_values", "image_sizes",
                     "batch_num_images", "pixel_attention_mask", "pixel_values_videos",
                     "token_type_ids", "image_position_ids", *POSITION_INPUTS)

def supported_classes() -> list[str]:
    """The vision-language model classes VisionLanguageGenerator implements."""
    return sorted(m for a in adapters("vlm") for m in a.models)


def check_supported(model, role: str) -> None:
    """Refuse, before any work and with the reason, a VLM class mmspec does not implement."""
    name, kind = type(model).__name__, getattr(model.config, "model_type", None)
    if name in supported_classes():
        return
    raise ValueError(f"{role} {name} ({kind}): a class VisionLanguageGenerator does not "
                     f"implement; accepted {', '.join(supported_classes())}")


ROLES = ("system", "user", "assistant")
PARTS = ("text", "image", "video")


def chat_prompt(processor, messages: list) -> str:
    """The prompt the processor's chat template renders for ``messages``, after checking
    them: dicts with a role in ``ROLES`` and content (a string, or parts of a type in
    ``PARTS``, text parts with their text), some text that is not blank, and every text
    present in the rendered prompt (a template that drops a turn's role is refused by name,
    not answered without it)."""
    texts = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES or "content" not in m:
            raise ValueError(f"message {i}: accepted a dict with a role in {ROLES} and content, "
                             f"got {m!r}")
        content = m["content"]
        parts = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(parts, list) or not all(isinstance(x, dict) for x in parts):
            raise ValueError(f"message {i}: content accepted as a string or a list of parts "
                             f"(dicts with a type), got {type(content).__name__}")
        for x in parts:
            if x.get("type") not in PARTS:
                raise ValueError(f"message {i}: a part of type {x.get('type')!r}; accepted "
                                 f"{', '.join(PARTS)}")
            if x["type"] == "text":
                if not isinstance(x.get("text"), str):
                    raise ValueError(f"message {i}: a text part without a text string")
                texts.append((i, m["role"], x["text"]))
    if not any(t.strip() for _, _, t in texts):
        raise ValueError("messages: no text, or only blank text; accepted a question")
    try:
        prompt = processor.apply_chat_template(messages, add_generation_prompt=True)
    except Exception as e:         # the template's own error (jinja's), named as the template's
        raise ValueError(f"messages: the processor's chat template cannot render them "
                         f"({type(e).__name__}: {e})") from None
    for i, role, text in texts:
        if text.strip() and text.strip() not in prompt:
            raise ValueError(f"message {i} ({role}): its text is not in the prompt the "
                             f"processor's chat template renders (it drops {role!r} turns); "
                             "accepted roles and parts the template renders")
    return prompt


class VisionLanguageGenerator:
    """target: a LLaVA- or Qwen-VL-family model; processor: its processor (tokenizer, image
    processor, chat template); draft: a causal LM (text draft) or a VLM of the target's family
    (image / ensemble draft; another family needs ``draft_processor``); head: a
    ``mmspec.DraftHead`` trained for the target (method ``"head"``)."""

    head_kind = "token"             # the kind of draft head its targets take

    def __init__(self, target, processor, draft=None, draft_mode: str | None = None,
                 draft_processor=None, assistant_model=None, head=None):
        if assistant_model is not None:          # transformers' name for the draft
            if draft is not None:
                raise ValueError("draft and assistant_model: accepted one of them")
            draft = assistant_model
        if not _is_vlm(target):
            raise ValueError("target must be a vision-language model (a config with vision_config "
                             "or vq_config)")
        check_supported(target, "target")
        self.target, self.processor, self.draft = target, processor, draft
        self.head = load_head(head, target)
        self.draft_processor = draft_processor or processor
        if draft is not None:
            draft_mode = draft_mode or ("image" if _is_vlm(draft) else "text")
            if draft_mode not in ("text", "image", "ensemble"):
                raise ValueError(f"draft_mode={draft_mode!r}: accepted 'text', 'image' or 'ensemble'")
            if draft_mode in ("image", "ensemble") and not _is_vlm(draft):
                raise ValueError(f"draft_mode={draft_mode!r} needs a vision-language draft")
            if draft_mode != "text":
                check_supported(draft, "draft")
                _check_family(target, draft, draft_processor is None)
            vt, vd = output_vocab_size(target), output_vocab_size(draft)
            if vd > vt:
                raise ValueError(f"vocabulary mismatch: the draft has {vd} ids, the target {vt}: "
                                 "accepted a draft whose vocabulary is the target's or a prefix "
                                 "of it (padded target vocabularies)")
            self._check_tokenizers()
        self.draft_mode = draft_mode
        self.image_token_id = getattr(target.config, "image_token_index",
                                      getattr(target.config, "image_token_id", None))

    def _check_tokenizers(self) -> None:
        a = getattr(self.processor, "tokenizer", None)
        b = getattr(self.draft_processor, "tokenizer", None)
        if a is None or b is None or a is b:
            return
        va, vb = a.get_vocab(), b.get_vocab()
        shared = set(va) & set(vb)
        if any(va[t] != vb[t] for t in shared) or len(vb) > len(va):
            raise ValueError("vocabulary mismatch: draft and target tokenizers map tokens to "
                             "different ids; accepted tokenizers that agree on the shared range")

    def to(self, device=None, dtype=None) -> "VisionLanguageGenerator":
        """Move (and cast) target and draft, as ``torch.nn.Module.to`` (a head follows its
        target)."""
        for m in (self.target, self.draft):
            if m is not None and (device is not None or dtype is not None):
                m.to(device=device, dtype=dtype)
        if self.head is not None:
            self.head.attach(self.target)
        return self

    @property
    def device(self) -> torch.device:
        """The device of the target's parameters."""
        return self.target.device

    @classmethod
    @serialized
    def from_pretrained(cls, target, draft=None, draft_mode=None, device=None,
                        assistant_model=None, head=None, **load_kwargs):
        """``target`` / ``draft``: folders or Hugging Face ids, or model objects; ``device``:
        where to put them; ``head``: a draft head's folder (or ``DraftHead``); ``load_kwargs``
        go to transformers' ``from_pretrained``."""
        from transformers import (
            AutoConfig,
            AutoModelForCausalLM,
            AutoModelForImageTextToText,
            AutoProcessor,
        )

        def load(spec):
            if not isinstance(spec, (str, os.PathLike)):
                return spec
            vision = _sees_images(load_pretrained(AutoConfig, spec))
            auto = AutoModelForImageTextToText if vision else AutoModelForCausalLM
            return load_pretrained(auto, spec, **load_kwargs).eval()

        model = load(target)
        proc = load_pretrained(AutoProcessor, target) if isinstance(target, (str, os.PathLike)) else None
        draft = draft if assistant_model is None else assistant_model
        gen = cls(model, proc, load(draft) if draft is not None else None, draft_mode).to(device)
        gen.head = load_head(head, gen.target)
        return gen

    # -- inputs ---------------------------------------------------------------------------------
    def _texts(self, prompts) -> list[str]:
        out = []
        for p in prompts:
            if isinstance(p, str):
                if not p.strip():
                    raise ValueError("prompt_or_messages: an empty prompt; accepted a question")
                out.append(p)
            elif isinstance(p, list):       # chat messages
                out.append(chat_prompt(self.processor, p))
            else:
                raise ValueError("prompt_or_messages: accepted strings or chat message lists")
        return out

    def encode(self, images, prompts, processor=None) -> dict:
        """Processor outputs for image-prompt pairs, after checking counts and shapes."""
        proc = processor or self.processor
        texts = self._texts(prompts)
        token = getattr(proc, "image_token", "<image>")
        counts = [t.count(token) for t in texts]
        n_images = sum(len(i) if isinstance(i, (list, tuple)) else (0 if i is None else 1)
                       for i in images)
        for t, c, img in zip(texts, counts, images):
            has = img is not None and not (isinstance(img, (list, tuple)) and not img)
            if has and c == 0:
                raise ValueError(f"prompt {t!r} has no {token} token but an image was given: "
                                 f"accepted one {token} per image")
            if not has and c > 0:
                raise ValueError(f"prompt {t!r} has an {token} token but no image was given")
        if sum(counts) != n_images:
            raise ValueError(f"image count mismatch: {n_images} images for {sum(counts)} "
                             f"{token} tokens")
        flat = [i for im in images for i in (im if isinstance(im, (list, tuple)) else [im])
                if i is not None]
        for im in flat:
            if isinstance(im, torch.Tensor) and (im.dim() != 3 or im.shape[0] != 3):
                raise ValueError(f"image tensors must be [3, H, W], got {tuple(im.shape)}")
        # one list per prompt where every prompt has images (processors that count images
        # per prompt, Gemma 3's, take no flat list for a batch)
        rows = [list(im) if isinstance(im, (list, tuple)) else [im] for im in images]
        given = rows if all(r and None not in r for r in rows) else (flat or None)
        proc.tokenizer.padding_side = "left"
        batch = proc(images=given, text=texts, return_tensors="pt", padding=True)
        _refuse_unknown_words(proc.tokenizer, texts, batch["input_ids"])
        # PaliGemma's processor returns training labels too: nothing generation reads
        return {k: v.to(self.target.device) for k, v in batch.items() if k != "labels"}

    def text_only(self, batch: dict) -> dict:
        """The same prompts without image placeholders, left-padded again (text drafts)."""
        rows = []
        for ids, m in zip(batch["input_ids"], batch["attention_mask"]):
            keep = (m == 1) & (ids != self.image_token_id)
            rows.append(ids[keep].tolist())
        pad = self.processor.tokenizer.pad_token_id or 0
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros(len(rows), width, dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, width - len(r):] = torch.tensor(r)
            mask[i, width - len(r):] = 1
        dev = batch["input_ids"].device
        return dict(input_ids=ids.to(dev), attention_mask=mask.to(dev))

    # -- generation -------------------------------------------------------------------------------
    def _method(self, spec, plan, params, batch, images, prompts, captions):
        """(drafter, rule, the draft's prompt or None) for a parsed method."""
        vt = output_vocab_size(self.target)
        context = MethodContext(embeddings=self._embeddings(spec.rule_class),
                                queue_drafts=plan.queue_drafts, head=self.head)
        if not spec.uses_draft_model:
            return spec.build_drafter(context), spec.build_rule(context), None
        if self.draft_mode == "ensemble":
            if spec.drafter_class.trees:
                raise ValueError(f"method={spec.spec!r} drafts trees; draft_mode='ensemble' "
                                 "drafts chains: accepted 'image' or 'text' draft modes")
            if prompts is None:
                raise ValueError("draft_mode='ensemble' builds its own prompts: accepted images "
                                 "and prompts, not processor outputs")
            dbatch = self._ensemble_batch(images, prompts, captions)
            session = _session(self.draft, params,
                               **plan.cache(*dbatch["input_ids"].shape[::-1]))
            drafter = EnsembleDrafter(PaddedSession.around(session, vt), dbatch["modes"],
                                      spec.num_draft_tokens())
            dbatch = {k: v for k, v in dbatch.items() if k != "modes"}
            return drafter, spec.build_rule(context), dbatch
        dbatch = self.text_only(batch) if self.draft_mode == "text" else self._image_batch(
            images, prompts, batch)
        cache = plan.cache(*dbatch["input_ids"].shape[::-1])
        context = dataclasses.replace(context, draft_session=lambda: PaddedSession.around(
            _session(self.draft, params, **cache), vt))
        drafter, rule = spec.build(context)
        return drafter, rule, dbatch

    def _embeddings(self, rule_class) -> torch.Tensor | None:
        """The target's token embeddings for a rule that reads them (gathered whole where a
        tensor-parallel plan split them), else None."""
        if "embeddings" not in rule_class.param_names():
            return None
        return whole(self.target.get_input_embeddings().weight).detach()

    def _image_batch(self, images, prompts, batch) -> dict:
        """An image draft's prompts: through its own processor, or the target's batch when
        the processors are one (the only choice for processor outputs)."""
        if prompts is not None:
            return self.encode(images, prompts, self.draft_processor)
        if self.draft_processor is not self.processor:
            raise ValueError("an image draft with its own processor: accepted images and "
                             "prompts, not the target's processor outputs")
        return batch

    def _ensemble_batch(self, images, prompts, captions) -> dict:
        """The ensemble's draft prompts: image + text, text only (and text + caption) blocks,
        stacked as one batch; ``modes``: the number of blocks."""
        pieces = [self.encode(images, prompts, self.draft_processor)]
        pieces.append(self.text_only(pieces[0]))
        if captions is not None:
            pieces.append(self.text_only(self.encode(
                images, [f"{c} {p}" if isinstance(p, str) else p for c, p in zip(captions, prompts)],
                self.draft_processor)))
        ids, mask = _stack([(p["input_ids"], p["attention_mask"]) for p in pieces],
                           self.processor.tokenizer.pad_token_id or 0)
        # token types (M-RoPE) follow from the stacked ids; the image block's rows keep grids
        extra = {k: v for k, v in pieces[0].items()
                 if k not in ("input_ids", "attention_mask", "mm_token_type_ids",
                              "token_type_ids")}
        return dict(input_ids=ids, attention_mask=mask, modes=len(pieces), **extra)

    @staticmethod
    def _pairs(images, prompt_or_messages) -> tuple[list, list]:
        if not isinstance(prompt_or_messages, (list, tuple)) or (
                prompt_or_messages and isinstance(prompt_or_messages[0], dict)):
            return [images], [prompt_or_messages]
        prompts = list(prompt_or_messages)
        images = list(images) if isinstance(images, (list, tuple)) else [images] * len(prompts)
        if not prompts:
            raise ValueError("prompt_or_messages: accepted at least one prompt")
        if len(images) != len(prompts):
            raise ValueError(f"image count mismatch: {len(images)} image entries for "
                             f"{len(prompts)} prompts")
        return images, prompts

    def _inputs(self, images, prompt_or_messages, given: dict):
        """(images, prompts, the target's batch): from image-prompt pairs through the
        processor, or from processor outputs given as keyword arguments (``**inputs``)."""
        if not given:
            images, prompts = self._pairs(images, prompt_or_messages)
            return images, prompts, self.encode(images, prompts)
        if images is not None or prompt_or_messages is not None or "input_ids" not in given:
            raise ValueError("processor outputs (input_ids, attention_mask, pixel_values ...): "
                             "accepted instead of images and prompts, with input_ids")
        batch = {k: v.to(self.target.device) for k, v in given.items()}
        batch.setdefault("attention_mask", torch.ones_like(batch["input_ids"]))
        return None, None, batch

    @torch.inference_mode()
    def generate(self, images=None, prompt_or_messages=None, *, method: str = "plain",
                 max_new_tokens: int = 64, temperature: float | None = None,
                 top_p: float | None = None, top_k: int | None = None, seed: int | None = None,
                 stream: bool = False, captions=None, compile: bool | str = False,
                 static_cache: bool | None = None, pipeline: bool | None = None,
                 engine: Engine | None = None, generation_config=None, streamer=None,
                 drafter=None, **method_params):
        """One image (or None, or a list) per prompt; a single pair may be given unwrapped;
        or the processor's outputs as keyword arguments (``generate(**processor(...))``).

        compile:      static caches for target and draft, and their decoding steps captured
                      as CUDA graphs (``mmspec.generate``'s switch: ``True``, each decoder layer
                      fused first, ``"graphs"`` or ``"inductor"``; CUDA only). The prompt pass (vision tower included) runs eagerly; the
                      eager path gives the same tokens under greedy decoding.
        static_cache: static caches without capturing (default: = compile).
        pipeline:     draft-model steps queued before the last is read (rejected drafts kept
                      as holes); None: on with ``compile=True`` and a text or image draft
                      (not with the ensemble, whose mixture weights are read every step).
        engine:       an ``mmspec.Engine`` instead of the three switches (docs/engine.md).
        drafter:      a ``mmspec`` Drafter object instead of the method's (the method then
                      names the rule).
        temperature, top_p, top_k: default temperature 1 without truncation; or
        generation_config: a GenerationConfig or ``"model"`` (the target's own), as in
                      ``mmspec.generate``.
        streamer:     a transformers streamer (``TextStreamer``, ``TextIteratorStreamer``): the
                      prompt's ids, then each step's new ids, then ``end()`` (batch 1).
        """
        # 1. Inputs, checked before any model runs.
        given = {k: method_params.pop(k) for k in PROCESSOR_OUTPUTS if k in method_params}
        images, prompts, batch = self._inputs(images, prompt_or_messages, given)
        if streamer is not None and batch["input_ids"].shape[0] != 1:
            raise ValueError("streamer: accepted with one prompt (batch 1, as transformers)")
        check_count("max_new_tokens", max_new_tokens)
        engine = Engine.from_switches(compile, static_cache, pipeline,
                                      engine=engine).check(self.target)
        spec = parse_method(method, method_params, has_draft=self.draft is not None,
                            has_head=self.head is not None)
        params = sampling_params(self.target, generation_config, temperature=temperature,
                                 top_p=top_p, top_k=top_k)
        width, limit = batch["input_ids"].shape[1], max_positions(self.target)
        if limit is not None and width >= limit:
            raise ValueError(f"the prompt has {width} tokens (image tokens included), at least the "
                             f"target's max_position_embeddings={limit}: accepted shorter "
                             "prompts or smaller images")
        check_positions("max_new_tokens", max_new_tokens, width, limit,
                        prompt=" (image tokens included)")

        # 2. The plan (draft steps queued ahead where every draft position fits), the
        # sessions, the drafter and the rule.
        k = spec.num_draft_tokens()
        queueable = spec.uses_draft_model and self.draft_mode != "ensemble"
        plan = engine.plan(max_new_tokens=max_new_tokens, num_draft_tokens=k,
                           draft_model=queueable, positions=width + max_new_tokens + spec.reach(),
                           limits=[limit, (max_positions(self.draft) if spec.uses_draft_model
                                           else None)])
        if drafter is None:
            drafter, rule, dbatch = self._method(spec, plan, params, batch, images, prompts,
                                                 captions)
        else:
            rule, dbatch = spec.build_rule(MethodContext(
                embeddings=self._embeddings(spec.rule_class))), None
        session = _session(self.target, params, **plan.cache(*batch["input_ids"].shape[::-1]))
        run = prepare(session, drafter, rule, plan=plan, seed=seed, device=self.target.device)
        it = self._run(run, batch, dbatch, streamer)
        return _in_inference_mode(it) if stream else self._collect(it)

    def _run(self, run, batch, dbatch, streamer=None):
        t0 = time.perf_counter()
        run.prefill(session_prompt(self.target, batch), None if dbatch is None or self.draft is
                    None else session_prompt(self.draft, dbatch))
        if streamer is not None:
            streamer.put(batch["input_ids"][0].cpu())
        tok = self.processor.tokenizer
        eos = [tok.eos_token_id] if tok.eos_token_id is not None else []
        rows = [[] for _ in range(batch["input_ids"].shape[0])]
        shown = [""] * len(rows)
        for ev in run.stream(batch["input_ids"][:, -1], stops=Stops(eos)):
            pieces = []
            for i, new in enumerate(ev.new_tokens):
                rows[i].extend(new)
                text = tok.decode([t for t in rows[i] if t not in eos], skip_special_tokens=True)
                pieces.append(text[len(shown[i]):])
                shown[i] = text
            if streamer is not None and ev.new_tokens[0]:
                streamer.put(torch.tensor(ev.new_tokens[0]))
            yield pieces, rows, run.stats, time.perf_counter() - t0
        if streamer is not None:
            streamer.end()

    def _collect(self, it) -> VLMOutput:
        pieces = rows = stats = None
        seconds = 0.0
        texts = None
        for pieces, rows, stats, seconds in it:
            texts = pieces if texts is None else [a + b for a, b in zip(texts, pieces)]
        return VLMOutput(texts=texts, token_ids=rows, stats=stats, seconds=seconds)


def _check_family(target, draft, shared_processor: bool) -> None:
    """An image draft reads the target's processor outputs unless given its own: it must be
    of the target's family (its image tokens, grids and positions are the target's)."""
    kinds = (target.config.model_type, draft.config.model_type)
    if shared_processor and kinds[0] != kinds[1]:
        raise ValueError(f"an image draft of another family ({kinds[1]}) than the target "
                         f"({kinds[0]}) cannot read the target's processor outputs: accepted a "
                         "draft of the target's family, or draft_processor=its own processor")


MEDIA_IDS = ("image_token_id", "video_token_id", "image_token_index")


def media_last(model, batch: dict) -> dict:
    """The prompt ``batch`` as a session takes it. Where a row's last token is an image or
    video placeholder, the first step must feed it, but the model merges each placeholder's
    features only when it sees them all: the whole prompt's merged input embeddings (the
    model's own, ``hidden_states[0]`` of one pass) replace the pixels, the session's prefill
    feeds all but the last column and its first step that one's embedding. A model whose
    decoder is called alone (``decodes_alone``: PaliGemma 2) takes every prompt so. A model
    with deepstack (Qwen3-VL) adds features inside its first layers: its vision tower's
    outputs are split instead (``deepstack.split_trailing``), the trailing placeholders' to
    its first step. Other prompts (a chat template's end on text) as they are."""
    ids, cfg = batch.get("input_ids"), model.config
    media = [m for m in (getattr(cfg, k, None) for k in MEDIA_IDS) if isinstance(m, int)]
    if ids is None or "modes" in batch or not media or not decodes_alone(model) and not bool(
            torch.isin(ids[:, -1], torch.tensor(media, device=ids.device)).any()):
        return batch
    if has_deepstack(model):
        prompt, trailing = split_trailing(model, batch)
        return {**prompt, "trailing_media": trailing}
    inputs = {k: v for k, v in batch.items() if k in PROCESSOR_OUTPUTS}
    with torch.no_grad():
        embeds = model(**inputs, output_hidden_states=True, use_cache=False).hidden_states[0]
    keep = ("input_ids", "attention_mask", "mm_token_type_ids", *POSITION_INPUTS)
    return {**{k: v for k, v in batch.items() if k in keep}, "inputs_embeds": embeds}


def prompt_blocks(model, batch: dict) -> Blocks | None:
    """The blocks of the prompt that attend both ways in the model's own prompt pass
    (``CausalLMSession.prefill(prompt_blocks=)``), read from the processor's token types as
    the model reads them: Gemma 3's images (each run of image tokens a block, every layer),
    Gemma 4's images and videos (on its sliding-window layers, where its config asks for
    them), PaliGemma's prefix (every prompt token). None for other models, or without token
    types (the model's own pass is then causal too)."""
    kind = model.config.model_type
    if kind == "paligemma" and "token_type_ids" in batch:      # its prefix past any window
        return Blocks(torch.where(batch["token_type_ids"] == 0, 0, -1), past_window=True)
    if kind == "gemma3" and "token_type_ids" in batch:
        return Blocks(_runs(batch["token_type_ids"] == 1))
    if kind == "gemma4" and "mm_token_type_ids" in batch and getattr(
            model.config.get_text_config(), "use_bidirectional_attention", None) == "vision":
        types = batch["mm_token_type_ids"]
        return Blocks(_runs((types == 1) | (types == 2)), sliding_only=True)
    return None


def _runs(inside: torch.Tensor) -> torch.Tensor:
    """Block ids [B, P]: each run of ``inside`` tokens one block, numbered from 0; -1 outside."""
    starts = inside & ~torch.nn.functional.pad(inside, (1, 0))[:, :-1]
    return torch.where(inside, starts.long().cumsum(1) - 1, -1)


def session_prompt(model, batch: dict) -> dict:
    """The prompt as ``model``'s session takes it: ``media_last``'s, with its
    ``prompt_blocks`` in place of the processor's ``token_type_ids``."""
    blocks = prompt_blocks(model, batch)
    out = {k: v for k, v in media_last(model, batch).items() if k != "token_type_ids"}
    return out if blocks is None else {**out, "prompt_blocks": blocks}


def _session(model, params, **cache) -> CausalLMSession:
    """The session a model decodes in: M-RoPE positions for Qwen-VL models; PaliGemma 2's
    text decoder called alone (``DecoderSession``)."""
    kind = (MRopeSession if uses_mrope(model) else DecoderSession if decodes_alone(model)
            else CausalLMSession)
    return kind(model, params, **cache)


def _refuse_unknown_words(tok, texts: list[str], ids: torch.Tensor) -> None:
    """A tokenizer that maps words it does not know to its unknown token (word-level
    vocabularies such as the bundled model's) would feed the model ``<unk>`` silently:
    refuse, naming the words."""
    unk = tok.unk_token_id
    if unk is None or not bool((ids == unk).any()):
        return
    for row, text in zip(ids, texts):
        if bool((row == unk).any()):
            words = [w for w in text.split() if unk in tok(w, add_special_tokens=False)["input_ids"]]
            raise ValueError(f"prompt {text!r}: the words {words} are outside the tokenizer's "
                             f"vocabulary (they would reach the model as {tok.unk_token}); "
                             "accepted words the tokenizer knows")


def _in_inference_mode(it):
    """Yield from a generator, running each of its steps under inference mode only (the
    caller's code between pieces runs in its own mode)."""
    while True:
        with torch.inference_mode():
            try:
                item = next(it)
            except StopIteration:
                return
        yield item[0]


def _stack(pairs, pad):
    width = max(ids.shape[1] for ids, _ in pairs)
    ids = torch.cat([torch.nn.functional.pad(i, (width - i.shape[1], 0), value=pad) for i, _ in pairs])
    mask = torch.cat([torch.nn.functional.pad(m, (width - m.shape[1], 0), value=0) for _, m in pairs])
    return ids, mask


register_adapter("llava", "vlm", VisionLanguageGenerator, ("LlavaForConditionalGeneration",))
register_adapter("llava-next", "vlm", VisionLanguageGenerator,
                 ("LlavaNextForConditionalGeneration",))
register_adapter("llava-onevision", "vlm", VisionLanguageGenerator,
                 ("LlavaOnevisionForConditionalGeneration",))
register_adapter("mistral3", "vlm", VisionLanguageGenerator,
                 ("Mistral3ForConditionalGeneration",))
register_adapter("internvl", "vlm", VisionLanguageGenerator,
                 ("InternVLForConditionalGeneration",))
register_adapter("idefics3", "vlm", VisionLanguageGenerator,
                 ("Idefics3ForConditionalGeneration",))
register_adapter("smolvlm", "vlm", VisionLanguageGenerator, ("SmolVLMForConditionalGeneration",))
register_adapter("chameleon", "vlm", VisionLanguageGenerator,
                 ("ChameleonForConditionalGeneration",))
register_adapter("gemma3", "vlm", VisionLanguageGenerator, ("Gemma3ForConditionalGeneration",))
register_adapter("gemma4", "vlm", VisionLanguageGenerator, ("Gemma4ForConditionalGeneration",))
register_adapter("paligemma", "vlm", VisionLanguageGenerator,
                 ("PaliGemmaForConditionalGeneration",))
register_adapter("qwen2-vl", "vlm", VisionLanguageGenerator, ("Qwen2VLForConditionalGeneration",))
register_adapter("qwen2.5-vl", "vlm", VisionLanguageGenerator,
                 ("Qwen2_5_VLForConditionalGeneration",))
register_adapter("qwen3-vl", "vlm", VisionLanguageGenerator,
                 ("Qwen3VLForConditionalGeneration", "Qwen3VLMoeForConditionalGeneration"))
register_adapter("qwen3.5", "vlm", VisionLanguageGenerator,
                 ("Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration"))
