"""What an ONNX (or ORT-format) model file looks like from outside: opset, I/O ports, size, precision.

Used by deploy to fill the manifest's `Build` entries, and by anything that must feed a model
(parity checks, test vectors) without knowing its ports in advance. Ports are returned as
`zoo.manifest.Port` objects: element types use numpy-style names (``float32``,
``float16``, ``int64``...), shapes hold ints for fixed dims, strings for symbolic dims and None
for unknown dims.

onnx and onnxruntime are imported inside the functions: importing this module is cheap.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zoo.errors import InvalidInput
from zoo.pathsafety import external_data_files
from zoo.manifest import Port

if TYPE_CHECKING:
    import numpy as np
    import onnx

# operators that only appear in quantized graphs (QDQ, integer and fused quantized kernels)
_QUANT_OPS = {
    "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger", "ConvInteger",
    "QLinearConv", "QLinearMatMul", "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "QGemm",
    "QAttention", "DynamicQuantizeLSTM", "MatMulNBits",
}


# weight-only quantized blocks (onnxruntime's MatMulNBitsQuantizer): their `bits` attribute says the precision
_WEIGHT_ONLY_OPS = {"MatMulNBits", "GatherBlockQuantized"}


def weight_only_bits(model: "onnx.ModelProto") -> set[int]:
    """The `bits` of the model's MatMulNBits / GatherBlockQuantized nodes (both default to 4)."""
    found = set()
    for node in model.graph.node:
        if node.op_type in _WEIGHT_ONLY_OPS:
            found.add(next((int(a.i) for a in node.attribute if a.name == "bits"), 4))
    return found


# MatMulNBits' accuracy_level by the names quantize's `weight_only.accuracy_level` gives them
_ACCURACY_NAMES = {0: "unset", 1: "float32", 2: "float16", 3: "bfloat16", 4: "int8"}


def quantization_record(path: Path) -> dict | None:
    """How a model's weights were quantized, for its manifest entry: the ``zoo.quantization`` stamp
    quantize's `mode: weight_only` writes, else what the graph's weight-only blocks say (bits, block
    size, accuracy level: a model quantized elsewhere, e.g. onnxruntime-genai's int4); None for others."""
    import json

    from zoo_stages.lib.release.provenance import PREFIX, read_metadata

    if Path(path).suffix.lower() != ".onnx":
        return None
    stamped = read_metadata(path).get(PREFIX + "quantization")
    if stamped:
        try:
            record = json.loads(stamped)
        except ValueError:
            record = None
        if isinstance(record, dict):
            return {k: v for k, v in sorted(record.items()) if isinstance(v, (str, int, bool)) or v is None}
    model = load_graph(path)
    blocks = [n for n in model.graph.node if n.op_type in _WEIGHT_ONLY_OPS]
    ops = {n.op_type for n in model.graph.node}
    if not blocks or (ops - _WEIGHT_ONLY_OPS) & _QUANT_OPS or any(op.startswith("QLinear") for op in ops):
        return None  # not weight-only: static/dynamic int8 (quantize's `linear: blockwise` has 8-bit blocks too)
    attrs = [{a.name: a.i for a in n.attribute if a.type == a.INT} for n in blocks]
    bits = sorted({a.get("bits", 4) for a in attrs})
    sizes = sorted({a["block_size"] for a in attrs if "block_size" in a})
    levels = sorted({a.get("accuracy_level", 0) for a, n in zip(attrs, blocks) if n.op_type == "MatMulNBits"})
    record: dict = {"method": "weight_only", "bits": bits[0]}
    if len(sizes) == 1:
        record["block_size"] = sizes[0]
    if len(levels) == 1:
        record["accuracy_level"] = _ACCURACY_NAMES.get(levels[0], str(levels[0]))
    return record


@dataclass(frozen=True)
class ModelInfo:
    """The outside of a model file: what the manifest records about a build."""

    path: Path
    format: str  # "onnx" or "ort"
    size_bytes: int
    opset: int | None  # version of the default (ai.onnx) domain
    opsets: dict[str, int] = field(default_factory=dict)  # every imported domain -> version
    ir_version: int | None = None
    inputs: list[Port] = field(default_factory=list)
    outputs: list[Port] = field(default_factory=list)
    precision: str | None = None  # fp32, fp16, int8, int4 (None when it cannot be read, e.g. .ort)
    external_data: list[str] = field(default_factory=list)  # relative locations of sidecar files


def describe(path: Path) -> ModelInfo:
    """Describe an .onnx file (read with onnx, without loading external data) or an .ort file."""
    path = Path(path)
    if not path.is_file():
        raise InvalidInput(f"model file {path} does not exist", hint="check the upstream stage's `model` output")
    if path.suffix.lower() == ".ort":
        inputs, outputs = session_ports(path)
        return ModelInfo(path=path, format="ort", size_bytes=path.stat().st_size, opset=None,
                         inputs=inputs, outputs=outputs)
    model = load_graph(path)
    inputs, outputs = onnx_ports(model)
    opsets = opset_imports(model)
    return ModelInfo(
        path=path, format="onnx", size_bytes=path.stat().st_size,
        opset=opsets.get("ai.onnx"), opsets=opsets, ir_version=int(model.ir_version),
        inputs=inputs, outputs=outputs, precision=detect_precision(model),
        external_data=external_data_files(path),
    )


