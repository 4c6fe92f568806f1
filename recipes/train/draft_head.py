"""Train a draft head (``mmspec.DraftHead``) for a target from the target's own generations.

    python -m recipes.train.draft_head --modality t2i --target samples/models/shapes-t2i \\
        --data shapes --out samples/models/shapes-t2i-head
    python -m recipes.train.draft_head --modality text --target Qwen/Qwen2.5-0.5B \\
        --data prompts.txt --out heads/qwen-0.5b --samples 2000
    accelerate launch -m recipes.train.draft_head ...        # several GPUs
    torchrun --standalone --nproc_per_node 2 -m recipes.train.draft_head ... --device cpu

1. Collect (self-distillation): plain decoding of the target on the prompts, through the
   modality's front door, with a recording drafter: every position's token embedding, the
   target's features (the head's feature layers, kept by the session: no second forward) and
   its processed distributions over the generated positions (guidance, temperature, top-k as
   at sampling). Saved to ``OUT/data.safetensors``. With several processes, each collects
   its share of the prompts and the file holds every process's batches.
2. Train: soft cross-entropy of the head's q against the target's p, unrolled ``--unroll``
   steps as EAGLE-3's training-time test: step j feeds each position the head's own step
   j - 1 output at the previous position as its feature and attends to real-feature pairs
   up to j - 1 positions back and to its own chain (the mask drafting sees at depth j).
   Checkpoints (safetensors) every ``--save-every`` steps; ``--resume`` continues. Several
   processes train data-parallel: each on its own batches, the gradients averaged over them
   before every optimizer step, so they hold one head throughout.
3. Measure: tokens per target step of plain decoding, the head's chain and its tree on
   held-out prompts, and with ``--draft`` a small draft model's chain on the same prompts;
   ``OUT/README.md`` is the model card.

Data (``--data``): ``shapes`` (the procedural shapes world: captions, questions about
rendered scenes (one in two "describe the image.", answered by a caption), sentences),
``shapes-describe`` (vlm: every scene described; the measure of long answers), or a file:
one prompt per line (t2i captions, tts texts, text prompts), or for vlm
``IMAGE<TAB>QUESTION[<TAB>ANSWER]`` per line, IMAGE a shapes-world seed or an image file (the
format ``mmspec eval`` reads, samples/prompts/shapes_vqa.tsv). Ctrl-C stops it in one line
that names what ``OUT`` keeps (collected data, the last checkpoint: ``--resume`` continues).
"""

from __future__ import annotations

import json
import math
import os
import random
import sys
import textwrap
import time
from dataclasses import dataclass, field

import torch

from mmspec.drafters.base import NoDraft
from mmspec.drafters.architectures import ARCHITECTURES
from mmspec.drafters.head_session import prompt_embeds, token_embeds
from recipes.cli import (COUNT, Device, Interrupted, Number, Parser, TreeShape, check_head,
                         describe, read_lines, run, tree_name)

MODALITIES = ("t2i", "vlm", "tts", "text")


# -- 1. collect ---------------------------------------------------------------------------

class Recorder(NoDraft):
    """Plain decoding that records what a head trains on: each position's token embedding
    (with ``merged``, the prompt's as the target's decoder read them: ``HeadConfig.
    merged_embeds``), the target's features and, over the generated positions, its
    distributions."""

    def __init__(self, layers, uncond: bool = False, merged: bool = False):
        self.layers, self.uncond, self.merged = tuple(layers), uncond, merged

    def attach(self, target):
        target.keep_features(self.layers + ((0,) if self.merged else ()), self.uncond)
        self.target = target

    def begin(self, input_ids, attention_mask, vocab_size=None, **prompt):
        t = self.target
        feats = t.features if input_ids.shape[1] > 1 else None
        merged = None
        if self.merged and feats is not None:           # hidden_states[0] kept last
            d = feats.shape[-1] // (len(self.layers) + 1)
            feats, merged = feats[..., :-d], feats[..., -d:]
        t.keep_features(self.layers, self.uncond)        # the steps': the head's layers only
        self.embeds = [prompt_embeds(t, input_ids, merged)]
        self.feats = [feats] if feats is not None else []
        self.mask, self.probs, self.valid = attention_mask, [], []

    def propose(self, last, k_max, active=None):
        self.valid.append(torch.ones(last.shape[0], dtype=torch.bool, device=last.device)
                          if active is None else active.clone())
        return super().propose(last, k_max, active)

    def observe(self, out, target_probs, num_accepted):
        t = self.target
        self.feats.append(t.features)
        self.probs.append(target_probs.to(torch.float16))
        tok = out.tokens[:, :1].clamp(min=0)
        self.embeds.append(token_embeds(t, t.embed(t._rows(tok)), tok.shape[0]))

    def batch(self) -> dict:
        """The call's tensors: T = prompt + generated positions fed, S generated."""
        valid = torch.stack(self.valid, 1).long()                               # [B, S]
        return dict(embeds=torch.cat(self.embeds, 1)[:, :-1].float().cpu(),      # [B, T, d]
                    features=torch.cat(self.feats, 1)[:, :-1].float().cpu(),     # [B, T-1, F]
                    mask=torch.cat([self.mask, valid], 1)[:, :-1].cpu(),         # [B, T]
                    prompt=torch.tensor(self.mask.shape[1]), steps=torch.tensor(len(self.valid)),
                    **self.targets())

    def targets(self) -> dict:
        """What the head's q is compared with at the S generated positions."""
        return dict(probs=torch.cat(self.probs, 1).cpu())                      # [B, S, V]


class DepthRecorder(Recorder):
    """Plain decoding of a depth-decoder target (CSM) that records what a depth head trains
    on: as ``Recorder`` (the prompt included), with the backbone's hidden state at each
    generated position and the frame emitted there in place of distributions (the target's
    conditionals along the frame are computed from them in training: ``_depth_ce``)."""

    def begin(self, input_ids, attention_mask, vocab_size=None, **prompt):
        super().begin(input_ids, attention_mask, vocab_size, **prompt)
        self.hidden, self.frames = [], []

    def observe(self, out, target_probs, num_accepted):
        t = self.target
        self.feats.append(t.features)
        self.hidden.append(target_probs.h.float())
        frame = out.tokens[:, :1]
        self.frames.append(frame)
        self.embeds.append(token_embeds(t, t.embed(frame.clamp(min=0)), frame.shape[0]))

    def targets(self) -> dict:
        return dict(hidden=torch.cat(self.hidden, 1).cpu(),                   # [B, S, d]
                    tokens=torch.cat(self.frames, 1).cpu())                    # [B, S, C]


