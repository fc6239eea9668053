"""The LightGBM exporter: the train stage's booster (LightGBM's text model) to ONNX with
onnxmltools, parity-gated on the held-out rows (`base.EstimatorExporter`).

LightGBM keeps split thresholds as float64 and compares ``x <= threshold`` in float64; the ONNX
TreeEnsemble holds float32 thresholds, which onnxmltools rounds to nearest. A float32 input lying
between a threshold and its rounded-up float32 value then takes the other branch (seen on the
breast-cancer data: 2 of 286 probabilities off by 1.4e-3). Rounding every numerical threshold
down to float32 instead (`float32_thresholds`) gives the same decisions for every float32 input
(``x <= t`` exactly when ``x <= t'``, t' the largest float32 not above t), so the converter
gets that booster and the parity gate compares with the original one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zoo_stages.exporters.base import EstimatorExporter


class LightGBMExporter(EstimatorExporter):
    name = "lightgbm"
    extra = "lightgbm"
    modules = ("lightgbm", "onnxmltools")
    tools = ("lightgbm", "onnxmltools", "onnxconverter-common", "numpy")
    summary = "LightGBM boosters via onnxmltools"
    max_opset = 15  # onnxmltools' LightGBM converter writes at most opset 15

    def load(self, checkpoint: Path, kind: str) -> Any:
        return self.estimators().load(checkpoint)

    def to_onnx(self, model: Any, input_name: str, width: int, opset: int) -> Any:
        import onnxmltools
        from onnxmltools.convert.common.data_types import FloatTensorType

        import lightgbm

        exact = lightgbm.Booster(model_str=float32_thresholds(model.model_to_string()))
        return onnxmltools.convert_lightgbm(exact, initial_types=[(input_name, FloatTensorType([None, width]))],
                                            target_opset=opset, zipmap=False)

    def predict(self, model: Any, features: Any, kind: str) -> dict[str, Any]:
        import numpy as np

        raw = np.asarray(model.predict(features), dtype=np.float64)
        if kind != "classification":
            return {"variable": raw.astype(np.float32).reshape(-1, 1)}
        # a binary booster gives P(class 1); a multiclass one a row per sample
        probabilities = np.stack([1 - raw, raw], axis=1) if raw.ndim == 1 else raw
        return {"label": np.argmax(probabilities, axis=1).astype(np.int64),
                "probabilities": probabilities.astype(np.float32)}


def float32_thresholds(model_text: str) -> str:
    """LightGBM's text model with the thresholds of its numerical splits rounded down to float32
    values (categorical splits, decision_type bit 0, are left alone) and without the header's
    ``tree_sizes`` (the blocks' byte sizes, which the new numbers change)."""
    import numpy as np

    lines = model_text.split("\n")
    decisions: dict[int, list[str]] = {}  # a tree's threshold line index -> its decision types
    pending: int | None = None
    for i, line in enumerate(lines):
        if line.startswith("threshold="):
            pending = i
        elif line.startswith("decision_type=") and pending is not None:
            decisions[pending] = line.removeprefix("decision_type=").split()
            pending = None
    for i, types in decisions.items():
        values = lines[i].removeprefix("threshold=").split()
        for j, (value, decision) in enumerate(zip(values, types)):
            if int(decision) & 1:
                continue
            t = float(value)
            down = np.float32(t)
            if float(down) > t:
                down = np.nextafter(down, np.float32(-np.inf))
            values[j] = repr(float(down))
        lines[i] = "threshold=" + " ".join(values)
    # the header's byte sizes of the tree blocks no longer hold: LightGBM then reads tree by tree
    return "\n".join(line for line in lines if not line.startswith("tree_sizes="))
