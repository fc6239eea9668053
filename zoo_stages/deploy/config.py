"""deploy's config: the builds of a release (`BuildSpec`) and the stage's options (`DeployConfig`),
with the defaults that depend on a build's conversion (its tools, its parity tolerance)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from zoo.manifest import BUILD_RE
from zoo.stage import KindConfig

# flatbuffers writes the canonical .ort bytes (see convert.canonical_ort_bytes), so its version
# matters to `convert: ort` builds; openvino to `convert: openvino` ones
BASE_TOOLS = ("onnx", "onnxruntime")
CONVERSION_TOOLS = {"ort": ("flatbuffers",), "openvino": ("openvino",)}
# default parity tolerances per conversion: fp16 rounds every weight and activation, while the
# ORT format runs the very same kernels (only graph optimizations are baked in)
DEFAULT_TOLERANCES = {"fp16": (1e-2, 1e-2), "ort": (1e-4, 1e-4), "openvino": (1e-3, 1e-3), "tensorrt": (1e-2, 1e-2)}
# options about what happens around the release, not what it holds: left out of its provenance
SIDE_EFFECT_OPTIONS = {"publish", "measurements"}


class BuildSpec(KindConfig):
    """One device build of the release."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    source: str = Field(alias="from", min_length=1,
                        description="id of the upstream stage whose `model` output this build ships")
    convert: Literal["fp16", "ort", "openvino", "tensorrt"] | None = Field(
        None, description="fp16: float16 weights/compute with float32 I/O (CUDA); ort: ORT format (mobile); "
                          "openvino: OpenVINO IR (model.xml + model.bin) for its CPU plugin, float32 inference "
                          "pinned; from a QDQ model it runs int8; tensorrt: the source model for onnxruntime's "
                          "TensorRT provider with its engine options (fp16, or int8 from a QDQ model)")
    verified_as: str | None = Field(
        None, description="name of the build in verify's report to take metrics/vectors from "
                          "(for converted builds: the verified build of the source model)")
    optimization_style: Literal["Fixed", "Runtime"] | None = Field(
        None, description="ORT format only: Fixed (default) bakes optimizations in; Runtime saves some "
                          "for compiling execution providers (NNAPI, CoreML)")
    atol: float | None = Field(None, ge=0, description="parity tolerance of a conversion (default fp16 1e-2, ort 1e-4)")
    rtol: float | None = Field(None, ge=0, description="relative parity tolerance (default fp16 1e-2, ort 1e-4)")
    precision: str | None = Field(None, description="override the precision read from the model (fp32, fp16, int8); "
                                                    "tensorrt: the engine's (default fp16, int8 for a QDQ model)")
    execution_providers: list[str] | None = Field(
        None, description="providers to list in the manifest (default: CUDA then CPU for fp16, CPU otherwise)")
    requires: dict[str, str] | None = Field(None, description="extra requirements, e.g. {device: cuda}")
    op_block_list: list[str] = Field(default_factory=list,
                                     description="fp16 only: operator types to keep in float32")

    @model_validator(mode="after")
    def _options_match_conversion(self):
        if self.optimization_style is not None and self.convert != "ort":
            raise ValueError("`optimization_style` applies to `convert: ort` builds only")
        if self.op_block_list and self.convert != "fp16":
            raise ValueError("`op_block_list` applies to `convert: fp16` builds only")
        return self

    def tolerance(self) -> tuple[float, float]:
        """(atol, rtol) of this conversion's parity check: the build's own, else its conversion's default."""
        atol, rtol = DEFAULT_TOLERANCES[self.convert]
        return (self.atol if self.atol is not None else atol, self.rtol if self.rtol is not None else rtol)


class DeployConfig(KindConfig):
    """Config of the deploy kind."""

    builds: dict[str, BuildSpec] = Field(min_length=1, description="build name -> how to make it")
    publish: bool = Field(True, description="publish the release to the local zoo")
    intended_use: str = Field("", description="model card: intended use (a generic text by default)")
    limitations: str = Field("", description="model card: limitations (a generic text by default)")
    parity_samples: int | None = Field(None, ge=1, description="held-out samples for parity checks (default: all)")
    vector_samples: int = Field(8, ge=1, description="samples per generated test vector when verify has none")
    check_vectors: bool = Field(True, description="re-run verify's test vectors against each shipped model")
    measurements: bool = Field(
        True, description="add verify's timing measurements (latency, throughput, speedup) to the PUBLISHED "
                          "manifest and card; the stage's own release output never holds them, so it stays "
                          "bit-reproducible")

    @field_validator("builds", mode="before")
    @classmethod
    def _shorthand(cls, v):
        # `cpu-fp32: optimize` is short for `cpu-fp32: {from: optimize}`
        if isinstance(v, dict):
            return {k: ({"from": spec} if isinstance(spec, str) else spec) for k, spec in v.items()}
        return v

    @field_validator("builds")
    @classmethod
    def _build_names(cls, v):
        for name in v:
            if not re.match(BUILD_RE, name):
                raise ValueError(f"build name {name!r} must be lowercase letters, digits, '.', '_' or '-' "
                                 "(e.g. cpu-fp32)")
        return v

    def tools(self) -> tuple[str, ...]:
        """onnx and onnxruntime, and the converter of each `convert:` the builds use."""
        return tuple(sorted({*BASE_TOOLS, *(t for b in self.builds.values() for t in CONVERSION_TOOLS.get(b.convert, ()))}))