class FrameRecorder(Recorder):
    """Plain decoding of a delay-pattern target that records what a frame head trains on: the
    frames fed (the start frame first), their embeddings, the target's features and its
    distributions [B, S, C, V]."""

    def begin(self, input_ids, attention_mask, vocab_size=None, **prompt):
        self.fed, self.feats, self.probs, self.valid = [], [], [], []

    def propose(self, last, k_max, active=None):
        self.fed.append(last[:, None])
        return super().propose(last, k_max, active)

    def observe(self, out, target_probs, num_accepted):
        self.feats.append(self.target.features)
        self.probs.append(target_probs.to(torch.float16))

    def batch(self) -> dict:
        """The call's tensors: S frames fed (T = S positions), each predicting the next."""
        fed = torch.cat(self.fed, 1)                                            # [B, S, C]
        with torch.no_grad():
            embeds = self.target.event_embeds(fed).float().cpu()                # [B, S, d]
        return dict(embeds=embeds,
                    features=torch.cat(self.feats, 1)[:, :-1].float().cpu(),     # [B, S-1, F]
                    probs=torch.cat(self.probs, 1).cpu(),                        # [B, S, C, V]
                    mask=torch.stack(self.valid, 1).long().cpu(), tokens=fed.cpu(),
                    prompt=torch.tensor(1), steps=torch.tensor(len(self.probs)))


@dataclass
class Source:
    """A modality's front door, its prompts and how one batch is generated."""

    modality: str
    front: object
    model: torch.nn.Module
    items: list
    held_out: list
    max_new_tokens: int | None       # None: the target's own limit (tts: its frame limit)
    head_kind: str = "token"         # the kind its adapter declares (HEAD_KINDS)

    @property
    def frames(self) -> bool:
        """The target decodes delay-pattern frames (a ``FrameHead`` drafts for it)."""
        return self.head_kind == "frame"

    @property
    def depth(self) -> bool:
        """The target decodes depth-decoder frames (CSM: a ``DepthHead`` drafts for it)."""
        return self.head_kind == "depth"

    def recorder(self, config):
        """The recording drafter for a head of ``config`` (its features)."""
        if self.frames or self.depth:
            return (FrameRecorder if self.frames else DepthRecorder)(config.feature_layers)
        return Recorder(config.feature_layers, config.uncond_features, config.merged_embeds)

    def generate(self, items, seed: int, temperature: float, drafter=None, method="plain",
                 **params):
        """Generate for ``items`` with ``drafter`` (None and method "plain": plain decoding;
        method "exact": the front door's draft model), exact rule."""
        kw = dict(method=method, seed=seed, temperature=temperature, drafter=drafter, **params)
        if self.modality == "t2i":
            return self.front(list(items), progress=False, decode=False, **kw)
        if self.modality == "tts":
            return self.front(list(items), progress=False, decode=False,
                              max_frames=self.max_new_tokens, **kw)
        if self.modality == "vlm":
            ims, msgs = zip(*items)
            return self.front.generate(list(ims), list(msgs), max_new_tokens=self.max_new_tokens,
                                       **kw)
        import mmspec

        tok, model, draft = self.front
        enc = tok(list(items), return_tensors="pt", padding=True).to(model.device)
        return mmspec.generate(model, draft if method == "exact" else None,
                               input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                               max_new_tokens=self.max_new_tokens, drafter=drafter, seed=seed,
                               temperature=temperature, **params)


# The VLM shapes data: one scene in N asked "describe the image.", the others one-word questions
DESCRIBE_EVERY = {"shapes": 2, "shapes-describe": 1}


def shapes_items(modality: str, n: int, start: int,
                 describe_every: int = DESCRIBE_EVERY["shapes"]) -> list:
    from modalities import shapes_world as sw

    if modality == "t2i":
        return [sw.caption(sw.sample_scene(random.Random(s))) for s in range(start, start + n)]
    if modality == "tts":
        from recipes.train.speech_data import sentence

        return [sentence(random.Random(s)) for s in range(start, start + n)]
    if modality == "vlm":
        return [shapes_question(s, describe_every)[:2] for s in range(start, start + n)]
    raise ValueError(f"--data shapes: accepted with --modality t2i, vlm or tts, not {modality}")


