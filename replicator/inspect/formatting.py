"""Text the read side prints: times in UTC to the second, and tables with aligned columns.

`replicator status`, `replicator audit` and the demo all print tables of times; writing them one
way keeps their outputs alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime


def format_time(moment: datetime) -> str:
    """UTC, to the second: `2026-01-31 12:00:05Z`."""
    utc = moment.astimezone(UTC) if moment.tzinfo is not None else moment
    return utc.strftime("%Y-%m-%d %H:%M:%SZ")


def align_columns(rows: Sequence[Sequence[str]], *, numeric: Iterable[int] = ()) -> list[str]:
    """Rows of cells as lines with aligned columns; `numeric` columns are right-aligned."""
    right = set(numeric)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        lines.append("  ".join(cells).rstrip())
    return lines
