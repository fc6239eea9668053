"""Showing a transfer (push, bundle export/import): a rich bar on a terminal (bytes, total, rate,
ETA), plain lines otherwise (one about every `every_s` seconds and one at the end, with MB/s),
nothing with --json.

    with transfer_display("push lenet-digits@1.0.0 to shared", total, as_json) as advance:
        zoo.push(ref, to, progress=advance)         # advance(n[, total]): n more bytes went through
"""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager
from typing import Callable, Iterator, TextIO

from zoo.formatting import size

EVERY_S = 10.0


def rate(nbytes: int, seconds: float) -> str:
    """MB/s with one decimal (binary megabytes, as `zoo.formatting.size` prints them)."""
    return f"{nbytes / max(seconds, 1e-6) / (1 << 20):.1f} MB/s"


class PlainTransfer:
    """`[zoo] LABEL: 12.0 MB of 45.0 MB (27%), 5.1 MB/s` about every `every_s` seconds, and
    `[zoo] LABEL: 45.0 MB in 3.2s (14.2 MB/s)` at the end."""

    def __init__(self, label: str, total: int | None, stream: TextIO | None = None, *, every_s: float = EVERY_S,
                 clock: Callable[[], float] = time.monotonic):
        self.label, self.total = label, total
        self.stream = stream or sys.stdout
        self.every_s, self.clock = every_s, clock
        self.done = 0
        self.started = self._last = clock()

    def advance(self, n: int, total: int | None = None) -> None:
        """`n` more bytes went through (of `total`, when the transfer knows it only now)."""
        self.done += n
        self.total = total if total is not None else self.total
        now = self.clock()
        if now - self._last >= self.every_s:
            self._last = now
            of = f" of {size(self.total)} ({100 * self.done / self.total:.0f}%)" if self.total else ""
            self._print(f"{size(self.done)}{of}, {rate(self.done, now - self.started)}")

    def finish(self) -> None:
        if self.done == 0:  # nothing moved (a pull of stored files, a push the remote had): nothing to say
            return
        seconds = self.clock() - self.started
        self._print(f"{size(self.done)} in {seconds:.1f}s ({rate(self.done, seconds)})")

    def _print(self, text: str) -> None:
        print(f"[zoo] {self.label}: {text}", file=self.stream, flush=True)


class RichTransfer:
    """A rich progress bar: description, bar, bytes of total, rate, time left."""

    def __init__(self, label: str, total: int | None, console=None, clock: Callable[[], float] | None = None):
        from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                                   TransferSpeedColumn)

        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                                 TransferSpeedColumn(), TimeRemainingColumn(), console=console, transient=False,
                                 get_time=clock)
        self.task = self.progress.add_task(label, total=total)

    def advance(self, n: int, total: int | None = None) -> None:
        if total is not None:
            self.progress.update(self.task, total=total)
        self.progress.advance(self.task, n)

    def start(self) -> None:
        self.progress.start()

    def finish(self) -> None:
        self.progress.stop()


def _terminal(stream: TextIO | None = None) -> bool:
    return (stream or sys.stdout).isatty() and os.environ.get("TERM") != "dumb"


@contextmanager
def transfer_display(label: str, total: int | None, as_json: bool = False, *,
                     stderr: bool = False) -> Iterator[Callable[..., None] | None]:
    """The `advance(n)` callback of the display for this output (None with --json: nothing shown).
    `stderr`: show it there (`zoo pull`, whose stdout is the path a script reads)."""
    if as_json:
        yield None
        return
    if _terminal(sys.stderr if stderr else None):
        from rich.console import Console

        display: "RichTransfer | PlainTransfer" = RichTransfer(label, total, console=Console(stderr=True) if stderr
                                                               else None)
    else:
        display = PlainTransfer(label, total, sys.stderr if stderr else None)
    if isinstance(display, RichTransfer):
        display.start()
    ok = False
    try:
        yield display.advance
        ok = True
    finally:
        if ok or isinstance(display, RichTransfer):
            display.finish()  # a failed plain transfer's error says enough
