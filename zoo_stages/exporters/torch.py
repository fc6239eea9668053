"""The torch exporter: the recipe's torch architecture (``model.arch`` or ``model.entry``) with
the checkpoint's or the fetched ``weights:``'s tensors, exported as the export kind has always
done it (`zoo_stages.export`: TorchScript or dynamo exporter, random-input parity gate)."""

from __future__ import annotations

from typing import Any, Mapping

from zoo_stages.exporters.base import ExportJob, Exporter, ModelFieldError, refuse_transformers_fields


class TorchExporter(Exporter):
    name = "torch"
    extra = "torch"
    modules = ("torch", "safetensors")
    tools = ("torch", "onnxscript", "safetensors", "numpy")
    summary = "torch.nn.Module (built-in arch or model.entry) via torch.onnx"

    @classmethod
    def tools_for(cls, model: Mapping[str, Any]) -> tuple[str, ...]:
        """`tools`, and transformers for the architecture it builds (bert), and onnx, whose converter
        turns a `model.from` parent into the torch network."""
        from zoo_stages.lib import archs

        extra = ("transformers",) if archs.modality(model) == "text" else ()
        return (*cls.tools, *extra, *(("onnx",) if model.get("from") else ()))

    @classmethod
    def check_model(cls, model: Mapping[str, Any]) -> None:
        for field in ("estimator", "params"):
            if model.get(field) is not None:
                raise ModelFieldError((field,), f"model.{field} applies to estimator frameworks (sklearn, lightgbm, "
                                                "xgboost), not to torch models",
                                      hint="set `framework:` to the estimator's framework, or remove the field")
        refuse_transformers_fields(model, cls.name)

    def export(self, job: ExportJob) -> None:
        from zoo_stages.export import _export_torch

        _export_torch(job.source, job.label, job.config, job.context, job.target, job.props)
