"""Printing helpers shared by the subcommands: tables and progress bars."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import IO

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from specdec_rs.measure.tables import fmt

__all__ = ["fmt", "make_console", "progress_bars", "table"]

PIPE_WIDTH = 1000  # columns when stdout is no terminal: tables keep their natural width


def make_console(file: IO[str] | None = None) -> Console:
    """The command's console. On a terminal rich fits its width; into a pipe
    or a file (no terminal, no $COLUMNS) rich would cut every line at 80
    columns, names in tables included ("transformers.genera…"), so lines
    there are as long as their text."""
    console = Console(file=file)
    if console.is_terminal or "COLUMNS" in os.environ:
        return console
    return Console(file=file, width=PIPE_WIDTH)


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
