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

    def __init__(self, model=None, draft=None, device=None, **gen):
        from modalities.image import TextToImage

        model = model or self.default_model
        if draft is None and model == self.default_model:
            draft = self.default_draft
        self.pipe = TextToImage.from_pretrained(model, draft=draft or None)
        self.device = torch.device(device) if device else self.pipe.target.device
        if self.device != self.pipe.target.device:
            self.pipe.target.model.to(self.device)
            if self.pipe.draft is not None:
                self.pipe.draft.model.to(self.device)
            vq = getattr(self.pipe.target, "vq", None)
            if vq is not None and hasattr(vq, "vq"):
                vq.vq.to(self.device)
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
            from eval.features import ShapesFeatureNet

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
        from PIL import Image, ImageDraw

        methods = list(tokens_by_method)
        tgt = self.pipe.target
        from modalities.image.pipeline import to_pil

        w = 128
        sheet = Image.new("RGB", (len(methods) * (w + 4), 14 + show * (w + 4)), "white")
        draw = ImageDraw.Draw(sheet)
        for j, m in enumerate(methods):
            ids = torch.tensor(tokens_by_method[m][:show], device=tgt.device)
            ims = to_pil(tgt.decode(ids))
            draw.text((j * (w + 4) + 2, 1), m[:22], fill="black")
            for i, im in enumerate(ims):
                sheet.paste(im.resize((w, w), Image.NEAREST), (j * (w + 4), 14 + i * (w + 4)))
        sheet.save(path)


TASKS = {"image": ImageTask}


def load_prompts(path: str | None, task_cls, n: int | None) -> list:
    path = path or task_cls.default_prompts
    with open(path) as f:
        prompts = [line.strip() for line in f if line.strip()]
    return prompts[:n] if n else prompts
