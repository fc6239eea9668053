"""Keras 3 and JAX/Flax models that the recipe's own functions build and train (`config.entry`,
zoo_stages/lib/models/entry_models): safe, reproducible checkpoints (a .keras archive loaded with
safe_mode=True; safetensors parameters), and exports (zoo_stages/exporters/{keras,jax}.py) that
pass a parity gate against the source framework on the held-out rows and give the same bytes
twice. Both frameworks go through the same tests, with the shipped recipes' entry files."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest

from zoo.errors import GateFailed, IntegrityError, InvalidInput
from zoo.stage import Inputs, RecipeInfo, StageContext, Upstream
from zoo_stages import exporters
from zoo_stages.export import Export
from zoo_stages.exporters.entry_models import EntryModelExporter
from zoo_stages.lib.models.entry_models import FRAMEWORKS, framework
from zoo_stages.train import Train

from conftest import REPO

RECIPES = REPO / "recipes"
DATA = {"source": "csv", "path": str(RECIPES / "data" / "breast-cancer.csv"), "label": "target",
        "normalize": "standard", "val_fraction": 0.25, "split_seed": 0}
MODELS = {
    "keras": {"framework": "keras", "num_classes": 2, "output_name": "probabilities"},
    "jax": {"framework": "jax", "entry": "entries/jax_mlp.py:apply", "num_classes": 2, "output_name": "probabilities"},
}
ENTRIES = {"keras": "entries/keras_mlp.py:train", "jax": "entries/jax_mlp.py:train"}


def _ctx(recipe_dir: Path, out: Path, name: str, model: dict) -> StageContext:
    recipe = RecipeInfo(name="t", version="0.1.0", description="", license="MIT", path=recipe_dir / "recipe.yaml",
                        digest="x")
    return StageContext(stage_id=name, out_dir=out / name / "out", work_dir=out / name / "work", recipe=recipe,
                        shared={"data": DATA, "model": model, "task": "tabular-classification"}, matrix={}, threads=1)


def _train(tmp: Path, fw: str, name: str = "train", seed: int = 0, recipe_dir: Path = RECIPES,
           model: dict | None = None, entry: str | None = None) -> tuple[Path, dict]:
    ctx = _ctx(recipe_dir, tmp, name, model or MODELS[fw])
    config = Train.Config(entry=entry or ENTRIES[fw], epochs=8, batch_size=32, seed=seed)
    return Train().run(Inputs([]), config, ctx)["checkpoint"], ctx.metrics


def _export(tmp: Path, fw: str, checkpoint: Path, name: str = "export", recipe_dir: Path = RECIPES,
            model: dict | None = None) -> tuple[Path, dict]:
    ctx = _ctx(recipe_dir, tmp, name, model or MODELS[fw])
    upstream = Inputs([Upstream(stage_id="train", kind="train", outputs={"checkpoint": checkpoint}, metrics={},
                                key="train-key")])
    return Export().run(upstream, Export.Config(), ctx)["model"], ctx.metrics


@pytest.fixture(scope="module", params=FRAMEWORKS)
def trained(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(request.param)
    checkpoint, metrics = _train(tmp, request.param)
    return {"fw": request.param, "tmp": tmp, "checkpoint": checkpoint, "metrics": metrics}


def test_the_keras_and_jax_exporters_are_builtins_with_a_trainer():
    names = {n for n, cls in exporters.BUILTIN.items() if issubclass(cls, EntryModelExporter)}
    assert names == set(FRAMEWORKS) == {"keras", "jax"}
    for name in FRAMEWORKS:
        assert framework(name).CHECKPOINT in ("model.keras", "params.safetensors")


def test_training_gives_identical_checkpoint_bytes_and_the_seed_reaches_the_function(trained):
    fw, tmp = trained["fw"], trained["tmp"]
    assert trained["checkpoint"].name == framework(fw).CHECKPOINT
    metrics = trained["metrics"]
    assert metrics["framework"] == fw and metrics["val_accuracy"] > 0.9 and metrics["num_parameters"] == 1554
    assert metrics["entry"] == ENTRIES[fw]
    again, _ = _train(tmp, fw, name="again")
    assert again.read_bytes() == trained["checkpoint"].read_bytes()
    other, _ = _train(tmp, fw, name="other-seed", seed=1)
    assert other.read_bytes() != trained["checkpoint"].read_bytes()


def test_export_passes_its_parity_gate_and_gives_the_same_bytes_twice(trained):
    fw, tmp = trained["fw"], trained["tmp"]
    path, metrics = _export(tmp, fw, trained["checkpoint"])
    proto = onnx.load(str(path))
    assert proto.ir_version <= 13 and metrics["exporter"] == fw and metrics["opset"] == 17
    assert [i.name for i in proto.graph.input] == ["features"]
    assert [o.name for o in proto.graph.output] == ["probabilities"]
    for port in (*proto.graph.input, *proto.graph.output):
        assert port.type.tensor_type.shape.dim[0].dim_param == "batch"
    parity = metrics["parity"]
    assert parity["passed"] and parity["data"] == "held-out split" and parity["samples"] == 143
    assert parity["outputs"]["probabilities"]["shape"] == [143, 2]
    assert parity["outputs"]["argmax(probabilities)"] == {**parity["outputs"]["argmax(probabilities)"], "exact": True,
                                                          "mismatches": 0}
    assert {p.key for p in proto.metadata_props} >= {"zoo.stage_record", "zoo.sources", "zoo.license"}
    again, _ = _export(tmp, fw, trained["checkpoint"], name="again")
    assert again.read_bytes() == path.read_bytes()


def test_a_model_that_predicts_otherwise_fails_the_gate_with_the_table(trained, monkeypatch):
    """A stand-in source prediction (probabilities moved by 0.01) must fail the stage, with the table."""
    module = framework(trained["fw"])
    real = module.predict
    monkeypatch.setattr(module, "predict", lambda model, inputs: [o + np.float32(0.01) for o in real(model, inputs)])
    with pytest.raises(GateFailed) as err:
        _export(trained["tmp"], trained["fw"], trained["checkpoint"], name="shifted")
    assert "probabilities" in err.value.table and "FAIL" in err.value.table
    assert "argmax(probabilities)" in err.value.table  # labels are compared too (exactly), and still agree


def test_the_keras_archive_drops_save_times_and_object_ids():
    """Two stand-in .keras archives that differ only where Keras writes the time and Python object ids."""
    from zoo_stages.lib.models.entry_models.keras import reproducible_archive

    def archive(when: str, ids: tuple[int, int], date: tuple) -> bytes:
        config = {"layers": [{"dtype": {"shared_object_id": ids[0]}}, {"dtype": {"shared_object_id": ids[0]}},
                             {"other": {"shared_object_id": ids[1]}}]}
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w") as z:
            for name, data in (("metadata.json", {"keras_version": "3", "date_saved": when}), ("config.json", config)):
                z.writestr(zipfile.ZipInfo(name, date_time=date), json.dumps(data))
            z.writestr(zipfile.ZipInfo("model.weights.h5", date_time=date), b"weights")
        return out.getvalue()

    first = archive("2026-01-01@10:00:00", (140000001, 140000002), (2026, 1, 1, 10, 0, 0))
    second = archive("2026-01-02@11:30:00", (139000009, 139000005), (2026, 1, 2, 11, 30, 0))
    assert first != second and reproducible_archive(first) == reproducible_archive(second)
    with zipfile.ZipFile(io.BytesIO(reproducible_archive(first))) as z:
        assert json.loads(z.read("metadata.json")) == {"keras_version": "3"}
        layers = json.loads(z.read("config.json"))["layers"]
        assert [next(iter(layer.values()))["shared_object_id"] for layer in layers] == [1, 1, 2]  # sharing kept
        assert {i.date_time for i in z.infolist()} == {(1980, 1, 1, 0, 0, 0)}
        assert z.read("model.weights.h5") == b"weights"


def test_a_keras_model_with_python_code_is_refused_at_training(tmp_path):
    """A Lambda layer holds Python bytecode, which safe_mode refuses to load: train fails, naming why."""
    (tmp_path / "lam.py").write_text(textwrap.dedent("""
        import keras

        def train(train, val, config, context):
            x, _ = train
            return keras.Sequential([keras.Input((x.shape[1],)), keras.layers.Lambda(lambda t: t * 2),
                                     keras.layers.Dense(2, activation="softmax")])
    """))
    with pytest.raises(InvalidInput, match="safe_mode=True") as err:
        _train(tmp_path, "keras", recipe_dir=tmp_path, entry="lam.py:train")
    assert "Lambda" in err.value.hint


def test_a_plain_jax_model_trains_and_exports(tmp_path):
    """The contract without Flax: apply(params, x) in plain jax.numpy, parameters a nested dict."""
    (tmp_path / "linear.py").write_text(textwrap.dedent("""
        import jax
        import jax.numpy as jnp

        def apply(params, x):
            return jax.nn.softmax(x @ params["dense"]["w"] + params["dense"]["b"])

        def train(apply, train, val, config, context):
            x, y = train
            params = {"dense": {"w": jnp.zeros((x.shape[1], 2)), "b": jnp.zeros(2)}}
            loss = lambda p: -jnp.mean(jnp.log(apply(p, x)[jnp.arange(len(y)), y]))
            grad = jax.jit(jax.grad(loss))
            for _ in range(50):
                params = jax.tree_util.tree_map(lambda p, g: p - 0.5 * g, params, grad(params))
            return params
    """))
    model = {"framework": "jax", "entry": "linear.py:apply", "num_classes": 2}
    checkpoint, metrics = _train(tmp_path, "jax", recipe_dir=tmp_path, model=model, entry="linear.py:train")
    assert metrics["val_accuracy"] > 0.9 and metrics["num_parameters"] == 62
    path, exported = _export(tmp_path, "jax", checkpoint, recipe_dir=tmp_path, model=model)
    assert exported["parity"]["passed"] and exported["outputs"] == ["logits"]  # model.output_name's default
    ops = {n.op_type for n in onnx.load(str(path)).graph.node}
    assert "Softmax" in ops and ops & {"MatMul", "Gemm"}


def test_jax_parameters_are_nested_dicts_of_arrays_and_the_checkpoint_is_checked(tmp_path):
    from safetensors.numpy import save_file

    from zoo_stages.lib.models.entry_models import jax as jax_models

    params = {"params": {"Dense_0": {"kernel": np.ones((3, 2), np.float32), "bias": np.zeros(2, np.float32)}}}
    flat = jax_models.flatten(params, "the function returned")
    assert sorted(flat) == ["params/Dense_0/bias", "params/Dense_0/kernel"]
    assert jax_models.unflatten(flat)["params"]["Dense_0"]["kernel"].shape == (3, 2)
    for bad, message in (({1: np.ones(2)}, "parameter key 1"), ({"a/b": np.ones(2)}, "parameter key 'a/b'"),
                         ({"a": "text"}, "str at a"), ({}, "no parameters"), (np.ones(2), "at the top")):
        with pytest.raises(InvalidInput, match=message):
            jax_models.flatten(bad, "the function returned")
    foreign = tmp_path / "params.safetensors"
    save_file(flat, str(foreign), metadata={"format": "pt"})  # a torch state dict, say
    with pytest.raises(IntegrityError, match="not a zoo JAX checkpoint"):
        jax_models.load(foreign, MODELS["jax"], RECIPES)


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_training_needs_the_recipes_function(fw, tmp_path):
    ctx = _ctx(RECIPES, tmp_path, "train", MODELS[fw])
    with pytest.raises(InvalidInput, match="config.entry: file.py:function"):
        Train().run(Inputs([]), Train.Config(), ctx)


def test_validating_and_planning_the_recipes_imports_no_framework(tmp_path):
    code = ("import sys; from zoo.cli.main import app; from typer.testing import CliRunner\n"
            "for args in (['validate', sys.argv[1]], ['plan', sys.argv[1]], ['validate', sys.argv[2]]):\n"
            "    r = CliRunner().invoke(app, args); assert r.exit_code == 0, r.output\n"
            "print(sorted(m for m in ('keras', 'jax', 'jax2onnx', 'flax', 'torch', 'onnx', 'onnxruntime')"
            " if m in sys.modules))")
    env = {"ZOO_CACHE_DIR": str(tmp_path / "cache"), "ZOO_HOME": str(tmp_path / "home"), "PATH": ""}
    proc = subprocess.run([sys.executable, "-c", code, str(RECIPES / "keras-mlp-breast-cancer.yaml"),
                           str(RECIPES / "jax-mlp-breast-cancer.yaml")], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"
