"""Device conversions of an ONNX model: float16 and the ORT format.

- `to_fp16`: onnxruntime's own float16 converter, keeping float32 inputs/outputs so callers feed
  the same arrays as before (Cast nodes are inserted at the graph's edges; the graph is then put
  back in topological order, `zoo_stages.lib.onnx.graph_order`, as ONNX requires);
- `to_ort`: onnxruntime's ``convert_onnx_models_to_ort`` tool, run on a private copy so its
  side files never land next to the source; we keep the ``.ort`` model and its
  ``required_operators`` config (what a minimal onnxruntime build for a phone needs), with the
  absolute paths the tool writes into that config's comments replaced by the file name;
- `canonical_ort_bytes`: the ORT flatbuffer re-serialised in a fixed order, so equal models give
  equal bytes.

Converted builds are opened with `zoo_stages.lib.runtimes.ort_session`, run with `zoo_stages.lib.runtimes.onnx_run`
and compared with their source by `zoo_stages.lib.quality.parity` (`zoo_stages.lib.quality.conversion_check`).
Heavy imports (onnx, onnxruntime, flatbuffers) happen inside functions.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from zoo.errors import InvalidInput, StageFailed

log = logging.getLogger("zoo.stage.convert")

OPTIMIZATION_STYLES = ("Fixed", "Runtime")


# ---------------------------------------------------------------------------------------------
# float16


def to_fp16(src: Path, dst: Path, *, keep_io_types: bool = True, op_block_list: Sequence[str] | None = None) -> Path:
    """Convert `src` to float16 weights and compute, writing `dst` (one .onnx file; above protobuf's limit its weights in one file beside it).

    Inputs and outputs stay float32 when `keep_io_types` (the default). Quantized sources are
    refused: their float parts are scales, and halving them would change the quantization.
    """
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16

    from zoo_stages.lib.onnx.model_info import detect_precision
    from zoo_stages.lib.onnx.onnx_io import MAX_IR_VERSION, load_model, save

    model = load_model(Path(src))  # with external data; refuses sidecar paths outside its folder
    precision = detect_precision(model)
    if precision == "int8":
        raise InvalidInput(f"{src} is a quantized (int8) model; float16 conversion needs a float32 source",
                           hint="use `from:` a float32 stage (e.g. optimize) for fp16 builds")
    if precision == "fp16":
        raise InvalidInput(f"{src} is already a float16 model", hint="drop `convert: fp16` for this build")
    runtime_ops = sorted({f"{n.domain}.{n.op_type}" for n in model.graph.node if n.domain.startswith("com.microsoft")})
    if runtime_ops:
        # onnxruntime's offline optimizer fuses ops into CPU-specific kernels (NCHWc layouts, fused
        # convs): float16 conversion produces a graph those kernels refuse
        raise InvalidInput(f"{src} holds onnxruntime-specific operators ({', '.join(runtime_ops[:4])}), which "
                           "cannot be converted to float16",
                           hint="make the fp16 build `from:` the export (or an optimize at `level: basic`)")
    blocked = sorted(set(DEFAULT_OP_BLOCK_LIST) | set(op_block_list or ()))
    with _warnings_to_log():
        converted = convert_float_to_float16(model, keep_io_types=keep_io_types, op_block_list=blocked)
    # the converter appends the Cast nodes of the graph's inputs after the nodes that read them:
    # valid for onnxruntime, not ONNX (onnx.checker refuses an unsorted graph)
    from zoo_stages.lib.onnx.graph_order import CycleError, sort_graph

    try:
        sort_graph(converted.graph)
    except CycleError as e:  # a node reading a value nothing provides: the converter broke the graph
        raise StageFailed(f"float16 conversion of {src} gave a graph that cannot be ordered: {e}",
                          hint="keep the operator named in float32 with the build's `op_block_list`, or make "
                               "the fp16 build `from:` the plain export") from None
    converted.ir_version = min(int(converted.ir_version), MAX_IR_VERSION)
    # one file, or above protobuf's limit the weights in one sidecar next to the model
    return save(converted, Path(dst))


@contextlib.contextmanager
def _warnings_to_log():
    """Route the converter's Python warnings (e.g. weights clipped to the float16 range) to our log,
    once per distinct message, instead of letting them print to stderr."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    for message in sorted({str(w.message) for w in caught}):
        log.warning("float16 conversion: %s", message)


# ---------------------------------------------------------------------------------------------
# ORT format


@dataclass(frozen=True)
class OrtConversion:
    """What `to_ort` kept: the ORT-format model and the operator list for minimal builds."""

    model: Path
    operators_config: Path
    optimization_style: str
    optimization_level: str = "all"


def to_ort(src: Path, dst_dir: Path, *, optimization_style: str = "Fixed", work_dir: Path | None = None,
           name: str = "model") -> OrtConversion:
    """Convert `src` to ORT format into `dst_dir` as `<name>.ort` and `<name>.required_operators.config`.

    The tool runs on a temporary copy of `src` (and its external data) so the files it writes
    next to its input (temporary models, configs for each style) never touch the source. Only
    the two files above are kept. `optimization_style` is "Fixed" (optimizations baked in; the
    default for CPU) or "Runtime" (some optimizations saved to be replayed by compiling
    execution providers such as NNAPI or CoreML).
    """
    if optimization_style not in OPTIMIZATION_STYLES:
        raise InvalidInput(f"unknown ORT optimization style {optimization_style!r}",
                           hint=f"use one of {', '.join(OPTIMIZATION_STYLES)}")
    from onnxruntime.tools.convert_onnx_models_to_ort import OptimizationStyle, convert_onnx_models_to_ort

    from zoo.files import atomic_write
    from zoo.pathsafety import external_data_files

    src = Path(src)
    sidecars = external_data_files(src)  # relative locations, each inside src's folder
    dst_dir = Path(dst_dir)
    dst_dir.mkdir(parents=True, exist_ok=True)
    if work_dir is not None:
        Path(work_dir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=work_dir, prefix="ort-convert-") as tmp:
        tmp_dir = Path(tmp)
        staged = tmp_dir / "in" / f"{name}.onnx"
        staged.parent.mkdir()
        shutil.copyfile(src, staged)
        for location in sidecars:
            (staged.parent / location).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src.parent / location, staged.parent / location)
        out = tmp_dir / "out"
        captured = io.StringIO()
        # the tool reads its optimization level from the environment: pin it so a user's
        # setting cannot silently change the shipped bytes
        previous = os.environ.get("ORT_CONVERT_ONNX_MODELS_TO_ORT_OPTIMIZATION_LEVEL")
        os.environ["ORT_CONVERT_ONNX_MODELS_TO_ORT_OPTIMIZATION_LEVEL"] = "all"
        # the tool logs the temporary paths it writes at INFO; they mean nothing to our users
        tool_log = logging.getLogger("ort_format_model.utils")
        tool_level = tool_log.level
        tool_log.setLevel(logging.WARNING)
        try:
            with contextlib.redirect_stdout(captured):
                convert_onnx_models_to_ort(staged, output_dir=out,
                                           optimization_styles=[OptimizationStyle[optimization_style]])
        except Exception as e:
            raise StageFailed(f"onnxruntime could not convert {src.name} to ORT format: {e}",
                              log_tail=captured.getvalue()[-4000:],
                              hint="the model may use operators the ORT format does not support") from e
        finally:
            tool_log.setLevel(tool_level)
            if previous is None:
                os.environ.pop("ORT_CONVERT_ONNX_MODELS_TO_ORT_OPTIMIZATION_LEVEL", None)
            else:
                os.environ["ORT_CONVERT_ONNX_MODELS_TO_ORT_OPTIMIZATION_LEVEL"] = previous
        log.debug("convert_onnx_models_to_ort output:\n%s", captured.getvalue())
        models = sorted(out.rglob("*.ort"))
        configs = sorted(out.rglob("*.config"))
        if len(models) != 1 or len(configs) != 1:
            raise StageFailed(f"onnxruntime's ORT converter produced {len(models)} .ort and {len(configs)} "
                              f".config files for {src.name}; expected one of each",
                              log_tail=captured.getvalue()[-4000:])
        model_dst = dst_dir / f"{name}.ort"
        config_dst = dst_dir / f"{name}.required_operators.config"
        raw = models[0].read_bytes()
        try:
            canonical = canonical_ort_bytes(raw)
        except _UnsupportedSchema as e:
            raise StageFailed(f"cannot write {src.name}'s ORT-format model reproducibly: the ORT flatbuffers "
                              f"schema of this onnxruntime has a construct zoo does not know ({e})",
                              hint="use an onnxruntime version zoo supports for `convert: ort` builds") from e
        atomic_write(model_dst, canonical, fsync=False)
        atomic_write(config_dst, _portable_operators_config(configs[0].read_text(), model_dst.name).encode(), fsync=False)
    return OrtConversion(model=model_dst, operators_config=config_dst, optimization_style=optimization_style)


