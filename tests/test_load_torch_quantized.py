"""`zoo.load_torch` of a published version's quantized builds, as alexnet's `cpu-int8` is made
(static QDQ convolutions, the fully connected layer as 8-bit MatMulNBits, `linear: blockwise`) on a
small CNN and real digits: the module holds dequantized float32 weights, says so (a warning line of the
``zoo`` logger, ``module.dequantized``) and computes what onnxruntime computes on the build; an
operator-format int8 build (QLinearConv) is refused in one line naming the float32 build."""

from __future__ import annotations

import hashlib
import logging

import numpy as np
import onnxruntime as ort
import pytest

torch = pytest.importorskip("torch")

from cli_helpers import zoo as zoo_cli  # noqa: E402
from test_quantize import cnn  # noqa: E402
from zoo.errors import InvalidInput  # noqa: E402
from zoo.registry.store import LocalZoo  # noqa: E402

pytestmark = pytest.mark.slow  # runs a recipe: export, two quantizations, verify, deploy

REF = "tiny-cnn@1.0.0"


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    base = tmp_path_factory.mktemp("quantized")
    (base / "cnn.onnx").write_bytes(cnn(size=16, c2=16).SerializeToString())
    digest = hashlib.sha256((base / "cnn.onnx").read_bytes()).hexdigest()
    (base / "recipe.yaml").write_text(f"""\
schema_version: 1
name: tiny-cnn
version: 1.0.0
license: MIT
task: image-classification
data: {{source: digits, image_size: 16, channels: 1, limit: 300}}
stages:
  export: {{config: {{onnx: {{path: cnn.onnx, sha256: {digest}}}}}}}
  quantize:
    needs: [export]
    config: {{mode: static, format: qdq, linear: blockwise, linear_block_size: 32, calibration: {{samples: 32}},
              accept: {{max_accuracy_drop: 1.0}}}}
  qoperator:
    kind: quantize
    needs: [export]
    config: {{mode: static, format: qoperator, calibration: {{samples: 32}}, accept: {{max_accuracy_drop: 1.0}}}}
  verify:
    needs: [export, quantize, qoperator]
    config:
      builds: {{cpu-fp32: export, cpu-int8: quantize, cpu-int8-qop: qoperator}}
      latency: {{warmup: 1, runs: 3, batch_sizes: [1]}}
  deploy:
    needs: [export, quantize, qoperator, verify]
    config:
      builds: {{cpu-fp32: {{from: export}}, cpu-int8: {{from: quantize}}, cpu-int8-qop: {{from: qoperator}}}}
""")
    env = {"ZOO_CACHE_DIR": str(base / "cache"), "ZOO_HOME": str(base / "home")}
    ran = zoo_cli("run", base / "recipe.yaml", env=env)
    assert ran.code == 0, ran.text
    return LocalZoo(base / "home")


def _digits() -> np.ndarray:
    from sklearn.datasets import load_digits

    images = load_digits().images[:64].astype(np.float32) / 16.0
    return np.kron(images, np.ones((2, 2), np.float32))[:, None]  # 16x16, one channel


def test_the_blockwise_int8_build_loads_with_dequantized_weights_and_says_so(published, caplog):
    import zoo

    with caplog.at_level(logging.WARNING, logger="zoo"):
        module = zoo.load_torch(REF, "cpu-int8", zoo=published)
    path = published.is_materialized(published.resolve(REF), "cpu-int8")  # load_torch pulled it
    ops = {n.op_type for n in __import__("onnx").load(str(path)).graph.node}
    assert {"MatMulNBits", "QuantizeLinear", "DequantizeLinear"} <= ops  # alexnet's cpu-int8 recipe
    said = [r.getMessage() for r in caplog.records if "is quantized" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith(f"{REF} build cpu-int8 is quantized; the torch module holds its "
                                                 "weights dequantized: ")
    assert "MatMulNBits (8-bit, block 32) -> float32 Linear weight x1" in said[0]
    assert any(line.startswith("MatMulNBits (8-bit, block 32)") for line in module.dequantized)
    assert any(line.startswith("DequantizeLinear of a stored int8/int32 weight or bias") for line in module.dequantized)
    x = _digits()
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    with torch.no_grad():
        got = module(torch.from_numpy(x)).numpy()
    # onnxruntime runs int8 kernels (MatMulNBits at accuracy_level 4 quantizes its input per block):
    # within a few 8-bit steps of the output's range, and the same top-1 class
    scale = float(np.abs(expected).max())
    np.testing.assert_allclose(got, expected, atol=4 * scale / 127, rtol=0)
    assert (got.argmax(1) == expected.argmax(1)).mean() >= 0.95
    assert zoo.load_torch(REF, zoo=published).dequantized == []  # the default: the float32 build


def test_an_operator_format_build_is_refused_naming_the_float_build(published):
    import zoo

    with pytest.raises(InvalidInput) as caught:
        zoo.load_torch(REF, "cpu-int8-qop", zoo=published)
    assert caught.value.message.startswith(f"{REF} build cpu-int8-qop: unsupported op")
    assert "\n" not in caught.value.message
    assert caught.value.hint.startswith(f"load the float32 build instead: zoo.load_torch('{REF}', build='cpu-fp32')")
    pulled = zoo_cli("pull", REF, "--as", "torch", "--build", "cpu-int8-qop",
                     env={"ZOO_HOME": str(published.root)})
    assert pulled.code == 2, pulled.text
    assert "Traceback" not in pulled.text and "--build cpu-fp32" in pulled.err
