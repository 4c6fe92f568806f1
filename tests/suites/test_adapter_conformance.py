"""One conformance suite over every registered adapter (``modalities.registry.adapters()``),
on tiny float32 models built from configs, greedy decoding:

- speculative decoding (a draft model and Jacobi) gives plain decoding's tokens;
- static caches give the dynamic caches' tokens (or are refused with a clear error before
  any work, where the layout cannot roll a static cache back);
- each row of a batch gives the tokens it gives alone (left padding, ragged rows);
- where transformers can generate with the model (LLaVA, LLaVA-NeXT, LLaVA-OneVision,
  Mistral3, InternVL, Idefics3, SmolVLM, Chameleon, Gemma 3, Gemma 4, PaliGemma, Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5, MusicGen, CSM), plain greedy decoding gives the model's own ``generate`` tokens,
  on configs in transformers' own layouts (MusicGen's pad id = vocabulary size; CSM's stop
  rule; Qwen-VL's 3-D rotary positions).

Every registered adapter needs a case below: registering one without a case fails
``test_every_registered_adapter_has_a_case``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pytest
import torch

from mmspec.drafters.architectures import ARCHITECTURES
from modalities.registry import adapters


@dataclass
class Case:
    """run(method, rows, static) -> the generated ids (or codes) of those rows, as lists."""

    run: Callable[[str, list[int], bool], list]
    methods: tuple[str, ...]
    static: bool = True          # static caches supported (else refused before any work)
    own: Callable[[int], list] | None = None    # row -> [the model's own greedy generate]
    rows: int = 2                # rows it has (VLMs: images of different sizes)
    front: object = None         # the front door (TextToImage, VisionLanguageGenerator ...)

    @property
    def model(self) -> torch.nn.Module:
        f = self.front
        return f.target if isinstance(f.target, torch.nn.Module) else f.target.model

    def give_head(self, arch: str = "draft-head") -> None:
        """A (random) draft head of ``arch`` of the kind the front door's target takes, for
        method 'head' (EAGLE-3: the first layers, up to three, fused)."""
        from mmspec.drafters.architectures import head_for_target
        from mmspec.drafters.load import load_head
        from mmspec.sessions.causal_lm import _decoder_config

        torch.manual_seed(7)
        kw = {}
        if arch == "eagle3":
            kw["feature_layers"] = tuple(range(min(3, _decoder_config(self.model)
                                                   .num_hidden_layers)))
        self.front.head = load_head(head_for_target(self.model, arch=arch,
                                                    kind=self.front.head_kind, **kw), self.model)


def _image(name: str) -> Case:
    from tiny_image import PIPES
    from tiny_image import tiny_vq

    pipe, prompts = PIPES[name](tiny_vq())
    if name == "emu3":            # a vocabulary map naming some codes, as transformers' tester
        from modalities.image import Emu3Adapter, TextToImage
        from tiny_image import tiny_emu3

        codes = [0, 2, 3, 5, 7, 8, 11, 13, 17, 19, 23]
        pipe = TextToImage(Emu3Adapter(tiny_emu3(codes=codes), 2, 3),
                           Emu3Adapter(tiny_emu3(seed=1, hidden=16, layers=1, codes=codes), 2, 3))

    def run(method, rows, static):
        return pipe([prompts[i] for i in rows], method=method, temperature=0, seed=0,
                    progress=False, decode=False, static_cache=static).tokens.tolist()
    return Case(run, ("exact", "sjd", "sjd-maximal", "sjd-proactive"), front=pipe)


def _vlm(kind: str) -> Case:
    from modalities.vlm import VisionLanguageGenerator
    from tiny_vlm import llava_models as _models, llava_pairs as _pairs

    from PIL import Image

    target, draft, proc = _models(kind)
    ims, prompts = _pairs(kind)
    # a third row: another image size (LLaVA-NeXT: another tile grid) and prompt length
    ims = [*ims, ims[0].resize((48, 32), Image.NEAREST)]
    prompts = [*prompts, "USER: <image> is it red ? ASSISTANT:"]
    return _vlm_case(VisionLanguageGenerator(target, proc, draft, "image"), ims, prompts)


def _vlm_case(gen, ims, prompts) -> Case:
    """A VLM generator's case over its image-prompt pairs (one row each)."""
    def run(method, rows, static, **params):
        return gen.generate([ims[i] for i in rows], [prompts[i] for i in rows], method=method,
                            temperature=0, max_new_tokens=10, seed=0,
                            static_cache=static, **params).token_ids

    def own(i):
        batch = gen.encode([ims[i]], [prompts[i]])
        out = gen.target.generate(**batch, do_sample=False, max_new_tokens=10)
        return [out[0, batch["input_ids"].shape[1]:].tolist()]
    return Case(run, ("exact", "sjd"), own=own, rows=len(prompts), front=gen)


