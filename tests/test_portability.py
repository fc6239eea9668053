"""Portable builds: standard operator domains (graph, subgraphs, local functions), the runtime a
build needs, and test vectors run under onnx's reference evaluator
(zoo_stages.lib.onnx.portability, zoo_stages.lib.onnx.reference_run). Small models built with onnx.helper."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_models import linear_model, multi_io_feeds, multi_io_model, numpy_logits, reshape_model
from zoo.errors import GateFailed, InvalidInput, StageFailed, UnsafePath
from zoo_stages.lib.onnx import portability, reference_run
from zoo_stages.lib.quality import parity
from zoo_stages.lib.runtimes import onnx_run, ort_session
from zoo_stages.lib.release.vectors import find_sets, write_test_vectors

IR = 10  # onnxruntime 1.32 loads IR <= 13, onnx 1.23 stamps 14


def _save(model: onnx.ModelProto, path: Path) -> Path:
    model.ir_version = IR
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def _model(nodes, inputs, outputs, initializers=(), *, opsets=(("", 17),), functions=()) -> onnx.ModelProto:
    graph = helper.make_graph(list(nodes), "g", list(inputs), list(outputs), list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets],
                              functions=list(functions))
    model.ir_version = IR
    return model


def _vi(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def _branch(name: str, node: onnx.NodeProto) -> onnx.GraphProto:
    return helper.make_graph([node], name, [], [_vi(node.output[0], ["N", 2])])


def _if_model(then_domain: str) -> onnx.ModelProto:
    """y = If(cond) then <a node of `then_domain`> else Relu(x): the domain only in a branch."""
    then_node = (helper.make_node("FusedGemm", ["x", "x"], ["t"], domain=then_domain) if then_domain
                 else helper.make_node("Neg", ["x"], ["t"]))
    nodes = [helper.make_node("If", ["cond"], ["y"], then_branch=_branch("then", then_node),
                              else_branch=_branch("else", helper.make_node("Relu", ["x"], ["e"])))]
    opsets = (("", 17),) + (((then_domain, 1),) if then_domain else ())
    return _model(nodes, [_vi("cond", [], TensorProto.BOOL), _vi("x", ["N", 2])], [_vi("y", ["N", 2])],
                  opsets=opsets)


def _function_model(body_domain: str) -> onnx.ModelProto:
    """z = AddTwice(x, y), a model-local function of domain "local.fn" whose body has an Add and a
    node of `body_domain` ("" for a standard Add)."""
    second = helper.make_node("Add" if not body_domain else "FusedAdd", ["t", "b"], ["c"], domain=body_domain)
    fn_opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(body_domain, 1)] if body_domain else [])
    fn = helper.make_function("local.fn", "AddTwice", ["a", "b"], ["c"],
                              [helper.make_node("Add", ["a", "b"], ["t"]), second], fn_opsets)
    opsets = (("", 17), ("local.fn", 1)) + (((body_domain, 1),) if body_domain else ())
    return _model([helper.make_node("AddTwice", ["x", "y"], ["z"], domain="local.fn")],
                  [_vi("x", ["N", 2]), _vi("y", ["N", 2])], [_vi("z", ["N", 2])], opsets=opsets, functions=[fn])


# -- domains ------------------------------------------------------------------------------------

def test_standard_domains_are_the_onnx_and_ml_operator_sets():
    assert portability.STANDARD_DOMAINS == {"", "ai.onnx", "ai.onnx.ml"}


@pytest.mark.parametrize("model, expected", [
    (linear_model(ir_version=IR), []),
    (_if_model(""), []),
    (_if_model("com.microsoft"), ["com.microsoft"]),
    (_function_model(""), []),
    (_function_model("com.microsoft"), ["com.microsoft"]),
    (_model([helper.make_node("Momentum", ["r", "t", "x", "g", "v"], ["x2", "v2"], domain="ai.onnx.preview.training",
                              alpha=0.9, beta=1.0, mode="standard", norm_coefficient=0.0)],
            [_vi("r", []), _vi("t", [], TensorProto.INT64), _vi("x", [2]), _vi("g", [2]), _vi("v", [2])],
            [_vi("x2", [2]), _vi("v2", [2])], opsets=(("", 17), ("ai.onnx.preview.training", 1))),
     ["ai.onnx.preview.training"]),
    (_model([helper.make_node("Binarizer", ["x"], ["y"], domain="ai.onnx.ml"),
             helper.make_node("FusedConv", ["y", "y"], ["z"], domain="com.microsoft"),
             helper.make_node("Dummy", ["z"], ["w"], domain="org.example")],
            [_vi("x", ["N", 2])], [_vi("w", ["N", 2])], opsets=(("", 17), ("ai.onnx.ml", 1), ("com.microsoft", 1),
                                                              ("org.example", 1))),
     ["com.microsoft", "org.example"]),
], ids=["standard", "if-standard", "if-com.microsoft", "function-standard", "function-com.microsoft",
        "preview-training", "ml-and-two-others"])
def test_nonstandard_domains_of_every_node(model, expected, tmp_path):
    assert portability.nonstandard_domains(model) == expected
    assert portability.nonstandard_domains(_save(model, tmp_path / "m.onnx")) == expected  # from a file too


def test_a_local_function_runs_under_both_runtimes(tmp_path):
    """A node calling a local function is standard ONNX: onnxruntime and the reference evaluator
    both inline it (so the domain check's view of functions is theirs)."""
    path = _save(_function_model(""), tmp_path / "fn.onnx")
    onnx.checker.check_model(str(path), full_check=True)
    feeds = {"x": np.arange(6, dtype=np.float32).reshape(3, 2), "y": np.ones((3, 2), np.float32)}
    got = reference_run.run_reference(path, feeds)
    want = onnx_run.run(ort_session.make_session(path), feeds)
    np.testing.assert_array_equal(got["z"], want["z"])
    np.testing.assert_array_equal(got["z"], feeds["x"] + 2)


def test_domains_are_read_without_loading_external_data(tmp_path, monkeypatch):
    model = linear_model(ir_version=IR)
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path), save_as_external_data=True, location="m.onnx.data", size_threshold=0)
    import onnx.external_data_helper as edh

    def refuse(*args, **kwargs):
        raise AssertionError("external data loaded")
    monkeypatch.setattr(edh, "load_external_data_for_model", refuse)
    assert portability.nonstandard_domains(path) == []


