"""Back into torch, end to end: publish lenet-digits, load every float build back as a torch module
(outputs match onnxruntime's on real digits), pull it `--as torch`, and fine-tune it with a new head
through recipes/lenet-digits-finetune.yaml, whose version's lineage names the parent. (Needs the
torch extra.)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

torch = pytest.importorskip("torch")

from cli_helpers import zoo as zoo_cli  # noqa: E402
from conftest import REPO  # noqa: E402
from zoo.errors import InvalidInput  # noqa: E402
from zoo.registry.store import LocalZoo  # noqa: E402

pytestmark = pytest.mark.slow
PARENT = "lenet-digits@1.0.0"


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """recipes/lenet-digits.yaml and the fine-tune recipe run once, in their own folder, cache and zoo."""
    base = tmp_path_factory.mktemp("back")
    for name in ("lenet-digits.yaml", "lenet-digits-finetune.yaml"):
        shutil.copy(REPO / "recipes" / name, base / name)
    env = {"ZOO_CACHE_DIR": str(base / "cache"), "ZOO_HOME": str(base / "home")}
    parent = zoo_cli("run", base / "lenet-digits.yaml", env=env)
    assert parent.code == 0, parent.text
    child = zoo_cli("run", base / "lenet-digits-finetune.yaml", "--json", env=env)
    assert child.code == 0, child.text
    return {"dir": base, "env": env, "zoo": LocalZoo(Path(env["ZOO_HOME"])), "finetune": json.loads(child.out)}


@pytest.fixture(scope="module")
def digits():
    """The held-out digits as the recipe feeds them (16x16, one channel)."""
    from zoo_stages.lib.data import datasets

    split = datasets.load_split({"source": "digits", "image_size": 16, "channels": 1, "val_fraction": 0.2,
                                 "split_seed": 0}, REPO / "recipes", "val")
    return np.array(split.single("digits"), dtype=np.float32)


def _onnxruntime(path: str, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]


@pytest.mark.parametrize("build", ["cpu-fp32", "cuda-fp16", "cpu-int8"])
def test_load_torch_matches_each_onnx_build_on_real_digits(published, digits, build):
    import zoo

    module = zoo.load_torch(PARENT, build, zoo=published["zoo"])
    assert isinstance(module, torch.nn.Module)
    path = published["zoo"].is_materialized(published["zoo"].resolve(PARENT), build)
    expected = _onnxruntime(str(path), digits)
    with torch.no_grad():
        got = module(torch.from_numpy(digits)).float().numpy()
    scale = float(np.abs(expected).max())
    # fp32: float rounding; fp16: half precision (onnxruntime's CPU kernels accumulate differently);
    # int8: within one step of an 8-bit output grid (the module fake-quantizes as the build quantizes)
    atol = {"cpu-fp32": 1e-4, "cuda-fp16": 2e-3 * scale, "cpu-int8": scale / 127}[build]
    np.testing.assert_allclose(got, expected, atol=atol, rtol=0)
    assert (got.argmax(1) == expected.argmax(1)).mean() >= 0.99


def test_load_torch_defaults_to_the_float32_build_and_refuses_the_ort_one(published):
    import zoo

    module = zoo.load_torch(PARENT, zoo=published["zoo"])
    assert module.get_submodule("features.0").weight.dtype == torch.float32
    assert {"features.0.weight", "classifier.4.bias"} <= set(module.state_dict())  # the torch model's own names
    with pytest.raises(InvalidInput, match="ORT format"):
        zoo.load_torch(PARENT, "mobile", zoo=published["zoo"])


def test_pull_as_torch_writes_a_torch_export_program(published, digits, tmp_path):
    import zoo

    cli = zoo_cli("pull", PARENT, "--as", "torch", "--to", tmp_path, env=published["env"])
    assert cli.code == 0, cli.text
    path = Path(cli.out.strip().splitlines()[-1])
    assert path == tmp_path / "model.pt2" and path.is_file()
    program = torch.export.load(str(path)).module()
    x = torch.from_numpy(digits[:7])  # another batch size than the traced example's: the batch stays dynamic
    with torch.no_grad():
        np.testing.assert_allclose(program(x).numpy(), zoo.load_torch(PARENT, zoo=published["zoo"])(x).numpy(),
                                   atol=1e-5)
    wrong = zoo_cli("pull", PARENT, "--as", "keras", env=published["env"])
    assert wrong.code == 2 and "torch" in wrong.text


def test_finetune_recipe_trains_a_new_head_on_the_frozen_parent_and_names_it_in_the_lineage(published):
    stages = {s["id"]: s for s in published["finetune"]["stages"]}
    train, export = stages["train"]["metrics"], stages["export"]["metrics"]
    assert train["epochs"] == 1
    assert 0 < train["trainable_parameters"] < train["num_parameters"]  # features.* frozen
    assert export["parity"]["passed"] is True and export["max_abs"] <= export["parity"]["atol"]  # the gate passed
    zoo_ = published["zoo"]
    parent, child = zoo_.resolve(PARENT), zoo_.resolve("lenet-digits-finetune@1.0.0")
    assert child.lineage.sources[f"zoo:{PARENT}"] == f"sha256:{parent.builds['cpu-fp32'].file.sha256}"
    import zoo

    before, after = zoo.load_torch(PARENT, zoo=zoo_), zoo.load_torch("lenet-digits-finetune@1.0.0", zoo=zoo_)
    for name in ("features.0.weight", "features.3.bias"):  # frozen: the parent's weights, unchanged
        assert torch.equal(before.state_dict()[name], after.state_dict()[name])
    for name in ("classifier.4.weight", "classifier.0.weight"):  # the new head, and the layers that trained
        assert not torch.equal(before.state_dict()[name], after.state_dict()[name])
    assert stages["verify"]["metrics"]["passed"] is True  # its gate: cpu-fp32.accuracy >= 0.85


def test_the_finetuned_versions_bill_of_materials_names_its_parent(published):
    """The BOM (zoo/registry/bom.py) of the real fine-tuned version: its parent as a component and as the
    model's pedigree, with the sha256 of the parent's build it was trained from and the parent's license."""
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    zoo_ = published["zoo"]
    parent = zoo_.resolve(PARENT)
    data = zoo_.attachments("lenet-digits-finetune", "1.0.0")["bom.cdx.json"]
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(data.decode()) is None
    doc = json.loads(data)
    found = next(c for c in doc["components"] if c["bom-ref"] == f"parent:{PARENT}")
    assert (found["name"], found["version"]) == ("lenet-digits", "1.0.0")
    assert found["hashes"] == [{"alg": "SHA-256", "content": parent.builds["cpu-fp32"].file.sha256}]
    assert found["licenses"] == [{"license": {"id": parent.license}}]
    assert [a["name"] for a in doc["metadata"]["component"]["pedigree"]["ancestors"]] == ["lenet-digits"]
    tools = {c["name"]: c["version"] for c in doc["components"] if c["type"] == "library"}
    assert tools["torch"] == torch.__version__  # the trainer's, as the lock records it


