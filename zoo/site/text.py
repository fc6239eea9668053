"""How the site writes numbers, sizes and measurement settings (one place, so plots, tables and
tooltips agree)."""

from __future__ import annotations

import math


def number(value, digits: int = 4) -> str:
    """`value` with `digits` significant digits and no trailing zeros (0.9333, 0.01617, 1.297e+05); '-' for None."""
    if value is None:
        return "-"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if not math.isfinite(value):
        return str(value)
    return format(value, f".{digits}g")


def size(n: int | None) -> str:
    """A byte count for the catalog's pages: 244.0 KB, 1.2 GB (binary units; one decimal from KB up)."""
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"
