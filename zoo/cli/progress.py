"""Showing a run: a live rich table on a terminal, plain lines otherwise, nothing with --json.

Both follow each running stage's log (`update` for state changes, `log` for the lines its log
gained: `zoo.api.run`'s `on_log`) and show what it is doing (zoo/cli/activity.py): epoch 3/10 ·
train_loss 0.412 · ETA 0:42, or its latest line. With `verbose` (`zoo run -v`) they also print
each stage's log file when it starts and every line of it as it comes (a custom `entry`'s prints
reach the user this way). What the remote run cache moves (`transfer`: `zoo.api.run`'s
`on_transfer`, from background threads too) is shown as bytes and MB/s per direction: a line
under the table, or plain lines about every 10 s and a total at the end.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Callable, TextIO

from zoo.cli.activity import StageActivity, duration, without_stage_name
from zoo.formatting import size
from zoo.cli.transfer import rate
from zoo.engine.runner import StageReport, StageState

_STYLE = {StageState.WAITING: "dim", StageState.RUNNING: "yellow", StageState.CACHED: "cyan", StageState.RAN: "green",
          StageState.FAILED: "bold red", StageState.SKIPPED: "dim"}

DETAIL_EVERY_S = 10.0  # plain output: at most one progress line per stage this often...
QUIET_S = 60.0  # ...and one at least this often while it runs, even when its log says nothing new


def _reason_text(report: StageReport) -> str:
    return "; ".join(str(r) for r in report.reasons)


def log_note(report: StageReport) -> str:
    """Where a starting stage's log is (`-v`): the file written while it runs, and where it is kept."""
    if report.live_log and report.live_log != report.log_path:
        return f"log {report.live_log} (kept as {report.log_path})"
    return f"log {report.log_path}"


class _Following:
    """The activities of the running stages, on one clock (what both displays share)."""

    def __init__(self, clock: Callable[[], float]):
        self.clock = clock
        self.activities: dict[str, StageActivity] = {}

    def started(self, report: StageReport) -> None:
        self.activities[report.id] = StageActivity(self.clock())

    def feed(self, report: StageReport, lines: list[str]) -> StageActivity:
        activity = self.activities.get(report.id)
        if activity is None:
            activity = self.activities[report.id] = StageActivity(self.clock())
        activity.feed(lines, self.clock())
        return activity


class Transfers:
    """Bytes the remote run cache moved, per direction ("fetched", "pushed"), with the span of
    time they took: from the start of the first object to the end of the last (objects move in
    parallel, so the sum of their times would understate the rate). Thread-safe."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self._lock = threading.Lock()
        self.moved: dict[str, list[float]] = {}  # direction -> [bytes, first start, last end]

    def add(self, direction: str, nbytes: int, seconds: float) -> None:
        now = self.clock()
        with self._lock:
            tally = self.moved.setdefault(direction, [0, now - seconds, now])
            tally[0] += nbytes
            tally[1] = min(tally[1], now - seconds)
            tally[2] = now

    def summary(self, *, final: bool = False) -> str:
        """'fetched 45.0 MB (14.2 MB/s) · pushed 3.0 MB (9.1 MB/s)'; with `final`, each with its time."""
        with self._lock:
            moved = {d: list(t) for d, t in self.moved.items()}
        parts = []
        for direction in sorted(moved):
            nbytes, start, end = moved[direction]
            took = f" in {end - start:.1f}s" if final else ""
            parts.append(f"{direction} {size(nbytes)}{took} ({rate(int(nbytes), end - start)})")
        return " · ".join(parts)


class PlainProgress:
    """One line per state change, for logs and pipes; while a stage runs, a line with what it is
    doing: the first step count (epoch 1/N) as soon as it is logged, then at most one line per
    `every_s` seconds when there is news, and at least one per `quiet_s` seconds."""

    def __init__(self, stream: TextIO | None = None, *, verbose: bool = False, every_s: float = DETAIL_EVERY_S,
                 quiet_s: float = QUIET_S, clock: Callable[[], float] = time.monotonic):
        self.stream = stream or sys.stdout
        self.verbose = verbose
        self.every_s, self.quiet_s = every_s, quiet_s
        self.following = _Following(clock)
        self._last_line: dict[str, float] = {}  # when a line about the stage was last printed
        self._stepped: set[str] = set()  # stages whose step count (epoch i/N) was printed
        self.transfers = Transfers(clock)
        self._transfer_said = float("-inf")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.transfers.moved:
            self._print(f"[zoo] remote cache: {self.transfers.summary(final=True)}")
        return False

    def transfer(self, direction: str, nbytes: int, seconds: float) -> None:
        """An object the remote run cache moved: a line about every `every_s` seconds, a total at the end."""
        self.transfers.add(direction, nbytes, seconds)
        now = self.following.clock()
        if now - self._transfer_said >= self.every_s:
            self._transfer_said = now
            self._print(f"[zoo] remote cache: {self.transfers.summary()}")

    def _print(self, line: str) -> None:
        print(line, file=self.stream, flush=True)

    def update(self, report: StageReport) -> None:
        if report.state == StageState.RUNNING:
            line = f"[zoo] {report.id}: running ({_reason_text(report)})"
            self.following.started(report)
            self._last_line[report.id] = self.following.clock()
        elif report.state == StageState.RAN:
            line = f"[zoo] {report.id}: done in {report.duration_s:.2f}s"
        elif report.state == StageState.CACHED:
            line = f"[zoo] {report.id}: cached"
        elif report.state == StageState.FAILED:
            line = f"[zoo] {report.id}: FAILED after {report.duration_s:.2f}s: {report.error.message if report.error else ''}"
        elif report.state == StageState.SKIPPED:
            line = f"[zoo] {report.id}: not run ({_reason_text(report)})"
        else:
            line = f"[zoo] {report.id}: {report.state} ({_reason_text(report)})"
        self._print(line)
        if report.state == StageState.RUNNING and self.verbose:
            self._print(f"[zoo] {report.id}: {log_note(report)}")

    def log(self, report: StageReport, lines: list[str]) -> None:
        """The lines `report`'s log gained (often none): streamed with `verbose`; a progress line when due."""
        activity = self.following.feed(report, lines)
        if self.verbose:
            for line in lines:
                self._print(f"  {report.id} | {line}")
        if report.state != StageState.RUNNING:
            return  # its last lines: the state line comes next
        now = self.following.clock()
        since = now - self._last_line.get(report.id, now)
        first_step = activity.step is not None and report.id not in self._stepped
        news = activity.changed and (first_step or since >= self.every_s)
        if not news and since < self.quiet_s:
            return
        detail = without_stage_name(activity.detail(now, width=120), report.id)
        if since >= self.quiet_s and not activity.changed:
            elapsed = now - activity.started
            detail = f"running for {duration(elapsed)}" + (f" · {detail}" if detail else "")
        if not detail:
            return
        self._print(f"[zoo] {report.id}: {detail}")
        activity.seen()
        if activity.step is not None:
            self._stepped.add(report.id)
        self._last_line[report.id] = now


