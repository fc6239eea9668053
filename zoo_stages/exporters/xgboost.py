"""The XGBoost exporter: the train stage's model (XGBoost JSON) to ONNX with onnxmltools,
parity-gated on the held-out rows (`base.EstimatorExporter`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zoo_stages.exporters.base import EstimatorExporter


class XGBoostExporter(EstimatorExporter):
    name = "xgboost"
    extra = "xgboost"
    modules = ("xgboost", "onnxmltools")
    tools = ("xgboost", "xgboost-cpu", "onnxmltools", "onnxconverter-common", "numpy")
    summary = "XGBoost models via onnxmltools"
    max_opset = 15  # onnxmltools' XGBoost converter writes at most opset 15

    def load(self, checkpoint: Path, kind: str) -> Any:
        return self.estimators().load(checkpoint, kind)

    def to_onnx(self, model: Any, input_name: str, width: int, opset: int) -> Any:
        import onnxmltools
        from onnxmltools.convert.common.data_types import FloatTensorType

        return onnxmltools.convert_xgboost(model, initial_types=[(input_name, FloatTensorType([None, width]))],
                                           target_opset=opset)

    def predict(self, model: Any, features: Any, kind: str) -> dict[str, Any]:
        import numpy as np

        if kind == "classification":
            return {"label": np.asarray(model.predict(features)).astype(np.int64),
                    "probabilities": np.asarray(model.predict_proba(features), dtype=np.float32)}
        return {"variable": np.asarray(model.predict(features), dtype=np.float32).reshape(-1, 1)}
