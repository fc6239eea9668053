"""The one way CLI commands print a table: rich's `Table`, fitted to the width, whole values when piped.

A table fits the output's width (`width()`): $COLUMNS when set, else the terminal's width, else
`PIPED_WIDTH` (piped output is not cut to 80 columns: scripts and logs get whole values). Columns
that must never be split across lines (numbers, names, digests) are `Col(..., wrap=False)`; when
the table would not fit, columns marked `drop` are left out, the highest `drop` first, and with
`key=` their values are listed below the table, one line per row, so nothing is lost.

Imported inside commands (rich costs ~30 ms), never at `zoo --help` time.
"""

from __future__ import annotations

import os
import sys
import textwrap
from dataclasses import dataclass
from typing import Any, Iterable, Literal, Sequence, TextIO

PIPED_WIDTH = 250  # piped output is not cut to 80 columns: scripts and logs get whole values


@dataclass(frozen=True)
class Col:
    """A column: its header, alignment, whether its cells may wrap, and when it may be left out."""

    header: str
    align: Literal["left", "right"] = "left"
    wrap: bool = True  # False: a cell is never split across lines (numbers, names, digests)
    drop: int = 0  # 0: always shown; otherwise left out when the table does not fit, highest first


def width(stream: TextIO | None = None) -> int:
    """The columns output may use: $COLUMNS, else the terminal's width, else PIPED_WIDTH."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    stream = stream or sys.stdout
    try:
        if stream.isatty():
            return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        pass
    return PIPED_WIDTH


def print_table(columns: Sequence[str | Col], rows: Iterable[Sequence[Any]], *, title: str | None = None,
                err: bool = False, compact: bool = False, key: int | None = None) -> list[str]:
    """Print `rows` under `columns` (None shows as empty) to stdout, or stderr with `err`.

    `compact`: no rules, two spaces between columns (the run summary's style); else columns are
    separated by "│". `key`: the column naming each row in the list of left-out values printed
    below the table. Returns the headers of the columns left out to fit the width.
    """
    from rich.console import Console

    cols = [c if isinstance(c, Col) else Col(c) for c in columns]
    rows = [["" if v is None else str(v) for v in r] for r in rows]
    stream = sys.stderr if err else sys.stdout
    available = width(stream)
    console = Console(file=stream, width=available)
    shown = list(range(len(cols)))
    table = _table(cols, rows, shown, title, compact)
    while _needed(console, table) > available:
        droppable = [i for i in shown if cols[i].drop]
        if not droppable:
            break
        shown.remove(max(droppable, key=lambda i: (cols[i].drop, i)))
        table = _table(cols, rows, shown, title, compact)
    with console.capture() as captured:
        console.print(table)
    lines = [line.rstrip() for line in captured.get().splitlines()]  # no padding after the last column
    left_out = [i for i in range(len(cols)) if i not in shown]
    if key is not None and left_out:
        for row in rows:
            text = f"{row[key]}: " + "; ".join(f"{cols[i].header} {row[i] or '-'}" for i in left_out)
            lines += textwrap.wrap(text, width=available, initial_indent="  ", subsequent_indent="    ",
                                   break_on_hyphens=False) or [""]
    print("\n".join(lines), file=stream, flush=True)
    return [cols[i].header for i in left_out]


def _table(cols: list[Col], rows: list[list[str]], shown: list[int], title: str | None, compact: bool):
    from rich.cells import cell_len
    from rich.table import Table
    from rich.text import Text

    if compact:
        table = Table(title=title, box=None, header_style="bold", pad_edge=False, padding=(0, 1))
    else:
        table = Table(title=title, show_edge=False, header_style="bold")
    for i in shown:
        c = cols[i]
        # rich measures a cell by its longest word: a cell that must stay whole needs its full width
        whole = None if c.wrap else max([cell_len(c.header)] + [cell_len(r[i]) for r in rows])
        table.add_column(c.header, justify=c.align, no_wrap=not c.wrap, min_width=whole,
                         overflow="fold" if c.wrap else "ellipsis")
    for r in rows:
        # Text, not str: rich would read "[...]" in a value (stage ids: quantize[mode=int8]) as markup
        table.add_row(*[Text(r[i]) for i in shown])
    return table


def _needed(console, table) -> int:
    """The narrowest the table can be laid out without splitting a `wrap=False` cell."""
    from rich.measure import Measurement

    return Measurement.get(console, console.options.update_width(1 << 20), table).minimum
