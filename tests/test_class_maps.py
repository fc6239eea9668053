"""Sequence-of-maps outputs (ZipMap's ``list[{class: probability}]``) as per-class matrices:
the conversion (column order, missing classes, string labels), `onnx_run.run` over batches, and
test vectors that keep the class keys (schema-versioned doc_string)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from zoo.errors import InvalidInput
from zoo_stages.lib.quality import class_maps, tasks
from zoo_stages.lib.release import vectors


def test_columns_are_the_keys_sorted_whatever_order_the_maps_list_them():
    m = class_maps.to_matrix([{2: 0.7, 0: 0.1, 1: 0.2}, {1: 0.5, 2: 0.25, 0: 0.25}])
    assert m.class_keys == (0, 1, 2)
    assert m.dtype == np.float32 and m.shape == (2, 3)
    np.testing.assert_allclose(m, [[0.1, 0.2, 0.7], [0.25, 0.5, 0.25]])


def test_int_keys_sort_numerically_not_as_text():
    m = class_maps.to_matrix([{10: 0.5, 9: 0.25, 2: 0.25}])
    assert m.class_keys == (2, 9, 10)
    np.testing.assert_allclose(m, [[0.25, 0.25, 0.5]])


def test_a_class_missing_from_one_sample_scores_zero_there():
    m = class_maps.to_matrix([{0: 0.4, 1: 0.6}, {1: 0.3, 2: 0.7}])
    assert m.class_keys == (0, 1, 2)
    np.testing.assert_allclose(m, [[0.4, 0.6, 0.0], [0.0, 0.3, 0.7]])


def test_string_labels_sort_and_bytes_keys_read_as_text():
    m = class_maps.to_matrix([{"virginica": 0.1, "setosa": 0.8, b"versicolor": 0.1}])
    assert m.class_keys == ("setosa", "versicolor", "virginica")
    np.testing.assert_allclose(m, [[0.8, 0.1, 0.1]])
    assert class_maps.to_maps(m, m.class_keys) == [{"setosa": pytest.approx(0.8), "versicolor": pytest.approx(0.1),
                                                    "virginica": pytest.approx(0.1)}]


def test_given_keys_fix_the_columns_and_an_unknown_class_is_refused():
    m = class_maps.to_matrix([{1: 0.5}], keys=[0, 1, 2])
    np.testing.assert_allclose(m, [[0.0, 0.5, 0.0]])
    with pytest.raises(InvalidInput, match="class 3"):
        class_maps.to_matrix([{3: 1.0}], keys=[0, 1, 2])


def test_mixed_key_types_cannot_be_ordered():
    with pytest.raises(InvalidInput, match="mixes key types"):
        class_maps.to_matrix([{0: 0.5, "a": 0.5}])


def test_only_ort_map_sequences_of_float_scores_are_recognised():
    assert class_maps.is_map_sequence("seq(map(int64,tensor(float)))")
    assert class_maps.is_map_sequence("seq(map(string,tensor(float)))")
    assert not class_maps.is_map_sequence("tensor(float)")
    assert not class_maps.is_map_sequence("seq(tensor(float))")


def test_join_cuts_each_batch_to_its_real_samples_before_one_key_order():
    joined = class_maps.join([(2, [{0: 1.0}, {1: 1.0}]), (1, [{2: 1.0}, {2: 0.5}])])  # last batch padded
    assert joined.class_keys == (0, 1, 2) and joined.shape == (3, 3)
    np.testing.assert_allclose(joined, np.eye(3))
    assert class_maps.join([(1, np.zeros(2))]) is None


def _zipmap_model(labels, key: str) -> onnx.ModelProto:
    """Softmax then ZipMap, with the label ArgMax picks: a classifier's tail, as skl2onnx writes it."""
    nodes = [helper.make_node("Softmax", ["x"], ["p"], axis=1),
             helper.make_node("ZipMap", ["p"], ["probabilities"], domain="ai.onnx.ml", **{key: labels}),
             helper.make_node("ArgMax", ["p"], ["label"], axis=1, keepdims=0)]
    map_type = helper.make_map_type_proto(TensorProto.INT64 if key == "classlabels_int64s" else TensorProto.STRING,
                                          helper.make_tensor_type_proto(TensorProto.FLOAT, []))
    graph = helper.make_graph(nodes, "zipmap", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, len(labels)])],
                              [helper.make_tensor_value_info("label", TensorProto.INT64, [None]),
                               helper.make_value_info("probabilities", helper.make_sequence_type_proto(map_type))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 1)],
                             ir_version=8)


