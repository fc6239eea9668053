"""The recipe's ``task:`` as the kind of model it names (minimal: helper VERIFY's module of the
same name, with the metrics, replaces this one when the #13 branches merge)."""

from __future__ import annotations

from typing import Literal


def kind_of(task: str) -> Literal["classification", "regression", "generic"]:
    """``classification``/``regression``, plain or modality-prefixed (``text-classification``,
    ``tabular-regression``); anything else (``object-detection``, ``feature-extraction``) is generic."""
    name = str(task or "").strip().lower()
    for kind in ("classification", "regression"):
        if name == kind or name.endswith("-" + kind):
            return kind  # type: ignore[return-value]
    return "generic"
