"""Tests of zoo_stages.lib.runtimes.ort_session: the one session builder, and the one error every caller
gives for a model onnxruntime cannot load."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from onnx_models import linear_model, numpy_logits, unknown_op_model
from zoo.errors import ExitCode, InvalidInput
from zoo_stages.lib.runtimes import onnx_run, ort_session


def test_every_session_is_sequential_and_deterministic_with_the_requested_threads_and_level():
    sess = ort_session.make_session(linear_model(), threads=2, level="basic")
    opts = sess.get_session_options()
    assert opts.intra_op_num_threads == 2 and opts.inter_op_num_threads == 1
    assert opts.use_deterministic_compute is True
    assert opts.execution_mode == ort.ExecutionMode.ORT_SEQUENTIAL
    assert opts.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    assert ort_session.make_session(linear_model(), level="disable").get_session_options().graph_optimization_level \
        == ort.GraphOptimizationLevel.ORT_DISABLE_ALL


def test_options_refuse_unknown_levels_providers_and_thread_counts():
    with pytest.raises(InvalidInput, match="not available"):
        ort_session.make_session(linear_model(), providers=["NoSuchExecutionProvider"])
    with pytest.raises(InvalidInput, match="level"):
        ort_session.make_session(linear_model(), level="turbo")
    with pytest.raises(InvalidInput, match="at least 1"):
        ort_session.make_session(linear_model(), threads=0)


def test_runtime_optimizations_and_the_optimized_model_path_are_set(tmp_path):
    opts = ort_session.session_options(runtime_optimizations=True, optimized_path=tmp_path / "o.onnx")
    assert opts.get_session_config_entry("session.enable_saved_runtime_optimizations") == "1"
    assert opts.optimized_model_filepath == str(tmp_path / "o.onnx")
    ort_session.make_session(linear_model(), level="basic", optimized_path=tmp_path / "o.onnx")
    assert (tmp_path / "o.onnx").is_file()


@pytest.mark.parametrize("form", ["proto", "bytes", "path", "path-ir14"])
def test_a_model_opens_from_a_proto_bytes_or_a_path(tmp_path, form):
    model = linear_model(ir_version=14 if form == "path-ir14" else 13)
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    given = {"proto": model, "bytes": model.SerializeToString()}.get(form, path)
    x = np.random.default_rng(0).random((3, 1, 4, 4), dtype=np.float32)
    out = onnx_run.run(ort_session.make_session(given), {"input": x})["logits"]
    np.testing.assert_allclose(out, numpy_logits(model, x), rtol=1e-5, atol=1e-5)


def _unloadable(tmp_path, what: str):
    if what == "unknown operator":
        path = tmp_path / "unknown.onnx"
        path.write_bytes(unknown_op_model().SerializeToString())
    elif what == "damaged .ort file":
        path = tmp_path / "damaged.ort"
        path.write_bytes(b"\x00" * 4 + b"ORTM" + b"\xff" * 64)
    else:
        path = tmp_path / "missing.ort"
    return path


def _export_smoke_run(path):
    from zoo_stages.export import ExportConfig, _smoke_run

    return _smoke_run(path, ExportConfig(), threads=1, declared=None)


def _conversion_parity(path):
    import logging

    from zoo_stages.lib.quality.conversion_check import ConversionCheck
    from zoo_stages.lib.quality.verify_report import VerifyOutputs

    check = ConversionCheck(VerifyOutputs(), data_spec=None, recipe_dir=path.parent, task="classification",
                            parity_samples=None, vector_samples=1, log=logging.getLogger("test"))
    return check.parity("b", None, path, path, atol=0, rtol=0)


def _model_info_describe(path):
    from zoo_stages.lib.onnx.model_info import describe

    return describe(path)


# every place a kind opens a model it did not just build: export's pass-through check, deploy's
# conversion check and build description, and the builder itself
CALLERS = {
    "make_session": ort_session.make_session,
    "export smoke run": _export_smoke_run,
    "deploy conversion check": _conversion_parity,
    "model_info.describe": _model_info_describe,
}


# describe reads .onnx files with onnx (no session): only its .ort cases go through onnxruntime
CASES = [(caller, what) for caller in sorted(CALLERS)
         for what in ("unknown operator", "damaged .ort file", "missing .ort file")
         if not (caller == "model_info.describe" and what == "unknown operator")]


@pytest.mark.parametrize("caller,what", CASES)
def test_a_model_onnxruntime_cannot_load_is_invalid_input_exit_2_for_every_caller(tmp_path, caller, what):
    path = _unloadable(tmp_path, what)
    with pytest.raises(InvalidInput) as err:
        CALLERS[caller](path)
    assert err.value.exit_code == ExitCode.INVALID
    assert ("cannot load" in err.value.message) or ("does not exist" in err.value.message)
    assert err.value.hint