def shapes_question(s: int, describe_every: int = DESCRIBE_EVERY["shapes"]) -> tuple:
    """(image, chat messages, answer) of shapes-world scene ``s``: one scene in
    ``describe_every`` asked "describe the image." (answered by its caption), the others one
    of four one-word questions in turn."""
    from modalities import shapes_world as sw
    from recipes.train.vlm import spaced

    scene, img, _ = sw.sample(s)
    one_word = (s // describe_every) % 4 + 2
    q, a = sw.questions(scene, random.Random(s))[1 if s % describe_every == 0 else one_word]
    return img, [{"role": "user", "content": [{"type": "image"},
                                              {"type": "text", "text": spaced(q)}]}], spaced(a)


def file_items(modality: str, path: str, n: int, m: int) -> tuple[list, list]:
    """(the first ``n`` prompts, the last ``m``: held out) of a ``--data`` file: one a line,
    or for vlm the question format that ``mmspec eval`` reads (``IMAGE<TAB>QUESTION[<TAB>
    ANSWER]``, IMAGE a shapes-world scene's seed or an image file; samples/prompts/
    shapes_vqa.tsv)."""
    if not os.path.isfile(path):
        raise ValueError(f"--data {path}: accepted 'shapes', 'shapes-describe' or an existing file")
    lines = read_lines(path, "--data")
    if len(lines) <= m:
        raise ValueError(f"--data {path}: {len(lines)} prompts; accepted more than --eval={m} "
                         "(the last --eval are held out)")
    train = list(enumerate(lines[:-m][:n]))
    held = list(enumerate(lines))[-m:]
    if modality != "vlm":
        return [x for _, x in train], [x for _, x in held]
    return ([vlm_item(path, i, x) for i, x in train], [vlm_item(path, i, x) for i, x in held])


def vlm_item(path: str, i: int, line: str) -> tuple:
    """(image, chat messages) of a vlm ``--data`` line (``modalities.vlm.questions``; its
    answer, when given, is not used: the head learns the target's own answers)."""
    from modalities.vlm.questions import Question

    try:
        q = Question.parse(line)
        q.check_image()
    except ValueError as e:
        raise ValueError(f"--data {path} line {i + 1}: {e}") from None
    return q.picture(), q.messages()


def load_items(args) -> tuple[list, list]:
    """(training items, held-out items) from ``--data``: read before any model loads."""
    n, m = args.samples, args.eval
    if args.data in DESCRIBE_EVERY:
        every = DESCRIBE_EVERY[args.data]
        return (shapes_items(args.modality, n, 0, every),
                shapes_items(args.modality, m, 20_000_000, every))
    return file_items(args.modality, args.data, n, m)


def load_source(args, items: tuple[list, list] | None = None) -> Source:
    """The modality's front door on the target, with ``items`` (``load_items``' when None)."""
    items, held = load_items(args) if items is None else items
    dev, draft = args.device, args.draft
    if args.modality == "t2i":
        from modalities.image import TextToImage

        front = TextToImage.from_pretrained(args.target, draft=draft, device=dev)
        model = front.target.model
    elif args.modality == "tts":
        from modalities.speech import TextToSpeech

        front = TextToSpeech.from_pretrained(args.target, draft=draft, device=dev)
        model = front.target.model
    elif args.modality == "vlm":
        from modalities.vlm import VisionLanguageGenerator

        front = VisionLanguageGenerator.from_pretrained(args.target, draft=draft, device=dev)
        model = front.target
    else:
        front, model = _text_front(args.target, draft, dev)
    limit = args.max_new_tokens
    if limit is None and args.modality != "tts":
        limit = 32
    kind = front.head_kind if args.modality == "tts" else "token"
    return Source(args.modality, front, model, items, held, limit, kind)


def _text_front(target: str, draft: str | None, dev: str) -> tuple:
    """((tokenizer, target, draft), target) of a text language model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(target).to(dev).eval()
    small = None if draft is None else AutoModelForCausalLM.from_pretrained(draft).to(dev).eval()
    tok = AutoTokenizer.from_pretrained(target, padding_side="left")
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return (tok, model, small), model


def collect(source: Source, config, args, accelerator) -> list[dict]:
    from tqdm.auto import tqdm

    mine = source.items[accelerator.process_index::accelerator.num_processes]
    batches, bs = [], args.collect_batch
    # progress also where output is no terminal (a batch job's log), as the other recipes
    for i in tqdm(range(0, len(mine), bs), desc="collect", mininterval=5,
                  disable=not accelerator.is_main_process):
        rec = source.recorder(config)
        source.generate(mine[i:i + bs], seed=args.seed + i, temperature=args.temperature,
                        drafter=rec)
        batches.append(rec.batch())
    return batches


def share_data(batches: list[dict], path: str, accelerator) -> None:
    """Write every process's collected batches to ``path``: each process writes its own part,
    the main process joins the parts in process order."""
    if accelerator.num_processes == 1:
        return save_data(batches, path)
    part = f"{path}.part{accelerator.process_index}"
    save_data(batches, part)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        parts = [f"{path}.part{i}" for i in range(accelerator.num_processes)]
        save_data([b for q in parts for b in load_data(q)], path)
        for q in parts:
            os.remove(q)
    accelerator.wait_for_everyone()


def save_data(batches: list[dict], path: str) -> None:
    from safetensors.torch import save_file

    save_file({f"{i}.{k}": v.contiguous() for i, b in enumerate(batches) for k, v in b.items()},
              path)


def load_data(path: str) -> list[dict]:
    from safetensors.torch import load_file

    flat, out = load_file(path), {}
    for key, v in flat.items():
        i, k = key.split(".", 1)
        out.setdefault(int(i), {})[k] = v
    return [out[i] for i in sorted(out)]


# -- 2. train ---------------------------------------------------------------------------------

def unrolled_mask(t: int, steps: int, device) -> torch.Tensor:
    """[steps T, steps T] bool: query (block a, position i) sees key (block c, position s) when
    c = 1 and s <= i - a + 1 (real-feature pairs), or 2 <= c <= a and s = i - a + c (its own
    chain of head outputs): what a depth-a draft attends to."""
    i = torch.arange(t, device=device)
    rows = []
    for a in range(1, steps + 1):
        cols = []
        for c in range(1, steps + 1):
            if c == 1:
                cols.append(i[None, :] <= i[:, None] - a + 1)
            elif c <= a:
                cols.append(i[None, :] == i[:, None] - a + c)
            else:
                cols.append(torch.zeros(t, t, dtype=torch.bool, device=device))
        rows.append(torch.cat(cols, 1))
    return torch.cat(rows, 0)


def _logits(head, template, batch: dict, g: torch.Tensor) -> torch.Tensor:
    """The head's logits in the rules' ids for its outputs g [B, T, d]: through the target
    session's ``logits`` hook; for a frame head its codebook heads [B, T, C, V] with the
    target's pattern forced (``force``, on the frames fed)."""
    from mmspec.drafters import FrameHead
    from mmspec.drafters.head_session import _HeadOutput
    from mmspec.drafters.frame import frame_logits

    if not isinstance(head, FrameHead):
        return template.logits(_HeadOutput(head.full_logits(head.decoder.lm_head(g)), g))
    return frame_logits(head, template, g, batch["tokens"].to(g.device), 0)


def _depth_ce(template, batch: dict, g: torch.Tensor) -> torch.Tensor:
    """A depth head's soft cross-entropy [B, S] for its outputs g [B, S, d]: along each
    emitted frame, every codebook's conditional at g against the target's at its own hidden
    state (both through the target's head and depth decoder; p processed as at sampling),
    summed over the codebooks."""
    frames = batch["tokens"].to(g.device)                                    # [B, S, C]
    with torch.no_grad():
        h = batch["hidden"].to(g.device, g.dtype)
        p = template.distributions(h, None).along(frames).float()             # [B, S, C, V]
    logq = torch.log_softmax(template.distributions(g, None).along_logits(frames), -1)
    return -(p * logq).sum(-1).sum(-1)


def _soft_ce(head, template, batch: dict, g: torch.Tensor, predicted: slice) -> torch.Tensor:
    """The soft cross-entropy [B, S] of the head's q (outputs g [B, T, d]) against the
    target's p at the S predicted positions; frames: summed over the codebooks."""
    from mmspec.drafters import DepthHead

    if isinstance(head, DepthHead):
        return _depth_ce(template, batch, g[:, predicted])
    target = batch["probs"].to(g.device).float()                             # [B, S, V]
    logits = _logits(head, template, batch, g)[:, predicted].float()
    logq = torch.log_softmax(logits, -1)
    # a reduced draft vocabulary learns the target's mass on its own ids
    ce = -(target * logq.masked_fill(logits == float("-inf"), 0.0)).sum(-1)   # [B, S, ...]
    return ce.flatten(2).sum(-1) if ce.dim() > 2 else ce


def head_loss(head, template, batch: dict, steps: int) -> torch.Tensor:
    """The unrolled soft cross-entropy of one collected batch (module docstring, step 2). A
    head without a first-token pair (``DraftHead.first_pair``: EAGLE-3) trains without it,
    as it drafts."""
    from mmspec.drafters.head_session import without_first_pair

    dev = next(head.parameters()).device
    e, mask = batch["embeds"].to(dev), batch["mask"].to(dev)
    b, t, d = e.shape
    p_len, s = int(batch["prompt"]), int(batch["steps"])
    if not head.first_pair:          # the prompt's pairs, as drafting leaves its first out
        mask = torch.cat([without_first_pair(mask[:, :p_len]), mask[:, p_len:]], 1)
    feats = head.reduce_features(batch["features"].to(dev))                 # [B, T-1, d]
    feature = torch.cat([feats.new_zeros(b, 1, d), feats], 1)                # paired with x_t
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    full = unrolled_mask(t, steps, dev)
    predicted = slice(p_len - 1, p_len - 1 + s)                              # positions with p
    row_ok = mask[:, predicted].bool()
    blocks, total = [], 0.0
    for j in range(1, steps + 1):
        blocks.append(head.inputs(e, feature))
        x = torch.cat(blocks, 1)
        n = j * t
        keys = mask.repeat(1, j).bool()
        m = full[:n, :n][None] & keys[:, None, :] | torch.eye(n, dtype=torch.bool, device=dev)
        additive = (~m).to(x.dtype)[:, None] * torch.finfo(x.dtype).min
        g = head.decoder.model(inputs_embeds=x, attention_mask=additive,
                               position_ids=pos.repeat(1, j), use_cache=False).last_hidden_state
        g = g[:, -t:]
        ce = _soft_ce(head, template, batch, g, predicted)
        ok = row_ok.clone()
        ok[:, : max(0, j - 1 - (p_len - 1))] = False       # step j needs j - 1 positions before
        total = total + ce[ok].mean() / j
        feature = torch.cat([g.new_zeros(b, 1, d), g[:, :-1]], 1)           # own outputs
    return total


def draft_vocab(batches: list[dict], size: int, accelerator=None) -> torch.Tensor:
    """The ``size`` ids with the most target probability mass over the collected generated
    positions (every process's): each id's expected count in the target's generations."""
    mass = None
    for batch in batches:
        p_len, s = int(batch["prompt"]), int(batch["steps"])
        keep = batch["mask"][:, p_len - 1:p_len - 1 + s].bool()
        add = batch["probs"][keep].double().sum(0)
        mass = add if mass is None else mass + add
    if accelerator is not None and accelerator.num_processes > 1:
        mass = accelerator.reduce(mass.to(accelerator.device), reduction="sum").cpu()
    if size > mass.numel():
        raise ValueError(f"--draft-vocab {size}: accepted at most the target's {mass.numel()} "
                         "ids")
    return mass.topk(size).indices


@dataclass
class Clock:
    """Seconds of work a head holds: its earlier runs' (kept in its checkpoint) and this run's."""

    before: float = 0.0
    start: float = field(default_factory=time.perf_counter)

    def seconds(self) -> float:
        return self.before + time.perf_counter() - self.start


def train(head, template, batches: list[dict], args, accelerator, start: int = 0,
          optimizer=None, clock: Clock | None = None) -> None:
    from tqdm.auto import tqdm

    own = head.own_parameters()
    for p in getattr(template, "model", torch.nn.Module()).parameters():
        p.requires_grad_(False)       # the target is frozen (a depth head's loss runs through it)
    for p in head.parameters():
        p.requires_grad_(any(p is q for q in own))
    optimizer = optimizer or torch.optim.AdamW(own, lr=args.lr, weight_decay=0.0)
    broadcast_parameters(own, accelerator)
    warm = max(1, args.steps // 20)

    def rate(i: int) -> float:             # warm-up, then cosine; a resumed run at its step
        i += start
        return min(1.0, (i + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(1.0, i / args.steps)))

    sched = torch.optim.lr_scheduler.LambdaLR(optimizer, rate)
    rng, clock = random.Random(args.seed + start), clock or Clock()
    bar = tqdm(range(start, args.steps), desc="train", mininterval=5,
               disable=not accelerator.is_main_process)
    for step in bar:
        batch = batches[rng.randrange(len(batches))]
        loss = head_loss(head, template, batch, args.unroll)
        accelerator.backward(loss)
        average_gradients(own, accelerator)
        torch.nn.utils.clip_grad_norm_(own, 1.0)
        optimizer.step()
        sched.step()
        optimizer.zero_grad(set_to_none=True)
        bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
        if accelerator.is_main_process and (step + 1) % args.save_every == 0:
            save_checkpoint(head, optimizer, step + 1, args.out, clock.seconds())
    check_one_head(own, accelerator)
    for p in own:
        p.requires_grad_(False)


# The loss calls the head's parts (its decoder, its fusion), not its forward, so a DDP wrapper
# would never see a forward pass: the processes' parameters and gradients are kept equal here.

def _flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1).float() for t in tensors])


