"""Weight-only quantization (``mode: weight_only``): onnxruntime's MatMulNBitsQuantizer.

The weights of the fully connected layers (MatMul, and Gemm rewritten as MatMul + Add) become
4- or 8-bit blocks of `block_size` values sharing a scale (and a zero point unless symmetric) in
com.microsoft's ``MatMulNBits``; embedding tables read by a Gather become ``GatherBlockQuantized``
(4 bits) when `op_types` names Gather. Activations stay in float: nothing is calibrated except
for GPTQ, whose error correction needs each layer's inputs.

The algorithms are onnxruntime's weight-only configs:

- ``rtn``: `DefaultWeightOnlyQuantConfig`, round-to-nearest per block with onnxruntime's own
  kernels (`RTNWeightOnlyQuantConfig` is the same rounding in Python, MatMul only: not used);
  MatMul and Gather, 4 or 8 bits, symmetric or not.
- ``hqq``: `HQQWeightOnlyQuantConfig`, half-quadratic quantization (an optimised scale and a
  float zero point per block, data-free; needs torch), MatMul only, 4 bits (onnxruntime's CPU
  kernels cannot run 8-bit weights with float zero points), asymmetric.
- ``gptq``: `GPTQWeightOnlyQuantConfig`, GPTQ's second-order error correction on a calibration
  sample, MatMul only, 4 bits (onnxruntime writes 8-bit GPTQ weights back as float).
- ``k_quant``: `KQuantWeightOnlyQuantConfig`, llama.cpp's k-quant search of scale and minimum
  per block (data-free), MatMul only, 4 or 8 bits, always with zero points.

`keep_8bit` layers are quantized at 8 bits: by k-quant itself (its per-node bits,
`customized_weight_config`), for the other algorithms by a second pass of ``rtn`` at 8 bits over
those layers once the first pass has quantized the rest. `exclude` layers stay in float.

onnx, onnxruntime and numpy are imported inside functions so importing this module is cheap.
"""

from __future__ import annotations

import fnmatch
import logging
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Literal

from pydantic import Field, model_validator

from zoo.errors import InvalidInput, StageFailed
from zoo.stage import KindConfig

ALGORITHMS = ("rtn", "hqq", "gptq", "k_quant")
# MatMulNBits' accuracy_level: the type its kernel computes in (onnxruntime's contrib op docs:
# 0 unset, 1 fp32, 2 fp16, 3 bf16, 4 int8). CPU kernels have float32 and int8 compute; float16
# and bfloat16 fall back to float32 there.
ACCURACY_LEVELS = {"unset": 0, "float32": 1, "float16": 2, "bfloat16": 3, "int8": 4}
OP_TYPES = ("MatMul", "Gather")

_LOGGERS = ("onnxruntime.quantization.matmul_nbits_quantizer", "neural_compressor", "onnxruntime.quantization")


