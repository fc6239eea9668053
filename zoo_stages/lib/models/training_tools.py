"""The distributions train uses for a recipe's ``model:`` section: their versions enter train's
key and lock record (`zoo.stage.StageKind.tools_used`), and no other framework's do, so another
version of LightGBM does not retrain a torch network.
"""

from __future__ import annotations

from typing import Any, Mapping

# what each framework's fitting reads and writes with (its checkpoint format included)
FRAMEWORK_TOOLS: dict[str, tuple[str, ...]] = {
    "torch": ("torch", "safetensors", "numpy"),
    "transformers": ("torch", "transformers", "tokenizers", "safetensors", "numpy"),
    "sklearn": ("scikit-learn", "skops", "numpy"),
    "lightgbm": ("lightgbm", "numpy"),
    "xgboost": ("xgboost", "xgboost-cpu", "numpy"),
    "keras": ("keras", "h5py", "jax", "jaxlib", "numpy"),
    "jax": ("jax", "jaxlib", "flax", "safetensors", "numpy"),
}


def for_model(model: Mapping[str, Any]) -> tuple[str, ...]:
    """The tools of the model's framework (torch when none is named); a torch network built from a
    transformers config (``arch: bert``) adds transformers, a `model.from` parent adds onnx (its
    ONNX file becomes the network through `zoo.onnx_to_torch`)."""
    framework = model.get("framework") or "torch"
    tools = FRAMEWORK_TOOLS.get(framework, FRAMEWORK_TOOLS["torch"])
    if framework == "torch" and model.get("arch") == "bert":
        tools = (*tools, "transformers")
    if model.get("from"):
        tools = (*tools, "onnx")
    return tuple(sorted(set(tools)))
