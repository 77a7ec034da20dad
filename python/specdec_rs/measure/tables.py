"""Numbers and Markdown tables for reports: one home for both."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def fmt(x: Any, spec: str) -> str:
    """A number for a table; "-" for an undefined one (None or NaN)."""
    if x is None or (isinstance(x, float) and x != x):
        return "-"
    return format(x, spec)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]], align: str = "") -> str:
    """A Markdown table; `align` gives one of "l"/"r" per column (default: all right
    but the first)."""
    align = align or "l" + "r" * (len(header) - 1)
    rule = ["---" if a == "l" else "---:" for a in align]
    lines = [f"| {' | '.join(header)} |", f"|{'|'.join(rule)}|"]
    lines += [f"| {' | '.join(row)} |" for row in rows]
    return "\n".join(lines)
