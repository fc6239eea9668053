"""Models whose weights lie in external data files (torch's dynamo exporter, anything above
protobuf's 2 GB limit), through every stage as a user runs them.

Two defects these caught: export's import of a model above 2 GB wrote a model.onnx whose tensors
pointed at the checker's scratch file ('check.onnx.data'), and verify reported `checker 0` (so
its default gate failed) for any external-data model in the cache, because onnx's checker
refuses hard-linked data files and the cache shares its files by hard link. The last test runs a
real model just above 2 GiB end to end (slow: about a minute and up to 10 GB of disk).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from cli_helpers import zoo as zoo_cli
from zoo.files import sha256_file
from zoo.pathsafety import external_data_files
from zoo_stages.lib.onnx import onnx_io


def mlp(width: int, layers: int, seed: int = 0, out_width: int | None = None) -> onnx.ModelProto:
    """x float[batch, width] -> `layers` × (MatMul, Tanh) -> y float[batch, out_width (default width)];
    weights scaled to keep tanh unsaturated."""
    rng = np.random.default_rng(seed)
    nodes, inits, x = [], [], "x"
    out_width = out_width or width
    for i in range(layers):
        cols = out_width if i == layers - 1 else width
        w = (rng.standard_normal((width, cols), dtype=np.float32) / np.sqrt(width)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        y = "y" if i == layers - 1 else f"h{i}"
        nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"]), helper.make_node("Tanh", [f"m{i}"], [y])]
        x = y
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", out_width])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def save_external(model: onnx.ModelProto, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=path.name + ".data", size_threshold=0)
    return path


def recipe(folder: Path, model: Path, width: int, *, latency_runs: int = 5) -> Path:
    """An import -> dynamic int8 -> verify -> deploy recipe for `model` (task generic)."""
    text = f"""schema_version: 1
name: external-mlp
version: 1.0.0
description: An MLP whose weights are external data.
license: Apache-2.0
task: generic
model:
  inputs:
    x: {{shape: [batch, {width}], dtype: float32}}
stages:
  export:
    config:
      onnx: {{path: {model.name}, sha256: {sha256_file(model)}}}
  quantize:
    needs: [export]
    config:
      mode: dynamic
      accept: {{min_speedup: 0.0}}
  verify:
    needs: [export, quantize]
    config:
      builds: {{cpu-fp32: export, cpu-int8: quantize}}
      reference: cpu-fp32
      latency: {{warmup: 1, runs: {latency_runs}, threads: 1, batch_sizes: [1]}}
      gates:
        - cpu-int8.cosine_min >= 0.9
  deploy:
    needs: [export, quantize, verify]
    config:
      builds:
        cpu-fp32: {{from: export}}
        cpu-int8: {{from: quantize}}
