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
from zoo_stages.lib.onnx import onnx_io
from zoo_stages.lib.runtimes import onnx_run, ort_session
from zoo_stages.lib.release.vectors import read_test_vectors
from zoo_stages.lib.data.datasets import load_split
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
    assert report["task_kind"] == "classification" and report["metric_outputs"] == {"scores": "scores"}
    assert ref["top5_accuracy"] >= ref["accuracy"] and 0 < ref["macro_f1"] <= 1 and q["macro_f1_drop"] is not None
    v = read_back(out, ctx)
    assert v.headline_metrics() == ["accuracy", "accuracy_drop"] and v.reference_metric("accuracy") == ref["accuracy"]


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


# -- any model: named inputs, tasks ---------------------------------------------------------------


def verify_models(tmp_path, models, *, task, split=None, monkeypatch=None, model_inputs=None, name="any",
                  data=None, **overrides):
    """Run verify on `models` ({build name: ModelProto}, the first the reference) as upstream
    stages of the same names. `split` (a datasets.Split) stands in for the recipe's held-out data."""
    from zoo_stages.lib.data import datasets

    base = tmp_path / name
    base.mkdir()
    ups = Inputs([Upstream(b, "export", {"model": onnx_io.save_model(m, base / f"{b}.onnx")}, {})
                  for b, m in models.items()])
    if split is not None:
        monkeypatch.setattr(datasets, "load_split", lambda data, recipe_dir, which: split.take(slice(None)))
        data = {"source": "npz", "path": "stand-in.npz"}
    ctx = make_context(tmp_path, name)
    ctx.shared = {"data": data, "task": task, "model": {"num_classes": None, "inputs": model_inputs}}
    cfg = VerifyConfig(**{"builds": {b: b for b in models}, "latency": FAST_LATENCY,
                          "vectors": {"count": 2, "seed": 0}, **overrides})
    out = Verify().run(ups, cfg, ctx)
    return json.loads(out["report"].read_text()), out, ctx


def read_back(out, ctx):
    """verify's outputs as deploy reads them."""
    import logging

    from zoo_stages.lib.quality.verify_report import read_verify_outputs

    return read_verify_outputs(Inputs([Upstream("verify", "verify", dict(out), ctx.metrics)]),
                               logging.getLogger("test"))


@pytest.fixture(scope="module")
def digits_flat():
    """Digits as (samples, 64) float features: two logistic regressions with different strengths
    (probabilities from one, the label output's decision rule from the other)."""
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    strong = LogisticRegression(max_iter=2000).fit(x[:1000], y[:1000])
    weak = LogisticRegression(C=1e-3, max_iter=2000).fit(x[:1000], y[:1000])
    return {"x": x[1000:1300], "y": y[1000:1300].astype(np.int64), "strong": strong, "weak": weak}


def test_multi_input_models_are_fed_every_input_and_vectors_hold_every_port(tmp_path):
    from onnx_models import multi_io_model

    report, out, _ = verify_models(tmp_path, {"a": multi_io_model(seed=0), "b": multi_io_model(seed=1)},
                                   task="text-classification", eval_samples=16)
    assert report["eval_data"].startswith("random") and report["eval_samples"] == 16
    a, b = report["builds"]["a"], report["builds"]["b"]
    assert a["inputs"] == [{"name": "ids", "dtype": "int64", "shape": ["N", 5]},
                           {"name": "types", "dtype": "int64", "shape": ["N", 5]},
                           {"name": "mask", "dtype": "bool", "shape": ["N", 5]}]
    assert [(p["name"], p["dtype"]) for p in a["outputs"]] == [("probs", "float32"), ("scores16", "float16"),
                                                               ("label", "int64"), ("total", "float32")]
    # the integer label output is compared exactly: no distance, no top-1 on it
    assert set(b["parity"]) == {"probs", "scores16", "label", "total"}
    assert "max_abs" not in b["parity"]["label"] and "top1_agreement" not in b["parity"]["label"]
    assert b["parity"]["label"]["exact_match"] == b["exact_match"] < 1.0
    assert a["exact_match"] == 1.0 and a["max_abs"] == 0.0
    # top-1 agreement on the scores output (probs), recomputed from the builds' own vectors below
    assert report["metric_outputs"] == {"scores": "probs", "label": "label"}
    assert 0.0 <= b["top1_agreement"] <= 1.0 and a["top1_agreement"] == 1.0
    # no labels: no task metrics
    assert report["task_metrics"] == [] and not any(k.startswith(("accuracy", "macro_f1")) for k in b)
    for build, seed in (("a", 0), ("b", 1)):
        for s in ("test_data_set_0", "test_data_set_1"):
            folder = out["vectors"] / build / s
            assert sorted(p.name for p in folder.iterdir()) == [
                "input_0.pb", "input_1.pb", "input_2.pb", "output_0.pb", "output_1.pb", "output_2.pb", "output_3.pb"]
            inputs, outputs = read_test_vectors(folder)
            assert list(inputs) == ["ids", "types", "mask"] and list(outputs) == ["probs", "scores16", "label", "total"]
            assert inputs["mask"].dtype == bool and inputs["ids"].dtype == np.int64 and inputs["ids"].shape == (1, 5)
            rerun = onnx_run.run(ort_session.make_session(multi_io_model(seed=seed).SerializeToString()), inputs)
            for k in outputs:
                np.testing.assert_array_equal(rerun[k], outputs[k])


