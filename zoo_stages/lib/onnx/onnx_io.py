"""ONNX models in and out of memory, the one place that loads, serialises, saves and checks them:
safe loading, deterministic bytes, protobuf's size limit, onnx's checker, the IR version cap, and
the opsets and operator domains a graph uses.

- loading with safety: external-data locations must stay inside the model's folder
  (`zoo.pathsafety.external_data_files`), and the IR version is lowered to what the installed
  onnxruntime reads (`MAX_IR_VERSION`) unless the caller keeps it (export decides from it);
- serialising deterministically below `PROTOBUF_LIMIT` (`serialise`, `model_bytes`), saving
  atomically (`zoo.files.atomic_write`) as one file, or above the limit with the weights in
  external data beside it (`save`); `prune_opset_imports` drops the domains no node uses;
- checking with onnx's full checker (`check_model`, `checker_error`, `check`);
- what a graph uses: its default opset, custom operator domains, operator counts.

Sessions are built by `zoo_stages.lib.runtimes.ort_session`, run by `zoo_stages.lib.runtimes.onnx_run`.
onnx is imported inside functions so importing this module is cheap.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from zoo.errors import InvalidInput

if TYPE_CHECKING:
    import onnx

# onnx 1.23 stamps IR version 14; onnxruntime 1.31 loads at most 13.
MAX_IR_VERSION = 13

# protobuf cannot serialise or parse a message of 2 GiB (2**31 bytes) or more. A model whose bytes
# are above this limit is saved with its weights in external data (`save`) and refused where one
# message is needed (`model_bytes`). 1 MiB below protobuf's own limit: what is written into a
# model's bytes after they were sized (the provenance metadata_props that export's `stamp_bytes`
# adds, a few KB) cannot take them over it.
PROTOBUF_LIMIT = 2 * 1024**3 - 1024 * 1024
# where `save` puts the weights of a model above the limit: `model.onnx.data` beside `model.onnx`
DATA_SUFFIX = ".data"


# ---------------------------------------------------------------------------------------------
# load / save


def loadable_as_is(path: Path) -> bool:
    """Whether onnxruntime can load the file at `path` directly: its IR version is at most
    `MAX_IR_VERSION`. Its external data must be files in its folder (UnsafePath, InvalidInput).

    Only the top-level fields and the tensors' external-data records are read, never the
    weights, so this costs microseconds where `load_model` parses the whole file.
    """
    from zoo.pathsafety import external_data_files
    from zoo_stages.lib.onnx import onnx_fields

    path = Path(path)
    if not path.is_file():
        raise InvalidInput(f"ONNX model {path} does not exist", hint="check the upstream stage's `model` output")
    header = onnx_fields.read_header(path)
    external_data_files(path)
    return header.ir_version is not None and header.ir_version <= MAX_IR_VERSION


def fix_ir_version(model: "onnx.ModelProto") -> "onnx.ModelProto":
    """Lower the model's IR version to `MAX_IR_VERSION` (in place) so onnxruntime can load it."""
    if model.ir_version > MAX_IR_VERSION:
        model.ir_version = MAX_IR_VERSION
    return model


def load_model(path: Path, *, cap_ir_version: bool = True) -> "onnx.ModelProto":
    """Load an ONNX model fully into memory, checking external data paths and (unless
    `cap_ir_version` is False) lowering the IR version to `MAX_IR_VERSION`.

    Raises InvalidInput for a missing or unparsable file and UnsafePath for external data
    that would escape the model's folder.
    """
    import onnx
    from onnx.external_data_helper import load_external_data_for_model

    from zoo.pathsafety import external_data_files

    path = Path(path)
    if not path.is_file():
        raise InvalidInput(f"ONNX model {path} does not exist", hint="check the upstream stage's `model` output")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # protobuf raises DecodeError, onnx raises its own; all mean "not a model"
        raise InvalidInput(f"{path} is not a readable ONNX model: {_first_line(e)}") from None
    if external_data_files(path):
        load_external_data_for_model(model, str(path.parent))
    return fix_ir_version(model) if cap_ir_version else model


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def load_graph(path: Path) -> "onnx.ModelProto":
    """The model at `path` without its external data's weights (their tensors keep their
    external-data records): the graph, ports and metadata of a model of any size, cheaply.
    Its external data must lie inside its folder (UnsafePath, InvalidInput)."""
    import onnx

    from zoo.pathsafety import external_data_files

    path = Path(path)
    external_data_files(path)
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # DecodeError and onnx's own errors: not a model
        raise InvalidInput(f"{path} is not a readable ONNX model: {_first_line(e)}") from None
    return fix_ir_version(model)


