"""zoo_stages/lib/equivalence.py: numerical equivalence of two builds of one stage's outputs (what the
built-in kinds answer to `StageKind.equivalence` for `zoo repro --check` across platform classes):
ONNX models (same graph, initializers within tolerance, metadata ignored), .npy/.npz arrays, JSON
numbers, files a kind marks as derived, and files that hold no numbers."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from onnx_models import linear_model
from zoo.engine import kind_loader
from zoo.stage import StageKind
from zoo_stages.lib.equivalence import compare_outputs
from zoo_stages.lib.parity import Tolerance


def _save(model: onnx.ModelProto, path):
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def _nudged(model: onnx.ModelProto, by: float, key: str = "") -> onnx.ModelProto:
    """The model with every float initializer moved by `by` (relative), and other provenance."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for i, t in enumerate(copy.graph.initializer):
        array = numpy_helper.to_array(t)
        if array.dtype.kind == "f":
            copy.graph.initializer[i].CopyFrom(numpy_helper.from_array((array * (1 + by)).astype(array.dtype), t.name))
    if key:
        onnx.helper.set_model_props(copy, {"zoo.key": key})
    return copy


def test_onnx_weights_within_tolerance_are_equivalent_and_metadata_is_not_compared(tmp_path):
    model = linear_model(seed=3)
    old = _save(_nudged(model, 0, key="a" * 64), tmp_path / "old" / "model.onnx")
    new = _save(_nudged(model, 1e-6, key="b" * 64), tmp_path / "new" / "model.onnx")
    assert old.read_bytes() != new.read_bytes()
    verdict = compare_outputs({"model": old}, {"model": new})
    assert verdict.equivalent, verdict.details
    assert len(verdict.details) == 1 and verdict.details[0].startswith("model: equivalent within <= 0.0001 + 0.001*|ref|")
    far = _save(_nudged(model, 0.05), tmp_path / "far" / "model.onnx")
    verdict = compare_outputs({"model": old}, {"model": far})
    assert not verdict.equivalent and "not equivalent:" in verdict.details[0]
    # a looser tolerance is the kind's to choose
    assert compare_outputs({"model": old}, {"model": far}, tolerance=Tolerance(atol=1.0, rtol=0.1)).equivalent


def test_onnx_graphs_that_differ_are_not_equivalent_whatever_the_weights(tmp_path):
    model = linear_model(seed=3)
    other = onnx.ModelProto()
    other.CopyFrom(model)
    other.graph.node[-1].op_type = "Sub" if other.graph.node[-1].op_type != "Sub" else "Add"
    old, new = _save(model, tmp_path / "a.onnx"), _save(other, tmp_path / "b.onnx")
    verdict = compare_outputs({"m": old}, {"m": new})
    assert not verdict.equivalent and "the graphs differ" in verdict.details[0]


def test_folders_npy_npz_and_json_derived_and_opaque_files(tmp_path):
    def build(root, scale, card, extra=None):
        root.mkdir()
        np.save(root / "values.npy", np.linspace(1, 2, 8, dtype="float32") * scale)
        np.savez(root / "more.npz", labels=np.arange(4), w=np.ones(3, dtype="float64") * scale)
        (root / "report.json").write_text(json.dumps({"accuracy": 0.9 * scale, "name": "x", "n": [1, 2]}))
        (root / "zoo.lock").write_text(card)
        if extra is not None:
            (root / "notes.txt").write_text(extra)
        return root

    old = build(tmp_path / "old", 1.0, "digest a", extra="same")
    new = build(tmp_path / "new", 1.0 + 1e-7, "digest b", extra="same")
    verdict = compare_outputs({"out": old}, {"out": new}, derived=("zoo.lock",))
    assert verdict.equivalent, verdict.details
    lines = dict(d.split(": ", 1) for d in verdict.details)
    assert lines["out/zoo.lock"] == "not compared (it records the other outputs' digests)"
    assert lines["out/values.npy"].startswith("equivalent") and lines["out/report.json"].startswith("equivalent")
    assert "out/notes.txt" not in lines  # identical bytes are not listed
    # without marking it derived, a differing non-numeric file fails
    assert not compare_outputs({"out": old}, {"out": new}).equivalent
    # a string that differs in JSON is not a rounding difference
    (new / "report.json").write_text(json.dumps({"accuracy": 0.9, "name": "y", "n": [1, 2]}))
    verdict = compare_outputs({"out": old}, {"out": new}, derived=("zoo.lock",))
    assert not verdict.equivalent and any("report.json: not equivalent: the structure differs" in d
                                          for d in verdict.details)
    # a file only on one side, or an output only on one side
    (new / "notes.txt").unlink()
    verdict = compare_outputs({"out": old, "gone": old}, {"out": new}, derived=("zoo.lock", "*.json"))
    assert not verdict.equivalent
    assert "out/notes.txt: only in the locked outputs" in verdict.details
    assert "output 'gone': only in the locked outputs" in verdict.details


def test_integer_arrays_are_exact(tmp_path):
    np.save(tmp_path / "a.npy", np.arange(5))
    np.save(tmp_path / "b.npy", np.arange(5) + np.array([0, 0, 0, 0, 1]))
    verdict = compare_outputs({"x": tmp_path / "a.npy"}, {"x": tmp_path / "b.npy"},
                              tolerance=Tolerance(atol=10, rtol=10))
    assert not verdict.equivalent


@pytest.mark.parametrize("kind", ["train", "export", "optimize", "quantize", "verify", "deploy"])
def test_every_built_in_kind_judges_equivalence(kind, tmp_path):
    cls = kind_loader.get(kind)
    assert cls.equivalence is not StageKind.equivalence
    np.save(tmp_path / "a.npy", np.ones(3, dtype="float32"))
    np.save(tmp_path / "b.npy", np.ones(3, dtype="float32") * (1 + 1e-6))
    verdict = cls().equivalence({"o": tmp_path / "a.npy"}, {"o": tmp_path / "b.npy"}, None)
    assert verdict.equivalent, verdict.details


def test_a_kind_that_says_nothing_is_judged_by_bytes_only():
    assert kind_loader.get("writer")().equivalence({}, {}, None) is None