# -- runtime -------------------------------------------------------------------------------------

def test_runtime_requirement(tmp_path):
    major, minor = onnxruntime.__version__.split(".")[:2]
    ort = f"onnxruntime>={major}.{minor}"
    assert portability.onnxruntime_requirement() == ort
    assert portability.runtime_requirement(_save(linear_model(), tmp_path / "a.onnx")) == "onnx"
    assert portability.runtime_requirement(_save(_if_model("com.microsoft"), tmp_path / "b.onnx")) == ort
    (tmp_path / "c.ort").write_bytes(b"\x00")  # only onnxruntime reads the ORT format, whatever it holds
    assert portability.runtime_requirement(tmp_path / "c.ort") == ort


# -- running under the reference evaluator ---------------------------------------------------------

def test_reference_session_shows_ports_like_onnxruntime(tmp_path):
    """The adapter's inputs and outputs read as onnxruntime's do (names, type strings, shapes), so
    onnx_run treats both alike; an initializer listed as an input is not an input to feed."""
    model = multi_io_model()
    model.graph.input.append(_vi("W", [5, 4]))  # W is also an initializer: an overridable default
    path = _save(model, tmp_path / "m.onnx")
    ref = reference_run.reference_session(path)
    ort = ort_session.make_session(path)
    for mine, theirs in ((ref.get_inputs(), ort.get_inputs()), (ref.get_outputs(), ort.get_outputs())):
        assert [(p.name, p.type, list(p.shape)) for p in mine] == [(p.name, p.type, list(p.shape)) for p in theirs]


def test_run_reference_equals_onnxruntime(tmp_path):
    path = _save(multi_io_model(), tmp_path / "m.onnx")
    feeds = multi_io_feeds(7)
    want = onnx_run.run(ort_session.make_session(path), feeds)
    got = reference_run.run_reference(path, feeds, batch_size=None)  # "total" has no batch axis: one run
    report = parity.compare(want, got, tolerance=reference_run.DEFAULT_TOLERANCE)
    assert report.passed, report.table()
    assert set(got) == {"probs", "scores16", "label", "total"}


def test_run_reference_in_batches(tmp_path):
    model = linear_model(ir_version=IR)
    path = _save(model, tmp_path / "m.onnx")
    x = np.random.default_rng(0).random((10, 1, 4, 4), dtype=np.float32)
    got = reference_run.run_reference(path, {"input": x}, batch_size=3)
    np.testing.assert_allclose(got["logits"], numpy_logits(model, x), rtol=1e-5, atol=1e-5)


