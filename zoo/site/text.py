"""How the site writes numbers, sizes and measurement settings (one place, so plots, tables and
tooltips agree)."""

from __future__ import annotations

import math

from zoo.formatting import size  # noqa: F401 (sizes as the CLI's tables write them: one way across zoo)


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
