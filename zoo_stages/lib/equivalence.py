"""Numerical equivalence of two builds of one stage's outputs made on CPUs of different platform
classes (zoo/host.py): what the built-in kinds answer to `StageKind.equivalence`, for
`zoo repro --check` on a platform the lockfile has no records for.

Files are matched by path inside each output. Identical bytes pass. Otherwise the numbers in the
file are compared with the one parity rule (`zoo_stages.lib.parity`; floats within
``atol + rtol * |ref|``, integers, booleans and strings exact), by file type:

- ``.onnx``: the graph (nodes, attributes, inputs and outputs, opsets) must be the same, and every
  initializer is compared as a named array (metadata and doc strings are provenance, which names
  the other build's digests, so they are not compared);
- ``.npz`` / ``.npy``: the arrays; ``.safetensors``: the tensors; ``.pt`` / ``.pth``: a torch state
  dict loaded with ``weights_only=True``;
- ``.json``: numbers by the float rule, every other value exact;
- files a kind names in `derived` (records of the other outputs' digests: zoo.lock, provenance,
  cards) are listed as not compared; any other file whose bytes differ is not equivalent.

Training on other kernels moves weights by more than one rounding step, so the default tolerance
is that of a converted model (atol 1e-4, rtol 1e-3), not of a bit-exact rebuild.
"""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path
from typing import Any, Mapping

from zoo.stage import Equivalence
from zoo_stages.lib.parity import Tolerance

DEFAULT_TOLERANCE = Tolerance(atol=1e-4, rtol=1e-3)


class NumericOutputs:
    """Mixin for a kind whose outputs are judged file by file as above (the built-in kinds)."""

    equivalence_tolerance: Tolerance = DEFAULT_TOLERANCE
    derived_files: tuple[str, ...] = ()  # glob patterns (file names) of files not compared

    def equivalence(self, locked: Mapping[str, Path], rebuilt: Mapping[str, Path], config: Any) -> Equivalence:
        return compare_outputs(locked, rebuilt, tolerance=self.equivalence_tolerance, derived=self.derived_files)


def compare_outputs(locked: Mapping[str, Path], rebuilt: Mapping[str, Path], *,
                    tolerance: Tolerance = DEFAULT_TOLERANCE, derived: tuple[str, ...] = ()) -> Equivalence:
    """Whether `rebuilt` is numerically equivalent to `locked` ({output name: file or folder})."""
    details: list[str] = []
    ok = True
    for name in sorted(set(locked) | set(rebuilt)):
        if name not in locked or name not in rebuilt:
            details.append(f"output {name!r}: only in the {'rebuilt' if name in rebuilt else 'locked'} outputs")
            ok = False
            continue
        old, new = _files(Path(locked[name])), _files(Path(rebuilt[name]))
        for rel in sorted(set(old) | set(new)):
            label = f"{name}/{rel}" if rel else name
            if rel not in old or rel not in new:
                details.append(f"{label}: only in the {'rebuilt' if rel in new else 'locked'} outputs")
                ok = False
                continue
            if old[rel].read_bytes() == new[rel].read_bytes():
                continue
            if any(fnmatch.fnmatch(old[rel].name, pattern) for pattern in derived):
                details.append(f"{label}: not compared (it records the other outputs' digests)")
                continue
            passed, line = compare_file(old[rel], new[rel], tolerance)
            details.append(f"{label}: {line}")
            ok = ok and passed
    return Equivalence(equivalent=ok, details=tuple(details))


def compare_file(old: Path, new: Path, tolerance: Tolerance) -> tuple[bool, str]:
    """(equivalent, one line) for two versions of one file whose bytes differ."""
    suffix = old.suffix.lower()
    readers = {".onnx": _onnx, ".npz": _npz, ".npy": _npy, ".json": _json, ".safetensors": _safetensors,
               ".pt": _torch, ".pth": _torch}
    reader = readers.get(suffix)
    if reader is None:
        return False, "bytes differ and it holds no numbers this check reads"
    try:
        (old_arrays, old_shape), (new_arrays, new_shape) = reader(old), reader(new)
    except Exception as e:  # an unreadable file cannot be shown equivalent
        return False, f"cannot read it as {suffix}: {type(e).__name__}: {str(e)[:120]}"
    if old_shape != new_shape:
        return False, f"not equivalent: {_first_difference(old_shape, new_shape)}"
    if set(old_arrays) != set(new_arrays):
        only = sorted(set(old_arrays) ^ set(new_arrays))[:3]
        return False, f"not equivalent: arrays {only} are only in one of them"
    from zoo_stages.lib import parity

    report = parity.compare(old_arrays, new_arrays, tolerance=tolerance, samples=len(old_arrays))
    failing = [o.name for o in report.outputs if not o.passed]
    figures = f"max-abs {report.max_abs:.3g}, max-rel {report.max_rel:.3g} over {len(old_arrays)} arrays"
    if failing:
        return False, f"not equivalent: {', '.join(failing[:3])} outside {tolerance.describe(False)} ({figures})"
    return True, f"equivalent within {tolerance.describe(False)} ({figures})"


def _files(path: Path) -> dict[str, Path]:
    if path.is_dir():
        return {p.relative_to(path).as_posix(): p for p in sorted(path.rglob("*")) if p.is_file()}
    return {"": path}


def _onnx(path: Path) -> tuple[dict[str, Any], Any]:
    """(initializers by name, everything else that decides what the graph computes)."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path), load_external_data=True)
    arrays = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    del model.graph.initializer[:]
    del model.metadata_props[:]
    model.doc_string = model.graph.doc_string = ""
    model.producer_version = ""
    return arrays, model.SerializeToString()


def _npz(path: Path) -> tuple[dict[str, Any], Any]:
    import numpy as np

    with np.load(path, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}, None


def _npy(path: Path) -> tuple[dict[str, Any], Any]:
    import numpy as np

    return {"array": np.load(path, allow_pickle=False)}, None


def _safetensors(path: Path) -> tuple[dict[str, Any], Any]:
    from safetensors.numpy import load_file

    return dict(load_file(str(path))), None


def _torch(path: Path) -> tuple[dict[str, Any], Any]:
    import torch

    state = torch.load(str(path), map_location="cpu", weights_only=True)
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    arrays, rest = {}, {}
    for k, v in (state.items() if isinstance(state, dict) else [("value", state)]):
        if isinstance(v, torch.Tensor):
            arrays[str(k)] = v.detach().float().numpy() if v.is_floating_point() else v.numpy()
        else:
            rest[str(k)] = repr(v)
    return arrays, rest


def _json(path: Path) -> tuple[dict[str, Any], Any]:
    """(every number by its JSON path, the document with numbers blanked out)."""
    import numpy as np

    numbers: dict[str, Any] = {}

    def walk(value: Any, where: str) -> Any:
        if isinstance(value, bool) or value is None or isinstance(value, str):
            return value
        if isinstance(value, (int, float)):
            numbers[where] = np.asarray(float(value))
            return "#"
        if isinstance(value, list):
            return [walk(v, f"{where}[{i}]") for i, v in enumerate(value)]
        return {k: walk(v, f"{where}.{k}" if where else k) for k, v in sorted(value.items())}

    shape = walk(json.loads(path.read_text(encoding="utf-8")), "")
    return numbers, shape


def _first_difference(a: Any, b: Any) -> str:
    if isinstance(a, bytes) and isinstance(b, bytes):
        return "the graphs differ (nodes, attributes, inputs or outputs), not only their weights"
    return "the structure differs (keys, strings or non-numeric values), not only the numbers"