def model_files(path: Path) -> list[Path]:
    """The model file at `path` and its external data files (in name order), checked to lie in its folder."""
    from zoo.pathsafety import external_data_files

    path = Path(path)
    return [path] + [path.parent / rel for rel in external_data_files(path)]


def model_digest(path: Path) -> str:
    """A digest of the model's bytes, its external data included: the file's own digest for a
    self-contained model, else one over each file's name and digest."""
    from zoo.engine.hashing import digest_json, hash_file_uncached

    files = model_files(path)
    if len(files) == 1:
        return hash_file_uncached(files[0])
    return digest_json({"files": [[f.name if i == 0 else str(f.relative_to(files[0].parent)),
                                        hash_file_uncached(f)] for i, f in enumerate(files)]})


def check_model(path: Path, scratch: Path | None = None) -> None:
    """``onnx.checker.check_model(full_check=True)`` of the model at `path` with its external data.

    onnx refuses external data files with more than one hard link (a guard against links to
    files elsewhere); the cache and the zoo share files by hard link, so such a model is checked
    on a copy of its files in a temporary folder under `scratch` (the system's temporary folder
    when None). Raises what the checker raises.
    """
    import shutil
    import tempfile

    import onnx

    files = model_files(path)
    if len(files) == 1:
        onnx.checker.check_model(str(path), full_check=True)
        return
    if all(f.stat().st_nlink == 1 for f in files):
        onnx.checker.check_model(str(path), full_check=True)
        return
    if scratch is not None:
        Path(scratch).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=scratch, prefix="check-") as tmp:
        for f in files:
            dest = Path(tmp) / f.relative_to(files[0].parent)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, dest)
        onnx.checker.check_model(str(Path(tmp) / files[0].name), full_check=True)


def checker_error(model: "Path | bytes | onnx.ModelProto", scratch: Path | None = None) -> str | None:
    """None when ``onnx.checker`` (full check: checker, then strict type and shape inference)
    accepts the model (a path, checked with its external data as `check_model` does, its
    serialisation, or a loaded ModelProto), else the first line of its complaint.
    zoo's own errors (a missing or unsafe external data file) are raised: they are not a verdict."""
    import onnx

    from zoo.errors import ZooError

    try:
        if isinstance(model, (str, Path)):
            check_model(Path(model), scratch)
        else:
            onnx.checker.check_model(model, full_check=True)
    except ZooError:
        raise
    except Exception as e:  # ValidationError, InferenceError: both mean the checker refused it
        return _first_line(e)
    return None


def check(model: "Path | bytes | onnx.ModelProto", *, hint: str, scratch: Path | None = None) -> None:
    """onnx's full check (`checker_error`); InvalidInput naming its complaint, with `hint`."""
    why = checker_error(model, scratch)
    if why is not None:
        raise InvalidInput(f"the ONNX model fails onnx's checker: {why}", hint=hint) from None


def model_size(path: Path) -> int:
    """Bytes of the model file and its external data files."""
    return sum(f.stat().st_size for f in model_files(path))


def serialise(model: "onnx.ModelProto") -> bytes | None:
    """The deterministic serialisation of `model`, or None above `PROTOBUF_LIMIT`."""
    try:
        blob = model.SerializeToString(deterministic=True)
    except Exception:  # protobuf refuses messages of 2 GiB or more (ValueError or EncodeError)
        # and its ByteSize() is a 32-bit count that wraps above 2 GiB, so it cannot tell this failure
        # from another: the model goes to external data, whose save fails on its own if it is malformed
        return None
    return blob if len(blob) <= PROTOBUF_LIMIT else None


