"""The train and export kinds without torch: their configs, their cache dependencies, the import
cost of their modules, and export's ONNX pass-through (which needs onnx and onnxruntime, not torch).
What needs torch is in test_train_export.py, which skips without the torch extra."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import onnx
import pytest
from pydantic import ValidationError

from zoo.errors import InvalidInput
from zoo.stage import Inputs, KeyContext, RecipeInfo, StageContext
from zoo_stages.export import Export
from zoo_stages.train import Train

DATA = {"source": "digits", "image_size": 8, "channels": 1}
LENET = {"arch": "lenet5", "num_classes": 10}


def _recipe(tmp: Path) -> RecipeInfo:
    return RecipeInfo(name="t", version="0.1.0", description="", license="MIT", path=tmp / "recipe.yaml", digest="x")


def _ctx(tmp: Path, name: str) -> StageContext:
    return StageContext(stage_id=name, out_dir=tmp / name / "out", work_dir=tmp / name / "work",
                        recipe=_recipe(tmp), shared={"data": DATA, "model": LENET}, matrix={}, threads=1)


def _key_ctx(tmp: Path, data=DATA) -> KeyContext:
    return KeyContext(recipe=_recipe(tmp), shared={"data": data, "model": LENET}, matrix={})


def test_kind_modules_import_nothing_heavy():
    import subprocess
    import sys

    code = ("import sys, zoo_stages.train, zoo_stages.export, zoo.sources, zoo_stages.lib.models.archs, "
            "zoo_stages.lib.data.datasets; "
            "print(sorted(m for m in ('torch', 'onnx', 'onnxruntime', 'numpy', 'sklearn', 'safetensors', 'keras', "
            "'jax', 'jax2onnx', 'flax') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"



def test_train_dependencies_and_config_errors(tmp_path):
    assert Train().dependencies(Train.Config(), _key_ctx(tmp_path)) == []
    np.savez(tmp_path / "d.npz", x=np.zeros((10, 8, 8), np.uint8), y=np.arange(10) % 2)
    npz = {"source": "npz", "path": "d.npz", "image_size": 8}
    assert Train().dependencies(Train.Config(), _key_ctx(tmp_path, data=npz)) == [(tmp_path / "d.npz").resolve()]
    with pytest.raises(InvalidInput, match="does not exist"):
        Train().dependencies(Train.Config(entry="missing.py:fit"), _key_ctx(tmp_path))
    with pytest.raises(ValidationError, match="file.py:function"):
        Train.Config.model_validate({"entry": "no-function-here"})
    with pytest.raises(ValidationError):
        Train.Config.model_validate({"epochs": 1, "learning_rate": 0.1})


def test_export_weight_sources_and_dependencies(tmp_path):
    with pytest.raises(ValidationError):
        Export.Config.model_validate({"weights": {"path": "a.pt"}, "onnx": {"path": "b.onnx"}})
    with pytest.raises(ValidationError, match="exactly one of `url` or `path`"):
        Export.Config.model_validate({"weights": {"url": "https://x/a.pt", "path": "a.pt"}})
    with pytest.raises(ValidationError, match="exactly one of `url` or `path`"):
        Export.Config.model_validate({"weights": {}})
    # a local weights file is a dependency (its content enters the cache key)
    (tmp_path / "w.pt").write_bytes(b"weights")
    config = Export.Config.model_validate({"weights": {"path": "w.pt"}})
    assert Export().dependencies(config, _key_ctx(tmp_path)) == [(tmp_path / "w.pt").resolve()]
    with pytest.raises(InvalidInput, match="does not exist"):
        Export().dependencies(Export.Config.model_validate({"weights": {"path": "nope.pt"}}), _key_ctx(tmp_path))


# ---------------------------------------------------------------------------------------------
# ONNX pass-through (no torch)


def _tiny_onnx(ir_version: int = 13):
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Flatten", ["input"], ["flat"]), helper.make_node("MatMul", ["flat", "w"], ["logits"])],
        "tiny",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 1, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        [onnx.numpy_helper.from_array(np.random.default_rng(0).random((64, 10), dtype=np.float32), "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = ir_version
    return model


def test_onnx_pass_through_keeps_bytes(tmp_path):
    onnx.save(_tiny_onnx(), tmp_path / "given.onnx")
    digest = hashlib.sha256((tmp_path / "given.onnx").read_bytes()).hexdigest()
    ctx = _ctx(tmp_path, "p")
    config = Export.Config.model_validate({"onnx": {"path": "given.onnx", "sha256": digest}})
    out = Export().run(Inputs([]), config, ctx)["model"]
    # the graph is passed through untouched; only provenance metadata is added
    got, given = onnx.load(str(out)).graph, onnx.load(str(tmp_path / "given.onnx")).graph
    for part in ("node", "initializer", "input", "output"):  # (shape inference may add value_info)
        assert list(getattr(got, part)) == list(getattr(given, part))
    import json

    from zoo_stages.lib.release.provenance import read_metadata

    assert json.loads(read_metadata(out)["zoo.sources"]) == {"onnx": f"sha256:{digest}"}
    assert ctx.metrics["source"] == "onnx" and ctx.metrics["parity"]["ran"] is True
    assert ctx.metrics["onnx"]["sha256"] == digest


def test_onnx_pass_through_caps_ir_version(tmp_path):
    onnx.save(_tiny_onnx(ir_version=14), tmp_path / "new.onnx")
    out = Export().run(Inputs([]), Export.Config.model_validate({"onnx": {"path": "new.onnx"}}), _ctx(tmp_path, "p"))
    assert onnx.load(str(out["model"])).ir_version == 13


def test_an_onnx_file_that_is_not_a_model_is_invalid_input(tmp_path):
    """(Escaping external data is refused here as at every other door: test_external_data.py.)"""
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "broken.onnx").write_bytes(b"not an onnx model")
    with pytest.raises(InvalidInput):
        Export().run(Inputs([]), Export.Config.model_validate({"onnx": {"path": "m/broken.onnx"}}), _ctx(tmp_path, "q"))
