"""The web demo: plain and speculative decoding side by side in a browser.

    mmspec serve                              # http://127.0.0.1:7860, the bundled models
    mmspec serve --port 8000 --t2i-model path/or/id --t2i-draft path/or/id
    python -m recipes.serve

One tab per modality: type a caption, ask a question about an image, or give a sentence;
pick methods; see plain decoding and each method side by side, with tokens per step,
acceptance, seconds, the speedup against plain decoding measured in that call, and a
quality figure (images: whether the shapes-world parser reads the caption's scene back;
answers: whether the method's answer equals plain decoding's; speech: mel cepstral
distortion against espeak-ng, lower is better). Each modality's models load on first use.
"""

from __future__ import annotations

import os
import shutil
import threading
from dataclasses import dataclass, field

import numpy as np

from recipes.cli import Number, Parser, add_common, configure, describe, run

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")   # no calls home from the page

BUNDLED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "samples",
                       "models")
T2I_METHODS = ("exact", "tree", "head", "head+lantern", "sjd", "sjd-maximal", "lantern", "gsd")
VLM_METHODS = ("exact", "tree", "head", "sjd")
TTS_METHODS = {"exact": {}, "pcg": {"theta": 0.45}, "head": {"tree_depth": 4}}
COLUMNS = ["method", "tokens/step", "acceptance", "seconds", "speedup", "quality"]


@dataclass
class Models:
    """The folders or Hugging Face ids the demo loads (default: the bundled shapes-world
    pairs); a draft of None means methods that need one are refused."""

    t2i: str = os.path.join(BUNDLED, "shapes-t2i")
    t2i_draft: str | None = os.path.join(BUNDLED, "shapes-t2i-draft")
    t2i_head: str | None = os.path.join(BUNDLED, "shapes-t2i-head")
    vlm: str = os.path.join(BUNDLED, "shapes-vlm")
    vlm_draft: str | None = os.path.join(BUNDLED, "shapes-vlm-text-draft")
    vlm_head: str | None = os.path.join(BUNDLED, "shapes-vlm-head")
    tts: str = os.path.join(BUNDLED, "shapes-tts")
    tts_draft: str | None = os.path.join(BUNDLED, "shapes-tts-draft")
    tts_head: str | None = os.path.join(BUNDLED, "shapes-tts-head")

    def bundled(self, name: str) -> bool:
        return os.path.normpath(getattr(self, name)).startswith(os.path.normpath(BUNDLED))


@dataclass
class Row:
    """One method's line of a result table."""

    method: str
    tokens_per_step: float
    acceptance: float
    seconds: float
    quality: str
    speedup: float = 1.0

    def cells(self) -> list:
        acceptance = "" if self.method == "plain" else round(self.acceptance, 3)
        return [self.method, round(self.tokens_per_step, 2), acceptance,
                round(self.seconds, 3), f"{self.speedup:.2f}x", self.quality]


def _table(rows: list[Row]) -> list[list]:
    for r in rows:
        r.speedup = rows[0].seconds / max(r.seconds, 1e-9)
    return [r.cells() for r in rows]


def _row(method: str, out, quality: str) -> Row:
    s = out.stats
    return Row(method, s.tokens_per_step, s.acceptance_rate if method != "plain" else 0.0,
               out.seconds, quality)


MODALITIES = ("t2i", "vlm", "tts")