def test_multi_input_data_is_bound_by_name_and_scored_on_the_label_output(tmp_path, monkeypatch):
    from onnx_models import multi_io_feeds, multi_io_model, multi_io_reference
    from zoo_stages.lib.data.datasets import Split

    feeds = multi_io_feeds(40)
    labels = np.random.default_rng(3).integers(0, 4, 40).astype(np.int64)
    # the data holds one more array than the model takes, in another order: bound by name
    split = Split({"mask": feeds["mask"], "extra": np.zeros((40, 2)), "types": feeds["types"], "ids": feeds["ids"]},
                  labels)
    report, _, _ = verify_models(tmp_path, {"a": multi_io_model(seed=0)}, task="text-classification",
                                 split=split, monkeypatch=monkeypatch, eval_samples=32,
                                 gates=["a.accuracy >= 0", "a.macro_f1 >= 0", "a.exact_match == 1"])
    expected = multi_io_reference(multi_io_model(seed=0), {k: v[:32] for k, v in feeds.items()})
    a = report["builds"]["a"]
    assert report["eval_data"] == "held-out split" and report["eval_samples"] == 32
    assert a["accuracy"] == float(np.mean(expected["label"] == labels[:32]))
    assert "top5_accuracy" not in a  # 4 classes
    assert report["task_metrics"] == ["accuracy", "macro_f1"] and report["passed"] is True


def test_an_sklearn_shaped_classifier_takes_accuracy_from_its_label_output(tmp_path, monkeypatch, digits_flat):
    from sklearn import metrics as skm

    from onnx_models import sklearn_classifier_model
    from zoo_stages.lib.data.datasets import Split

    strong, weak = digits_flat["strong"], digits_flat["weak"]
    x, y = digits_flat["x"], digits_flat["y"]
    model = sklearn_classifier_model(weak.coef_, weak.intercept_, strong.coef_, strong.intercept_)
    report, _, _ = verify_models(tmp_path, {"fp32": model}, task="tabular-classification",
                                 split=Split({"features": x}, y), monkeypatch=monkeypatch)
    m = report["builds"]["fp32"]
    label, proba = strong.predict(x), weak.predict_proba(x)
    assert not np.array_equal(label, proba.argmax(axis=1))  # the two outputs disagree on some samples
    assert m["accuracy"] == skm.accuracy_score(y, label)  # exactly the label output's accuracy
    assert m["macro_f1"] == pytest.approx(skm.f1_score(y, label, average="macro"), abs=1e-9)
    assert m["top5_accuracy"] == pytest.approx(skm.top_k_accuracy_score(y, proba, k=5), abs=1e-9)
    assert report["metric_outputs"] == {"scores": "probabilities", "label": "label"}
    assert "max_abs" not in m["parity"]["label"]


