"""What the framework modules (`sklearn`, `lightgbm`, `xgboost`) share: the `Estimator` entry of
their ``ESTIMATORS`` tables, and checking a recipe's estimator name and ``model.params`` against
them (with a did-you-mean). Apart from the package's `framework`, which imports those modules.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Literal, Mapping

from zoo.errors import InvalidInput


@dataclass(frozen=True)
class Estimator:
    """One estimator `train` can fit: where its class lives and what it predicts."""

    name: str
    module: str  # the framework module holding the class ("sklearn.ensemble", "lightgbm")
    kind: Literal["classification", "regression"]


def lookup(table: Mapping[str, Estimator], name: str, framework_name: str) -> Estimator:
    """The estimator called `name`; ValueError naming the closest one otherwise."""
    if name in table:
        return table[name]
    close = difflib.get_close_matches(name, list(table), n=1, cutoff=0.6)
    suggestion = f" — did you mean {close[0]!r}?" if close else ""
    raise ValueError(f"unknown {framework_name} estimator {name!r}{suggestion} "
                     f"(known: {', '.join(sorted(table))})")


def checked_params(cls: type, given: Mapping[str, Any], where: str = "model.params") -> dict[str, Any]:
    """`given` after checking every name against the estimator's parameters (``get_params``),
    with a did-you-mean for a misspelt one."""
    known = list(cls().get_params())
    for key in given:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            raise InvalidInput(f"{where}.{key}: {cls.__name__} has no parameter {key!r}"
                               + (f" — did you mean {close[0]!r}?" if close else ""),
                               hint=f"its parameters: {', '.join(sorted(known))}")
    return dict(given)
