"""``TextToImage``: a diffusers-style pipeline over any image-token adapter and any method.

    pipe = TextToImage.from_pretrained("samples/models/shapes-t2i", draft="samples/models/shapes-t2i-draft")
    out = pipe("a large red circle at the top left", guidance_scale=3.0, method="sjd-maximal",
               seed=0)
    out.images[0].save("x.png"); print(out.stats)
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

import torch
from PIL import Image

from mmspec.checks import (check_at_most, check_count, check_guidance_scale, check_positions,
                           guided)
from mmspec.drafters.load import load_head
from mmspec.engine import Engine
from mmspec.registry import MethodContext, parse_method
from mmspec.runner import prepare
from mmspec.sampling import SamplingParams
from mmspec.types import StepStats
from modalities.registry import generation_defaults, load_pretrained, serialized

from .adapters import (
    Emu3Adapter,
    ImageAdapter,
    JanusAdapter,
    LlamaGenAdapter,
    TokenSpanAdapter,
)


@dataclass
class ImageOutput:
    """images: PIL images (one per row); tokens: [B, N] generated compact ids; stats."""

    images: list
    tokens: torch.Tensor
    stats: StepStats
    seconds: float


def to_pil(images: torch.Tensor) -> list:
    """[B, 3, H, W] in [0, 1] -> list of PIL RGB images."""
    arr = (images.detach().float().clamp(0, 1) * 255).round().to(torch.uint8)
    return [Image.fromarray(a.permute(1, 2, 0).cpu().numpy(), "RGB") for a in arr]


OUTPUT_TYPES = ("pil", "np", "pt")


def _as_output(images: torch.Tensor, output_type: str):
    """[B, 3, H, W] in [0, 1] -> PIL images, numpy [B, H, W, 3] float32, or the tensor."""
    if output_type == "pil":
        return to_pil(images)
    if output_type == "np":
        return images.detach().float().clamp(0, 1).permute(0, 2, 3, 1).cpu().numpy()
    return images.detach().float().clamp(0, 1)


def _as_prompt_list(prompt, class_ids: bool = False, name: str = "prompt") -> list:
    """A str, one id list, a class id, or a list of those -> a list of prompts.

    A flat list of ints is one token-id prompt, or (``class_ids``) a list of class labels."""
    if isinstance(prompt, torch.Tensor) and not class_ids and prompt.dim() == 1:
        return [prompt.tolist()]
    if isinstance(prompt, torch.Tensor):
        prompt = prompt.tolist()
    if isinstance(prompt, (str, int)):
        return [prompt]
    if isinstance(prompt, (list, tuple)):
        flat_ints = len(prompt) > 0 and all(isinstance(t, int) for t in prompt)
        return [list(prompt)] if flat_ints and not class_ids else list(prompt)
    raise ValueError(f"{name}={prompt!r:.60}: accepted a string, a token-id list, or a list of "
                     "those")


# Method parameters that size the drafts a step runs ahead: bounded by an image's tokens
DRAFT_SIZES = ("num_draft_tokens", "window", "tree_depth")


def check_draft_sizes(params, num_tokens: int) -> None:
    """Each draft size given in ``params`` at most the image's ``num_tokens`` (a step never
    uses drafts past the tokens left), refused naming the range before any model runs."""
    for name in DRAFT_SIZES:
        if params.get(name) is not None:
            check_at_most(name, params[name], num_tokens, f"an image has {num_tokens} tokens: "
                          "drafts past the tokens left are never used")


class TextToImage:
    """target, draft: ``ImageAdapter`` objects (``from_pretrained`` builds them); head: a
    ``mmspec.DraftHead`` trained for the target (method ``"head"``)."""

    head_kind = "token"             # the kind of draft head its targets take

    def __init__(self, target: ImageAdapter, draft: ImageAdapter | None = None, defaults=None,
                 head=None):
        for name, a in (("target", target), ("draft", draft)):
            if not (isinstance(a, ImageAdapter) or (a is None and name == "draft")):
                raise ValueError(f"{name}={a!r:.60}: accepted an ImageAdapter (TextToImage."
                                 "from_pretrained builds one from a folder, an id or a model)")
        if draft is not None:
            target.check_compatible(draft)
        self.target, self.draft = target, draft
        self.head = load_head(head, target.model)
        self.defaults = dict(defaults or {})

    # -- loading ------------------------------------------------------------------------------
    @classmethod
    @serialized
    def from_pretrained(cls, target, draft=None, device=None, head=None,
                        **load_kwargs) -> "TextToImage":
        """``target`` / ``draft``: a folder or Hugging Face id, a model object, or an adapter;
        ``device``: where to put them; ``head``: a draft head's folder (or ``DraftHead``);
        ``load_kwargs`` go to transformers' ``from_pretrained`` (``dtype`` / ``torch_dtype``,
        ``device_map`` ...)."""
        t, defaults = load_adapter(target, **load_kwargs)
        d = load_adapter(draft, **load_kwargs)[0] if draft is not None else None
        pipe = cls(t, d, defaults).to(device)
        pipe.head = load_head(head, pipe.target.model)
        return pipe

    def to(self, device=None, dtype=None) -> "TextToImage":
        """Move (and cast) target and draft, as ``torch.nn.Module.to`` (a head follows its
        target)."""
        for a in (self.target, self.draft):
            if a is not None and (device is not None or dtype is not None):
                a.to(device, dtype)
        if getattr(self, "head", None) is not None:
            self.head.attach(self.target.model)
        return self

    @property
    def device(self) -> torch.device:
        """The device of the target's parameters."""
        return self.target.device

    # -- generation ---------------------------------------------------------------------------
    def _rows(self, prompt, class_labels, num_images_per_prompt, negative_prompt):
        """(prompt rows, negative rows or None), one per image, checked."""
        if self.target.class_conditional:
            prompts = _as_prompt_list(prompt if class_labels is None else class_labels, True)
        elif class_labels is not None:
            raise ValueError("class_labels: accepted by class-conditional models only; this "
                             "model takes text prompts (prompt=)")
        else:
            prompts = _as_prompt_list(prompt)
        if not prompts:
            raise ValueError("prompt: accepted at least one prompt (got an empty list)")
        if any(isinstance(p, str) and not p.strip() for p in prompts):
            raise ValueError("prompt: accepted non-empty strings")
        self.target.check_prompts(prompts)
        check_count("num_images_per_prompt", num_images_per_prompt)
        negative = None
        if negative_prompt is not None:
            negative = _as_prompt_list(negative_prompt, name="negative_prompt")
            self.target.check_prompts(negative, "negative_prompt")
            if len(negative) == 1 and len(prompts) > 1:
                negative = negative * len(prompts)
            if len(negative) != len(prompts):
                raise ValueError(f"negative_prompt has {len(negative)} entries for {len(prompts)} "
                                 "prompts: accepted one, or one per prompt")
        rows = [p for p in prompts for _ in range(num_images_per_prompt)]
        neg = None if negative is None else [n for n in negative for _ in range(num_images_per_prompt)]
        return rows, neg

    def _sampling(self, temperature, top_k, top_p) -> SamplingParams:
        """The sampling parameters; ``top_k`` defaults to the pipeline's and is bounded by the
        codebook."""
        top_k = self.defaults.get("top_k") if top_k is None else top_k
        if top_k is not None and top_k > self.target.vocab_size:
            raise ValueError(f"top_k={top_k}: accepted at most the codebook size "
                             f"{self.target.vocab_size}")
        return SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)

    def _tokens(self, run, batch: dict, dbatch: dict | None, progress: str | None,
                callback_on_step_end) -> list[list[int]]:
        """Prefill, then every row's tokens from the loop's events (``callback_on_step_end``
        after each step)."""
        run.prefill(batch, dbatch)
        tokens = [[] for _ in range(batch["input_ids"].shape[0])]
        events = run.stream(batch["input_ids"][:, -1], progress=progress)
        for step, ev in enumerate(events):
            for row, new in zip(tokens, ev.new_tokens):
                row.extend(new)
            if callback_on_step_end is not None:
                callback_on_step_end(self, step, None, {"tokens": tokens})
        return tokens

    @torch.inference_mode()
    def __call__(self, prompt=None, *, class_labels=None, num_images_per_prompt: int = 1,
                 guidance_scale: float | None = None, negative_prompt=None,
                 method: str = "plain", temperature: float = 1.0, top_k: int | None = None,
                 top_p: float | None = None, seed: int | None = None, progress: bool = True,
                 decode: bool = True, profile: bool = False, compile: bool | str = False,
                 static_cache: bool | None = None, pipeline: bool | None = None,
                 engine: Engine | None = None, generator: torch.Generator | None = None,
                 output_type: str = "pil", return_dict: bool = True,
                 callback_on_step_end=None, drafter=None, **method_params) -> ImageOutput:
        """Generate images; diffusers' conventions where they apply.

        generator:     a ``torch.Generator`` on the model's device (instead of ``seed``).
        output_type:   ``"pil"`` (PIL images), ``"np"`` ([B, H, W, 3] float32 in [0, 1]) or
                       ``"pt"`` ([B, 3, H, W] in [0, 1]); ``decode=False`` skips decoding.
        return_dict:   False returns the tuple ``(images,)``.
        callback_on_step_end: ``f(pipe, step, timestep, callback_kwargs)`` after every loop
                       step (timestep None: no diffusion schedule; ``callback_kwargs["tokens"]``
                       holds each row's tokens so far).
        drafter:       a ``mmspec`` Drafter object instead of the method's (the method then
                       names the rule).
        compile / static_cache / pipeline / profile, or ``engine``: as in ``mmspec.generate``
        (static caches, steps captured as CUDA graphs, draft steps queued ahead); the eager
        path is the reference and gives the same tokens under greedy decoding."""
        tgt = self.target
        # 1. Inputs, checked before any model runs.
        if output_type not in OUTPUT_TYPES:
            raise ValueError(f"output_type={output_type!r}: accepted one of {OUTPUT_TYPES}")
        if generator is not None and seed is not None:
            raise ValueError("seed and generator: accepted one of them")
        rows, neg_rows = self._rows(prompt, class_labels, num_images_per_prompt, negative_prompt)
        g = guided(check_guidance_scale(self.defaults.get("guidance_scale") if guidance_scale
                                        is None else guidance_scale))
        params = self._sampling(temperature, top_k, top_p)
        engine = Engine.from_switches(compile, static_cache, pipeline, profile,
                                      engine).check(tgt.model)
        spec = parse_method(method, method_params, has_draft=self.draft is not None,
                            has_head=self.head is not None)
        check_draft_sizes(method_params, tgt.num_tokens)
        batch = tgt.prompt_batch(rows, neg_rows, g is not None)
        width, n = batch["input_ids"].shape[1], tgt.num_tokens
        check_positions("image tokens", n, width, tgt.max_positions(), "model")

        # 2. The plan, the sessions, the drafter and the rule. With a draft model under
        # compile=True the steps are queued ahead (rejected drafts kept as holes).
        k = spec.num_draft_tokens(tgt.jacobi_defaults)
        plan = engine.plan(max_new_tokens=n, num_draft_tokens=k, draft_model=spec.uses_draft_model,
                           positions=width + n + spec.reach(tgt.jacobi_defaults),
                           limits=[tgt.max_positions(), (
                               self.draft.max_positions() if spec.uses_draft_model else None)])
        session = tgt.session(params, g, **plan.cache(width, len(rows)))
        dbatch = self.draft.prompt_batch(rows, neg_rows, g is not None) if spec.uses_draft_model else None
        context = MethodContext(
            draft_session=None if dbatch is None else lambda: self.draft.session(
                params, g, **plan.cache(dbatch["input_ids"].shape[1], len(rows))),
            embeddings=tgt.codebook_embeddings(), jacobi=tgt.jacobi_defaults,
            queue_drafts=plan.queue_drafts, head=self.head)
        rule = spec.build_rule(context)
        drafter = spec.build_drafter(context) if drafter is None else drafter
        run = prepare(session, drafter, rule, plan=plan, seed=seed, device=tgt.device,
                      generator=generator)

        # 3. Prefill and the loop (a progress bar over the slowest row's tokens).
        t0 = time.perf_counter()
        tokens = self._tokens(run, batch, dbatch, method if progress else None,
                              callback_on_step_end)

        # 4. Decode.
        ids = torch.tensor(tokens, dtype=torch.long, device=tgt.device)
        seconds = time.perf_counter() - t0
        images = _as_output(tgt.decode(ids), output_type) if decode else []
        if not return_dict:
            return (images,)
        return ImageOutput(images=images, tokens=ids, stats=run.stats, seconds=seconds)


