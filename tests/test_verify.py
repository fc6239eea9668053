"""Tests of the `verify` kind (its gates alone: tests/test_gates.py)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pydantic
import pytest
from onnx import TensorProto, helper, numpy_helper

from zoo.errors import GateFailed, InvalidInput, RecipeError
from zoo.stage import Inputs, RecipeInfo, StageContext, Upstream
from zoo_stages.lib import onnx_io, onnx_run, ort_session
from zoo_stages.lib.vectors import read_test_vectors
from zoo_stages.lib.datasets import load_split
from zoo_stages.verify import Verify, VerifyConfig, _build_name, metric_names
from data_helpers import xy

DATA = {"source": "digits", "image_size": 8, "channels": 1}


# -- fixtures ----------------------------------------------------------------------------------


def gemm_model(w: np.ndarray, b: np.ndarray, batch="N") -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Flatten", ["image"], ["flat"], axis=1),
         helper.make_node("Gemm", ["flat", "W", "B"], ["scores"], transB=1)],
        "logreg",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [batch, 1, 8, 8])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [batch, w.shape[0]])],
        [numpy_helper.from_array(w.astype(np.float32), "W"), numpy_helper.from_array(b.astype(np.float32), "B")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 13
    return model


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A logistic regression fit on the digits train split, as ONNX, with its sklearn accuracy."""
    from sklearn.linear_model import LogisticRegression

    base = tmp_path_factory.mktemp("verify-models")
    xt, yt = xy(load_split(DATA, base, "train"))
    xv, yv = xy(load_split(DATA, base, "val"))
    clf = LogisticRegression(max_iter=2000).fit(xt.reshape(len(xt), -1), yt)
    fp32 = onnx_io.save_model(gemm_model(clf.coef_, clf.intercept_), base / "fp32.onnx")
    int8 = base / "int8.onnx"
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(fp32), str(int8), weight_type=QuantType.QInt8)
    onnx_io.save_model(onnx_io.load_model(int8), int8)
    fixed = onnx_io.save_model(gemm_model(clf.coef_, clf.intercept_, batch=1), base / "fixed.onnx")
    return {"fp32": fp32, "int8": int8, "fixed": fixed, "sk_accuracy": clf.score(xv.reshape(len(xv), -1), yv),
            "x_val": xv, "y_val": yv}


def make_context(tmp_path: Path, name: str = "run") -> StageContext:
    base = tmp_path / name
    (base / "out").mkdir(parents=True)
    recipe = RecipeInfo(name="t", version="0.1.0", description="", license="", path=tmp_path / "recipe.yaml", digest="")
    return StageContext(stage_id="verify", out_dir=base / "out", work_dir=base / "work", recipe=recipe,
                        shared={"data": DATA, "task": "image-classification",
                                "model": {"num_classes": 10, "inputs": None}}, matrix={})


def inputs_for(trained) -> Inputs:
    return Inputs([Upstream("optimize", "optimize", {"model": trained["fp32"]}, {}),
                   Upstream("quantize", "quantize", {"model": trained["int8"]}, {}),
                   Upstream("fixed", "export", {"model": trained["fixed"]}, {})])


FAST_LATENCY = {"warmup": 1, "runs": 5, "threads": 1, "batch_sizes": [1, 4], "throughput_runs": 2}


def config(**overrides) -> VerifyConfig:
    base = {"builds": {"cpu-fp32": "optimize", "cpu-int8": "quantize"}, "reference": "cpu-fp32",
            "latency": FAST_LATENCY, "vectors": {"count": 2, "seed": 0}}
    base.update(overrides)
    return VerifyConfig(**base)


def run_verify(tmp_path, trained, name="run", **overrides):
    ctx = make_context(tmp_path, name)
    out = Verify().run(inputs_for(trained), config(**overrides), ctx)
    return out, ctx


# -- verify ------------------------------------------------------------------------------------


