"""The shapes world: procedural 64x64 scenes with captions, questions and a parser.

One to three objects (circle, square, triangle, star, cross) in eight saturated colours and two
sizes, each in its own cell of a 3x3 grid, over textured backgrounds (noise, gradients,
stripes) in muted colours, so that VQ token distributions are flat like real images' rather
than near-deterministic. Everything is seeded and deterministic: ``sample_scene(rng)`` and
``render(scene, rng)`` with ``random.Random`` objects.

``caption(scene)`` -> "a large red circle at the top left and a small blue star at the bottom"
``questions(scene, rng)`` -> question-answer pairs for vision-language models.
``parse(image)`` -> the objects it sees (shape, colour, size, cell); on rendered scenes it is
right at least 98% of the time (tests/modalities/test_shapes_world.py), so it scores generated images:
``compositional_accuracy`` = fraction of images whose parse matches their caption.
"""

from __future__ import annotations

import colorsys
import math
import random
import re
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

SIZE = 64
CELLS = 3
CELL = SIZE / CELLS
SHAPES = ("circle", "square", "triangle", "star", "cross")
COLOURS = {
    "red": (220, 30, 30), "green": (30, 170, 40), "blue": (30, 60, 225),
    "yellow": (235, 215, 20), "purple": (150, 40, 200), "orange": (245, 130, 15),
    "white": (250, 250, 250), "black": (10, 10, 10),
}
SIZES = {"small": 11, "large": 19}
ROWS = ("top", "middle", "bottom")
COLS = ("left", "centre", "right")


def position_name(cell: int) -> str:
    r, c = divmod(cell, CELLS)
    if r == 1:
        return COLS[c] if c != 1 else "centre"
    return ROWS[r] if c == 1 else f"{ROWS[r]} {COLS[c]}"


POSITIONS = {position_name(i): i for i in range(CELLS * CELLS)}


@dataclass(frozen=True, order=True)
class Obj:
    cell: int
    shape: str
    colour: str
    size: str

    def phrase(self) -> str:
        return f"a {self.size} {self.colour} {self.shape} at the {position_name(self.cell)}"


@dataclass(frozen=True)
class Scene:
    objects: tuple[Obj, ...]   # sorted by cell (raster order)


def sample_scene(rng: random.Random, max_objects: int = 3) -> Scene:
    n = rng.randint(1, max_objects)
    cells = sorted(rng.sample(range(CELLS * CELLS), n))
    objs = tuple(Obj(c, rng.choice(SHAPES), rng.choice(list(COLOURS)), rng.choice(list(SIZES)))
                 for c in cells)
    return Scene(objs)


def caption(scene: Scene) -> str:
    return " and ".join(o.phrase() for o in scene.objects)


_PHRASE = re.compile(r"a (small|large) (\w+) (\w+) at the ([a-z ]+?)(?= and a |$)")


def parse_caption(text: str) -> Scene:
    """Inverse of ``caption`` (raises ValueError on text outside the grammar)."""
    objs = []
    for size, colour, shape, where in _PHRASE.findall(text.strip()):
        if colour not in COLOURS or shape not in SHAPES or where not in POSITIONS:
            raise ValueError(f"not a shapes-world caption: {text!r}")
        objs.append(Obj(POSITIONS[where], shape, colour, size))
    if not objs:
        raise ValueError(f"not a shapes-world caption: {text!r}")
    return Scene(tuple(sorted(objs)))


# -- rendering -------------------------------------------------------------------------------

def _muted(rng: random.Random) -> tuple[int, int, int]:
    h, s, v = rng.random(), rng.uniform(0.0, 0.25), rng.uniform(0.42, 0.68)
    return tuple(int(255 * x) for x in colorsys.hsv_to_rgb(h, s, v))


