"""Sequence-of-maps outputs (a classifier's ZipMap: one ``{class: probability}`` per sample) as a
per-class probability matrix, the form every comparison, metric, gate and test vector uses.

onnxruntime returns an output of ONNX type ``seq(map(int64|string, tensor(float)))`` as a Python
``list[dict]``. `to_matrix` turns it into a float32 ``(samples, classes)`` array whose columns are
the map keys sorted (ints numerically, strings by code point), so ``{0: .9, 1: .1}`` and
``{1: .1, 0: .9}`` give the same row; a class absent from one sample's map (ZipMap never drops
one, but a hand-made map may) has probability 0 there. The array is a `ClassProbabilities`, an
ndarray that remembers its column keys (``class_keys``) so test vectors can record them.

Imported only where a model runs (`onnx_run.run`, test vectors), so numpy is imported at the top.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

import numpy as np

from zoo.errors import InvalidInput

# onnxruntime spells the type "seq(map(int64,tensor(float)))"; keys int64 or string, values float or double
MAP_SEQUENCE = re.compile(r"^seq\(map\((int64|string),\s*tensor\((float|double)\)\)\)$")


def is_map_sequence(ort_type: str) -> bool:
    """Whether onnxruntime's type name is a sequence of class -> score maps (ZipMap's output)."""
    return bool(MAP_SEQUENCE.match(ort_type or ""))


def is_map_list(value: Any) -> bool:
    """Whether a session's output value is a list of maps (how onnxruntime returns a ZipMap's output)."""
    return isinstance(value, list) and all(isinstance(m, dict) for m in value)


class ClassProbabilities(np.ndarray):
    """A (samples, classes) float array whose columns are the classes ``class_keys``."""

    class_keys: tuple = ()

    def __array_finalize__(self, obj):
        self.class_keys = getattr(obj, "class_keys", ())

    def __reduce__(self):  # pickled (a Dask worker's result) with its keys
        rebuild, args, state = super().__reduce__()
        return rebuild, args, (state, self.class_keys)

    def __setstate__(self, state):
        base, self.class_keys = state
        super().__setstate__(base)


def class_probabilities(matrix: np.ndarray, keys: Sequence[Any]) -> ClassProbabilities:
    """`matrix` viewed as a `ClassProbabilities` with column keys `keys`."""
    out = matrix.view(ClassProbabilities)
    out.class_keys = tuple(keys)
    return out


def sorted_keys(maps: Sequence[dict]) -> list[Any]:
    """Every key of `maps`, sorted; InvalidInput when ints and strings are mixed (no order between them)."""
    keys = {k for m in maps for k in m}
    kinds = {type(_plain(k)) for k in keys}
    if len(kinds) > 1:
        raise InvalidInput(f"a map output mixes key types ({', '.join(sorted(t.__name__ for t in kinds))}); "
                           "its classes cannot be ordered", hint="a classifier's labels are all ints or all strings")
    return sorted(_plain(k) for k in keys)


def _plain(key: Any) -> Any:
    """A key as a plain int or str (numpy ints and bytes included)."""
    if isinstance(key, bytes):
        return key.decode("utf-8")
    if isinstance(key, str):
        return key
    try:
        return int(key)
    except (TypeError, ValueError):
        raise InvalidInput(f"a map output has the key {key!r}, neither an int nor a string") from None


def to_matrix(maps: Sequence[dict], keys: Sequence[Any] | None = None) -> np.ndarray:
    """``list[{class: score}]`` -> float32 (samples, classes), columns `keys` (default: every key,
    sorted). A class missing from a sample's map scores 0; a key not in `keys` is InvalidInput."""
    columns = list(keys) if keys is not None else sorted_keys(maps)
    index = {k: i for i, k in enumerate(columns)}
    matrix = np.zeros((len(maps), len(columns)), dtype=np.float32)
    for row, sample in enumerate(maps):
        for key, value in sample.items():
            col = index.get(_plain(key))
            if col is None:
                raise InvalidInput(f"sample {row} of a map output has class {key!r}, which is not among {columns}")
            matrix[row, col] = value
    return class_probabilities(matrix, columns)


def join(parts: Sequence[tuple[int, Any]]) -> np.ndarray | None:
    """One output from the batches of a run, ``(samples kept, value)`` each (a padded last batch
    keeps fewer than it fed): lists of maps are cut, concatenated and made one matrix (one key
    order for every batch); None when the output is not a sequence of maps."""
    if not parts or not all(is_map_list(value) for _, value in parts):
        return None
    return to_matrix([m for real, value in parts for m in value[:real]])


def to_maps(matrix: np.ndarray, keys: Sequence[Any]) -> list[dict]:
    """The inverse of `to_matrix`: one ``{class: score}`` per row (for a caller that wants ZipMap's form)."""
    return [{k: float(v) for k, v in zip(keys, row)} for row in matrix]