def _qwen(kind: str) -> Case:
    from modalities.vlm import VisionLanguageGenerator
    from tiny_vlm import own_tokens as _own, qwen_pairs as _pairs
    from tiny_vlm import tiny_qwen_processor, tiny_qwen_vl

    target, proc = tiny_qwen_vl(kind), tiny_qwen_processor(kind)
    ims, msgs = _pairs()
    gen = VisionLanguageGenerator(target, proc, tiny_qwen_vl(kind, seed=1, layers=1), "image")

    def run(method, rows, static, **params):
        return gen.generate([ims[i] for i in rows], [msgs[i] for i in rows], method=method,
                            temperature=0, max_new_tokens=10, seed=0,
                            static_cache=static, **params).token_ids
    return Case(run, ("exact", "sjd"), own=lambda i: _own(gen, target, [ims[i]], [msgs[i]], 10),
                rows=3, front=gen)


def _onevision() -> Case:
    from tiny_vlm import tiny_onevision, tiny_onevision_processor

    return _llava_like(tiny_onevision, tiny_onevision_processor(), (64, 32), "<image>")


def _mistral3() -> Case:
    from tiny_vlm import tiny_mistral3, tiny_mistral3_processor

    return _llava_like(tiny_mistral3, tiny_mistral3_processor(), (32, 16), "[IMG]")


def _internvl() -> Case:
    from tiny_vlm import tiny_internvl, tiny_internvl_processor

    return _llava_like(tiny_internvl, tiny_internvl_processor(), (48, 32), "<IMG_CONTEXT>")


def _idefics3() -> Case:
    from tiny_vlm import tiny_idefics3, tiny_idefics3_processor

    return _llava_like(tiny_idefics3, tiny_idefics3_processor(), (48, 32), "<image>", seed=3)


def _smolvlm() -> Case:
    from functools import partial

    from tiny_vlm import tiny_idefics3, tiny_idefics3_processor

    return _llava_like(partial(tiny_idefics3, family="SmolVLM"), tiny_idefics3_processor(),
                       (48, 32), "<image>", seed=3)


def _chameleon() -> Case:
    from tiny_vlm import tiny_chameleon, tiny_chameleon_processor

    return _llava_like(tiny_chameleon, tiny_chameleon_processor(), (48, 32), "<image>")


def _gemma3() -> Case:
    from tiny_vlm import tiny_gemma3, tiny_gemma3_processor

    return _llava_like(tiny_gemma3, tiny_gemma3_processor(), (48, 32), "<start_of_image>")


def _gemma4() -> Case:
    from tiny_vlm import tiny_gemma4, tiny_gemma4_processor

    return _llava_like(tiny_gemma4, tiny_gemma4_processor(), (48, 32), "<|image|>")


def _paligemma() -> Case:
    from tiny_vlm import tiny_paligemma, tiny_paligemma_processor

    return _llava_like(tiny_paligemma, tiny_paligemma_processor(), (48, 32), "<image>")


def _paligemma2() -> Case:
    """PaliGemma 2: Gemma 2's sliding windows (4 slots) shorter than the bidirectional prefix."""
    from functools import partial

    from tiny_vlm import tiny_paligemma, tiny_paligemma_processor

    return _llava_like(partial(tiny_paligemma, window=4), tiny_paligemma_processor(), (48, 32),
                       "<image>")