# -- loading ---------------------------------------------------------------------------------

class WordTokenizer:
    """Whitespace word tokenizer of the bundled models (their ``words`` list)."""

    def __init__(self, words: list[str], offset: int):
        self.index = {w: i + offset for i, w in enumerate(words)}

    def encode(self, text: str) -> list[int]:
        out = []
        for w in text.lower().replace(",", " ").replace(".", " ").split():
            if w not in self.index:
                raise ValueError(f"prompt word {w!r} is not in the model's vocabulary "
                                 f"({len(self.index)} words)")
            out.append(self.index[w])
        return out


def load_adapter(spec, **load_kwargs) -> tuple[ImageAdapter, dict]:
    """An adapter (and default generation settings) from a folder, an id or a model object."""
    if isinstance(spec, ImageAdapter):
        return spec, {}
    if not isinstance(spec, (str, os.PathLike)):
        name = type(spec).__name__
        if name == "JanusForConditionalGeneration":
            return JanusAdapter(spec), generation_defaults(spec)
        if name == "LlamaGenForImageGeneration":
            raise ValueError("a LlamaGen model needs its VQ tokenizer: pass "
                             "LlamaGenAdapter(model, VQTokenizer(...))")
        raise ValueError(f"cannot build an image adapter from {name}: pass a folder, an "
                         "ImageAdapter, or a Janus model")
    path = os.fspath(spec)
    meta_path = os.path.join(path, "mmspec_image.json")
    if os.path.isfile(meta_path):
        return _load_bundled(path, meta_path, **load_kwargs)
    from transformers import AutoConfig

    cfg = load_pretrained(AutoConfig, path, **load_kwargs)
    processor = _maybe_processor(path, **load_kwargs)
    if cfg.model_type == "janus":
        from transformers import JanusForConditionalGeneration

        model = load_pretrained(JanusForConditionalGeneration, path, **load_kwargs).eval()
        return JanusAdapter(model, processor), generation_defaults(model)
    if cfg.model_type == "emu3":
        from transformers import Emu3ForConditionalGeneration

        model = load_pretrained(Emu3ForConditionalGeneration, path, **load_kwargs).eval()
        side = int(load_kwargs.pop("image_grid", 90)) if "image_grid" in load_kwargs else 90
        return Emu3Adapter(model, side, side, processor), generation_defaults(model)
    raise ValueError(f"{path}: model_type {cfg.model_type!r} is not an image-token target "
                     "mmspec knows (janus, emu3, mmspec_llamagen, or a folder with "
                     "mmspec_image.json)")