def model_bytes(model: "onnx.ModelProto") -> bytes:
    """Deterministic serialisation of a model (IR version fixed), refusing models above the limit."""
    blob = serialise(fix_ir_version(model))
    if blob is None:
        raise InvalidInput(f"the model is {model.ByteSize() / 2**30:.1f} GiB, above protobuf's 2 GiB limit",
                           hint="models this large need ONNX external data, which this stage does not write")
    return blob


def save_model(model: "onnx.ModelProto", path: Path) -> Path:
    """Atomically save `model` as one self-contained .onnx file (IR version ≤ MAX_IR_VERSION)."""
    from zoo.files import atomic_write

    return atomic_write(Path(path), model_bytes(model), fsync=False)  # the cache fsyncs outputs it commits


def save(model: "onnx.ModelProto", path: Path, blob: bytes | None = None) -> Path:
    """Atomically save `model` at `path`: its serialisation (`blob` when the caller has it) as
    one file, or, above `PROTOBUF_LIMIT`, with its weights in `data_path(path)` (`save_external`).
    The IR version is the caller's to fix."""
    from zoo.files import atomic_write

    if blob is None:
        blob = serialise(model)
    if blob is None:
        return save_external(model, path)
    return atomic_write(Path(path), blob, fsync=False)  # the cache fsyncs outputs it commits


def save_external(model: "onnx.ModelProto", path: Path) -> Path:
    """Save `model` at `path` with every tensor of 1 KiB or more in one data file beside it,
    `data_path(path)`. Saving moves the weights out of `model`'s tensors and points them at that
    file, so a model is saved this way once, under its final name (the model file is written
    atomically; the data file is written beside it under its own name)."""
    import onnx

    from zoo.files import atomic_output

    path = Path(path)
    with atomic_output(path, fsync=False) as tmp:
        onnx.save_model(model, str(tmp), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=data_path(path).name, size_threshold=1024)
    return path


def data_path(path: Path) -> Path:
    """Where `save` puts the weights of the model at `path` when it is above the limit."""
    path = Path(path)
    return path.with_name(path.name + DATA_SUFFIX)


def as_model(model: "onnx.ModelProto | Path | str | bytes") -> "onnx.ModelProto":
    """A ModelProto from a proto, a path (loaded safely) or serialised bytes."""
    import onnx

    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, (bytes, bytearray)):
        return fix_ir_version(onnx.load_from_string(bytes(model)))
    return load_model(Path(model))


def _graph_domains(graph) -> set[str]:
    found = set()
    for node in graph.node:
        found.add(node.domain)
        for attr in node.attribute:
            if attr.HasField("g"):
                found |= _graph_domains(attr.g)
            for g in attr.graphs:
                found |= _graph_domains(g)
    return found


def prune_opset_imports(model: "onnx.ModelProto") -> "onnx.ModelProto":
    """Drop opset imports no node uses and sort the rest (in place).

    onnxruntime's optimizer and quantizer declare every domain they know (training, aten,
    nchwc...); keeping only the used ones makes the file smaller, stable and honest about
    which runtimes can load it. The default domain is always kept.
    """
    used = _graph_domains(model.graph)
    for function in model.functions:
        used.add(function.domain)
        for node in function.node:
            used.add(node.domain)
    used = {"" if d == "ai.onnx" else d for d in used} | {""}
    keep = sorted({(op.domain, op.version) for op in model.opset_import
                   if ("" if op.domain == "ai.onnx" else op.domain) in used})
    del model.opset_import[:]
    for domain, version in keep:
        entry = model.opset_import.add()
        entry.domain, entry.version = domain, version
    return model


def opset_version(model: "onnx.ModelProto") -> int | None:
    """The model's default-domain opset version."""
    for op in model.opset_import:
        if op.domain in ("", "ai.onnx"):
            return int(op.version)
    return None


def custom_domains(model: "onnx.ModelProto") -> list[str]:
    """Operator domains other than the standard ONNX one used by the graph's nodes (e.g. com.microsoft)."""
    return sorted({n.domain for n in model.graph.node if n.domain not in ("", "ai.onnx")})


def op_counts(model: "onnx.ModelProto") -> dict[str, int]:
    """Number of nodes per operator type (domain-qualified for non-standard domains)."""
    counts: dict[str, int] = {}
    for n in model.graph.node:
        name = n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}"
        counts[name] = counts.get(name, 0) + 1
    return dict(sorted(counts.items()))