def test_a_build_whose_label_output_changes_reports_exact_match_and_drops(tmp_path, monkeypatch, digits_flat):
    from onnx_models import sklearn_classifier_model
    from zoo_stages.lib.data.datasets import Split

    strong, weak = digits_flat["strong"], digits_flat["weak"]
    x, y = digits_flat["x"], digits_flat["y"]
    ref = sklearn_classifier_model(strong.coef_, strong.intercept_, strong.coef_, strong.intercept_)
    worse = sklearn_classifier_model(strong.coef_, strong.intercept_, weak.coef_, weak.intercept_)
    report, _, ctx = verify_models(
        tmp_path, {"ref": ref, "worse": worse}, task="tabular-classification", split=Split({"features": x}, y),
        monkeypatch=monkeypatch, gates=["worse.exact_match >= 0.5", "worse.accuracy_drop <= 0.5"])
    r, w = report["builds"]["ref"], report["builds"]["worse"]
    share = float(np.mean(strong.predict(x) == weak.predict(x)))
    assert w["exact_match"] == pytest.approx(share) and share < 1.0
    assert w["accuracy_drop"] == pytest.approx(r["accuracy"] - float(np.mean(weak.predict(x) == y)))
    assert w["max_abs"] == 0.0 and w["top1_agreement"] == 1.0  # the probabilities are the same
    assert [g["passed"] for g in report["gates"]] == [True, True, True, True]


@pytest.fixture(scope="module")
def diabetes():
    from sklearn.datasets import load_diabetes
    from sklearn.linear_model import Ridge

    x, y = load_diabetes(return_X_y=True)
    x, y = x.astype(np.float32), y.astype(np.float32)
    good = Ridge(alpha=0.1).fit(x[:340], y[:340])
    poor = Ridge(alpha=10.0).fit(x[:340], y[:340])
    return {"x": x[340:], "y": y[340:], "good": good, "poor": poor}


def test_regression_metrics_increases_and_gates(tmp_path, monkeypatch, diabetes):
    from sklearn import metrics as skm

    from onnx_models import regression_model
    from zoo_stages.lib.data.datasets import Split

    good, poor, x, y = diabetes["good"], diabetes["poor"], diabetes["x"], diabetes["y"]
    models = {"good": regression_model(good.coef_, good.intercept_),
              "poor": regression_model(poor.coef_, poor.intercept_)}
    gates = ["good.r2 >= 0.3", "poor.mae_increase <= 100", "poor.rmse_increase >= 0", "poor.r2_drop >= 0"]
    report, out, ctx = verify_models(tmp_path, models, task="tabular-regression", split=Split({"features": x}, y),
                                     monkeypatch=monkeypatch, gates=gates)
    assert report["task_kind"] == "regression" and report["metric_outputs"] == {"scores": "prediction"}
    assert report["task_metrics"] == ["mae", "rmse", "r2"]
    g, p = report["builds"]["good"], report["builds"]["poor"]
    for m, model in ((g, good), (p, poor)):
        pred = model.predict(x)
        assert m["mae"] == pytest.approx(skm.mean_absolute_error(y, pred), rel=1e-4)
        assert m["rmse"] == pytest.approx(np.sqrt(skm.mean_squared_error(y, pred)), rel=1e-4)
        assert m["r2"] == pytest.approx(skm.r2_score(y, pred), rel=1e-4)
        assert not any(k.startswith(("accuracy", "top5", "macro_f1", "top1")) for k in m)
    assert p["mae_increase"] == pytest.approx(p["mae"] - g["mae"]) and p["mae_increase"] > 0
    assert p["r2_drop"] == pytest.approx(g["r2"] - p["r2"]) and g["mae_increase"] == 0.0
    assert report["passed"] is True
    # deploy and the card read the task's headline metrics, not accuracy by name
    v = read_back(out, ctx)
    assert (v.task, v.task_kind, v.metric_outputs) == ("tabular-regression", "regression", {"scores": "prediction"})
    assert v.headline_metrics() == ["mae", "mae_increase"]
    assert v.reference_metric("mae") == g["mae"] and v.reference_metric("accuracy") is None
    assert v.verified_metrics("poor")["mae_increase"] == p["mae_increase"]
    # a regression gate that fails, and a classification gate that does not apply
    with pytest.raises(GateFailed, match="poor.mae_increase <= 0"):
        verify_models(tmp_path, models, task="tabular-regression", split=Split({"features": x}, y),
                      monkeypatch=monkeypatch, name="failing", gates=["poor.mae_increase <= 0"])
    with pytest.raises(InvalidInput, match="'accuracy'.*classification metric and task 'tabular-regression'") as err:
        verify_models(tmp_path, models, task="tabular-regression", split=Split({"features": x}, y),
                      monkeypatch=monkeypatch, name="refused", gates=["good.accuracy >= 0.5"])
    assert "mae_increase" in err.value.hint and "accuracy" not in err.value.hint


