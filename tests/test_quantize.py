"""Tests of the `quantize` kind: every mode builds a runnable model, presets, auto selection, flags."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pydantic
import pytest
from onnx import TensorProto, helper, numpy_helper

from zoo.errors import GateFailed, InvalidInput
from zoo.stage import Inputs, KeyContext, RecipeInfo, StageContext, Upstream
from zoo_stages.lib.data import datasets
from zoo_stages.lib.onnx import onnx_io
from zoo_stages.lib.runtimes import host_info, onnx_run, ort_session, timing
from zoo_stages.lib.quality.parity import compare
from zoo_stages.lib.quantization.quant_settings import CANDIDATES, resolve, saturation_hint
from zoo_stages.quantize import Quantize, QuantizeConfig
from data_helpers import xy

DIGITS8 = {"source": "digits", "image_size": 8, "channels": 1, "limit": 300}
DIGITS32 = {"source": "digits", "image_size": 32, "channels": 1, "limit": 300}


def cnn(size: int = 8, c1: int = 8, c2: int = 16, classes: int = 10, seed: int = 0, batch="N") -> onnx.ModelProto:
    """Conv-Relu-Conv-Relu-MaxPool-Gemm on (N,1,size,size) with fixed random weights."""
    rng = np.random.default_rng(seed)
    inits = {
        "W1": rng.normal(0, 0.3, (c1, 1, 3, 3)), "B1": rng.normal(0, 0.1, (c1,)),
        "W2": rng.normal(0, 0.1, (c2, c1, 3, 3)), "B2": rng.normal(0, 0.1, (c2,)),
        "G": rng.normal(0, 0.02, (classes, c2 * (size // 2) ** 2)), "GB": rng.normal(0, 0.1, (classes,)),
    }
    nodes = [
        helper.make_node("Conv", ["input", "W1", "B1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "W2", "B2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("MaxPool", ["r2"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p"], ["f"], axis=1),
        helper.make_node("Gemm", ["f", "G", "GB"], ["logits"], transB=1),
    ]
    graph = helper.make_graph(
        nodes, "cnn",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [batch, 1, size, size])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, classes])],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 13
    return model


def make_context(tmp_path: Path, data: dict | None, name: str = "run") -> StageContext:
    base = tmp_path / name
    (base / "out").mkdir(parents=True)
    recipe = RecipeInfo(name="t", version="0.1.0", description="", license="", path=tmp_path / "recipe.yaml", digest="")
    return StageContext(stage_id="quantize", out_dir=base / "out", work_dir=base / "work", recipe=recipe,
                        shared={"data": data}, matrix={})


def run_quantize(tmp_path, model_path, data=DIGITS8, name="run", **config):
    ctx = make_context(tmp_path, data, name)
    inputs = Inputs([Upstream("optimize", "optimize", {"model": model_path}, {})])
    out = Quantize().run(inputs, QuantizeConfig(**config), ctx)
    return out["model"], ctx


@pytest.fixture
def small(tmp_path) -> Path:
    return onnx_io.save_model(cnn(), tmp_path / "small.onnx")


FAST = {"latency": {"warmup": 2, "runs": 10}}


def ops_of(path: Path) -> set[str]:
    return set(onnx_io.op_counts(onnx.load(str(path))))


def _kind_of(path: Path) -> str:
    ops = ops_of(path)
    if "DynamicQuantizeLinear" in ops:
        return "dynamic"
    return "static" if ops & {"QuantizeLinear", "QLinearConv", "MatMulNBits"} else "fp32"


@pytest.fixture
def stand_in_clock(monkeypatch):
    """Stand-in for the wall clock of quantize's latency measurement: each model's p50 is given
    per kind of model (fp32, static int8, dynamic int8) in `latencies`, so a test of what the kind
    decides from timings does not depend on this machine's speed. The figures default to the
    shape measured for AlexNet on x86 (static int8 faster than fp32, dynamic slower)."""
    latencies = {"fp32": 10.0, "static": 4.0, "dynamic": 35.0}
    real_make_session = ort_session.make_session

    def make_session(path, *args, **kwargs):
        session = real_make_session(path, *args, **kwargs)
        session.zoo_test_kind = _kind_of(Path(path))
        return session

    def stats(session, runs):
        ms = latencies[session.zoo_test_kind]
        return {"p50_ms": ms, "p90_ms": ms * 1.5, "mean_ms": ms, "min_ms": ms, "runs": runs, "warmup": 0}

    def measure_latency(session, x, *, warmup=5, runs=30, progress=None):
        return stats(session, runs)

    def compare_latency(sessions, x, *, warmup=5, runs=30, min_runs=None, progress=None):
        return {key: {**stats(s, runs), "stopped_early": False} for key, s in sessions.items()}

    monkeypatch.setattr(ort_session, "make_session", make_session)
    monkeypatch.setattr(timing, "measure_latency", measure_latency)
    monkeypatch.setattr(timing, "compare_latency", compare_latency)
    return latencies


# -- settings ----------------------------------------------------------------------------------


def test_presets_choose_types_and_reduce_range():
    avx2 = resolve(QuantizeConfig(preset="x86-avx2"))
    assert (avx2.activation_type, avx2.weight_type, avx2.reduce_range) == ("QUInt8", "QInt8", True)
    vnni = resolve(QuantizeConfig(preset="x86-vnni"))
    assert (vnni.activation_type, vnni.weight_type, vnni.reduce_range) == ("QUInt8", "QInt8", False)
    arm = resolve(QuantizeConfig(preset="arm64"))
    assert (arm.activation_type, arm.weight_type, arm.reduce_range) == ("QInt8", "QInt8", False)
    explicit = resolve(QuantizeConfig(preset="x86-avx2", reduce_range=False, activation_type="int8"))
    assert (explicit.activation_type, explicit.reduce_range) == ("QInt8", False)


def test_the_tensorrt_preset_is_symmetric_int8_with_float_biases():
    """What TensorRT's explicit quantization runs: int8 with zero points of 0, biases left in float
    (it rejects int32 dequantization), per-channel weights; a QOperator or dynamic model is refused."""
    trt = resolve(QuantizeConfig(preset="tensorrt"))
    assert (trt.activation_type, trt.weight_type, trt.per_channel, trt.reduce_range, trt.format) == \
        ("QInt8", "QInt8", True, False, "qdq")
    assert trt.extra_options() == {"ActivationSymmetric": True, "WeightSymmetric": True, "QuantizeBias": False}
    assert resolve(QuantizeConfig(preset="tensorrt", per_channel=False)).per_channel is False  # explicit wins
    assert resolve(QuantizeConfig()).extra_options() == {}
    for bad in ({"format": "qoperator"}, {"mode": "dynamic"}, {"linear": "blockwise"}):
        with pytest.raises(pydantic.ValidationError, match="preset: tensorrt makes a static QDQ model"):
            QuantizeConfig(preset="tensorrt", **bad)


def test_defaults_follow_onnxruntime_guidance():
    qdq = resolve(QuantizeConfig())
    assert (qdq.mode, qdq.format, qdq.activation_type, qdq.weight_type, qdq.preprocess) == \
        ("static", "qdq", "QInt8", "QInt8", True)
    qop = resolve(QuantizeConfig(format="qoperator"))
    assert qop.activation_type == "QUInt8"  # S8S8 QOperator is slow on x86-64
    dyn = resolve(QuantizeConfig(mode="dynamic", weight_type="QUInt8"))
    assert (dyn.activation_type, dyn.format, dyn.weight_type, dyn.preprocess, dyn.name) == \
        (None, None, "QUInt8", False, "dynamic-quint8")
    names = [resolve(QuantizeConfig(mode="auto"), n) for n in CANDIDATES]
    assert [(s.mode, s.format, s.per_channel, s.linear) for s in names] == [
        ("static", "qdq", False, "qdq"), ("static", "qdq", True, "qdq"), ("static", "qoperator", False, "qdq"),
        ("static", "qdq", False, "blockwise"), ("static", "qdq", False, "qdq"), ("dynamic", None, False, "qdq"),
        ("dynamic", None, False, "qdq")]
    assert [s.weight_type for s in names[5:]] == ["QInt8", "QUInt8"]
    # the saturation-free variant for x86 without VNNI: the x86-avx2 preset's types, whatever else is set
    avx2 = resolve(QuantizeConfig(mode="auto", activation_type="QInt8"), "static-qdq-x86-avx2")
    assert (avx2.activation_type, avx2.weight_type, avx2.reduce_range) == ("QUInt8", "QInt8", True)
    assert not any(s.reduce_range for s in names if s.name != "static-qdq-x86-avx2")
    assert resolve(QuantizeConfig(linear="blockwise")).linear == "blockwise"
    assert resolve(QuantizeConfig(mode="dynamic")).linear == "qdq"


@pytest.mark.parametrize("config,message", [
    ({"mode": "dynamic", "linear": "blockwise"}, "linear does not apply"),
    ({"mode": "auto", "linear": "blockwise"}, "linear is chosen by mode: auto"),
    ({"linear": "blockwise", "linear_block_size": 100}, "power of two"),
    ({"mode": "dynamic", "activation_type": "QInt8"}, "activation_type does not apply"),
    ({"mode": "dynamic", "format": "qdq"}, "format does not apply"),
    ({"mode": "dynamic", "calibration": {"samples": 8}}, "calibration does not apply"),
    ({"mode": "auto", "format": "qdq"}, "chosen by mode: auto"),
    ({"mode": "auto", "candidates": ["static-qdq", "fancy"]}, "unknown candidate 'fancy'"),
    ({"mode": "static", "candidates": ["static-qdq"]}, "auto only"),
    ({"weight_type": "QInt4"}, "weight_type"),
    ({"calibration": {"method": "magic"}}, "method"),
    ({"preset": "riscv"}, "preset"),
])
def test_config_errors_name_the_problem(config, message):
    with pytest.raises(pydantic.ValidationError, match=message):
        QuantizeConfig(**config)


# Candidate selection for `mode: auto` (the limits at their exact values, ties, the table) is tested
# without onnx in tests/test_quant_select.py.


# -- modes -------------------------------------------------------------------------------------


@pytest.mark.parametrize("config,expect_ops", [
    ({"mode": "static"}, {"QuantizeLinear", "DequantizeLinear"}),
    ({"mode": "static", "per_channel": True}, {"QuantizeLinear", "DequantizeLinear"}),
    ({"mode": "static", "format": "qoperator"}, {"QLinearConv"}),
    ({"mode": "static", "linear": "blockwise", "linear_block_size": 32}, {"QuantizeLinear", "com.microsoft.MatMulNBits"}),
    ({"mode": "static", "calibration": {"method": "entropy", "samples": 16}}, {"QuantizeLinear"}),
    ({"mode": "static", "calibration": {"method": "percentile", "samples": 16}}, {"QuantizeLinear"}),
    ({"mode": "dynamic", "weight_type": "QInt8"}, {"DynamicQuantizeLinear", "ConvInteger"}),
    ({"mode": "dynamic", "weight_type": "QUInt8"}, {"DynamicQuantizeLinear", "ConvInteger"}),
])
def test_each_mode_produces_a_runnable_model(tmp_path, small, config, expect_ops):
    out, ctx = run_quantize(tmp_path, small, **config, **FAST)
    assert expect_ops <= ops_of(out)
    model = onnx.load(str(out))
    assert model.ir_version <= 13
    onnx.checker.check_model(model)
    # Held-out digits: the distribution the activation ranges were calibrated on (uniform noise
    # saturates them and measures the calibration data, not the quantizer).
    x = xy(datasets.load_split(DIGITS8, tmp_path, "val"))[0][:16]
    ref = onnx_run.run(ort_session.make_session(small), {"input": x})
    # Level basic keeps Q/DQ unfused, so this checks the quantizer's scales and zero points
    # exactly, on any CPU. The fused int8 kernels (level all) are host-dependent: on x86 without
    # VNNI, VPMADDUBSW's 16-bit sums saturate (per-channel weights here: cosine 0.985).
    q = onnx_run.run(ort_session.make_session(out, level="basic"), {"input": x})
    assert compare(ref, q).cosine_min > 0.99
    fused = onnx_run.run(ort_session.make_session(out, level="all"), {"input": x})
    assert compare(ref, fused).top1_agreement >= 0.9
    m = ctx.metrics
    assert m["speedup"] > 0 and m["latency_p50_ms"] > 0 and m["fp32_latency_p50_ms"] > 0
    assert m["accuracy"] is not None and m["accuracy_drop"] == pytest.approx(m["fp32_accuracy"] - m["accuracy"])
    assert isinstance(m["flags"], list)


def test_static_quantization_is_deterministic(tmp_path, small):
    a, _ = run_quantize(tmp_path, small, name="a", **FAST)
    b, _ = run_quantize(tmp_path, small, name="b", **FAST)
    assert a.read_bytes() == b.read_bytes()
    c, _ = run_quantize(tmp_path, small, name="c", calibration={"seed": 1, "samples": 8}, **FAST)
    assert c.read_bytes() != a.read_bytes()  # the calibration sample matters


def test_blockwise_linear_layers_are_8bit_matmulnbits_and_deterministic(tmp_path, small):
    a, _ = run_quantize(tmp_path, small, name="a", linear="blockwise", linear_block_size=32, **FAST)
    b, _ = run_quantize(tmp_path, small, name="b", linear="blockwise", linear_block_size=32, **FAST)
    assert a.read_bytes() == b.read_bytes()
    nodes = onnx.load(str(a)).graph.node
    nbits = [n for n in nodes if n.op_type == "MatMulNBits"]
    assert len(nbits) == 1 and not [n for n in nodes if n.op_type == "Gemm"]  # the classifier, now 8-bit blockwise
    attrs = {x.name: onnx.helper.get_attribute_value(x) for x in nbits[0].attribute}
    assert (attrs["bits"], attrs["block_size"], attrs["accuracy_level"]) == (8, 32, 4)
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops_of(a)  # the convolutions stay static QDQ


def test_preset_avx2_writes_uint8_activations_and_7bit_weights(tmp_path, small):
    out, ctx = run_quantize(tmp_path, small, preset="x86-avx2", **FAST)
    model = onnx.load(str(out))
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    zero_points = [inits[n.input[2]] for n in model.graph.node if n.op_type == "QuantizeLinear"]
    assert zero_points and all(z.dtype == np.uint8 for z in zero_points)
    int8_weights = [v for v in inits.values() if v.dtype == np.int8 and v.size > 8]
    # onnxruntime's reduced int8 range is [-64, 64]; the full symmetric range reaches +-127
    assert int8_weights and all(-64 <= v.min() and v.max() <= 64 for v in int8_weights)
    assert ctx.metrics["settings"]["reduce_range"] is True
    full, _ = run_quantize(tmp_path, small, name="full", preset="x86-avx2", reduce_range=False, **FAST)
    full_weights = [numpy_helper.to_array(t) for t in onnx.load(str(full)).graph.initializer
                    if t.data_type == TensorProto.INT8 and numpy_helper.to_array(t).size > 8]
    assert max(int(np.abs(v.astype(np.int32)).max()) for v in full_weights) > 100


def test_dynamic_mode_slower_than_fp32_is_flagged_with_a_stand_in_clock(tmp_path, small, stand_in_clock):
    """Stand-in clock (see `stand_in_clock`): dynamic int8 at 35 ms against fp32 at 10 ms."""
    out, ctx = run_quantize(tmp_path, small, mode="dynamic", **FAST)
    m = ctx.metrics
    assert (m["latency_p50_ms"], m["fp32_latency_p50_ms"]) == (35.0, 10.0)
    assert m["speedup"] == pytest.approx(10.0 / 35.0) and m["slower_than_fp32"] is True
    assert any("slower than its fp32 parent on this host (35.000 ms vs 10.000 ms, speedup 0.29x)" in f
               for f in m["flags"]), m["flags"]


@pytest.mark.parametrize("dynamic_ms,slower", [(10.0, False), (10.001, True), (9.0, False)])
def test_only_a_build_slower_than_fp32_is_flagged_with_a_stand_in_clock(tmp_path, small, stand_in_clock,
                                                                        dynamic_ms, slower):
    """Stand-in clock: equal latency (speedup exactly 1.0) is not "slower"."""
    stand_in_clock["dynamic"] = dynamic_ms
    _, ctx = run_quantize(tmp_path, small, mode="dynamic", **FAST)
    assert ctx.metrics["slower_than_fp32"] is slower
    assert any("slower than its fp32 parent" in f for f in ctx.metrics["flags"]) is slower


def test_auto_picks_a_fast_candidate_and_records_the_table_with_a_stand_in_clock(tmp_path, small, stand_in_clock):
    """Stand-in clock (see `stand_in_clock`): static candidates 4 ms, dynamic 35 ms, fp32 10 ms;
    the static ones tie, so the first passing one in candidate order wins."""
    out, ctx = run_quantize(tmp_path, small, mode="auto", accept={"max_accuracy_drop": 0.1}, **FAST)
    rows = ctx.metrics["candidates"]
    assert [r["name"] for r in rows] == list(CANDIDATES)
    chosen = ctx.metrics["chosen"]
    assert chosen.startswith("static-")
    table = ctx.metrics["candidates_table"]
    by = {r["name"]: r for r in rows}
    for name in ("dynamic-qint8", "dynamic-quint8"):
        assert by[name]["slower_than_fp32"] and not by[name]["passed"], table
        assert by[name]["speedup"] == pytest.approx(10.0 / 35.0)
    assert all(not r["passed"] for r in rows if r["slower_than_fp32"]), table
    winner = next(r for r in rows if r["name"] == chosen)
    assert winner["passed"] and winner["speedup"] == pytest.approx(2.5)
    assert chosen == next(r["name"] for r in rows if r["passed"])  # a tie goes to candidate order
    saved = json.loads((ctx.out_dir / "candidates.json").read_text())
    assert saved["chosen"] == chosen and len(saved["candidates"]) == len(CANDIDATES)
    assert "CHOSEN" in ctx.metrics["candidates_table"]
    # the output is exactly the chosen candidate's quantization
    assert out.read_bytes() == (ctx.work_dir / "quantize" / "candidates" / f"{chosen}.onnx").read_bytes()


def test_auto_with_no_acceptable_candidate_raises_with_the_table_on_a_stand_in_cpu_without_vnni(
        tmp_path, small, monkeypatch, stand_in_clock):
    """Two stand-ins: the host is declared an x86 CPU without VNNI (`int8_may_saturate` patched to
    True, whatever this machine is), and the stand-in clock gives static int8 a 2.5x speedup, just
    short of the 2.6x asked for."""
    monkeypatch.setattr(host_info, "int8_may_saturate", lambda host=None: True)
    with pytest.raises(GateFailed, match="no quantization candidate") as err:
        run_quantize(tmp_path, small, mode="auto", candidates=["static-qdq", "dynamic-qint8"],
                     accept={"min_speedup": 2.6}, **FAST)
    assert "static-qdq" in err.value.table and "dynamic-qint8" in err.value.table
    assert "FAIL" in err.value.table
    assert (tmp_path / "run" / "out" / "candidates.json").is_file()
    assert "preset: x86-avx2" in err.value.hint
    # when auto already tried the x86-avx2 types, suggesting them would send the user in a circle
    with pytest.raises(GateFailed) as err:
        run_quantize(tmp_path, small, name="again", mode="auto", candidates=["static-qdq", "static-qdq-x86-avx2"],
                     accept={"min_speedup": 2.6}, **FAST)
    assert "static-qdq-x86-avx2" in err.value.table and "x86-avx2`" not in err.value.hint


def test_static_without_data_is_refused(tmp_path, small):
    with pytest.raises(InvalidInput, match="data"):
        run_quantize(tmp_path, small, data=None)
    # dynamic needs no data: accuracy is simply not measured
    out, ctx = run_quantize(tmp_path, small, data=None, name="dyn", mode="dynamic", **FAST)
    assert ctx.metrics["accuracy"] is None and ctx.metrics["speedup"] > 0


def test_shape_mismatch_between_data_and_model_is_explained(tmp_path, small):
    with pytest.raises(InvalidInput, match="1x32x32.*1x8x8"):
        run_quantize(tmp_path, small, data=DIGITS32)


def test_models_with_onnxruntime_fused_ops_are_refused(tmp_path, small):
    fused = tmp_path / "fused.onnx"
    ort_session.make_session(small, level="extended", optimized_path=fused)
    with pytest.raises(InvalidInput, match="com.microsoft") as err:
        run_quantize(tmp_path, fused)
    assert "level: basic" in err.value.hint


def test_a_model_with_nothing_to_quantize_is_refused_not_labelled_int8(tmp_path, small):
    """A tree ensemble (one ai.onnx.ml node): the quantizer returns it unchanged, which must not
    become a build called int8; `op_types` the model lacks fail the same way."""
    trees = helper.make_node("TreeEnsembleRegressor", ["x"], ["y"], domain="ai.onnx.ml", n_targets=1,
                             nodes_featureids=[0], nodes_modes=["LEAF"], nodes_nodeids=[0], nodes_treeids=[0],
                             nodes_values=[0.0], nodes_truenodeids=[0], nodes_falsenodeids=[0],
                             target_ids=[0], target_nodeids=[0], target_treeids=[0], target_weights=[1.5])
    graph = helper.make_graph([trees], "trees", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)])
    model.ir_version = 13
    path = onnx_io.save_model(model, tmp_path / "trees.onnx")
    with pytest.raises(InvalidInput, match=r"nothing to quantize.*TreeEnsembleRegressor x1") as err:
        run_quantize(tmp_path, path, data=None, mode="dynamic", **FAST)
    assert "drop the quantize stage" in err.value.hint
    with pytest.raises(InvalidInput, match="nothing to quantize.* of op_types LSTM") as err:
        run_quantize(tmp_path, small, data=None, name="lstm", mode="dynamic", op_types=["LSTM"], **FAST)
    assert "widen `op_types`" in err.value.hint


def test_npz_dataset_enters_the_cache_key(tmp_path):
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", x=rng.integers(0, 255, (40, 8, 8), dtype=np.uint8), y=np.arange(40) % 4)
    recipe = RecipeInfo(name="t", version="0.1.0", description="", license="", path=tmp_path / "recipe.yaml", digest="")
    data = {"source": "npz", "path": "d.npz"}
    deps = Quantize().dependencies(QuantizeConfig(), KeyContext(recipe=recipe, shared={"data": data}, matrix={}))
    assert deps == [(tmp_path / "d.npz").resolve()]
    assert Quantize().dependencies(QuantizeConfig(), KeyContext(recipe=recipe, shared={"data": None}, matrix={})) == []


def test_calibration_uses_an_npz_dataset(tmp_path, small):
    rng = np.random.default_rng(1)
    np.savez(tmp_path / "d.npz", x=rng.integers(0, 255, (60, 8, 8), dtype=np.uint8), y=np.arange(60) % 10)
    out, ctx = run_quantize(tmp_path, small, data={"source": "npz", "path": "d.npz"},
                            calibration={"samples": 100}, **FAST)
    assert any("calibration uses all" in f for f in ctx.metrics["flags"])
    assert "QuantizeLinear" in ops_of(out)


def test_a_fixed_batch_model_calibrates_and_measures(tmp_path):
    fixed = onnx_io.save_model(cnn(batch=1), tmp_path / "fixed.onnx")
    out, ctx = run_quantize(tmp_path, fixed, calibration={"samples": 5}, **FAST)
    assert "QuantizeLinear" in ops_of(out)
    assert ctx.metrics["accuracy"] is not None
    assert onnx_run.fixed_batch(ort_session.make_session(out)) == 1


@pytest.mark.parametrize("machine,flags,expect", [
    ("x86_64", ["avx2", "fma"], True),             # e.g. AMD Zen 3, Intel Haswell..Skylake client
    ("x86_64", ["avx2", "avx512f", "avx512_vnni"], False),
    ("x86_64", ["avx2", "avx_vnni"], False),       # Alder Lake and later clients
    ("aarch64", ["asimd", "asimddp"], False),
])
def test_int8_saturation_risk_follows_the_cpu_flags(machine, flags, expect):
    assert host_info.int8_may_saturate({"machine": machine, "flags": flags}) is expect


def test_saturation_hint_names_the_avx2_preset_only_where_it_helps_on_stand_in_cpus(monkeypatch):
    """Stand-in: `int8_may_saturate` is patched to declare the host an x86 CPU without VNNI, then
    one where int8 does not saturate (the real CPU-flag rule is tested just above)."""
    monkeypatch.setattr(host_info, "int8_may_saturate", lambda host=None: True)
    assert "preset: x86-avx2" in saturation_hint(resolve(QuantizeConfig(mode="static")))
    assert saturation_hint(resolve(QuantizeConfig(preset="x86-avx2"))) == ""  # already 7-bit weights
    assert saturation_hint(resolve(QuantizeConfig(mode="dynamic", weight_type="QUInt8"))) == ""  # u8 x u8 kernels
    monkeypatch.setattr(host_info, "int8_may_saturate", lambda host=None: False)
    assert saturation_hint(resolve(QuantizeConfig(mode="static"))) == ""
