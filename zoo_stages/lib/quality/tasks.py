"""What a model's task measures: the metric family of a recipe's `task:`, the output the metrics
read, and the metrics themselves.

- `kind_of`: ``classification``, ``regression``, ``generation`` or ``generic`` for a recipe's `task:`
  (see `zoo_stages.sections.task.task_kind`: ``*-classification``, ``*-regression``,
  ``*-generation``, anything else generic);
- `scores_output` / `label_output`: which model output the metrics read (classification: the float
  (samples, classes) scores, and an integer (samples,) label output when the model has one, as
  scikit-learn converters make them; regression: a float (samples,) or (samples, 1) output);
- `evaluate`: the task's metrics against the dataset's labels (`METRICS` per kind, name ->
  meaning); `primary_metric`: the headline one; `compare`: a build's metric against the
  reference's as ``<metric>_drop`` (higher is better) or ``<metric>_increase`` (lower is better;
  relative to the reference for perplexity, `RELATIVE`: 0.05 is 5% above it).

Classification accuracy comes from the integer label output exactly when the model has one
(its own decision, whatever its scores say), else from the argmax of the scores; top-5 accuracy
(only with more than 5 classes) from the scores. A generic task has no metrics: parity only.
A generation task's metric (perplexity) is not read from outputs and labels: verify computes it
from a decoder's teacher-forced runs (`zoo_stages.lib.quality.generation`), so `evaluate` and
`applicable` have nothing for it.

numpy is imported inside functions so importing this module is cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, Mapping, Sequence

from zoo.errors import InvalidInput

if TYPE_CHECKING:
    import numpy as np

Kind = Literal["classification", "regression", "generation", "generic"]

TOP_K = 5

# kind -> metric name -> meaning
METRICS: dict[str, dict[str, str]] = {
    "classification": {
        "accuracy": "share of held-out samples whose predicted class is the label (the label output when the "
                    "model has one, else the argmax of its scores)",
        "top5_accuracy": "share of held-out samples whose label is among the 5 highest scores (more than 5 "
                         "classes only)",
        "macro_f1": "F1 score averaged over the classes that occur in the labels or the predictions",
    },
    "regression": {
        "mae": "mean absolute error on the held-out split",
        "rmse": "root mean squared error on the held-out split",
        "r2": "coefficient of determination (R²) on the held-out split",
    },
    "generation": {
        "perplexity": "exp of the mean negative log-likelihood of each next token of the held-out `input_ids` "
                      "blocks, teacher-forced (one prefill per block)",
    },
    "generic": {},
}

# metric -> whether a higher value is better (it decides `compare`'s name and sign)
HIGHER_IS_BETTER: dict[str, bool] = {"accuracy": True, "top5_accuracy": True, "macro_f1": True,
                                     "mae": False, "rmse": False, "r2": True, "perplexity": False}
# metrics whose change against the reference is relative ((value - reference) / reference): a
# perplexity's scale depends on the vocabulary and the text, its ratio reads the same everywhere
RELATIVE = frozenset({"perplexity"})

_PRIMARY: dict[str, str] = {"classification": "accuracy", "regression": "mae", "generation": "perplexity"}


def kind_of(task: str) -> Kind:
    """The metric family of a recipe's `task:` (InvalidInput for a malformed or misspelt one).

    An empty task (a stage run outside a recipe) is generic: no metric is claimed for it."""
    from zoo_stages.sections.task import task_kind

    if not task:
        return "generic"
    try:
        return task_kind(task)  # type: ignore[return-value]
    except ValueError as e:
        raise InvalidInput(str(e), hint="fix the recipe's `task:`") from None


def primary_metric(kind: str) -> tuple[str, bool] | None:
    """(name, higher_is_better) of the kind's headline metric: accuracy, mae, perplexity, or None for generic."""
    name = _PRIMARY.get(kind)
    return (name, HIGHER_IS_BETTER[name]) if name else None


def comparison_name(metric: str) -> str:
    """How a build's `metric` against the reference's is named: ``accuracy_drop``, ``mae_increase``."""
    return f"{metric}_drop" if HIGHER_IS_BETTER[metric] else f"{metric}_increase"


def comparison_names(kind: str) -> dict[str, str]:
    """Every comparison metric of `kind` -> its meaning."""
    out = {}
    for metric in METRICS[kind]:
        if metric in RELATIVE:
            out[comparison_name(metric)] = (f"(this build's {metric} - the reference's) / the reference's: "
                                            f"0.05 is 5% above it")
        elif HIGHER_IS_BETTER[metric]:
            out[comparison_name(metric)] = f"reference {metric} minus this build's"
        else:
            out[comparison_name(metric)] = f"this build's {metric} minus the reference's"
    return out


