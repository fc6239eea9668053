"""XGBoost estimators for `train`, and their checkpoint format.

Checkpoint: ``model.xgboost.json``, XGBoost's own JSON model format (trees, parameters and the
scikit-learn wrapper's attributes as JSON data; loading it parses numbers, never code). Fits are
reproducible: seeded (``random_state`` = the train stage's seed), ``tree_method: hist`` on the
train stage's thread count. The CPU-only wheel ``xgboost-cpu`` provides the same ``xgboost`` module.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from zoo_stages.lib.models.estimators.estimator import Estimator

CHECKPOINT = "model.xgboost.json"

ESTIMATORS: dict[str, Estimator] = {e.name: e for e in (
    Estimator("XGBClassifier", "xgboost", "classification"),
    Estimator("XGBRegressor", "xgboost", "regression"),
)}


def build(estimator: Estimator, params: Mapping[str, Any], seed: int, threads: int) -> Any:
    """The unfitted estimator with `params`, seeded unless `params` sets random_state."""
    import xgboost

    from zoo_stages.lib.models.estimators.estimator import checked_params

    cls = getattr(xgboost, estimator.name)
    kwargs = checked_params(cls, params)
    for key, value in (("random_state", seed), ("n_jobs", threads), ("tree_method", "hist")):
        kwargs.setdefault(key, value)
    return cls(**kwargs)


def save(model: Any, path: Path) -> Path:
    """Write the fitted model (with its scikit-learn wrapper's attributes) as XGBoost JSON."""
    import tempfile

    from zoo.files import atomic_write

    with tempfile.TemporaryDirectory(dir=Path(path).parent) as scratch:
        written = Path(scratch) / "model.json"  # XGBoost picks the format by the file's suffix
        model.save_model(str(written))
        return atomic_write(path, written.read_bytes(), fsync=False)


def load(path: Path, kind: str) -> Any:
    """The XGBClassifier (`kind` classification) or XGBRegressor in a JSON model file."""
    import xgboost

    model = xgboost.XGBClassifier() if kind == "classification" else xgboost.XGBRegressor()
    model.load_model(str(path))
    return model
