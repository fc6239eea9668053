"""Choosing among ``mode: auto``'s candidates: pass/fail per row, the fastest passing one, the table."""

from __future__ import annotations

from typing import Any


def select_candidate(rows: list[dict[str, Any]], *, max_accuracy_drop: float, min_speedup: float,
                     tie_tolerance: float = 0.0, min_cosine: float | None = None) -> str | None:
    """Mark each candidate row passed/failed and return the name of the one to keep (or None).

    A row has ``name``, ``accuracy_drop``, ``speedup``, ``latency_p50_ms`` and optionally
    ``error`` and ``cosine`` (its outputs' lowest mean cosine to the fp32 parent's). A row
    passes when it built, its accuracy drop is at most `max_accuracy_drop` (where accuracy does
    not apply, drop None: its cosine is at least `min_cosine`, when that is given),
    its speedup is at least `min_speedup`, and it is not slower than the fp32 parent
    (speedup < 1 is flagged ``slower_than_fp32`` and never picked). Among passing rows the
    fastest wins; rows within `tie_tolerance` (a share) of the fastest p50 are tied, and the
    earliest in `rows` order wins the tie, so measurement noise rarely flips the choice.
    Rows are updated in place with ``passed``, ``reasons`` and ``slower_than_fp32``.
    """
    passing = []
    for row in rows:
        reasons = []
        speedup, drop = row.get("speedup"), row.get("accuracy_drop")
        row["slower_than_fp32"] = speedup is not None and speedup < 1.0
        if row.get("error"):
            reasons.append(f"failed to build: {row['error']}")
        else:
            cosine = row.get("cosine")
            if drop is None and min_cosine is not None and cosine is not None:
                if cosine < min_cosine:
                    reasons.append(f"cosine to fp32 {cosine:.4f} < {min_cosine:g}")
            elif drop is None:
                reasons.append("accuracy not measured")
            elif drop > max_accuracy_drop:
                reasons.append(f"accuracy drop {drop:.4f} > {max_accuracy_drop:g}")
            if speedup is None:
                reasons.append("latency not measured")
            else:
                if row["slower_than_fp32"]:
                    reasons.append(f"slower than fp32 parent (speedup {speedup:.2f}x)")
                if speedup < min_speedup:
                    reasons.append(f"speedup {speedup:.2f}x < {min_speedup:g}x")
        row["passed"] = not reasons
        row["reasons"] = reasons
        if not reasons:
            passing.append(row)
    if not passing:
        return None
    fastest = min(r["latency_p50_ms"] for r in passing)
    for row in passing:  # rows order = preference order
        if row["latency_p50_ms"] <= fastest * (1.0 + tie_tolerance):
            return row["name"]
    return None  # unreachable: the fastest row itself always qualifies


def candidates_table(rows: list[dict[str, Any]], chosen: str | None = None) -> str:
    """A text table of auto candidates: accuracy, drop, p50, speedup, size, verdict."""

    def num(v, fmt):
        return "n/a" if v is None else format(v, fmt)

    header = ("candidate", "accuracy", "drop", "p50_ms", "speedup", "size_kb", "result", "notes")
    lines = [header]
    for r in rows:
        verdict = "CHOSEN" if r["name"] == chosen else ("pass" if r.get("passed") else "FAIL")
        notes = "; ".join(r.get("reasons") or [])
        if r.get("slower_than_fp32") and "slower than fp32" not in notes:
            notes = "; ".join(filter(None, [notes, "slower than fp32 parent"]))
        lines.append((r["name"], num(r.get("accuracy"), ".4f"), num(r.get("accuracy_drop"), "+.4f"),
                      num(r.get("latency_p50_ms"), ".3f"), num(r.get("speedup"), ".2f"),
                      num(r["size_bytes"] / 1024 if r.get("size_bytes") is not None else None, ".1f"),
                      verdict, notes))
    widths = [max(len(str(row[i])) for row in lines) for i in range(len(header))]
    text = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in lines]
    text.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(text)
