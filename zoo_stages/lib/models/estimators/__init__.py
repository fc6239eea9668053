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
gives the module for a name; `training` is the train stage for them; `estimator` holds what
the framework modules share (the `Estimator` entry, checking a recipe's names against it).
"""

from __future__ import annotations

from types import ModuleType

from zoo.errors import InvalidInput

FRAMEWORKS = ("sklearn", "lightgbm", "xgboost")
# the distributions whose versions decide a fit's or a checkpoint's bytes (the train and export kinds'
# `tools`); xgboost-cpu is the CPU-only wheel of the `xgboost` module
ESTIMATOR_TOOLS = ("scikit-learn", "skops", "lightgbm", "xgboost", "xgboost-cpu")


def framework(name: str) -> ModuleType:
    """The module of framework `name` (`sklearn`, `lightgbm` or `xgboost`); imports no framework."""
    from zoo_stages.lib.models.estimators import lightgbm, sklearn, xgboost

    modules = {"sklearn": sklearn, "lightgbm": lightgbm, "xgboost": xgboost}
    if name not in modules:
        raise InvalidInput(f"train fits no estimators of framework {name!r}",
                           hint=f"frameworks it fits: {', '.join(FRAMEWORKS)}")
    return modules[name]