def _unflat(flat: torch.Tensor, like) -> list[torch.Tensor]:
    return [f.view_as(t).to(t.dtype) for f, t in zip(flat.split([t.numel() for t in like]), like)]


def broadcast_parameters(params: list, accelerator) -> None:
    """Every process starts from the main process's parameters."""
    if accelerator.num_processes > 1:
        from accelerate.utils import broadcast

        with torch.no_grad():
            for p, v in zip(params, _unflat(broadcast(_flat(params)), params)):
                p.copy_(v)


def average_gradients(params: list, accelerator) -> None:
    """Each parameter's gradient replaced by its mean over the processes."""
    if accelerator.num_processes > 1:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        for p, g in zip(params, _unflat(accelerator.reduce(_flat(grads), "mean"), grads)):
            p.grad = g


def check_one_head(params: list, accelerator) -> None:
    """Raise if the processes' heads differ (their updates did not stay in step)."""
    if accelerator.num_processes > 1:
        import torch.distributed as dist

        flat = _flat(params)
        low, high = flat.clone(), flat.clone()
        dist.all_reduce(low, op=dist.ReduceOp.MIN)
        dist.all_reduce(high, op=dist.ReduceOp.MAX)
        if not torch.equal(low, high):
            raise RuntimeError("the processes' heads differ after training (largest gap "
                               f"{(high - low).abs().max().item():.3g}): gradients not averaged")


def save_checkpoint(head, optimizer, step: int, out: str, seconds: float = 0.0) -> None:
    from safetensors.torch import save_file

    path = os.path.join(out, "checkpoint")
    head.save_pretrained(path)
    state = optimizer.state_dict()
    flat = {f"{i}.{k}": v.contiguous().cpu() for i, s in state["state"].items()
            for k, v in s.items() if torch.is_tensor(v)}
    save_file(flat, os.path.join(path, "optimizer.safetensors"))
    # trainer.json is written last and atomically (a whole file or the previous one): a
    # Ctrl-C during the save leaves no half-written JSON for `kept` or --resume to read.
    groups = [{k: v for k, v in g.items() if k != "params"} for g in state["param_groups"]]
    final = os.path.join(path, "trainer.json")
    with open(final + ".tmp", "w") as f:
        json.dump({"step": step, "seconds": seconds, "param_groups": groups}, f)
    os.replace(final + ".tmp", final)


def load_checkpoint(head, out: str, lr: float):
    """(step, optimizer) from OUT/checkpoint, loading the head's weights in place."""
    from safetensors.torch import load_file

    path = os.path.join(out, "checkpoint")
    head.reload(path)
    own = head.own_parameters()
    opt = torch.optim.AdamW(own, lr=lr, weight_decay=0.0)
    with open(os.path.join(path, "trainer.json")) as f:
        meta = json.load(f)
    flat = load_file(os.path.join(path, "optimizer.safetensors"))
    state = {}
    for key, v in flat.items():
        i, k = key.split(".", 1)
        state.setdefault(int(i), {})[k] = v.to(own[0].device)
    opt.load_state_dict({"state": state, "param_groups": [
        {**g, "params": list(range(len(own)))} for g in meta["param_groups"]]})
    return meta["step"], opt


