"""Estimators that `train` fits declaratively on tabular data: scikit-learn, LightGBM, XGBoost.

A recipe names the framework, the estimator and its parameters in its ``model:`` section::

    model:
      framework: sklearn            # sklearn, lightgbm or xgboost (torch: `arch:`/`entry:` instead)
      estimator: GradientBoostingClassifier
      params: {n_estimators: 100, max_depth: 3}

One module per framework (`sklearn`, `lightgbm`, `xgboost`) says which estimators it fits
(``ESTIMATORS``: name -> `Estimator`, a static table, so a recipe is checked without importing
the framework), builds one seeded from the train stage's ``seed`` and ``threads``, and saves and
loads its checkpoint in a format that holds data, never code (see each module). `framework`
gives the module for a name; `training` is the train stage for them.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal, Mapping

from zoo.errors import InvalidInput

FRAMEWORKS = ("sklearn", "lightgbm", "xgboost")
# the distributions whose versions decide a fit's or a checkpoint's bytes (the train and export kinds'
# `tools`); xgboost-cpu is the CPU-only wheel of the `xgboost` module
ESTIMATOR_TOOLS = ("scikit-learn", "skops", "lightgbm", "xgboost", "xgboost-cpu")


@dataclass(frozen=True)
class Estimator:
    """One estimator `train` can fit: where its class lives and what it predicts."""

    name: str
    module: str  # the framework module holding the class ("sklearn.ensemble", "lightgbm")
    kind: Literal["classification", "regression"]


def framework(name: str) -> ModuleType:
    """The module of framework `name` (`sklearn`, `lightgbm` or `xgboost`); imports no framework."""
    from zoo_stages.lib.estimators import lightgbm, sklearn, xgboost

    modules = {"sklearn": sklearn, "lightgbm": lightgbm, "xgboost": xgboost}
    if name not in modules:
        raise InvalidInput(f"train fits no estimators of framework {name!r}",
                           hint=f"frameworks it fits: {', '.join(FRAMEWORKS)}")
    return modules[name]


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
