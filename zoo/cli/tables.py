"""The one way CLI commands print a table: rich's `Table`, whole values when piped.

Imported inside commands (rich costs ~30 ms), never at `zoo --help` time.
"""

from __future__ import annotations

import sys
from typing import Any, Iterable, Sequence

PIPED_WIDTH = 250  # piped output is not cut to 80 columns: scripts and logs get whole values


def print_table(columns: Sequence[str], rows: Iterable[Sequence[Any]], *, title: str | None = None,
                err: bool = False) -> None:
    """Print `rows` under `columns` (None shows as empty) to stdout, or stderr with `err`."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, show_edge=False, header_style="bold")
    for c in columns:
        table.add_column(c, overflow="fold")
    for r in rows:
        # Text, not str: rich would read "[...]" in a value (stage ids: quantize[mode=int8]) as markup
        table.add_row(*[Text("" if v is None else str(v)) for v in r])
    stream = sys.stderr if err else sys.stdout
    Console(file=stream, width=None if stream.isatty() else PIPED_WIDTH).print(table)
    stream.flush()
