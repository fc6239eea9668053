"""train fits scikit-learn, LightGBM and XGBoost estimators declared in `model:`, into safe,
reproducible checkpoints; export converts them (zoo_stages/exporters) behind a parity gate
against the source framework on the held-out rows. Every framework goes through the same tests."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest

from zoo.errors import GateFailed, IntegrityError, InvalidInput
from zoo.stage import Inputs, RecipeInfo, StageContext, Upstream
from zoo_stages import exporters
from zoo_stages.export import Export
from zoo_stages.exporters.base import EstimatorExporter
from zoo_stages.lib.models.estimators import framework
from zoo_stages.train import Train

from conftest import REPO

CSV = str(REPO / "recipes" / "data" / "breast-cancer.csv")
CLASSES = {"source": "csv", "path": CSV, "label": "target", "val_fraction": 0.25, "split_seed": 0}
# regression: one measurement predicted from the others
VALUES = {"source": "csv", "path": CSV, "label": "mean area", "columns": ["mean radius", "mean texture", "worst area"],
          "val_fraction": 0.25, "split_seed": 0}

# framework -> (classifier, regressor, small params)
ESTIMATORS = {
    "sklearn": ("GradientBoostingClassifier", "GradientBoostingRegressor", {"n_estimators": 20, "max_depth": 3}),
    "lightgbm": ("LGBMClassifier", "LGBMRegressor", {"n_estimators": 20, "num_leaves": 15}),
    "xgboost": ("XGBClassifier", "XGBRegressor", {"n_estimators": 20, "max_depth": 3}),
}
FRAMEWORKS = sorted(ESTIMATORS)


def _model(fw: str, kind: str = "classification", **extra) -> dict:
    classifier, regressor, params = ESTIMATORS[fw]
    return {"framework": fw, "estimator": classifier if kind == "classification" else regressor,
            "params": params, "num_classes": 2, **extra}


def _ctx(tmp: Path, name: str, model: dict, kind: str = "classification") -> StageContext:
    recipe = RecipeInfo(name="t", version="0.1.0", description="", license="MIT", path=tmp / "recipe.yaml",
                        digest="x")
    shared = {"data": CLASSES if kind == "classification" else VALUES, "model": model,
              "task": f"tabular-{kind}"}
    return StageContext(stage_id=name, out_dir=tmp / name / "out", work_dir=tmp / name / "work", recipe=recipe,
                        shared=shared, matrix={}, threads=1)


def _train(tmp: Path, model: dict, kind: str = "classification", name: str = "train") -> tuple[Path, dict]:
    ctx = _ctx(tmp, name, model, kind)
    out = Train().run(Inputs([]), Train.Config(seed=0, threads=1), ctx)
    return out["checkpoint"], ctx.metrics


def _export(tmp: Path, checkpoint: Path, model: dict, kind: str = "classification", **config) -> tuple[Path, dict]:
    ctx = _ctx(tmp, "export", model, kind)
    upstream = Inputs([Upstream(stage_id="train", kind="train", outputs={"checkpoint": checkpoint}, metrics={},
                                key="train-key")])
    out = Export().run(upstream, Export.Config(**config), ctx)
    return out["model"], ctx.metrics


def test_every_estimator_exporter_is_a_builtin_with_a_trainer():
    estimator_exporters = {n for n, cls in exporters.BUILTIN.items() if issubclass(cls, EstimatorExporter)}
    assert estimator_exporters == set(FRAMEWORKS)
    for name in FRAMEWORKS:
        fw = framework(name)
        assert fw.ESTIMATORS and fw.CHECKPOINT.startswith("model.")
        assert {e.kind for e in fw.ESTIMATORS.values()} == {"classification", "regression"}


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_two_fits_give_identical_checkpoint_bytes(fw, tmp_path):
    first, metrics = _train(tmp_path, _model(fw), name="a")
    second, _ = _train(tmp_path, _model(fw), name="b")
    assert first.name == framework(fw).CHECKPOINT
    assert first.read_bytes() == second.read_bytes()
    assert metrics["val_accuracy"] > 0.9 and metrics["estimator"] == ESTIMATORS[fw][0]
    # the seed reaches the estimator: another seed gives another model where sampling is random
    sampled = _model(fw, params={**ESTIMATORS[fw][2], **{"sklearn": {"subsample": 0.5}, "lightgbm": {
        "subsample": 0.5, "subsample_freq": 1}, "xgboost": {"subsample": 0.5}}[fw]})
    ctx_a, ctx_b = _ctx(tmp_path, "s0", sampled), _ctx(tmp_path, "s1", sampled)
    a = Train().run(Inputs([]), Train.Config(seed=0, threads=1), ctx_a)["checkpoint"]
    b = Train().run(Inputs([]), Train.Config(seed=1, threads=1), ctx_b)["checkpoint"]
    assert a.read_bytes() != b.read_bytes()


@pytest.mark.parametrize("kind", ["classification", "regression"])
@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_export_passes_its_parity_gate_against_the_source_framework(fw, kind, tmp_path):
    model = _model(fw, kind)
    checkpoint, _ = _train(tmp_path, model, kind)
    path, metrics = _export(tmp_path, checkpoint, model, kind)
    proto = onnx.load(str(path))
    assert proto.ir_version <= 13
    assert metrics["exporter"] == fw and metrics["parity"]["passed"] and metrics["parity"]["data"] == "held-out split"
    outputs = {o.name: o for o in proto.graph.output}
    if kind == "classification":
        assert set(outputs) == {"label", "probabilities"}  # plain tensors: zipmap off
        assert outputs["label"].type.tensor_type.elem_type == onnx.TensorProto.INT64
        assert metrics["parity"]["outputs"]["label"]["exact"] is True
        assert metrics["parity"]["outputs"]["probabilities"]["shape"] == [143, 2]
    else:
        assert list(outputs) == ["variable"]
    for port in (*proto.graph.input, *proto.graph.output):  # one sample per row, whatever the converter said
        assert port.type.tensor_type.shape.dim[0].dim_param == "batch"
    assert {p.key for p in proto.metadata_props} >= {"zoo.stage_record", "zoo.sources", "zoo.license"}
    first = path.read_bytes()
    again, _ = _export(tmp_path, checkpoint, model, kind)
    assert again.read_bytes() == first  # converters name graphs at random (onnxmltools: a uuid): zoo does not


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_a_model_that_predicts_otherwise_fails_the_gate_with_the_table(fw, tmp_path, monkeypatch):
    """A stand-in source prediction (probabilities moved by 0.01) must fail the stage, with the table."""
    model = _model(fw)
    checkpoint, _ = _train(tmp_path, model)
    cls = exporters.BUILTIN[fw]
    real = cls.predict

    def shifted(self, m, features, kind):
        out = real(self, m, features, kind)
        return {**out, "probabilities": out["probabilities"] + np.float32(0.01)}

    monkeypatch.setattr(cls, "predict", shifted)
    with pytest.raises(GateFailed) as err:
        _export(tmp_path, checkpoint, model)
    assert "probabilities" in err.value.table and "FAIL" in err.value.table
    assert "label" in err.value.table  # labels are compared too (exactly), and still agree


def test_lightgbm_thresholds_are_rounded_down_to_float32():
    from zoo_stages.exporters.lightgbm import float32_thresholds

    text = "tree\ntree_sizes=10 10\n\nTree=0\nthreshold=0.1 2.5 3\ndecision_type=2 3 2\nleft_child=1\n"
    out = float32_thresholds(text)
    values = out.split("threshold=")[1].split("\n")[0].split()
    down = float(values[0])
    assert float(np.float32(down)) == down  # a float32 value, so the converter keeps it exactly
    assert down <= 0.1 < float(np.float32(0.1))  # rounding to nearest goes above 0.1: LightGBM's decisions would change
    assert float(np.nextafter(np.float32(down), np.float32(1))) > 0.1  # the largest float32 not above 0.1
    assert values[1] == "2.5"  # a categorical split (decision_type bit 0) is left alone
    assert float(values[2]) == 3.0
    assert "tree_sizes" not in out


def test_estimator_errors_name_the_fix(tmp_path):
    with pytest.raises(InvalidInput, match="did you mean 'max_depth'"):
        _train(tmp_path, _model("sklearn", params={"max_dept": 3}))
    with pytest.raises(InvalidInput, match="regression estimator.*tabular-classification"):
        _train(tmp_path, {**_model("sklearn"), "estimator": "GradientBoostingRegressor"})
    with pytest.raises(InvalidInput, match="config.entry trains torch, Keras and JAX models"):
        Train().run(Inputs([]), Train.Config(entry="fit.py:fit"), _ctx(tmp_path, "e", _model("sklearn")))


def test_a_skops_checkpoint_with_an_unknown_type_is_refused(tmp_path):
    """The loader's allow-list: a checkpoint naming a type outside it is never loaded."""
    from zoo_stages.lib.models.estimators import sklearn as sk

    checkpoint, _ = _train(tmp_path, _model("sklearn"))
    blob = checkpoint.read_bytes()
    source = zipfile.ZipFile(io.BytesIO(blob))
    schema = source.read("schema.json").decode()
    assert "sklearn.tree._tree" in schema
    forged = tmp_path / "forged.skops"
    with zipfile.ZipFile(forged, "w") as target:
        for name in source.namelist():
            data = source.read(name)
            target.writestr(name, schema.replace('"__module__": "sklearn.tree._tree"', '"__module__": "os"')
                            .encode() if name == "schema.json" else data)
    with pytest.raises(IntegrityError, match="does not load"):
        sk.load(forged)
    loaded = sk.load(checkpoint)
    assert type(loaded).__name__ == "GradientBoostingClassifier"


