"""LightGBM estimators for `train`, and their checkpoint format.

Checkpoint: ``model.lightgbm.txt``, LightGBM's own text model format (the booster's trees and
parameters as text; loading it parses numbers, never code). Fits are reproducible: seeded
(``random_state`` = the train stage's seed), ``deterministic: true`` with row-wise histograms, on
the train stage's thread count, so the same data gives the same text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from zoo_stages.lib.models.estimators.estimator import Estimator

CHECKPOINT = "model.lightgbm.txt"

ESTIMATORS: dict[str, Estimator] = {e.name: e for e in (
    Estimator("LGBMClassifier", "lightgbm", "classification"),
    Estimator("LGBMRegressor", "lightgbm", "regression"),
)}


def build(estimator: Estimator, params: Mapping[str, Any], seed: int, threads: int) -> Any:
    """The unfitted estimator with `params`, seeded and deterministic unless `params` says otherwise."""
    import lightgbm

    from zoo_stages.lib.models.estimators.estimator import checked_params

    cls = getattr(lightgbm, estimator.name)
    kwargs = checked_params(cls, {k: v for k, v in params.items() if k not in _ENGINE_PARAMS})
    kwargs.update({k: v for k, v in params.items() if k in _ENGINE_PARAMS})
    for key, value in (("random_state", seed), ("n_jobs", threads), ("deterministic", True),
                       ("force_row_wise", True), ("verbose", -1)):
        kwargs.setdefault(key, value)
    return cls(**kwargs)


# LightGBM parameters its scikit-learn wrapper passes through without listing them in get_params
_ENGINE_PARAMS = ("deterministic", "force_row_wise", "force_col_wise", "verbose", "min_data_in_bin", "max_bin")


def save(model: Any, path: Path) -> Path:
    """Write the fitted model's booster as LightGBM's text model."""
    from zoo.files import atomic_write_text

    return atomic_write_text(path, model.booster_.model_to_string(), fsync=False)


def load(path: Path) -> Any:
    """The `lightgbm.Booster` in a text model file."""
    import lightgbm

    return lightgbm.Booster(model_str=Path(path).read_text())
