"""Tests of zoo_stages.lib.runtimes.openvino_build: an OpenVINO build of an ONNX model, checked against
onnxruntime on small models built with onnx.helper (float32, QDQ int8, com.microsoft fused ops)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_models import multi_io_feeds, multi_io_model
from zoo.errors import InvalidInput, MissingExtra, StageFailed
from zoo_stages.lib.runtimes import onnx_run, openvino_build, ort_session

CLASSES = 5
SIDE = 8


def _finish(graph: onnx.GraphProto, *domains: str) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]
                              + [helper.make_opsetid(d, 1) for d in domains])
    model.ir_version = 10  # onnxruntime 1.32 loads IR <= 13; onnx 1.23 stamps 14
    return model


def _weights(seed: int = 0) -> list[onnx.TensorProto]:
    rng = np.random.default_rng(seed)
    arrays = {"W": rng.normal(0, 0.3, (8, 3, 3, 3)), "B": rng.normal(0, 0.1, (8,)),
              "G": rng.normal(0, 0.1, (CLASSES, 8 * SIDE * SIDE)), "C": rng.normal(0, 0.1, (CLASSES,))}
    return [numpy_helper.from_array(a.astype(np.float32), name) for name, a in arrays.items()]


def conv_net(batch: int | str = "N") -> onnx.ModelProto:
    """Conv+Relu+Flatten+Gemm+Softmax on (batch, 3, 8, 8) "image"; outputs "probs" then "logits"."""
    graph = helper.make_graph(
        [helper.make_node("Conv", ["image", "W", "B"], ["conv"], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["conv"], ["relu"]),
         helper.make_node("Flatten", ["relu"], ["flat"], axis=1),
         helper.make_node("Gemm", ["flat", "G", "C"], ["logits"], transB=1),
         helper.make_node("Softmax", ["logits"], ["probs"], axis=1)],
        "conv_net",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [batch, 3, SIDE, SIDE])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [batch, CLASSES]),
         helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, CLASSES])],
        _weights())
    return _finish(graph)


def fused_net() -> onnx.ModelProto:
    """`conv_net` with com.microsoft FusedConv (Relu) and FusedGemm (LeakyRelu), as onnxruntime's
    offline optimizations write them; one output passes through an Identity."""
    graph = helper.make_graph(
        [helper.make_node("FusedConv", ["image", "W", "B"], ["relu"], domain="com.microsoft", pads=[1, 1, 1, 1],
                          activation="Relu"),
         helper.make_node("Flatten", ["relu"], ["flat"], axis=1),
         helper.make_node("FusedGemm", ["flat", "G", "C"], ["logits"], domain="com.microsoft", transB=1,
                          activation="LeakyRelu", activation_alpha=0.1),
         helper.make_node("Identity", ["logits"], ["scores"]),
         helper.make_node("Softmax", ["logits"], ["probs"], axis=1)],
        "fused_net",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 3, SIDE, SIDE])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", CLASSES]),
         helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N", CLASSES])],
        _weights())
    return _finish(graph, "com.microsoft")


def images(samples: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).random((samples, 3, SIDE, SIDE), dtype=np.float32)


def _save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save(model, path)
    return path


def _ort(path: Path, feeds, **kw) -> dict[str, np.ndarray]:
    return onnx_run.run(ort_session.make_session(path), feeds, **kw)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """{name: (onnx path, compiled model, model.xml)} for the float, fixed-batch, fused and QDQ int8 models."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    root = tmp_path_factory.mktemp("ov")
    paths = {"float": _save(conv_net(), root / "float.onnx"),
             "fixed": _save(conv_net(batch=4), root / "fixed.onnx"),
             "fused": _save(fused_net(), root / "fused.onnx")}

    class Calibration(CalibrationDataReader):
        def __init__(self):
            self.batches = iter([{"image": images(1, seed)} for seed in range(8)])

        def get_next(self):
            return next(self.batches, None)

    paths["int8"] = root / "int8.onnx"
    quantize_static(str(paths["float"]), str(paths["int8"]), Calibration(), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    out = {}
    for name, path in paths.items():
        xml, _ = openvino_build.to_openvino(path, root / f"{name}-ov")
        out[name] = (path, openvino_build.compile_model(xml), xml)
    return out


def test_float_outputs_by_onnx_name_match_onnxruntime_in_batches(built):
    path, compiled, _ = built["float"]
    x = images(10).astype(np.float64)  # cast to the input's float32, as onnx_run does
    got = openvino_build.run(compiled, {"image": x}, batch_size=4)
    assert list(got) == ["probs", "logits"]  # the ONNX output names, in the graph's order
    expected = _ort(path, {"image": x})
    for name in expected:
        assert got[name].shape == (10, CLASSES) and got[name].dtype == np.float32
        np.testing.assert_allclose(got[name], expected[name], atol=1e-4, rtol=0)
    whole = openvino_build.run(compiled, {"image": x})
    np.testing.assert_allclose(whole["logits"], got["logits"], atol=1e-5, rtol=0)
    assert list(openvino_build.run(compiled, {"image": x}, outputs=["logits"])) == ["logits"]


def test_fused_microsoft_ops_convert_and_match_onnxruntime(built):
    path, compiled, _ = built["fused"]
    x = images(6)
    got, expected = openvino_build.run(compiled, {"image": x}), _ort(path, {"image": x})
    assert list(got) == ["probs", "scores"]
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], atol=1e-4, rtol=0)


