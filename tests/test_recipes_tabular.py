"""The shipped tree-ensemble recipes (scikit-learn, LightGBM, XGBoost on breast-cancer), end to end
as a user runs them: train fits the declared estimator, export converts it behind its parity gate,
optimize, verify's gates and deploy publish; the published model takes raw rows and gives a label
and probabilities that agree with what was measured; the second run is cached."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from cli_helpers import zoo as zoo_cli
from shipped_recipes import run_shipped

pytestmark = pytest.mark.slow

# recipe -> the framework that exports it
RECIPES = {"sklearn-gbdt-breast-cancer": "sklearn", "lightgbm-breast-cancer": "lightgbm",
           "xgboost-breast-cancer": "xgboost"}


@pytest.fixture(scope="module", params=sorted(RECIPES))
def run(request, tmp_path_factory):
    return run_shipped(request.param, tmp_path_factory.mktemp(request.param))


def test_every_stage_runs_the_gates_pass_and_the_version_is_published(run):
    stages = {s["id"]: s for s in run["result"]["stages"]}
    assert list(stages) == ["train", "export", "optimize", "verify", "deploy"]
    assert {s["state"] for s in stages.values()} == {"done"}, stages
    assert stages["train"]["metrics"]["framework"] == RECIPES[run["name"]]
    export = stages["export"]["metrics"]
    assert export["exporter"] == RECIPES[run["name"]] and export["parity"]["passed"]
    assert export["parity"]["outputs"]["label"]["mismatches"] == 0
    assert any(op.startswith("ai.onnx.ml.TreeEnsemble") for op in export["op_types"])
    verify = stages["verify"]["metrics"]
    assert verify["passed"] is True and verify["builds"]["cpu-fp32"]["accuracy"] >= 0.95
    assert stages["deploy"]["effects"] == [{"kind": "published", "ref": f"{run['name']}@1.0.0"}]


def test_the_published_model_classifies_raw_rows(run):
    import onnxruntime as ort

    from zoo.registry.store import LocalZoo

    manifest = LocalZoo(Path(run["env"]["ZOO_HOME"])).resolve(f"{run['name']}@1.0.0")
    build = manifest.builds["cpu-fp32"]
    assert {"accuracy", "macro_f1"} <= set(build.metrics)
    assert [p.name for p in build.outputs] == ["label", "probabilities"]
    pulled = run["dir"] / "pulled"
    cli = zoo_cli("pull", f"{run['name']}@1.0.0", "--build", "cpu-fp32", "--to", pulled, env=run["env"])
    assert cli.code == 0, cli.text
    session = ort.InferenceSession(cli.out.strip(), providers=["CPUExecutionProvider"])
    with open(run["dir"] / "data" / "breast-cancer.csv", newline="") as f:
        rows = list(csv.reader(f))[1:]
    features = np.array([r[:-1] for r in rows], dtype=np.float32)
    labels = np.array([["benign", "malignant"].index(r[-1]) for r in rows])  # classes in sorted order
    label, probabilities = session.run(None, {session.get_inputs()[0].name: features})
    assert np.array_equal(label, probabilities.argmax(axis=1))
    np.testing.assert_allclose(probabilities.sum(axis=1), 1, atol=1e-5)
    assert np.mean(label == labels) > 0.95  # train and held-out rows together


def test_the_second_run_is_cached(run):
    again = zoo_cli("run", run["recipe"], env=run["env"])
    assert again.code == 0 and " 0 ran," in again.out, again.text
