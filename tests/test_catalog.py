"""The weights catalog (zoo/catalogs/*.json, zoo.catalog), torch-free: a name
resolves to the pinned URL, full sha256, license and arch; export's `weights:` takes the name,
and the resolved pin (not the name) is what its config (and so its cache key) holds."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from zoo.errors import InvalidInput
from zoo_stages.export import ExportConfig
from zoo import catalog
from zoo_stages.lib.models.vision_archs import VISION_ARCHS

REPO = Path(__file__).resolve().parents[1]
IMAGENET = {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225], "input_shape": [3, 224, 224]}


def test_torchvision_resnet18_resolves_to_the_pinned_file():
    assert catalog.resolve("torchvision:resnet18") == {
        "url": "https://download.pytorch.org/models/resnet18-f37072fd.pth",
        "sha256": "f37072fd47e89c5e827621c5baffa7500819f7896bbacec160b1a16c560e07ec",
        "license": "BSD-3-Clause",
        "attribution": "torchvision (PyTorch contributors), https://github.com/pytorch/vision; weights from "
                       "download.pytorch.org",
        "arch": "resnet18", "num_classes": 1000, "catalog": "torchvision:resnet18",
        "preprocessing": catalog.load("torchvision")["preprocessing"],
    }


@pytest.mark.parametrize("name", [*VISION_ARCHS, "alexnet"])
def test_every_entry_is_a_download_pytorch_org_file_pinned_by_its_full_digest(name):
    entry = catalog.load("torchvision")["models"][name]
    assert entry["arch"] == name and entry["num_classes"] == 1000
    match = re.fullmatch(r"https://download\.pytorch\.org/models/[a-z0-9_-]+-([0-9a-f]{8})\.pth", entry["url"])
    assert match, entry["url"]
    # torchvision's file names carry the digest's first 8 hex digits: the full pin must agree
    assert re.fullmatch(r"[0-9a-f]{64}", entry["sha256"]) and entry["sha256"].startswith(match.group(1))
    assert entry["bytes"] > 1_000_000


def test_the_catalog_declares_its_schema_license_preprocessing_and_sources():
    data = json.loads((catalog.CATALOG_DIR / "torchvision.json").read_text())
    assert data["schema_version"] == catalog.SCHEMA_VERSION and data["license"] == "BSD-3-Clause"
    assert {k: data["preprocessing"][k] for k in IMAGENET} == IMAGENET
    assert data["preprocessing"]["crop"] == 224 and data["preprocessing"]["resize"] == 256
    assert "sha256_sources" in data  # where the full digests came from


@pytest.mark.parametrize("name, message", [
    ("torchvision:resnet19", "no model 'resnet19' — did you mean 'resnet18'"),
    ("timm:resnet18", "no weights catalog called 'timm'"),
    ("resnet18", "not a catalog name"),
])
def test_unknown_names_are_invalid_input_naming_what_exists(name, message):
    with pytest.raises(InvalidInput, match=message):
        catalog.resolve(name)


def test_a_catalog_of_another_schema_version_or_a_prefix_digest_is_refused(tmp_path):
    data = json.loads((catalog.CATALOG_DIR / "torchvision.json").read_text())
    (tmp_path / "future.json").write_text(json.dumps({**data, "schema_version": 2}))
    with pytest.raises(InvalidInput, match="schema_version 2"):
        catalog.load("future", tmp_path)
    data["models"]["resnet18"]["sha256"] = "f37072fd"
    (tmp_path / "short.json").write_text(json.dumps(data))
    with pytest.raises(InvalidInput, match="lacks the full sha256"):
        catalog.load("short", tmp_path)


def test_zoo_catalog_path_folders_come_first_and_add_catalogs(tmp_path, monkeypatch):
    """A team's catalog (or a mirror of torchvision's files) shadows zoo's by prefix and adds its own."""
    data = json.loads((catalog.CATALOG_DIR / "torchvision.json").read_text())
    mirror = "https://models.internal.example/torchvision/resnet18-f37072fd.pth"
    data["models"]["resnet18"]["url"] = mirror
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    (first / "torchvision.json").write_text(json.dumps(data))
    (second / "team.json").write_text(json.dumps({**data, "models": {"edges": data["models"]["resnet50"]}}))
    (second / "broken.json").write_text("{not json")
    monkeypatch.setenv(catalog.PATH_ENV, os.pathsep.join([str(first), "", str(second)]))
    assert catalog.search_path() == [first, second, catalog.CATALOG_DIR]
    assert catalog.resolve("torchvision:resnet18")["url"] == mirror
    assert catalog.resolve("team:edges")["arch"] == "resnet50"
    assert {"torchvision", "team", "broken"} <= set(catalog.known())
    assert catalog.is_catalog_name("team:anything") and not catalog.is_catalog_name("timm:resnet18")
    with pytest.raises(InvalidInput, match="broken.json: not a readable catalog"):
        catalog.resolve("broken:x")
    monkeypatch.delenv(catalog.PATH_ENV)
    assert catalog.resolve("torchvision:resnet18")["url"].startswith("https://download.pytorch.org/")
    with pytest.raises(InvalidInput, match="no weights catalog called 'team'") as error:
        catalog.resolve("team:edges")
    assert catalog.PATH_ENV in error.value.hint


def test_export_config_takes_the_name_and_holds_the_resolved_pin():
    config = ExportConfig.model_validate({"weights": "torchvision:mobilenet_v3_small"})
    dumped = config.model_dump(mode="json")["weights"]  # what the cache key digests
    assert dumped["url"] == "https://download.pytorch.org/models/mobilenet_v3_small-047dcff4.pth"
    assert dumped["sha256"].startswith("047dcff4") and dumped["arch"] == "mobilenet_v3_small"
    assert dumped["license"] == "BSD-3-Clause" and dumped["catalog"] == "torchvision:mobilenet_v3_small"
    with pytest.raises(ValidationError, match="did you mean 'efficientnet_b0'"):
        ExportConfig.model_validate({"weights": "torchvision:efficientnet_b1"})


def test_a_recipe_naming_catalog_weights_validates_and_plans_without_torch(tmp_path):
    recipe = tmp_path / "resnet.yaml"
    recipe.write_text("schema_version: 1\nname: resnet18-imagenet\nversion: 1.0.0\nlicense: BSD-3-Clause\n"
                      "task: image-classification\nmodel: {arch: resnet18, num_classes: 1000}\n"
                      "stages:\n  export:\n    config: {weights: 'torchvision:resnet18'}\n")
    code = ("import sys, runpy\n"
            "sys.argv = ['zoo'] + sys.argv[1:]\n"
            "status = 0\n"
            "try:\n    runpy.run_module('zoo', run_name='__main__')\n"
            "except SystemExit as e:\n    status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)\n"
            "print('HEAVY', [m for m in ('torch', 'onnx', 'onnxruntime') if m in sys.modules])\n"
            "sys.exit(status)\n")
    for command in ("validate", "plan"):
        out = subprocess.run([sys.executable, "-c", code, command, str(recipe)], capture_output=True, text=True,
                             cwd=tmp_path)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "HEAVY []" in out.stdout, command
    bad = recipe.read_text().replace("torchvision:resnet18", "torchvision:resnet19")
    recipe.write_text(bad)
    out = subprocess.run([sys.executable, "-c", code, "validate", str(recipe)], capture_output=True, text=True,
                         cwd=tmp_path)
    assert out.returncode == 2 and "did you mean 'resnet18'" in out.stdout + out.stderr
