"""Tests of zoo_stages.lib.onnxutil: safe loading, atomic saving, sessions, timing."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from zoo.errors import InvalidInput, UnsafePath
from zoo_stages.lib import onnxutil


def linear_model(features: int = 16, classes: int = 3, batch="N", seed: int = 0, ir_version: int = 13) -> onnx.ModelProto:
    """Flatten + Gemm on (batch, 1, 4, 4) inputs, fixed random weights."""
    rng = np.random.default_rng(seed)
    w = rng.normal(0, 1, (classes, features)).astype(np.float32)
    b = rng.normal(0, 1, (classes,)).astype(np.float32)
    side = int(features ** 0.5)
    graph = helper.make_graph(
        [helper.make_node("Flatten", ["input"], ["flat"], axis=1),
         helper.make_node("Gemm", ["flat", "W", "B"], ["logits"], transB=1)],
        "linear",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [batch, 1, side, side])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, classes])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = ir_version
    return model


def numpy_logits(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    w = numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == "W"))
    b = numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == "B"))
    return x.reshape(len(x), -1) @ w.T + b


def test_load_fixes_ir_version_so_onnxruntime_runs_it(tmp_path):
    model = linear_model(ir_version=14)
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    loaded = onnxutil.load_model(path)
    assert loaded.ir_version == onnxutil.MAX_IR_VERSION
    x = np.random.default_rng(1).random((5, 1, 4, 4), dtype=np.float32)
    out = onnxutil.run(onnxutil.make_session(path), x)[0]
    np.testing.assert_allclose(out, numpy_logits(model, x), rtol=1e-5, atol=1e-5)


def test_load_refuses_missing_and_garbage_files(tmp_path):
    with pytest.raises(InvalidInput, match="does not exist"):
        onnxutil.load_model(tmp_path / "nope.onnx")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\xff\xfe not a protobuf \x00" * 10)
    with pytest.raises(InvalidInput, match="not a readable ONNX model"):
        onnxutil.load_model(bad)


def _with_external_location(tmp_path: Path, location: str) -> Path:
    """A model whose W initializer points at `location` (the data itself sits next to it)."""
    model = linear_model()
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    onnx.save_model(model, str(folder / "m.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.bin", size_threshold=0)
    saved = onnx.load(str(folder / "m.onnx"), load_external_data=False)
    for tensor in saved.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = location
    (folder / "m.onnx").write_bytes(saved.SerializeToString())
    return folder / "m.onnx"


def test_external_data_inside_the_folder_loads(tmp_path):
    path = _with_external_location(tmp_path, "weights.bin")
    loaded = onnxutil.load_model(path)
    assert all(t.data_location == TensorProto.DEFAULT for t in loaded.graph.initializer)
    x = np.ones((2, 1, 4, 4), dtype=np.float32)
    np.testing.assert_allclose(onnxutil.run(onnxutil.make_session(loaded), x)[0], numpy_logits(linear_model(), x),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("location", ["../weights.bin", "/etc/passwd", "sub/../../weights.bin"])
def test_external_data_escaping_the_folder_is_refused(tmp_path, location):
    path = _with_external_location(tmp_path, location)
    (tmp_path / "weights.bin").write_bytes((path.parent / "weights.bin").read_bytes())
    with pytest.raises(UnsafePath):
        onnxutil.load_model(path)


def test_external_data_symlink_out_of_the_folder_is_refused(tmp_path):
    path = _with_external_location(tmp_path, "link.bin")
    outside = tmp_path / "outside.bin"
    outside.write_bytes((path.parent / "weights.bin").read_bytes())
    os.symlink(outside, path.parent / "link.bin")
    with pytest.raises(UnsafePath, match="outside"):
        onnxutil.load_model(path)


def test_save_is_atomic_deterministic_and_lowers_ir(tmp_path):
    model = linear_model(ir_version=14)
    a = onnxutil.save_model(model, tmp_path / "a" / "m.onnx")
    b = onnxutil.save_model(linear_model(ir_version=14), tmp_path / "b" / "m.onnx")
    assert a.read_bytes() == b.read_bytes()
    assert onnx.load(str(a)).ir_version == onnxutil.MAX_IR_VERSION
    assert sorted(p.name for p in a.parent.iterdir()) == ["m.onnx"]  # no temp file left behind


def test_write_json_is_stable(tmp_path):
    onnxutil.write_json(tmp_path / "a.json", {"b": 1, "a": [1.5, None]})
    onnxutil.write_json(tmp_path / "b.json", {"a": [1.5, None], "b": 1})
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()


def test_prune_opset_imports_keeps_used_domains_only():
    model = linear_model()
    for domain in ("com.microsoft.nchwc", "ai.onnx.training", "com.microsoft"):
        model.opset_import.append(helper.make_opsetid(domain, 1))
    model.graph.node.append(helper.make_node("Identity", ["logits"], ["unused"], domain="com.microsoft"))
    onnxutil.prune_opset_imports(model)
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17), ("com.microsoft", 1)]
    assert onnxutil.custom_domains(model) == ["com.microsoft"]
    assert onnxutil.opset_version(model) == 17


def test_session_uses_the_requested_thread_count():
    sess = onnxutil.make_session(linear_model(), threads=2, level="basic")
    assert sess.get_session_options().intra_op_num_threads == 2
    with pytest.raises(InvalidInput, match="not available"):
        onnxutil.make_session(linear_model(), providers=["NoSuchExecutionProvider"])
    with pytest.raises(InvalidInput, match="level"):
        onnxutil.make_session(linear_model(), level="turbo")


def test_run_batched_pads_a_fixed_batch_and_matches_per_sample_runs():
    fixed = linear_model(batch=4)
    x = np.random.default_rng(2).random((10, 1, 4, 4), dtype=np.float32)
    sess = onnxutil.make_session(fixed)
    assert onnxutil.fixed_batch(sess) == 4
    out = onnxutil.run_batched(sess, x)
    assert out.shape == (10, 3)
    np.testing.assert_allclose(out, numpy_logits(fixed, x), rtol=1e-5, atol=1e-5)
    dyn = onnxutil.make_session(linear_model())
    assert onnxutil.fixed_batch(dyn) is None
    np.testing.assert_allclose(onnxutil.run_batched(dyn, x, batch_size=3), out, rtol=1e-6, atol=1e-6)


def test_random_inputs_are_fixed_by_seed_and_refuse_unknown_dims():
    sess = onnxutil.make_session(linear_model())
    a = onnxutil.random_inputs(sess, 3, seed=7)
    b = onnxutil.random_inputs(sess, 3, seed=7)
    assert [x.shape for x in a] == [(1, 1, 4, 4)] * 3
    assert all(np.array_equal(p, q) for p, q in zip(a, b))
    assert not np.array_equal(a[0], onnxutil.random_inputs(sess, 1, seed=8)[0])
    model = linear_model()
    model.graph.input[0].type.tensor_type.shape.dim[2].dim_param = "H"
    with pytest.raises(InvalidInput, match="dynamic dimensions") as err:
        onnxutil.random_inputs(onnxutil.make_session(model), 1, seed=0)
    assert "input_shape" in err.value.hint


def test_check_input_shape_names_the_mismatch():
    sess = onnxutil.make_session(linear_model())
    onnxutil.check_input_shape(sess, (1, 4, 4))
    with pytest.raises(InvalidInput, match="3x8x8.*1x4x4"):
        onnxutil.check_input_shape(sess, (3, 8, 8))


def test_compare_logits_and_accuracy_on_known_values():
    ref = np.array([[1.0, 0.0], [0.0, 2.0], [3.0, 4.0]])
    out = np.array([[1.0, 0.0], [0.0, 2.5], [4.0, 3.0]])
    r = onnxutil.compare_logits(out, ref)
    assert r["max_abs"] == pytest.approx(1.0)
    assert r["top1_agreement"] == pytest.approx(2 / 3)
    assert r["cosine_min"] == pytest.approx(24 / 25)
    assert r["cosine"] == pytest.approx((1 + 1 + 24 / 25) / 3)
    assert onnxutil.accuracy(ref, np.array([0, 1, 0])) == pytest.approx(2 / 3)
    with pytest.raises(InvalidInput, match="classes"):
        onnxutil.accuracy(ref, np.array([0, 1, 5]))


def test_allclose_report():
    rep = onnxutil.allclose_report(np.array([1.0, 2.2]), np.array([1.0, 2.0]), atol=0.1, rtol=0.0)
    assert rep["max_abs"] == pytest.approx(0.2)
    assert rep["max_rel"] == pytest.approx(0.1)
    assert not rep["ok"]
    assert onnxutil.allclose_report(np.array([1.0, 2.2]), np.array([1.0, 2.0]), atol=0.0, rtol=0.11)["ok"]


def test_latency_and_throughput():
    sess = onnxutil.make_session(linear_model())
    x = np.random.default_rng(0).random((5, 1, 4, 4), dtype=np.float32)
    stats = onnxutil.measure_latency(sess, x[:1], warmup=2, runs=9)
    assert 0 < stats["min_ms"] <= stats["p50_ms"] <= stats["p90_ms"]
    assert stats["runs"] == 9 and stats["warmup"] == 2
    tp = onnxutil.measure_throughput(sess, x, [1, 8], warmup=1, runs=3)
    assert set(tp) == {"1", "8"} and all(v > 0 for v in tp.values())
    fixed = onnxutil.make_session(linear_model(batch=1))
    assert onnxutil.measure_throughput(fixed, x, [1, 8], warmup=0, runs=2)["8"] is None
    assert onnxutil.batch_of(x, 7).shape == (7, 1, 4, 4)


def test_host_info_describes_the_cpu():
    info = onnxutil.host_info()
    assert info["cpu_count"] >= 1 and info["machine"]
    assert info["versions"]["onnxruntime"]
    assert isinstance(info["flags"], list)