def background(rng: random.Random) -> np.ndarray:
    kind = rng.choice(("noise", "gradient", "stripes"))
    a, b = np.array(_muted(rng), float), np.array(_muted(rng), float)
    yy, xx = np.mgrid[0:SIZE, 0:SIZE].astype(float)
    if kind == "noise":
        img = np.broadcast_to(a, (SIZE, SIZE, 3)).copy()
    elif kind == "gradient":
        ang = rng.uniform(0, 2 * math.pi)
        t = (np.cos(ang) * xx + np.sin(ang) * yy)
        t = (t - t.min()) / (t.max() - t.min() + 1e-9)
        img = a + (b - a) * t[..., None]
    else:
        width = rng.randint(3, 8)
        d = rng.choice((xx, yy, xx + yy, xx - yy))
        img = np.where(((d // width) % 2 == 0)[..., None], a, b)
    nrng = np.random.default_rng(rng.randrange(2**32))
    img = img + nrng.normal(0, 9, img.shape)
    return np.clip(img, 0, 255)


def shape_polygon(shape: str, cx: float, cy: float, s: float):
    r = s / 2
    if shape == "triangle":
        return [(cx, cy - r), (cx + r, cy + r), (cx - r, cy + r)]
    if shape == "star":
        pts = []
        for i in range(10):
            ang = -math.pi / 2 + i * math.pi / 5
            rad = r if i % 2 == 0 else r * 0.45
            pts.append((cx + rad * math.cos(ang), cy + rad * math.sin(ang)))
        return pts
    raise ValueError(shape)


def draw_shape(draw: ImageDraw.ImageDraw, shape: str, cx: float, cy: float, s: float, fill) -> None:
    r = s / 2
    if shape == "circle":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill)
    elif shape == "square":
        draw.rectangle([cx - r, cy - r, cx + r, cy + r], fill=fill)
    elif shape == "cross":
        w = s / 6
        draw.rectangle([cx - w, cy - r, cx + w, cy + r], fill=fill)
        draw.rectangle([cx - r, cy - w, cx + r, cy + w], fill=fill)
    else:
        draw.polygon(shape_polygon(shape, cx, cy, s), fill=fill)


def render(scene: Scene, rng: random.Random) -> Image.Image:
    img = Image.fromarray(background(rng).astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(img)
    for o in scene.objects:
        r, c = divmod(o.cell, CELLS)
        cx = (c + 0.5) * CELL + rng.uniform(-1.5, 1.5)
        cy = (r + 0.5) * CELL + rng.uniform(-1.5, 1.5)
        draw_shape(draw, o.shape, cx, cy, SIZES[o.size], COLOURS[o.colour])
    return img


def sample(seed: int) -> tuple[Scene, Image.Image, str]:
    """The scene, image and caption of one seed."""
    rng = random.Random(seed)
    scene = sample_scene(rng)
    return scene, render(scene, rng), caption(scene)


# -- questions ---------------------------------------------------------------------------------

def questions(scene: Scene, rng: random.Random) -> list[tuple[str, str]]:
    """Question-answer pairs about one scene (answers are single words or the caption)."""
    objs = scene.objects
    qa = [("how many objects are there?", str(len(objs))),
          ("describe the image.", caption(scene))]
    for o in objs:
        where = position_name(o.cell)
        qa.append((f"what shape is at the {where}?", o.shape))
        qa.append((f"what colour is the object at the {where}?", o.colour))
        qa.append((f"what size is the object at the {where}?", o.size))
        if sum(p.shape == o.shape and p.colour == o.colour for p in objs) == 1:
            qa.append((f"where is the {o.colour} {o.shape}?", where))
    shape, colour = rng.choice(SHAPES), rng.choice(list(COLOURS))
    present = any(o.shape == shape and o.colour == colour for o in objs)
    qa.append((f"is there a {colour} {shape}?", "yes" if present else "no"))
    return qa


# -- parsing -----------------------------------------------------------------------------------

_PALETTE = np.array(list(COLOURS.values()), float)
_NAMES = list(COLOURS)


def _cell_box(cell: int) -> tuple[int, int, int, int]:
    r, c = divmod(cell, CELLS)
    return (int(round(r * CELL)), int(round((r + 1) * CELL)),
            int(round(c * CELL)), int(round((c + 1) * CELL)))


_OFFSETS = np.arange(-1.5, 1.51, 0.5)
_CELL_TEMPLATES: dict[int, tuple[np.ndarray, list]] = {}


def _templates(cell: int) -> tuple[np.ndarray, list]:
    """Every (shape, size, jitter) rendered in one cell's box: masks [T, h, w] and labels."""
    if cell not in _CELL_TEMPLATES:
        y0, y1, x0, x1 = _cell_box(cell)
        r, c = divmod(cell, CELLS)
        masks, labels = [], []
        for shape in SHAPES:
            for size, px in SIZES.items():
                for dy in _OFFSETS:
                    for dx in _OFFSETS:
                        img = Image.new("L", (SIZE, SIZE), 0)
                        draw_shape(ImageDraw.Draw(img), shape, (c + 0.5) * CELL + dx,
                                   (r + 0.5) * CELL + dy, px, 255)
                        masks.append(np.array(img)[y0:y1, x0:x1] > 127)
                        labels.append((shape, size))
        _CELL_TEMPLATES[cell] = (np.stack(masks), labels)
    return _CELL_TEMPLATES[cell]


def _classify(cell: int, mask: np.ndarray) -> tuple[str, str]:
    """The (shape, size) whose rendering best overlaps the mask (IoU over jitters)."""
    masks, labels = _templates(cell)
    inter = (masks & mask).sum((1, 2))
    union = (masks | mask).sum((1, 2))
    return labels[int(np.argmax(inter / np.maximum(union, 1)))]


def parse(image) -> Scene:
    """Read the objects back from a 64x64 image (PIL or [H, W, 3] uint8 array)."""
    arr = np.asarray(image.convert("RGB") if hasattr(image, "convert") else image, float)
    if arr.shape[:2] != (SIZE, SIZE):
        arr = np.asarray(Image.fromarray(arr.astype(np.uint8)).resize((SIZE, SIZE), Image.BILINEAR), float)
    d = np.sqrt(((arr[:, :, None, :] - _PALETTE[None, None]) ** 2).sum(-1))     # [H, W, 8]
    label = d.argmin(-1)
    close = d.min(-1) < 70
    objs = []
    for cell in range(CELLS * CELLS):
        y0, y1, x0, x1 = _cell_box(cell)
        lab, ok = label[y0:y1, x0:x1], close[y0:y1, x0:x1]
        counts = np.bincount(lab[ok], minlength=len(_NAMES))
        k = int(counts.argmax())
        if counts[k] < 25:
            continue
        shape, size = _classify(cell, ok & (lab == k))
        objs.append(Obj(cell, shape, _NAMES[k], size))
    return Scene(tuple(objs))


def matches(image, text_or_scene) -> bool:
    want = parse_caption(text_or_scene) if isinstance(text_or_scene, str) else text_or_scene
    return parse(image) == want


def compositional_accuracy(images, captions) -> float:
    """Fraction of images whose parse equals their caption's scene."""
    if len(images) != len(captions) or not images:
        raise ValueError("images and captions must be non-empty lists of the same length")
    return sum(matches(im, c) for im, c in zip(images, captions)) / len(images)