def _llava_like(build, proc, other_size, token, seed: int = 0) -> Case:
    """Three images, two sizes (other tile grids or token counts), an image draft."""
    from PIL import Image

    from modalities.vlm import VisionLanguageGenerator
    from tiny_vlm import images

    gen = VisionLanguageGenerator(build(seed=seed), proc, build(seed=seed + 1, layers=1), "image")
    ims = images(3)
    ims[1] = ims[1].resize(other_size, Image.NEAREST)
    prompts = [f"USER: {token} what colour is the circle ? ASSISTANT:", f"USER: {token} a ASSISTANT:",
               f"USER: {token} is it red ? ASSISTANT:"]
    return _vlm_case(gen, ims, prompts)


def _speech(tts, texts, methods, static=True, frames=8, own=None) -> Case:
    def run(method, rows, static_):
        out = tts([texts[i] for i in rows], method=method, temperature=0, max_frames=frames,
                  progress=False, decode=False, static_cache=static_)
        return [c.tolist() for c in out.codes]
    return Case(run, methods, static, own, front=tts)


TEXTS = [[3, 4, 5, 6, 7], [8, 9]]


def _delay_pattern() -> Case:
    """transformers' layout: the pad / start id equals the vocabulary size (one past the
    logits), as MusicgenDecoderConfig's defaults and the released checkpoints."""
    from modalities.speech import TextToSpeech
    from tiny_speech import tiny_musicgen

    target = tiny_musicgen(pad_outside=True)
    tts = TextToSpeech.from_pretrained(target, tiny_musicgen(seed=1, hidden=8, layers=1,
                                                             pad_outside=True))

    def own(i):                   # MusicGen's generate decodes its codes: read them there
        seen, decode = [], target.audio_encoder.decode
        target.audio_encoder.decode = lambda codes, *a, **k: seen.append(codes) or decode(codes, *a, **k)
        try:
            ids = torch.tensor([TEXTS[i]])
            target.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                            max_new_tokens=8 + 1)
        finally:
            target.audio_encoder.decode = decode
        return [seen[0][0, 0, :, :8].T.tolist()]
    return _speech(tts, TEXTS, ("exact", "sjd"), static=False, own=own)


def _single_codebook() -> Case:
    from modalities.speech import SingleCodebookAdapter, TextToSpeech
    from tiny_speech import ToyCodec, single_codebook as _single

    def mk(m):
        return SingleCodebookAdapter(m, ToyCodec(), range(20, 36), end_id=36, prefix=[1],
                                     suffix=[2], max_frames=16)
    tts = TextToSpeech(mk(_single()), mk(_single(seed=1, hidden=16)))
    return _speech(tts, [[3, 4, 5, 6, 7], [8, 9]], ("exact", "sjd"), frames=12)


def _csm() -> Case:
    from modalities.speech import TextToSpeech
    from modalities.speech.csm import CsmAdapter
    from tiny_csm import tiny_csm

    target, draft = tiny_csm(scale=3.0), tiny_csm(scale=3.0)
    with torch.no_grad():                      # a perturbed copy: acceptance in (0, 1)
        for prm in draft.parameters():
            prm.add_(0.3 * torch.randn_like(prm) * prm.abs().mean())
    # An end-of-audio id these weights emit in every codebook but the last after 8 frames of
    # the first text and never for the second: rows end by the model's own rule.
    target.config.codebook_eos_token_id = draft.config.codebook_eos_token_id = 7
    texts = [[4, 5, 6, 7, 8], [9, 10]]
    tts = TextToSpeech(CsmAdapter(target, max_frames=10), CsmAdapter(draft, max_frames=10))

    def own(i):                   # transformers' sequence ends with its end frame
        ids = torch.tensor([texts[i]])
        out = target.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                              do_sample=False, max_new_tokens=10, output_audio=False)[0]
        ended = bool((out[-1, :-1] == 7).all())
        return [out[:-1].tolist() if ended else out.tolist()]
    return _speech(tts, texts, ("exact",), frames=10, own=own)


