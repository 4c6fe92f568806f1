"""The examples of README.md and docs/*.md run from a fresh clone as written: the images their
commands name ship in the repository, and the questions they ask are true of those images
(the bundled VLM's shapes world answers them, and the bundled model gives that answer)."""

from __future__ import annotations

import pathlib
import random
import re
import runpy

import numpy as np
import pytest
from PIL import Image

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# `mmspec vlm IMAGE "QUESTION"` and `python -m recipes.vlm IMAGE "QUESTION"`
COMMAND = re.compile(r'(?:mmspec vlm|python -m recipes\.vlm) +(\S+) +"([^"]+)"')
# a Python block's Image.open("IMAGE") and its chat messages' "text": "QUESTION"
OPENED = re.compile(r'Image\.open\("([^"]+)"\)')
TEXT = re.compile(r'"text":\s*"([^"]+)"')


def _examples() -> list[tuple[str, str, str]]:
    """(page, image path, question) of every vision-language example in the docs."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for path, question in COMMAND.findall(text):
            found.append((page.name, path, question))
        for block in re.findall(r"```python\n(.*?)```", text, re.S):
            if "VisionLanguageGenerator" not in block:
                continue
            for path in OPENED.findall(block):
                found += [(page.name, path, question) for question in TEXT.findall(block)]
    return found


EXAMPLES = _examples()


def _scene():
    return runpy.run_path(str(ROOT / "samples" / "make_scene.py"))


def test_the_docs_show_vision_language_examples():
    assert {"README.md", "vlm.md", "cli.md"} <= {page for page, _, _ in EXAMPLES}, EXAMPLES
    for page in PAGES:           # every VLM Python example asks about an image file it names
        for block in re.findall(r"```python\n(.*?)```", page.read_text(), re.S):
            if "VisionLanguageGenerator.from_pretrained" in block:
                assert OPENED.search(block) and TEXT.search(block), f"{page.name}: {block[:200]}"


@pytest.mark.parametrize("page,path,question", EXAMPLES)
def test_every_example_image_ships(page, path, question):
    assert (ROOT / path).is_file(), f"{page}: {path} does not ship (run from the repository root)"


def test_the_shipped_scene_is_the_shapes_world_renderers():
    """samples/scene.png is what samples/make_scene.py renders (same pixels), and small."""
    ns = _scene()
    scene, image, caption = ns["render"]()
    shipped = Image.open(ROOT / "samples" / "scene.png")
    assert shipped.size == (64, 64) and shipped.mode == "RGB"
    assert (np.asarray(shipped) == np.asarray(image)).all()
    assert (ROOT / "samples" / "scene.png").stat().st_size < 16_000
    assert "circle" in caption


def _answers() -> dict[str, str]:
    """Every question the shapes world asks about the shipped scene, with its answer."""
    scene = _scene()["render"]()[0]
    from modalities import shapes_world

    qa = dict(shapes_world.questions(scene, random.Random(0)))
    qa.pop(next(q for q in qa if q.startswith("is there")))    # a random yes/no question
    return qa


@pytest.mark.parametrize("page,path,question", EXAMPLES)
def test_every_example_question_is_true_of_its_image(page, path, question):
    assert path == "samples/scene.png", f"{page}: {path}"
    assert question in _answers(), (f"{page}: {question!r} is not a question about "
                                     f"samples/scene.png's scene: {sorted(_answers())}")


def test_the_bundled_model_answers_the_examples_truly():
    import torch

    from modalities.vlm import VisionLanguageGenerator

    gen = VisionLanguageGenerator.from_pretrained(str(ROOT / "samples/models/shapes-vlm"),
                                                  draft=str(ROOT / "samples/models/shapes-vlm-text-draft"))
    image = Image.open(ROOT / "samples" / "scene.png")
    truth = _answers()
    for question in sorted({q for _, _, q in EXAMPLES}):
        msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]
        with torch.no_grad():
            out = gen.generate(image, msgs, method="exact", max_new_tokens=16, temperature=0)
        assert out.texts[0].strip() == truth[question], (question, out.texts[0])