@dataclass(frozen=True)
class ImageLayout:
    """What a target's config files say of its images, read without loading any weights:
    the codebook's ids (an upper bound where a vocabulary map names fewer), the tokens of one
    image, and whether prompts are class ids."""

    vocab_size: int
    num_tokens: int
    class_conditional: bool = False
    words: tuple[str, ...] = ()

    def check_prompts(self, prompts: list) -> None:
        """Text prompts in the bundled models' words (the error their tokenizer gives)."""
        if self.words:
            tokenizer = WordTokenizer(list(self.words), 0)
            for p in prompts:
                if isinstance(p, str):
                    tokenizer.encode(p)


def read_layout(spec, image_grid: int = 90) -> ImageLayout | None:
    """The ``ImageLayout`` of a target folder or id from its config files alone (cheap: the
    command lines check sizes with it before any model loads); None where only loading the
    model tells (a model object, an adapter, an unknown kind)."""
    if not isinstance(spec, (str, os.PathLike)):
        return None
    path = os.fspath(spec)
    meta_path = os.path.join(path, "mmspec_image.json")
    if os.path.isfile(meta_path):
        with open(meta_path) as f:
            meta = json.load(f)
        if meta.get("format") == "token-span":
            rows, cols = meta["grid"]
            return ImageLayout(int(meta["codebook_size"]), rows * cols,
                               words=tuple(meta.get("words") or ()))
        from .llamagen import LlamaGenConfig

        cfg = LlamaGenConfig.from_pretrained(path)
        return ImageLayout(int(cfg.vocab_size), int(cfg.block_size),
                           cfg.model_type_cond == "c2i")
    from transformers import AutoConfig

    cfg = load_pretrained(AutoConfig, path)
    if cfg.model_type == "janus":
        return ImageLayout(int(cfg.vq_config.num_embeddings),
                           int(cfg.vision_config.num_image_tokens))
    if cfg.model_type == "emu3":
        return ImageLayout(int(cfg.vq_config.codebook_size), image_grid * (image_grid + 1))
    return None


