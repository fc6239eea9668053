"""Tests of zoo_stages.lib.onnxutil: safe loading, atomic saving, sessions, timing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from zoo.errors import InvalidInput
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


def test_save_is_atomic_deterministic_and_lowers_ir(tmp_path):
    model = linear_model(ir_version=14)
    a = onnxutil.save_model(model, tmp_path / "a" / "m.onnx")
    b = onnxutil.save_model(linear_model(ir_version=14), tmp_path / "b" / "m.onnx")
    assert a.read_bytes() == b.read_bytes()
    assert onnx.load(str(a)).ir_version == onnxutil.MAX_IR_VERSION
    assert sorted(p.name for p in a.parent.iterdir()) == ["m.onnx"]  # no temp file left behind


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


class _StandInClock:
    """Stand-in for `time` in onnxutil: perf_counter_ns only moves when a stand-in session runs."""

    def __init__(self):
        self.now_ns = 0

    def perf_counter_ns(self) -> int:
        return self.now_ns


class _StandInSession:
    """Stand-in for an InferenceSession whose runs take the given milliseconds on the stand-in
    clock, in turn (the last one repeats); records the batch sizes it was fed."""

    def __init__(self, clock: _StandInClock, ms: list[float], batch="N"):
        self.clock, self.ms, self.calls, self.batches = clock, list(ms), 0, []
        self.batch = batch

    def get_inputs(self):
        from types import SimpleNamespace

        return [SimpleNamespace(name="x", shape=[self.batch, 1, 4, 4], type="tensor(float)")]

    def run(self, outputs, feed):
        self.batches.append(len(feed["x"]))
        self.clock.now_ns += round(self.ms[min(self.calls, len(self.ms) - 1)] * 1e6)
        self.calls += 1
        return [feed["x"]]


@pytest.fixture
def clock(monkeypatch):
    c = _StandInClock()
    monkeypatch.setattr(onnxutil, "time", c)
    return c


def test_latency_percentiles_with_a_stand_in_clock(clock):
    x = np.zeros((1, 1, 4, 4), np.float32)
    # two warm-up runs (untimed, 100 ms each), then nine timed runs of 1..9 ms in shuffled order
    session = _StandInSession(clock, [100, 100, 5, 1, 9, 3, 7, 2, 8, 4, 6])
    stats = onnxutil.measure_latency(session, x, warmup=2, runs=9)
    assert session.calls == 11
    assert stats == {"p50_ms": 5.0, "p90_ms": pytest.approx(8.2), "mean_ms": 5.0, "min_ms": 1.0, "runs": 9,
                     "warmup": 2}
    with pytest.raises(InvalidInput, match="at least 1"):
        onnxutil.measure_latency(session, x, runs=0)


def test_throughput_from_the_median_batch_time_with_a_stand_in_clock(clock):
    samples = np.zeros((5, 1, 4, 4), np.float32)
    session = _StandInSession(clock, [4.0])
    assert onnxutil.measure_throughput(session, samples, [1, 8], warmup=1, runs=3) == {"1": 250.0, "8": 2000.0}
    assert session.batches == [1] * 4 + [8] * 4
    fixed = _StandInSession(clock, [4.0], batch=1)
    assert onnxutil.measure_throughput(fixed, samples, [1, 8], warmup=0, runs=2) == {"1": 250.0, "8": None}


def test_compare_latency_stops_early_only_when_clearly_apart_with_a_stand_in_clock(clock):
    x = np.zeros((1, 1, 4, 4), np.float32)
    fast, slow = _StandInSession(clock, [1.0]), _StandInSession(clock, [2.0])
    stats = onnxutil.compare_latency({"a": fast, "b": slow}, x, warmup=1, runs=30, min_runs=5)
    assert stats["a"]["runs"] == stats["b"]["runs"] == 5 and stats["a"]["stopped_early"] is True
    assert (stats["a"]["p50_ms"], stats["b"]["p50_ms"]) == (1.0, 2.0)
    assert fast.calls == slow.calls == 6  # interleaved: one warm-up and five rounds each
    # medians 15% apart are not "clearly" apart (more than 15% is needed): every round runs
    near = onnxutil.compare_latency({"a": _StandInSession(clock, [1.0]), "b": _StandInSession(clock, [1.15])}, x,
                                    warmup=0, runs=12, min_runs=5)
    assert near["a"]["runs"] == 12 and near["a"]["stopped_early"] is False
    apart = onnxutil.compare_latency({"a": _StandInSession(clock, [1.0]), "b": _StandInSession(clock, [1.16])}, x,
                                     warmup=0, runs=12, min_runs=5)
    assert apart["a"]["runs"] == 5 and apart["a"]["stopped_early"] is True
    # without min_runs, or with one session, there is no early stop
    assert onnxutil.compare_latency({"a": fast, "b": slow}, x, warmup=0, runs=7)["a"]["runs"] == 7
    assert onnxutil.compare_latency({"a": fast}, x, warmup=0, runs=7, min_runs=2)["a"]["runs"] == 7


def test_latency_on_a_real_session_is_measured():
    """The real clock and a real session: only what holds whatever the machine's speed."""
    sess = onnxutil.make_session(linear_model())
    x = np.random.default_rng(0).random((5, 1, 4, 4), dtype=np.float32)
    stats = onnxutil.measure_latency(sess, x[:1], warmup=2, runs=9)
    assert stats["min_ms"] <= stats["p50_ms"] <= stats["p90_ms"]
    assert stats["runs"] == 9 and stats["warmup"] == 2
    assert onnxutil.batch_of(x, 7).shape == (7, 1, 4, 4)


def test_host_info_describes_the_cpu():
    info = onnxutil.host_info()
    assert info["cpu_count"] >= 1 and info["machine"]
    assert info["versions"]["onnxruntime"]
    assert isinstance(info["flags"], list)
