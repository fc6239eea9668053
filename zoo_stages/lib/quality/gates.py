"""Quality gates: ``<build>.<metric> <op> <number>`` strings, parsed, checked, and printed as a table.

Examples::

    cpu-fp32.accuracy >= 0.95
    cpu-int8.accuracy_drop <= 0.01
    cpu-int8.speedup >= 1.0

The build is everything before the last dot of the left-hand side, the metric the word after
it; operators are ``>= <= > < ==``; the threshold is a plain number (``0.95``, ``1e-3``, ``-2``).
Parsing is pure (no numpy) so recipes validate gates at load time.
"""

from __future__ import annotations

import difflib
import math
import operator
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

OPERATORS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    ">": operator.gt,
    "<": operator.lt,
    "==": operator.eq,
}

_GATE_RE = re.compile(
    r"^\s*(?P<build>[A-Za-z0-9][A-Za-z0-9._-]*)\.(?P<metric>[A-Za-z_][A-Za-z0-9_]*)"
    r"\s*(?P<op>>=|<=|==|>|<)\s*"
    r"(?P<value>[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)\s*$"
)

SYNTAX = "<build>.<metric> <op> <number>, e.g. 'cpu-int8.accuracy_drop <= 0.01' (op: >=, <=, >, <, ==)"


class GateSyntaxError(ValueError):
    """A gate string that does not parse or names an unknown metric/build (a ValueError, for pydantic)."""


@dataclass(frozen=True)
class Gate:
    """One parsed gate."""

    text: str
    build: str
    metric: str
    op: str
    threshold: float

    def check(self, value: float | None) -> bool:
        """True when `value` satisfies the gate; a missing or non-finite value never does."""
        if value is None:
            return False
        try:
            v = float(value)
        except (TypeError, ValueError):
            return False
        if not math.isfinite(v):
            return False
        return OPERATORS[self.op](v, self.threshold)

    @property
    def condition(self) -> str:
        return f"{self.op} {self.threshold:g}"


@dataclass(frozen=True)
class GateResult:
    """A gate with the value it was checked against."""

    gate: Gate
    value: float | None
    passed: bool

    def to_json(self) -> dict[str, Any]:
        return {"gate": self.gate.text, "build": self.gate.build, "metric": self.gate.metric,
                "op": self.gate.op, "threshold": self.gate.threshold, "value": self.value, "passed": self.passed}


def parse_gate(text: str, metrics: Iterable[str] | None = None, builds: Iterable[str] | None = None) -> Gate:
    """Parse one gate; with `metrics`/`builds` given, unknown names are errors listing the valid ones."""
    if not isinstance(text, str):
        raise GateSyntaxError(f"gate {text!r} must be a string of the form {SYNTAX}")
    m = _GATE_RE.match(text)
    if not m:
        raise GateSyntaxError(f"gate {text!r} does not parse; expected {SYNTAX}")
    build, metric = m.group("build"), m.group("metric")
    if metrics is not None:
        valid = sorted(set(metrics))
        if metric not in valid:
            close = difflib.get_close_matches(metric, valid, n=1)
            hint = f" — did you mean {close[0]!r}?" if close else ""
            raise GateSyntaxError(f"gate {text!r}: unknown metric {metric!r}{hint}; valid metrics: {', '.join(valid)}")
    if builds is not None:
        valid_builds = sorted(set(builds))
        if build not in valid_builds:
            close = difflib.get_close_matches(build, valid_builds, n=1)
            hint = f" — did you mean {close[0]!r}?" if close else ""
            raise GateSyntaxError(f"gate {text!r}: unknown build {build!r}{hint}; builds: {', '.join(valid_builds) or 'none'}")
    threshold = float(m.group("value"))
    return Gate(text=" ".join(text.split()), build=build, metric=metric, op=m.group("op"), threshold=threshold)


def evaluate(gates: Sequence[Gate], values: Mapping[str, Mapping[str, Any]]) -> list[GateResult]:
    """Check each gate against ``values[build][metric]`` (missing values fail)."""
    results = []
    for gate in gates:
        value = values.get(gate.build, {}).get(gate.metric)
        shown = float(value) if isinstance(value, (int, float)) else None  # bools count as 1/0
        results.append(GateResult(gate=gate, value=shown, passed=gate.check(shown)))
    return results


def _fmt(value: float | None) -> str:
    if value is None:
        return "n/a"
    if not math.isfinite(value):
        return str(value)
    if value == 0 or 1e-3 <= abs(value) < 1e6:
        return f"{value:.4f}".rstrip("0").rstrip(".")
    return f"{value:.3e}"


def format_table(results: Sequence[GateResult]) -> str:
    """A plain-text table of every gate: gate, value, threshold, PASS/FAIL."""
    rows = [("gate", "value", "threshold", "result")]
    for r in results:
        rows.append((r.gate.text, _fmt(r.value), r.gate.condition, "PASS" if r.passed else "FAIL"))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def failed_summary(results: Sequence[GateResult]) -> str:
    """One line naming the failed gates, for an error message."""
    failed = [r for r in results if not r.passed]
    if not failed:
        return "all gates passed"
    return f"{len(failed)} of {len(results)} gate(s) failed: " + "; ".join(
        f"{r.gate.text} (got {_fmt(r.value)})" for r in failed)
