"""An ONNX file's graph inputs and outputs (name, rank) read at the protobuf wire level, without onnx.

For the checks before a run (`Export.preflight`): the ports are in the graph's small fields, so
reading them costs the same for a 2 GB model as for a 2 KB one (`zoo.onnxwire.fields` skips every
weight). Graph inputs that are also initializers (models of IR version < 4 list their weights as
inputs) are not ports: a caller never feeds them.

Field numbers are onnx.proto's: ModelProto.graph 7; GraphProto.initializer 5, input 11, output 12;
TensorProto.name 8; ValueInfoProto.name 1, type 2; TypeProto.tensor_type 1; TypeProto.Tensor.shape 2;
TensorShapeProto.dim 1.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass
from pathlib import Path

from zoo import onnxwire

_GRAPH, _INITIALIZER, _INPUT, _OUTPUT = 7, 5, 11, 12
_TENSOR_NAME, _VALUE_NAME, _VALUE_TYPE, _TENSOR_TYPE, _SHAPE, _DIM = 8, 1, 2, 1, 2, 1
_LEN = onnxwire.LENGTH_DELIMITED


@dataclass(frozen=True)
class Port:
    """One graph input or output: its name and rank (None when the file declares no shape)."""

    name: str
    rank: int | None


@dataclass(frozen=True)
class Ports:
    inputs: tuple[Port, ...]
    outputs: tuple[Port, ...]


def read_ports(path: Path) -> Ports:
    """The graph's inputs (initializers excepted) and outputs, in order; ValueError (`onnxwire.ScanError`)
    when the file is not a protobuf message, OSError when it cannot be read."""
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        if size == 0:
            raise onnxwire.ScanError("empty file")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            view = memoryview(mm)
            try:
                return _ports(view, size)
            finally:
                view.release()


def _ports(buf, size: int) -> Ports:
    inputs: list[Port] = []
    outputs: list[Port] = []
    weights: set[str] = set()
    for g in onnxwire.fields(buf, 0, size):
        if g.number != _GRAPH or g.wire != _LEN:
            continue
        for f in onnxwire.fields(buf, g.value_start, g.stop):
            if f.wire != _LEN:
                continue
            if f.number == _INITIALIZER:
                weights.update(onnxwire.text(buf, t) for t in onnxwire.fields(buf, f.value_start, f.stop)
                               if t.number == _TENSOR_NAME and t.wire == _LEN)
            elif f.number in (_INPUT, _OUTPUT):
                (inputs if f.number == _INPUT else outputs).append(_port(buf, f))
    return Ports(tuple(p for p in inputs if p.name not in weights), tuple(outputs))


def _port(buf, value: onnxwire.Field) -> Port:
    name, rank = "", None
    for f in onnxwire.fields(buf, value.value_start, value.stop):
        if f.wire != _LEN:
            continue
        if f.number == _VALUE_NAME:
            name = onnxwire.text(buf, f)
        elif f.number == _VALUE_TYPE:
            rank = _rank(buf, f)
    return Port(name, rank)


def _rank(buf, type_field: onnxwire.Field) -> int | None:
    """The number of dimensions of a tensor type's shape; None for a non-tensor or shapeless type."""
    for t in onnxwire.fields(buf, type_field.value_start, type_field.stop):
        if t.number != _TENSOR_TYPE or t.wire != _LEN:
            continue
        for s in onnxwire.fields(buf, t.value_start, t.stop):
            if s.number == _SHAPE and s.wire == _LEN:
                return sum(1 for d in onnxwire.fields(buf, s.value_start, s.stop) if d.number == _DIM)
    return None
