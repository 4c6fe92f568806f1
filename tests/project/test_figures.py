"""Comparison figures: every column is labelled with its method, and no tile is left blank
(the text-to-image recipe's grid, the demo's sheets and the evaluation sweep's comparison)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from PIL import Image

from recipes.figures import GAP, LABEL, sheet

COLOURS = [(200, 30, 30), (30, 160, 40), (30, 60, 220), (230, 210, 20), (140, 40, 190)]


def _images(n, offset=0, size=64):
    return [Image.new("RGB", (size, size), COLOURS[(i + offset) % len(COLOURS)]) for i in range(n)]


def _strip(img, col, w):
    """The label strip above column ``col`` (tiles ``w`` pixels wide)."""
    return np.asarray(img)[:LABEL, col * (w + GAP):col * (w + GAP) + w]


def _tile(img, row, col, w, h=None):
    h = h or w
    y, x = LABEL + row * (h + GAP), col * (w + GAP)
    return np.asarray(img)[y:y + h, x:x + w]


def _labelled(img, ncols, w):
    """Every column's strip has dark (text) pixels."""
    return all((_strip(img, j, w) < 100).any() for j in range(ncols))


def test_the_text_to_image_grid_labels_plain_and_the_method():
    from recipes.text_to_image import grid

    pairs = list(zip(_images(3), _images(3, offset=1)))
    a = grid(pairs, scale=2, labels=("plain", "sjd-maximal"))
    b = grid(pairs, scale=2, labels=("plain", "lantern"))
    w = 128
    assert a.size == (2 * w + GAP, LABEL + 3 * (w + GAP) - GAP)     # the strip is counted
    assert _labelled(a, 2, w)
    assert (_strip(a, 0, w) == _strip(b, 0, w)).all()               # same left label
    assert (_strip(a, 1, w) != _strip(b, 1, w)).any()               # the method's name differs
    for i, (p, m) in enumerate(pairs):                              # tiles are the images
        assert (_tile(a, i, 0, w) == np.asarray(p.resize((w, w)))).all()
        assert (_tile(a, i, 1, w) == np.asarray(m.resize((w, w)))).all()


def test_a_sheet_shows_only_rows_every_column_has():
    cols = {"plain": _images(2), "exact": _images(5, 1), "a method with a very long name": _images(4, 2)}
    img = sheet(cols, 32, rows=4)
    assert img.size == (3 * (32 + GAP) - GAP, LABEL + 2 * (32 + GAP) - GAP)
    assert _labelled(img, 3, 32)
    for j in range(3):
        for i in range(2):
            assert not (_tile(img, i, j, 32) == 255).all(), (i, j)        # no blank tile
    same = sheet([("plain", _images(1)), ("plain", _images(1, 1))], 32)   # names may repeat
    assert same.size[0] == 2 * 32 + GAP
    with pytest.raises(ValueError, match="at least one image"):
        sheet({"plain": []}, 32)


def test_the_demo_comparison_has_no_blank_rows(tmp_path):
    from recipes.demo import _comparison

    images = {"plain": _images(2), "exact": _images(2, 1)}
    _comparison(images, ["a", "b"], str(tmp_path / "c.png"), show=4, scale=1)
    img = Image.open(tmp_path / "c.png")
    assert img.size == (2 * 64 + GAP, LABEL + 2 * (64 + GAP) - GAP)
    assert _labelled(img, 2, 64)


def test_the_sweep_comparison_fills_every_tile_when_batches_are_small(tmp_path):
    """Three prompts in batches of two: the comparison shows all three (it showed the first
    batch's two in a sheet of four rows, half blank)."""
    from eval.results import read_rows
    from eval.sweep import main as sweep_main
    from tiny_image import save_tiny_bundled_pair

    target, draft = save_tiny_bundled_pair(str(tmp_path / "models"))
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a large red circle at the top left\na small blue star at the bottom\n"
                       "a large black cross at the centre\n")
    out = tmp_path / "sweep"
    sweep_main(["--model", target, "--draft", draft, "--prompts", str(prompts), "--methods",
                "plain,exact", "--num-prompts", "3", "--batch", "2", "--seeds", "0", "--out",
                str(out)])
    assert len(read_rows(os.path.join(out, "results.jsonl"))) == 6
    img = Image.open(out / "comparison.png").convert("RGB")
    w = 128
    assert img.size == (2 * w + GAP, LABEL + 3 * (w + GAP) - GAP)
    assert _labelled(img, 2, w)
    for j in range(2):
        for i in range(3):
            assert not (_tile(img, i, j, w) == 255).all(), (i, j)          # no blank tile