@pytest.mark.parametrize("task", ["object-detection", "image-classification"])
def test_a_detector_never_gets_an_accuracy(tmp_path, task):
    """The issue's case: a (N, 1, H, W) output on labelled digits must not be scored as a classifier,
    whether the recipe says generic or leaves the default image-classification task."""
    from onnx_models import detector_model

    models = {"fp32": detector_model(seed=0), "other": detector_model(seed=1)}
    ctx_data = dict(DATA)
    report, out, ctx = verify_models(tmp_path, models, task=task, data=ctx_data)
    assert report["eval_data"] == "held-out split" and report["task"] == task
    assert report["metric_outputs"] == {} and report["task_metrics"] == []
    for m in list(report["builds"].values()) + list(ctx.metrics["builds"].values()):
        assert not any(k.startswith(("accuracy", "top5", "macro_f1", "top1")) for k in m), m
        assert "exact_match" not in m and 0 < m["cosine"] <= 1
    v = read_back(out, ctx)
    assert v.reference_metric("accuracy") is None and "accuracy" not in v.verified_metrics("other")
    if task == "object-detection":
        assert v.headline_metrics() == []
    with pytest.raises(InvalidInput, match="'accuracy'") as err:
        verify_models(tmp_path, models, task=task, data=ctx_data, name="gated", gates=["other.accuracy >= 0.5"])
    assert "max_abs" in err.value.hint and "accuracy" not in err.value.hint


def test_inapplicable_gates_are_refused_with_the_reason(tmp_path, monkeypatch):
    from onnx_models import multi_io_feeds, multi_io_model
    from zoo_stages.lib.data.datasets import Split

    models = {"a": multi_io_model(seed=0)}
    split = Split(multi_io_feeds(8), np.zeros(8, dtype=np.int64))
    with pytest.raises(InvalidInput, match="more than 5 classes; the model's scores have 4"):
        verify_models(tmp_path, models, task="text-classification", name="top5", split=split,
                      monkeypatch=monkeypatch, gates=["a.top5_accuracy >= 0.5"])
    with pytest.raises(InvalidInput, match="needs labelled data"):
        verify_models(tmp_path, models, task="text-classification", name="nolabels", gates=["a.accuracy >= 0.5"])
    with pytest.raises(InvalidInput, match="top1_agreement.*task 'feature-extraction' is generic"):
        verify_models(tmp_path, models, task="feature-extraction", name="generic", gates=["a.top1_agreement >= 1"])


def test_a_preferred_metrics_output_must_fit(tmp_path):
    from onnx_models import multi_io_model

    report, _, _ = verify_models(tmp_path, {"a": multi_io_model(seed=0)}, task="text-classification",
                                 output="scores16")
    assert report["metric_outputs"] == {"scores": "scores16", "label": "label"}
    with pytest.raises(InvalidInput, match="'label' .* cannot be read as classification scores"):
        verify_models(tmp_path, {"a": multi_io_model(seed=0)}, task="text-classification", output="label",
                      name="bad")


def test_dynamic_dimensions_without_data_need_model_inputs(tmp_path):
    from onnx_models import sequence_model

    models = {"enc": sequence_model()}
    with pytest.raises(InvalidInput, match="model.inputs") as err:
        verify_models(tmp_path, models, task="feature-extraction")
    assert "ids" in str(err.value) and "model.inputs: {ids:" in err.value.hint
    declared = {"ids": {"shape": ["batch", 7], "dtype": "int64"}}
    report, out, _ = verify_models(tmp_path, models, task="feature-extraction", model_inputs=declared, name="ok")
    inputs, outputs = read_test_vectors(out["vectors"] / "enc" / "test_data_set_0")
    assert inputs["ids"].shape == (1, 7) and outputs["embedding"].shape == (1, 4)
    assert report["builds"]["enc"]["inputs"] == [{"name": "ids", "dtype": "int64", "shape": ["batch", "sequence"]}]
