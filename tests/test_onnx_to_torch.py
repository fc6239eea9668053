"""zoo.onnx_to_torch: ONNX graphs rebuilt as torch modules compute what onnxruntime computes,
train, and name an unsupported op with its node. (Needs the torch extra.)"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

torch = pytest.importorskip("torch")

from zoo.errors import InvalidInput  # noqa: E402
from zoo.onnx_to_torch import convert, replace_head  # noqa: E402

RNG = np.random.default_rng(0)


def _w(*shape, scale=0.3):
    return RNG.normal(0, scale, shape).astype(np.float32)


def _model(nodes, inputs, outputs, inits, opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _vi(name, shape, t=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, t, shape)


def cnn():
    """Conv (uneven pads) + BatchNormalization + Relu + MaxPool + AveragePool + GlobalAveragePool + Gemm + Softmax."""
    return _model([
        helper.make_node("Conv", ["x", "conv.weight", "conv.bias"], ["c"], pads=[1, 1, 2, 2], strides=[1, 1]),
        helper.make_node("BatchNormalization", ["c", "bn.weight", "bn.bias", "bn.mean", "bn.var"], ["b"], epsilon=1e-3),
        helper.make_node("Relu", ["b"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["m"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("AveragePool", ["m"], ["a"], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1]),
        helper.make_node("GlobalAveragePool", ["a"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"], axis=1),
        helper.make_node("Gemm", ["f", "fc.weight", "fc.bias"], ["l"], transB=1, alpha=0.5, beta=2.0),
        helper.make_node("Softmax", ["l"], ["y"], axis=1),
    ], [_vi("x", ["N", 3, 9, 9])], [_vi("y", ["N", 5])], {
        "conv.weight": _w(4, 3, 3, 3), "conv.bias": _w(4), "bn.weight": 1 + _w(4), "bn.bias": _w(4),
        "bn.mean": _w(4), "bn.var": 1 + np.abs(_w(4)), "fc.weight": _w(5, 4), "fc.bias": _w(5)})


def transformer_block():
    """LayerNormalization, MatMul + Add, Gelu written out with Erf, Transpose, Reshape, Concat, Unsqueeze,
    ReduceMean, Dropout, Sub, Div, Sqrt, Tanh, Sigmoid."""
    return _model([
        helper.make_node("LayerNormalization", ["x", "ln.weight", "ln.bias"], ["n"], axis=-1, epsilon=1e-5),
        helper.make_node("MatMul", ["n", "proj.weight"], ["p"]),
        helper.make_node("Add", ["p", "proj.bias"], ["pb"]),
        # gelu(x) = 0.5 x (1 + erf(x / sqrt 2)), as the TorchScript exporter writes it
        helper.make_node("Div", ["pb", "sqrt2"], ["d"]),
        helper.make_node("Erf", ["d"], ["e"]),
        helper.make_node("Add", ["e", "one"], ["e1"]),
        helper.make_node("Mul", ["pb", "e1"], ["m"]),
        helper.make_node("Mul", ["m", "half"], ["gelu"]),
        helper.make_node("Dropout", ["gelu"], ["dr"]),
        helper.make_node("Transpose", ["dr"], ["t"], perm=[0, 2, 1]),
        helper.make_node("Reshape", ["t", "shape"], ["rs"]),
        helper.make_node("ReduceMean", ["x"], ["mean"], axes=[2], keepdims=0),
        helper.make_node("Tanh", ["mean"], ["th"]),
        helper.make_node("Sigmoid", ["th"], ["sg"]),
        helper.make_node("Concat", ["rs", "sg"], ["y"], axis=1),
        helper.make_node("Unsqueeze", ["y", "axes"], ["y1"]),
        helper.make_node("Squeeze", ["y1", "axes"], ["out"]),
    ], [_vi("x", ["N", 3, 8])], [_vi("out", ["N", 21])], {
        "ln.weight": 1 + _w(8), "ln.bias": _w(8), "proj.weight": _w(8, 6), "proj.bias": _w(6),
        "sqrt2": np.array(np.sqrt(2), np.float32), "one": np.array(1, np.float32), "half": np.array(0.5, np.float32),
        "shape": np.array([0, -1], np.int64), "axes": np.array([2], np.int64)}, opset=17)


def qdq_linear():
    """A QDQ-quantized Gemm: int8 weights dequantized, activations fake-quantized (uint8)."""
    w = _w(4, 6)
    scale = np.float32(np.abs(w).max() / 127)
    wq = np.clip(np.round(w / scale), -127, 127).astype(np.int8)
    return _model([
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
        helper.make_node("DequantizeLinear", ["fc.weight_quantized", "ws", "wz"], ["fc.weight_DequantizeLinear_Output"]),
        helper.make_node("Gemm", ["xd", "fc.weight_DequantizeLinear_Output", "fc.bias"], ["y"], transB=1),
    ], [_vi("x", ["N", 6])], [_vi("y", ["N", 4])], {
        "xs": np.array(0.02, np.float32), "xz": np.array(128, np.uint8), "fc.weight_quantized": wq,
        "ws": np.array(scale, np.float32), "wz": np.array(0, np.int8), "fc.bias": _w(4)})


MODELS = {"cnn": (cnn, (3, 3, 9, 9)), "transformer-block": (transformer_block, (3, 3, 8)),
          "qdq-linear": (qdq_linear, (5, 6))}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_converted_module_computes_what_onnxruntime_computes(name):
    build, shape = MODELS[name]
    proto = build()
    x = np.random.default_rng(1).normal(0, 1, shape).astype(np.float32)
    expected = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    module = convert(proto)
    with torch.no_grad():
        got = module(torch.from_numpy(x)).numpy()
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-4)


def test_layers_take_their_weights_names_so_state_dict_keys_are_torchs():
    module = convert(cnn())
    keys = set(module.state_dict())
    assert {"conv.weight", "conv.bias", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var",
            "fc.weight", "fc.bias"} <= keys
    assert isinstance(module.get_submodule("conv"), torch.nn.Conv2d)
    assert isinstance(module.get_submodule("fc"), torch.nn.Linear)
    # a dequantized int8 weight is a float32 parameter under its float name
    q = convert(qdq_linear())
    assert q.get_submodule("fc").weight.dtype == torch.float32


def test_the_module_trains_and_a_new_head_replaces_the_last_linear():
    module = convert(cnn())
    assert replace_head(module, 7) == "fc"
    module.train()
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    x = torch.randn(4, 3, 9, 9)
    before = module.get_submodule("conv").weight.detach().clone()
    out = module(x)
    assert out.shape == (4, 7)  # the softmax after the head now sees 7 classes
    torch.nn.functional.nll_loss(out.log(), torch.tensor([0, 1, 2, 3])).backward()
    opt.step()
    assert not torch.equal(before, module.get_submodule("conv").weight)


def test_an_unsupported_op_is_named_with_its_node():
    proto = _model([helper.make_node("TopK", ["x", "k"], ["v", "i"], name="pick_best")],
                   [_vi("x", ["N", 5])], [_vi("v", ["N", 2]), _vi("i", ["N", 2], TensorProto.INT64)],
                   {"k": np.array([2], np.int64)})
    with pytest.raises(InvalidInput) as e:
        convert(proto)
    assert "unsupported op TopK at node 'pick_best'" in e.value.message
    assert "Conv" in e.value.hint  # the hint lists what is supported


def test_an_ort_format_file_is_refused_clearly(tmp_path):
    path = tmp_path / "model.ort"
    path.write_bytes(b"\x1c\x00\x00\x00ORTM" + b"\x00" * 64)
    with pytest.raises(InvalidInput, match="ORT format"):
        convert(path)
