"""Tests of zoo_stages.lib.runtimes.onnx_run: named feeds in, named outputs out, in batches."""

from __future__ import annotations

import numpy as np
import pytest

from onnx_models import (CLASSES, TOKENS, linear_model, multi_io_feeds, multi_io_model, multi_io_reference,
                         numpy_logits, reshape_model)
from zoo.errors import InvalidInput, StageFailed
from zoo_stages.lib.runtimes import onnx_run, ort_session


@pytest.fixture(scope="module")
def multi():
    return ort_session.make_session(multi_io_model())


def test_specs_name_every_port_with_its_numpy_type_and_shape(multi):
    assert [(s.name, s.dtype, s.shape) for s in onnx_run.input_specs(multi)] == [
        ("ids", "int64", ("N", TOKENS)), ("types", "int64", ("N", TOKENS)), ("mask", "bool", ("N", TOKENS))]
    assert [(s.name, s.dtype) for s in onnx_run.output_specs(multi)] == [
        ("probs", "float32"), ("scores16", "float16"), ("label", "int64"), ("total", "float32")]
    assert onnx_run.fixed_batch(multi) is None
    with pytest.raises(InvalidInput, match="3 inputs.*single-input"):
        onnx_run.single_input(multi)


def test_run_feeds_every_named_input_and_returns_every_named_output(multi):
    model = multi_io_model()
    feeds = multi_io_feeds(6)
    out = onnx_run.run(multi, feeds)
    assert list(out) == ["probs", "scores16", "label", "total"]
    assert [out[k].dtype for k in out] == [np.float32, np.float16, np.int64, np.float32]
    expected = multi_io_reference(model, feeds)
    np.testing.assert_allclose(out["probs"], expected["probs"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["scores16"].astype(np.float32), expected["scores16"].astype(np.float32),
                               rtol=1e-3)
    np.testing.assert_array_equal(out["label"], expected["label"])
    assert out["probs"].shape == (6, CLASSES) and out["label"].shape == (6,)
    # only the outputs asked for, in that order
    assert list(onnx_run.run(multi, feeds, outputs=["label", "probs"])) == ["label", "probs"]


@pytest.mark.parametrize("batch_size", [1, 3, 4, 100])
def test_batched_runs_equal_one_run(multi, batch_size):
    feeds = multi_io_feeds(10)
    whole = onnx_run.run(multi, feeds, outputs=["probs", "scores16", "label"])
    batched = onnx_run.run(multi, feeds, batch_size=batch_size, outputs=["probs", "scores16", "label"])
    np.testing.assert_array_equal(batched["label"], whole["label"])
    np.testing.assert_allclose(batched["probs"], whole["probs"], rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(batched["scores16"], whole["scores16"])


def test_a_fixed_batch_is_fed_whole_batches_padding_the_last_and_dropping_its_padded_outputs():
    model = multi_io_model(batch=4)
    fixed = ort_session.make_session(model)
    assert onnx_run.fixed_batch(fixed) == 4
    feeds = multi_io_feeds(10)
    out = onnx_run.run(fixed, feeds, batch_size=3, outputs=["probs", "label"])  # the model's 4 wins over 3
    assert out["probs"].shape == (10, CLASSES)
    expected = multi_io_reference(model, feeds)
    np.testing.assert_array_equal(out["label"], expected["label"])
    np.testing.assert_allclose(out["probs"], expected["probs"], rtol=1e-5, atol=1e-6)
    # fewer samples than one batch: padded too
    assert onnx_run.run(fixed, multi_io_feeds(2), outputs=["label"])["label"].shape == (2,)


def test_an_output_without_a_batch_axis_comes_from_one_run_only(multi):
    feeds = multi_io_feeds(6)
    total = onnx_run.run(multi, feeds)["total"]
    assert total.shape == () and np.isclose(total, multi_io_reference(multi_io_model(), feeds)["total"], rtol=1e-5)
    with pytest.raises(InvalidInput, match="'total' has no batch axis"):
        onnx_run.run(multi, feeds, batch_size=4)


def test_feeds_are_cast_within_their_kind_and_refused_across_kinds(multi):
    feeds = multi_io_feeds(3)
    narrow = {**feeds, "ids": feeds["ids"].astype(np.int32), "types": feeds["types"].astype(np.int32)}
    np.testing.assert_array_equal(onnx_run.run(multi, narrow)["label"], onnx_run.run(multi, feeds)["label"])
    with pytest.raises(InvalidInput, match="the inputs: float64 values for model input 'ids', which takes int64"):
        onnx_run.run(multi, {**feeds, "ids": feeds["ids"].astype(np.float64)})
    linear = ort_session.make_session(linear_model())
    x = np.random.default_rng(0).random((2, 1, 4, 4))  # float64 into a float32 input: the same kind
    np.testing.assert_allclose(onnx_run.run(linear, {"input": x})["logits"], numpy_logits(linear_model(), x),
                               rtol=1e-5, atol=1e-5)


def test_prepare_names_what_is_wrong_with_the_feeds(multi):
    feeds = multi_io_feeds(3)
    with pytest.raises(InvalidInput, match="no values for model input.*mask"):
        onnx_run.prepare(multi, {"ids": feeds["ids"], "types": feeds["types"]})
    with pytest.raises(InvalidInput, match="extra.*does not take"):
        onnx_run.prepare(multi, {**feeds, "extra": feeds["ids"]})
    with pytest.raises(InvalidInput, match="different numbers of samples.*ids: 3.*mask: 2"):
        onnx_run.prepare(multi, {**feeds, "mask": feeds["mask"][:2]})
    linear = ort_session.make_session(linear_model())
    with pytest.raises(InvalidInput, match="the held-out split: samples of shape 3x8x8.*'input' expects 1x4x4"):
        onnx_run.prepare(linear, {"input": np.zeros((2, 3, 8, 8), np.float32)}, where="the held-out split")
    with pytest.raises(InvalidInput, match="no samples"):
        onnx_run.run(linear, {"input": np.zeros((0, 1, 4, 4), np.float32)})


def test_a_failure_inside_onnxruntime_is_a_stage_failure():
    session = ort_session.make_session(reshape_model())
    assert onnx_run.run(session, {"x": np.ones((3, 4), np.float32)})["y"].shape == (4, 3)
    with pytest.raises(StageFailed, match="onnxruntime failed running the model"):
        onnx_run.run(session, {"x": np.ones((1, 4), np.float32)})


def test_random_feeds_are_fixed_by_seed_and_typed_per_input(multi):
    linear = ort_session.make_session(linear_model())
    a = onnx_run.random_feeds(linear, 3, seed=7)
    b = onnx_run.random_feeds(linear, 3, seed=7)
    assert a["input"].shape == (3, 1, 4, 4) and a["input"].dtype == np.float32
    np.testing.assert_array_equal(a["input"], b["input"])
    # the draws of one generator seeded with `seed`, in input order: the inputs every kind made before
    np.testing.assert_array_equal(a["input"], np.random.default_rng(7).random((3, 1, 4, 4), dtype=np.float32))
    assert not np.array_equal(a["input"], onnx_run.random_feeds(linear, 3, seed=8)["input"])
    assert ((0 <= a["input"]) & (a["input"] < 1)).all()
    feeds = onnx_run.random_feeds(multi, 2, seed=0)
    assert feeds["ids"].dtype == np.int64 and set(np.unique(feeds["ids"])) == {0, 1}
    assert feeds["mask"].dtype == bool and feeds["mask"].all()
    assert onnx_run.run(multi, feeds)["label"].shape == (2,)


def test_random_feeds_refuse_dynamic_dims_unless_given_a_shape():
    model = linear_model()
    model.graph.input[0].type.tensor_type.shape.dim[2].dim_param = "H"
    session = ort_session.make_session(model)
    with pytest.raises(InvalidInput, match="dynamic dimensions") as err:
        onnx_run.random_feeds(session, 1, seed=0)
    assert "input_shape" in err.value.hint
    with pytest.raises(InvalidInput, match="dynamic dimensions") as err:
        onnx_run.random_feeds(session, 1, seed=0, hint="add a data section")
    assert err.value.hint == "add a data section"
    assert onnx_run.random_feeds(session, 2, seed=0, shapes={"input": [1, 4, 4]})["input"].shape == (2, 1, 4, 4)


def test_bind_takes_each_input_by_name_and_leaves_extra_features_out(multi):
    feeds = multi_io_feeds(4)
    bound = onnx_run.bind(multi, {**feeds, "unused": np.zeros(4)})
    assert list(bound) == ["ids", "types", "mask"]
    assert all(bound[k] is feeds[k] for k in bound)


def test_bind_feeds_a_single_input_model_the_only_feature_whatever_its_name():
    session = ort_session.make_session(linear_model())
    x = np.zeros((2, 16), np.float32)
    bound = onnx_run.bind(session, {"image": x})
    assert list(bound) == ["input"] and bound["input"] is x


def test_bind_names_the_inputs_the_data_lacks(multi):
    feeds = multi_io_feeds(4)
    with pytest.raises(InvalidInput, match="the held-out split has no values for model input\\(s\\) mask") as e:
        onnx_run.bind(multi, {"ids": feeds["ids"], "types": feeds["types"]}, where="the held-out split")
    assert "ids, types, mask" in e.value.hint


def test_declared_shapes_fill_dynamic_dims_and_refuse_inputs_the_model_lacks(multi):
    declared = {"ids": {"shape": ["batch", "sequence"], "dtype": "int64"}, "mask": {"shape": ["batch", 5]}}
    assert onnx_run.declared_shapes(multi, declared, sequence=7) == {"ids": [7], "mask": [5]}
    assert onnx_run.declared_shapes(multi, None) == {}
    with pytest.raises(InvalidInput, match="'pixels', which the model does not take"):
        onnx_run.declared_shapes(multi, {"pixels": {"shape": ["batch", 3]}})
    with pytest.raises(InvalidInput, match="model.inputs.ids.shape has 3 dimensions"):
        onnx_run.declared_shapes(multi, {"ids": {"shape": ["batch", 2, 2]}})
