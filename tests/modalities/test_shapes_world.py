"""The shapes world: deterministic rendering, captions that parse back, and a parser that is
right on at least 98% of rendered scenes."""

from __future__ import annotations

import random

import numpy as np
import pytest

from modalities import shapes_world as sw


def test_rendering_is_deterministic_and_64x64():
    a, b = sw.sample(7), sw.sample(7)
    assert a[0] == b[0] and a[2] == b[2]
    assert np.array_equal(np.asarray(a[1]), np.asarray(b[1]))
    assert a[1].size == (64, 64) and a[1].mode == "RGB"


def test_parser_accuracy_on_rendered_scenes():
    n = 400
    right = sum(sw.parse(img) == scene for scene, img, _ in (sw.sample(10_000 + s) for s in range(n)))
    assert right / n >= 0.98


def test_captions_round_trip_and_score():
    scene, img, cap = sw.sample(3)
    assert sw.parse_caption(cap) == scene
    assert sw.compositional_accuracy([img], [cap]) == 1.0
    other = sw.sample(4)[2]
    assert sw.compositional_accuracy([img, img], [cap, other]) == (0.5 if other != cap else 1.0)
    with pytest.raises(ValueError, match="not a shapes-world caption"):
        sw.parse_caption("a huge teal blob at the corner")


def test_backgrounds_are_textured_not_flat():
    img = np.asarray(sw.render(sw.Scene(()), random.Random(0)), float)
    assert img.std() > 3     # noise at least: VQ tokens of backgrounds are not one id


def test_questions_answer_from_the_scene():
    scene = sw.Scene((sw.Obj(0, "circle", "red", "large"), sw.Obj(8, "star", "blue", "small")))
    qa = dict(sw.questions(scene, random.Random(0)))
    assert qa["how many objects are there?"] == "2"
    assert qa["what shape is at the top left?"] == "circle"
    assert qa["what colour is the object at the bottom right?"] == "blue"
    assert qa["where is the blue star?"] == "bottom right"
    assert qa["describe the image."] == sw.caption(scene)