def _portable_operators_config(text: str, model_name: str) -> str:
    """The tool's operator config with the absolute model paths in its comments replaced by a name."""
    body = [line for line in text.splitlines() if not line.startswith("#")]
    return "\n".join(["# Generated from model/s:", f"# - {model_name}", *body]) + "\n"


# ---------------------------------------------------------------------------------------------
# canonical ORT-format bytes
#
# onnxruntime serializes ORT-format models while iterating hash tables whose order depends on
# heap addresses, so converting the same model twice gives files that load identically but
# differ in byte layout. Releases must be bit-for-bit reproducible, so the converted flatbuffer
# is re-serialized in a fixed depth-first order. The schema is read from the flatbuffers
# bindings onnxruntime ships (ort_format_model/ort_flatbuffers_py): field slots and kinds come
# from their generated accessors, whose shape is fixed by flatc. Anything not understood raises
# _UnsupportedSchema instead of being copied wrongly.

_ORT_FILE_IDENTIFIER = b"ORTM"
_ORT_ROOT_TABLE = "InferenceSession"
# union field -> {type value: table}; checked against the generated enum at load time
_ORT_UNIONS = {("TypeInfo", "Value"): ("TypeInfoValue", {"tensor_type": "TensorTypeAndShape",
                                                          "sequence_type": "SequenceType",
                                                          "map_type": "MapType"})}
