"""The recipe's `task:`: what the model does, which chooses verify's metrics (`zoo_stages.lib.quality.tasks`).

A plain value, not a mapping: `TaskSection.schema` is the name's pattern and `task_kind`, which
maps a name to its metric family and refuses a misspelt classification, regression or generation name.

A recipe may leave `task:` out when its data or model tell it (`TaskSection.infer`, `infer_task`);
the first rule that applies wins:

1. a corpus (``data.source: text``): ``text-generation``;
2. data with labels (``data.label``, which defaults to ``label`` for tables and ``y`` for npz;
   ``label: null`` has none) — the labels' kind is what the loader makes of them
   (`zoo_stages.lib.data.loaded.class_labels`): integer, boolean and text labels are classes
   (``-classification``), float labels values (``-regression``); read from the label column or
   array alone (`zoo_stages.sections.data_probe.label_kind`):
   - ``data.text`` (a column of texts): ``text-classification`` / ``text-regression``;
   - a table (csv, parquet, jsonl): ``tabular-classification`` / ``tabular-regression``;
   - npz with an image array (``x``, or an input mapped to ``image``): ``image-classification`` /
     ``image-regression``; other arrays: ``classification`` / ``regression``;
3. image data whose classes are its folders or labels: ``source: digits`` or ``folder`` (also a
   DVC-tracked folder): ``image-classification``;
4. no data: the model — an image architecture (``arch: alexnet``, ``lenet5``, ``resnet18``…) or a
   transformers ``*ForImageClassification``: ``image-classification``; ``arch: bert`` or a
   ``*ForSequenceClassification``: ``text-classification``; a ``*ForCausalLM``:
   ``text-generation``; an estimator named ``*Classifier`` /
   ``*Regressor`` (sklearn, lightgbm, xgboost): ``tabular-classification`` / ``tabular-regression``.

Nothing else is guessed: an imported ONNX file without data, data without labels, or a DVC-tracked
table (its labels are not beside the recipe) need `task:` when a stage reads it (train, export,
quantize, verify and deploy do: the recipe error names the stage).
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, Field

from zoo.section import RecipeSection

TASK_RE = r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$"
TASK_KINDS = ("classification", "regression", "generation", "generic")
# the last word of a task name that chooses its metric family (any other name is generic)
_FAMILY_WORDS = ("classification", "regression", "generation")
TASK_DESCRIPTION = (
    "what the model does; it chooses verify's metrics. `classification` and any `*-classification` "
    "(image-, text-, tabular-classification, ...): accuracy, top5_accuracy, macro_f1; `regression` and any "
    "`*-regression` (tabular-regression, ...): mae, rmse, r2; `text-generation` and any `*-generation` (a decoder "
    "with a KV cache): perplexity, greedy agreement with the reference, prefill latency and decode tokens/s; "
    "`generic` and every other name "
    "(object-detection, feature-extraction, embedding, ...): no task metrics, parity per output only. "
    "Lowercase words joined by '-'")
INFERRED = (". Default: told from the data and the model (a table's label column: tabular-classification or "
            "-regression by the labels' type; a text column: text-; a corpus, source: text: text-generation; image "
            "data: image-classification; an image architecture; a *ForCausalLM: text-generation; an estimator's "
            "name); required when they do not tell it")


def task_kind(task: str) -> str:
    """The metric family of a recipe's `task:`: "classification", "regression", "generation" or "generic".

    ``classification``/``regression``/``generation`` and every ``*-classification``/``*-regression``/
    ``*-generation`` name (``text-generation``) map to those; any other well-formed name
    (``object-detection``, ``feature-extraction``) is generic. ValueError for a malformed name or one
    that looks like a misspelt family word (``image-clasification``, ``tabular-regressor``,
    ``text-genaration``), which would otherwise lose its metrics silently.
    """
    if not isinstance(task, str) or not re.fullmatch(TASK_RE, task):
        raise ValueError(f"task {task!r} must be lowercase words joined by '-', e.g. image-classification")
    words = task.split("-")
    for word in words:
        if word in _FAMILY_WORDS:
            continue
        close = difflib.get_close_matches(word, list(_FAMILY_WORDS), n=1, cutoff=0.8)
        stem = next((f for f in _FAMILY_WORDS if word.startswith(f[:7])), None)
        if close or stem:
            meant = close[0] if close else stem
            fixed = "-".join(meant if w == word else w for w in words)
            raise ValueError(f"task {task!r}: did you mean {fixed!r}? (tasks ending in -classification, "
                             "-regression or -generation get that task's metrics; any other name is generic)")
    if words[-1] in _FAMILY_WORDS:
        return words[-1]
    return "generic"


def _known_task(name: str) -> str:
    task_kind(name)  # refuses misspelt classification/regression names
    return name


class TaskSection(RecipeSection):
    """`task:`, told from the data and the model when the recipe leaves it out (the module docstring)."""

    schema = Annotated[str, Field(pattern=TASK_RE, description=TASK_DESCRIPTION + INFERRED), AfterValidator(_known_task)]
    missing_hint = ("add `task:` at the top level: image-classification, text-classification, tabular-classification, "
                    "tabular-regression, text-generation, … or generic (no labels: parity only)")

    @classmethod
    def infer(cls, sections: dict[str, Any], recipe_dir: Path) -> str | None:
        return infer_task(sections.get("data"), sections.get("model"), recipe_dir)


def infer_task(data: dict[str, Any] | None, model: dict[str, Any] | None, recipe_dir: Path) -> str | None:
    """The task the data and model tell (rules in the module docstring); None when they do not."""
    if data:
        from zoo_stages.sections.data import data_format
        from zoo_stages.sections.data_probe import label_kind, npz_arrays

        fmt = data_format(data["source"], data.get("format"), data.get("path"))
        if fmt == "text":
            return "text-generation"
        if fmt in ("digits", "folder"):
            return "image-classification"
        kind = label_kind(data, recipe_dir)
        if kind is None:
            return None
        if data.get("text") is not None:
            return f"text-{kind}"
        if fmt in ("csv", "parquet", "jsonl"):
            return f"tabular-{kind}"
        inputs = data.get("inputs")
        arrays = [] if inputs else npz_arrays(_beside(data["path"], recipe_dir)) or []
        images = "image" in inputs if inputs else any(a in ("x", "image") for a in arrays)
        return f"image-{kind}" if images else kind
    return _model_task(model or {})


def _model_task(model: dict[str, Any]) -> str | None:
    from zoo_stages.lib.models.archs import IMAGE_ARCHS

    arch, architecture, estimator = model.get("arch"), model.get("architecture") or "", model.get("estimator") or ""
    if arch in IMAGE_ARCHS or architecture.endswith("ForImageClassification"):
        return "image-classification"
    if arch == "bert" or architecture.endswith("ForSequenceClassification"):
        return "text-classification"
    if architecture.endswith("ForCausalLM"):
        return "text-generation"
    for suffix, task in (("Classifier", "tabular-classification"), ("Regressor", "tabular-regression")):
        if estimator.endswith(suffix):
            return task
    return None


def _beside(given: str, recipe_dir: Path) -> Path:
    p = Path(given).expanduser()
    return p if p.is_absolute() else recipe_dir / p