def compare(metric: str, reference: float | None, value: float | None) -> float | None:
    """How much worse `value` is than `reference` (positive = worse), None when either is missing
    (or, for a relative metric, when the reference is not positive)."""
    if reference is None or value is None:
        return None
    if metric in RELATIVE:
        return (value - reference) / reference if reference > 0 else None
    return reference - value if HIGHER_IS_BETTER[metric] else value - reference


def _dims(spec: Any) -> tuple | None:
    return tuple(spec.shape) if spec.shape else None


def _is_float(dtype: str) -> bool:
    return dtype in ("float16", "float32", "float64", "bfloat16")


def _is_int(dtype: str) -> bool:
    return dtype.startswith(("int", "uint"))


def _fits(kind: str, spec: Any) -> bool:
    """Whether output `spec` (name, dtype, shape) can be read as `kind`'s scores. A sequence of
    {class: score} maps (ZipMap) is a classifier's: `onnx_run.run` gives it as (samples, classes)."""
    from zoo_stages.lib.quality.class_maps import is_map_sequence

    if is_map_sequence(spec.dtype):
        return kind == "classification"
    dims = _dims(spec)
    if dims is None or not _is_float(spec.dtype):
        return False
    if kind == "classification":  # (samples, classes), classes unknown or > 1
        return len(dims) == 2 and not (isinstance(dims[1], int) and dims[1] <= 1)
    if kind == "regression":  # (samples,) or (samples, 1)
        return len(dims) == 1 or (len(dims) == 2 and dims[1] == 1)
    return False


def scores_output(output_specs: Sequence[Any], preferred: str | None = None,
                  kind: str = "classification") -> str | None:
    """The output `kind`'s metrics read: classification, the first float (samples, classes) output;
    regression, the first float (samples,) or (samples, 1) output; generic, None.

    `output_specs` are `onnx_run.TensorSpec`-like (name, dtype, shape). `preferred` names the
    output to use; InvalidInput when the model has no such output or it does not fit the task.
    None when no output fits (the task's metrics then do not apply).
    """
    if kind == "generic":
        return None
    if preferred is not None:
        spec = next((s for s in output_specs if s.name == preferred), None)
        if spec is None:
            raise InvalidInput(f"output {preferred!r} is not an output of the model",
                               hint=f"its outputs are {', '.join(s.name for s in output_specs)}")
        if not _fits(kind, spec):
            want = "float (samples, classes)" if kind == "classification" else "float (samples,) or (samples, 1)"
            raise InvalidInput(f"output {preferred!r} ({spec.dtype} {list(spec.shape or [])}) cannot be read as "
                               f"{kind} scores: they must be {want}")
        return preferred
    return next((s.name for s in output_specs if _fits(kind, s)), None)


def label_output(output_specs: Sequence[Any]) -> str | None:
    """The first integer (samples,) output: a classifier's own predicted label, or None."""
    for spec in output_specs:
        dims = _dims(spec)
        if dims is not None and len(dims) == 1 and _is_int(spec.dtype):
            return spec.name
    return None


def applicable(kind: str, *, labelled: bool, scores: str | None, label: str | None,
               classes: int | None) -> list[str]:
    """The metrics `evaluate` reports for these outputs (in `METRICS` order).

    Classification needs labels and a scores or label output (top-5 needs scores with more than
    5 classes); regression needs labels and a scores output; generic has none, and generation none
    from outputs and labels (verify computes perplexity from a decoder's own runs).
    """
    if not labelled or kind in ("generic", "generation"):
        return []
    if kind == "classification":
        out = []
        if scores or label:
            out += ["accuracy"]
            if scores and classes is not None and classes > TOP_K:
                out += ["top5_accuracy"]
            out += ["macro_f1"]
        return out
    return list(METRICS["regression"]) if scores else []


def evaluate(kind: str, outputs: Mapping[str, Any], labels: Any, output: str | None, *,
             label_output: str | None = None) -> dict[str, float]:
    """`kind`'s metrics of a model's `outputs` ({name: array}) against the dataset's `labels`.

    `output` names the scores output (from `scores_output`), `label_output` an integer label
    output (classification only; accuracy then comes from it exactly). {} for a generic or
    generation task, without labels, or without an output to read.
    """
    import numpy as np

    if kind in ("generic", "generation") or labels is None:
        return {}
    labels = np.asarray(labels)
    scores = np.asarray(outputs[output]) if output is not None else None
    if kind == "classification":
        predicted = np.asarray(outputs[label_output]) if label_output is not None else None
        return classification_metrics(labels, scores=scores, predicted=predicted)
    if kind == "regression":
        return {} if scores is None else regression_metrics(labels, scores)
    raise InvalidInput(f"unknown task kind {kind!r}", hint="classification, regression, generation or generic")