_SCALAR_SIZES = {"Bool": 1, "Int8": 1, "Uint8": 1, "Int16": 2, "Uint16": 2, "Int32": 4, "Uint32": 4,
                 "Int64": 8, "Uint64": 8, "Float32": 4, "Float64": 8}


class _UnsupportedSchema(Exception):
    """The generated ORT flatbuffers bindings contain a construct this re-serializer does not know."""


@dataclass(frozen=True)
class _FbField:
    name: str
    voffset: int
    kind: str  # scalar, string, table, union, vec_scalar, vec_string, vec_table, vec_struct
    type: str | None = None  # scalar type name (Int32...) or table/struct name
    elem_size: int = 0
    default: Any = None
    union: tuple[str, dict[int, str]] | None = None  # (type field name, value -> table)

    @property
    def slot(self) -> int:
        return (self.voffset - 4) // 2


@dataclass(frozen=True)
class _FbTable:
    name: str
    slots: int
    fields: tuple[_FbField, ...]


def _fbs_module(name: str) -> Any:
    import importlib

    import onnxruntime.tools.ort_format_model  # noqa: F401  (puts ort_flatbuffers_py on sys.path)

    return importlib.import_module(f"onnxruntime.tools.ort_format_model.ort_flatbuffers_py.fbs.{name}")


_FB_SCHEMA: dict[str, _FbTable] = {}


