"""Tests of zoo_stages.lib.quality.parity: one comparison of named outputs, with rules by element type."""

from __future__ import annotations

import json

import numpy as np
import pytest

from onnx_models import multi_io_feeds, multi_io_model
from zoo.errors import GateFailed, InvalidInput
from zoo_stages.lib.runtimes import onnx_run, ort_session
from zoo_stages.lib.quality.parity import Tolerance, compare

LOOSE = Tolerance(atol=1e-4, rtol=1e-3)


def test_an_integer_label_one_class_off_fails_where_a_float_rule_would_let_it_pass():
    ref = np.array([1000, 5, 7], dtype=np.int64)
    got = np.array([1001, 5, 7], dtype=np.int64)
    # the same numbers as floats are within atol + rtol*|ref| (1 <= 1e-4 + 1e-3 * 1000)
    as_floats = compare({"label": ref.astype(np.float64)}, {"label": got.astype(np.float64)}, tolerance=LOOSE)
    assert as_floats.passed and as_floats.max_abs == 1.0
    report = compare({"label": ref}, {"label": got}, tolerance=LOOSE)
    label = report.output("label")
    assert not report.passed and label.exact
    assert (label.violations, label.elements, label.mismatch_fraction) == (1, 3, pytest.approx(1 / 3))
    assert label.max_abs is None  # no float figures for an exact output
    assert "exact" in report.table() and "1/3" in report.table()


def test_boolean_and_string_outputs_are_exact_too():
    mask = np.array([True, False, True])
    assert compare({"m": mask}, {"m": mask.copy()}).passed
    assert not compare({"m": mask}, {"m": ~mask}).passed
    words = np.array(["cat", "dog"], dtype=object)
    assert compare({"w": words}, {"w": np.array(["cat", "dog"], dtype=object)}).passed
    assert not compare({"w": words}, {"w": np.array(["cat", "cow"], dtype=object)}).passed


def test_an_exact_output_may_allow_a_share_of_mismatches():
    ref = np.arange(10, dtype=np.int64)
    got = ref.copy()
    got[:2] += 1
    assert not compare({"ids": ref}, {"ids": got}, tolerance=Tolerance(mismatch=0.1)).passed
    assert compare({"ids": ref}, {"ids": got}, tolerance=Tolerance(mismatch=0.2)).passed


def test_float_figures_on_known_values():
    ref = np.array([[1.0, 0.0], [0.0, 2.0], [3.0, 4.0]])
    got = np.array([[1.0, 0.0], [0.0, 2.5], [4.0, 3.0]])
    o = compare({"y": ref}, {"y": got}, tolerance=Tolerance(atol=0.6)).output("y")
    assert o.max_abs == pytest.approx(1.0)
    assert o.max_rel == pytest.approx(1 / 3)  # |3 - 4| / |3|; the zeros of ref are left out
    assert o.mean_abs == pytest.approx(2.5 / 6)
    assert o.top1_agreement == pytest.approx(2 / 3)
    assert o.cosine_min == pytest.approx(24 / 25)
    assert o.cosine == pytest.approx((1 + 1 + 24 / 25) / 3)
    assert o.violations == 2  # the two elements off by 1.0 > 0.6


def test_atol_and_rtol_bound_each_element():
    ref, got = np.array([1.0, 2.0]), np.array([1.0, 2.2])
    assert not compare({"y": ref}, {"y": got}, tolerance=Tolerance(atol=0.1)).passed
    assert compare({"y": ref}, {"y": got}, tolerance=Tolerance(rtol=0.11)).passed
    assert compare({"y": ref}, {"y": got}, tolerance=Tolerance(atol=0.21)).passed


