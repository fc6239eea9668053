"""What the export kind does to its ONNX files, the same for its torch exporter and its ONNX
pass-through, between loading and saving them (`zoo_stages.lib.onnx.onnx_io`, which also serialises
below protobuf's limit, writes external data above it and checks): the graph normalised (IR
version capped at what onnxruntime loads, doc strings and node metadata dropped: they may hold
source paths), provenance stamped, checked with onnx's full checker (an opset hint when it
fails), saved above the limit, and described for the stage's metrics. onnx is imported inside
functions.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping

from zoo_stages.lib.onnx import onnx_io
from zoo_stages.lib.onnx.onnx_io import MAX_IR_VERSION

# what a model that fails onnx's checker after an export may need
CHECK_HINT = "try another opset"


def needs_normalising(proto) -> bool:
    """Whether `normalise` would change anything (the TorchScript exporter, not verbose,
    writes no doc strings or node metadata)."""
    return (proto.ir_version > MAX_IR_VERSION or bool(proto.doc_string) or bool(proto.graph.doc_string)
            or any(node.doc_string or len(node.metadata_props) for node in all_nodes(proto.graph)))


def stamp_bytes(blob: bytes, proto, props: Mapping[str, str]) -> bytes:
    """`blob` with its metadata_props replaced as `stamp` would (also applied to `proto`)."""
    from zoo_stages.lib.onnx import onnx_fields
    from zoo_stages.lib.release.provenance import stamped_entries

    entries = stamped_entries([(p.key, p.value) for p in proto.metadata_props], props)
    stamp(proto, props)
    return onnx_fields.rewrite_bytes(blob, metadata=entries)


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
    serialisation, or of its file when it lies above protobuf's limit (external data);
    InvalidInput when it fails."""
    onnx_io.check(model, hint=CHECK_HINT)


def save_large(proto, target: Path) -> None:
    """Above protobuf's limit: write `proto` with its weights in external data beside `target`
    (`onnx_io.save_external`), then check the file. (Saving with external data points the
    tensors at the file written, so the model is saved once, under its final name, and checked
    there: a check under another name first would leave the tensors pointing at that name.)"""
    onnx_io.save_external(proto, target)
    check(target)


def stamp(proto, props: Mapping[str, str]) -> None:
    from zoo_stages.lib.release.provenance import stamp

    stamp(proto, props)


def describe(proto, target: Path) -> dict[str, Any]:
    ops: dict[str, int] = {}
    for node in all_nodes(proto.graph):
        ops[node.op_type] = ops.get(node.op_type, 0) + 1
    size = target.stat().st_size
    data = onnx_io.data_path(target)
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