@pytest.mark.parametrize(("labels", "key"), [([5, 1, 3], "classlabels_int64s"),
                                             (["virginica", "setosa", "versicolor"], "classlabels_strings")])
def test_onnx_run_gives_onnxruntimes_maps_as_a_matrix_over_batches(labels, key):
    import onnxruntime as ort

    from zoo_stages.lib.runtimes import onnx_run

    session = ort.InferenceSession(_zipmap_model(labels, key).SerializeToString(), providers=["CPUExecutionProvider"])
    spec = {s.name: s for s in onnx_run.output_specs(session)}["probabilities"]
    key_type = "int64" if key == "classlabels_int64s" else "string"
    assert spec.dtype == f"seq(map({key_type},tensor(float)))"  # the port as onnxruntime names it...
    assert tasks.scores_output(onnx_run.output_specs(session)) == "probabilities"  # ...read as a classifier's scores
    x = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
    out = onnx_run.run(session, {"x": x}, batch_size=2)["probabilities"]
    softmax = np.exp(x) / np.exp(x).sum(axis=1, keepdims=True)
    order = np.argsort(labels)  # columns follow the labels sorted, not the ZipMap's attribute order
    assert out.class_keys == tuple(sorted(labels))
    np.testing.assert_allclose(out, softmax[:, order], rtol=1e-5)


def test_the_reference_evaluator_runs_zipmap_like_onnxruntime():
    import onnxruntime as ort

    from zoo_stages.lib.onnx.reference_run import ReferenceSession
    from zoo_stages.lib.runtimes import onnx_run

    model = _zipmap_model(["b", "a"], "classlabels_strings")
    x = np.random.default_rng(1).normal(size=(4, 2)).astype(np.float32)
    ours = onnx_run.run(ReferenceSession(model), {"x": x})["probabilities"]
    theirs = onnx_run.run(ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]),
                          {"x": x})["probabilities"]
    assert ours.class_keys == theirs.class_keys == ("a", "b")
    np.testing.assert_allclose(ours, theirs, rtol=1e-5)


def test_vectors_keep_the_class_keys_and_plain_tensors_stay_plain(tmp_path):
    probs = class_maps.to_matrix([{"b": 0.25, "a": 0.75}])
    set_dir = vectors.write_test_vectors(tmp_path / "test_data_set_0", {"x": np.ones((1, 2), np.float32)},
                                         {"label": np.array([0]), "probabilities": probs})
    described = json.loads(onnx.TensorProto.FromString((set_dir / "output_1.pb").read_bytes()).doc_string)
    assert described == {"zoo_vector": "class_matrix", "schema_version": 1, "class_keys": ["a", "b"]}
    assert onnx.TensorProto.FromString((set_dir / "output_0.pb").read_bytes()).doc_string == ""
    _, outputs = vectors.read_test_vectors(set_dir)
    assert outputs["probabilities"].class_keys == ("a", "b")
    np.testing.assert_allclose(outputs["probabilities"], [[0.75, 0.25]])
    assert not hasattr(outputs["label"], "class_keys")


def test_a_class_matrix_of_an_unknown_schema_version_is_refused(tmp_path):
    set_dir = vectors.write_test_vectors(tmp_path / "test_data_set_0", {"x": np.ones((1, 2), np.float32)},
                                         {"probabilities": class_maps.to_matrix([{0: 1.0}])})
    proto = onnx.TensorProto.FromString((set_dir / "output_0.pb").read_bytes())
    proto.doc_string = json.dumps({"zoo_vector": "class_matrix", "schema_version": 99, "class_keys": [0]})
    (set_dir / "output_0.pb").write_bytes(proto.SerializeToString())
    with pytest.raises(InvalidInput, match="schema_version 99"):
        vectors.read_tensors(set_dir, "output")