def checkpoint_seconds(out: str) -> float:
    """Seconds of work held by OUT/checkpoint (collection and training of earlier runs)."""
    with open(os.path.join(out, "checkpoint", "trainer.json")) as f:
        return json.load(f)["seconds"]


# -- 3. measure -----------------------------------------------------------------------------

CHAIN = dict(tree_depth=4, tree_branch=1, tree_width=1)
TREE = "5x2x4"          # the head tree a card measures unless --tree says otherwise
DRAFT_K = 4


def measure(source: Source, head, args, compare=None) -> list[dict]:
    """Tokens per target step on the held-out prompts: plain, the head's chain, its tree of
    ``--tree``'s shape (a frame head: its chain, each prompt its own call), with ``compare``
    (``--compare-head``: another head of the target) its chain and tree on the same prompts,
    and with ``--draft`` the draft model's chain (exact rule, ``DRAFT_K`` drafts per step)."""
    from mmspec.drafters import DepthHead, FrameHead
    from mmspec.registry import MethodContext, parse_method

    frames = isinstance(head, FrameHead)
    runs = [("plain", None, {}, None), ("head chain", CHAIN, {}, head)]
    if not isinstance(head, (FrameHead, DepthHead)):       # frame heads draft chains only
        runs.append(("head tree", args.tree, {}, head))
    if compare is not None:
        kind = _arch_name(compare)
        runs += [(f"{kind} chain", CHAIN, {}, compare), (f"{kind} tree", args.tree, {}, compare)]
    if args.draft is not None:                  # the front door's draft model
        runs.append((f"draft model, K = {DRAFT_K}", None,
                     dict(method="exact", num_draft_tokens=DRAFT_K), None))
    rows = []
    for i, (name, tree, params, which) in enumerate(runs, 1):
        print(f"measuring {name} ({i} of {len(runs)}) on {len(source.held_out)} held-out "
              "prompts", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        # method "head"'s drafter for this head's kind (token, frame or depth head)
        drafter = (None if tree is None else parse_method("head", tree, has_draft=False,
                                                          has_head=True).build_drafter(
                                                              MethodContext(head=which)))
        # a delay-pattern call commits its rows to the shortest accepted run: one at a time
        calls = [[x] for x in source.held_out] if frames else [source.held_out]
        stats = [source.generate(c, args.seed, args.temperature, drafter, **params).stats
                 for c in calls]
        drafted = sum(s.drafted for s in stats)
        rows.append(dict(method=name, steps=sum(s.steps for s in stats),
                         tokens_per_step=sum(s.emitted for s in stats) /
                         sum(s.row_steps for s in stats),
                         acceptance=sum(s.accepted for s in stats) / drafted if drafted else 0.0,
                         seconds=time.perf_counter() - t0))
    return rows


def _arch_name(head) -> str:
    """How a card names a head's architecture."""
    from mmspec.drafters.eagle3 import Eagle3Head

    return "EAGLE-3 head" if isinstance(head, Eagle3Head) else "mmspec DraftHead"


def _vocab_line(cfg) -> str:
    merged = (" At the prompt's image placeholders it reads the target's merged image features "
              "(hidden_states[0], --merged-embeds)." if cfg.merged_embeds else "")
    return _vocab_only(cfg) + merged


def _vocab_only(cfg) -> str:
    if cfg.codebooks:
        return f"It drafts over each codebook's {cfg.vocab_size} ids."
    if cfg.draft_vocab_size in (None, cfg.vocab_size):
        return "It drafts over the target's whole output head."
    return (f"It drafts {cfg.draft_vocab_size} of the target's {cfg.vocab_size} ids (those with "
            "the most target probability mass in the training data; `draft_ids`).")


def _init_note(t: dict) -> str:
    """Where a head's training started, if from another head's weights (``--init``)."""
    return f", starting from the weights of `{t['init']}`" if t.get("init") else ""


def _data_note(t: dict) -> str:
    """What a VLM head's shapes data asked, as recorded when it was trained."""
    every = t.get("describe_every")
    if every is None:
        return ""
    if every == 1:
        return ("Every training scene was asked \"describe the image.\": a head drafts best "
                "the kind of answer it was trained on, so train it on prompts like those it "
                "will serve. ")
    return (f"One training scene in {every} was asked \"describe the image.\", the others "
            "one-word questions. ")


def model_card(target: str, head, rows, trained: dict) -> str:
    cfg = head.config
    table = "\n".join(f"| {r['method']} | {r['tokens_per_step']:.2f} | {r['acceptance']:.3f} | "
                      f"{r['steps']} |" for r in rows)
    t = trained
    layers = "one decoder layer" if cfg.num_layers == 1 else f"{cfg.num_layers} decoder layers"
    if cfg.depth_decoder:
        kind = (f"A `mmspec.drafters.DepthHead` (the frame as one event: the target backbone's "
                f"hidden states of layers {list(cfg.feature_layers)} fused, {layers} "
                "drafting the backbone's next hidden state, the frame drawn from it by the "
                f"target's own head and depth decoder over {cfg.codebooks} codebooks)")
        use = ("then `method=\"head\"` (a chain of `tree_depth` frames; depth-decoder frames "
               "are verified as chains)")
        shapes = "chain = depth 4"
    elif cfg.codebooks:
        kind = (f"A `mmspec.drafters.FrameHead` (the frame as one event: the target decoder's "
                f"hidden states of layers {list(cfg.feature_layers)} fused, {layers}, "
                f"the {cfg.codebooks} codebook embeddings summed as input and the "
                f"{cfg.codebooks} codebook heads shared)")
        use = ("then `method=\"head\"` (a chain of `tree_depth` frames; delay-pattern targets "
               "take no trees)")
        shapes = "chain = depth 4"
    else:
        if _arch_name(head) == "EAGLE-3 head":
            kind = (f"An `mmspec.drafters.Eagle3Head` (the EAGLE-3 architecture of the field's "
                    f"checkpoints: the target's hidden_states {list(cfg.feature_layers)} fused, "
                    f"{layers} with 2H-wide q/k/v, its own norm and output layer, 1-D rotary "
                    "positions; saved in vLLM's `speculators` layout, which vLLM serves as it "
                    "is: `speculative_config={\"model\": this folder, \"method\": \"eagle3\"}`)")
        else:
            branches = (", of the conditional and the unconditional branch,"
                        if cfg.uncond_features else "")
            kind = (f"A `mmspec.DraftHead` (EAGLE-3 style: the target's hidden states of layers "
                    f"{list(cfg.feature_layers)}{branches} fused, {layers}, the target's "
                    "embeddings and output head shared)")
        use = ("then `method=\"head\"` (a tree: `tree_depth`, `tree_branch`, `tree_width`; a "
               "chain: `tree_branch=1, tree_width=1`)")
        tree = TreeShape()(t.get("tree", TREE))
        shapes = (f"chain = depth 4; tree = depth {tree['tree_depth']}, {tree['tree_branch']} "
                  f"children per node, {tree['tree_width']} nodes expanded per level")
    about = textwrap.fill(
        f"{kind} trained by `python -m recipes.train.draft_head` on the target's own "
        f"generations ({t['modality']}, data `{t['data']}`, {t['samples']} prompts, temperature "
        f"{t['temperature']}, {t['steps']} steps, unroll {t['unroll']}, {t['seconds']:.0f} s on "
        f"{t['device']}{_init_note(t)}). {_data_note(t)}{_vocab_line(cfg)}"
        + (" Its output layer is the target's rows, kept fixed in training (--freeze-output)."
           if t.get("freeze_output") else ""), 96)
    usage = textwrap.fill(
        "Use: `head=\"this folder\"` on the front door (or `mmspec.drafters.layouts.load(this "
        f"folder, target)`), {use}. Exact: the target's distribution is unchanged.", 96)
    unit = "frames" if cfg.codebooks else "tokens"
    most = ""                            # the generation limit (images have a fixed length)
    if t["modality"] != "t2i" and "max_new_tokens" in t:
        limit = t["max_new_tokens"]
        most = (f"at most {limit} new {unit} each, " if limit is not None else
                f"up to the target's own {unit[:-1]} limit, ")
    on = f", on {t['measured_on']}" if "measured_on" in t else ""
    measured = textwrap.fill(
        f"Measured on {t['eval']} held-out prompts (data `{t.get('measured_data', t['data'])}`, "
        f"{most}temperature {t['temperature']}, seed {t['seed']}{on}); {shapes}"
        + (f"; the {t['compare_kind']} `{t['compare']}`'s chain and tree on the same prompts"
           if t.get("compare") else "")
        + (f"; the draft model `{t['draft']}` with the exact rule, K = {DRAFT_K}, on the same "
           "prompts" if t.get("draft") else "")
        + " (`python -m recipes.train.draft_head ... --measure-only` measures again):", 96,
        break_on_hyphens=False)
    return f"""# Draft head for `{target}`

{about}

{usage}

{measured}

| method | tokens per target step | acceptance | target steps |
|---|---|---|---|
{table}
"""


# -- the command ------------------------------------------------------------------------------

def build_parser():
    ap = Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--modality", required=True, choices=MODALITIES,
                    help="the target's front door")
    ap.add_argument("--target", required=True, help="the target: a folder or Hugging Face id")
    ap.add_argument("--data", default="shapes",
                    help="'shapes', 'shapes-describe' (vlm) or a prompts file (vlm: "
                         "IMAGE<TAB>QUESTION[<TAB>ANSWER] lines, as samples/prompts/"
                         "shapes_vqa.tsv)")
    ap.add_argument("--draft", default=None,
                    help="a small draft model of the target (folder or id): measured beside "
                         f"the head on the same held-out prompts, exact rule, K = {DRAFT_K} "
                         "(default: none, the head alone)")
    ap.add_argument("--out", required=True, help="folder for the head, its data and card")
    ap.add_argument("--samples", type=COUNT, default=512, help="training prompts")
    ap.add_argument("--eval", type=COUNT, default=16, help="held-out prompts measured")
    ap.add_argument("--max-new-tokens", type=COUNT, default=None,
                    help="tokens (frames) generated per prompt at most: vlm and text 32 "
                         "unless given, tts the target's own frame limit")
    ap.add_argument("--temperature", type=Number(float, 0.0), default=1.0,
                    help="sampling temperature of the generations and the measurement")
    ap.add_argument("--collect-batch", type=COUNT, default=32, help="prompts per generate call")
    ap.add_argument("--steps", type=COUNT, default=2000, help="optimizer steps")
    ap.add_argument("--lr", type=Number(float, 0.0, open_low=True), default=3e-3,
                    help="peak learning rate (cosine schedule)")
    ap.add_argument("--unroll", type=Number(int, 1, 4), default=2,
                    help="training-time-test steps (own features fed back)")
    ap.add_argument("--feature-layers", type=Number(int, 0), nargs="*", default=None,
                    help="the target's hidden_states fused (default: low, middle, last)")
    ap.add_argument("--draft-vocab", type=COUNT, default=None,
                    help="draft only this many ids, those with the most target probability "
                         "mass in the collected data (EAGLE-3's draft vocabulary; default: "
                         "the target's whole output head)")
    ap.add_argument("--head-layers", type=Number(int, 1, 8), default=1,
                    help="decoder layers of the head (EAGLE-3's: 1)")
    ap.add_argument("--arch", choices=ARCHITECTURES, default="draft-head",
                    help="the head's architecture: mmspec's DraftHead, or eagle3 (the field's "
                         "checkpoints' architecture, exported to vLLM and SGLang)")
    ap.add_argument("--freeze-output", action="store_true",
                    help="eagle3: keep the output layer at the target's rows of the draft ids "
                         "(as speculators trains; default: trained with the rest)")
    ap.add_argument("--export", nargs=2, metavar=("LAYOUT", "DIR"), default=None,
                    help="also write the head in LAYOUT to DIR: an eagle3 head in speculators "
                         "(vLLM), sglang (SGLang), safeailab or angelslim; mmspec's own "
                         "DraftHead in vllm (vLLM through mmspec's plugin)")
    ap.add_argument("--compare-head", default=None, metavar="FOLDER",
                    help="another head of the target (any layout) measured beside this one on "
                         "the same held-out prompts, chain and tree, for the card")
    ap.add_argument("--uncond-features", action="store_true",
                    help="t2i under guidance: the head fuses the unconditional branch's "
                         "features too (default: the conditional branch's only)")
    ap.add_argument("--merged-embeds", action="store_true",
                    help="vlm: the head reads the target's merged input embeddings "
                         "(hidden_states[0]: the image features at the prompt's image "
                         "placeholders, as vLLM hands its EAGLE-3 drafter) (default: the "
                         "placeholder id's embedding, as the bundled heads)")
    ap.add_argument("--tree", type=TreeShape(), default=TREE,
                    help="the head tree measured for the card (token heads)")
    ap.add_argument("--save-every", type=COUNT, default=500, help="checkpoint interval (steps)")
    ap.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint")
    ap.add_argument("--init", default=None, metavar="FOLDER",
                    help="start from the weights of a head saved in FOLDER (same architecture "
                         "and sizes; a fresh optimizer and schedule, new data)")
    ap.add_argument("--measure-only", action="store_true",
                    help="measure the head saved in OUT again (no collection, no training)")
    ap.add_argument("--seed", type=Number(int, 0), default=0, help="seed of data and training")
    ap.add_argument("--device", type=Device(),
                    default="cuda" if torch.cuda.is_available() else "cpu",
                    help="where the target runs")
    return describe(ap)


