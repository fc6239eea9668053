"""The wire-level ONNX walker that finds external-data locations without loading weights."""

from __future__ import annotations

import pytest

from zoo.errors import InvalidInput
from zoo import onnxwire
from zoo.onnxwire import ScanError, external_locations
from zoo.pathsafety import external_data_locations
from registry_servers import tiny_onnx


def _external(tensor, location: str):
    from onnx import TensorProto

    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    e = tensor.external_data.add()
    e.key, e.value = "location", location
    return tensor


def _model_everywhere():
    """A model with external tensors in every place a tensor can live."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    w = _external(numpy_helper.from_array(np.ones(4, np.float32), "w"), "init.bin")
    const = helper.make_node("Constant", [], ["c"], value=_external(numpy_helper.from_array(np.ones(4, np.float32), "c"), "attr.bin"))
    branch_init = _external(numpy_helper.from_array(np.ones(4, np.float32), "b"), "sub/graph.bin")
    branch = helper.make_graph([helper.make_node("Identity", ["b"], ["o"])], "then", [],
                               [helper.make_tensor_value_info("o", TensorProto.FLOAT, [4])], [branch_init])
    cond = helper.make_node("If", ["flag"], ["y"], then_branch=branch, else_branch=branch)
    values = _external(numpy_helper.from_array(np.ones(2, np.float32), "sv"), "sparse.bin")
    sparse = helper.make_sparse_tensor(values, numpy_helper.from_array(np.array([0, 2], np.int64), "si"), [4])
    fconst = helper.make_node("Constant", [], ["fc"], value=_external(numpy_helper.from_array(np.ones(1, np.float32), "fc"), "func.bin"))
    func = helper.make_function("local", "F", [], ["fc"], [fconst], [helper.make_opsetid("", 17)])
    graph = helper.make_graph([const, cond], "g", [helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], [w], sparse_initializer=[sparse])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local", 1)],
                              functions=[func])
    model.ir_version = 13
    return model


def test_field_numbers_match_onnx_proto():
    import onnx

    def num(msg, field):
        return msg.DESCRIPTOR.fields_by_name[field].number

    assert {num(onnx.ModelProto, f) for f in ("graph", "training_info", "functions")} == set(onnxwire.CHILDREN[onnxwire.MODEL])
    assert {num(onnx.GraphProto, f) for f in ("node", "initializer", "sparse_initializer")} == set(onnxwire.CHILDREN[onnxwire.GRAPH])
    assert num(onnx.NodeProto, "attribute") in onnxwire.CHILDREN[onnxwire.NODE]
    assert {num(onnx.AttributeProto, f) for f in ("t", "g", "tensors", "graphs", "sparse_tensor", "sparse_tensors")} == \
        set(onnxwire.CHILDREN[onnxwire.ATTRIBUTE])
    assert {num(onnx.SparseTensorProto, f) for f in ("values", "indices")} == set(onnxwire.CHILDREN[onnxwire.SPARSE])
    assert {num(onnx.FunctionProto, f) for f in ("node", "attribute_proto")} == set(onnxwire.CHILDREN[onnxwire.FUNCTION])
    assert {num(onnx.TrainingInfoProto, f) for f in ("initialization", "algorithm")} == set(onnxwire.CHILDREN[onnxwire.TRAINING])
    assert (num(onnx.TensorProto, "name"), num(onnx.TensorProto, "external_data"), num(onnx.TensorProto, "data_location")) == \
        (onnxwire.TENSOR_NAME, onnxwire.TENSOR_EXTERNAL_DATA, onnxwire.TENSOR_DATA_LOCATION)
    assert onnx.TensorProto.EXTERNAL == onnxwire.EXTERNAL
    assert (num(onnx.StringStringEntryProto, "key"), num(onnx.StringStringEntryProto, "value")) == \
        (onnxwire.ENTRY_KEY, onnxwire.ENTRY_VALUE)


def test_finds_external_data_everywhere_and_agrees_with_onnx(tmp_path):
    from onnx.external_data_helper import ExternalDataInfo, _get_all_tensors

    model = _model_everywhere()
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    found = external_locations(path)
    assert found == ["attr.bin", "func.bin", "init.bin", "sparse.bin", "sub/graph.bin"]
    onnx_view = {ExternalDataInfo(t).location for t in _get_all_tensors(model) if t.data_location == 1}
    assert onnx_view <= set(found)  # the walker sees at least what onnx's helper sees


def test_no_external_data_and_large_weights(tmp_path):
    path = tiny_onnx(tmp_path / "big.onnx", big_bytes=4_000_000)
    assert external_locations(path) == []


@pytest.mark.parametrize("data", [b"", b"\xff\xff\xff", b"\x3a\x10abc", b"\x0b\x00"])
def test_malformed_files_are_invalid_input(tmp_path, data):
    path = tmp_path / "bad.onnx"
    path.write_bytes(data)
    with pytest.raises(InvalidInput, match="not a valid ONNX file"):
        external_data_locations(path)
    with pytest.raises(ScanError):
        external_locations(path)


