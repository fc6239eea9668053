"""`zoo_stages.lib.onnx.graph_order.sort_graph`: an ONNX graph put in topological order, as onnx.checker
requires, with nothing else changed; an already sorted graph keeps its bytes; subgraphs (If) are
sorted and ordered after the values they read from the enclosing graph; a cycle or a name nothing
provides is refused by name."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

from zoo_stages.lib.onnx.graph_order import CycleError, sort_graph


def _model(nodes, inputs=("x",), outputs=("y",)) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in inputs],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in outputs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def _checks(model: onnx.ModelProto) -> bool:
    try:
        onnx.checker.check_model(model, full_check=True)
        return True
    except onnx.checker.ValidationError:
        return False


def test_an_input_cast_appended_last_is_moved_first_and_the_graph_becomes_valid():
    # as onnxruntime's float16 converter leaves it: the nodes that read the cast come first
    nodes = [helper.make_node("Relu", ["x_cast"], ["r"], name="relu"),
             helper.make_node("Neg", ["r"], ["y"], name="neg"),
             helper.make_node("Identity", ["x"], ["x_cast"], name="cast_in")]
    model = _model(nodes)
    assert not _checks(model)
    assert sort_graph(model.graph) is True
    assert [n.name for n in model.graph.node] == ["cast_in", "relu", "neg"]
    assert _checks(model)


def test_a_sorted_graph_keeps_its_order_and_bytes():
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="a"), helper.make_node("Neg", ["x"], ["b"], name="b"),
             helper.make_node("Add", ["a", "b"], ["y"], name="add")]
    model = _model(nodes)
    before = model.SerializeToString(deterministic=True)
    assert sort_graph(model.graph) is False
    assert model.SerializeToString(deterministic=True) == before


def test_among_ready_nodes_the_earliest_goes_first():
    nodes = [helper.make_node("Add", ["a", "b"], ["y"], name="add"), helper.make_node("Neg", ["x"], ["b"], name="b"),
             helper.make_node("Relu", ["x"], ["a"], name="a")]
    model = _model(nodes)
    sort_graph(model.graph)
    assert [n.name for n in model.graph.node] == ["b", "a", "add"]


def test_an_if_whose_branch_reads_an_outer_value_goes_after_its_producer():
    branch = helper.make_graph([helper.make_node("Identity", ["late"], ["out"], name="inner")], "then", [],
                               [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2])])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["out2"], name="inner2")], "else", [],
                              [helper.make_tensor_value_info("out2", TensorProto.FLOAT, [2])])
    nodes = [helper.make_node("If", ["c"], ["y"], name="if", then_branch=branch, else_branch=other),
             helper.make_node("Relu", ["x"], ["late"], name="late"),
             helper.make_node("Constant", [], ["c"], name="cond",
                              value=helper.make_tensor("c", TensorProto.BOOL, [], [True]))]
    model = _model(nodes)
    sort_graph(model.graph)
    assert [n.name for n in model.graph.node] == ["late", "cond", "if"]
    assert _checks(model)


@pytest.mark.parametrize("case", ["cycle", "unknown"])
def test_a_graph_that_cannot_be_ordered_is_refused_by_name(case):
    if case == "cycle":
        nodes = [helper.make_node("Relu", ["b"], ["a"], name="n1"), helper.make_node("Relu", ["a"], ["b"], name="n2"),
                 helper.make_node("Identity", ["x"], ["y"], name="ok")]
        match = "node n1 .* is on a cycle"
    else:
        nodes = [helper.make_node("Add", ["x", "ghost"], ["y"], name="add")]
        match = "node add .* reads 'ghost', which no node, input or initializer"
    with pytest.raises(CycleError, match=match):
        sort_graph(_model(nodes).graph)