def _fixed_batch_model(batch: int = 4) -> onnx.ModelProto:
    """(4, 1, 4, 4) -> Reshape to exactly (4, 16) -> Gemm: right only when fed 4 samples at a time."""
    model = linear_model(batch=batch, ir_version=IR)
    flatten = model.graph.node[0]
    model.graph.node.remove(flatten)
    model.graph.node.insert(0, helper.make_node("Reshape", ["input", "shape"], ["flat"]))
    model.graph.initializer.append(numpy_helper.from_array(np.array([batch, 16], np.int64), "shape"))
    return model


def test_fixed_batch_is_padded(tmp_path):
    model = _fixed_batch_model(4)
    path = _save(model, tmp_path / "m.onnx")
    x = np.random.default_rng(0).random((6, 1, 4, 4), dtype=np.float32)  # a batch of 4, then 2 padded to 4
    got = reference_run.run_reference(path, {"input": x}, batch_size=100)
    assert got["logits"].shape == (6, 3)
    np.testing.assert_allclose(got["logits"], numpy_logits(model, x), rtol=1e-5, atol=1e-5)


def test_a_failure_names_the_reference_evaluator(tmp_path):
    path = _save(reshape_model(), tmp_path / "m.onnx")
    with pytest.raises(StageFailed) as failed:
        reference_run.run_reference(path, {"x": np.ones((2, 4), np.float32)})  # 8 values cannot be (-1, 3)
    assert str(failed.value).startswith("onnx's reference evaluator failed running m.onnx: ")  # not onnxruntime's


def _external_model(tmp_path: Path, location: str) -> Path:
    """linear_model with its weights in external data at `location` (relative to the model)."""
    folder = tmp_path / "build"
    folder.mkdir()
    model = linear_model(ir_version=IR)
    onnx.save(model, str(folder / "model.onnx"), save_as_external_data=True, location="w.bin", size_threshold=0)
    if location != "w.bin":
        target = (folder / location).resolve()
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(folder / "w.bin", target)
        m = onnx.load(str(folder / "model.onnx"), load_external_data=False)
        for tensor in m.graph.initializer:
            for entry in tensor.external_data:
                if entry.key == "location":
                    entry.value = location
        onnx.save(m, str(folder / "model.onnx"))
    return folder / "model.onnx"


def test_external_data_in_the_folder_is_loaded(tmp_path):
    path = _external_model(tmp_path, "w.bin")
    x = np.random.default_rng(0).random((2, 1, 4, 4), dtype=np.float32)
    got = reference_run.run_reference(path, {"input": x})
    np.testing.assert_allclose(got["logits"], numpy_logits(linear_model(), x), rtol=1e-5, atol=1e-5)


def test_external_data_outside_the_folder_is_refused(tmp_path):
    path = _external_model(tmp_path, "../outside/w.bin")
    x = np.zeros((1, 1, 4, 4), np.float32)
    with pytest.raises(UnsafePath):
        reference_run.run_reference(path, {"input": x})
    with pytest.raises(UnsafePath):
        portability.nonstandard_domains(path)
    set_dir = write_test_vectors(tmp_path / "test_data_set_0", {"input": x}, {"logits": np.zeros((1, 3), np.float32)})
    with pytest.raises(UnsafePath):
        reference_run.check_vectors(path, [set_dir], quantized=False)


# -- test vectors --------------------------------------------------------------------------------

def _with_vectors(tmp_path: Path, model: onnx.ModelProto, feeds_per_set: list[dict]) -> tuple[Path, list[Path]]:
    """The model saved under tmp_path/build with test_data_set_N holding onnxruntime's outputs."""
    path = _save(model, tmp_path / "build" / "model.onnx")
    session = ort_session.make_session(path)
    for n, feeds in enumerate(feeds_per_set):
        write_test_vectors(path.parent / f"test_data_set_{n}", feeds, onnx_run.run(session, feeds))
    return path, find_sets(path.parent)


def _tamper(set_dir: Path, index: int, change) -> None:
    f = set_dir / f"output_{index}.pb"
    proto = onnx.TensorProto.FromString(f.read_bytes())
    f.write_bytes(numpy_helper.from_array(change(numpy_helper.to_array(proto).copy()), proto.name).SerializeToString())


