"""Models that the recipe's own Python builds and trains: Keras 3 and JAX (``model.framework``).

zoo cannot declare every network of these frameworks, so the recipe names functions in its own
files (paths relative to the recipe, ``file.py:function``), as a torch ``config.entry`` does:

Keras (``model.framework: keras``): the train stage's ``config.entry`` is called as
``function(train, val, config, context)`` and returns the trained ``keras.Model``. zoo saves it
as a ``.keras`` archive and loads it back with ``safe_mode=True`` (no Lambda layers or other
Python code: built-in layers, or classes registered with ``keras.saving.register_keras_serializable``
in a module export can import). Keras runs on its JAX backend (`keras.backend`).

JAX (``model.framework: jax``, plain JAX or Flax): ``model.entry`` names the forward function
``apply(params, *inputs)`` (jax-traceable; a Flax module's ``module.apply`` in a wrapper), which
train, export and the parity gate call; the train stage's ``config.entry`` is called as
``function(apply, train, val, config, context)`` and returns the trained parameters: a nested
mapping of string keys (no ``/`` in them) to arrays, such as Flax's ``variables``. zoo saves them
as safetensors (`jax.save`).

For both: ``train`` and ``val`` are `zoo_stages.lib.models.training_split.TrainingSplit` objects (``.features``: the
data's features by name as float32 arrays, samples along axis 0, in the data's order; ``.labels``;
a single-feature split also unpacks as ``x, y = train``), ``config`` the train stage's config as a
plain dict (``seed``, ``epochs``, ``batch_size``, ...), ``context`` the `StageContext`. Before the
call numpy's, Python's (and Keras') global generators are seeded with ``config.seed``; a JAX
function seeds its own keys from ``config["seed"]``. What the function prints goes to stderr, so
progress bars never mix with ``zoo run --json``. The model's inputs are the data's features in
that order (a single one named ``model.input_name`` or the feature's name), float32 with a
dynamic batch axis; its outputs are named ``model.output_name`` (``output_name_0``, ... for
several), in the order the model returns them (flattened).

The checkpoint formats hold data, never code, and the same training gives the same bytes (see
each module). This package's modules import their frameworks inside functions.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import ModuleType
from typing import Any, Mapping

from zoo.errors import InvalidInput
from zoo.stage import StageContext

FRAMEWORKS = ("keras", "jax")
# the distributions whose versions decide a checkpoint's or an export's bytes (the kinds' `tools`)
ENTRY_MODEL_TOOLS = ("keras", "h5py", "jax", "jaxlib", "flax", "jax2onnx", "onnx-ir")


def framework(name: str) -> ModuleType:
    """The module of framework `name` (`keras` or `jax`); imports no framework."""
    from zoo_stages.lib.models.entry_models import jax, keras

    modules = {"keras": keras, "jax": jax}
    if name not in modules:
        raise InvalidInput(f"no entry-function training for framework {name!r}",
                           hint=f"frameworks trained by `config.entry`: {', '.join(FRAMEWORKS)}")
    return modules[name]


def model_features(split: Any, model_section: Mapping[str, Any]) -> dict[str, Any]:
    """The split's features as the model takes them: float32 arrays by input name, in the data's
    order (a single feature is named ``model.input_name`` when the recipe sets it)."""
    import numpy as np

    features = dict(split.features)
    if not features:
        raise InvalidInput("the data gives no features")
    not_numbers = [name for name, a in features.items() if np.asarray(a).dtype.kind not in "fiub"]
    if not_numbers:
        raise InvalidInput(f"Keras and JAX models take numeric features; {', '.join(not_numbers)} "
                           "are not numbers", hint="use a table, image or array data source")
    if len(features) == 1 and model_section.get("input_name"):
        features = {model_section["input_name"]: next(iter(features.values()))}
    return {name: np.ascontiguousarray(a, dtype=np.float32) for name, a in features.items()}


def output_names(model_section: Mapping[str, Any], count: int) -> list[str]:
    """The names of the model's `count` outputs: ``model.output_name``, numbered when several."""
    base = model_section.get("output_name") or "logits"
    return [base] if count == 1 else [f"{base}_{i}" for i in range(count)]


def run(config: Any, context: StageContext) -> Mapping[str, Path]:
    """The train stage for Keras and JAX models: call the recipe's function, save the checkpoint."""
    from zoo_stages.lib.data import datasets
    from zoo_stages.lib.quality import tasks
    from zoo_stages.lib.models.training_split import TrainingSplit

    model_section = dict(context.shared.get("model") or {})
    name = model_section["framework"]
    data = dict(context.shared.get("data") or {})
    if not data:
        raise InvalidInput("the train stage needs the recipe's `data:` section",
                           hint="add e.g. `data: {source: csv, path: data/table.csv, label: target}`")
    if not config.entry:
        raise InvalidInput(f"a {name} model is trained by the recipe's function: set the train stage's "
                           "`config.entry: file.py:function`",
                           hint="see the contract in the README (Keras and JAX models)")
    if config.freeze:
        raise InvalidInput("config.freeze applies to torch models", hint="freeze layers in your training function")
    fw = framework(name)
    kind = tasks.kind_of(context.shared.get("task") or "")
    train = datasets.load_split(data, context.recipe.dir, "train")
    val = datasets.load_split(data, context.recipe.dir, "val")
    x_train, x_val = model_features(train, model_section), model_features(val, model_section)
    started = time.perf_counter()
    trained = fw.fit(config.entry, model_section, context.recipe.dir, TrainingSplit(x_train, train.labels),
                     TrainingSplit(x_val, val.labels), config.model_dump(mode="json"), config.seed, context)
    seconds = time.perf_counter() - started
    path = fw.save(trained, context.output_path(fw.CHECKPOINT))

    figures: dict[str, float] = {}
    for split, x, labels in (("train", x_train, train.labels), ("val", x_val, val.labels)):
        figures.update({f"{split}_{k}": v for k, v in
                        evaluate(fw.predict(trained, list(x.values())), labels, kind).items()})
    context.metrics.update({
        **{k: round(v, 6) for k, v in figures.items()},
        "framework": name,
        "entry": config.entry,
        "num_parameters": fw.parameter_count(trained),
        "samples": len(train),
        "seconds": round(seconds, 3),
        "split": datasets.split_info(data, context.recipe.dir),
    })
    context.log.info("trained %s model: %s in %.1fs", name,
                     " ".join(f"{k} {v:.4f}" for k, v in figures.items() if k.startswith("val_")), seconds)
    return {"checkpoint": path}


def evaluate(outputs: list[Any], labels: Any, kind: str) -> dict[str, float]:
    """Accuracy (argmax of a (samples, classes) first output) or mean absolute error (a 1-wide
    output); nothing for other tasks or data without labels."""
    import numpy as np

    if labels is None or not len(labels) or not outputs:
        return {}
    first = np.asarray(outputs[0])
    if kind == "classification" and first.ndim == 2 and first.shape[1] > 1:
        return {"accuracy": float(np.mean(first.argmax(axis=1) == np.asarray(labels)))}
    if kind == "regression" and first.size == len(labels):
        return {"mae": float(np.mean(np.abs(first.reshape(-1) - np.asarray(labels, dtype=np.float64))))}
    return {}
