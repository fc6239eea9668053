"""ONNX files at the protobuf wire level: read and replace a model's small top-level fields.

The protobuf field walker is `zoo.onnxwire.fields`. A ``ModelProto`` is a handful of small fields (IR version, opset imports, metadata_props...)
around one huge one, the graph with its weights. Stages that only need to stamp provenance or
prune opset imports should not parse, re-serialise and rewrite hundreds of MB to do it: that
took 0.7-1 s per 233 MB model here. This module reads the top-level fields from a memory map
and rewrites only the bytes after the graph, in place.

Protobuf writers emit fields in field-number order, so in files written by onnx, torch and
onnxruntime the graph (field 7) comes before ``opset_import`` (8) and ``metadata_props`` (14).
When a field to replace sits before the graph anyway, or the file has other hard links (it may
be a cache object), the whole file is rewritten into a temp file and renamed instead. The
fields after the graph are re-emitted in field-number order, the replaced ones in their place,
so a given input always gives the same bytes.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from zoo.errors import InvalidInput
from zoo.files import atomic_output
from zoo.onnxwire import ENTRY_KEY, ENTRY_VALUE, LENGTH_DELIMITED, VARINT, Field, fields, read_varint, string_entry, text

# onnx.proto field numbers
IR_VERSION, GRAPH, OPSET_IMPORT, METADATA_PROPS = 1, 7, 8, 14
_DOMAIN, _VERSION = 1, 2  # OperatorSetIdProto
_COPY_CHUNK = 64 << 20


@dataclass(frozen=True)
class Header:
    """What the small top-level fields of an ONNX file say."""

    ir_version: int | None
    opset_import: list[tuple[str, int]]
    metadata: list[tuple[str, str]]


def read_header(path: Path) -> Header:
    """IR version, opset imports and metadata_props of the ONNX file at `path`, without parsing
    its graph. InvalidInput when the file is empty or not protobuf."""
    path = Path(path)
    with _mapped(path) as (buf, size):
        try:
            top = list(fields(buf, 0, size))
            ir = None
            opsets: list[tuple[str, int]] = []
            metadata: list[tuple[str, str]] = []
            for f in top:
                if f.number == IR_VERSION and f.wire == VARINT:
                    ir, _ = read_varint(buf, f.value_start, f.stop)
                elif f.number == OPSET_IMPORT and f.wire == LENGTH_DELIMITED:
                    opsets.append(_opset(buf, f))
                elif f.number == METADATA_PROPS and f.wire == LENGTH_DELIMITED:
                    metadata.append(string_entry(buf, f))
        except ValueError as e:
            raise InvalidInput(f"{path} is not a readable ONNX model ({e})") from None
    return Header(ir, opsets, metadata)


def rewrite(path: Path, *, metadata: Sequence[tuple[str, str]] | None = None,
            opset_import: Sequence[tuple[str, int]] | None = None, ir_version: int | None = None) -> Path:
    """Replace the given top-level fields of the ONNX file at `path` (None leaves a field alone).

    In place when every replaced field follows the graph and the file has no other hard link;
    otherwise through a temp file and a rename. Either way the graph bytes are not parsed.
    """
    path = Path(path)
    replaced = _replacements(metadata, opset_import, ir_version)
    if not replaced:
        return path
    with _mapped(path) as (buf, size):
        try:
            top = list(fields(buf, 0, size))
        except ValueError as e:
            raise InvalidInput(f"{path} is not a readable ONNX model ({e})") from None
        graphs = [i for i, f in enumerate(top) if f.number == GRAPH]
        cut = graphs[-1] + 1 if graphs else 0
        in_place = (path.stat().st_nlink == 1 and graphs
                    and not any(f.number in replaced for f in top[:cut]))
        if in_place:
            tail_start = top[cut].start if cut < len(top) else size
            tail = _emit(buf, top[cut:], replaced)
        else:
            head = [f for f in top if f.number not in replaced]
    if in_place:
        with open(path, "r+b") as f:
            f.seek(tail_start)
            f.write(tail)
            f.truncate()
        return path
    _rewrite_copy(path, head, replaced)
    return path


def rewrite_bytes(blob: bytes, *, metadata: Sequence[tuple[str, str]] | None = None,
                  opset_import: Sequence[tuple[str, int]] | None = None) -> bytes:
    """`rewrite` for a serialised model in memory: the bytes up to the end of the graph are
    kept as they are, the fields after it re-emitted. ValueError when the fields to replace
    precede the graph (no writer emits them there) or `blob` is not protobuf."""
    replaced = _replacements(metadata, opset_import, None)
    view = memoryview(blob)
    top = list(fields(view, 0, len(blob)))
    graphs = [i for i, f in enumerate(top) if f.number == GRAPH]
    if not graphs or any(f.number in replaced for f in top[:graphs[-1] + 1]):
        raise ValueError("the fields to replace do not all follow the graph")
    cut = graphs[-1] + 1
    tail_start = top[cut].start if cut < len(top) else len(blob)
    return b"".join([view[:tail_start], _emit(view, top[cut:], replaced)])


# ---------------------------------------------------------------------------------------------
# internals


def _replacements(metadata, opset_import, ir_version) -> dict[int, list[bytes]]:
    """Encoded top-level fields by field number, for the arguments that are not None."""
    replaced: dict[int, list[bytes]] = {}
    if ir_version is not None:
        replaced[IR_VERSION] = [_varint_field(IR_VERSION, ir_version)]
    if opset_import is not None:
        replaced[OPSET_IMPORT] = [_bytes_field(OPSET_IMPORT, _bytes_field(_DOMAIN, d.encode()) +
                                               _varint_field(_VERSION, int(v))) for d, v in opset_import]
    if metadata is not None:
        replaced[METADATA_PROPS] = [_bytes_field(METADATA_PROPS, _bytes_field(ENTRY_KEY, k.encode()) +
                                                 _bytes_field(ENTRY_VALUE, v.encode())) for k, v in metadata]
    return replaced


class _mapped:
    """A read-only memory map of a non-empty file: ``with _mapped(path) as (buf, size)``."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self):
        try:
            self._file = open(self.path, "rb")
        except FileNotFoundError:
            raise InvalidInput(f"ONNX model {self.path} does not exist") from None
        size = self._file.seek(0, 2)
        if size == 0:
            self._file.close()
            raise InvalidInput(f"{self.path} is empty, not an ONNX model")
        self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
        self._view = memoryview(self._map)
        return self._view, size

    def __exit__(self, *exc):
        self._view.release()
        self._map.close()
        self._file.close()
        return False


