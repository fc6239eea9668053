"""TensorRT builds (zoo_stages.lib.runtimes.tensorrt_build, deploy's `convert: tensorrt`): what TensorRT can
compile is checked on any host; the engine options travel in the manifest; without the provider the
build is published unverified and never pulled by default. The GPU path (the engine built and timed
by onnxruntime's TensorrtExecutionProvider) needs an NVIDIA GPU and is not run by this suite."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from cli_helpers import zoo as zoo_cli
from conftest import REPO
from zoo_stages.lib.runtimes import tensorrt_build as trt


def _qdq_model(*, zero_point: int = 0, zp_type: int = TensorProto.INT8, bias_int32: bool = False,
               with_zero_point: bool = True):
    """x -> QuantizeLinear -> DequantizeLinear -> Add(bias) -> y, the QDQ pattern of a quantized model."""
    dtype = helper.tensor_dtype_to_np_dtype(zp_type)
    inits = [numpy_helper.from_array(np.array(0.1, np.float32), "scale")]
    q_inputs = ["x", "scale"]
    if with_zero_point:
        inits.append(numpy_helper.from_array(np.array(zero_point, dtype), "zp"))
        q_inputs.append("zp")
    nodes = [helper.make_node("QuantizeLinear", q_inputs, ["xq"], name="q"),
             helper.make_node("DequantizeLinear", ["xq", *q_inputs[1:]], ["xd"], name="dq")]
    if bias_int32:
        inits += [numpy_helper.from_array(np.array([3], np.int32), "bias_q"),
                  numpy_helper.from_array(np.array(0.01, np.float32), "bias_scale")]
        nodes.append(helper.make_node("DequantizeLinear", ["bias_q", "bias_scale"], ["bias"], name="bias_dq"))
    else:
        inits.append(numpy_helper.from_array(np.array([0.5], np.float32), "bias"))
    nodes.append(helper.make_node("Add", ["xd", "bias"], ["y"], name="add"))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def test_provider_options_follow_the_precision():
    assert trt.provider_options("fp32") == {"trt_engine_cache_enable": "True", "trt_engine_cache_path": "trt-engines",
                                            "trt_timing_cache_enable": "True", "trt_timing_cache_path": "trt-engines"}
    assert trt.provider_options("fp16")["trt_fp16_enable"] == "True" and "trt_int8_enable" not in trt.provider_options("fp16")
    int8 = trt.provider_options("int8")
    assert (int8["trt_int8_enable"], int8["trt_fp16_enable"]) == ("True", "True")
    with pytest.raises(ValueError, match="unknown TensorRT precision"):
        trt.provider_options("bf8")


def test_precision_defaults_and_refusals():
    assert (trt.precision_for("fp32", None), trt.precision_for("int8", None)) == ("fp16", "int8")
    assert trt.precision_for("fp32", "fp32") == "fp32"
    with pytest.raises(ValueError, match="needs a quantized \\(QDQ\\) source model"):
        trt.precision_for("fp32", "int8")
    with pytest.raises(ValueError, match="TensorRT runs it in int8, not fp16"):
        trt.precision_for("int8", "fp16")


def test_what_tensorrt_cannot_compile_is_named():
    assert trt.problems(_qdq_model()) == []
    (uint8,) = trt.problems(_qdq_model(zp_type=TensorProto.UINT8, zero_point=128))
    assert "2 QuantizeLinear/DequantizeLinear node(s) not in int8 (first: q)" in uint8
    (no_zp,) = trt.problems(_qdq_model(with_zero_point=False))  # no zero point: uint8 by the standard
    assert "not in int8" in no_zp
    (asym,) = trt.problems(_qdq_model(zero_point=-3))
    assert "2 QuantizeLinear/DequantizeLinear node(s) with a nonzero zero point (first: q)" in asym
    (bias,) = trt.problems(_qdq_model(bias_int32=True))
    assert "1 DequantizeLinear node(s) of int32 data (first: bias_dq: a quantized bias)" in bias
    fused = _qdq_model()
    fused.graph.node.append(helper.make_node("FusedGemm", ["y", "y"], ["z"], domain="com.microsoft"))
    fused.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    assert any("'com.microsoft'" in p for p in trt.problems(fused))


def test_the_engine_cache_of_a_loaded_build_goes_to_the_local_zoo(tmp_path):
    """zoo.load_session creates each provider with the build's options; a relative engine cache
    folder is placed in the local zoo, per model file (an engine is made for one model)."""
    from zoo.api import _provider_options
    from zoo.registry.manifest import Build, FileRef

    build = Build(name="tensorrt-fp16", file=FileRef(path="builds/t/model.onnx", sha256="ab" * 32, size=1),
                  execution_providers=["TensorrtExecutionProvider", "CPUExecutionProvider"],
                  provider_options={"TensorrtExecutionProvider": trt.provider_options("fp16")})
    options = _provider_options(build, "TensorrtExecutionProvider", tmp_path)
    assert options["trt_engine_cache_path"] == str(tmp_path / "engines" / ("ab" * 8) / "trt-engines")
    assert options["trt_fp16_enable"] == "True"
    assert _provider_options(build, "CPUExecutionProvider", tmp_path) == {}


def _lenet_with_tensorrt_int8(folder: Path, source: str) -> Path:
    """lenet-digits with a quantize stage for TensorRT and a `tensorrt-int8` build of stage `source`."""
    text = (REPO / "recipes" / "lenet-digits.yaml").read_text()
    text = text.replace("  verify:\n", "  quantize-trt:\n    kind: quantize\n    needs: [export]\n    config:\n"
                                       "      mode: static\n      preset: tensorrt\n"
                                       "      calibration: {samples: 64, method: minmax}\n"
                                       "      accept: {max_accuracy_drop: 0.02, min_speedup: 0.0}\n  verify:\n", 1)
    text = text.replace("needs: [export, optimize, quantize, verify]",
                        "needs: [export, optimize, quantize, quantize-trt, verify]")
    text = text.replace("        mobile: {from: quantize, convert: ort}\n",
                        f"        mobile: {{from: quantize, convert: ort}}\n"
                        f"        tensorrt-int8: {{from: {source}, convert: tensorrt}}\n")
    folder.mkdir(parents=True, exist_ok=True)
    recipe = folder / "lenet-digits.yaml"
    recipe.write_text(text)
    return recipe


@pytest.mark.slow
def test_an_int8_tensorrt_build_from_a_tensorrt_quantization_and_a_refusal_before_anything_is_published(tmp_path):
    env = {"ZOO_HOME": str(tmp_path / "home"), "ZOO_CACHE_DIR": str(tmp_path / "cache")}
    bad = zoo_cli("run", _lenet_with_tensorrt_int8(tmp_path / "bad", "quantize"), env=env, timeout=600)
    assert bad.code == 2, bad.text  # the recipe's model is wrong for the build: bad input
    assert "builds.tensorrt-int8 (convert: tensorrt, from: quantize): TensorRT cannot compile" in bad.err
    assert "DequantizeLinear node(s) of int32 data" in bad.err and "nonzero zero point" in bad.err
    assert "`preset: tensorrt`" in bad.err
    assert zoo_cli("list", "--json", env=env).out.strip() in ("[]", "")  # nothing was published

    good = zoo_cli("run", _lenet_with_tensorrt_int8(tmp_path / "good", "quantize-trt"), env=env, timeout=600)
    assert good.code == 0, good.text
    from zoo.registry.store import LocalZoo
    from zoo_stages.lib.onnx import onnx_io

    zoo = LocalZoo(tmp_path / "home")
    manifest = zoo.resolve("lenet-digits@1.0.0")
    b = manifest.builds["tensorrt-int8"]
    assert (b.precision, b.execution_providers[0]) == ("int8", "TensorrtExecutionProvider")
    assert b.provider_options["TensorrtExecutionProvider"]["trt_int8_enable"] == "True"
    model = onnx_io.load_model(zoo.blobs.path(b.file.sha256))
    assert trt.problems(model) == [] and any(n.op_type == "QuantizeLinear" for n in model.graph.node)
    assert b.metrics["accuracy"] >= 0.85  # symmetric int8 on the CPU, for the vectors
    if not trt.available():
        assert b.verified is False and "not run with TensorRT" in b.unverified_reason
        pulled = zoo_cli("pull", "lenet-digits", "--json", env=env)
        assert pulled.code == 0 and json.loads(pulled.out)["build"] != "tensorrt-int8"