def _fb_table(name: str) -> _FbTable:
    """The layout of one ORT flatbuffers table, parsed from its generated Python module."""
    import ast
    import inspect
    import re

    if name in _FB_SCHEMA:
        return _FB_SCHEMA[name]
    src = inspect.getsource(_fbs_module(name))
    tree = ast.parse(src)
    start = re.search(r"def %sStart\(builder\):\s*builder\.StartObject\((\d+)\)" % name, src)
    if not start:
        raise _UnsupportedSchema(f"{name}: no StartObject (a struct where a table was expected?)")
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)
    if cls is None:
        raise _UnsupportedSchema(f"{name}: class not found")
    fields: list[_FbField] = []
    skip = re.compile(r"^(Init|GetRootAs\w*|\w+BufferHasIdentifier|SizeOf|\w+Length|\w+IsNone|\w+AsNumpy)$")
    for fn in cls.body:
        if not isinstance(fn, ast.FunctionDef) or skip.match(fn.name):
            continue
        body = ast.get_source_segment(src, fn) or ""
        voff = re.search(r"self\._tab\.Offset\((\d+)\)", body)
        if not voff:
            raise _UnsupportedSchema(f"{name}.{fn.name}: no vtable offset")
        voffset = int(voff.group(1))
        imported = re.search(r"from \S+ import (\w+)", body)
        scalar = re.search(r"self\._tab\.Get\(flatbuffers\.number_types\.(\w+)Flags, (o|a) \+", body)
        if len(fn.args.args) == 2:  # vector accessor (self, j)
            if "self._tab.Vector(o)" not in body:
                raise _UnsupportedSchema(f"{name}.{fn.name}: indexed accessor without a vector")
            if "self._tab.String(a" in body:
                fields.append(_FbField(fn.name, voffset, "vec_string"))
            elif imported and "self._tab.Indirect(x)" in body:
                fields.append(_FbField(fn.name, voffset, "vec_table", imported.group(1)))
            elif imported:
                size = re.search(r"\* (\d+)", body)
                fields.append(_FbField(fn.name, voffset, "vec_struct", imported.group(1), int(size.group(1))))
            elif scalar and scalar.group(2) == "a":
                fields.append(_FbField(fn.name, voffset, "vec_scalar", scalar.group(1),
                                       _SCALAR_SIZES[scalar.group(1)]))
            else:
                raise _UnsupportedSchema(f"{name}.{fn.name}: unknown vector kind")
        elif "self._tab.String(o + self._tab.Pos)" in body:
            fields.append(_FbField(fn.name, voffset, "string"))
        elif scalar and scalar.group(2) == "o":
            default_node = fn.body[-1]
            default = ast.literal_eval(default_node.value) if isinstance(default_node, ast.Return) else None
            fields.append(_FbField(fn.name, voffset, "scalar", scalar.group(1), _SCALAR_SIZES[scalar.group(1)],
                                   default=default))
        elif imported and "self._tab.Indirect(o + self._tab.Pos)" in body:
            fields.append(_FbField(fn.name, voffset, "table", imported.group(1)))
        elif "self._tab.Union(obj, o)" in body:
            if (name, fn.name) not in _ORT_UNIONS:
                raise _UnsupportedSchema(f"{name}.{fn.name}: unknown union")
            enum_name, by_member = _ORT_UNIONS[(name, fn.name)]
            enum = getattr(_fbs_module(enum_name), enum_name)
            members = {k: v for k, v in vars(enum).items() if not k.startswith("_") and k != "NONE"}
            if set(members) != set(by_member):
                raise _UnsupportedSchema(f"{name}.{fn.name}: union members changed: {sorted(members)}")
            fields.append(_FbField(fn.name, voffset, "union",
                                   union=(fn.name + "Type", {int(members[m]): t for m, t in by_member.items()})))
        else:
            raise _UnsupportedSchema(f"{name}.{fn.name}: unknown field kind")
    table = _FbTable(name, int(start.group(1)), tuple(sorted(fields, key=lambda f: f.voffset)))
    _FB_SCHEMA[name] = table
    return table


def _struct_alignment(name: str) -> int:
    import inspect
    import re

    prep = re.search(r"builder\.Prep\((\d+), (\d+)\)", inspect.getsource(_fbs_module(name)))
    if not prep:
        raise _UnsupportedSchema(f"struct {name}: alignment not found")
    return int(prep.group(1))


