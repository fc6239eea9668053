"""The recipe's `task:`: what the model does, which chooses verify's metrics (`zoo_stages.lib.quality.tasks`).

A plain value, not a mapping: `TaskSection.schema` is the name's pattern and `task_kind`, which
maps a name to its metric family and refuses a misspelt classification or regression name.
"""

from __future__ import annotations

import difflib
import re
from typing import Annotated

from pydantic import AfterValidator, Field

from zoo.section import RecipeSection

TASK_RE = r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$"
TASK_KINDS = ("classification", "regression", "generic")
TASK_DESCRIPTION = (
    "what the model does; it chooses verify's metrics. `classification` and any `*-classification` "
    "(image-, text-, tabular-classification, ...): accuracy, top5_accuracy, macro_f1; `regression` and any "
    "`*-regression` (tabular-regression, ...): mae, rmse, r2; `generic` and every other name "
    "(object-detection, feature-extraction, embedding, ...): no task metrics, parity per output only. "
    "Lowercase words joined by '-'")


def task_kind(task: str) -> str:
    """The metric family of a recipe's `task:`: "classification", "regression" or "generic".

    ``classification``/``regression`` and every ``*-classification``/``*-regression`` name map to
    those; any other well-formed name (``object-detection``, ``feature-extraction``) is generic.
    ValueError for a malformed name or one that looks like a misspelt classification/regression
    (``image-clasification``, ``tabular-regressor``), which would otherwise lose its metrics silently.
    """
    if not isinstance(task, str) or not re.fullmatch(TASK_RE, task):
        raise ValueError(f"task {task!r} must be lowercase words joined by '-', e.g. image-classification")
    words = task.split("-")
    for word in words:
        if word in ("classification", "regression"):
            continue
        close = difflib.get_close_matches(word, ["classification", "regression"], n=1, cutoff=0.8)
        if close or word.startswith(("classif", "regress")):
            meant = close[0] if close else ("classification" if word.startswith("classif") else "regression")
            fixed = "-".join(meant if w == word else w for w in words)
            raise ValueError(f"task {task!r}: did you mean {fixed!r}? (tasks ending in -classification or "
                             "-regression get that task's metrics; any other name is generic)")
    if words[-1] in TASK_KINDS[:2]:
        return words[-1]
    return "generic"


def _known_task(name: str) -> str:
    task_kind(name)  # refuses misspelt classification/regression names
    return name


class TaskSection(RecipeSection):
    """`task:`, image-classification unless the recipe says otherwise."""

    schema = Annotated[str, Field(pattern=TASK_RE, description=TASK_DESCRIPTION), AfterValidator(_known_task)]
    default = "image-classification"
