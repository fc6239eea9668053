"""The export kind's ONNX files in and out, the same for its torch exporter and its ONNX
pass-through: a source model loaded with its external data kept inside its folder, the graph
normalised (IR version capped at what onnxruntime loads, doc strings and node metadata dropped:
they may hold source paths), provenance stamped, serialised deterministically below protobuf's
2 GB limit (external data in ``model.onnx.data`` above it), checked with onnx's full checker,
written atomically, and described for the stage's metrics. onnx is imported inside functions.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping

from zoo.errors import InvalidInput

MAX_IR_VERSION = 13  # onnxruntime 1.31 loads at most IR 13; onnx 1.23 stamps 14
PROTOBUF_LIMIT = 2 * 1024**3 - 1024 * 1024  # stay clear of protobuf's 2 GB message limit
DATA_LOCATION = "model.onnx.data"


def needs_normalising(proto) -> bool:
    """Whether `normalise` would change anything (the TorchScript exporter, not verbose,
    writes no doc strings or node metadata)."""
    return (proto.ir_version > MAX_IR_VERSION or bool(proto.doc_string) or bool(proto.graph.doc_string)
            or any(node.doc_string or len(node.metadata_props) for node in all_nodes(proto.graph)))


def stamp_bytes(blob: bytes, proto, props: Mapping[str, str]) -> bytes:
    """`blob` with its metadata_props replaced as `stamp` would (also applied to `proto`)."""
    from zoo_stages.lib import onnx_fields
    from zoo_stages.lib.provenance import stamped_entries

    entries = stamped_entries([(p.key, p.value) for p in proto.metadata_props], props)
    stamp(proto, props)
    return onnx_fields.rewrite_bytes(blob, metadata=entries)


def serialise(proto) -> bytes | None:
    """The deterministic serialisation of `proto`, or None above protobuf's 2 GB limit."""
    try:
        blob = proto.SerializeToString(deterministic=True)
    except Exception:  # protobuf refuses messages above 2 GB (ValueError or EncodeError)
        return None
    return blob if len(blob) <= PROTOBUF_LIMIT else None


def normalise(proto):
    """Cap the IR version and drop text that may vary between runs or machines."""
    proto.ir_version = min(proto.ir_version, MAX_IR_VERSION)
    proto.doc_string = ""
    proto.graph.doc_string = ""
    for node in all_nodes(proto.graph):
        node.doc_string = ""
        del node.metadata_props[:]
    return proto


def all_nodes(graph):
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.g.node:
                yield from all_nodes(attr.g)
            for g in attr.graphs:
                yield from all_nodes(g)


def check(model: "bytes | Path") -> None:
    """``onnx.checker`` full check (checker, then strict type and shape inference) of the model's
    serialisation, or of its file when it lies above protobuf's 2 GB limit (external data)."""
    import onnx

    try:
        onnx.checker.check_model(model if isinstance(model, bytes) else str(model), full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
        raise InvalidInput(f"the ONNX model fails onnx's checker: {str(e).splitlines()[0]}",
                           hint="try another opset") from None


def save_large(proto, target: Path) -> None:
    """Above 2 GB: write `proto` with its weights in model.onnx.data beside `target`, then check
    the file. (Saving with external data moves the weights out of `proto`'s tensors and points
    them at the file written, so the model is saved once, under its final name, and checked
    there: a check under another name first would leave the tensors pointing at that name.)"""
    save(proto, target)
    check(target)


def save(proto, target: Path, blob: bytes | None = None) -> None:
    """Write the model atomically: `blob` (its serialisation) when given, else external data
    (model.onnx.data) for a model above 2 GB."""
    import onnx

    from zoo.files import atomic_output, atomic_write

    if blob is not None:
        atomic_write(target, blob, fsync=False)
        return
    with atomic_output(target, fsync=False) as tmp:  # the data file is written beside it, under its own name
        onnx.save_model(proto, str(tmp), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=DATA_LOCATION, size_threshold=1024)


def stamp(proto, props: Mapping[str, str]) -> None:
    from zoo_stages.lib.provenance import stamp

    stamp(proto, props)


def load_onnx(path: Path):
    """Load an ONNX model with its external data, which must be files in the model's folder
    (`zoo.pathsafety.external_data_files`: UnsafePath for a location that escapes it)."""
    import onnx
    from onnx.external_data_helper import load_external_data_for_model

    from zoo.pathsafety import external_data_files

    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception as e:
        raise InvalidInput(f"{path} is not a readable ONNX model: {str(e).splitlines()[0]}") from None
    if external_data_files(path):
        load_external_data_for_model(proto, str(path.parent))
    return proto


def describe(proto, target: Path) -> dict[str, Any]:
    ops: dict[str, int] = {}
    for node in all_nodes(proto.graph):
        ops[node.op_type] = ops.get(node.op_type, 0) + 1
    size = target.stat().st_size
    data = target.with_name(DATA_LOCATION)
    if data.exists():
        size += data.stat().st_size
    return {
        "ir_version": int(proto.ir_version),
        "opset_imports": {(o.domain or "ai.onnx"): int(o.version) for o in proto.opset_import},
        "inputs": [i.name for i in proto.graph.input if i.name not in {t.name for t in proto.graph.initializer}],
        "outputs": output_names(proto),
        "nodes": sum(ops.values()),
        "op_types": dict(sorted(ops.items())),
        "size_bytes": int(size),
    }


def output_names(proto) -> list[str]:
    return [o.name for o in proto.graph.output]


def source_digest(path: Path) -> str:
    """The sha256 of a source file (weights, an ONNX model)."""
    from zoo.sources import source_sha256

    # files from the source cache are named by their (verified) sha256: no need to re-read them
    if path.parent.name == "sha256" and re.fullmatch(r"[0-9a-f]{64}", path.name):
        return path.name
    return source_sha256(path)