class WeightOnlyConfig(KindConfig):
    """`mode: weight_only`'s settings (onnxruntime's MatMulNBitsQuantizer)."""

    algorithm: Literal["rtn", "hqq", "gptq", "k_quant"] = Field(
        "rtn", description="rtn: round-to-nearest per block (data-free, onnxruntime's default quantizer); "
                           "hqq: half-quadratic (data-free, needs torch); gptq: error-corrected on a calibration "
                           "sample of the recipe's `data:` (4 bits); k_quant: llama.cpp's k-quant search "
                           "(data-free)")
    bits: Literal[4, 8] = Field(4, description="bits per weight (int4 or int8)")
    block_size: int = Field(32, ge=16, le=4096, description="weights sharing one scale (a power of two, at least "
                                                            "16): smaller blocks are more accurate and larger")
    symmetric: bool = Field(False, description="no zero points (rtn, gptq): smaller, slightly less accurate; hqq "
                                               "and k_quant always keep zero points")
    accuracy_level: Literal["unset", "float32", "float16", "bfloat16", "int8"] = Field(
        "int8", description="what MatMulNBits computes in: int8 (activations quantized per block at run time, "
                            "int8 dot products: the fast one on CPUs, onnxruntime-genai's CPU default) or float32 "
                            "(weights dequantized to float: slower, exact activations); float16/bfloat16 run "
                            "as float32 on CPUs; unset leaves it to onnxruntime (float32). onnxruntime's levels "
                            "4, 1, 2, 3 and 0")
    exclude: list[str] = Field(default_factory=list, description="layers kept in float: node names or shell-style "
                                                                 "patterns (`*classifier*`)")
    keep_8bit: list[str] = Field(default_factory=list, description="layers quantized at 8 bits when `bits` is 4 "
                                                                   "(e.g. the LM head: `*lm_head*`): node names "
                                                                   "or patterns")

    @model_validator(mode="after")
    def _consistent(self):
        if self.block_size & (self.block_size - 1):
            raise ValueError(f"weight_only.block_size must be a power of two (got {self.block_size})")
        if self.symmetric and self.algorithm in ("hqq", "k_quant"):
            raise ValueError(f"weight_only.symmetric does not apply to algorithm {self.algorithm} (it always keeps "
                             "zero points); remove it or use algorithm rtn or gptq")
        if self.algorithm == "gptq" and self.bits == 8:
            raise ValueError("algorithm gptq writes 4-bit weights only (onnxruntime leaves 8-bit GPTQ weights in "
                             "float); use bits: 4, or algorithm rtn/k_quant/hqq for 8 bits")
        if self.algorithm == "hqq" and self.bits == 8:
            raise ValueError("algorithm hqq at 8 bits makes float zero points, which onnxruntime's CPU MatMulNBits "
                             "cannot run; use bits: 4, or algorithm rtn/k_quant for 8 bits")
        if self.keep_8bit and self.bits == 8:
            raise ValueError("weight_only.keep_8bit applies to bits: 4 (every layer is already 8-bit)")
        return self


