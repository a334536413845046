"""Where the shared public measurements live: $ITERCAST_DATA, else ../shared/data beside the repo."""

from __future__ import annotations

import os
from pathlib import Path


def shared_data_dir() -> Path | None:
    """The data folder if present, else None (callers skip cleanly)."""
    env = os.environ.get("ITERCAST_DATA")
    candidates = [Path(env)] if env else []
    candidates.append(Path(__file__).resolve().parents[2] / "shared" / "data")
    candidates.append(Path.cwd().parent / "shared" / "data")
    return next((p for p in candidates if p.is_dir()), None)


def read_csv_rows(path: Path) -> list[dict[str, str]]:
    """Rows of a CSV whose leading '#' lines are comments (the shared data's convention)."""
    import csv

    with path.open(newline="") as fh:
        return list(csv.DictReader(line for line in fh if not line.startswith("#")))
