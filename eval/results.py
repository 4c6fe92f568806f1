"""The sweep's results file: JSON lines, one row per prompt and unit, read by the sweep
(resuming) and the report."""

from __future__ import annotations

import json
import os


def read_rows(path: str) -> list[dict]:
    rows = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError:      # a line cut by an interruption
                        pass
    return rows
