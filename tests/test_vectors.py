"""Tests of zoo_stages.lib.release.vectors: test vectors in the ONNX Model Zoo layout."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from zoo.errors import InvalidInput
from zoo_stages.lib.onnx import onnx_io
from zoo_stages.lib.runtimes import onnx_run, ort_session
from zoo_stages.lib.release.vectors import (find_sets, read_tensors, read_test_vectors, vector_files,
                                    write_test_vectors)


def relu_model() -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node("Relu", ["input"], ["logits"])], "relu",
                              [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = onnx_io.MAX_IR_VERSION
    return model


def test_roundtrip_in_model_zoo_layout(tmp_path):
    model = relu_model()
    sess = ort_session.make_session(model)
    x = np.random.default_rng(3).random((2, 3), dtype=np.float32) - 0.5
    y = onnx_run.run(sess, {"input": x})["logits"]
    set_dir = write_test_vectors(tmp_path / "test_data_set_0", {"input": x}, {"logits": y})
    assert sorted(p.name for p in set_dir.iterdir()) == ["input_0.pb", "output_0.pb"]
    proto = onnx.TensorProto()
    proto.ParseFromString((set_dir / "input_0.pb").read_bytes())
    assert proto.name == "input"
    inputs, outputs = read_test_vectors(set_dir)
    assert list(inputs) == ["input"] and list(outputs) == ["logits"]
    np.testing.assert_array_equal(onnx_run.run(sess, inputs)["logits"], outputs["logits"])
    with pytest.raises(InvalidInput, match="no input_0.pb"):
        read_test_vectors(tmp_path)


def test_same_arrays_give_the_same_bytes(tmp_path):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    a = write_test_vectors(tmp_path / "a", {"x": x}, {"y": x * 2})
    b = write_test_vectors(tmp_path / "b", {"x": x.copy()}, {"y": x * 2})
    for name in ("input_0.pb", "output_0.pb"):
        assert (a / name).read_bytes() == (b / name).read_bytes()


def test_files_are_ordered_by_index_not_by_name(tmp_path):
    # 12 inputs: a name sort would put input_10 before input_2
    inputs = {f"in{k}": np.full((1,), k, dtype=np.int64) for k in range(12)}
    set_dir = write_test_vectors(tmp_path / "test_data_set_0", inputs, {"out": np.zeros(1, np.float32)})
    (set_dir / "notes.txt").write_text("not a vector")
    names = [p.name for p in vector_files(set_dir)]
    assert names[:3] == ["input_0.pb", "input_1.pb", "input_2.pb"] and names[-1] == "output_0.pb"
    assert "notes.txt" not in names
    assert [int(a[0]) for a in read_tensors(set_dir, "input")] == list(range(12))
    assert list(read_test_vectors(set_dir)[0]) == [f"in{k}" for k in range(12)]


def test_sets_are_found_in_order_and_corrupt_files_are_named(tmp_path):
    for i in (1, 0):
        write_test_vectors(tmp_path / f"test_data_set_{i}", {"x": np.zeros(2, np.float32)}, {})
    (tmp_path / "test_data_set_9.txt").write_text("a file, not a set")
    assert [p.name for p in find_sets(tmp_path)] == ["test_data_set_0", "test_data_set_1"]
    bad = tmp_path / "test_data_set_0" / "input_0.pb"
    bad.write_bytes(b"\xff\xff\xff not a protobuf")
    with pytest.raises(InvalidInput, match="input_0.pb"):
        read_tensors(tmp_path / "test_data_set_0", "input")
