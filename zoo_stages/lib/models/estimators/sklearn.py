"""scikit-learn estimators for `train`, and their checkpoint format.

Checkpoint: ``model.skops``, written with `skops.io`, which stores an estimator as JSON plus
numpy arrays in a zip file and rebuilds it without unpickling: loading refuses any type outside
skops' defaults (scikit-learn estimators, numpy arrays and dtypes, builtins) and the explicit
`TRUSTED_TYPES` below (the fitted tree structures of the estimators in `ESTIMATORS`), so a
checkpoint cannot run code. `save` makes the bytes reproducible: skops names its array files and
marks shared objects (``__id__``) by Python object ids, and stamps the current time; the ids are
renumbered in order of appearance and the entries dated 1980-01-01, so the same fit always gives
the same file.
"""

from __future__ import annotations

import io
import re
import zipfile
from pathlib import Path
from typing import Any, Mapping

from zoo.errors import IntegrityError
from zoo_stages.lib.models.estimators.estimator import Estimator

CHECKPOINT = "model.skops"

ESTIMATORS: dict[str, Estimator] = {e.name: e for e in (
    Estimator("GradientBoostingClassifier", "sklearn.ensemble", "classification"),
    Estimator("GradientBoostingRegressor", "sklearn.ensemble", "regression"),
    Estimator("HistGradientBoostingClassifier", "sklearn.ensemble", "classification"),
    Estimator("HistGradientBoostingRegressor", "sklearn.ensemble", "regression"),
    Estimator("RandomForestClassifier", "sklearn.ensemble", "classification"),
    Estimator("RandomForestRegressor", "sklearn.ensemble", "regression"),
    Estimator("ExtraTreesClassifier", "sklearn.ensemble", "classification"),
    Estimator("ExtraTreesRegressor", "sklearn.ensemble", "regression"),
    Estimator("DecisionTreeClassifier", "sklearn.tree", "classification"),
    Estimator("DecisionTreeRegressor", "sklearn.tree", "regression"),
    Estimator("LogisticRegression", "sklearn.linear_model", "classification"),
    Estimator("LinearRegression", "sklearn.linear_model", "regression"),
    Estimator("Ridge", "sklearn.linear_model", "regression"),
)}

# types skops does not trust by default that the estimators above need: their fitted trees
TRUSTED_TYPES = ("sklearn.tree._tree.Tree", "sklearn.ensemble._hist_gradient_boosting.predictor.TreePredictor")

_ZIP_DATE = (1980, 1, 1, 0, 0, 0)


def build(estimator: Estimator, params: Mapping[str, Any], seed: int, threads: int) -> Any:
    """The unfitted estimator with `params`; seeded with `seed` unless `params` sets random_state."""
    import importlib

    from zoo_stages.lib.models.estimators.estimator import checked_params

    cls = getattr(importlib.import_module(estimator.module), estimator.name)
    kwargs = checked_params(cls, params)
    if "random_state" in cls().get_params():
        kwargs.setdefault("random_state", seed)
    return cls(**kwargs)


def save(model: Any, path: Path) -> Path:
    """Write `model` as a skops file with reproducible bytes (see the module docstring)."""
    import skops.io

    from zoo.files import atomic_write

    return atomic_write(path, _reproducible(skops.io.dumps(model)), fsync=False)


def _reproducible(blob: bytes) -> bytes:
    """The skops zip with its id-named array files renamed 0.npy, 1.npy, ... and its ``__id__``
    marks renumbered 0, 1, ... in the order the schema names them, every entry dated 1980-01-01
    and stored in name order."""
    source = zipfile.ZipFile(io.BytesIO(blob))
    schema = source.read("schema.json").decode()
    names: dict[str, str] = {}
    for old in re.findall(r'"([0-9]+\.npy)"', schema):
        names.setdefault(old, f"{len(names)}.npy")
    schema = re.sub(r'"([0-9]+\.npy)"', lambda m: f'"{names[m.group(1)]}"', schema)
    ids: dict[str, str] = {}  # shared objects are marked by their id(): number them in order instead
    schema = re.sub(r'"__id__": ([0-9]+)', lambda m: f'"__id__": {ids.setdefault(m.group(1), str(len(ids)))}', schema)
    entries = {names.get(n, n): (schema.encode() if n == "schema.json" else source.read(n)) for n in source.namelist()}
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as target:
        for name in sorted(entries):
            info = zipfile.ZipInfo(name, date_time=_ZIP_DATE)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            target.writestr(info, entries[name])
    return out.getvalue()


def load(path: Path) -> Any:
    """The estimator in a skops checkpoint; IntegrityError if it holds a type outside skops'
    defaults and `TRUSTED_TYPES` (nothing is loaded then)."""
    import skops.io

    untrusted = [t for t in skops.io.get_untrusted_types(file=str(path)) if t not in TRUSTED_TYPES]
    if untrusted:
        raise IntegrityError(f"{path.name} holds types zoo does not load: {', '.join(untrusted)}",
                             hint="a scikit-learn checkpoint may hold the estimators train fits; refit it with zoo")
    return skops.io.load(str(path), trusted=list(TRUSTED_TYPES))