def check_args(args) -> tuple[list, list]:
    """Every check that needs no model, before any loads; returns ``--data``'s prompts
    (training, held out)."""
    from mmspec.drafters import layouts

    if args.export is not None:
        allowed = layouts.writable(args.arch)
        if args.arch != "eagle3" and args.export[0] in layouts.writable("eagle3"):
            raise ValueError(f"--export {args.export[0]}: accepted with --arch eagle3 (an "
                             "mmspec DraftHead is another architecture than the engines' "
                             f"EAGLE-3; it exports to {', '.join(allowed)}, for mmspec's vLLM "
                             "plugin)")
        if args.export[0] not in allowed:
            raise ValueError(f"--export {args.export[0]}: accepted one of "
                             f"{', '.join(allowed)} with --arch {args.arch}")
        if args.export[0] == "vllm" and not os.path.isfile(os.path.join(args.target,
                                                                        "config.json")):
            raise ValueError(f"--export vllm: --target {args.target} is not a local folder "
                             "(the export reads its layer count and copies its final norm); "
                             "accepted a downloaded target's folder")
        if args.export[0] == "vllm":
            try:
                layouts.check_vllm_target(args.target, args.feature_layers)
            except ValueError as e:
                raise ValueError(f"--export vllm: {e}") from None
        if args.uncond_features:
            raise ValueError("--export with --uncond-features: a head fusing the "
                             "unconditional branch drafts with guidance only, which the "
                             "engines do not run")
    if args.freeze_output and args.arch != "eagle3":
        raise ValueError("--freeze-output: accepted with --arch eagle3 (a DraftHead's output "
                         "layer is the target's already)")
    if args.uncond_features and args.arch == "eagle3":
        raise ValueError("--uncond-features: an EAGLE-3 head fuses the conditional branch "
                         "only; accepted with --arch draft-head")
    if args.resume and not os.path.isdir(os.path.join(args.out, "checkpoint")):
        raise ValueError(f"--resume: {args.out}/checkpoint does not exist")
    if args.init is not None and not os.path.isfile(os.path.join(args.init, "config.json")):
        raise ValueError(f"--init {args.init}: accepted a folder with a saved head")
    if args.init is not None and args.draft_vocab is not None:
        raise ValueError("--init and --draft-vocab: the head's draft ids come with --init's "
                         "weights; accepted one of them")
    if args.merged_embeds and args.modality != "vlm":
        raise ValueError(f"--merged-embeds: accepted with --modality vlm (image features "
                         f"merged into the prompt), not {args.modality}")
    if args.uncond_features and args.modality != "t2i":
        raise ValueError(f"--uncond-features: accepted with --modality t2i (a target sampled "
                         f"with guidance), not {args.modality}")
    if args.data == "shapes-describe" and args.modality != "vlm":
        raise ValueError(f"--data shapes-describe: accepted with --modality vlm, not "
                         f"{args.modality}")
    if args.measure_only and not os.path.isfile(os.path.join(args.out, "training.json")):
        raise ValueError(f"--measure-only: {args.out} holds no trained head (no training.json): "
                         "accepted the --out of a finished run")
    check_head(args.compare_head, "--compare-head")
    check_head(args.out if args.measure_only else None, "--out")
    sizes = target_sizes(args.modality, args.target)
    if sizes is not None and not args.measure_only:
        check_head_sizes(args, *sizes)
    return load_items(args)