CASES = {
    "janus": lambda: _image("janus"), "emu3": lambda: _image("emu3"),
    "llamagen": lambda: _image("llamagen"), "token-span": lambda: _image("token-span"),
    "llava": lambda: _vlm("llava"), "llava-next": lambda: _vlm("llava-next"),
    "llava-onevision": _onevision, "mistral3": _mistral3, "internvl": _internvl,
    "idefics3": _idefics3, "smolvlm": _smolvlm, "chameleon": _chameleon,
    "gemma3": _gemma3, "gemma4": _gemma4, "paligemma": _paligemma, "paligemma2": _paligemma2,
    "qwen2-vl": lambda: _qwen("qwen2-vl"), "qwen2.5-vl": lambda: _qwen("qwen2.5-vl"),
    "qwen3-vl": lambda: _qwen("qwen3-vl"), "qwen3.5": lambda: _qwen("qwen3.5"),
    "delay-pattern": _delay_pattern, "single-codebook": _single_codebook, "csm": _csm,
}
# Cases of a registered adapter's class in another configuration the adapter decodes otherwise.
VARIANTS = {"paligemma2": "paligemma"}
NAMES = [a.name for a in adapters()] + list(VARIANTS)


@pytest.fixture(scope="module", params=NAMES)
def case(request):
    if request.param not in CASES:
        pytest.fail(f"adapter {request.param!r} is registered without a conformance case")
    torch.manual_seed(0)
    return CASES[request.param]()


def test_every_registered_adapter_has_a_case():
    assert set(NAMES) == set(CASES), set(NAMES) ^ set(CASES)
    assert set(VARIANTS.values()) <= {a.name for a in adapters()}


def test_speculative_greedy_equals_plain_greedy(case):
    plain = case.run("plain", [0, 1], False)
    for method in case.methods:
        assert case.run(method, [0, 1], False) == plain, method


def test_plain_steps_chained_give_plain_greedy(case, monkeypatch):
    """Plain decoding three target steps per launch (``Plan.steps_per_launch``, as captured
    engines chain them; here each chain runs its steps one by one) gives the tokens of a
    step per launch, budgets that end mid-chain and stop tokens inside a chain included."""
    from mmspec.drafters import NoDraft
    from mmspec.engine import Plan

    plain = {static: case.run("plain", [0, 1], static) for static in {False, case.static}}
    monkeypatch.setattr(Plan, "steps_per_launch",
                        lambda self, target, drafter: 3 if isinstance(drafter, NoDraft) else 1)
    for static, tokens in plain.items():
        assert case.run("plain", [0, 1], static) == tokens, static


def test_static_caches_give_the_dynamic_tokens(case):
    plain = case.run("plain", [0, 1], False)
    if not case.static:
        with pytest.raises(ValueError, match="static_cache"):
            case.run("plain", [0, 1], True)
        return
    for method in ("plain",) + case.methods:
        assert case.run(method, [0, 1], True) == plain, method


def test_batch_rows_equal_their_single_row_runs(case):
    for method in ("plain", case.methods[0]):
        both = case.run(method, [0, 1], False)
        assert both == case.run(method, [0], False) + case.run(method, [1], False), method


# Adapters whose sessions cannot take tree steps: delay patterns (positions follow the cache
# length), CSM (frames from a depth decoder), Qwen3.5 (recurrent layers: its draft model's
# trees are refused; as a target it verifies a head's trees, below), the tiny Mistral3
# and Gemma 3 and 4 (sliding windows: MistralConfig's default, Gemma's local layers).
NO_TREES = {"delay-pattern", "csm", "qwen3.5", "mistral3", "gemma3", "gemma4", "paligemma2"}


