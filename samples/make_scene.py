"""Writes samples/scene.png, the scene that the README's and the docs' vision-language examples
ask about: shapes-world seed 31_000_089, rendered by ``modalities.shapes_world`` at 64x64,
"a large purple circle at the top left and a large orange star at the bottom left".

    python samples/make_scene.py          # or: make scene

The same seed always renders the same pixels (tests/frontdoors/test_examples.py checks the file).
"""

from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEED = 31_000_089
PATH = os.path.join(ROOT, "samples", "scene.png")


def render():
    """The scene, its 64x64 image and its caption."""
    sys.path.insert(0, ROOT)
    from modalities import shapes_world

    return shapes_world.sample(SEED)


if __name__ == "__main__":
    scene, image, caption = render()
    image.save(PATH, optimize=True)
    print(f"wrote {os.path.relpath(PATH, ROOT)} ({os.path.getsize(PATH)} bytes): {caption}")