def target_sizes(modality: str, target: str) -> tuple[int, int, str] | None:
    """(layers, output ids, kind) of the decoder a head drafts for, from the target folder's
    config files alone (no weights): a VLM's text decoder, a delay-pattern or depth-decoder
    speech model's decoder (kind ``"frame"`` / ``"depth"``, else ``"token"``); None where only
    loading the target tells (text-to-image models other than the bundled formats)."""
    from transformers import AutoConfig

    from modalities.registry import load_pretrained

    path = os.fspath(target)
    try:
        if modality == "t2i":
            meta = os.path.join(path, "mmspec_image.json")
            if not os.path.isfile(meta):
                load_pretrained(AutoConfig, path)           # the folder exists, its config reads
                return None
            with open(meta) as f:
                fmt = json.load(f).get("format")
            if fmt == "llamagen":
                from modalities.image.llamagen import LlamaGenConfig

                cfg = LlamaGenConfig.from_pretrained(path)
                return int(cfg.num_hidden_layers), int(cfg.vocab_size), "token"
            if fmt != "token-span":
                return None
        cfg = load_pretrained(AutoConfig, path)
    except ValueError as e:
        raise ValueError(f"--target {e}") from None
    if modality == "tts" and cfg.model_type == "musicgen":
        return int(cfg.decoder.num_hidden_layers), int(cfg.decoder.vocab_size), "frame"
    if modality == "tts" and cfg.model_type == "csm":
        return int(cfg.num_hidden_layers), int(cfg.vocab_size), "depth"
    text = cfg.get_text_config(decoder=True)
    layers, vocab = getattr(text, "num_hidden_layers", None), getattr(text, "vocab_size", None)
    if not isinstance(layers, int) or not isinstance(vocab, int):
        return None
    return layers, vocab, "token"


def check_head_sizes(args, layers: int, vocab: int, kind: str) -> None:
    """``--feature-layers``, ``--draft-vocab`` and ``--arch`` against the target's decoder
    (``layers`` layers, ``vocab`` output ids, ``kind``), as the head would check them once
    built: an EAGLE-3 head's layer ids in [0, N - 1] and distinct (id N is refused:
    docs/drafters.md), a DraftHead's indices in [0, N]; a draft vocabulary below the
    target's (EAGLE-3: at most it); frame and depth heads over the whole codebooks."""
    from mmspec.drafters.eagle3 import check_feature_layers, default_feature_layers

    given = args.feature_layers
    named = f"--feature-layers {' '.join(map(str, given or ()))}"
    where = f"the target's config: num_hidden_layers={layers}"
    if kind != "token":
        if args.arch == "eagle3":
            raise ValueError(f"--arch eagle3: an EAGLE-3 head drafts from one token table; "
                             f"{args.target} is a multi-codebook ({kind}) model: accepted "
                             "--arch draft-head (its frame or depth head)")
        if args.draft_vocab is not None:
            raise ValueError(f"--draft-vocab {args.draft_vocab}: a {kind} head drafts over the "
                             "codebooks' whole vocabulary: accepted with token targets only")
    if args.arch == "eagle3":
        try:
            if given:
                check_feature_layers(given, layers)
            else:
                default_feature_layers(layers)
        except ValueError as e:
            raise ValueError(f"{named + ': ' if given else ''}{e}, from the target's "
                             "config") from None
    elif given and any(not 0 <= i <= layers for i in given):
        raise ValueError(f"{named}: accepted indices in [0, {layers}] ({where}; 0 the "
                         f"embeddings, {layers} the last layer's normed output)")
    if args.draft_vocab is not None:
        high = vocab if args.arch == "eagle3" else vocab - 1
        if not 1 <= args.draft_vocab <= high:
            raise ValueError(f"--draft-vocab {args.draft_vocab}: accepted an integer in [1, "
                             f"{high}] ({'at most' if args.arch == 'eagle3' else 'fewer ids than'}"
                             f" the target's {vocab} output ids, its config's vocab_size)")