@dataclass(frozen=True)
class WeightOnlySettings:
    """One resolved weight-only quantization (what the metrics' `settings` and the build record)."""

    name: str
    mode: str
    algorithm: str
    bits: int
    block_size: int
    symmetric: bool
    accuracy_level: str
    accuracy_level_value: int
    op_types: tuple[str, ...]
    exclude: tuple[str, ...]
    keep_8bit: tuple[str, ...]

    def record(self) -> dict[str, Any]:
        """The settings as plain data (lists for tuples)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    def stamp(self) -> dict[str, Any]:
        """What the quantized model carries (metadata ``zoo.quantization``) and the manifest records."""
        return {"method": "weight_only", "algorithm": self.algorithm, "bits": self.bits,
                "block_size": self.block_size, "symmetric": self.symmetric, "accuracy_level": self.accuracy_level}


def resolve(config: WeightOnlyConfig, op_types: list[str] | None) -> WeightOnlySettings:
    kinds = tuple(op_types) if op_types else ("MatMul",)
    return WeightOnlySettings(
        name=f"int{config.bits}-{config.algorithm.replace('_', '')}-b{config.block_size}", mode="weight_only",
        algorithm=config.algorithm, bits=config.bits, block_size=config.block_size,
        symmetric=config.symmetric, accuracy_level=config.accuracy_level,
        accuracy_level_value=ACCURACY_LEVELS[config.accuracy_level], op_types=kinds,
        exclude=tuple(config.exclude), keep_8bit=tuple(config.keep_8bit))


def check_op_types(config: WeightOnlyConfig, op_types: list[str] | None) -> None:
    """ValueError for `op_types` weight-only quantization cannot take (pydantic reports it at the field)."""
    if not op_types:
        return
    unknown = [t for t in op_types if t not in OP_TYPES]
    if unknown:
        raise ValueError(f"op_types {unknown[0]!r} cannot be weight-only quantized; mode: weight_only takes "
                         "MatMul (fully connected layers, Gemm included) and Gather (embeddings)")
    if "Gather" in op_types and (config.algorithm != "rtn" or config.bits != 4):
        raise ValueError("embeddings (op_types Gather) are quantized by algorithm rtn at 4 bits only "
                         "(onnxruntime's GatherBlockQuantized); drop Gather or use algorithm rtn with bits 4")


def matched(patterns: tuple[str, ...], names: list[str], field: str) -> set[str]:
    """The node names `patterns` match; InvalidInput naming a pattern that matches none."""
    out: set[str] = set()
    for pattern in patterns:
        hits = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
        if not hits:
            shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
            raise InvalidInput(f"weight_only.{field}: {pattern!r} matches no quantizable layer",
                               hint=f"the layers are: {shown or 'none'}")
        out.update(hits)
    return out


def quantize(src: Path, target: Path, settings: WeightOnlySettings,
             calibration: Callable[[], Any] | None = None) -> dict[str, Any]:
    """Weight-only quantize the model at `src` into `target` (IR capped, deterministic bytes);
    returns what it did: ``{"layers": {bits: count}, "gathers": count, "kept_float": count}``.

    `calibration()` gives GPTQ's CalibrationDataReader (called only for gptq)."""
    from onnxruntime.quantization.onnx_model import ONNXModel

    from zoo_stages.lib.onnx import onnx_io
    from zoo_stages.lib.quantization import quant_ops

    model = onnx_io.load_model(src, cap_ir_version=False)
    wrapped = ONNXModel(model)
    wrapped.replace_gemm_with_matmul()  # MatMulNBits takes MatMul only
    model = quant_ops.name_nodes(wrapped.model)
    weights = {t.name for t in model.graph.initializer}
    layers = [n.name for n in model.graph.node if n.op_type == "MatMul" and len(n.input) > 1 and n.input[1] in weights]
    gathers = [n.name for n in model.graph.node if n.op_type == "Gather" and n.input and n.input[0] in weights]
    candidates = layers + (gathers if "Gather" in settings.op_types else [])
    if "MatMul" not in settings.op_types:
        candidates = gathers
    excluded = matched(settings.exclude, candidates, "exclude")
    eight = matched(settings.keep_8bit, [n for n in layers if n not in excluded], "keep_8bit")
    first_out = excluded | (eight if settings.algorithm != "k_quant" else set())
    if not [n for n in candidates if n not in excluded]:
        raise InvalidInput("weight-only quantization found no layer with a constant weight to quantize"
                           + (f" (op_types {', '.join(settings.op_types)})" if settings.op_types else ""),
                           hint="weight-only quantization takes MatMul/Gemm layers and Gather embeddings with "
                                "constant weights; use mode: static or dynamic for convolutions")
    with _quiet():
        model = _pass(model, settings.algorithm, settings.bits, settings, exclude=first_out,
                      eight=eight if settings.algorithm == "k_quant" else set(), calibration=calibration)
        if eight and settings.algorithm != "k_quant":
            others = {n.name for n in model.graph.node if n.op_type in ("MatMul", "Gather")} - eight
            model = _pass(model, "rtn", 8, settings, exclude=others, eight=set(), op_types=("MatMul",))
    _set_accuracy_level(model, settings.accuracy_level_value)
    _import_microsoft_domain(model)
    summary = summarize(model)
    if not summary["layers"] and not summary["gathers"]:
        raise StageFailed("onnxruntime's weight-only quantizer left every layer in float",
                          hint="check `op_types`, `exclude` and the model's layers")
    summary["kept_float"] = len(excluded)
    onnx_io.save_model(model, target)  # IR capped, deterministic bytes
    return summary


def _pass(model, algorithm: str, bits: int, settings: WeightOnlySettings, *, exclude: set[str], eight: set[str],
          calibration=None, op_types: tuple[str, ...] | None = None):
    """One run of MatMulNBitsQuantizer over `model` (a ModelProto); the quantized ModelProto."""
    from onnxruntime.quantization import matmul_nbits_quantizer as mnq
    from onnxruntime.quantization.quant_utils import QuantFormat

    kinds = tuple(op_types or settings.op_types)
    level = settings.accuracy_level_value or None
    if algorithm == "rtn":
        config = mnq.DefaultWeightOnlyQuantConfig(block_size=settings.block_size, is_symmetric=settings.symmetric,
                                                  accuracy_level=level, quant_format=QuantFormat.QOperator,
                                                  op_types_to_quantize=kinds, quant_axes=(("MatMul", 0), ("Gather", 1)),
                                                  bits=bits)
    elif algorithm == "hqq":
        try:
            import torch  # noqa: F401  (onnxruntime's HQQ quantizer computes with it)
        except ImportError:
            raise InvalidInput("weight_only algorithm hqq needs torch (onnxruntime's HQQ quantizer computes with it)",
                               hint="install zoo's torch extra, or use a data-free algorithm without it: rtn or "
                                    "k_quant") from None
        config = mnq.HQQWeightOnlyQuantConfig(block_size=settings.block_size, bits=bits, op_types_to_quantize=kinds)
    elif algorithm == "gptq":
        if calibration is None:
            raise InvalidInput("algorithm gptq needs calibration samples", hint="add a `data:` section")
        config = mnq.GPTQWeightOnlyQuantConfig(calibration_data_reader=calibration(), block_size=128,
                                               op_types_to_quantize=kinds)
    else:  # k_quant: its own per-node bits keep the `eight` layers at 8
        config = mnq.KQuantWeightOnlyQuantConfig(op_types_to_quantize=kinds,
                                                 customized_weight_config={n: {"bits": 8} for n in eight} or None)
    quantizer = mnq.MatMulNBitsQuantizer(model, bits=bits, block_size=settings.block_size,
                                         is_symmetric=settings.symmetric, accuracy_level=level,
                                         nodes_to_exclude=sorted(exclude), op_types_to_quantize=kinds,
                                         algo_config=config)
    if algorithm in ("gptq", "k_quant") and bits == 8:
        # the RTN/GPTQ path reads each layer's bits from its node config, which it fills with 4
        config.customized_weight_config = {**(getattr(config, "customized_weight_config", None) or {}),
                                           **{n: {"bits": 8} for n in _layer_names(model) if n not in exclude}}
    quantizer.process()
    result = quantizer.model
    return result.model if hasattr(result, "model") else result


