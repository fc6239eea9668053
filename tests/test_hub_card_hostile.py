"""The model card `zoo push` writes to a Hugging Face repo for a version without one: its YAML
metadata (license, tags) is emitted by PyYAML, so a license or task holding a newline adds no key
to what the Hub reads. The Hub's write API is the stand-in (`tests/registry_servers.py`'s `HubWriteApp`
over olah's git mirrors), hence `hf-stand-in-write-api` in the test's id."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from cli_helpers import zoo
from zoo.registry.codec import read_manifest_file
from zoo.registry.manifest import MANIFEST_FILE
from zoo.registry.staging import write_manifest
from zoo.registry.store import LocalZoo
from registry_servers import make_staging


@pytest.mark.parametrize("backend", ["hf"], indirect=True, ids=["hf-stand-in-write-api"])
def test_a_pushed_versions_card_metadata_holds_only_the_keys_zoo_writes(backend, tmp_path):
    staging = make_staging(tmp_path / "s", card=None)  # no card: push generates the README
    manifest = read_manifest_file(staging / MANIFEST_FILE)
    write_manifest(staging, manifest.model_copy(update={"license": "mit\ndatasets: [stolen]",
                                                        "task": "regression\npipeline_tag: evil"}))
    local = LocalZoo()  # conftest's ZOO_HOME, the one `zoo push` uses
    local.publish(staging)
    backend.add_to(local)
    pushed = zoo("push", "tiny@1.0.0", "--to", "origin")
    assert pushed.code == 0, pushed.text
    repo = backend.hub.mirrors / "models" / f"ns{backend.uid}" / "tiny"
    card = subprocess.run(["git", "-C", str(repo), "show", "HEAD:README.md"], check=True, capture_output=True,
                          text=True).stdout
    assert card.startswith("---\n")
    meta = yaml.safe_load(card.split("\n---\n", 1)[0][len("---\n"):])
    assert set(meta) == {"license", "library_name", "tags"}, meta
    assert meta["license"] == "mit\ndatasets: [stolen]" and meta["tags"][-1] == "regression\npipeline_tag: evil"
