"""Question lines: the VLM prompt format the package ships (``samples/prompts/*.tsv``), read
by the evaluation sweep and the draft-head recipe.

    IMAGE<TAB>QUESTION[<TAB>ANSWER]      IMAGE: a shapes-world scene seed or an image file
"""

from __future__ import annotations

import os
from dataclasses import dataclass

FORMAT = "IMAGE<TAB>QUESTION[<TAB>ANSWER]"


@dataclass(frozen=True)
class Question:
    """One line: its image (a seed or a path), the question, and the answer when given."""

    image: str
    text: str
    answer: str | None = None

    @classmethod
    def parse(cls, line: str) -> "Question":
        """The line's fields; ValueError naming the format for a line without two or three
        of them or with a blank question."""
        parts = line.split("\t")
        if len(parts) not in (2, 3) or not parts[1].strip():
            raise ValueError(f"accepted {FORMAT} (IMAGE a shapes-world seed or an image file)")
        return cls(parts[0].strip(), parts[1].strip(), parts[2] if len(parts) == 3 else None)

    def check_image(self) -> None:
        """ValueError unless the image is a seed or an existing file (no image is read)."""
        if not (self.image.isdigit() or os.path.isfile(self.image)):
            raise ValueError(f"image {self.image!r}: accepted a shapes-world seed or an existing "
                             "image file")

    def picture(self):
        """The image: the shapes-world scene of its seed, or the file's (RGB)."""
        if self.image.isdigit():
            from modalities import shapes_world as sw

            return sw.sample(int(self.image))[1]
        from PIL import Image

        return Image.open(self.image).convert("RGB")

    def messages(self) -> list:
        """The question as one user turn with the image before it."""
        return [{"role": "user", "content": [{"type": "image"},
                                             {"type": "text", "text": self.text}]}]