def test_fixed_batch_is_fed_whole_batches_and_padding_is_dropped(built, monkeypatch):
    path, compiled, _ = built["fixed"]
    session = openvino_build.CompiledSession(compiled)
    assert [(p.name, p.shape) for p in session.get_inputs()] == [("image", (4, 3, SIDE, SIDE))]
    fed = []
    real_run = session.run
    monkeypatch.setattr(session, "run", lambda names, feeds: fed.append(feeds["image"].copy()) or real_run(names, feeds))
    x = images(10)
    got = openvino_build.run(session, {"image": x}, batch_size=3)  # the model's own batch of 4 wins
    assert [len(batch) for batch in fed] == [4, 4, 4]
    np.testing.assert_array_equal(fed[-1][2:], np.repeat(x[-1:], 2, axis=0))  # padded with the last sample
    assert got["probs"].shape == (10, CLASSES)
    expected = _ort(built["float"][0], {"image": x})
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], atol=1e-4, rtol=0)


def test_qdq_int8_runs_int8_kernels_and_agrees_with_the_float_model(built):
    path, compiled, _ = built["int8"]
    layers = [op.get_rt_info() for op in compiled.get_runtime_model().get_ordered_ops()]  # the executed graph
    precisions = {info["runtimePrecision"].astype(str) for info in layers
                  if info["layerType"].astype(str) == "Convolution"}
    assert precisions and precisions <= {"u8", "i8"}, precisions  # OpenVINO runs the QDQ convolution in int8
    x = images(32, seed=7)
    got = openvino_build.run(compiled, {"image": x}, batch_size=8)["logits"]
    ort_int8 = _ort(path, {"image": x})["logits"]
    floats = _ort(built["float"][0], {"image": x})["logits"]
    same_model, float_model = _cosines(got, ort_int8), _cosines(got, floats)
    assert same_model.min() > 0.999 and np.array_equal(got.argmax(1), ort_int8.argmax(1))  # as onnxruntime runs it
    assert float_model.mean() > 0.99 and np.mean(got.argmax(1) == floats.argmax(1)) >= 0.9  # int8's usual loss


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, axis=1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def test_multi_io_model_keeps_names_types_and_a_scalar_output(tmp_path):
    model = multi_io_model()
    model.ir_version = 10
    path = _save(model, tmp_path / "multi.onnx")
    compiled = openvino_build.compile_model(openvino_build.to_openvino(path, tmp_path / "ov")[0])
    feeds = multi_io_feeds(6)
    got, expected = openvino_build.run(compiled, feeds), _ort(path, feeds)
    assert list(got) == list(expected) == ["probs", "scores16", "label", "total"]
    for name in expected:
        assert got[name].dtype == expected[name].dtype and got[name].shape == expected[name].shape, name
        np.testing.assert_allclose(got[name].astype(np.float64), expected[name].astype(np.float64), rtol=1e-3,
                                   atol=1e-4)
    with pytest.raises(InvalidInput, match="'total' has no batch axis"):
        openvino_build.run(compiled, feeds, batch_size=4)


def test_feeds_are_checked_against_the_inputs(built):
    compiled = built["float"][1]
    with pytest.raises(InvalidInput, match="no values for model input"):
        openvino_build.run(compiled, {})
    with pytest.raises(InvalidInput, match="expects 3x8x8"):
        openvino_build.run(compiled, {"image": np.zeros((2, 3, 4, 4), np.float32)})
    with pytest.raises(InvalidInput, match="complex64 values for model input 'image', which takes float32"):
        openvino_build.run(built["fixed"][1], {"image": np.zeros((2, 3, SIDE, SIDE), np.complex64)})


