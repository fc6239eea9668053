"""Unit tests of zoo_stages/lib/onnx/model_info.py and zoo_stages/lib/runtimes/convert.py on tiny ONNX models built here
(outputs compared with zoo_stages.lib.quality.parity, whose own tests are tests/test_parity.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from zoo.errors import InvalidInput
from zoo_stages.lib.runtimes import convert as cv
from zoo_stages.lib.runtimes import onnx_run, ort_session
from zoo_stages.lib.quality.parity import Tolerance, compare
from zoo_stages.lib.onnx.model_info import describe, detect_precision, load_graph


def tiny_classifier(path: Path, *, batch: int | str = "batch", seed: int = 0) -> Path:
    """A 64 -> 32 -> 10 MLP on 1x8x8 images (opset 17, IR 13)."""
    rng = np.random.default_rng(seed)
    weights = {
        "W1": rng.standard_normal((64, 32)).astype(np.float32) * 0.3,
        "b1": rng.standard_normal(32).astype(np.float32) * 0.1,
        "W2": rng.standard_normal((32, 10)).astype(np.float32) * 0.3,
        "b2": rng.standard_normal(10).astype(np.float32) * 0.1,
    }
    nodes = [
        helper.make_node("Flatten", ["input"], ["flat"], axis=1),
        helper.make_node("MatMul", ["flat", "W1"], ["h0"]),
        helper.make_node("Add", ["h0", "b1"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["h2"]),
        helper.make_node("MatMul", ["h2", "W2"], ["o0"]),
        helper.make_node("Add", ["o0", "b2"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes, "tiny",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [batch, 1, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, 10])],
        [numpy_helper.from_array(v, k) for k, v in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 13
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def quantized(src: Path, dst: Path) -> Path:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8)
    m = onnx.load(str(dst))
    m.ir_version = min(m.ir_version, 13)
    onnx.save(m, str(dst))
    return dst


def run(path: Path, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x})[0]


@pytest.fixture
def images() -> np.ndarray:
    return np.random.default_rng(1).random((16, 1, 8, 8), dtype=np.float32)


# ---------------------------------------------------------------------------------------------
# describe


def test_describe_onnx_ports_opset_precision(tmp_path):
    path = tiny_classifier(tmp_path / "m.onnx")
    info = describe(path)
    assert info.format == "onnx"
    assert info.opset == 17 and info.opsets == {"ai.onnx": 17}
    assert info.ir_version == 13
    assert info.size_bytes == path.stat().st_size
    assert [(p.name, p.dtype, p.shape) for p in info.inputs] == [("input", "float32", ["batch", 1, 8, 8])]
    assert [(p.name, p.dtype, p.shape) for p in info.outputs] == [("logits", "float32", ["batch", 10])]
    assert info.precision == "fp32"
    assert info.external_data == []


def test_describe_excludes_initializers_listed_as_inputs(tmp_path):
    m = onnx.load(str(tiny_classifier(tmp_path / "m.onnx")))
    # old exporters list every weight as a graph input too
    m.graph.input.append(helper.make_tensor_value_info("W1", TensorProto.FLOAT, [64, 32]))
    onnx.save(m, str(tmp_path / "old.onnx"))
    assert [p.name for p in describe(tmp_path / "old.onnx").inputs] == ["input"]


def test_weight_only_blocks_read_as_int4_or_int8_and_their_record(tmp_path):
    """A weight-only model's precision is its fewest bits (int4 with an 8-bit head), and its manifest
    record comes from quantize's stamp or, without one, from its blocks; a model with int8 operators
    beside its blocks (quantize's `linear: blockwise`) stays int8 with no weight-only record."""
    from zoo_stages.lib.onnx.model_info import quantization_record
    from zoo_stages.lib.quantization import quant_ops, weight_only

    src = tiny_classifier(tmp_path / "m.onnx")
    settings = weight_only.resolve(weight_only.WeightOnlyConfig(block_size=16, accuracy_level="float32"), None)
    int4 = tmp_path / "int4.onnx"
    weight_only.quantize(src, int4, settings)
    assert describe(int4).precision == "int4"
    assert quantization_record(int4) == {"method": "weight_only", "bits": 4, "block_size": 16,
                                         "accuracy_level": "float32"}  # from the graph: no stamp
    eight = weight_only.resolve(weight_only.WeightOnlyConfig(bits=8), None)
    weight_only.quantize(src, tmp_path / "int8.onnx", eight)
    assert describe(tmp_path / "int8.onnx").precision == "int8"
    from onnxruntime.quantization import QuantType, quantize_dynamic

    named = onnx.load(str(src))
    for i, node in enumerate(named.graph.node):
        node.name = f"n{i}"
    onnx.save(named, str(tmp_path / "named.onnx"))
    first = next(n.name for n in named.graph.node if n.op_type == "MatMul")
    blockwise = tmp_path / "blockwise.onnx"  # one layer dynamic int8, the other an 8-bit block layer
    quantize_dynamic(str(tmp_path / "named.onnx"), str(blockwise), weight_type=QuantType.QInt8, nodes_to_exclude=[first])
    quant_ops.blockwise_linear(blockwise, 16)
    assert {"MatMulNBits", "MatMulInteger"} <= {n.op_type for n in onnx.load(str(blockwise)).graph.node}
    assert describe(blockwise).precision == "int8" and quantization_record(blockwise) is None
    assert describe(src).precision == "fp32" and quantization_record(src) is None


def test_describe_unknown_dims_and_int8(tmp_path):
    src = tiny_classifier(tmp_path / "m.onnx")
    q = quantized(src, tmp_path / "q.onnx")
    info = describe(q)
    assert info.precision == "int8"
    m = onnx.load(str(src))
    m.graph.output[0].type.tensor_type.shape.dim[1].Clear()  # neither value nor param
    assert describe_ports_after_save(m, tmp_path / "u.onnx")[1][0].shape == ["batch", None]


def describe_ports_after_save(model, path):
    onnx.save(model, str(path))
    info = describe(path)
    return info.inputs, info.outputs


def test_describe_rejects_garbage_and_missing(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\xff\x00 this is not protobuf \x12\x99")
    with pytest.raises(InvalidInput):
        describe(bad)
    with pytest.raises(InvalidInput, match="does not exist"):
        describe(tmp_path / "nope.onnx")


def test_load_graph_does_not_need_external_data(tmp_path):
    m = onnx.load(str(tiny_classifier(tmp_path / "m.onnx")))
    d = tmp_path / "ext"
    d.mkdir()
    onnx.save(m, str(d / "model.onnx"), save_as_external_data=True, location="w.bin", size_threshold=0)
    (d / "w.bin").unlink()
    assert len(load_graph(d / "model.onnx").graph.initializer) == 4


def test_external_data_is_listed_and_loaded_for_conversion(tmp_path, images):
    src = tiny_classifier(tmp_path / "m.onnx")
    m = onnx.load(str(src))
    ext_dir = tmp_path / "ext"
    ext_dir.mkdir()
    onnx.save(m, str(ext_dir / "model.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
              location="model.onnx.data", size_threshold=0)
    assert describe(ext_dir / "model.onnx").external_data == ["model.onnx.data"]
    out = cv.to_fp16(ext_dir / "model.onnx", tmp_path / "fp16" / "model.onnx")
    np.testing.assert_allclose(run(out, images), run(src, images), atol=1e-2, rtol=1e-2)


# ---------------------------------------------------------------------------------------------
# fp16


def test_fp16_keeps_float32_io_and_matches(tmp_path, images):
    src = tiny_classifier(tmp_path / "m.onnx")
    out = cv.to_fp16(src, tmp_path / "out" / "model.onnx")
    model = onnx.load(str(out))
    assert model.ir_version <= 13
    assert detect_precision(model) == "fp16"
    info = describe(out)
    assert [p.dtype for p in info.inputs + info.outputs] == ["float32", "float32"]
    assert {i.data_type for i in model.graph.initializer} == {TensorProto.FLOAT16}
    onnx.checker.check_model(model, full_check=True)  # valid ONNX: the input Casts come first
    assert model.graph.node[0].op_type == "Cast" and model.graph.node[0].input[0] == model.graph.input[0].name
    ref, got = run(src, images), run(out, images)
    assert got.dtype == np.float32
    parity = compare({"logits": ref}, {"logits": got}, tolerance=Tolerance(atol=1e-2, rtol=1e-2))
    assert parity.passed and 0 < parity.max_abs < 1e-2
    assert parity.top1_agreement == 1.0
    # same source, same bytes
    again = cv.to_fp16(src, tmp_path / "again" / "model.onnx")
    assert again.read_bytes() == out.read_bytes()


def test_fp16_refuses_quantized_source(tmp_path):
    q = quantized(tiny_classifier(tmp_path / "m.onnx"), tmp_path / "q.onnx")
    with pytest.raises(InvalidInput, match="quantized"):
        cv.to_fp16(q, tmp_path / "x.onnx")


def test_fp16_op_block_list_keeps_ops_in_float32(tmp_path):
    src = tiny_classifier(tmp_path / "m.onnx")
    out = cv.to_fp16(src, tmp_path / "model.onnx", op_block_list=["MatMul"])
    model = onnx.load(str(out))
    # MatMul weights stay float32 when MatMul is blocked; only the Add biases become float16
    types = {i.name: i.data_type for i in model.graph.initializer}
    assert types["W1"] == TensorProto.FLOAT and types["b1"] == TensorProto.FLOAT16


# ---------------------------------------------------------------------------------------------
# ORT format


@pytest.mark.parametrize("style", ["Fixed", "Runtime"])
def test_ort_conversion_loads_matches_and_keeps_two_files(tmp_path, images, style):
    src = quantized(tiny_classifier(tmp_path / "m.onnx"), tmp_path / "q.onnx")
    dst = tmp_path / "out"
    result = cv.to_ort(src, dst, optimization_style=style, work_dir=tmp_path / "work")
    assert sorted(p.name for p in dst.iterdir()) == ["model.ort", "model.required_operators.config"]
    assert result.optimization_style == style
    config = result.operators_config.read_text()
    assert str(tmp_path) not in config and "# - model.ort" in config
    assert "ai.onnx;" in config
    assert describe(result.model).format == "ort"
    sess = ort_session.make_session(result.model, runtime_optimizations=style == "Runtime")
    got = onnx_run.run(sess, {"input": images})
    parity = compare({"logits": run(src, images)}, got, tolerance=Tolerance(atol=1e-4, rtol=1e-4))
    assert parity.passed, parity.table()
    # the work dir is cleaned up and the source folder untouched
    assert list((tmp_path / "work").iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "out", "q.onnx", "work"]
    second = cv.to_ort(src, tmp_path / "out2", optimization_style=style)
    assert second.model.read_bytes() == result.model.read_bytes()
    assert second.operators_config.read_bytes() == result.operators_config.read_bytes()


def test_ort_unknown_style(tmp_path):
    with pytest.raises(InvalidInput, match="optimization style"):
        cv.to_ort(tiny_classifier(tmp_path / "m.onnx"), tmp_path / "o", optimization_style="Fast")


# ---------------------------------------------------------------------------------------------
# canonical ORT bytes


def test_every_table_of_the_installed_ort_schema_is_understood():
    import pkgutil

    import onnxruntime.tools.ort_format_model.ort_flatbuffers_py.fbs as fbs

    tables = 0
    for info in pkgutil.iter_modules(fbs.__path__):
        source = Path(cv._fbs_module(info.name).__file__).read_text()
        if "StartObject" in source:
            table = cv._fb_table(info.name)
            assert table.slots >= len(table.fields) > 0
            tables += 1
        elif "def SizeOf" in source:
            assert cv._struct_alignment(info.name) in (1, 2, 4, 8)
    assert tables > 20


def test_canonical_ort_bytes_is_stable_and_equivalent(tmp_path, images):
    src = quantized(tiny_classifier(tmp_path / "m.onnx"), tmp_path / "q.onnx")
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "raw.ort")
    so.add_session_config_entry("session.save_model_format", "ORT")
    ort.InferenceSession(str(src), sess_options=so, providers=["CPUExecutionProvider"])
    raw = (tmp_path / "raw.ort").read_bytes()
    canonical = cv.canonical_ort_bytes(raw)
    assert cv.canonical_ort_bytes(canonical) == canonical
    (tmp_path / "canonical.ort").write_bytes(canonical)
    np.testing.assert_array_equal(run(tmp_path / "canonical.ort", images), run(tmp_path / "raw.ort", images))
    with pytest.raises(ValueError, match="ORTM"):
        cv.canonical_ort_bytes(src.read_bytes())


def test_runtime_style_with_saved_optimizations_is_reproducible(tmp_path, images):
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Calibration(CalibrationDataReader):
        def __init__(self):
            self.batches = iter([{"input": images[i:i + 4]} for i in range(0, 16, 4)])

        def get_next(self):
            return next(self.batches, None)

    src = tiny_classifier(tmp_path / "m.onnx")
    qdq = tmp_path / "qdq.onnx"
    quantize_static(str(src), str(qdq), Calibration(), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    m = onnx.load(str(qdq))
    m.ir_version = 13
    onnx.save(m, str(qdq))
    first = cv.to_ort(qdq, tmp_path / "a", optimization_style="Runtime")
    second = cv.to_ort(qdq, tmp_path / "b", optimization_style="Runtime")
    assert first.model.read_bytes() == second.model.read_bytes()
    from onnxruntime.tools.ort_format_model.ort_flatbuffers_py.fbs.InferenceSession import InferenceSession

    graph = InferenceSession.GetRootAs(first.model.read_bytes(), 0).Model().Graph()
    assert graph.RuntimeOptimizations().RecordsLength() >= 1  # the QDQ fusions were saved, not applied
    # default loading (no replay): what deploy's parity gate checks
    got = onnx_run.run(ort_session.make_session(first.model), {"input": images})
    parity = compare({"logits": run(qdq, images)}, got, tolerance=Tolerance(atol=0.05, rtol=0.05))
    assert parity.top1_agreement == 1.0 and parity.cosine > 0.999, parity.table()


def test_fp16_refuses_onnxruntime_specific_operators(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    from zoo.errors import InvalidInput
    from zoo_stages.lib.runtimes.convert import to_fp16

    node = helper.make_node("FusedGemm", ["x", "w"], ["y"], domain="com.microsoft", name="fused")
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 4], [0.5] * 16)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 13
    onnx.save(model, str(tmp_path / "fused.onnx"))
    with pytest.raises(InvalidInput, match="onnxruntime-specific operators") as err:
        to_fp16(tmp_path / "fused.onnx", tmp_path / "out.onnx")
    assert "from:` the export" in err.value.hint


def test_a_graph_the_fp16_converter_broke_is_a_stage_failure_naming_the_fix(tmp_path, monkeypatch):
    """Stand-in: the re-sorting finds a node reading a name nothing provides (what a converter bug
    would leave); the build fails with a hint instead of a bare ValueError, and nothing is written."""
    from zoo.errors import StageFailed
    from zoo_stages.lib.onnx import graph_order

    def broken(graph):
        raise graph_order.CycleError("node 'x' reads 'missing', which nothing provides")

    src = tiny_classifier(tmp_path / "m.onnx")
    monkeypatch.setattr(graph_order, "sort_graph", broken)
    with pytest.raises(StageFailed, match="cannot be ordered: node 'x' reads 'missing'") as e:
        cv.to_fp16(src, tmp_path / "out" / "model.onnx")
    assert "op_block_list" in e.value.hint and not (tmp_path / "out" / "model.onnx").exists()