def _varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64  # protobuf encodes negative int64 as ten bytes
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _varint_field(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value)


def _bytes_field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _opset(buf, f: Field) -> tuple[str, int]:
    domain, version = "", 0
    for sub in fields(buf, f.value_start, f.stop):
        if sub.number == _DOMAIN and sub.wire == LENGTH_DELIMITED:
            domain = text(buf, sub)
        elif sub.number == _VERSION and sub.wire == VARINT:
            version, _ = read_varint(buf, sub.value_start, sub.stop)
    return domain, version


def _emit(buf, tail: list[Field], replaced: dict[int, list[bytes]]) -> bytes:
    """The tail fields in field-number order (stable), the replaced numbers swapped for new bytes."""
    pieces: list[tuple[int, int, bytes]] = []
    for i, f in enumerate(tail):
        if f.number not in replaced:
            pieces.append((f.number, i, bytes(buf[f.start:f.stop])))
    for number, encoded in replaced.items():
        pieces.append((number, -1, b"".join(encoded)))
    pieces.sort(key=lambda p: (p[0], p[1]))
    return b"".join(p[2] for p in pieces)


def _rewrite_copy(path: Path, keep: list[Field], replaced: dict[int, list[bytes]]) -> None:
    """Write the kept fields and the replacements (all in field-number order) to a temp file
    in the same folder, then rename it over `path`."""
    order = sorted([(f.number, i, f) for i, f in enumerate(keep)] +
                   [(number, -1, encoded) for number, encoded in replaced.items()], key=lambda p: (p[0], p[1]))
    with atomic_output(path, fsync=False) as tmp, open(path, "rb") as src, open(tmp, "wb") as out:
        for _, _, item in order:
            if isinstance(item, Field):
                src.seek(item.start)
                remaining = item.stop - item.start
                while remaining:
                    chunk = src.read(min(remaining, _COPY_CHUNK))
                    if not chunk:
                        raise InvalidInput(f"{path} changed while it was being rewritten")
                    out.write(chunk)
                    remaining -= len(chunk)
            else:
                out.write(b"".join(item))