def _layer_names(model) -> list[str]:
    weights = {t.name for t in model.graph.initializer}
    return [n.name for n in model.graph.node if n.op_type == "MatMul" and len(n.input) > 1 and n.input[1] in weights]


def _import_microsoft_domain(model) -> None:
    """onnxruntime's RTN/GPTQ path (k_quant, gptq) writes com.microsoft nodes without importing the
    domain, which onnx's checker refuses: import it (version 1) where a node uses it."""
    if any(n.domain == "com.microsoft" for n in model.graph.node) and \
            not any(o.domain == "com.microsoft" for o in model.opset_import):
        entry = model.opset_import.add()
        entry.domain, entry.version = "com.microsoft", 1


def _set_accuracy_level(model, level: int) -> None:
    """Every MatMulNBits gets `level` (hqq's and a second pass's nodes would otherwise differ)."""
    from onnx import helper

    for node in model.graph.node:
        if node.op_type != "MatMulNBits":
            continue
        kept = [a for a in node.attribute if a.name != "accuracy_level"]
        del node.attribute[:]
        node.attribute.extend(kept)
        if level:
            node.attribute.append(helper.make_attribute("accuracy_level", level))
        node.attribute.sort(key=lambda a: a.name)


def summarize(model) -> dict[str, Any]:
    """What a weight-only model holds: ``{"layers": {"4": n, "8": m}, "gathers": k, "block_sizes": [...],
    "accuracy_levels": [...]}`` read from its MatMulNBits / GatherBlockQuantized nodes."""
    from onnx import helper

    bits: dict[str, int] = {}
    blocks, levels, gathers = set(), set(), 0
    for node in model.graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type == "MatMulNBits":
            key = str(attrs.get("bits", 4))
            bits[key] = bits.get(key, 0) + 1
            blocks.add(int(attrs.get("block_size", 0)))
            levels.add(int(attrs.get("accuracy_level", 0)))
        elif node.op_type == "GatherBlockQuantized":
            gathers += 1
            blocks.add(int(attrs.get("block_size", 0)))
    return {"layers": dict(sorted(bits.items())), "gathers": gathers, "block_sizes": sorted(blocks),
            "accuracy_levels": sorted(levels)}


class _quiet:
    """onnxruntime's weight-only quantizer logs every node at INFO and its RTN/GPTQ path prints a
    progress bar: kept at WARNING and off stdout while it runs."""

    def __enter__(self):
        import contextlib
        import io

        self.levels = {name: logging.getLogger(name).level for name in _LOGGERS}
        for name in _LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)
        self.stdout = contextlib.redirect_stdout(io.StringIO())
        self.stdout.__enter__()
        self.warnings = warnings.catch_warnings()
        self.warnings.__enter__()
        # HQQ hands torch a read-only numpy view of each weight, which it only reads
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return self

    def __exit__(self, *exc):
        self.warnings.__exit__(*exc)
        self.stdout.__exit__(*exc)
        for name, level in self.levels.items():
            logging.getLogger(name).setLevel(level)
        return False