def canonical_ort_bytes(data: bytes) -> bytes:
    """Re-serialize an ORT-format model in a fixed order, so equal models give equal bytes.

    Raises ValueError for buffers that are not ORT-format models.
    """
    import flatbuffers
    from flatbuffers import number_types as N
    from flatbuffers.table import Table

    if len(data) < 8 or data[4:8] != _ORT_FILE_IDENTIFIER:
        raise ValueError("not an ORT-format model (missing the ORTM file identifier)")
    buf = bytearray(data)
    builder = flatbuffers.Builder(max(1024, len(data) + len(data) // 4))

    def raw_vector(tab: Table, o: int, elem_size: int, alignment: int) -> int:
        start = tab.Vector(o)
        n = tab.VectorLen(o)
        payload = bytes(buf[start:start + n * elem_size])
        builder.StartVector(elem_size, n, alignment)
        builder.head -= len(payload)
        builder.Bytes[builder.head:builder.head + len(payload)] = payload
        return builder.EndVector()

    def offsets_vector(offsets: list[int]) -> int:
        builder.StartVector(4, len(offsets), 4)
        for off in reversed(offsets):
            builder.PrependUOffsetTRelative(off)
        return builder.EndVector()

    def copy_table(name: str, pos: int) -> int:
        schema = _fb_table(name)
        tab = Table(buf, pos)
        present: dict[str, int] = {}
        for f in schema.fields:
            o = tab.Offset(f.voffset)
            if o:
                present[f.name] = o
        values: list[tuple[_FbField, Any]] = []
        for f in schema.fields:  # children first, in slot order: the fixed order that makes bytes stable
            o = present.get(f.name)
            if o is None:
                continue
            if f.kind == "scalar":
                values.append((f, tab.Get(getattr(N, f.type + "Flags"), o + tab.Pos)))
            elif f.kind == "string":
                values.append((f, builder.CreateSharedString(bytes(tab.String(o + tab.Pos)))))
            elif f.kind == "table":
                values.append((f, copy_table(f.type, tab.Indirect(o + tab.Pos))))
            elif f.kind == "union":
                type_field = next(x for x in schema.fields if x.name == f.union[0])
                type_o = present.get(type_field.name)
                type_value = tab.Get(N.Uint8Flags, type_o + tab.Pos) if type_o else 0
                if type_value not in f.union[1]:
                    raise _UnsupportedSchema(f"{name}.{f.name}: union type {type_value}")
                values.append((f, copy_table(f.union[1][type_value], tab.Indirect(o + tab.Pos))))
            elif f.kind == "vec_scalar":
                # 16-byte alignment keeps raw tensor data usable in place
                values.append((f, raw_vector(tab, o, f.elem_size, max(f.elem_size, 16))))
            elif f.kind == "vec_struct":
                values.append((f, raw_vector(tab, o, f.elem_size, _struct_alignment(f.type))))
            elif f.kind == "vec_string":
                start, n = tab.Vector(o), tab.VectorLen(o)
                offs = [builder.CreateSharedString(bytes(tab.String(start + 4 * j))) for j in range(n)]
                values.append((f, offsets_vector(offs)))
            elif f.kind == "vec_table":
                start, n = tab.Vector(o), tab.VectorLen(o)
                offs = [copy_table(f.type, tab.Indirect(start + 4 * j)) for j in range(n)]
                values.append((f, offsets_vector(offs)))
        builder.StartObject(schema.slots)
        for f, v in values:
            if f.kind == "scalar":
                getattr(builder, f"Prepend{f.type}Slot")(f.slot, v, f.default)
            else:
                builder.PrependUOffsetTRelativeSlot(f.slot, v, 0)
        return builder.EndObject()

    root = copy_table(_ORT_ROOT_TABLE, int.from_bytes(buf[0:4], "little"))
    builder.Finish(root, file_identifier=_ORT_FILE_IDENTIFIER)
    return bytes(builder.Output())
