"""zoo_stages/lib/quality/equivalence.py: equivalence of two builds of one stage's outputs (what the built-in
kinds answer to `StageKind.equivalence` for `zoo repro --check` across platform classes): ONNX
models (same graph structure, outputs on seeded inputs or test vectors, metadata ignored), test
vectors, .npy/.npz arrays, JSON numbers and quality metrics, files a kind marks as derived, and
files that hold no numbers. Real cross-class builds: tests/test_equivalence_cross_platform.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from onnx_models import linear_model
from zoo.engine import kind_loader
from zoo.stage import EquivalenceContext, RecipeInfo, StageKind
from zoo_stages.lib.quality.equivalence import compare_outputs
from zoo_stages.lib.quality.parity import Tolerance


CONTEXT = EquivalenceContext(recipe=RecipeInfo(name="r", version="1.0.0", description="", license="",
                                                    path=Path("r.yaml"), digest=""),
                             shared={}, matrix={})


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


def test_onnx_models_are_judged_by_their_outputs_and_metadata_is_not_compared(tmp_path):
    model = linear_model(seed=3)
    old = _save(_nudged(model, 0, key="a" * 64), tmp_path / "old" / "model.onnx")
    new = _save(_nudged(model, 1e-6, key="b" * 64), tmp_path / "new" / "model.onnx")
    assert old.read_bytes() != new.read_bytes()
    verdict = compare_outputs({"model": old}, {"model": new})
    assert verdict.equivalent, verdict.details
    assert len(verdict.details) == 1 and verdict.details[0].startswith(
        "model: equivalent outputs (same graph; 32 seeded inputs (seed 0)) within <= 0.0001 + 0.001*|ref|")
    far = _save(_nudged(model, 0.05), tmp_path / "far" / "model.onnx")
    verdict = compare_outputs({"model": old}, {"model": far})
    assert not verdict.equivalent and verdict.details[0].startswith("model: not equivalent: outputs"), verdict.details
    # a looser tolerance is the kind's to choose
    assert compare_outputs({"model": old}, {"model": far}, tolerance=Tolerance(atol=1.0, rtol=0.1)).equivalent


def test_onnx_outputs_are_compared_on_the_test_vectors_beside_the_model(tmp_path):
    from zoo_stages.lib.release.vectors import write_test_vectors

    model = linear_model(seed=3)
    x = np.random.default_rng(1).random((5, 1, 4, 4), dtype=np.float32)
    for side, by in (("old", 0.0), ("new", 1e-6)):
        _save(_nudged(model, by, key=side * 32), tmp_path / side / "model.onnx")
        write_test_vectors(tmp_path / side / "test_data_set_0", {"input": x}, {"logits": np.zeros((5, 3), "float32")})
    verdict = compare_outputs({"m": tmp_path / "old" / "model.onnx"}, {"m": tmp_path / "new" / "model.onnx"})
    assert verdict.equivalent and "(same graph; 1 test vector set(s), 5 samples)" in verdict.details[0], verdict.details


def test_weights_far_apart_with_the_same_outputs_are_equivalent(tmp_path):
    """What matters is what the model computes: weights that moved where they cannot change an
    output (a column multiplied by an always-zero input) leave the model equivalent."""
    model = linear_model(seed=3)
    other = onnx.ModelProto()
    other.CopyFrom(model)
    w = numpy_helper.to_array(other.graph.initializer[0]).copy()
    masking = onnx.helper.make_node("Mul", ["input", "mask"], ["masked"])
    mask = np.ones((1, 1, 4, 4), dtype="float32")
    mask[..., 0, 0] = 0
    for m in (model, other):
        m.graph.initializer.append(numpy_helper.from_array(mask, "mask"))
        m.graph.node.insert(0, masking)
        m.graph.node[1].input[0] = "masked"
    w[:, 0] += 0.5  # the weight of the masked pixel
    other.graph.initializer[0].CopyFrom(numpy_helper.from_array(w, "W"))
    old, new = _save(model, tmp_path / "a" / "m.onnx"), _save(other, tmp_path / "b" / "m.onnx")
    verdict = compare_outputs({"m": old}, {"m": new})
    assert verdict.equivalent, verdict.details


def test_onnx_graphs_that_differ_are_not_equivalent_whatever_the_weights(tmp_path):
    model = linear_model(seed=3)
    other = onnx.ModelProto()
    other.CopyFrom(model)
    other.graph.node[-1].op_type = "Sub" if other.graph.node[-1].op_type != "Sub" else "Add"
    old, new = _save(model, tmp_path / "a.onnx"), _save(other, tmp_path / "b.onnx")
    verdict = compare_outputs({"m": old}, {"m": new})
    assert not verdict.equivalent and "the graphs differ" in verdict.details[0]
    # a graph with another initializer shape is another structure too
    wider = linear_model(seed=3, features=25)
    verdict = compare_outputs({"m": old}, {"m": _save(wider, tmp_path / "c.onnx")})
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
    verdict = cls().equivalence({"o": tmp_path / "a.npy"}, {"o": tmp_path / "b.npy"}, None, CONTEXT)
    assert verdict.equivalent, verdict.details


def test_a_kind_that_says_nothing_is_judged_by_bytes_only():
    assert kind_loader.get("writer")().equivalence({}, {}, None, CONTEXT) is None
