"""Keras 3 models: training through the recipe's function, the ``.keras`` checkpoint, export.

Backend: JAX. Keras 3 runs on TensorFlow, JAX or torch, chosen once per process (``KERAS_BACKEND``
before the first ``import keras``). Keras' own ONNX export (``model.export(format="onnx")``) then
goes through tf2onnx (TensorFlow), jax2onnx (JAX) or torch.onnx (torch). zoo uses JAX:
- TensorFlow is a 600 MB wheel, and the tf2onnx path needs Keras' numpy-2 patches of it;
- on the torch backend Keras exports a dynamic batch with torch's deprecated TorchScript exporter,
  and the graph carries a Cast around every op and numbered output names;
- on JAX, jax2onnx writes the plain graph (MatMul, Add, Relu, Softmax for an MLP) and is the
  converter of the ``jax`` framework too, so one extra serves both.
`backend` sets ``KERAS_BACKEND=jax`` when Keras is not imported yet (overriding the
environment's: the checkpoint and export bytes depend on the backend) and refuses a process
whose Keras already runs on another backend.

Checkpoint: ``model.keras``, Keras' zip of ``config.json`` (the architecture as data),
``metadata.json`` and ``model.weights.h5``, loaded with ``safe_mode=True`` (a Lambda layer's
Python bytecode is refused), so it runs no code. `save` makes the bytes reproducible: Keras stamps
the save time (``date_saved``, the zip entries' dates) and marks shared objects by Python object
ids (``shared_object_id``); the time is dropped, entries dated 1980-01-01 and the ids renumbered
in order of appearance. The HDF5 weights file holds no times (h5py does not track them).
"""

from __future__ import annotations

import io
import json
import os
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any, Mapping

from zoo.errors import InvalidInput

CHECKPOINT = "model.keras"
BACKEND = "jax"
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)


def backend() -> Any:
    """The ``keras`` module, running on the JAX backend (see the module docstring)."""
    if "keras" not in sys.modules:
        os.environ["KERAS_BACKEND"] = BACKEND
    import keras

    if keras.backend.backend() != BACKEND:
        raise InvalidInput(f"Keras already runs on the {keras.backend.backend()} backend in this process; zoo "
                           f"trains and exports Keras models on {BACKEND}",
                           hint=f"run zoo without importing Keras first, or set KERAS_BACKEND={BACKEND}")
    return keras


def fit(entry: str, model_section: Mapping[str, Any], recipe_dir: Path, train: Any, val: Any,
        config: Mapping[str, Any], seed: int, context: Any) -> Any:
    """The trained ``keras.Model`` that ``entry(train, val, config, context)`` returns."""
    from zoo_stages.lib.models import archs
    from zoo_stages.lib.models.entry_models.user_code import user_code

    keras = backend()
    if model_section.get("entry"):
        raise InvalidInput("model.entry builds torch networks and JAX forward functions; a Keras model is built "
                           "and trained by the train stage's `config.entry`", hint="remove `model.entry`")
    fn = archs.load_function(entry, recipe_dir, "config.entry")
    with user_code(seed):
        # automatic layer names ("dense_3") count per process: start from a fresh session so a
        # second training in the same process gives the same names, hence the same bytes
        keras.backend.clear_session()
        keras.utils.set_random_seed(seed)
        model = fn(train, val, dict(config), context)
    if not isinstance(model, keras.Model):
        raise InvalidInput(f"config.entry {entry!r} returned {type(model).__name__}, not a keras.Model",
                           hint="return the trained model")
    return model


def save(model: Any, target: Path) -> Path:
    """Write `model` as a reproducible ``.keras`` archive at `target`, checked to load safely."""
    from zoo.files import atomic_write

    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / CHECKPOINT
        model.save(raw)
        atomic_write(target, reproducible_archive(raw.read_bytes()), fsync=False)
    try:
        load(target)
    except Exception as e:
        raise InvalidInput(f"the trained Keras model does not load back with safe_mode=True: {e}",
                           hint="use Keras' built-in layers (a Lambda layer holds Python code), or register custom "
                                "classes with keras.saving.register_keras_serializable") from None
    return target


def load(checkpoint: Path, model_section: Mapping[str, Any] | None = None, recipe_dir: Path | None = None) -> Any:
    """The model in a ``.keras`` checkpoint, loaded with ``safe_mode=True`` (no code runs)."""
    keras = backend()
    return keras.saving.load_model(str(checkpoint), safe_mode=True, compile=False)


def predict(model: Any, inputs: list[Any]) -> list[Any]:
    """Keras' outputs on `inputs` (float32 arrays in the model's input order), flattened, as numpy."""
    import numpy as np

    keras = backend()
    outputs = model(inputs[0] if len(inputs) == 1 else list(inputs), training=False)
    return [np.asarray(o) for o in keras.tree.flatten(outputs)]


def to_onnx(model: Any, inputs: Mapping[str, Any], opset: int) -> Any:
    """The model as an onnx ModelProto, from Keras' own ONNX export (jax2onnx on the JAX backend):
    one float32 input per entry of `inputs` (example arrays), batch axis ``batch``."""
    import onnx

    keras = backend()
    specs = [keras.InputSpec(shape=(None, *a.shape[1:]), dtype="float32", name=name) for name, a in inputs.items()]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.onnx"
        model.export(str(path), format="onnx", verbose=False, opset_version=opset,
                     input_signature=specs if len(specs) == 1 else [specs])
        return onnx.load(str(path))


def parameter_count(model: Any) -> int:
    return int(model.count_params())


def reproducible_archive(blob: bytes) -> bytes:
    """A ``.keras`` zip without its save time, its entries dated 1980-01-01 and its
    ``shared_object_id`` values renumbered 1, 2, ... in order of appearance."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(blob)) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename == "metadata.json":
                metadata = json.loads(data)
                metadata.pop("date_saved", None)
                data = json.dumps(metadata).encode()
            elif info.filename == "config.json":
                data = json.dumps(_renumber_shared_ids(json.loads(data), {})).encode()
            entry = zipfile.ZipInfo(info.filename, date_time=_ZIP_DATE)
            entry.compress_type = info.compress_type
            entry.external_attr = 0o644 << 16
            dst.writestr(entry, data)
    return out.getvalue()


def _renumber_shared_ids(node: Any, ids: dict[int, int]) -> Any:
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key == "shared_object_id" and isinstance(value, int):
                out[key] = ids.setdefault(value, len(ids) + 1)
            else:
                out[key] = _renumber_shared_ids(value, ids)
        return out
    if isinstance(node, list):
        return [_renumber_shared_ids(v, ids) for v in node]
    return node
