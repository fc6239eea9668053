"""How zoo writes numbers for people: sizes, latencies, metrics, digests (JSON keeps the raw values).
The CLI's tables and the web catalog's pages (`zoo.site`) both use it, so a size reads the same in each.

Imports nothing beyond the standard library, so any command (and `zoo --help`) may use it.
"""

from __future__ import annotations

import math

SHORT_SHA = 12  # hex digits of a sha256 shown in tables: enough to tell builds apart, as git does


def size(n: int | float | None) -> str:
    """A byte count for people: '512 B', '244 KB', '217.6 MB', '1.2 GB' (binary units, as `du -h`);
    '-' for none (or what no byte count can be: negative, not a number)."""
    value = _number(n)
    if value is None or value != value or value < 0:
        return "-"
    if value == math.inf:
        return "inf"
    for unit in ("B", "KB"):
        if value < 1024:
            return f"{value:.0f} {unit}"
        value /= 1024
    for unit in ("MB", "GB", "TB"):
        if value < 1024:
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.4g} PB"


def ms(value) -> str:
    """A latency in milliseconds: 2 decimals below 10 ms ('5.92'), 3 significant digits otherwise
    ('12.3', '123'), and 3 significant digits below 1 ms ('0.0123'); '-' when not measured."""
    number = _number(value)
    if number is None:
        return "-" if value is None else _text(value)
    if not math.isfinite(number):
        return str(number)  # 'inf', '-inf', 'nan': what was recorded, not a figure to format
    if abs(number) >= 1e15:
        return f"{number:.3g}"
    if number >= 100:
        return f"{number:.0f}"
    if number >= 10:
        return f"{number:.1f}"
    if number >= 1 or number == 0:
        return f"{number:.2f}"
    return f"{number:.3g}"


def metric(value) -> str:
    """A quality metric (accuracy, F1, MAE...): 4 decimals for fractions ('0.9333'), 4 significant
    digits for larger values; integers and text as they are; '-' when missing."""
    if value is None:
        return "-"
    if isinstance(value, bool) or (isinstance(value, int) and abs(value) < 10**15):
        return str(value)
    number = _number(value)
    if number is None:
        return _text(value)
    if not math.isfinite(number):
        return str(number)
    return f"{number:.4f}" if abs(number) < 10 else f"{number:.4g}"


def short_sha(digest: str | None) -> str:
    """The first 12 hex digits of a sha256 ('-' when there is none)."""
    return digest[:SHORT_SHA] if digest else "-"


def timestamp(text: str | None, *, seconds: bool = False) -> str:
    """An ISO timestamp in UTC to the minute (or second), as people read it: '2026-11-24 00:28'
    (zoo records UTC; one with another offset is converted, one without is taken as UTC)."""
    if not text:
        return "-"
    from datetime import datetime, timezone

    try:
        moment = datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return str(text).replace("T", " ")[:19 if seconds else 16]  # not ISO: as recorded, cut
    if moment.tzinfo is not None:
        moment = moment.astimezone(timezone.utc)
    return moment.strftime("%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M")


def _number(value) -> float | None:
    """`value` as a float (an int too large for one: +-inf); None when it is no number."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        try:
            return float(value)
        except OverflowError:
            return math.inf if value > 0 else -math.inf
    if isinstance(value, float):
        return value
    if isinstance(value, str) and len(value) > 100:  # no figure is written in 100 characters
        return None
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return None


def _text(value, limit: int = 40) -> str:
    """A value that is no number, in at most `limit` characters (a metric may be any string)."""
    text = str(value)
    return text if len(text) <= limit else text[:limit - 1] + "…"
