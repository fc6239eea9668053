"""What a running stage is doing, read from the lines of its log: a step count with its figures
(``epoch 3/10 · train_loss 0.412 · train_accuracy 0.93 · ETA 0:42``), or else its latest line.

A step is a log message of the form ``LABEL I/N`` optionally followed by ``: NAME VALUE …``:

    epoch 3/10: train_loss 0.4120 train_accuracy 0.9300      (train, today)
    calibration 4/16                                         (a quantize calibration batch)
    latency cpu-int8 120/200                                 (a latency run)

LABEL is one or more words; VALUEs are numbers (``NAME=VALUE`` is read too). The ETA is the pace of
the steps seen so far (from the first one seen) times the steps left; with one step seen there is
no ETA yet: the time since the stage started also holds its set-up (loading data, a model, warm-up
runs), which made a 5 s calibration's first ETA read 1:33. A new LABEL starts a new count. Any
other line is shown as the latest line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# the worker's log format (zoo/engine/worker.py): "2026-11-24 00:28:01,123 INFO message"
_PREFIX = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (?:DEBUG|INFO|WARNING|ERROR|CRITICAL) ")
_WORD = r"[A-Za-z][\w.()-]*"
_STEP = re.compile(rf"^(?P<label>{_WORD}(?: {_WORD})*) (?P<i>\d+)/(?P<n>\d+)(?::\s*(?P<rest>.*))?$")
_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|nan|inf"
_PAIR = re.compile(rf"(?P<name>{_WORD})(?: +|=)(?P<value>{_NUMBER})(?=\s|,|$)")
MAX_FIGURES = 3  # figures shown after the step count: the line must stay short


@dataclass
class Step:
    """One recognised step line: `label` `i`/`n` and its figures (name, value) in logged order."""

    label: str
    i: int
    n: int
    figures: list[tuple[str, float]] = field(default_factory=list)


def message(line: str) -> str:
    """The line without the worker's timestamp and level."""
    return _PREFIX.sub("", line.rstrip(), count=1)


def parse_step(line: str) -> Step | None:
    """The step a log line reports, or None when it is not one (see the module docstring)."""
    m = _STEP.match(message(line))
    if m is None:
        return None
    i, n = int(m["i"]), int(m["n"])
    if n <= 0 or i > n:
        return None
    figures = [(p["name"], float(p["value"])) for p in _PAIR.finditer(m["rest"] or "")]
    return Step(m["label"], i, n, figures)


def without_stage_name(text: str, stage_id: str) -> str:
    """`text` without a leading "STAGE: " that repeats the stage's name: kinds start their log
    lines with it ("deploy: cpu-fp32 parity …"), and the display already names the stage, so
    "[zoo] deploy: deploy: …" would say it twice. A matrix instance's lines name its base stage."""
    for name in dict.fromkeys((stage_id, stage_id.split("[")[0])):
        if text.startswith(f"{name}: "):
            return text[len(name) + 2:]
    return text


def duration(seconds: float) -> str:
    """0:42, 12:05, 1:02:03."""
    s = max(0, int(round(seconds)))
    h, rest = divmod(s, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


class StageActivity:
    """The progress of one running stage, fed its log lines with the time they were read."""

    def __init__(self, started: float):
        self.started = started  # on the clock the lines are fed with
        self.step: Step | None = None
        self.latest = ""  # the latest line that is not a step
        self.changed = False  # something new since `seen()` was last called
        self._first: tuple[int, float] | None = None  # (i, time) of the first step of the current label
        self._at = started  # when the current step was read

    def feed(self, lines: list[str], now: float) -> None:
        """Take the lines read at `now`."""
        for line in lines:
            text = message(line).strip()
            if not text:
                continue
            step = parse_step(text)
            self.changed = True
            if step is None:
                self.latest = text
                continue
            if self.step is None or step.label != self.step.label or step.i < self.step.i:
                self._first = (step.i, now)
            self.step, self._at = step, now

    def seen(self) -> None:
        """Mark what there is as shown (`changed` becomes False)."""
        self.changed = False

    def eta(self, now: float) -> float | None:
        """Seconds left until the current count ends, at the pace seen so far; None before two steps."""
        if self.step is None or self._first is None:
            return None
        first_i, first_t = self._first
        if self.step.i <= first_i:  # one step seen: no pace yet
            return None
        pace = (self._at - first_t) / (self.step.i - first_i)
        return max(0.0, pace * (self.step.n - self.step.i) - (now - self._at))

    def detail(self, now: float, width: int = 80) -> str:
        """One short line: the step with its figures and ETA, or the latest line (cut to `width`)."""
        if self.step is None:
            return self.latest if len(self.latest) <= width else self.latest[:width - 1] + "…"
        parts = [f"{self.step.label} {self.step.i}/{self.step.n}"]
        parts += [f"{name} {value:.4g}" for name, value in self.step.figures[:MAX_FIGURES]]
        eta = self.eta(now)
        if eta is not None and self.step.i < self.step.n:
            parts.append(f"ETA {duration(eta)}")
        return " · ".join(parts)