def test_metrics_on_a_known_model(tmp_path, trained):
    out, ctx = run_verify(tmp_path, trained, gates=["cpu-fp32.accuracy >= 0.9", "cpu-int8.accuracy_drop <= 0.05"])
    report = json.loads(out["report"].read_text())
    ref, q = report["builds"]["cpu-fp32"], report["builds"]["cpu-int8"]
    # timings are measurements: metrics only, never in the (bit-reproducible) report artifact
    assert not any(k.startswith(("latency", "throughput", "speedup")) for m in (ref, q) for k in m)
    assert "latency_p50_ms" in report["measured"]
    ref = {**ref, **{k: v for k, v in ctx.metrics["builds"]["cpu-fp32"].items() if k not in ref}}
    q = {**q, **{k: v for k, v in ctx.metrics["builds"]["cpu-int8"].items() if k not in q}}
    assert ref["accuracy"] == pytest.approx(trained["sk_accuracy"], abs=1e-9)
    assert (ref["max_abs"], ref["cosine"], ref["top1_agreement"], ref["accuracy_drop"], ref["speedup"]) == \
        (0.0, pytest.approx(1.0), 1.0, 0.0, 1.0)
    # the int8 build's numbers, recomputed independently from its raw outputs
    xv, yv = trained["x_val"], trained["y_val"]
    q_out = onnx_run.run(ort_session.make_session(trained["int8"]), {"image": xv})["scores"]
    f_out = onnx_run.run(ort_session.make_session(trained["fp32"]), {"image": xv})["scores"]
    assert q["accuracy"] == pytest.approx(float((q_out.argmax(1) == yv).mean()))
    assert q["accuracy_drop"] == pytest.approx(ref["accuracy"] - q["accuracy"])
    assert q["top1_agreement"] == pytest.approx(float((q_out.argmax(1) == f_out.argmax(1)).mean()))
    assert q["max_abs"] == pytest.approx(float(np.abs(q_out - f_out).max()), rel=1e-5)
    assert 0.9 < q["cosine"] <= 1.0 + 1e-9
    assert q["speedup"] == pytest.approx(ref["latency_p50_ms"] / q["latency_p50_ms"])
    assert q["size_bytes"] == trained["int8"].stat().st_size and q["checker"] == 1
    for m in (ref, q):
        assert m["latency_p50_ms"] <= m["latency_p90_ms"]
        assert m["throughput_bs1"] > 0 and m["throughput_bs4"] > 0 and set(m["throughput"]) == {"1", "4"}
    assert report["threads"] == 1 and report["reference"] == "cpu-fp32" and report["passed"] is True
    assert ctx.metrics["host"]["cpu_count"] >= 1
    assert [g["gate"] for g in report["gates"]] == ["cpu-fp32.accuracy >= 0.9", "cpu-int8.accuracy_drop <= 0.05",
                                                    "cpu-fp32.checker == 1", "cpu-int8.checker == 1"]
    assert all(g["passed"] for g in report["gates"])
    assert ctx.metrics["builds"]["cpu-int8"]["accuracy"] == q["accuracy"] and ctx.metrics["passed"] is True


def test_gates_and_the_run_report_read_the_stage_metrics(tmp_path, trained):
    from zoo.stage import GateOutcome

    out, ctx = run_verify(tmp_path, trained, gates=["cpu-fp32.accuracy >= 0.9", "cpu-int8.size_ratio <= 2"])
    outcomes = Verify().gates(ctx.metrics)
    assert [(g.gate, g.passed, g.implicit) for g in outcomes] == [
        ("cpu-fp32.accuracy >= 0.9", True, False), ("cpu-int8.size_ratio <= 2", True, False),
        ("cpu-fp32.checker == 1", True, True), ("cpu-int8.checker == 1", True, True)]
    assert outcomes[0].value == ctx.metrics["builds"]["cpu-fp32"]["accuracy"]
    # the run summary shows the recipe's gates, not the implicit ones
    [table] = Verify().report("verify", ctx.metrics, [])
    assert table.title == "gates (verify)" and [c.header for c in table.columns] == ["gate", "value", "result"]
    assert table.rows == (("cpu-fp32.accuracy >= 0.9", outcomes[0].value, "PASS"),
                          ("cpu-int8.size_ratio <= 2", outcomes[1].value, "PASS"))
    # a failed or unmeasured gate (as a failing run's metrics hold them)
    failing = {"gates": [{"gate": "b.accuracy >= 1", "value": None, "passed": False, "implicit": False}]}
    assert Verify().gates(failing) == [GateOutcome("b.accuracy >= 1", None, False, False)]
    assert Verify().report("v", failing, [])[0].rows == (("b.accuracy >= 1", None, "FAIL"),)


def test_vectors_follow_the_model_zoo_layout_and_reload_to_the_same_outputs(tmp_path, trained):
    out, _ = run_verify(tmp_path, trained)
    vectors = out["vectors"]
    assert sorted(p.name for p in vectors.iterdir()) == ["cpu-fp32", "cpu-int8"]
    for build, path in (("cpu-fp32", trained["fp32"]), ("cpu-int8", trained["int8"])):
        sets = sorted(p.name for p in (vectors / build).iterdir())
        assert sets == ["test_data_set_0", "test_data_set_1"]
        for s in sets:
            assert sorted(p.name for p in (vectors / build / s).iterdir()) == ["input_0.pb", "output_0.pb"]
            inputs, outputs = read_test_vectors(vectors / build / s)
            assert list(inputs) == ["image"] and list(outputs) == ["scores"]
            assert inputs["image"].shape == (1, 1, 8, 8)
            # inputs come from the held-out split
            assert any(np.array_equal(inputs["image"][0], x) for x in trained["x_val"])
            rerun = onnx_run.run(ort_session.make_session(path), inputs)["scores"]
            np.testing.assert_array_equal(rerun, outputs["scores"])


