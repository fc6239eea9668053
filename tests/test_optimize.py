"""Tests of the `optimize` kind: levels, simplifiers, parity gate, determinism."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pydantic
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_models import multi_io_feeds, multi_io_model
from zoo.errors import GateFailed, InvalidInput
from zoo.stage import Inputs, RecipeInfo, StageContext, Upstream
from zoo_stages import optimize as optimize_mod
from zoo_stages.lib.onnx import onnx_io
from zoo_stages.lib.runtimes import onnx_run, ort_session
from zoo_stages.lib.quality.parity import Tolerance, compare
from zoo_stages.optimize import Optimize, OptimizeConfig, check_parity


def conv_classifier(seed: int = 0) -> onnx.ModelProto:
    """Conv+Relu+Gemm on (N,1,8,8), plus nodes a simplifier can remove (Identity, foldable Add)."""
    rng = np.random.default_rng(seed)
    inits = {
        "W": rng.normal(0, 0.5, (4, 1, 3, 3)), "B": rng.normal(0, 0.1, (4,)),
        "G": rng.normal(0, 0.2, (10, 4 * 8 * 8)), "GB0": rng.normal(0, 0.1, (10,)), "GB1": rng.normal(0, 0.1, (10,)),
    }
    nodes = [
        helper.make_node("Identity", ["input"], ["x"]),
        helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Flatten", ["r"], ["f"], axis=1),
        helper.make_node("Add", ["GB0", "GB1"], ["GB"]),  # constant subgraph: folded by every optimizer
        helper.make_node("Gemm", ["f", "G", "GB"], ["logits"], transB=1),
    ]
    graph = helper.make_graph(
        nodes, "conv_classifier",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 1, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 13
    return model


def make_context(tmp_path: Path, name: str = "run", shared: dict | None = None) -> StageContext:
    base = tmp_path / name
    recipe = RecipeInfo(name="t", version="0.1.0", description="", license="", path=tmp_path / "recipe.yaml", digest="")
    (base / "out").mkdir(parents=True)
    return StageContext(stage_id="optimize", out_dir=base / "out", work_dir=base / "work", recipe=recipe,
                        shared=shared if shared is not None else {"model": None}, matrix={})


def upstream(path: Path, stage_id: str = "export") -> Inputs:
    return Inputs([Upstream(stage_id=stage_id, kind="export", outputs={"model": path}, metrics={})])


def _run(model, x, level: str = "all"):
    """The model's first output on `x`."""
    return next(iter(onnx_run.run(ort_session.make_session(model, level=level), {"input": x}).values()))


@pytest.fixture
def model_path(tmp_path) -> Path:
    return onnx_io.save_model(conv_classifier(), tmp_path / "input.onnx")


def run_optimize(tmp_path, model_path, name="run", shared=None, **config):
    ctx = make_context(tmp_path, name, shared)
    out = Optimize().run(upstream(model_path), OptimizeConfig(**config), ctx)
    return out["model"], ctx


@pytest.mark.parametrize("level,domain", [("basic", None), ("extended", "com.microsoft"),
                                          ("all", "com.microsoft.nchwc")])
def test_each_level_keeps_parity_and_records_domains(tmp_path, model_path, level, domain):
    out, ctx = run_optimize(tmp_path, model_path, level=level)
    assert out == ctx.out_dir.resolve() / "model.onnx"
    model = onnx.load(str(out))
    assert model.ir_version <= 13
    m = ctx.metrics
    assert m["level"] == level and m["parity"]["max_abs"] <= 1e-4
    assert m["nodes_after"] < m["nodes_before"]  # Identity and the constant Add are gone at every level
    if domain is None:
        assert m["custom_domains"] == [] and not m["host_specific"]
    else:
        assert domain in m["custom_domains"]
    assert m["host_specific"] == (level == "all")
    # only the domains actually used stay imported (onnxruntime declares a dozen)
    assert {o.domain for o in model.opset_import} == {""} | set(m["custom_domains"])
    x = np.random.default_rng(5).random((3, 1, 8, 8), dtype=np.float32)
    ref = _run(model_path, x, level="disable")
    np.testing.assert_allclose(_run(out, x), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("level", ["basic", "all"])
def test_same_input_gives_same_bytes(tmp_path, model_path, level):
    a, _ = run_optimize(tmp_path, model_path, name="a", level=level)
    b, _ = run_optimize(tmp_path, model_path, name="b", level=level)
    assert a.read_bytes() == b.read_bytes()


@pytest.mark.parametrize("tool", ["onnxsim", "onnxoptimizer"])
def test_simplifiers_run_and_keep_parity(tmp_path, model_path, tool):
    out, ctx = run_optimize(tmp_path, model_path, simplify=tool, level="basic")
    assert ctx.metrics["simplify"] == tool
    ops = ctx.metrics["ops_after"]
    assert "Identity" not in ops and "Add" not in ops
    assert ctx.metrics["parity"]["outputs"]["logits"]["passed"]
    again, _ = run_optimize(tmp_path, model_path, name="again", simplify=tool, level="basic")
    assert out.read_bytes() == again.read_bytes()


@pytest.mark.torch
def test_simplifiers_on_a_torch_exported_model(tmp_path):
    import torch

    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(1, 6, 3, padding=1), torch.nn.BatchNorm2d(6), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(6 * 4 * 4, 10)).eval()
    path = tmp_path / "torch.onnx"
    torch.onnx.export(net, torch.zeros(1, 1, 8, 8), str(path), dynamo=False, input_names=["input"],
                      output_names=["logits"], dynamic_axes={"input": {0: "N"}, "logits": {0: "N"}})
    for tool in ("onnxsim", "onnxoptimizer"):
        out, ctx = run_optimize(tmp_path, path, name=tool, simplify=tool, level="extended")
        assert ctx.metrics["parity"]["max_abs"] <= 1e-4
        assert onnx.load(str(out)).ir_version <= 13


