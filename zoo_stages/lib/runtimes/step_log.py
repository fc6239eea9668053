"""Progress lines for a stage's long loops: ``LABEL I/N`` in the stage's log, which `zoo run`
shows as a step count with an ETA (zoo/cli/activity.py reads them from the log as it grows).

A loop of thousands of short steps (latency runs of a small model) must not flood the log or slow
the loop: a line is written for the first and the last step, and otherwise at most every
`every_s` seconds. The check is one clock read per step, outside any timed region.
"""

from __future__ import annotations

import logging
import time


class StepLog:
    """Call with each finished step's number (1..total) to log ``LABEL i/total`` now and then."""

    def __init__(self, log: logging.Logger | None, label: str, total: int, *, every_s: float = 0.5):
        self.log = log
        self.label = label
        self.total = total
        self.every_s = every_s
        self._last = float("-inf")

    def __call__(self, i: int) -> None:
        if self.log is None:
            return
        now = time.monotonic()
        if i == 1 or i >= self.total or now - self._last >= self.every_s:
            self._last = now
            self.log.info("%s %d/%d", self.label, i, self.total)
