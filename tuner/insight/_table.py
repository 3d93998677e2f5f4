"""A plain-text table for the terminal (no dependency for a few aligned columns)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["format_table"]


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Columns aligned, numbers right-aligned, a rule under the header."""
    cells = [[str(value) for value in row] for row in rows]
    widths = [max([len(h), *(len(row[i]) for row in cells)]) for i, h in enumerate(headers)]

    def line(values: Sequence[str], raw: Sequence[Any] | None = None) -> str:
        parts = []
        for i, value in enumerate(values):
            numeric = (
                raw is not None and isinstance(raw[i], int | float) and not isinstance(raw[i], bool)
            )
            numeric = numeric or (
                raw is not None and value.replace(",", "").replace(".", "", 1).isdigit()
            )
            parts.append(value.rjust(widths[i]) if numeric else value.ljust(widths[i]))
        return "  ".join(parts).rstrip()

    rule = "  ".join("-" * width for width in widths)
    return "\n".join(
        [line(list(headers)), rule, *(line(c, r) for c, r in zip(cells, rows, strict=True))]
    )