def _image_sets(n: int, samples: int = 4) -> list[dict]:
    rng = np.random.default_rng(3)
    return [{"input": rng.random((samples, 1, 4, 4), dtype=np.float32)} for _ in range(n)]


def test_vectors_pass_under_the_reference_evaluator(tmp_path):
    path, sets = _with_vectors(tmp_path, linear_model(ir_version=IR), _image_sets(2))
    check = reference_run.check_vectors(path, sets, quantized=False)
    assert check.passed, check.detail
    assert (check.sets, check.samples) == (2, 8)
    assert check.max_abs < 1e-5
    check.require("build cpu-fp32")  # does not raise


def test_a_tampered_float_output_fails_naming_set_and_output(tmp_path):
    path, sets = _with_vectors(tmp_path, linear_model(ir_version=IR), _image_sets(2))

    def nudge(a):
        a[1, 2] += 0.5
        return a
    _tamper(sets[1], 0, nudge)
    check = reference_run.check_vectors(path, sets, quantized=False)
    assert not check.passed and check.error is None
    assert "test_data_set_1" in check.detail and "'logits'" in check.detail
    assert check.max_abs == pytest.approx(0.5, rel=1e-4)
    with pytest.raises(GateFailed, match="test_data_set_1.*'logits'"):
        check.require("build cpu-fp32")


def test_integer_outputs_must_match_exactly(tmp_path):
    path, sets = _with_vectors(tmp_path, multi_io_model(), [multi_io_feeds(6)])
    assert reference_run.check_vectors(path, sets, quantized=False, batch_size=None).passed
    labels = [f.name for f in sorted(sets[0].iterdir()) if f.name.startswith("output_")]
    _tamper(sets[0], 2, lambda a: (a + 1) % 4)  # output_2 is "label"
    assert "output_2.pb" in labels
    check = reference_run.check_vectors(path, sets, quantized=False, batch_size=None)
    assert not check.passed
    assert "'label'" in check.detail and "6/6 elements differ" in check.detail


def _qdq_model(opset: int = 13) -> onnx.ModelProto:
    """A QDQ MatMul as onnxruntime's quantizer writes it at opset 13: the input quantized per
    tensor to int8, the weight int8 per output column (axis 1), then a float MatMul."""
    rng = np.random.default_rng(0)
    w = rng.normal(0, 1, (16, 3)).astype(np.float32)
    w_scale = (np.abs(w).max(axis=0) / 127).astype(np.float32)
    w_q = np.clip(np.round(w / w_scale), -127, 127).astype(np.int8)
    nodes = [
        helper.make_node("Flatten", ["input"], ["flat"], axis=1),
        helper.make_node("QuantizeLinear", ["flat", "x_scale", "x_zero"], ["flat_q"]),
        helper.make_node("DequantizeLinear", ["flat_q", "x_scale", "x_zero"], ["flat_dq"]),
        helper.make_node("DequantizeLinear", ["W_q", "w_scale", "w_zero"], ["W"], axis=1),
        helper.make_node("MatMul", ["flat_dq", "W"], ["logits"]),
    ]
    inits = [numpy_helper.from_array(np.float32(1 / 127), "x_scale"), numpy_helper.from_array(np.int8(0), "x_zero"),
             numpy_helper.from_array(w_q, "W_q"), numpy_helper.from_array(w_scale, "w_scale"),
             numpy_helper.from_array(np.zeros(3, np.int8), "w_zero")]
    return _model(nodes, [_vi("input", ["N", 1, 4, 4])], [_vi("logits", ["N", 3])], inits, opsets=(("", opset),))


