"""What the sweep needs from each modality: load models, run one batch with one method,
score the outputs, and render comparisons. One class per modality; the sweep never branches on
modality names beyond looking the class up in ``TASKS``."""

from __future__ import annotations

import os
import random
import zlib
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUNDLED = os.path.join(ROOT, "samples", "models")


def resolve_models(cls, model, draft) -> tuple[str, str | None]:
    """The model and draft a task loads: the bundled pair by default (a draft only beside the
    bundled model unless one is given)."""
    model = model or cls.default_model
    if draft is None and model == cls.default_model:
        draft = cls.default_draft
    return model, (draft or None)


def _dtype(model) -> str:
    return str(next(model.parameters()).dtype).replace("torch.", "")


class ImageTask:
    """Text-to-image (or class-to-image) with ``modalities.image.TextToImage``.

    Per row: compositional accuracy (shapes-world parser; models outside the shapes world
    report none), features for FID (the bundled feature network), the generated ids.
    """

    modality = "image"
    default_model = os.path.join(BUNDLED, "shapes-t2i")
    default_draft = os.path.join(BUNDLED, "shapes-t2i-draft")
    default_prompts = os.path.join(ROOT, "samples", "prompts", "shapes_eval.txt")
    quality_metrics = ("compositional_accuracy",)
    higher_is_better = {"compositional_accuracy": True, "fid": False}

    def __init__(self, model=None, draft=None, device=None, head=None, **gen):
        from modalities.image import TextToImage

        model, draft = self.model_path, self.draft_path = resolve_models(type(self), model, draft)
        self.pipe = TextToImage.from_pretrained(model, draft=draft, head=head)
        self.head_path, self.has_head = head, head is not None
        self.has_draft, self.dtype = draft is not None, _dtype(self.pipe.target.model)
        self.device = self.pipe.to(device).device
        self.gen = gen
        self.vocab = self.pipe.target.vocab_size
        self._features = None
        self.shapes_world = "shapes" in os.path.basename(os.path.normpath(str(model)))

    # -- generation --------------------------------------------------------------------------
    def run(self, prompts: list, method: str, params: dict, seed: int, profile: bool) -> dict:
        t0 = time.perf_counter()
        out = self.pipe(prompts, method=method, seed=seed, progress=False, profile=profile,
                        **self.gen, **params)
        seconds = time.perf_counter() - t0
        return dict(outputs=out.images, tokens=out.tokens.tolist(), stats=out.stats,
                    seconds=seconds)

    # -- quality -------------------------------------------------------------------------------
    def features(self):
        if self._features is None:
            from modalities.shapes_features import ShapesFeatureNet

            self._features = ShapesFeatureNet.load(os.path.join(BUNDLED, "shapes-features"),
                                                   self.device)
        return self._features

    def _feat(self, images) -> np.ndarray:
        arr = np.stack([np.asarray(im.convert("RGB").resize((64, 64))) for im in images])
        x = torch.from_numpy(arr).to(self.device).permute(0, 3, 1, 2).float() / 127.5 - 1
        with torch.no_grad():
            return self.features().features(x).cpu().numpy()

    def score(self, prompts, outputs) -> list[dict]:
        rows = [dict() for _ in outputs]
        if self.shapes_world:
            from modalities import shapes_world as sw

            feats = self._feat(outputs)
            for i, (p, im) in enumerate(zip(prompts, outputs)):
                rows[i]["compositional_accuracy"] = float(sw.matches(im, p))
                rows[i]["features"] = [round(float(v), 4) for v in feats[i]]
        return rows

    def reference_features(self, prompts) -> np.ndarray | None:
        """Features of rendered scenes for the prompts (4 backgrounds each): FID's reference."""
        if not self.shapes_world:
            return None
        from modalities import shapes_world as sw

        imgs = []
        for i, p in enumerate(prompts):
            scene = sw.parse_caption(p)
            for k in range(4):
                imgs.append(sw.render(scene, random.Random(zlib.crc32(f"{p}#{k}".encode()))))
        return self._feat(imgs)

    # -- pictures ------------------------------------------------------------------------------
    def visual(self, tokens_by_method: dict, path: str, show: int = 4) -> None:
        """Images of the first prompts, methods side by side at the same seed."""
        from modalities.image.pipeline import to_pil
        from recipes.figures import sheet

        tgt = self.pipe.target
        columns = [(m, to_pil(tgt.decode(torch.tensor(rows[:show], device=tgt.device))))
                   for m, rows in tokens_by_method.items()]
        sheet(columns, 128, rows=show).save(path)


