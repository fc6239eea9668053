"""quantize on models other than single-input image classifiers: a tiny BERT (two int64 inputs,
plain and fused by optimize's transformer optimizer), a multi-input model with integer and bool
inputs, tasks without accuracy, and models whose weights are external data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from onnx_models import multi_io_feeds, multi_io_model
from test_quantize import DIGITS8, FAST, cnn, make_context, ops_of
from test_quantize import stand_in_clock  # noqa: F401 (the fixture `clock` reads)
from zoo.errors import InvalidInput
from zoo.pathsafety import external_data_files
from zoo.stage import Inputs, Upstream
from zoo_stages.lib.data import datasets
from zoo_stages.lib.onnx import onnx_io
from zoo_stages.lib.runtimes import onnx_run, ort_session
from zoo_stages.lib.quality.parity import compare
from zoo_stages.quantize import Quantize, QuantizeConfig

NPZ = {"source": "npz", "path": "features.npz"}  # stands for a data section with named arrays


def run_quantize(tmp_path, model_path, *, data=None, task="text-classification", inputs=None, name="run", **config):
    ctx = make_context(tmp_path, data, name)
    ctx.shared.update({"task": task, "model": {"inputs": inputs} if inputs else None})
    out = Quantize().run(Inputs([Upstream("optimize", "optimize", {"model": model_path}, {})]),
                         QuantizeConfig(**config), ctx)
    return out["model"], ctx


@pytest.fixture
def clock(request) -> dict:
    """tests/test_quantize.py's stand-in clock: each model's p50 given per kind of model."""
    return request.getfixturevalue("stand_in_clock")


@pytest.fixture
def named_split(monkeypatch):
    """Stand-in for a data section with several named arrays (npz, tables, text): `load_split`
    returns `features` (train: the first 3/4, val: the rest) with `labels`."""
    state: dict = {}

    def load_split(data, recipe_dir, split):
        features, labels = state["features"], state["labels"]
        n = len(labels)
        part = slice(0, 3 * n // 4) if split == "train" else slice(3 * n // 4, n)
        return datasets.Split({k: v[part] for k, v in features.items()}, labels[part])

    def use(features: dict, labels: np.ndarray) -> None:
        state.update(features=features, labels=labels)

    monkeypatch.setattr(datasets, "load_split", load_split)
    return use


# -- a tiny BERT ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bert(tmp_path_factory) -> dict[str, Path]:
    """The tiny BERT, plain and as optimize's transformer optimizer leaves it."""
    pytest.importorskip("transformers")
    from bert_models import export_tiny_bert
    from zoo_stages.lib.runtimes import transformer_fusion

    folder = tmp_path_factory.mktemp("bert")
    plain = export_tiny_bert(folder / "bert.onnx")
    fused, counts, _ = transformer_fusion.fuse(onnx_io.load_model(plain), model_type="bert", num_heads=0,
                                               hidden_size=0, opt_level=1)
    assert counts["Attention"] == 2
    return {"plain": plain, "fused": onnx_io.save_model(fused, folder / "fused.onnx")}


def _agreement(reference: Path, quantized: Path, feeds) -> float:
    ref = onnx_run.run(ort_session.make_session(reference), feeds)
    got = onnx_run.run(ort_session.make_session(quantized), feeds)
    return compare(ref, got).cosine


@pytest.mark.torch
@pytest.mark.parametrize("variant", ["plain", "fused"])
def test_dynamic_int8_quantizes_a_bert_plain_or_fused_without_data(tmp_path, bert, variant):
    from bert_models import INPUTS, token_features

    out, ctx = run_quantize(tmp_path, bert[variant], inputs=INPUTS, mode="dynamic",
                            latency={"warmup": 1, "runs": 3, "dynamic_size": 16})
    ops = ops_of(out)
    assert "DynamicQuantizeLinear" in ops and "MatMulInteger" in ops
    if variant == "fused":  # the fused attention's weights are quantized too
        assert "com.microsoft.QAttention" in ops and "com.microsoft.Attention" not in ops
    assert not external_data_files(out)
    m = ctx.metrics
    assert m["accuracy"] is None and m["task"] == "classification"  # no labels without data
    assert m["parity"]["samples"] == 8 and m["parity"]["cosine"] > 0.99  # random int64 feeds, by name
    assert _agreement(bert["plain"], out, token_features(8)) > 0.99


@pytest.mark.torch
def test_static_int8_calibrates_a_bert_on_two_named_inputs(tmp_path, bert, named_split):
    from bert_models import token_features

    features = token_features(48, seed=3)
    named_split(features, np.arange(48) % 3)
    out, ctx = run_quantize(tmp_path, bert["plain"], data=NPZ, mode="static", calibration={"samples": 16},
                            preprocess=False, **FAST)
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops_of(out)
    m = ctx.metrics
    assert m["accuracy"] is not None and m["fp32_accuracy"] is not None  # classification with labels
    assert m["parity"]["samples"] == 12 and m["parity"]["top1_agreement"] is not None
    assert _agreement(bert["plain"], out, {k: v[36:] for k, v in features.items()}) > 0.95


