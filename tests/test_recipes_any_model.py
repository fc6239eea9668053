"""The shipped recipes beyond image classifiers, end to end as a user runs them: text (BERT-style
encoder, two int64 inputs; a Hugging Face DistilBERT through framework: transformers), tabular (MLP on a CSV), a non-square normalised image, and an imported
label-less ONNX model (task: generic). Each must pass its gates and publish; its published
metrics must follow its task; its card and manifest must list every port and the preprocessing."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli_helpers import zoo as zoo_cli
from shipped_recipes import run_shipped

pytestmark = pytest.mark.slow

# recipe -> (the metrics its builds must publish, metrics they must not)
RECIPES = {
    "bert-tiny-text": ({"accuracy", "macro_f1"}, {"mae"}),
    "transformers-distilbert-languages": ({"accuracy", "macro_f1"}, {"mae"}),
    "tabular-mlp": ({"accuracy", "macro_f1"}, {"mae"}),
    "digits-nonsquare": ({"accuracy"}, {"mae"}),
    "sobel-edges": (set(), {"accuracy", "accuracy_drop", "top1_agreement", "macro_f1"}),
}


TEXT_RECIPES = ("bert-tiny-text", "transformers-distilbert-languages")  # the ones that ship a tokenizer


@pytest.fixture(scope="module", params=sorted(RECIPES))
def run(request, tmp_path_factory):
    return run_shipped(request.param, tmp_path_factory.mktemp(request.param))


def test_every_stage_runs_and_the_gates_pass(run):
    stages = {s["id"]: s for s in run["result"]["stages"]}
    assert {s["state"] for s in stages.values()} == {"done"}, stages
    assert stages["verify"]["metrics"]["passed"] is True
    assert stages["deploy"]["effects"] == [{"kind": "published", "ref": f"{run['name']}@1.0.0"}]


def test_published_metrics_follow_the_task(run):
    from zoo.registry.store import LocalZoo

    wanted, refused = RECIPES[run["name"]]
    manifest = LocalZoo(Path(run["env"]["ZOO_HOME"])).resolve(f"{run['name']}@1.0.0")
    for build in manifest.builds.values():
        assert wanted <= set(build.metrics), (build.name, sorted(build.metrics))
        assert not refused & set(build.metrics), (build.name, sorted(build.metrics))
        assert build.test_vectors, build.name


def test_card_and_manifest_list_every_port_and_the_preprocessing(run):
    from zoo.registry.store import LocalZoo

    zoo = LocalZoo(Path(run["env"]["ZOO_HOME"]))
    manifest = zoo.resolve(f"{run['name']}@1.0.0")
    assert manifest.preprocessing.get("schema_version") == 1
    card = zoo.blobs.path(manifest.card.sha256).read_text()
    assert "## Preprocessing" in card
    for build in manifest.builds.values():
        assert build.inputs and build.outputs
        for port in build.inputs + build.outputs:
            assert f"`{port.name}`" in card, port.name


def test_pull_verifies_and_the_second_run_is_cached(run):
    for build in ("cpu-fp32", "cpu-int8"):
        cli = zoo_cli("pull", f"{run['name']}@1.0.0", "--build", build, "--to", run["dir"] / "pulled" / build,
                      env=run["env"])
        assert cli.code == 0, cli.text
        assert Path(cli.out.strip()).is_file(), cli.text
    again = zoo_cli("run", run["recipe"], env=run["env"])
    assert again.code == 0 and " 0 ran," in again.out, again.text


def test_a_text_model_ships_the_tokenizer_that_made_its_inputs_and_no_other_model_has_one(run):
    from tokenizers import Tokenizer

    from zoo.registry.store import LocalZoo

    zoo = LocalZoo(Path(run["env"]["ZOO_HOME"]))
    manifest = zoo.resolve(f"{run['name']}@1.0.0")
    ref = next((f for f in manifest.files if f.path == "tokenizer.json"), None)
    if run["name"] not in TEXT_RECIPES:
        assert ref is None and "text" not in manifest.preprocessing
        return
    tokenizer = Tokenizer.from_str(zoo.blobs.path(ref.sha256).read_text())
    encoded = tokenizer.encode("Schweden")
    assert len(encoded.ids) == manifest.preprocessing["text"]["max_length"] == 32
    assert encoded.attention_mask[:2] == [1, 1] and encoded.attention_mask[-1] == 0