def _bundled(path: str) -> bool:
    return os.path.normpath(str(path)).startswith(os.path.normpath(BUNDLED))


class VLMTask:
    """Vision-language answers with ``modalities.vlm.VisionLanguageGenerator``.

    Prompts: one per line, ``IMAGE<TAB>QUESTION[<TAB>ANSWER]`` where IMAGE is a shapes-world
    seed (the scene is rendered) or an image file. Per row: answer accuracy (exact match after
    whitespace normalisation, when the line gives an answer) and agreement with the target's
    plain greedy answer (taken from the plain greedy run when the sweep has one, else computed
    once per prompt; cached). Greedy by default
    (``--temperature`` changes it)."""

    modality = "vlm"
    default_model = os.path.join(BUNDLED, "shapes-vlm")
    default_draft = os.path.join(BUNDLED, "shapes-vlm-draft")
    default_prompts = os.path.join(ROOT, "samples", "prompts", "shapes_vqa.tsv")
    quality_metrics = ("answer_accuracy", "greedy_agreement")
    higher_is_better = {"answer_accuracy": True, "greedy_agreement": True}

    def __init__(self, model=None, draft=None, device=None, draft_mode=None, max_new_tokens=24,
                 head=None, **gen):
        from modalities.vlm import VisionLanguageGenerator

        model, draft = self.model_path, self.draft_path = resolve_models(type(self), model, draft)
        self.gen_obj = VisionLanguageGenerator.from_pretrained(
            model, draft=draft, draft_mode=draft_mode or ("image" if draft else None), head=head)
        self.head_path, self.has_head = head, head is not None
        self.has_draft, self.dtype = draft is not None, _dtype(self.gen_obj.target)
        self.device = self.gen_obj.to(device).device
        gen.setdefault("temperature", 0.0)
        self.gen, self.max_new_tokens = gen, max_new_tokens
        from mmspec.sessions import output_vocab_size

        self.vocab = output_vocab_size(self.gen_obj.target)
        self._greedy: dict = {}

    @staticmethod
    def parse(line: str):
        """A prompt line (``modalities.vlm.questions``), named in the error."""
        from modalities.vlm.questions import Question

        try:
            return Question.parse(line)
        except ValueError as e:
            raise ValueError(f"VLM prompt {line!r}: {e}") from None

    def _inputs(self, prompts):
        questions = [self.parse(line) for line in prompts]
        return [q.picture() for q in questions], [q.messages() for q in questions]

    def run(self, prompts, method, params, seed, profile):
        images, msgs = self._inputs(prompts)
        t0 = time.perf_counter()
        out = self.gen_obj.generate(images, msgs, method=method, seed=seed,
                                    max_new_tokens=self.max_new_tokens, **self.gen, **params)
        seconds = time.perf_counter() - t0
        if method == "plain" and not params and self.gen.get("temperature") == 0:
            self._greedy.update(zip(prompts, out.texts))   # the reference, already computed
        return dict(outputs=out.texts, tokens=out.token_ids, stats=out.stats, seconds=seconds)

    def score(self, prompts, outputs):
        norm = lambda t: " ".join(str(t).split())    # noqa: E731
        todo = [p for p in prompts if p not in self._greedy]
        if todo:
            images, msgs = self._inputs(todo)
            ref = self.gen_obj.generate(images, msgs, method="plain", temperature=0,
                                        max_new_tokens=self.max_new_tokens, seed=0)
            self._greedy.update(zip(todo, ref.texts))
        rows = []
        for p, text in zip(prompts, outputs):
            answer = self.parse(p).answer
            r = dict(answer=text, greedy_agreement=float(norm(text) == norm(self._greedy[p])))
            if answer is not None:
                r["answer_accuracy"] = float(norm(text) == norm(answer))
            rows.append(r)
        return rows

    def visual(self, tokens_by_method: dict, path: str, show: int = 4) -> None:
        """The first prompts' images with each method's answer at the same seed."""
        from PIL import Image, ImageDraw

        tok = self.gen_obj.processor.tokenizer
        prompts = getattr(self, "prompts", None) or self._shown
        methods = list(tokens_by_method)
        w, line = 96, 12
        height = w + line * (2 + len(methods))
        shown = prompts[:show]
        sheet = Image.new("RGB", (len(shown) * (w + 200), height), "white")
        draw = ImageDraw.Draw(sheet)
        for j, p in enumerate(shown):
            q = self.parse(p)
            x = j * (w + 200)
            sheet.paste(q.picture().resize((w, w)), (x, 0))
            draw.text((x, w + 2), q.text[:48], fill="black")
            for i, m in enumerate(methods):
                ids = tokens_by_method[m][j] if j < len(tokens_by_method[m]) else []
                text = tok.decode(ids, skip_special_tokens=True).strip()
                draw.text((x, w + line * (i + 1) + 2), f"{m[:12]}: {text[:36]}", fill="black")
        sheet.save(path)