def test_a_missing_parent_names_it_and_the_command_that_makes_it(published, tmp_path):
    for name in ("lenet-digits.yaml", "lenet-digits-finetune.yaml"):
        shutil.copy(REPO / "recipes" / name, tmp_path / name)
    env = {"ZOO_CACHE_DIR": str(tmp_path / "cache"), "ZOO_HOME": str(tmp_path / "empty-zoo")}
    cli = zoo_cli("run", "lenet-digits-finetune.yaml", cwd=tmp_path, env=env)
    assert cli.code == 2, cli.text
    assert f"the parent model {PARENT} is not in the local zoo" in cli.text
    assert "zoo run lenet-digits.yaml" in cli.text


def test_head_keep_needs_the_parents_width_and_freeze_needs_a_matching_name(published, monkeypatch):
    from zoo.engine import parents
    from zoo_stages.lib.models import archs, finetune

    monkeypatch.setenv("ZOO_HOME", published["env"]["ZOO_HOME"])
    section = {"from": f"zoo:{PARENT}", "num_classes": 5}
    found = parents.resolve(section["from"], published["dir"], where="model.from")  # as the engine gives train it
    with pytest.raises(InvalidInput) as e:
        archs.build_model(section, published["dir"], parent=found)
    assert "gives 10 outputs" in e.value.message and "head: new" in e.value.hint
    model = archs.build_model({**section, "head": "new"}, published["dir"], parent=found)
    assert model(torch.zeros(2, 1, 16, 16)).shape == (2, 5)
    with pytest.raises(InvalidInput, match="matches none") as e:
        finetune.freeze(model, ["backbone.*"])
    assert "features.0.weight" in e.value.hint


def test_planning_the_finetune_recipe_imports_nothing_heavy(published):
    """The parent is found and its digest keyed from the local zoo's files: no torch, onnx or onnxruntime."""
    import os
    import subprocess
    import sys

    code = ("import sys, zoo.api; r = zoo.api.plan(sys.argv[1]); "
            "print(sorted(m for m in ('torch', 'onnx', 'onnxruntime') if m in sys.modules), "
            "[s.state.value for s in r.stages])")
    proc = subprocess.run([sys.executable, "-c", code, str(published["dir"] / "lenet-digits-finetune.yaml")],
                          capture_output=True, text=True, env={**os.environ, **published["env"]})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[] ['cached', 'cached', 'cached', 'cached']", proc.stdout  # after the fixture's run