@dataclass
class Demo:
    """The demo's work without the page: each call runs plain decoding and the chosen methods
    at one seed and returns what the page shows (tests call these directly too)."""

    models: Models = field(default_factory=Models)
    device: str = "cpu"
    _loaded: dict = field(default_factory=dict, repr=False)
    _locks: dict = field(default_factory=lambda: {k: threading.Lock() for k in MODALITIES},
                         repr=False)

    # 1. Loading (once per modality, with a warm-up call so the first timing is not a cold one;
    # concurrent first requests wait for the one load; a failed load is tried again next time).
    def _pipe(self, kind: str):
        with self._locks[kind]:
            if kind not in self._loaded:
                self._loaded[kind] = getattr(self, f"_load_{kind}")()
            return self._loaded[kind]

    def _load_t2i(self):
        from modalities.image import TextToImage

        pipe = TextToImage.from_pretrained(self.models.t2i, draft=self.models.t2i_draft,
                                           device=self.device, head=self.models.t2i_head)
        pipe("a red circle", method="plain", seed=0, progress=False, decode=False)
        return pipe

    def _load_vlm(self):
        from modalities.vlm import VisionLanguageGenerator

        return VisionLanguageGenerator.from_pretrained(self.models.vlm, draft=self.models.vlm_draft,
                                                       device=self.device, head=self.models.vlm_head)

    def _load_tts(self):
        from modalities.speech import TextToSpeech

        tts = TextToSpeech.from_pretrained(self.models.tts, draft=self.models.tts_draft,
                                           device=self.device, head=self.models.tts_head)
        tts("a red circle", method="plain", seed=0, progress=False, max_frames=8)
        return tts

    # 2. The three calls.
    def text_to_image(self, caption: str, methods, seed: int = 0):
        """(gallery of (image, method), table rows) for a caption."""
        from modalities import shapes_world as sw

        if not caption or not caption.strip():
            raise ValueError("caption: accepted a non-empty text")
        pipe, rows, gallery = self._pipe("t2i"), [], []
        for method in ["plain", *methods]:
            out = pipe(caption.strip(), method=method, seed=int(seed), progress=False)
            try:
                quality = "matches" if sw.matches(out.images[0], caption) else "does not match"
            except ValueError:                  # a caption outside the shapes-world grammar
                quality = "n/a"
            rows.append(_row(method, out, quality))
            gallery.append((out.images[0].resize((256, 256), 0), method))
        return gallery, _table(rows)

    def answer(self, image, question: str, methods):
        """Table rows with each method's answer (greedy) to a question about an image."""
        from recipes.train.vlm import spaced

        if image is None:
            raise ValueError("image: accepted an image")
        if not question or not question.strip():
            raise ValueError("question: accepted a non-empty text")
        gen = self._pipe("vlm")
        text = spaced(question) if self.models.bundled("vlm") else question.strip()
        msgs = [[{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]]
        rows, answers = [], []
        for method in ["plain", *methods]:
            out = gen.generate([image], msgs, method=method, temperature=0, max_new_tokens=24)
            answers.append(out.texts[0].strip())
            same = "same as plain" if answers[-1] == answers[0] else "differs from plain"
            rows.append(_row(method, out, same))
        return [cells + [a] for cells, a in zip(_table(rows), answers)]

    def speak(self, text: str, methods, seed: int = 0):
        """({method: (sample rate, int16 samples)}, table rows) for a sentence."""
        from modalities.speech.metrics import mel_cepstral_distortion

        if not text or not text.strip():
            raise ValueError("text: accepted a non-empty text")
        tts, rows, audio = self._pipe("tts"), [], {}
        ref = _espeak(text) if self.models.bundled("tts") else None
        for method in ["plain", *methods]:
            out = tts(text.strip(), method=method, seed=int(seed), progress=False,
                      **TTS_METHODS.get(method, {}))
            wave = out.waveforms[0]
            mcd = "n/a" if ref is None else f"{mel_cepstral_distortion(wave, ref):.2f} dB MCD"
            rows.append(_row(method, out, mcd))
            audio[method] = (out.sample_rate, (np.clip(wave, -1, 1) * 32767).astype(np.int16))
        return audio, _table(rows)


def _espeak(text: str):
    """espeak-ng's rendering of the text, the bundled TTS's reference (None without it)."""
    if shutil.which("espeak-ng") is None:
        return None
    from recipes.train.speech_data import reference

    return reference(f"us {text.strip()}")


# 3. The page.
def _guarded(fn):
    """Bad input as the page's error message, not a traceback in the server's log."""
    import functools

    import gradio as gr

    @functools.wraps(fn)
    def call(*args):
        try:
            return fn(*args)
        except ValueError as e:
            raise gr.Error(str(e)) from None
    return call


def _image_tab(gr, demo: Demo) -> None:
    caption = gr.Textbox(label="Caption", value="a large red circle at the top left",
                         elem_id="t2i-caption")
    with gr.Row():
        methods = gr.CheckboxGroup(list(T2I_METHODS), value=["exact", "sjd"], label="Methods")
        seed = gr.Number(value=0, precision=0, minimum=0, label="Seed")
    go = gr.Button("Generate", variant="primary", elem_id="t2i-run")
    gallery = gr.Gallery(label="plain decoding, then each method (same seed)", columns=6,
                         elem_id="t2i-images")
    table = gr.Dataframe(headers=COLUMNS, label="Results", elem_id="t2i-table")
    go.click(_guarded(demo.text_to_image), [caption, methods, seed], [gallery, table])


def _vlm_tab(gr, demo: Demo, example) -> None:
    with gr.Row():
        image = gr.Image(value=example, type="pil", label="Image", elem_id="vlm-image")
        with gr.Column():
            question = gr.Textbox(label="Question", value="what shape is at the right?",
                                  elem_id="vlm-question")
            methods = gr.CheckboxGroup(list(VLM_METHODS), value=list(VLM_METHODS),
                                       label="Methods")
            go = gr.Button("Answer", variant="primary", elem_id="vlm-run")
    table = gr.Dataframe(headers=COLUMNS + ["answer"], label="Answers (greedy)",
                         elem_id="vlm-table")
    go.click(_guarded(demo.answer), [image, question, methods], table)


def _tts_tab(gr, demo: Demo) -> None:
    text = gr.Textbox(label="Sentence", value="a small blue star at the bottom",
                      elem_id="tts-text")
    with gr.Row():
        methods = gr.CheckboxGroup(list(TTS_METHODS), value=list(TTS_METHODS), label="Methods")
        seed = gr.Number(value=0, precision=0, minimum=0, label="Seed")
    go = gr.Button("Speak", variant="primary", elem_id="tts-run")
    with gr.Row():
        players = [gr.Audio(label=m, elem_id=f"tts-{m}") for m in ["plain", *TTS_METHODS]]
    table = gr.Dataframe(headers=COLUMNS, label="Results", elem_id="tts-table")

    def speak(text, methods, seed):
        audio, rows = demo.speak(text, methods, seed)
        return [audio.get(m) for m in ["plain", *TTS_METHODS]] + [rows]
    go.click(_guarded(speak), [text, methods, seed], [*players, table])


def build_app(demo: Demo):
    """The gradio page over ``demo``: one tab per modality."""
    import gradio as gr

    from modalities import shapes_world as sw

    with gr.Blocks(title="mmspec") as app:
        gr.Markdown("# mmspec: speculative decoding, side by side with plain decoding\n"
                    "Tokens per step and acceptance come from the method's run; the speedup is "
                    "plain decoding's seconds over the method's, measured in this call.")
        with gr.Tab("Text to image", elem_id="tab-t2i"):
            _image_tab(gr, demo)
        with gr.Tab("Question about an image", elem_id="tab-vlm"):
            _vlm_tab(gr, demo, sw.sample(20_000_001)[1].resize((256, 256), 0))
        with gr.Tab("Text to speech", elem_id="tab-tts"):
            _tts_tab(gr, demo)
    return app


# 4. The command line.
def build_parser():
    ap = Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1",
                    help="address to listen on (0.0.0.0 opens it to the network)")
    ap.add_argument("--port", type=Number(int, 1, 65535), default=7860)
    defaults = Models()
    for kind, what in (("t2i", "text-to-image"), ("vlm", "vision-language"), ("tts", "speech")):
        name = os.path.basename(getattr(defaults, kind))
        ap.add_argument(f"--{kind}-model", default=None,
                        help=f"{what} folder or id (default: the bundled {name})")
        ap.add_argument(f"--{kind}-draft", default=None,
                        help="its draft (default: the bundled draft with the bundled model, "
                             "else none)")
        ap.add_argument(f"--{kind}-head", default=None,
                        help="its draft head (default: the bundled head with the bundled "
                             "model, else none)")
    add_common(ap)
    return describe(ap)