def classification_metrics(labels: "np.ndarray", *, scores: "np.ndarray | None" = None,
                           predicted: "np.ndarray | None" = None) -> dict[str, float]:
    """accuracy, top5_accuracy (scores with more than 5 classes) and macro_f1 of integer `labels`.

    The predicted class is `predicted` (a label output) when given, else the argmax of `scores`
    (samples, classes). InvalidInput when a label names a class the scores do not have.
    """
    import numpy as np

    labels = np.asarray(labels).astype(np.int64).reshape(-1)
    if scores is not None:
        scores = np.asarray(scores)
        if scores.ndim != 2:  # (samples,) or (samples, classes, 1...): one row per sample
            scores = scores.reshape(len(scores), -1)
        _check_rows(scores, labels, "scores")
        if len(labels) and int(labels.max()) >= scores.shape[1]:
            raise InvalidInput(f"the dataset has label {int(labels.max())} but the model outputs {scores.shape[1]} "
                               "classes", hint="check model.num_classes against the dataset; if that output is "
                                               "not class scores, set the recipe's `task:` (e.g. feature-extraction) "
                                               "or verify's `output:`")
    if predicted is not None:
        predicted = np.asarray(predicted).astype(np.int64).reshape(-1)
        _check_rows(predicted, labels, "label output")
    elif scores is not None:
        predicted = scores.argmax(axis=1)
    else:
        return {}
    out = {"accuracy": float(np.mean(predicted == labels)) if len(labels) else 0.0}
    if scores is not None and scores.shape[1] > TOP_K:
        out["top5_accuracy"] = top_k_accuracy(scores, labels, TOP_K)
    out["macro_f1"] = macro_f1(labels, predicted)
    return out


def _check_rows(values: "np.ndarray", labels: "np.ndarray", what: str) -> None:
    if len(values) != len(labels):
        raise InvalidInput(f"the model's {what} has {len(values)} rows for {len(labels)} labels",
                           hint="the output must hold one row per sample")


def top_k_accuracy(scores: "np.ndarray", labels: "np.ndarray", k: int) -> float:
    """Share of samples whose label is among the `k` highest scores (ties: the higher class index
    first, as scikit-learn's `top_k_accuracy_score` breaks them)."""
    import numpy as np

    if len(labels) == 0:
        return 0.0
    ranked = np.argsort(scores, axis=1, kind="mergesort")[:, ::-1][:, :k]
    return float(np.mean((ranked == labels[:, None]).any(axis=1)))


def macro_f1(labels: "np.ndarray", predicted: "np.ndarray") -> float:
    """F1 averaged over every class present in `labels` or `predicted` (scikit-learn's macro F1)."""
    import numpy as np

    classes = np.union1d(labels, predicted)
    if classes.size == 0:
        return 0.0
    tp = np.array([np.sum((predicted == c) & (labels == c)) for c in classes], dtype=np.float64)
    fp = np.array([np.sum((predicted == c) & (labels != c)) for c in classes], dtype=np.float64)
    fn = np.array([np.sum((predicted != c) & (labels == c)) for c in classes], dtype=np.float64)
    return float(np.mean(2 * tp / (2 * tp + fp + fn)))  # every class occurs, so no 0/0


def regression_metrics(targets: "np.ndarray", predictions: "np.ndarray") -> dict[str, float]:
    """mae, rmse and r2 of `predictions` ((samples,) or (samples, 1)) against `targets`.

    R² follows scikit-learn for constant targets: 1 when predicted exactly, else 0.
    """
    import numpy as np

    y = np.asarray(targets, dtype=np.float64).reshape(-1)
    p = np.asarray(predictions, dtype=np.float64)
    if p.ndim == 2 and p.shape[1] == 1:
        p = p[:, 0]
    if p.ndim != 1:
        raise InvalidInput(f"regression predictions must be (samples,) or (samples, 1), not {list(p.shape)}")
    _check_rows(p, y, "predictions")
    if len(y) == 0:
        return {"mae": 0.0, "rmse": 0.0, "r2": 0.0}
    err = p - y
    ss_res = float(np.sum(err ** 2))
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else (1.0 if ss_res == 0 else 0.0)
    return {"mae": float(np.mean(np.abs(err))), "rmse": float(np.sqrt(np.mean(err ** 2))), "r2": r2}
