"""Ctrl-C as one line: what it stopped, and that nothing was half-published (exit 130).

A command wraps what may be interrupted in `interruptible`, which turns the KeyboardInterrupt
into an `Interrupted` (not a KeyboardInterrupt: typer would swallow that into a silent exit 130);
`zoo.cli.main.main` prints its text as is. The guarantees quoted here are the ones the code keeps: the run cache records a
stage only when it completed (zoo/engine/cache.py) and a run's workspaces go with its lease
(zoo/engine/leases.py; the runner ends the stages' processes first); a remote shows a version
only once its manifest is written, after every blob (zoo/registry/fsremote.py); a pull places a
file only once its sha256 matched (zoo/download.py); a bundle is written to a temporary file
removed on any exception (zoo.files.atomic_output) and imported from a scratch folder
(zoo/registry/bundle.py).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Callable, Iterator

from zoo.cli.activity import duration

if TYPE_CHECKING:  # `zoo --help` imports this module (zoo.cli.main.main): no engine at import
    from zoo.engine.runner import StageReport

RUN_LEFT = ("the run cache records a stage only once it completes, the zoo a version only whole; "
            "the run's temporary files were removed")
PUSH_LEFT = ("the remote shows a version only once its manifest is written, after every blob; "
             "the next push uploads only the blobs still missing")
PULL_LEFT = ("a file is placed only once its sha256 matches; the next pull resumes the partial download")
CACHE_PUSH_LEFT = ("the remote run cache gets an entry only after all its objects, create-exclusive; "
                   "the next push uploads only the objects still missing")
CACHE_PULL_LEFT = ("the local cache records a stage only once all its objects are verified; "
                   "the next pull resumes the partial downloads (the cache's partial/)")
BUNDLE_LEFT = "the bundle is written under a temporary name, renamed only when complete; that file was removed"
BUNDLE_IMPORT_LEFT = ("every byte is verified in a scratch folder, now removed, before a version's blobs are moved "
                      "in and its manifest recorded last")


class Interrupted(Exception):
    """A Ctrl-C with its one line to print (exit 130)."""


def interrupted(what: str, left: str) -> Interrupted:
    """`interrupted: WHAT; nothing was half-published (LEFT)`."""
    return Interrupted(f"interrupted: {what}; nothing was half-published ({left})")


@contextmanager
def interruptible(what: Callable[[], str] | str, left: str) -> Iterator[None]:
    """Turn a Ctrl-C inside the block into an `Interrupted` naming `what` (text, or a function
    asked at that moment)."""
    try:
        yield
    except KeyboardInterrupt:
        raise interrupted(what() if callable(what) else what, left) from None


class RunWatch:
    """Passes a run's stage updates on to `on_update`, remembering which stages are running, so
    that a Ctrl-C can say which it stopped and how far they had got."""

    def __init__(self, command: str, on_update: Callable[["StageReport"], None],
                 clock: Callable[[], float] = time.monotonic):
        self.command = command
        self.on_update = on_update
        self.clock = clock
        self.running: dict[str, float] = {}  # stage id -> when it started

    def update(self, report: "StageReport") -> None:
        from zoo.engine.runner import StageState

        if report.state == StageState.RUNNING:
            self.running[report.id] = self.clock()
        else:
            self.running.pop(report.id, None)
        self.on_update(report)

    def what(self) -> str:
        """`stage train (after 0:12)`, `stages a (after 0:03), b (after 0:01)`, or the command between stages."""
        if not self.running:
            return self.command
        now = self.clock()
        stages = ", ".join(f"{sid} (after {duration(now - t)})" for sid, t in self.running.items())
        return f"stage{'s' if len(self.running) > 1 else ''} {stages} of {self.command}"

    def interruptible(self):
        return interruptible(self.what, RUN_LEFT)