def models_from(args) -> Models:
    """The models the flags name; a model given without its draft (or head) runs without one."""
    kw = {}
    for kind in ("t2i", "vlm", "tts"):
        model, draft = getattr(args, f"{kind}_model"), getattr(args, f"{kind}_draft")
        head = getattr(args, f"{kind}_head", None)
        if model is not None:
            kw[kind], kw[f"{kind}_draft"], kw[f"{kind}_head"] = model, draft, head
        else:
            if draft is not None:
                kw[f"{kind}_draft"] = draft
            if head is not None:
                kw[f"{kind}_head"] = head
    return Models(**kw)


def check_models(models: Models) -> None:
    """Every model and draft folder holds a config and every head folder is a head mmspec
    reads, checked before the server starts (a Hugging Face id, ``name`` or ``org/name`` that
    is no folder here, is left to the first load); one line naming the flag."""
    from recipes.cli import check_head

    for kind in MODALITIES:
        for name, flag in ((kind, f"--{kind}-model"), (f"{kind}_draft", f"--{kind}-draft")):
            path = getattr(models, name)
            if path is None:
                continue
            path = os.fspath(path)
            local = path.startswith((".", "/", "~")) or path.count("/") > 1 \
                or os.path.exists(path)
            if local and not os.path.isfile(os.path.join(os.path.expanduser(path),
                                                         "config.json")):
                why = "no such folder" if not os.path.isdir(os.path.expanduser(path)) else \
                    "holds no config.json"
                raise ValueError(f"{flag} {path}: {why}: accepted a model folder holding "
                                 "config.json, or a Hugging Face id (org/name)")
        check_head(getattr(models, f"{kind}_head"), f"--{kind}-head")


def main(argv=None):
    args = build_parser().parse_args(argv)
    models = models_from(args)
    check_models(models)
    app = build_app(Demo(models, device=configure(args)))
    print(f"mmspec web demo on http://{args.host}:{args.port} (Ctrl+C stops it)")
    app.queue().launch(server_name=args.host, server_port=args.port, quiet=not args.verbose)


if __name__ == "__main__":
    run(main, "recipes.serve")
