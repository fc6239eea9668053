"""The shipped Keras and JAX/Flax recipes (an MLP on breast-cancer, trained by the recipe's own
function in recipes/entries/), end to end as a user runs them: train calls the entry, export
converts the checkpoint behind its parity gate, optimize, quantize, verify's gates and deploy
publish; the published model, fed raw rows normalised as its manifest says, classifies them;
the second run is cached."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from cli_helpers import zoo as zoo_cli
from shipped_recipes import run_shipped

pytestmark = pytest.mark.slow

# recipe -> the framework that trains and exports it
RECIPES = {"keras-mlp-breast-cancer": "keras", "jax-mlp-breast-cancer": "jax"}


@pytest.fixture(scope="module", params=sorted(RECIPES))
def run(request, tmp_path_factory):
    return run_shipped(request.param, tmp_path_factory.mktemp(request.param))


def test_every_stage_runs_the_gates_pass_and_the_version_is_published(run):
    stages = {s["id"]: s for s in run["result"]["stages"]}
    assert list(stages) == ["train", "export", "optimize", "quantize", "verify", "deploy"]
    assert {s["state"] for s in stages.values()} == {"done"}, stages
    train = stages["train"]["metrics"]
    assert train["framework"] == RECIPES[run["name"]] and train["val_accuracy"] > 0.93
    export = stages["export"]["metrics"]
    assert export["exporter"] == RECIPES[run["name"]] and export["parity"]["passed"]
    assert export["parity"]["outputs"]["argmax(probabilities)"]["mismatches"] == 0
    assert export["ir_version"] <= 13 and export["outputs"] == ["probabilities"]
    verify = stages["verify"]["metrics"]
    assert verify["passed"] is True and verify["builds"]["cpu-fp32"]["accuracy"] >= 0.93
    assert stages["deploy"]["effects"] == [{"kind": "published", "ref": f"{run['name']}@1.0.0"}]


def test_the_published_model_classifies_rows_normalised_as_its_manifest_says(run):
    import onnxruntime as ort

    from zoo.registry.store import LocalZoo

    manifest = LocalZoo(Path(run["env"]["ZOO_HOME"])).resolve(f"{run['name']}@1.0.0")
    assert set(manifest.builds) == {"cpu-fp32", "cpu-int8"}
    assert [p.name for p in manifest.builds["cpu-fp32"].outputs] == ["probabilities"]
    table = manifest.preprocessing["table"]["features"]["features"]
    mean, std = (np.array([table["normalize"][k][c] for c in table["columns"]]) for k in ("mean", "std"))
    pulled = run["dir"] / "pulled"
    cli = zoo_cli("pull", f"{run['name']}@1.0.0", "--build", "cpu-fp32", "--to", pulled, env=run["env"])
    assert cli.code == 0, cli.text
    session = ort.InferenceSession(cli.out.strip(), providers=["CPUExecutionProvider"])
    with open(run["dir"] / "data" / "breast-cancer.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    raw = np.array([[float(r[c]) for c in table["columns"]] for r in rows])
    labels = np.array([["benign", "malignant"].index(r["target"]) for r in rows])
    (probabilities,) = session.run(None, {"features": ((raw - mean) / std).astype(np.float32)})
    np.testing.assert_allclose(probabilities.sum(axis=1), 1, atol=1e-5)
    assert np.mean(probabilities.argmax(axis=1) == labels) > 0.95  # train and held-out rows together


def test_the_second_run_is_cached(run):
    again = zoo_cli("run", run["recipe"], env=run["env"])
    assert again.code == 0 and " 0 ran," in again.out, again.text