def test_a_qdq_model_below_opset_19_runs_and_passes(tmp_path):
    """onnx's evaluator has DequantizeLinear kernels from opset 19 only; at opset 13 (what
    onnxruntime's quantizer writes) opset 19's kernel computes it, per axis too."""
    model = _qdq_model(13)
    path, sets = _with_vectors(tmp_path, model, _image_sets(1))
    check = reference_run.check_vectors(path, sets, quantized=True)
    assert check.passed, check.detail
    x = _image_sets(1)[0]["input"]
    w = numpy_helper.to_array(model.graph.initializer[2]).astype(np.float32) * \
        numpy_helper.to_array(model.graph.initializer[3])
    want = (np.round(x.reshape(len(x), -1) * 127) / 127) @ w
    got = reference_run.run_reference(path, {"input": x})["logits"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_quantized_outputs_are_judged_by_the_quantized_bar(tmp_path):
    """int8 kernels and the evaluator's float arithmetic may differ by a quantization step: a
    quantized model's outputs outside the float tolerance still pass at mean cosine >= 0.99, and
    fail below it, naming the output."""
    path, sets = _with_vectors(tmp_path, _qdq_model(13), _image_sets(1, samples=8))
    noise = np.random.default_rng(1)
    _tamper(sets[0], 0, lambda a: a + noise.normal(0, 0.01, a.shape).astype(a.dtype) * np.abs(a).max())
    assert not reference_run.check_vectors(path, sets, quantized=False).passed
    check = reference_run.check_vectors(path, sets, quantized=True)
    assert check.passed, check.detail
    _tamper(sets[0], 0, lambda a: -a)
    check = reference_run.check_vectors(path, sets, quantized=True)
    assert not check.passed
    assert "test_data_set_0" in check.detail and "'logits'" in check.detail and "cosine" in check.detail


def test_a_model_the_evaluator_cannot_run_is_recorded(tmp_path):
    model = _if_model("com.microsoft")
    path = _save(model, tmp_path / "build" / "model.onnx")
    set_dir = write_test_vectors(path.parent / "test_data_set_0",
                                 {"cond": np.array(True), "x": np.ones((2, 2), np.float32)},
                                 {"y": np.ones((2, 2), np.float32)})
    check = reference_run.check_vectors(path, [set_dir], quantized=False)
    assert not check.passed and check.error is not None and "FusedGemm" in check.error
    with pytest.raises(StageFailed, match="reference evaluator"):
        check.require()


def test_vectors_of_another_model_are_invalid_input(tmp_path):
    path = _save(linear_model(), tmp_path / "m.onnx")
    x = np.zeros((1, 1, 4, 4), np.float32)
    set_dir = write_test_vectors(tmp_path / "test_data_set_0", {"input": x}, {"scores": np.zeros((1, 3), np.float32)})
    with pytest.raises(InvalidInput, match="'scores', which the model m.onnx does not have"):
        reference_run.check_vectors(path, [set_dir], quantized=False)


def test_no_vectors_is_not_a_pass(tmp_path):
    path = _save(linear_model(), tmp_path / "m.onnx")
    check = reference_run.check_vectors(path, [], quantized=False)
    assert not check.passed and "no test vectors" in check.detail


# -- the report -----------------------------------------------------------------------------------

def test_a_portable_build(tmp_path):
    path, sets = _with_vectors(tmp_path, linear_model(ir_version=IR), _image_sets(1))
    report = portability.assess(path, sets, scratch=tmp_path / "scratch")
    assert report.portable and report.runtime == "onnx", report.reason
    record = report.to_json()
    assert record["portable"] is True and record["reference"]["passed"] is True


def test_nonstandard_domains_are_not_portable(tmp_path):
    path = _save(_if_model("com.microsoft"), tmp_path / "m.onnx")
    report = portability.assess(path, [], scratch=tmp_path / "scratch")
    assert not report.portable
    assert report.nonstandard_domains == ("com.microsoft",) and report.reference is None
    assert "com.microsoft" in report.reason
    assert report.runtime == portability.onnxruntime_requirement()


def test_a_build_the_checker_refuses_is_not_portable(tmp_path):
    model = linear_model(ir_version=IR)
    model.graph.node.reverse()  # Gemm before the Flatten that makes its input: not topologically sorted
    path = _save(model, tmp_path / "m.onnx")
    report = portability.assess(path, [], scratch=tmp_path / "scratch")
    assert not report.portable and not report.checker_passed and report.reference is None
    assert "onnx.checker" in report.reason and "topologically sorted" in report.reason


def test_tampered_vectors_are_not_portable(tmp_path):
    path, sets = _with_vectors(tmp_path, linear_model(ir_version=IR), _image_sets(1))
    _tamper(sets[0], 0, lambda a: a * 2)
    report = portability.assess(path, sets, scratch=tmp_path / "scratch")
    assert report.standard_domains and report.checker_passed and not report.portable
    assert "test_data_set_0" in report.reason and "'logits'" in report.reason


def test_ort_format_is_not_portable(tmp_path):
    (tmp_path / "model.ort").write_bytes(b"\x00")
    report = portability.assess(tmp_path / "model.ort", [], scratch=tmp_path / "scratch")
    assert not report.portable and report.format == "ort" and "only onnxruntime" in report.reason
