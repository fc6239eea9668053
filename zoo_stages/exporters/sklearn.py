"""The scikit-learn exporter: a fitted estimator or pipeline (the train stage's skops checkpoint)
to ONNX with skl2onnx, parity-gated on the held-out rows (`base.EstimatorExporter`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zoo_stages.exporters.base import EstimatorExporter

ML_OPSET = 3  # ai.onnx.ml: TreeEnsembleClassifier/Regressor as onnxruntime runs them


class SklearnExporter(EstimatorExporter):
    name = "sklearn"
    extra = "sklearn"
    modules = ("sklearn", "skl2onnx", "skops")
    tools = ("scikit-learn", "skl2onnx", "onnxconverter-common", "skops", "numpy")
    summary = "scikit-learn estimators and pipelines via skl2onnx"
    max_opset = 21

    def load(self, checkpoint: Path, kind: str) -> Any:
        return self.estimators().load(checkpoint)

    def to_onnx(self, model: Any, input_name: str, width: int, opset: int) -> Any:
        from skl2onnx import to_onnx
        from skl2onnx.common.data_types import FloatTensorType

        options = {"zipmap": False} if hasattr(model, "predict_proba") else None
        return to_onnx(model, initial_types=[(input_name, FloatTensorType([None, width]))],
                       target_opset={"": opset, "ai.onnx.ml": ML_OPSET},
                       options={id(model): options} if options else None)

    def predict(self, model: Any, features: Any, kind: str) -> dict[str, Any]:
        import numpy as np

        if kind == "classification":
            return {"label": np.asarray(model.predict(features)).astype(np.int64),
                    "probabilities": np.asarray(model.predict_proba(features), dtype=np.float32)}
        return {"variable": np.asarray(model.predict(features), dtype=np.float32).reshape(-1, 1)}
