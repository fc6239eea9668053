"""ONNX files at the protobuf wire level, without onnx: the one field walker, and the scan for
external-data locations.

An ONNX model is a protobuf ``ModelProto``. `fields` lists the fields of a message straight from
the bytes (a memory map), skipping each value by its length, so reading the small fields of a
2 GB model costs the same as of a 2 KB one (``onnx.load`` would copy every weight byte). The
stage kinds read and rewrite a model's top-level fields with it (``zoo_stages.lib.onnx.onnx_fields``),
and `external_tensors` descends through it into the messages that can hold tensors.

`external_tensors` visits a superset of what ``onnx.external_data_helper`` visits: graph
initializers, sparse initializers, node attributes (tensor, tensors, sparse tensors, subgraphs),
functions and their attribute defaults, and training-info graphs. Nothing is executed.
Whether a location is safe is decided in `zoo.pathsafety`.

Field numbers are those of onnx.proto (checked against onnx's descriptors in the tests).
"""

from __future__ import annotations

import mmap
from pathlib import Path
from typing import Iterator, NamedTuple

# message -> {field number: child message}; fields absent here are skipped
MODEL, GRAPH, NODE, ATTRIBUTE, TENSOR, SPARSE, FUNCTION, TRAINING = range(8)
CHILDREN: dict[int, dict[int, int]] = {
    MODEL: {7: GRAPH, 20: TRAINING, 25: FUNCTION},
    TRAINING: {1: GRAPH, 2: GRAPH},
    GRAPH: {1: NODE, 5: TENSOR, 15: SPARSE},
    NODE: {5: ATTRIBUTE},
    ATTRIBUTE: {5: TENSOR, 6: GRAPH, 10: TENSOR, 11: GRAPH, 22: SPARSE, 23: SPARSE},
    SPARSE: {1: TENSOR, 2: TENSOR},
    FUNCTION: {7: NODE, 11: ATTRIBUTE},
    TENSOR: {},
}
TENSOR_NAME, TENSOR_EXTERNAL_DATA, TENSOR_DATA_LOCATION = 8, 13, 14
ENTRY_KEY, ENTRY_VALUE = 1, 2  # StringStringEntryProto
EXTERNAL = 1
MAX_DEPTH = 64

VARINT, FIXED64, LENGTH_DELIMITED, FIXED32 = 0, 1, 2, 5  # wire types (3 and 4, groups, are not used by onnx)


class ScanError(ValueError):
    """The bytes are not a well-formed protobuf message."""


class Field(NamedTuple):
    """One field of a message: its number, wire type, and byte offsets in the buffer."""

    number: int
    wire: int
    start: int  # the tag's first byte
    value_start: int  # the value's first byte (after the length, for a length-delimited field)
    stop: int  # one past the value's last byte


_new_field = tuple.__new__  # Field(...) without NamedTuple's Python-level __new__: millions are made


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


def fields(buf, start: int, end: int) -> Iterator[Field]:
    """The fields of the message in ``buf[start:end]``, in order; ScanError (a ValueError) when
    the bytes are not protobuf. Values are skipped, not read: a huge field costs nothing."""
    pos = start
    while pos < end:
        begin = pos
        tag = buf[pos]
        if tag < 0x80:  # one-byte varints (most tags and lengths) skip read_varint: the walker is hot
            pos += 1
        else:
            tag, pos = read_varint(buf, pos, end)
        number, wire = tag >> 3, tag & 7
        if number == 0:
            raise ScanError("field number 0")
        value_start = pos
        if wire == VARINT:
            _, pos = read_varint(buf, pos, end)
        elif wire == LENGTH_DELIMITED:
            if pos < end and buf[pos] < 0x80:
                value_start = pos + 1
                pos = value_start + buf[pos]
            else:
                n, value_start = read_varint(buf, pos, end)
                pos = value_start + n
        elif wire == FIXED64:
            pos += 8
        elif wire == FIXED32:
            pos += 4
        else:
            raise ScanError(f"unsupported wire type {wire}")
        if pos > end:
            raise ScanError("field runs past its message")
        yield _new_field(Field, (number, wire, begin, value_start, pos))


def text(buf, f: Field) -> str:
    """A length-delimited field's value as text (undecodable bytes replaced)."""
    return bytes(buf[f.value_start:f.stop]).decode("utf-8", errors="replace")


def _walk(buf, start: int, end: int, kind: int, depth: int, found: list[tuple[str, str]]) -> None:
    """Append (location, tensor name) for every tensor with external data under this message."""
    if depth > MAX_DEPTH:
        raise ScanError("messages nested too deeply")
    children = CHILDREN[kind]
    location = None
    name = ""
    is_external = False
    for f in fields(buf, start, end):
        if f.wire == LENGTH_DELIMITED:
            if kind == TENSOR and f.number == TENSOR_EXTERNAL_DATA:
                key, value = string_entry(buf, f)
                if key == "location":
                    location = value or ""
            elif kind == TENSOR and f.number == TENSOR_NAME:
                name = text(buf, f)
            elif f.number in children:
                _walk(buf, f.value_start, f.stop, children[f.number], depth + 1, found)
        elif f.wire == VARINT and kind == TENSOR and f.number == TENSOR_DATA_LOCATION:
            is_external = read_varint(buf, f.value_start, f.stop)[0] == EXTERNAL
    # any recorded location is reported, even without data_location=EXTERNAL: stricter than runtimes
    if location is not None or is_external:
        found.append((location if location is not None else "", name))


def string_entry(buf, f: Field) -> tuple[str, str]:
    """(key, value) of a StringStringEntryProto field ("" for a missing one)."""
    key = value = ""
    for sub in fields(buf, f.value_start, f.stop):
        if sub.wire == LENGTH_DELIMITED and sub.number == ENTRY_KEY:
            key = text(buf, sub)
        elif sub.wire == LENGTH_DELIMITED and sub.number == ENTRY_VALUE:
            value = text(buf, sub)
    return key, value


def external_tensors(path: Path) -> list[tuple[str, str]]:
    """(location, tensor name) of every tensor in the ONNX file at `path` that records external
    data, in file order. An external tensor without a location gives "" (which callers refuse).

    Raises ScanError if the file is empty or not a well-formed protobuf message.
    """
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        if size == 0:
            raise ScanError("empty file")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            found: list[tuple[str, str]] = []
            view = memoryview(mm)
            try:
                _walk(view, 0, size, MODEL, 0, found)
            finally:
                view.release()
    return found


def external_locations(path: Path) -> list[str]:
    """Sorted, distinct external-data locations recorded in the ONNX file at `path` (unchecked:
    `zoo.pathsafety.external_data_locations` refuses the unsafe ones)."""
    return sorted({location for location, _ in external_tensors(path)})