def test_per_output_tolerances_override_the_default():
    ref = {"probs": np.array([[0.2, 0.8]], np.float32), "logits": np.array([[1.0, 3.0]], np.float32)}
    got = {"probs": np.array([[0.2, 0.8]], np.float32), "logits": np.array([[1.05, 3.0]], np.float32)}
    strict = compare(ref, got, tolerance=LOOSE)
    assert not strict.passed and strict.output("probs").passed and not strict.output("logits").passed
    relaxed = compare(ref, got, tolerance=LOOSE, overrides={"logits": Tolerance(atol=0.1)})
    assert relaxed.passed and relaxed.output("logits").tolerance.atol == 0.1
    assert relaxed.output("probs").tolerance == LOOSE
    with pytest.raises(InvalidInput, match="nope"):
        compare(ref, got, overrides={"nope": Tolerance()})


def test_a_float16_candidate_is_compared_with_a_float32_reference():
    ref = np.array([[0.1, 0.2, 0.7]], np.float32)
    got = ref.astype(np.float16)
    report = compare({"p": ref}, {"p": got}, tolerance=Tolerance(atol=1e-3))
    assert report.passed and 0 < report.max_abs < 1e-3
    assert not compare({"p": ref}, {"p": got}, tolerance=Tolerance(atol=1e-6)).passed


def test_missing_outputs_other_shapes_element_kinds_and_nan_fail_with_a_note():
    ref = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    missing = compare({"y": ref, "z": ref}, {"y": ref})
    assert not missing.passed and missing.output("z").note == "missing" and missing.output("y").passed
    shape = compare({"y": ref}, {"y": ref[:1]})
    assert not shape.passed and "shape [1, 2]" in shape.table() and shape.max_abs == float("inf")
    kind = compare({"y": ref}, {"y": ref.astype(np.int64)})
    assert not kind.passed and kind.output("y").note == "element type int64"
    nan = ref.copy()
    nan[0, 0] = np.nan
    report = compare({"y": ref}, {"y": nan}, tolerance=Tolerance(atol=1.0, rtol=1.0))
    assert not report.passed and report.max_abs == float("inf")
    assert np.isnan(report.output("y").cosine_min)  # a non-finite sample has no similarity
    assert report.output("y").cosine_min != report.output("y").cosine_min


def test_the_report_prints_stores_and_gates():
    ref = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    far = ref.copy()
    far[1, 0] = np.nan
    report = compare({"y": ref, "label": np.array([0, 1])}, {"y": far, "label": np.array([0, 1])},
                     tolerance=Tolerance(atol=1e-2))
    table = report.table()
    assert "y" in table and "violations" in table and "max_abs" in table and "FAIL" in table and "PASS" in table
    stored = report.to_json()
    json.dumps(stored, allow_nan=False)  # non-finite figures are stored as null
    assert stored["passed"] is False and stored["samples"] == 2 and stored["atol"] == 1e-2
    assert stored["outputs"]["y"]["max_abs"] is None and stored["outputs"]["y"]["violations"] == 1
    assert stored["outputs"]["label"] == {"dtype": "int64", "shape": [2], "passed": True, "exact": True,
                                          "mismatches": 0, "elements": 2, "mismatch_fraction": 0.0, "tolerance": 0.0}
    figures = report.metrics()
    assert figures["parity_atol"] == 1e-2 and figures["parity_samples"] == 2
    assert figures["parity_max_abs"] == float("inf") and "parity_top1_agreement" in figures
    with pytest.raises(GateFailed, match="builds differ") as err:
        report.require("builds differ", hint="look")
    assert err.value.table == table and err.value.hint == "look"
    compare({"y": ref}, {"y": ref}).require("never raised")


def test_parity_of_two_runs_of_a_multi_output_model():
    """The runner's outputs go straight into the comparison: float32, float16, int64 and a scalar."""
    session = ort_session.make_session(multi_io_model())
    feeds = multi_io_feeds(8)
    a = onnx_run.run(session, feeds)
    b = onnx_run.run(session, feeds, batch_size=3, outputs=["probs", "scores16", "label"])
    b["total"] = a["total"]
    report = compare(a, b, tolerance=Tolerance(atol=1e-6))
    assert report.passed and report.samples == 8
    assert [o.exact for o in report.outputs] == [False, False, True, False]
    other = onnx_run.run(ort_session.make_session(multi_io_model(seed=1)), feeds)
    assert not compare(a, other, tolerance=Tolerance(atol=1e-6)).output("label").passed