def test_conversion_is_byte_deterministic_and_names_no_source_path(tmp_path):
    # two conversions in one process, from different folders and file names: OpenVINO's
    # process-wide node counter and the rt_info's source name would both make them differ
    first = openvino_build.to_openvino(_save(conv_net(), tmp_path / "a.onnx"), tmp_path / "one")
    (tmp_path / "elsewhere").mkdir()
    second = openvino_build.to_openvino(_save(conv_net(), tmp_path / "elsewhere" / "b.onnx"), tmp_path / "two")
    assert [p.name for p in first] == ["model.xml", "model.bin"]
    for a, b in zip(first, second):
        assert a.read_bytes() == b.read_bytes(), a.name
    xml = first[0].read_text()
    assert "a.onnx" not in xml and str(tmp_path) not in xml and "conversion_parameters" not in xml
    assert f'<Runtime_version value="{openvino_build.version()}' in xml  # which OpenVINO made it stays
    assert sorted(p.name for p in (tmp_path / "one").iterdir()) == ["model.bin", "model.xml"]  # no temp folder left


def test_a_failed_conversion_leaves_the_folder_as_it_was(tmp_path):
    graph = helper.make_graph([helper.make_node("NoSuchOp", ["x"], ["y"], domain="zoo.test")], "bad",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    source = _save(_finish(graph, "zoo.test"), tmp_path / "bad.onnx")
    out = tmp_path / "out"
    out.mkdir()
    (out / "model.xml").write_text("old")
    with pytest.raises(StageFailed, match="OpenVINO could not convert bad.onnx: .*NoSuchOp") as failed:
        openvino_build.to_openvino(source, out)
    assert "NoSuchOp" in failed.value.log_tail
    assert sorted(p.name for p in out.iterdir()) == ["model.xml"] and (out / "model.xml").read_text() == "old"
    with pytest.raises(InvalidInput, match="no ONNX model at"):
        openvino_build.to_openvino(tmp_path / "missing.onnx", out)


def test_a_runtime_failure_keeps_openvinos_message():
    class Failing:  # a session whose run fails as CompiledSession.run reports it
        def get_inputs(self):
            return [openvino_build._Port("x", "float32", (None, 2))]

        def get_outputs(self):
            return [openvino_build._Port("y", "float32", (None, 2))]

        def run(self, names, feeds):
            raise StageFailed("OpenVINO failed running the model: out of memory")

    with pytest.raises(StageFailed, match="^OpenVINO failed running the model: out of memory$"):
        onnx_run.run(Failing(), {"x": np.zeros((3, 2), np.float32)})


def test_compiled_model_pins_precision_threads_streams_and_hint(built):
    import openvino as ov

    compiled = built["float"][1]
    assert compiled.get_property("INFERENCE_PRECISION_HINT") == ov.Type.f32  # not the bf16 default of AVX512-BF16 CPUs
    assert compiled.get_property("INFERENCE_NUM_THREADS") == 1
    assert compiled.get_property("NUM_STREAMS") == 1
    assert str(compiled.get_property("PERFORMANCE_HINT")) == "LATENCY"
    xml = built["float"][2]
    assert openvino_build.compile_model(xml, threads=2).get_property("INFERENCE_NUM_THREADS") == 2
    with pytest.raises(InvalidInput, match="at least 1"):
        openvino_build.compile_model(xml, threads=0)


def test_latency_has_timings_fields_and_runtime_info_names_the_runtime(built):
    stats = openvino_build.measure_latency(built["float"][1], {"image": images(1)}, warmup=1, runs=5)
    assert set(stats) == {"p50_ms", "p90_ms", "mean_ms", "min_ms", "runs", "warmup"}
    assert stats["runs"] == 5 and stats["warmup"] == 1
    assert all(stats[k] > 0 for k in ("p50_ms", "p90_ms", "mean_ms", "min_ms"))
    assert stats["min_ms"] <= stats["p50_ms"] <= stats["p90_ms"]
    info = openvino_build.runtime_info()
    assert info["runtime"] == "openvino" and info["device"] == "CPU" and info["inference_precision"] == "f32"
    assert info["runtime_version"] == openvino_build.version() and info["runtime_version"].startswith("20")
    assert info["device_name"]


def test_missing_openvino_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "openvino", None)  # `import openvino` now raises ImportError
    for call in (lambda: openvino_build.to_openvino(tmp_path / "m.onnx", tmp_path / "out"),
                 lambda: openvino_build.compile_model(tmp_path / "model.xml"),
                 openvino_build.runtime_info):
        with pytest.raises(MissingExtra) as missing:
            call()
        assert isinstance(missing.value, InvalidInput) and "zoo-onnx[openvino]" in missing.value.hint
    assert not (tmp_path / "out").exists()
    monkeypatch.setattr(openvino_build, "version", lambda: None)  # not installed at all
    with pytest.raises(MissingExtra, match="needs openvino"):
        openvino_build.require()


def test_importing_the_module_loads_neither_openvino_nor_numpy():
    code = ("import sys, zoo_stages.lib.runtimes.openvino_build; "
            "print(sorted(m for m in ('openvino', 'numpy', 'onnx', 'onnxruntime') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
