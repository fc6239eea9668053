"""`DataError`: a data file that does not fit the recipe's `data:` section, raised while a stage
loads it, naming the field (`data.label`) so the runner can print one line at the recipe's line.

Every message of this package starts with the field it is about (``data.label: 'x.csv' has no
column 'y'``); `DataError` reads the field from there, so a raise site says it once. A message
about the data as a whole (an unreadable image) points at the `data:` section.
"""

from __future__ import annotations

import re

from zoo.errors import FieldError

_FIELD = re.compile(r"data\.([A-Za-z_][A-Za-z0-9_]*)(?:\.([A-Za-z0-9_-]+))?")


def field_of(message: str) -> tuple[str, ...]:
    """The recipe field a message starts with: ``("data", "inputs", "image")`` for
    ``data.inputs.image: …``; ``("data",)`` when it starts with none."""
    m = _FIELD.match(message)
    if m is None:
        return ("data",)
    return ("data", m.group(1)) + ((m.group(2),) if m.group(2) else ())


class DataError(FieldError):
    """A data error at a field of `data:` (see the module docstring)."""

    def __init__(self, message: str, *, hint: str | None = None):
        super().__init__(message, field=field_of(message), hint=hint)