def _maybe_processor(path, **kw):
    try:
        from transformers import AutoProcessor

        return AutoProcessor.from_pretrained(path, **kw)
    except Exception:  # no processor files next to the weights
        return None


def _load_bundled(path: str, meta_path: str, **load_kwargs):
    with open(meta_path) as f:
        meta = json.load(f)
    from .vq import VQTokenizer

    vq_path = os.path.normpath(os.path.join(path, meta["vq"]))
    vq = load_pretrained(VQTokenizer, vq_path)
    fmt = meta.get("format")
    if fmt == "token-span":
        from transformers import LlamaForCausalLM

        model = load_pretrained(LlamaForCausalLM, path, **load_kwargs).eval()
        off = meta["image_token_offset"]
        tok = WordTokenizer(meta["words"], meta["word_offset"])
        adapter = TokenSpanAdapter(model, list(range(off, off + meta["codebook_size"])),
                                   tuple(meta["grid"]), vq, prefix=meta["prefix"],
                                   suffix=meta["suffix"], pad_id=meta["pad_id"], tokenizer=tok)
    elif fmt == "llamagen":
        from .llamagen import LlamaGenForImageGeneration

        model = load_pretrained(LlamaGenForImageGeneration, path, **load_kwargs).eval()
        adapter = LlamaGenAdapter(model, vq)
    else:
        raise ValueError(f"{meta_path}: format {fmt!r}: accepted 'token-span' or 'llamagen'")
    vq.vq.to(adapter.device)
    return adapter, dict(meta.get("defaults", {}))


def save_bundled(folder: str, model, *, fmt: str, vq_folder: str, meta: dict) -> None:
    """Write a model folder that ``load_adapter`` reads: the model (safetensors + config) and
    mmspec_image.json (format, VQ folder relative to this one, token layout, defaults)."""
    os.makedirs(folder, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    info = dict(meta, format=fmt, vq=os.path.relpath(os.path.abspath(vq_folder), os.path.abspath(folder)))
    with open(os.path.join(folder, "mmspec_image.json"), "w") as f:
        json.dump(info, f, indent=1)
