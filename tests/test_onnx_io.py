"""Tests of zoo_stages.lib.onnx.onnx_io: safe loading, atomic saving, the IR cap, opset imports."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnx_models import linear_model, numpy_logits
from zoo.errors import InvalidInput
from zoo_stages.lib.onnx import onnx_io
from zoo_stages.lib.runtimes import onnx_run, ort_session


def test_load_fixes_ir_version_so_onnxruntime_runs_it(tmp_path):
    model = linear_model(ir_version=14)
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    loaded = onnx_io.load_model(path)
    assert loaded.ir_version == onnx_io.MAX_IR_VERSION
    x = np.random.default_rng(1).random((5, 1, 4, 4), dtype=np.float32)
    out = onnx_run.run(ort_session.make_session(path), {"input": x})["logits"]
    np.testing.assert_allclose(out, numpy_logits(model, x), rtol=1e-5, atol=1e-5)


def test_load_refuses_missing_and_garbage_files(tmp_path):
    with pytest.raises(InvalidInput, match="does not exist"):
        onnx_io.load_model(tmp_path / "nope.onnx")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\xff\xfe not a protobuf \x00" * 10)
    with pytest.raises(InvalidInput, match="not a readable ONNX model"):
        onnx_io.load_model(bad)


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
    loaded = onnx_io.load_model(path)
    assert all(t.data_location == TensorProto.DEFAULT for t in loaded.graph.initializer)
    x = np.ones((2, 1, 4, 4), dtype=np.float32)
    np.testing.assert_allclose(onnx_run.run(ort_session.make_session(loaded), {"input": x})["logits"],
                               numpy_logits(linear_model(), x),
                               rtol=1e-5, atol=1e-5)


def test_save_is_atomic_deterministic_and_lowers_ir(tmp_path):
    model = linear_model(ir_version=14)
    a = onnx_io.save_model(model, tmp_path / "a" / "m.onnx")
    b = onnx_io.save_model(linear_model(ir_version=14), tmp_path / "b" / "m.onnx")
    assert a.read_bytes() == b.read_bytes()
    assert onnx.load(str(a)).ir_version == onnx_io.MAX_IR_VERSION
    assert sorted(p.name for p in a.parent.iterdir()) == ["m.onnx"]  # no temp file left behind


def test_prune_opset_imports_keeps_used_domains_only():
    model = linear_model()
    for domain in ("com.microsoft.nchwc", "ai.onnx.training", "com.microsoft"):
        model.opset_import.append(helper.make_opsetid(domain, 1))
    model.graph.node.append(helper.make_node("Identity", ["logits"], ["unused"], domain="com.microsoft"))
    onnx_io.prune_opset_imports(model)
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17), ("com.microsoft", 1)]
    assert onnx_io.custom_domains(model) == ["com.microsoft"]
    assert onnx_io.opset_version(model) == 17
