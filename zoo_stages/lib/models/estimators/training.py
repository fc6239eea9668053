"""The train stage for scikit-learn, LightGBM and XGBoost estimators (``model.framework``).

The recipe's tabular ``data:`` must give one float feature (a table's columns, ``features``
by default) and labels; the estimator (``model.estimator``, its ``model.params``) is fitted on
the train split, seeded with the stage's ``seed`` and run on its ``threads``, and saved in its
framework's checkpoint format (`zoo_stages.lib.models.estimators.sklearn` and siblings), whose bytes
the same data, parameters, seed, threads and versions reproduce. The estimator must fit the
recipe's task: a classifier for ``*-classification``, a regressor for ``*-regression``.

Metrics: ``train_accuracy`` / ``val_accuracy`` (classification) or ``train_mae`` / ``val_mae``
(regression), ``estimator``, ``params`` (as given), ``samples``, ``seconds``, ``threads`` and
``split``. The torch options of the train stage (epochs, optimizer, entry, ...) do not apply.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Mapping

from zoo.errors import InvalidInput
from zoo.stage import StageContext


def run(config: Any, context: StageContext) -> Mapping[str, Path]:
    """Fit the recipe's estimator and write its checkpoint (``checkpoint``)."""
    import numpy as np

    from zoo_stages.lib.data import datasets
    from zoo_stages.lib.quality import tasks
    from zoo_stages.lib.models.estimators import framework
    from zoo_stages.lib.models.estimators.estimator import lookup

    model_section = dict(context.shared.get("model") or {})
    data = dict(context.shared.get("data") or {})
    if not data:
        raise InvalidInput("the train stage needs the recipe's `data:` section",
                           hint="add e.g. `data: {source: csv, path: data/table.csv, label: target}`")
    if config.entry:
        raise InvalidInput("config.entry trains torch, Keras and JAX models; this recipe's model is a "
                           f"{model_section['framework']} estimator", hint="remove `entry:` from the train config")
    fw = framework(model_section["framework"])
    try:
        estimator = lookup(fw.ESTIMATORS, model_section.get("estimator") or "", model_section["framework"])
    except ValueError as e:
        raise InvalidInput(f"model.estimator: {e}") from None
    kind = tasks.kind_of(context.shared.get("task") or "")
    if kind != estimator.kind:
        raise InvalidInput(f"model.estimator {estimator.name} is a {estimator.kind} estimator, but the recipe's task "
                           f"is {context.shared.get('task')!r}",
                           hint=f"use a {kind} estimator, or set `task:` to a *-{estimator.kind} task")
    train = datasets.load_split(data, context.recipe.dir, "train")
    val = datasets.load_split(data, context.recipe.dir, "val")
    if train.labels is None:
        raise InvalidInput("the data has no labels, which fitting an estimator needs", hint="set `data.label:`")
    x_train, x_val = table_features(train), table_features(val)
    threads = config.threads or context.threads
    model = fw.build(estimator, dict(model_section.get("params") or {}), config.seed, int(threads))
    started = time.perf_counter()
    model.fit(x_train, np.asarray(train.labels))
    seconds = time.perf_counter() - started
    path = fw.save(model, context.output_path(fw.CHECKPOINT))

    figures: dict[str, float] = {}
    for split, x, labels in (("train", x_train, train.labels), ("val", x_val, val.labels)):
        predicted = np.asarray(model.predict(x))
        if kind == "classification":
            figures[f"{split}_accuracy"] = float(np.mean(predicted == np.asarray(labels)))
        else:
            figures[f"{split}_mae"] = float(np.mean(np.abs(predicted.reshape(-1) - np.asarray(labels))))
    context.metrics.update({
        **{k: round(v, 6) for k, v in figures.items()},
        "framework": model_section["framework"],
        "estimator": estimator.name,
        "params": dict(model_section.get("params") or {}),
        "samples": len(train),
        "seconds": round(seconds, 3),
        "threads": int(threads),
        "split": datasets.split_info(data, context.recipe.dir),
    })
    context.log.info("fitted %s: %s in %.1fs", estimator.name,
                     " ".join(f"{k} {v:.4f}" for k, v in figures.items() if k.startswith("val_")), seconds)
    return {"checkpoint": path}


def table_features(split: Any) -> Any:
    """The split's single float feature as a float32 (samples, columns) array: estimators take
    one table (InvalidInput for image, text or several-feature data)."""
    import numpy as np

    if len(split.features) != 1:
        raise InvalidInput(f"an estimator takes one table of features, the data gives {len(split.features)} "
                           f"({', '.join(split.features)})", hint="use a csv, parquet or jsonl table of numbers")
    x = np.asarray(next(iter(split.features.values())))
    if x.ndim != 2 or x.dtype.kind != "f":
        raise InvalidInput(f"an estimator takes a (samples, columns) table of numbers, the data gives {x.dtype} "
                           f"{list(x.shape)}", hint="use a csv, parquet or jsonl table of numbers")
    return np.ascontiguousarray(x, dtype=np.float32)
