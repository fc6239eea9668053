"""The JAX exporter: a JAX or Flax forward function (``model.entry``) with the parameters that the
recipe's ``config.entry`` trained (the train stage's safetensors checkpoint), converted by
jax2onnx and parity-gated against JAX on the held-out data (`entry_models.EntryModelExporter`)."""

from __future__ import annotations

from zoo_stages.exporters.entry_models import EntryModelExporter


class JaxExporter(EntryModelExporter):
    name = "jax"
    extra = "jax"
    modules = ("jax", "jax2onnx", "safetensors")
    tools = ("jax", "jaxlib", "flax", "jax2onnx", "onnx-ir", "safetensors", "numpy")
    summary = "JAX/Flax forward functions (model.entry) with trained parameters via jax2onnx"
    needs_forward_entry = True
