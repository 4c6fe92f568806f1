"""Labelled image sheets: one column per method, its name in a strip above the column.

Used by the text-to-image recipe (``comparison.png``), the demo (``comparison.png``,
``continuous.png``) and the evaluation sweep's image comparison.
"""

from __future__ import annotations

from PIL import Image, ImageDraw, ImageFont

LABEL = 16          # pixels of the label strip above the tiles
GAP = 4             # pixels between tiles


def _fit(draw: ImageDraw.ImageDraw, text: str, font, width: int) -> str:
    """``text``, cut (with "..") to fit ``width`` pixels."""
    if draw.textlength(text, font=font) <= width:
        return text
    while text and draw.textlength(text + "..", font=font) > width:
        text = text[:-1]
    return text + ".."


def sheet(columns, size, rows: int | None = None) -> Image.Image:
    """Columns side by side, each under a white strip of ``LABEL`` pixels naming its method.

    ``columns``: {name: images} or [(name, images)] (names may repeat); ``size``: a tile's
    width and height in pixels (an int for square tiles); ``rows``: the images shown per
    column (default and at most: the shortest column's count, so no tile is left blank).
    Images are resized to the tile with nearest-neighbour sampling."""
    cols = list(columns.items()) if isinstance(columns, dict) else list(columns)
    if not cols or any(len(ims) == 0 for _, ims in cols):
        raise ValueError("sheet needs at least one image in every column")
    w, h = (size, size) if isinstance(size, int) else size
    n = min(len(ims) for _, ims in cols)
    n = n if rows is None else max(1, min(rows, n))
    out = Image.new("RGB", (len(cols) * (w + GAP) - GAP, LABEL + n * (h + GAP) - GAP), "white")
    draw = ImageDraw.Draw(out)
    font = ImageFont.load_default(size=11)
    for j, (name, ims) in enumerate(cols):
        x = j * (w + GAP)
        draw.text((x + 2, 2), _fit(draw, str(name), font, w - 4), fill="black", font=font)
        for i, im in enumerate(ims[:n]):
            out.paste(im.convert("RGB").resize((w, h), Image.NEAREST), (x, LABEL + i * (h + GAP)))
    return out
