"""Find the external-data locations of an ONNX file without parsing its weights.

An ONNX model is a protobuf ``ModelProto``. This walker reads the wire format directly from a
memory map: it descends only into the messages that can hold tensors and skips every other
field by its length, so a 2 GB model costs the same as a 2 KB one (``onnx.load`` would copy
every weight byte). It visits a superset of what ``onnx.external_data_helper`` visits: graph
initializers, sparse initializers, node attributes (tensor, tensors, sparse tensors, subgraphs),
functions and their attribute defaults, and training-info graphs. Nothing is executed.

Field numbers are those of onnx.proto (checked against onnx's descriptors in the tests).
"""

from __future__ import annotations

import mmap
from pathlib import Path

# message -> {field number: child message}; fields absent here are skipped
MODEL, GRAPH, NODE, ATTRIBUTE, TENSOR, SPARSE, FUNCTION, TRAINING, ENTRY = range(9)
CHILDREN: dict[int, dict[int, int]] = {
    MODEL: {7: GRAPH, 20: TRAINING, 25: FUNCTION},
    TRAINING: {1: GRAPH, 2: GRAPH},
    GRAPH: {1: NODE, 5: TENSOR, 15: SPARSE},
    NODE: {5: ATTRIBUTE},
    ATTRIBUTE: {5: TENSOR, 6: GRAPH, 10: TENSOR, 11: GRAPH, 22: SPARSE, 23: SPARSE},
    SPARSE: {1: TENSOR, 2: TENSOR},
    FUNCTION: {7: NODE, 11: ATTRIBUTE},
    TENSOR: {13: ENTRY},
    ENTRY: {},
}
TENSOR_DATA_LOCATION = 14
EXTERNAL = 1
MAX_DEPTH = 64


class ScanError(ValueError):
    """The bytes are not a well-formed protobuf message."""


def read_varint(buf, pos: int, end: int) -> tuple[int, int]:
    """(value, next position) of the protobuf varint at `pos`; ScanError (a ValueError) if malformed."""
    result = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise ScanError("truncated or overlong varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _walk(buf, pos: int, end: int, kind: int, depth: int, found: list[str]) -> None:
    if depth > MAX_DEPTH:
        raise ScanError("messages nested too deeply")
    children = CHILDREN[kind]
    location = None
    is_external = False
    entries: list[tuple[int, int]] = []
    key = value = None
    while pos < end:
        tag, pos = read_varint(buf, pos, end)
        field, wire = tag >> 3, tag & 7
        if field == 0:
            raise ScanError("field number 0")
        if wire == 0:
            v, pos = read_varint(buf, pos, end)
            if kind == TENSOR and field == TENSOR_DATA_LOCATION:
                is_external = v == EXTERNAL
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 2:
            n, pos = read_varint(buf, pos, end)
            if pos + n > end:
                raise ScanError("length-delimited field runs past its message")
            if kind == ENTRY and field in (1, 2):
                text = bytes(buf[pos:pos + n]).decode("utf-8", errors="replace")
                key, value = (text, value) if field == 1 else (key, text)
            elif kind == TENSOR and field == 13:
                entries.append((pos, pos + n))
            elif field in children:
                _walk(buf, pos, pos + n, children[field], depth + 1, found)
            pos += n
        else:
            raise ScanError(f"unsupported wire type {wire}")
        if pos > end:
            raise ScanError("field runs past its message")
    if kind == ENTRY:
        found.append(f"{key}\x00{value}")
    if kind == TENSOR:
        pairs: list[str] = []
        for start, stop in entries:
            _walk(buf, start, stop, ENTRY, depth + 1, pairs)
        for pair in pairs:
            k, _, v = pair.partition("\x00")
            # any recorded location is checked, even without data_location=EXTERNAL: stricter than runtimes
            if k == "location":
                location = v
        if location is not None or is_external:
            found.append(location if location is not None else "")


def external_locations(path: Path) -> list[str]:
    """Sorted, distinct external-data locations recorded in the ONNX file at `path`.

    An external tensor without a location yields "" (which the caller refuses).
    Raises ScanError if the file is not a well-formed protobuf message.
    """
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        if size == 0:
            raise ScanError("empty file")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            found: list[str] = []
            view = memoryview(mm)
            try:
                _walk(view, 0, size, MODEL, 0, found)
            finally:
                view.release()
    return sorted(set(found))