_CONVERT_TWICE = """
import hashlib
import numpy as np
from sklearn.ensemble import GradientBoostingClassifier
from zoo_stages.exporters.base import sort_opset_imports
from zoo_stages.exporters.sklearn import SklearnExporter

x = np.random.default_rng(0).random((40, 3), dtype=np.float32)
model = GradientBoostingClassifier(n_estimators=3, random_state=0).fit(x, (x[:, 0] > 0.5).astype(int))
proto = SklearnExporter().to_onnx(model, "features", 3, 15)
proto.graph.name = "m"
sort_opset_imports(proto)
print([o.domain for o in proto.opset_import], hashlib.sha256(proto.SerializeToString()).hexdigest())
"""


def test_an_estimators_onnx_bytes_do_not_follow_pythons_hash_seed():
    """skl2onnx collects opset imports in a set: under other hash seeds (each stage is a new
    process) the same model came out in other bytes. In domain order, every seed gives one file."""
    import os
    import subprocess
    import sys

    outs = set()
    for seed in ("0", "1", "2", "3", "4", "5"):
        proc = subprocess.run([sys.executable, "-c", _CONVERT_TWICE], capture_output=True, text=True,
                              env=dict(os.environ, PYTHONHASHSEED=seed))
        assert proc.returncode == 0, proc.stderr
        outs.add(proc.stdout.strip())
    assert len(outs) == 1, outs
    assert next(iter(outs)).startswith("['', 'ai.onnx.ml']")