def kept(out: str, since: float) -> str:
    """What ``out`` keeps of a run started at ``since`` (time.time()) when it is stopped."""
    def written(*parts) -> bool:
        path = os.path.join(out, *parts)
        return os.path.isfile(path) and os.path.getmtime(path) >= since

    state = os.path.join(out, "checkpoint", "trainer.json")
    if written("model.safetensors") and written("config.json"):
        return f"the trained head is saved in {out} (--measure-only measures it)"
    if os.path.isfile(state):
        try:
            with open(state) as f:
                step = json.load(f)["step"]
        except (OSError, ValueError, KeyError, TypeError):
            return (f"{out}/checkpoint was being written when stopped (its trainer.json is "
                    "not whole): --resume cannot continue from it, a run without it starts again")
        return f"{out}/checkpoint holds step {step} (--resume continues from it)"
    if written("data.safetensors"):
        return (f"the collected data is in {out}/data.safetensors; no checkpoint yet (a new "
                "run collects again)")
    return "nothing kept (stopped before the first checkpoint)"


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    items = check_args(args)
    since = time.time()
    try:
        _run(args, items)
    except KeyboardInterrupt:
        raise Interrupted(kept(args.out, since)) from None


def _run(args, items: tuple[list, list]) -> None:
    """Collect, train (or, with --measure-only, load the head in OUT), measure, write the card."""
    from accelerate import Accelerator

    from mmspec.drafters import layouts
    from mmspec.drafters.load import load_head

    torch.manual_seed(args.seed)
    accelerator = Accelerator(cpu=torch.device(args.device).type == "cpu")   # cpu:0 too
    if args.device == "cuda":
        args.device = str(accelerator.device)            # each process its own GPU
    clock = Clock()
    source = load_source(args, items)
    if args.measure_only:
        head = load_head(args.out, source.model)
        with open(os.path.join(args.out, "training.json")) as f:
            trained = json.load(f)
    else:
        head = fit(source, args, accelerator, clock)
        trained = dict(modality=args.modality, data=args.data, samples=args.samples,
                       temperature=args.temperature, steps=args.steps, unroll=args.unroll,
                       seconds=clock.seconds(), eval=args.eval, seed=args.seed,
                       device=_device_name(args.device, accelerator.num_processes))
        if args.modality == "vlm" and args.data in DESCRIBE_EVERY:
            trained["describe_every"] = DESCRIBE_EVERY[args.data]
        if args.init is not None:
            trained["init"] = args.init
        if args.freeze_output:
            trained["freeze_output"] = True
    if accelerator.is_main_process:
        head.eval()
        if args.export is not None:
            layouts.export(head, args.export[1], args.export[0], target=args.target)
        compare = (None if args.compare_head is None else
                   load_head(args.compare_head, source.model).eval())
        rows = measure(source, head, args, compare)
        for r in rows:
            print(f"{r['method']:>20}: {r['tokens_per_step']:.2f} tokens/step, acceptance "
                  f"{r['acceptance']:.3f}, {r['steps']} steps")
        if compare is not None:
            trained.update(compare=args.compare_head, compare_kind=_arch_name(compare))
        trained.update(eval=args.eval, seed=args.seed, temperature=args.temperature,
                       draft=args.draft, tree=tree_name(args.tree), measured_data=args.data,
                       max_new_tokens=source.max_new_tokens,
                       measured_on=_device_name(args.device))
        for name, value in (("training.json", trained), ("metrics.json", rows)):
            with open(os.path.join(args.out, name), "w") as f:
                json.dump(value, f, indent=2)
        with open(os.path.join(args.out, "README.md"), "w") as f:
            f.write(model_card(args.target, head, rows, trained))


def fit(source: Source, args, accelerator, clock: Clock | None = None):
    """Collect (or reuse OUT/data.safetensors on --resume), train, save the head; ``clock``
    gains the checkpoint's seconds on --resume."""
    from mmspec.drafters import head_for_target, layouts

    if (source.frames or source.depth) and args.draft_vocab is not None:
        raise ValueError(f"--draft-vocab {args.draft_vocab}: a frame head drafts over the "
                         "codebooks' whole vocabulary: accepted with token targets only")
    kw = dict(draft_vocab_size=args.draft_vocab, num_layers=args.head_layers)
    if args.arch == "eagle3":
        kw["mrope_section"] = None          # trained on 1-D positions (the card says so)
    else:
        kw["uncond_features"] = args.uncond_features
    if args.merged_embeds:
        kw["merged_embeds"] = True
    head = head_for_target(source.model, args.feature_layers, arch=args.arch,
                           kind=source.head_kind, **kw)
    head.config.target = args.target
    if args.export is not None:           # a frame or depth head: refused before any work
        layouts.layout_named(args.export[0]).check_head(head)
    os.makedirs(args.out, exist_ok=True)
    data = os.path.join(args.out, "data.safetensors")
    if args.resume and os.path.isfile(data):
        batches = load_data(data)[accelerator.process_index::accelerator.num_processes]
    else:
        batches = collect(source, head.config, args, accelerator)
        share_data(batches, data, accelerator)
    if args.draft_vocab is not None:
        head.set_draft_ids(draft_vocab(batches, args.draft_vocab, accelerator))
    if args.arch == "eagle3":             # its output layer starts as the target's rows
        head.init_output(source.model.get_output_embeddings())
    if args.init is not None:             # or every weight from a saved head of its kind
        head.reload(args.init)
    if args.freeze_output:                # kept at the target's rows
        head.init_output(source.model.get_output_embeddings())
        head.train_output = False
    template = _template(source, head, args.temperature)
    start, opt = (load_checkpoint(head, args.out, args.lr) if args.resume else (0, None))
    clock = clock or Clock()
    if args.resume:
        clock.before = checkpoint_seconds(args.out)
    train(head, template, batches, args, accelerator, start, opt, clock)
    if accelerator.is_main_process:
        head.save_pretrained(args.out)
    return head


def _device_name(device: str, processes: int = 1) -> str:
    name = "CPU"
    if device.startswith("cuda") and torch.cuda.is_available():
        name = torch.cuda.get_device_name(torch.device(device))
    return name if processes == 1 else f"{processes} processes, each on {name}"


def _template(source: Source, head, temperature: float):
    """The target's session that maps the head's outputs to the rules' ids (its ``logits``;
    a depth-decoder target's frame distributions, processed as at collection)."""
    rec = source.recorder(head.config)
    source.generate(source.items[:1], seed=0, temperature=temperature, drafter=rec)
    t = rec.target
    for name, value in list(vars(t).items()):   # made under inference mode: not for autograd
        if torch.is_tensor(value) and value.is_inference():
            setattr(t, name, value.clone())
    if source.frames:                 # forcing from the frames fed alone, every batch size
        t.eos_step = torch.full((1,), 1 << 30, dtype=torch.long, device=t.eos_step.device)
    return t


if __name__ == "__main__":
    run(main, "recipes.train.draft_head")