def test_greedy_trees_give_plain_greedy_or_are_refused(case, request):
    """Method 'tree' (the draft model's dynamic trees) gives plain greedy's tokens, static and
    dynamic caches, on every adapter whose sessions take tree steps; the others refuse it
    before any work, naming tree steps."""
    name = request.node.callspec.params["case"]
    run = case.run
    assert "exact" in case.methods            # every case has a draft model
    plain = run("plain", [0, 1], False)
    if name in NO_TREES:
        with pytest.raises(ValueError, match="tree"):
            run("tree", [0, 1], False)
        return
    for static in (False, True) if case.static else (False,):
        assert run("tree", [0, 1], static) == plain, static


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_draft_heads_give_plain_greedy(case, request, arch):
    """Method 'head' (a random head of each architecture, of the kind the target takes, on
    its features: a token head's trees, or chains where the sessions take no tree steps;
    frame heads' chains) gives plain greedy's tokens, static and dynamic caches.
    Multi-codebook targets refuse a token head and an EAGLE-3 head."""
    if request.node.callspec.params["case"] in ("delay-pattern", "csm"):
        from mmspec.drafters import DraftHead
        from mmspec.drafters.architectures import head_for_target

        with pytest.raises(ValueError, match="multi-codebook"):
            DraftHead.for_target(case.model)
        if arch == "eagle3":
            with pytest.raises(ValueError, match="multi-codebook"):
                head_for_target(case.model, arch=arch, kind=case.front.head_kind)
            return
    case.give_head(arch)
    plain = case.run("plain", [0, 1], False)
    for static in (False, True) if case.static else (False,):
        assert case.run("head", [0, 1], static) == plain, static


VLMS = [a.name for a in adapters("vlm")]


@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("name", VLMS)
def test_every_vlm_draft_width_gives_plain_greedy(name, k):
    """Every vision-language adapter, K in {1, 3, 8} drafts per step and Jacobi windows,
    static and dynamic caches, a batch of its three rows (images of different sizes)."""
    case = CASES[name]()
    rows = list(range(case.rows))
    plain = case.run("plain", rows, False)
    for static in (False, True):
        assert case.run("exact", rows, static, num_draft_tokens=k) == plain, (static, "exact")
        assert case.run("sjd", rows, static, window=k) == plain, (static, "sjd")


IMAGE_LAST = ["llava-onevision", "mistral3", "internvl", "idefics3", "smolvlm", "chameleon",
              "gemma3", "gemma4", "paligemma", "paligemma2"]


@pytest.mark.parametrize("name", IMAGE_LAST)
def test_prompts_that_end_with_the_image_give_the_models_own_tokens(name):
    """A prompt written with its image last (completion style), beside one with it first:
    plain, draft-model and Jacobi decoding give each row the model's own greedy tokens,
    dynamic and static caches, whatever the processor makes of the end (an image
    placeholder, or its closing token). LLaVA, LLaVA-NeXT and the Qwen-VL kinds:
    tests/modalities/test_vlm.py."""
    from tiny_vlm import images

    gen = CASES[name]().front
    token = getattr(gen.processor, "image_token", "<image>")
    ims = images(2, seed=5)
    prompts = [f"USER: what colour is the circle ? {token}", f"USER: {token} a ASSISTANT:"]
    own = []
    for im, prompt in zip(ims, prompts):
        batch = gen.encode([im], [prompt])
        out = gen.target.generate(**batch, do_sample=False, max_new_tokens=6)
        own.append(out[0, batch["input_ids"].shape[1]:].tolist())
    for method in ("plain", "exact", "sjd"):
        for static in (False, True):
            out = gen.generate(ims, prompts, method=method, temperature=0, max_new_tokens=6,
                               static_cache=static, seed=0)
            assert out.token_ids == own, (method, static)


OWN = ["llava", "llava-next", "llava-onevision", "mistral3", "internvl", "idefics3", "smolvlm",
       "chameleon", "gemma3", "gemma4", "paligemma", "paligemma2", "qwen2-vl", "qwen2.5-vl", "qwen3-vl", "qwen3.5",
       "delay-pattern", "csm"]


@pytest.mark.parametrize("name", OWN)
def test_plain_greedy_equals_the_models_own_generate(name):
    case = CASES[name]()
    for i in (0, 1):
        assert case.run("plain", [i], False) == case.own(i), i


def test_readme_lists_every_supported_model_class():
    import pathlib

    readme = (pathlib.Path(__file__).resolve().parent.parent.parent / "README.md").read_text()
    table = readme[readme.index("## Supported models"):
                   readme.index("## Command line and web demo")]
    for info in adapters():
        assert f"`{info.name}`" in table, info.name
        assert all(f"`{m}`" in table for m in info.models), info.models
