"""Quantized builds back into torch (`zoo.onnx_to_torch_quant`): MatMulNBits made by onnxruntime's own
MatMulNBitsQuantizer at 4 and 8 bits (symmetric and with zero points, K not a multiple of the
block) dequantizes into float32 Linear weights that compute what onnxruntime computes; dynamic
int8 (DynamicQuantizeLinear + MatMulInteger, onnxruntime's quantize_dynamic) is computed as ONNX
specifies; what was dequantized is listed on the module; an operator-format int8 op is refused in
one line."""

from __future__ import annotations

import logging

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

torch = pytest.importorskip("torch")

from zoo import onnx_to_torch  # noqa: E402
from zoo.errors import InvalidInput  # noqa: E402
from zoo.onnx_to_torch_quant import unpack  # noqa: E402

K, H, N = 70, 48, 10  # K: two blocks of 32 and a padded third


def _float_mlp() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.normal(size=(K, H)) * 0.1).astype(np.float32), "fc1.weight"),
             numpy_helper.from_array((rng.normal(size=(H, N)) * 0.1).astype(np.float32), "fc2.weight"),
             numpy_helper.from_array(rng.normal(size=N).astype(np.float32), "fc2.bias")]
    nodes = [helper.make_node("MatMul", ["x", "fc1.weight"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Gemm", ["r", "fc2.weight", "fc2.bias"], ["y"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, K])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, N])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _nbits(bits: int, symmetric: bool) -> onnx.ModelProto:
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    from onnxruntime.quantization.onnx_model import ONNXModel

    wrapped = ONNXModel(_float_mlp())
    wrapped.replace_gemm_with_matmul()
    quantizer = MatMulNBitsQuantizer(wrapped.model, bits=bits, block_size=32, is_symmetric=symmetric,
                                     op_types_to_quantize=("MatMul",))
    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)
    quantizer.process()
    model = quantizer.model.model
    assert [n.op_type for n in model.graph.node].count("MatMulNBits") == 2
    return model


def _onnxruntime(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def _x(samples: int = 6) -> np.ndarray:
    return np.random.default_rng(1).normal(size=(samples, K)).astype(np.float32)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("symmetric", [True, False], ids=["symmetric", "zero-points"])
def test_matmul_nbits_dequantizes_into_linear_weights_that_compute_what_onnxruntime_computes(bits, symmetric):
    model = _nbits(bits, symmetric)
    assert any(i.name.endswith("zero_points") for i in model.graph.initializer) is (not symmetric)
    module = onnx_to_torch.convert(model)
    x = _x()
    with torch.no_grad():
        got = module(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, _onnxruntime(model, x), atol=1e-5, rtol=1e-5)
    assert module.dequantized == [f"MatMulNBits ({bits}-bit, block 32) -> float32 Linear weight x2"]
    # the layers take the float model's names, and their weights are float parameters that train
    assert isinstance(module.get_submodule("fc1"), torch.nn.Linear)
    assert module.get_submodule("fc1").weight.dtype == torch.float32
    # ...and the dequantized weight is the float one within a quantization step (4 bits: coarse)
    w = numpy_helper.to_array(next(i for i in _float_mlp().graph.initializer if i.name == "fc1.weight")).T
    step = np.abs(w).max() / (2 ** (bits - 1) - 1)
    assert np.abs(module.get_submodule("fc1").weight.detach().numpy() - w).max() <= step
    module(torch.from_numpy(x)).sum().backward()
    assert module.get_submodule("fc1").weight.grad is not None


def test_unpacking_reads_low_bits_first():
    packed = np.array([[0x21, 0x43]], dtype=np.uint8)
    assert unpack(packed, 4, 4).tolist() == [[1, 2, 3, 4]]
    assert unpack(packed, 4, 3).tolist() == [[1, 2, 3]]
    assert unpack(np.array([[0b11100100]], dtype=np.uint8), 2, 4).tolist() == [[0, 1, 2, 3]]


def test_dynamic_int8_is_computed_as_onnx_specifies(tmp_path):
    from onnxruntime.quantization import quantize_dynamic

    (tmp_path / "f.onnx").write_bytes(_float_mlp().SerializeToString())
    quantize_dynamic(tmp_path / "f.onnx", tmp_path / "d.onnx")
    model = onnx.load(tmp_path / "d.onnx")
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= {n.op_type for n in model.graph.node}
    module = onnx_to_torch.convert(model)
    x = _x(9)
    got = module(torch.from_numpy(x).requires_grad_())
    np.testing.assert_allclose(got.detach().numpy(), _onnxruntime(model, x), atol=1e-5, rtol=1e-5)
    assert "MatMulInteger -> computed in float32 (its int8 weights kept as buffers) x2" in module.dequantized


def test_a_float_build_lists_nothing_dequantized():
    assert onnx_to_torch.convert(_float_mlp()).dequantized == []


def test_operator_format_int8_is_refused_in_one_line_naming_the_op(tmp_path):
    from onnxruntime.quantization import QuantFormat, quantize_static
    from onnxruntime.quantization.calibrate import CalibrationDataReader

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.batches = iter([{"x": _x(4)}])

        def get_next(self):
            return next(self.batches, None)

    (tmp_path / "f.onnx").write_bytes(_float_mlp().SerializeToString())
    quantize_static(tmp_path / "f.onnx", tmp_path / "q.onnx", Reader(), quant_format=QuantFormat.QOperator)
    ops = {n.op_type for n in onnx.load(tmp_path / "q.onnx").graph.node}
    unsupported = sorted(ops - set(onnx_to_torch.SUPPORTED))
    assert unsupported, ops
    with pytest.raises(InvalidInput) as caught:
        onnx_to_torch.convert(tmp_path / "q.onnx", where="m@1 build cpu-int8")
    assert caught.value.message.startswith("m@1 build cpu-int8: unsupported op")
    assert "\n" not in caught.value.message
