"""Draft heads shared by the head tests: EAGLE-3 variants and a random head, its forward, the
draft-head recipe's collection and training on a tiny target, a text LM folder for it."""

from __future__ import annotations

import argparse

import torch

import mmspec
from conftest import tiny_llama
from mmspec.drafters import DraftHead, FeatureDrafter
from mmspec.drafters.eagle3 import Eagle3Head
from recipes.train import draft_head as recipe

VARIANTS = {
    "plain": {},
    "norm_before_residual": dict(norm_before_residual=True),
    "norm_before_fc": dict(norm_before_fc=True),
    "fc_norm": dict(fc_norm=True),
    "norm_output": dict(norm_output=True),
    "two layers": dict(num_layers=2),
}


def eagle3_head(target, seed=1, draft_vocab=24, layers=(1, 2, 4), **kw) -> Eagle3Head:
    """A random head (weights and norms perturbed, a shuffled draft vocabulary)."""
    torch.manual_seed(seed)
    head = Eagle3Head.for_target(target, feature_layers=layers, draft_vocab_size=draft_vocab,
                                 **kw)
    head.set_draft_ids(torch.randperm(target.config.vocab_size)[:draft_vocab])
    with torch.no_grad():
        for name, p in head.named_parameters():
            if not name.startswith("decoder.model.embed_tokens"):
                p.add_(0.3 * torch.randn_like(p))
    return head


def forward(head, feats, embeds):
    """The head's own logits [T, V] and fed-back outputs through its decoder (as training and
    the head's session run it)."""
    x = head.inputs(embeds[None], head.reduce_features(feats[None]))
    g = head.decoder.model(inputs_embeds=x, position_ids=torch.arange(x.shape[1])[None],
                           use_cache=False).last_hidden_state
    return head.full_logits(head.decoder.lm_head(g))[0], g[0]


def eagle3_pairs(target, head, seed=0, t=7):
    """(features [t, F], token embeddings [t, H]) of a random sequence through ``target``."""
    ids = torch.randint(0, target.config.vocab_size, (1, t),
                        generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        hs = target(ids, output_hidden_states=True).hidden_states
    feats = torch.cat([hs[i] for i in head.config.feature_layers], -1)[0]
    return feats, target.get_input_embeddings()(ids)[0]


def collect(target, n_batches=6, rows=16, seed=0, new=16, layers=None):
    """The recipe's training batches from ``target``'s greedy generations of random prompts,
    and its template."""
    batches = []
    layers = layers or DraftHead.for_target(target).config.feature_layers
    for i in range(n_batches):
        g = torch.Generator().manual_seed(seed + i)
        ids = torch.randint(1, target.config.vocab_size, (rows, 4), generator=g)
        rec = recipe.Recorder(layers)
        mmspec.generate(target, input_ids=ids, drafter=rec, temperature=0, max_new_tokens=new,
                        seed=i)
        batches.append(rec.batch())
    return batches, rec.target


def _tokens_per_step(target, head, seed=100):
    ids = torch.randint(1, target.config.vocab_size, (16, 4),
                        generator=torch.Generator().manual_seed(seed))
    out = mmspec.generate(target, input_ids=ids, temperature=0, max_new_tokens=16,
                          drafter=FeatureDrafter(head, depth=3, branch=1, width=1))
    return out.stats.tokens_per_step


def trains(target, head, template, batches) -> None:
    """150 steps of the recipe's training: the head's chain emits over 0.3 more tokens per
    target step than before, and its greedy tokens stay plain greedy's."""
    from accelerate import Accelerator

    before = _tokens_per_step(target, head)
    args = argparse.Namespace(lr=3e-3, steps=150, unroll=2, seed=0, save_every=10_000,
                              out="unused")
    recipe.train(head, template, batches, args, Accelerator(cpu=True))
    after = _tokens_per_step(target, head)
    assert after > before + 0.3, (before, after)
    ref = torch.randint(1, target.config.vocab_size, (3, 4),
                        generator=torch.Generator().manual_seed(7))
    kw = dict(input_ids=ref, temperature=0, max_new_tokens=12)
    assert torch.equal(mmspec.generate(target, drafter=FeatureDrafter(head), **kw).sequences,
                       mmspec.generate(target, **kw).sequences)


def text_lm_folder(folder, layers: int = 2) -> str:
    """A tiny text LM saved with the bundled word tokenizer in ``folder/lm`` and seven
    prompts in ``folder/prompts.txt`` (the recipe's ``--modality text`` inputs)."""
    from recipes.train.vlm import WORDS, tokenizer

    target = tiny_llama(vocab=len(WORDS), layers=layers)
    target.config.eos_token_id = None
    target.save_pretrained(folder / "lm")
    tokenizer().save_pretrained(folder / "lm")
    lines = [" ".join(WORDS[12 + (i * 7 + j) % 20] for j in range(3 + i % 4)) for i in range(7)]
    (folder / "prompts.txt").write_text("\n".join(lines) + "\n")
    return str(folder / "lm")