def test_vectors_and_parity_are_deterministic(tmp_path, trained):
    a, actx = run_verify(tmp_path, trained, name="a")
    b, bctx = run_verify(tmp_path, trained, name="b")
    files_a = sorted(p.relative_to(a["vectors"]) for p in a["vectors"].rglob("*.pb"))
    assert files_a == sorted(p.relative_to(b["vectors"]) for p in b["vectors"].rglob("*.pb"))
    for rel in files_a:
        assert (a["vectors"] / rel).read_bytes() == (b["vectors"] / rel).read_bytes()
    stable = ("accuracy", "accuracy_drop", "max_abs", "cosine", "top1_agreement", "model_digest", "size_bytes")
    for build in ("cpu-fp32", "cpu-int8"):
        assert {k: actx.metrics["builds"][build][k] for k in stable} == {k: bctx.metrics["builds"][build][k] for k in stable}


def test_a_failing_gate_raises_with_the_table_after_writing_the_report(tmp_path, trained):
    gates = ["cpu-fp32.accuracy >= 0.5", "cpu-int8.accuracy >= 1.01", "cpu-int8.size_ratio <= 2"]
    with pytest.raises(GateFailed, match="1 of 5 gate") as err:
        run_verify(tmp_path, trained, gates=gates)
    table = err.value.table
    lines = table.splitlines()
    assert lines[0].split() == ["gate", "value", "threshold", "result"]
    row = next(line for line in lines if line.startswith("cpu-int8.accuracy >= 1.01"))
    assert row.rstrip().endswith("FAIL") and ">= 1.01" in row
    assert next(line for line in lines if line.startswith("cpu-fp32.accuracy")).rstrip().endswith("PASS")
    report = json.loads((tmp_path / "run" / "out" / "report.json").read_text())
    assert report["passed"] is False
    assert [g["passed"] for g in report["gates"]] == [True, False, True, True, True]


def test_a_fixed_batch_model_skips_other_throughput_sizes(tmp_path, trained):
    ctx = make_context(tmp_path)
    cfg = config(builds={"fixed": "fixed"}, reference=None)
    Verify().run(inputs_for(trained), cfg, ctx)
    m = ctx.metrics["builds"]["fixed"]
    assert m["throughput_bs1"] > 0 and m["throughput_bs4"] is None
    assert any("fixed to 1" in n for n in m["notes"])
    assert ctx.metrics["reference"] == "fixed"


def test_a_build_with_nan_outputs_reports_null_and_fails_its_gates(tmp_path, trained):
    w = np.full((10, 64), np.inf, dtype=np.float32)
    broken = onnx_io.save_model(gemm_model(w, np.zeros(10)), tmp_path / "broken.onnx")
    inputs = Inputs([Upstream("optimize", "optimize", {"model": trained["fp32"]}, {}),
                     Upstream("bad", "quantize", {"model": broken}, {})])
    ctx = make_context(tmp_path)
    cfg = config(builds={"cpu-fp32": "optimize", "broken": "bad"}, gates=["broken.cosine >= 0.9"])
    with pytest.raises(GateFailed) as err:
        Verify().run(inputs, cfg, ctx)
    assert "n/a" in err.value.table
    report = json.loads((ctx.out_dir / "report.json").read_text())
    assert report["builds"]["broken"]["cosine"] is None and report["gates"][0]["passed"] is False


def test_a_build_naming_a_stage_outside_needs_is_refused(tmp_path, trained):
    ctx = make_context(tmp_path)
    with pytest.raises(InvalidInput, match="train"):
        Verify().run(inputs_for(trained), config(builds={"cpu-fp32": "train"}, reference=None), ctx)