def test_parity_failure_raises_a_table():
    ref = conv_classifier(seed=0)
    other = conv_classifier(seed=1)
    with pytest.raises(GateFailed) as err:
        check_parity(ref, other, optimize_mod.ParityConfig(samples=3))
    table = err.value.table
    assert "logits" in table and "max_abs" in table and "max_rel" in table and "FAIL" in table


def test_parity_covers_every_output_of_a_multi_input_model_integer_ones_exactly():
    same = check_parity(multi_io_model(), multi_io_model(), optimize_mod.ParityConfig(samples=4))
    assert same["passed"] and set(same["outputs"]) == {"probs", "scores16", "label", "total"}
    assert same["outputs"]["label"]["exact"] and same["samples"] == 4 and same["seed"] == 0
    with pytest.raises(GateFailed) as err:
        check_parity(multi_io_model(), multi_io_model(seed=1), optimize_mod.ParityConfig(samples=4))
    assert "label" in err.value.table and "exact" in err.value.table


def test_a_simplifier_that_changes_numerics_fails_the_stage(tmp_path, model_path, monkeypatch):
    def perturbing(model, tool):
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        for t in copy.graph.initializer:
            if t.name == "G":
                t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t) * 1.01, "G"))
        return copy

    monkeypatch.setattr(optimize_mod, "simplify", perturbing)
    with pytest.raises(GateFailed, match="beyond tolerance") as err:
        run_optimize(tmp_path, model_path, simplify="onnxsim")
    assert "FAIL" in err.value.table
    # a wide enough tolerance accepts the same drift
    run_optimize(tmp_path, model_path, name="wide", simplify="onnxsim", parity={"atol": 1.0, "rtol": 1.0})


def test_model_from_picks_the_named_upstream(tmp_path, model_path):
    other = onnx_io.save_model(conv_classifier(seed=3), tmp_path / "other.onnx")
    inputs = Inputs([Upstream("export", "export", {"model": model_path}, {}),
                     Upstream("train2", "export", {"model": other}, {})])
    ctx = make_context(tmp_path)
    with pytest.raises(InvalidInput, match="several"):
        Optimize().run(inputs, OptimizeConfig(), ctx)
    out = Optimize().run(inputs, OptimizeConfig(model_from="train2"), make_context(tmp_path, "b"))["model"]
    x = np.ones((1, 1, 8, 8), dtype=np.float32)
    np.testing.assert_allclose(_run(out, x), _run(other, x), rtol=1e-5, atol=1e-5)


def test_config_validation():
    with pytest.raises(pydantic.ValidationError):
        OptimizeConfig(level="max")
    with pytest.raises(pydantic.ValidationError):
        OptimizeConfig(simplify="magic")
    with pytest.raises(pydantic.ValidationError):
        OptimizeConfig(parity={"samples": 0})
    with pytest.raises(pydantic.ValidationError):
        OptimizeConfig(unknown=1)


def test_unavailable_execution_provider_is_a_clear_error(tmp_path, model_path):
    with pytest.raises(InvalidInput, match="CUDAExecutionProvider"):
        run_optimize(tmp_path, model_path, execution_provider="CUDAExecutionProvider")


def test_dynamic_spatial_dims_need_input_shapes_or_declared_inputs(tmp_path):
    model = conv_classifier()
    dims = model.graph.input[0].type.tensor_type.shape.dim
    dims[2].dim_param, dims[3].dim_param = "H", "W"
    path = onnx_io.save_model(model, tmp_path / "dyn.onnx")
    with pytest.raises(InvalidInput, match="dynamic dimensions") as err:
        run_optimize(tmp_path, path)
    assert "input_shapes" in err.value.hint and "model.inputs" in err.value.hint
    _, ctx = run_optimize(tmp_path, path, name="shaped", input_shapes={"input": [2, 1, 8, 8]})
    assert ctx.metrics["parity"]["outputs"]["logits"]["passed"] and ctx.metrics["parity"]["samples"] == 8
    # the recipe's model.inputs: named dims take parity.dynamic_size (8 here, what the Gemm needs)
    declared = {"input": {"shape": ["batch", 1, "H", "W"], "dtype": "float32"}}
    _, ctx = run_optimize(tmp_path, path, name="declared", shared={"model": {"inputs": declared}})
    assert ctx.metrics["parity"]["passed"]
    with pytest.raises(Exception, match="Gemm|onnxruntime failed"):  # 4x4 images do not fit the classifier
        run_optimize(tmp_path, path, name="small", shared={"model": {"inputs": declared}},
                     parity={"dynamic_size": 4})
    with pytest.raises(InvalidInput, match="'image'"):
        run_optimize(tmp_path, path, name="unknown", input_shapes={"image": [1, 1, 8, 8]})