class RichProgress:
    """A live table, one line per stage: waiting / running with elapsed time and what it is doing
    (epoch, loss, metric, ETA, or its latest log line) / cached / done / failed."""

    def __init__(self, stage_ids: list[str], kinds: dict[str, str], *, verbose: bool = False, console=None,
                 clock: Callable[[], float] = time.monotonic):
        from rich.console import Console
        from rich.live import Live

        self.console = console or Console(stderr=False)
        self.order = stage_ids
        self.kinds = kinds
        self.verbose = verbose
        self.reports: dict[str, StageReport] = {}
        self.following = _Following(clock)
        self.transfers = Transfers(clock)
        self.live = Live(self._render(), console=self.console, refresh_per_second=8, transient=False,
                         get_renderable=self._render)

    def __enter__(self):
        self.live.__enter__()
        return self

    def __exit__(self, *exc):
        self.live.__exit__(*exc)
        return False

    def update(self, report: StageReport) -> None:
        self.reports[report.id] = report
        if report.state == StageState.RUNNING:
            self.following.started(report)
            if self.verbose:
                self._say(f"{report.id}: {log_note(report)}")

    def log(self, report: StageReport, lines: list[str]) -> None:
        self.following.feed(report, lines)
        if self.verbose:
            for line in lines:
                self._say(f"  {report.id} | {line}")

    def transfer(self, direction: str, nbytes: int, seconds: float) -> None:
        """An object the remote run cache moved: counted in the line under the table."""
        self.transfers.add(direction, nbytes, seconds)

    def _say(self, text: str) -> None:
        """A line above the live table (rich keeps the table at the bottom)."""
        from rich.text import Text

        self.live.console.print(Text(text), highlight=False, soft_wrap=True)

    def _render(self):
        from rich.table import Table
        from rich.text import Text

        table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
        table.add_column("stage")
        table.add_column("kind", style="dim")
        table.add_column("state")
        table.add_column("time", justify="right")
        table.add_column("progress / why", overflow="ellipsis", no_wrap=True)
        now = self.following.clock()
        for sid in self.order:
            r = self.reports.get(sid)
            state = r.state if r else StageState.WAITING
            if r and state == StageState.RUNNING and r.started:
                elapsed = f"{time.time() - r.started:.1f}s"
            elif r and state == StageState.RAN:
                elapsed = f"{r.duration_s:.1f}s"
            else:
                elapsed = ""
            why = _reason_text(r) if r and state != StageState.CACHED else ""
            activity = self.following.activities.get(sid)
            if r and state == StageState.RUNNING and activity is not None:
                why = without_stage_name(activity.detail(now), sid) or why
            if r and state == StageState.FAILED:
                why = r.error.message[:80] if r.error else ""
            # Text: a log line's or reason's brackets are not rich markup
            table.add_row(sid, self.kinds.get(sid, ""), f"[{_STYLE.get(state, '')}]{state}[/]", elapsed, Text(why))
        moved = self.transfers.summary()
        if moved:  # a line of its own under the table (a caption would wrap at the table's width)
            from rich.console import Group

            return Group(table, Text(f"remote cache: {moved}", no_wrap=True, overflow="ellipsis"))
        return table


class NullProgress:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, report: StageReport) -> None:
        pass

    def transfer(self, direction: str, nbytes: int, seconds: float) -> None:
        pass