class SpeechTask:
    """Text-to-speech with ``modalities.speech.TextToSpeech``.

    Per row: mel cepstral distortion (DTW) and log-F0 RMSE against the espeak-ng rendering of
    the text (shapes-world models, whose training data espeak-ng spoke; needs ``make
    speech-deps``), the duration ratio against it, and the target's negative log-likelihood of
    the generated codes (nats per code; every model). Generated ids are frames (lists of C
    codes); tokens per step count frames, the lossless check compares code frequencies."""

    modality = "speech"
    default_model = os.path.join(BUNDLED, "shapes-tts")
    default_draft = os.path.join(BUNDLED, "shapes-tts-draft")
    default_prompts = os.path.join(ROOT, "samples", "prompts", "shapes_tts.txt")
    quality_metrics = ("mcd", "log_f0_rmse", "duration_ratio", "code_nll")
    higher_is_better = {"mcd": False, "log_f0_rmse": False, "duration_ratio": None,
                        "code_nll": False}

    def __init__(self, model=None, draft=None, device=None, head=None, **gen):
        from modalities.speech import TextToSpeech

        model, draft = self.model_path, self.draft_path = resolve_models(type(self), model, draft)
        self.tts = TextToSpeech.from_pretrained(model, draft=draft, head=head)
        self.head_path, self.has_head = head, head is not None
        self.has_draft, self.dtype = draft is not None, _dtype(self.tts.target.model)
        self.device = self.tts.to(device).device
        self.gen = gen
        self.vocab = int(self.tts.target.vocab_size)
        self.references = _bundled(model)
        self._refs: dict = {}

    def run(self, prompts, method, params, seed, profile):
        t0 = time.perf_counter()
        out = self.tts(list(prompts), method=method, seed=seed, progress=False, **self.gen, **params)
        seconds = time.perf_counter() - t0
        tokens = [c.tolist() for c in out.codes]            # frames: [N][C] ids
        return dict(outputs=list(zip(out.waveforms, out.codes)), tokens=tokens, stats=out.stats,
                    seconds=seconds)

    def reference(self, text: str):
        if text not in self._refs:
            from recipes.train.speech_data import reference

            tag = self.tts.defaults.get("description") or "us"
            self._refs[text] = reference(f"{tag} {text}")
        return self._refs[text]

    def score(self, prompts, outputs):
        from eval.metrics import duration_ratio, log_f0_rmse, mel_cepstral_distortion

        rows = []
        sr = self.tts.target.sample_rate
        for text, (wave, codes) in zip(prompts, outputs):
            r = dict(code_nll=self.tts.code_nll(text, codes))
            if self.references:
                ref = self.reference(text)
                r["mcd"] = mel_cepstral_distortion(wave, ref, sr)
                f0 = log_f0_rmse(wave, ref, sr)
                if f0 == f0:
                    r["log_f0_rmse"] = f0
                r["duration_ratio"] = duration_ratio(wave, ref)
            rows.append(r)
        return rows

    def visual(self, tokens_by_method: dict, path: str, show: int = 2) -> None:
        """Mel spectrograms of the first prompts, one row per method, at the same seed."""
        from modalities.speech.audio import spectrogram_grid

        tgt = self.tts.target
        waves = {}
        for m, rows in tokens_by_method.items():
            waves[m] = []
            for ids in rows[:show]:
                codes = torch.tensor(ids, dtype=torch.long).view(-1, tgt.codebooks)
                waves[m].append(tgt.decode(codes[None].to(tgt.device))[0] if len(codes)
                                else np.zeros(0, np.float32))
        spectrogram_grid(waves, tgt.sample_rate, path, show=show, dpi=90)


TASKS = {"image": ImageTask, "vlm": VLMTask, "speech": SpeechTask}


def load_prompts(path: str | None, task_cls, n: int | None) -> list:
    path = path or task_cls.default_prompts
    with open(path) as f:
        prompts = [line.strip() for line in f if line.strip()]
    return prompts[:n] if n else prompts