"""
    path = folder / "external-mlp.yaml"
    path.write_text(text)
    return path


def run_and_pull(tmp_path: Path, recipe_path: Path, after_run=None) -> tuple[dict, Path]:
    """`zoo run` the recipe, call `after_run()`, then `zoo pull` its cpu-fp32 build."""
    env = {"ZOO_CACHE_DIR": str(tmp_path / "cache"), "ZOO_HOME": str(tmp_path / "home")}
    cli = zoo_cli("run", recipe_path, "--json", env=env, timeout=900)
    assert cli.code == 0, cli.text
    result = {s["id"]: s for s in json.loads(cli.out)["stages"]}
    if after_run is not None:
        after_run()
    pulled = tmp_path / "pulled"
    cli = zoo_cli("pull", "external-mlp@1.0.0", "--build", "cpu-fp32", "--to", pulled, env=env, timeout=900)
    assert cli.code == 0, cli.text
    return result, pulled


def outputs(path: Path, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def test_import_above_the_protobuf_limit_writes_data_its_model_points_at(tmp_path, monkeypatch):
    """export's >2 GB path, taken by lowering the limit it compares with: the written model's
    tensors must name model.onnx.data beside it (not the checker's scratch file)."""
    from zoo.stage import Inputs
    from zoo_stages import export
    from test_export_onnx import _ctx

    source = save_external(mlp(16, 2), tmp_path / "src" / "mlp.onnx")
    monkeypatch.setattr(onnx_io, "PROTOBUF_LIMIT", 64)  # every model is "too big" to serialise in memory
    ctx = _ctx(tmp_path, "big")
    config = export.ExportConfig(onnx={"path": str(source), "sha256": sha256_file(source)})
    out = Path(export.Export().run(Inputs([]), config, ctx)["model"])
    assert external_data_files(out) == ["model.onnx.data"]
    x = np.random.default_rng(1).standard_normal((3, 16), dtype=np.float32)
    np.testing.assert_array_equal(outputs(out, x), outputs(source, x))


def test_the_checker_accepts_hard_linked_external_data(tmp_path):
    """The cache hard-links its outputs; onnx's checker refuses such data files unless checked on a copy."""
    path = save_external(mlp(8, 2), tmp_path / "m" / "model.onnx")
    os.link(path.parent / "model.onnx.data", tmp_path / "second-link")
    with pytest.raises(onnx.checker.ValidationError, match="hard link"):
        onnx.checker.check_model(str(path), full_check=True)  # what verify called before
    onnx_io.check_model(path, tmp_path / "scratch")
    assert not list((tmp_path / "scratch").iterdir())  # the copy is gone


def test_model_digest_and_size_cover_the_external_data(tmp_path):
    path = save_external(mlp(8, 2), tmp_path / "model.onnx")
    before = onnx_io.model_digest(path)
    assert onnx_io.model_size(path) == path.stat().st_size + (tmp_path / "model.onnx.data").stat().st_size
    data = bytearray((tmp_path / "model.onnx.data").read_bytes())
    data[0] ^= 1
    (tmp_path / "model.onnx.data").write_bytes(bytes(data))
    assert onnx_io.model_digest(path) != before  # a change to the weights alone is seen
    plain = tmp_path / "plain.onnx"
    onnx.save_model(mlp(8, 2), str(plain))
    from zoo.engine.hashing import hash_file_uncached

    assert onnx_io.model_digest(plain) == hash_file_uncached(plain)  # self-contained: the file's own digest


def test_verify_checks_and_measures_hard_linked_external_data_models(tmp_path):
    """Two builds whose weights are external data files with two hard links each, as in the
    cache: the checker passes, the digest and size cover the weights."""
    from zoo.stage import Inputs, RecipeInfo, StageContext, Upstream
    from zoo_stages.verify import Verify, VerifyConfig

    paths = {}
    for name, seed in (("a", 0), ("b", 1)):
        paths[name] = save_external(mlp(16, 2, seed=seed), tmp_path / name / "model.onnx")
        os.link(paths[name].parent / "model.onnx.data", tmp_path / f"{name}-cache-link")
    recipe = RecipeInfo(name="t", version="0.1.0", description="", license="", path=tmp_path / "r.yaml", digest="")
    ctx = StageContext(stage_id="verify", out_dir=tmp_path / "out", work_dir=tmp_path / "work", recipe=recipe,
                       shared={"task": "generic", "model": {"inputs": None}}, matrix={})
    config = VerifyConfig(builds={"fp32": "a", "other": "b"}, reference="fp32", eval_samples=8,
                          latency={"warmup": 1, "runs": 2, "threads": 1, "batch_sizes": [1], "throughput_runs": 1})
    Verify().run(Inputs([Upstream(n, "export", {"model": p}, {}) for n, p in paths.items()]), config, ctx)
    builds = ctx.metrics["builds"]
    for name, path in (("fp32", paths["a"]), ("other", paths["b"])):
        assert builds[name]["checker"] == 1, builds[name]["checker_error"]
        assert builds[name]["model_digest"] == onnx_io.model_digest(path)
        assert builds[name]["size_bytes"] == onnx_io.model_size(path) > 2 * 16 * 16 * 4
    assert builds["other"]["cosine"] < 0.999  # two different models, compared by name


def test_an_imported_external_data_model_below_2_gb_ships_as_one_file(tmp_path):
    source = save_external(mlp(64, 3), tmp_path / "mlp.onnx")
    stages, pulled = run_and_pull(tmp_path, recipe(tmp_path, source, 64))
    assert stages["verify"]["metrics"]["builds"]["cpu-fp32"]["checker"] == 1
    model = pulled / "builds" / "cpu-fp32" / "model.onnx"
    assert external_data_files(model) == []  # inlined: below 2 GB a model is one file
    x = np.random.default_rng(2).standard_normal((4, 64), dtype=np.float32)
    np.testing.assert_array_equal(outputs(model, x), outputs(source, x))


@pytest.fixture
def big_tmp(tmp_path):
    """tmp_path, emptied afterwards even when the test fails (it holds up to ~10 GB at a time)."""
    yield tmp_path
    shutil.rmtree(tmp_path, ignore_errors=True)


@pytest.mark.slow
def test_a_model_above_2_gb_is_imported_quantized_verified_and_published(big_tmp):
    """A real fp32 model just above protobuf's 2 GiB (8 × 8192² weights and an 8192 × 16 one): its
    int8 build (0.5 GB) is one file. Just above, and the source removed once imported, because the
    run holds several copies at a time (cache, release, local zoo, pull) on the CI's disk."""
    tmp_path = big_tmp
    source = save_external(mlp(8192, 9, out_width=16), tmp_path / "mlp.onnx")
    assert (tmp_path / "mlp.onnx.data").stat().st_size > 2**31
    x = np.random.default_rng(3).standard_normal((1, 8192), dtype=np.float32)
    expected = {}

    def forget_the_source():  # the cache holds the imported copy; its outputs are what the pull must give
        expected["y"] = outputs(source, x)
        source.unlink()
        (tmp_path / "mlp.onnx.data").unlink()

    stages, pulled = run_and_pull(tmp_path, recipe(tmp_path, source, 8192, latency_runs=2), forget_the_source)
    builds = stages["verify"]["metrics"]["builds"]
    assert builds["cpu-fp32"]["checker"] == 1 and builds["cpu-int8"]["cosine_min"] > 0.99
    model = pulled / "builds" / "cpu-fp32" / "model.onnx"
    assert external_data_files(model) == ["model.onnx.data"]
    np.testing.assert_array_equal(outputs(model, x), expected["y"])
