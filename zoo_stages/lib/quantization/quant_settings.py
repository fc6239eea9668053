"""What the quantize kind builds: device presets, auto's candidates, resolved settings.

A `Settings` is one fully resolved call of onnxruntime's quantizer (mode, format, types,
per-channel, reduce_range, calibration, how fully connected layers are quantized). `resolve`
derives it from a `QuantizeConfig` (explicit fields over the preset over onnxruntime's defaults),
or for one named candidate of ``mode: auto``. See `zoo_stages.quantize` for why the presets are
what they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from zoo_stages.quantize import QuantizeConfig

PRESETS: dict[str, dict[str, Any]] = {
    "x86-avx2": {"activation_type": "QUInt8", "weight_type": "QInt8", "reduce_range": True},
    "x86-vnni": {"activation_type": "QUInt8", "weight_type": "QInt8", "reduce_range": False},
    "arm64": {"activation_type": "QInt8", "weight_type": "QInt8", "reduce_range": False},
    # TensorRT's explicit quantization: int8 only, zero points of 0, biases in float (it folds them)
    "tensorrt": {"activation_type": "QInt8", "weight_type": "QInt8", "reduce_range": False, "per_channel": True,
                 "symmetric": True},
}

# The auto mode's search space, in preference order (earlier wins ties).
# static-qdq-x86-avx2 is static QDQ with the x86-avx2 preset's types (U8S8, 7-bit weights): on x86
# without VNNI it is the variant whose int8 kernels cannot saturate, so auto can fall back on it
# when full-range weights lose accuracy there.
CANDIDATES = ("static-qdq", "static-qdq-per-channel", "static-qoperator", "static-qdq-blockwise",
              "static-qdq-x86-avx2", "dynamic-qint8", "dynamic-quint8")
# Weight-only candidates (`mode: weight_only` at 4 or 8 bits, with the config's `weight_only:` settings):
# tried only when `candidates:` names them, after the int8 ones, so the default search is unchanged.
WEIGHT_ONLY_CANDIDATES = ("weight-only-int4", "weight-only-int8")


@dataclass(frozen=True)
class Settings:
    """One fully resolved quantization recipe (what onnxruntime is called with)."""

    name: str
    mode: str  # static | dynamic
    format: str | None  # qdq | qoperator (static)
    per_channel: bool
    reduce_range: bool
    activation_type: str | None  # QInt8 | QUInt8 (static)
    weight_type: str
    calibration: str | None  # minmax | entropy | percentile (static)
    preprocess: bool
    preprocess_explicit: bool
    linear: str = "qdq"  # qdq | blockwise (static): how Gemm/MatMul layers with constant weights are quantized
    linear_block_size: int = 256
    # static: symmetric activations and weights (zero points of 0) and float biases, as TensorRT requires
    symmetric: bool = False

    def extra_options(self) -> dict[str, Any]:
        """onnxruntime quantizer ``extra_options`` these settings imply."""
        if not self.symmetric or self.mode != "static":
            return {}
        return {"ActivationSymmetric": True, "WeightSymmetric": True, "QuantizeBias": False}


def resolve(config: QuantizeConfig, name: str | None = None) -> Settings:
    """The settings of a static/dynamic config, or of one auto candidate `name`."""
    preset = PRESETS.get(config.preset or "", {})
    mode, fmt, per_channel, weight = config.mode, config.format, config.per_channel, config.weight_type
    if per_channel is None:
        per_channel = preset.get("per_channel")
    if name is not None:
        mode = name.split("-")[0]
        fmt = {"static-qdq": "qdq", "static-qdq-per-channel": "qdq", "static-qoperator": "qoperator",
               "static-qdq-blockwise": "qdq", "static-qdq-x86-avx2": "qdq"}.get(name)
        per_channel = name == "static-qdq-per-channel"
        if mode == "dynamic":
            weight = "QInt8" if name == "dynamic-qint8" else "QUInt8"
    fmt = fmt or "qdq"
    if mode == "static":
        # S8S8 QDQ is onnxruntime's default; S8S8 QOperator is slow on x86-64, so QOperator
        # defaults to uint8 activations.
        activation = config.activation_type or preset.get("activation_type") or ("QUInt8" if fmt == "qoperator" else "QInt8")
    else:
        activation, fmt = None, None
    weight = weight or preset.get("weight_type") or "QInt8"
    reduce_range = config.reduce_range if config.reduce_range is not None else bool(preset.get("reduce_range", False))
    if name == "static-qdq-x86-avx2":
        avx2 = PRESETS["x86-avx2"]
        activation, weight, reduce_range = avx2["activation_type"], avx2["weight_type"], avx2["reduce_range"]
    preprocess = config.preprocess if config.preprocess is not None else mode == "static"
    linear = "blockwise" if name == "static-qdq-blockwise" else (config.linear or "qdq") if name is None else "qdq"
    if mode != "static":
        linear = "qdq"
    return Settings(
        name=name or (f"static-{fmt}" if mode == "static" else f"dynamic-{weight.lower()}"),
        mode=mode, format=fmt, per_channel=bool(per_channel), reduce_range=reduce_range,
        activation_type=activation, weight_type=weight,
        calibration=config.calibration.method if mode == "static" else None,
        preprocess=preprocess, preprocess_explicit=config.preprocess is not None,
        linear=linear, linear_block_size=config.linear_block_size,
        symmetric=bool(preset.get("symmetric")) and name is None,
    )


def saturation_hint(settings: Settings) -> str:
    """A sentence to append to an accuracy complaint when this host's int8 kernels may saturate
    full-range int8 weights (x86 without VNNI), else ''."""
    from zoo_stages.lib.runtimes import host_info

    if settings.weight_type != "QInt8" or settings.reduce_range or not host_info.int8_may_saturate():
        return ""
    return ("; this CPU has no VNNI, so onnxruntime's int8 kernels can saturate full-range int8 weights: "
            "try `preset: x86-avx2` (reduce_range) and compare")