def test_without_data_verify_measures_parity_on_random_inputs(tmp_path, trained):
    ctx = make_context(tmp_path)
    ctx.shared = {"data": None, "model": None, "task": "image-classification"}
    out = Verify().run(inputs_for(trained), config(eval_samples=16, gates=["cpu-int8.top1_agreement >= 0.5"]), ctx)
    report = json.loads(out["report"].read_text())
    assert report["eval_data"].startswith("random") and report["eval_samples"] == 16
    q = report["builds"]["cpu-int8"]
    assert "accuracy" not in q and "accuracy_drop" not in q and "macro_f1" not in q
    assert q["top1_agreement"] >= 0.5 and q["cosine"] > 0.9
    inputs, _ = read_test_vectors(out["vectors"] / "cpu-int8" / "test_data_set_0")
    assert 0 <= inputs["image"].min() and inputs["image"].max() < 1
    # accuracy cannot be gated without labelled data: refused before anything runs
    ctx2 = make_context(tmp_path, "b")
    ctx2.shared = {"data": None, "model": None, "task": "image-classification"}
    with pytest.raises(InvalidInput, match="needs labelled data"):
        Verify().run(inputs_for(trained), config(gates=["cpu-int8.accuracy_drop <= 0.1"]), ctx2)


def test_builds_default_to_every_upstream_model(tmp_path, trained):
    ctx = make_context(tmp_path)
    cfg = VerifyConfig(latency=FAST_LATENCY, gates=["optimize.accuracy >= 0.9", "quantize.speedup >= 0"])
    Verify().run(inputs_for(trained), cfg, ctx)
    assert list(ctx.metrics["builds"]) == ["optimize", "quantize", "fixed"]
    assert ctx.metrics["reference"] == "optimize"
    assert ctx.metrics["builds"]["quantize"]["stage"] == "quantize"
    bad = VerifyConfig(latency=FAST_LATENCY, gates=["cpu-int8.speedup >= 1"])  # no builds: checked at run time
    with pytest.raises(InvalidInput, match="unknown build 'cpu-int8'"):
        Verify().run(inputs_for(trained), bad, make_context(tmp_path, "b"))
    assert _build_name("quantize[cpu-int8]") == "quantize-cpu-int8"


# -- config validation -------------------------------------------------------------------------


@pytest.mark.parametrize("gate,message", [
    ("cpu-int8.acuracy >= 0.9", "unknown metric 'acuracy' — did you mean 'accuracy'"),
    ("cpu-int8.accuracy => 0.9", "does not parse"),
    ("cpu-int8.accuracy >= high", "does not parse"),
    ("accuracy >= 0.9", "does not parse"),
    ("gpu-int8.accuracy >= 0.9", "unknown build 'gpu-int8'"),
    ("cpu-int8.throughput_bs64 >= 10", "unknown metric 'throughput_bs64'"),
])
def test_bad_gates_are_validation_errors(gate, message):
    with pytest.raises(pydantic.ValidationError, match=message) as err:
        config(gates=[gate])
    assert gate in str(err.value)


def test_unknown_metric_error_lists_the_valid_ones():
    with pytest.raises(pydantic.ValidationError) as err:
        config(gates=["cpu-int8.latency >= 1"])
    for name in ("accuracy_drop", "latency_p50_ms", "speedup", "throughput_bs4", "top1_agreement"):
        assert name in str(err.value)


def test_other_config_errors():
    with pytest.raises(pydantic.ValidationError, match="reference 'gpu'"):
        config(reference="gpu")
    with pytest.raises(pydantic.ValidationError, match="build name"):
        config(builds={"cpu int8": "quantize"}, reference=None)
    with pytest.raises(pydantic.ValidationError):
        config(builds={})
    with pytest.raises(pydantic.ValidationError, match="at least 1"):
        config(latency={"batch_sizes": [0]})
    assert config(gates=["cpu-int8.throughput_bs4 >= 1"]).parsed_gates()[0].metric == "throughput_bs4"


def test_a_bad_gate_fails_at_recipe_load_time_with_its_position(tmp_path):
    from zoo.engine import recipe

    path = tmp_path / "recipe.yaml"
    path.write_text(textwrap.dedent("""\
        schema_version: 1
        name: gated
        version: 0.1.0
        data: {source: digits}
        stages:
          verify:
            config:
              builds: {cpu-fp32: optimize}
              gates:
                - cpu-fp32.accuracy >= 0.9
                - cpu-fp32.acuracy >= 0.9
        """))
    with pytest.raises(RecipeError) as err:
        recipe.load(path)
    text = str(err.value)
    assert "cpu-fp32.acuracy >= 0.9" in text and "did you mean 'accuracy'" in text


# The gates themselves (parsing, every operator at its threshold, evaluation, the table) are tested
# without onnx in tests/test_gates.py.


def test_metric_names_include_throughput_sizes():
    names = metric_names([1, 16])
    assert "throughput_bs16" in names and "throughput_bs8" not in names and "accuracy" in names