def load_graph(path: Path) -> "onnx.ModelProto":
    """Load an ONNX model's graph without its external data, with a clear error on bad bytes."""
    import onnx

    try:
        return onnx.load(str(path), load_external_data=False)
    except Exception as e:  # protobuf raises DecodeError, onnx raises its own; all mean "not ONNX"
        raise InvalidInput(f"{path} is not a readable ONNX model: {e}",
                           hint="check that the upstream stage wrote an .onnx file") from e


def opset_imports(model: "onnx.ModelProto") -> dict[str, int]:
    """Imported operator sets, domain -> version, with the default domain called 'ai.onnx'."""
    return {(imp.domain or "ai.onnx"): int(imp.version) for imp in sorted(model.opset_import, key=lambda i: i.domain)}


def onnx_ports(model: "onnx.ModelProto") -> tuple[list[Port], list[Port]]:
    """The graph's real inputs (initializers listed as inputs by old exporters excluded) and outputs."""
    initializers = {init.name for init in model.graph.initializer}
    inputs = [_port(vi) for vi in model.graph.input if vi.name not in initializers]
    outputs = [_port(vi) for vi in model.graph.output]
    return inputs, outputs


def _port(value_info: Any) -> Port:
    kind = value_info.type.WhichOneof("value")
    if kind != "tensor_type":
        # sequences, maps and optionals have no single element type or shape to record
        return Port(name=value_info.name, dtype=kind.replace("_type", "") if kind else "unknown", shape=[])
    tensor = value_info.type.tensor_type
    dtype = tensor_dtype_name(tensor.elem_type)
    shape: list[int | str | None] = []
    if tensor.HasField("shape"):
        for dim in tensor.shape.dim:
            which = dim.WhichOneof("value")
            shape.append(int(dim.dim_value) if which == "dim_value" else dim.dim_param if which == "dim_param" else None)
    return Port(name=value_info.name, dtype=dtype, shape=shape)


def tensor_dtype_name(elem_type: int) -> str:
    """numpy-style name of an ONNX TensorProto element type (``1`` -> ``float32``)."""
    import onnx

    try:
        return onnx.helper.tensor_dtype_to_np_dtype(elem_type).name
    except Exception:  # types numpy lacks (bfloat16, float8...) keep their ONNX name
        return onnx.TensorProto.DataType.Name(elem_type).lower()


def session_ports(path_or_session: Any) -> tuple[list[Port], list[Port]]:
    """Ports as onnxruntime sees them (works for .ort files, which onnx cannot read)."""
    from zoo_stages.lib.runtimes import onnx_run, ort_session

    sess = path_or_session
    if isinstance(path_or_session, (str, Path)):
        sess = ort_session.make_session(path_or_session, threads=1, level="disable")

    def convert(spec: onnx_run.TensorSpec) -> Port:
        return Port(name=spec.name, dtype=spec.dtype, shape=list(spec.shape or []))

    return [convert(s) for s in onnx_run.input_specs(sess)], [convert(s) for s in onnx_run.output_specs(sess)]


def detect_precision(model: "onnx.ModelProto") -> str:
    """fp32, fp16, int8 or int4, read from the graph: quantization operators or 8-bit weights mean
    int8; weight-only blocks alone (MatMulNBits, GatherBlockQuantized) mean int<their fewest bits>
    (int4 when the LM head is kept at 8 bits); mostly-float16 weights mean fp16."""
    import onnx

    ops = {node.op_type for node in model.graph.node}
    if (ops - _WEIGHT_ONLY_OPS) & _QUANT_OPS or any(op.startswith("QLinear") for op in ops):
        return "int8"
    bits = weight_only_bits(model)
    if bits:
        return f"int{min(bits)}"
    sizes: dict[int, int] = {}
    for init in model.graph.initializer:
        n = 1
        for d in init.dims:
            n *= int(d)
        sizes[init.data_type] = sizes.get(init.data_type, 0) + n
    T = onnx.TensorProto
    eight_bit = sizes.get(T.INT8, 0) + sizes.get(T.UINT8, 0)
    half = sizes.get(T.FLOAT16, 0) + sizes.get(T.BFLOAT16, 0)
    full = sizes.get(T.FLOAT, 0) + sizes.get(T.DOUBLE, 0)
    if eight_bit > max(half, full):
        return "int8"
    if half > full:
        return "fp16"
    return "fp32"


def numpy_dtype(dtype: str) -> "np.dtype":
    """The numpy dtype of a port's element type name, or InvalidInput for types numpy lacks."""
    import numpy as np

    try:
        return np.dtype(dtype)
    except TypeError as e:
        raise InvalidInput(f"element type {dtype!r} has no numpy equivalent",
                           hint="only models with numpy-compatible tensor inputs can be fed test inputs") from e
