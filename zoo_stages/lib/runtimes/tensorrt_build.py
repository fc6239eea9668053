"""TensorRT builds: an ONNX model that onnxruntime's TensorRT execution provider compiles into an
engine for the NVIDIA GPU it runs on.

A TensorRT engine is specific to one GPU model and one TensorRT version, so the build ships the
ONNX model (a stamped copy of its source) and the provider options that make the engine: its
precision (``trt_fp16_enable``, and ``trt_int8_enable`` for a QDQ model) and an engine cache, so
the engine is built once, on the first session, and reused. The options are the build's
``provider_options`` in the manifest; `zoo.load` creates the session with them.

TensorRT parses standard ONNX only (onnxruntime's ``com.microsoft`` fused ops would run outside
the engine), and runs int8 only as *explicit* quantization: every QuantizeLinear/DequantizeLinear
in int8 with a zero point of 0 (symmetric), biases left in float (quantize's ``preset: tensorrt``
makes such a model). Both are checked here, on any host, before anything
is built: a model TensorRT would reject or silently run in pieces is refused with the fix.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import onnx

TENSORRT_PROVIDER = "TensorrtExecutionProvider"
CUDA_PROVIDER = "CUDAExecutionProvider"
CPU_PROVIDER = "CPUExecutionProvider"
PRECISIONS = ("fp32", "fp16", "int8")
_QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")


def provider_options(precision: str, *, cache_dir: str = "trt-engines") -> dict[str, str]:
    """The TensorRT execution provider's options for a build of `precision` (fp32, fp16, int8).

    fp16 and int8 both enable fp16 kernels (in int8, for the layers the QDQ model leaves in float);
    the engine and timing caches go to `cache_dir` (relative: beside the process's working folder).
    Values are strings, as onnxruntime's provider options are."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown TensorRT precision {precision!r}; one of {', '.join(PRECISIONS)}")
    options = {"trt_engine_cache_enable": "True", "trt_engine_cache_path": cache_dir,
               "trt_timing_cache_enable": "True", "trt_timing_cache_path": cache_dir}
    if precision in ("fp16", "int8"):
        options["trt_fp16_enable"] = "True"
    if precision == "int8":
        options["trt_int8_enable"] = "True"  # explicit quantization: the QDQ model's scales, no calibration table
    return dict(sorted(options.items()))


def precision_for(source_precision: str | None, requested: str | None) -> str:
    """The precision of a TensorRT build of a model of `source_precision`: the requested one, else
    int8 for a quantized (QDQ) model and fp16 for a float one. ValueError for a request the model
    cannot meet (int8 needs a QDQ model: TensorRT calibration is not done here)."""
    quantized = source_precision == "int8"
    if requested is None:
        return "int8" if quantized else "fp16"
    if requested not in PRECISIONS:
        raise ValueError(f"precision {requested!r} is not a TensorRT precision ({', '.join(PRECISIONS)})")
    if requested == "int8" and not quantized:
        raise ValueError("a TensorRT int8 build needs a quantized (QDQ) source model: set `from:` to a quantize "
                         "stage made with `preset: tensorrt`")
    if quantized and requested != "int8":
        raise ValueError(f"the source model is quantized (QDQ); TensorRT runs it in int8, not {requested}: set "
                         "`from:` to a float model's stage for an fp16/fp32 build")
    return requested


def problems(model: "onnx.ModelProto", base_dir: Path | None = None) -> list[str]:
    """Why TensorRT cannot compile `model` as one engine ([] when it can): operators outside the
    standard domains, QDQ nodes that are not int8 with zero points of 0, int32 (bias)
    dequantization. `base_dir` holds the model's external data (its paths already checked)."""
    from onnx import TensorProto, numpy_helper

    from zoo_stages.lib.onnx.portability import nonstandard_domains

    found = [f"operators of domain {d!r} (onnxruntime-only; TensorRT parses standard ONNX)"
             for d in nonstandard_domains(model)]
    constants = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    constants[node.output[0]] = attr.t
    bad_type: list[str] = []
    nonzero: list[str] = []
    wide: list[str] = []
    for node in model.graph.node:
        if node.op_type not in _QDQ_OPS or node.domain not in ("", "ai.onnx"):
            continue
        data = constants.get(node.input[0])
        if node.op_type == "DequantizeLinear" and data is not None and data.data_type == TensorProto.INT32:
            wide.append(node.name or node.output[0])  # onnxruntime's quantizer makes int32 biases by default
            continue
        zero_point = constants.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        if zero_point is None:
            bad_type.append(node.name or node.output[0])  # no zero point: uint8
            continue
        if zero_point.data_type != TensorProto.INT8:
            bad_type.append(node.name or node.output[0])
        elif numpy_helper.to_array(zero_point, base_dir=str(base_dir or '')).any():
            nonzero.append(node.name or node.output[0])
    if bad_type:
        found.append(f"{len(bad_type)} QuantizeLinear/DequantizeLinear node(s) not in int8 (first: {bad_type[0]}); "
                     "TensorRT quantizes to int8 only")
    if wide:
        found.append(f"{len(wide)} DequantizeLinear node(s) of int32 data (first: {wide[0]}: a quantized bias); "
                     "TensorRT dequantizes 8-bit tensors only")
    if nonzero:
        found.append(f"{len(nonzero)} QuantizeLinear/DequantizeLinear node(s) with a nonzero zero point (first: "
                     f"{nonzero[0]}); TensorRT's int8 is symmetric")
    return found


def available() -> bool:
    """Whether onnxruntime offers its TensorRT execution provider here (an NVIDIA GPU, CUDA,
    TensorRT and onnxruntime-gpu installed)."""
    import onnxruntime as ort

    return TENSORRT_PROVIDER in ort.get_available_providers()


def tensorrt_version() -> str | None:
    """The installed TensorRT's version (the ``tensorrt`` package), None when it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("tensorrt", "tensorrt-cu12", "tensorrt-libs"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return None


def make_session(model: Path, options: dict[str, str], engine_dir: Path) -> Any:
    """An onnxruntime session on the TensorRT provider (CUDA, then CPU, for what TensorRT does not
    take), its engine cache in `engine_dir`; zoo_stages.lib.runtimes.ort_session's deterministic settings."""
    from zoo_stages.lib.runtimes import ort_session

    engine_dir.mkdir(parents=True, exist_ok=True)
    here = {**options, "trt_engine_cache_path": str(engine_dir), "trt_timing_cache_path": str(engine_dir)}
    return ort_session.make_session(model, providers=[TENSORRT_PROVIDER, CUDA_PROVIDER, CPU_PROVIDER],
                                    provider_options={TENSORRT_PROVIDER: here})
