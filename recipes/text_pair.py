"""A small text pair built in seconds on the CPU: a word-level "scene caption" language, a
4-layer Llama target and a 1-layer Llama draft trained on it from scratch.

Used by ``make demo`` (until the bundled models exist) and by ``eval/bench_core.py``. The
language is a seeded grammar ("a large red circle at the top left and a small blue star at
the bottom ."), so the models learn real structure and the draft agrees with the target
often, but not always: acceptance is measured, not arranged.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm
from transformers import LlamaConfig, LlamaForCausalLM

SIZES = ["small", "large"]
COLOURS = ["red", "green", "blue", "yellow", "purple", "orange", "white", "black"]
SHAPES = ["circle", "square", "triangle", "star", "cross"]
ROWS = ["top", "middle", "bottom"]
COLS = ["left", "centre", "right"]
SPECIALS = ["<pad>", "<bos>", "<eos>"]
WORDS = SPECIALS + ["a", "and", "at", "the", "."] + SIZES + COLOURS + SHAPES + ROWS + COLS


@dataclass
class WordTokenizer:
    words: list[str]

    def __post_init__(self):
        self.index = {w: i for i, w in enumerate(self.words)}

    @property
    def pad_id(self) -> int:
        return self.index["<pad>"]

    @property
    def bos_id(self) -> int:
        return self.index["<bos>"]

    @property
    def eos_id(self) -> int:
        return self.index["<eos>"]

    def encode(self, text: str) -> list[int]:
        return [self.bos_id] + [self.index[w] for w in text.split()]

    def decode(self, ids) -> str:
        return " ".join(self.words[i] for i in ids if self.words[i] not in SPECIALS)


def caption(rng: random.Random) -> str:
    objs = []
    for _ in range(rng.randint(1, 3)):
        row, col = rng.choice(ROWS), rng.choice(COLS)
        where = f"{row} {col}" if not (row == "middle" and col == "centre") else "middle centre"
        objs.append(f"a {rng.choice(SIZES)} {rng.choice(COLOURS)} {rng.choice(SHAPES)} at the {where}")
    return " and ".join(objs) + " ."


def batch(tok: WordTokenizer, rng: random.Random, n: int, length: int) -> torch.Tensor:
    """[n, length] training sequences: captions joined by <eos>, cut to length."""
    rows = []
    for _ in range(n):
        ids: list[int] = []
        while len(ids) < length:
            ids += tok.encode(caption(rng)) + [tok.eos_id]
        rows.append(ids[:length])
    return torch.tensor(rows)


def llama(vocab: int, hidden: int, layers: int, heads: int, seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=4 * hidden,
                      num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=heads, max_position_embeddings=256,
                      pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=True)
    return LlamaForCausalLM(cfg)


def train(model, tok, steps: int, seed: int, desc: str, lr: float = 3e-3, progress=True):
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
    model.train()
    bar = tqdm(range(steps), desc=desc, disable=None if progress else True, leave=False)
    loss = torch.tensor(0.0)
    for _ in bar:
        x = batch(tok, rng, 32, 48)
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        bar.set_postfix(loss=f"{loss.item():.3f}")
    model.eval()
    return float(loss)


def build_text_pair(seed: int = 0, target_steps: int = 150, draft_steps: int = 150,
                    progress: bool = True):
    """Train (target, draft) on the caption language; returns (target, draft, tokenizer, info)."""
    torch.manual_seed(seed)
    tok = WordTokenizer(WORDS)
    target = llama(len(WORDS), hidden=128, layers=4, heads=4, seed=seed)
    draft = llama(len(WORDS), hidden=32, layers=1, heads=2, seed=seed + 1)
    lt = train(target, tok, target_steps, seed, "train target (4 layers)", progress=progress)
    ld = train(draft, tok, draft_steps, seed + 1, "train draft (1 layer)", progress=progress)
    info = dict(target_params=sum(p.numel() for p in target.parameters()),
                draft_params=sum(p.numel() for p in draft.parameters()),
                target_loss=lt, draft_loss=ld)
    return target, draft, tok, info


def prompts(tok: WordTokenizer, n: int, seed: int = 123) -> tuple[torch.Tensor, torch.Tensor]:
    """n left-padded prompts: a caption prefix of varying length."""
    rng = random.Random(seed)
    seqs = []
    for _ in range(n):
        ids = tok.encode(caption(rng))
        seqs.append(ids[: rng.randint(2, 6)])
    width = max(len(s) for s in seqs)
    ids = torch.full((n, width), tok.pad_id)
    mask = torch.zeros(n, width, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, width - len(s):] = torch.tensor(s)
        mask[i, width - len(s):] = 1
    return ids, mask
