"""The Keras exporter: a Keras 3 model that the recipe's ``config.entry`` trained (the train
stage's ``.keras`` checkpoint), exported by Keras' own ``model.export(format="onnx")`` on the JAX
backend (jax2onnx; why JAX and not TensorFlow or torch: `zoo_stages.lib.models.entry_models.keras`),
parity-gated against Keras on the held-out data (`entry_models.EntryModelExporter`)."""

from __future__ import annotations

from zoo_stages.exporters.entry_models import EntryModelExporter


class KerasExporter(EntryModelExporter):
    name = "keras"
    extra = "keras"
    modules = ("keras", "h5py", "jax", "jax2onnx")
    tools = ("keras", "h5py", "jax", "jaxlib", "jax2onnx", "onnx-ir", "numpy")
    summary = "Keras 3 models (trained by config.entry) via Keras' ONNX export on the JAX backend"
