"""What the benchmark scripts share to write their results: a CSV of dict rows (the tables beside it are each
script's own)."""

from __future__ import annotations

import csv
import os
from collections.abc import Iterable, Sequence


def write_csv(path: str | os.PathLike, rows: Iterable[dict], fieldnames: Sequence[str] | None = None) -> None:
    """``rows`` as a CSV file at ``path`` with a header: the columns ``fieldnames``, or the first row's keys."""
    rows = list(rows)
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]) if fieldnames is None else list(fieldnames))
        writer.writeheader()
        writer.writerows(rows)