def test_input_shapes_need_one_batch_size():
    with pytest.raises(pydantic.ValidationError, match="same batch size"):
        OptimizeConfig(input_shapes={"a": [1, 4], "b": [2, 4]})
    with pytest.raises(pydantic.ValidationError):
        OptimizeConfig(input_shapes={"a": [0, 4]})


def test_a_multi_input_model_with_integer_and_bool_inputs_is_optimized_and_parity_checked(tmp_path):
    path = onnx_io.save_model(multi_io_model(), tmp_path / "multi.onnx")
    out, ctx = run_optimize(tmp_path, path, level="extended")
    parity = ctx.metrics["parity"]
    assert parity["passed"] and set(parity["outputs"]) == {"probs", "scores16", "label", "total"}
    feeds = multi_io_feeds(5)
    ref = onnx_run.run(ort_session.make_session(path, level="disable"), feeds)
    got = onnx_run.run(ort_session.make_session(out), feeds)
    assert compare(ref, got, tolerance=Tolerance(atol=1e-5, rtol=1e-4)).passed


# -- transformer fusions (a tiny Hugging Face BERT) ----------------------------------------------


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory) -> Path:
    pytest.importorskip("transformers")
    from bert_models import export_tiny_bert

    return export_tiny_bert(tmp_path_factory.mktemp("bert") / "bert.onnx")


@pytest.mark.torch
def test_the_transformer_optimizer_fuses_attention_keeps_parity_and_is_deterministic(tmp_path, tiny_bert):
    from bert_models import INPUTS, token_features

    shared = {"model": {"inputs": INPUTS}}
    out, ctx = run_optimize(tmp_path, tiny_bert, name="a", shared=shared, transformer={"model_type": "bert"})
    m = ctx.metrics
    assert m["fused"]["Attention"] == 2 and m["fused"]["SkipLayerNormalization"] > 0
    assert m["transformer"]["num_heads_used"] == 2 and m["transformer"]["hidden_size_used"] == 64  # detected
    assert "com.microsoft" in m["custom_domains"] and m["ops_after"]["com.microsoft.Attention"] == 2
    # parity fed both int64 inputs, random 0/1 masks included (the raw mask keeps their meaning)
    assert m["parity"]["passed"] and m["parity"]["outputs"]["logits"]["max_abs"] <= 1e-4
    assert onnx.load(str(out)).ir_version <= onnx_io.MAX_IR_VERSION
    feeds = token_features(6)
    ref = onnx_run.run(ort_session.make_session(tiny_bert, level="disable"), feeds)
    assert compare(ref, onnx_run.run(ort_session.make_session(out), feeds),
                   tolerance=Tolerance(atol=1e-4, rtol=1e-3)).passed
    again, _ = run_optimize(tmp_path, tiny_bert, name="b", shared=shared, transformer={"model_type": "bert"})
    assert again.read_bytes() == out.read_bytes()


@pytest.mark.torch
def test_transformer_parity_inputs_from_input_shapes_and_tolerances(tmp_path, tiny_bert):
    shapes = {"input_ids": [2, 12], "attention_mask": [2, 12]}
    _, ctx = run_optimize(tmp_path, tiny_bert, input_shapes=shapes, transformer={"num_heads": 2, "hidden_size": 64},
                          parity={"samples": 2, "atol": 1e-3, "rtol": 0})
    assert ctx.metrics["fused"]["Attention"] == 2
    assert ctx.metrics["parity"]["outputs"]["logits"]["shape"] == [4, 3]
    assert ctx.metrics["parity"]["outputs"]["logits"]["atol"] == 1e-3
    with pytest.raises(InvalidInput, match="dynamic dimensions"):  # no shapes for the sequence axis
        run_optimize(tmp_path, tiny_bert, name="unshaped", transformer={})
    with pytest.raises(InvalidInput, match="model_type"):
        run_optimize(tmp_path, tiny_bert, name="bad", input_shapes=shapes, transformer={"model_type": "nosuch"})


@pytest.mark.torch
def test_attention_shape_is_read_from_the_graph(tiny_bert):
    from zoo_stages.lib.runtimes.transformer_fusion import attention_shape

    assert attention_shape(onnx.load(str(tiny_bert))) == (2, 64)
    assert attention_shape(conv_classifier()) == (0, 0)  # no attention: onnxruntime is left to decide


def test_transformer_config_validation():
    assert OptimizeConfig(transformer={}).transformer.opt_level == 1
    with pytest.raises(pydantic.ValidationError):
        OptimizeConfig(transformer={"opt_level": 3})
    with pytest.raises(pydantic.ValidationError):
        OptimizeConfig(transformer={"num_heads": -1})
