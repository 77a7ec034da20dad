"""Printing helpers shared by the subcommands: tables and progress bars."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from specdec_rs.measure.tables import fmt

__all__ = ["fmt", "progress_bars", "table"]


def table(title: str, header: Sequence[str], rows: Sequence[Sequence[str]]) -> Table:
    t = Table(title=title)
    for i, col in enumerate(header):
        t.add_column(col, justify="left" if i == 0 else "right")
    for row in rows:
        t.add_row(*row)
    return t


@contextmanager
def progress_bars(console: Console) -> Iterator[Callable[[str, int], Callable[[], None]]]:
    """A `measure` progress callback drawing rich bars (gone when done)."""
    with Progress(console=console, transient=True) as bars:

        def start(description: str, total: int) -> Callable[[], None]:
            task = bars.add_task(description, total=total)
            return lambda: bars.advance(task)

        yield start