@pytest.mark.torch
def test_static_int8_refuses_fused_ops_and_auto_skips_to_dynamic(tmp_path, bert, named_split, clock):
    """Stand-in clock (tests/test_quantize.py): dynamic int8 at 4 ms against fp32 at 10 ms."""
    from bert_models import token_features

    named_split(token_features(32), np.arange(32) % 3)
    with pytest.raises(InvalidInput, match="com.microsoft.Attention") as err:
        run_quantize(tmp_path, bert["fused"], data=NPZ, mode="static")
    assert "mode: dynamic" in err.value.hint
    clock["dynamic"] = 4.0
    out, ctx = run_quantize(tmp_path, bert["fused"], name="auto", data=NPZ, mode="auto",
                            candidates=["static-qdq", "dynamic-qint8"], accept={"max_accuracy_drop": 0.5}, **FAST)
    rows = {r["name"]: r for r in ctx.metrics["candidates"]}
    assert "onnxruntime-specific" in rows["static-qdq"]["error"] and not rows["static-qdq"]["passed"]
    assert ctx.metrics["chosen"] == "dynamic-qint8" and "DynamicQuantizeLinear" in ops_of(out)


# -- multi-input models and tasks without accuracy ----------------------------------------------------


@pytest.fixture
def multi(tmp_path) -> Path:
    return onnx_io.save_model(multi_io_model(), tmp_path / "multi.onnx")


def test_a_multi_input_model_quantizes_dynamic_and_static_from_named_features(tmp_path, multi, named_split):
    out, ctx = run_quantize(tmp_path, multi, mode="dynamic", task="generic", **FAST)
    assert "MatMulInteger" in ops_of(out)
    assert ctx.metrics["accuracy"] is None and ctx.metrics["parity"]["cosine"] > 0.99
    feeds = multi_io_feeds(40)
    named_split(feeds, np.arange(40) % 4)
    out, ctx = run_quantize(tmp_path, multi, name="static", data=NPZ, mode="static", calibration={"samples": 20},
                            task="tabular-classification", **FAST)
    assert "QuantizeLinear" in ops_of(out)
    assert ctx.metrics["accuracy"] is not None  # of "probs", the first (samples, classes) float output
    assert ctx.metrics["parity"]["top1_agreement"] >= 0.9


@pytest.mark.parametrize("task", ["generic", "object-detection", "tabular-regression"])
def test_tasks_without_accuracy_are_judged_by_parity(tmp_path, task, clock):
    """Stand-in clock: static candidates 4 ms, dynamic 35 ms, fp32 10 ms."""
    small = onnx_io.save_model(cnn(), tmp_path / "small.onnx")
    out, ctx = run_quantize(tmp_path, small, data=DIGITS8, task=task, mode="auto",
                            candidates=["static-qdq", "dynamic-qint8"], accept={"min_cosine": 0.95}, **FAST)
    m = ctx.metrics
    assert m["accuracy"] is None and m["fp32_accuracy"] is None and m["accuracy_drop"] is None
    assert m["chosen"] == "static-qdq" and m["parity"]["cosine"] >= 0.95
    # a cosine nothing reaches fails every candidate, naming it
    with pytest.raises(Exception, match="no quantization candidate") as err:
        run_quantize(tmp_path, small, name="strict", data=DIGITS8, task=task, mode="auto",
                     candidates=["static-qdq"], accept={"min_cosine": 1.0}, **FAST)
    assert "cosine to fp32" in err.value.table


# -- external data ----------------------------------------------------------------------------------


def _save_external(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=path.name + ".data", size_threshold=0)
    return path


@pytest.mark.parametrize("ir_version", [13, 14], ids=["loadable", "ir-too-new"])
@pytest.mark.parametrize("mode", ["dynamic", "static"])
def test_a_model_with_external_data_quantizes_into_one_self_contained_file(tmp_path, mode, ir_version):
    model = cnn()
    model.ir_version = ir_version
    up = tmp_path / "up"
    up.mkdir()
    src = _save_external(model, up / "model.onnx")
    assert external_data_files(src) == ["model.onnx.data"]
    before = (src.read_bytes(), (up / "model.onnx.data").read_bytes())
    extra = {"calibration": {"samples": 8}} if mode == "static" else {}
    out, ctx = run_quantize(tmp_path, src, data=DIGITS8, task="image-classification", mode=mode, **extra, **FAST)
    assert external_data_files(out) == [] and sorted(p.name for p in out.parent.iterdir()) == ["model.onnx"]
    assert onnx.load(str(out)).ir_version <= onnx_io.MAX_IR_VERSION
    assert ctx.metrics["accuracy"] is not None
    # the upstream files (the cache's) are untouched
    assert (src.read_bytes(), (up / "model.onnx.data").read_bytes()) == before
    x = np.asarray(datasets.load_split(DIGITS8, tmp_path, "val").features["image"][:16])
    ref = onnx_run.run(ort_session.make_session(src), {"input": x})
    assert compare(ref, onnx_run.run(ort_session.make_session(out), {"input": x})).top1_agreement >= 0.9


def test_dynamic_int8_takes_a_model_with_onnxruntime_fused_ops(tmp_path):
    small = onnx_io.save_model(cnn(), tmp_path / "small.onnx")
    fused = tmp_path / "fused.onnx"
    ort_session.make_session(small, level="extended", optimized_path=fused)
    assert any(op.startswith("com.microsoft") for op in ops_of(fused))
    out, ctx = run_quantize(tmp_path, fused, data=DIGITS8, task="image-classification", mode="dynamic", **FAST)
    assert "DynamicQuantizeLinear" in ops_of(out)
    assert ctx.metrics["accuracy_drop"] is not None and ctx.metrics["parity"]["top1_agreement"] >= 0.9
