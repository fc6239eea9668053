"""Showing a run: a live rich table on a terminal, plain lines otherwise, nothing with --json."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from zoo.engine.runner import StageReport, StageState

_STYLE = {StageState.WAITING: "dim", StageState.RUNNING: "yellow", StageState.CACHED: "cyan", StageState.RAN: "green",
          StageState.FAILED: "bold red", StageState.SKIPPED: "dim"}


def _reason_text(report: StageReport) -> str:
    return "; ".join(str(r) for r in report.reasons)


class PlainProgress:
    """One line per state change, for logs and pipes."""

    def __init__(self, stream: TextIO | None = None):
        self.stream = stream or sys.stdout

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, report: StageReport) -> None:
        if report.state == StageState.RUNNING:
            line = f"[zoo] {report.id}: running ({_reason_text(report)})"
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
        print(line, file=self.stream, flush=True)


class RichProgress:
    """A live table, one line per stage: waiting / running with elapsed time / cached / done / failed."""

    def __init__(self, stage_ids: list[str], kinds: dict[str, str]):
        from rich.console import Console
        from rich.live import Live

        self.console = Console(stderr=False)
        self.order = stage_ids
        self.kinds = kinds
        self.reports: dict[str, StageReport] = {}
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

    def _render(self):
        from rich.table import Table

        table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
        table.add_column("stage")
        table.add_column("kind", style="dim")
        table.add_column("state")
        table.add_column("time", justify="right")
        table.add_column("why")
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
            if r and state == StageState.FAILED:
                why = r.error.message[:80] if r.error else ""
            table.add_row(sid, self.kinds.get(sid, ""), f"[{_STYLE.get(state, '')}]{state}[/]", elapsed, why)
        return table


class NullProgress:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, report: StageReport) -> None:
        pass
