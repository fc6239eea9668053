"""Malformed weights catalogs on ``ZOO_CATALOG_PATH``, through the real `zoo` CLI: a catalog is
hostile input. The command that needs the catalog (`zoo import team:edges`) refuses it in one line
naming the file and the field (exit 2); a command that only consults catalogs for a hint (`zoo pull
NAME` of a model the zoo lacks) skips the bad one with one warning line, and the hint still names
the model in a good catalog beside it.
"""

from __future__ import annotations

import copy
import json
import os

import pytest

from cli_helpers import zoo
from zoo import catalog
from zoo.errors import InvalidInput
from zoo.registry.store import LocalZoo

SHIPPED = json.loads((catalog.CATALOG_DIR / "torchvision.json").read_text())
ENTRY = SHIPPED["models"]["resnet50"]


def _catalog(**models) -> dict:
    return {**copy.deepcopy(SHIPPED), "models": models}


def _without(entry: dict, key: str) -> dict:
    return {k: v for k, v in entry.items() if k != key}


# (id, the file's text, what the error line names: the field, and what it says)
MALFORMED = [
    ("top-level-list", json.dumps([_catalog(edges=ENTRY)]), "top level is a JSON list"),
    ("top-level-string", json.dumps("models"), "top level is a JSON str"),
    ("no-models", json.dumps(_without(_catalog(), "models")), "field models: Field required"),
    ("models-a-list", json.dumps({**_catalog(), "models": [ENTRY]}), "field models: Input should be a valid dict"),
    ("entry-a-string", json.dumps(_catalog(edges="resnet50")), "field models.edges: Input should be"),
    ("no-url", json.dumps(_catalog(edges=_without(ENTRY, "url"))), "field models.edges.url: Field required"),
    ("url-not-http", json.dumps(_catalog(edges={**ENTRY, "url": "file:///etc/passwd"})), "field models.edges.url"),
    ("url-with-newline", json.dumps(_catalog(edges={**ENTRY, "url": ENTRY["url"] + "\nx"})), "models.edges.url"),
    ("num-classes-a-string", json.dumps(_catalog(edges={**ENTRY, "num_classes": "1000"})),
     "field models.edges.num_classes: Input should be a valid integer"),
    ("num-classes-a-float", json.dumps(_catalog(edges={**ENTRY, "num_classes": 3.5})),
     "field models.edges.num_classes"),
    ("num-classes-huge", json.dumps(_catalog(edges=ENTRY)).replace('"num_classes": 1000', '"num_classes": ' + "9" * 400),
     "field models.edges.num_classes"),
    ("num-classes-null", json.dumps(_catalog(edges={**ENTRY, "num_classes": None})), "field models.edges.num_classes"),
    ("input-shape-strings", json.dumps({**_catalog(edges=ENTRY), "preprocessing": {"input_shape": ["3", "a"]}}),
     "field preprocessing.input_shape.0"),
    ("input-shape-a-float", json.dumps({**_catalog(edges=ENTRY), "preprocessing": {"input_shape": 3.5}}),
     "field preprocessing.input_shape"),
    ("input-shape-negative", json.dumps({**_catalog(edges=ENTRY), "preprocessing": {"input_shape": [3, -1, 224]}}),
     "field preprocessing.input_shape.1"),
    ("no-schema-version", json.dumps(_without(_catalog(edges=ENTRY), "schema_version")), "schema_version None"),
    ("schema-version-a-list", json.dumps({**_catalog(edges=ENTRY), "schema_version": [1]}),
     "schema_version of type list"),
    ("sha256-newline", json.dumps(_catalog(edges={**ENTRY, "sha256": ENTRY["sha256"] + "\n"})),
     "edges lacks the full sha256"),
    ("unknown-field", json.dumps(_catalog(edges={**ENTRY, "script": "rm -rf ~"})),
     "field models.edges.script: Extra inputs are not permitted"),
    ("model-name-newline", json.dumps(_catalog(**{"edges\nerror: forged": ENTRY})), r"models.'edges\nerror: forged'"),
    ("license-multiline", json.dumps({**_catalog(edges=ENTRY), "license": "mit\ndata: {}"}), "field license"),
    ("not-json", "{not json", "not a readable catalog"),
    ("nested-deep", "[" * 100_000 + "]" * 100_000, "nested too deep"),
    ("too-large", json.dumps({**_catalog(edges=ENTRY), "description": "x" * (catalog.MAX_BYTES + 1)}),
     f"larger than {catalog.MAX_BYTES} bytes"),
]


# the shapes the issue lists, and the parser's limits, go through the CLI; the rest are checked in-process
THROUGH_CLI = {"top-level-list", "no-models", "entry-a-string", "no-url", "num-classes-a-string", "num-classes-a-float",
               "input-shape-strings", "input-shape-a-float", "no-schema-version", "model-name-newline", "nested-deep",
               "too-large"}


@pytest.fixture
def catalogs(tmp_path):
    """A folder for ZOO_CATALOG_PATH holding a good catalog ``good.json`` whose model is ``edges``."""
    folder = tmp_path / "catalogs"
    folder.mkdir()
    (folder / "good.json").write_text(json.dumps(_catalog(edges=ENTRY)))
    return folder


@pytest.mark.parametrize("text, says", [(t, s) for i, t, s in MALFORMED if i in THROUGH_CLI],
                         ids=[i for i, _, _ in MALFORMED if i in THROUGH_CLI])
def test_a_malformed_catalog_is_one_line_naming_the_file_and_field_where_it_is_needed(catalogs, text, says):
    bad = catalogs / "team.json"
    bad.write_text(text)
    env = {catalog.PATH_ENV: str(catalogs)}
    needed = zoo("import", "team:edges", env=env)
    assert needed.code == 2, needed.text
    assert "Traceback" not in needed.err
    [line] = [ln for ln in needed.err.splitlines() if ln.startswith("error:")]
    assert str(bad) in line and says in line, line
    assert not [ln for ln in needed.err.splitlines() if ln.startswith("forged")]
    assert LocalZoo().list() == []

    # only consulted for a hint: skipped with one warning, and the good catalog's hint survives
    hint = zoo("pull", "edges", env=env)
    assert hint.code == 2 and "Traceback" not in hint.err, hint.text
    [warning] = [ln for ln in hint.err.splitlines() if ln.startswith("warning:")]
    assert "skipped a weights catalog" in warning and str(bad) in warning
    assert "`zoo import good:edges`" in hint.err


@pytest.mark.parametrize("text, says", [(t, s) for i, t, s in MALFORMED if i not in THROUGH_CLI],
                         ids=[i for i, _, _ in MALFORMED if i not in THROUGH_CLI])
def test_every_other_malformed_catalog_is_invalid_input_naming_the_file_and_field(catalogs, text, says):
    (catalogs / "other.json").write_text(text)
    with pytest.raises(InvalidInput) as refused:
        catalog.load("other", catalogs)
    assert str(catalogs / "other.json") in refused.value.message and says in refused.value.message
    assert "\n" not in refused.value.message


def test_a_catalog_on_the_path_is_still_used_when_it_is_well_formed(catalogs):
    """The good catalog resolves (the export kind's check at `zoo validate`), the shipped one too."""
    recipe = catalogs.parent / "r.yaml"
    recipe.write_text("schema_version: 1\nname: r\nversion: 1.0.0\nlicense: BSD-3-Clause\ntask: image-classification\n"
                      "model: {arch: resnet50, num_classes: 1000}\n"
                      "stages:\n  export:\n    config: {weights: 'good:edges'}\n")
    env = {catalog.PATH_ENV: os.pathsep.join([str(catalogs)])}
    assert zoo("validate", recipe, env=env).code == 0
    (catalogs / "good.json").write_text(json.dumps(_catalog(edges=_without(ENTRY, "url"))))
    refused = zoo("validate", recipe, env=env)
    assert refused.code == 2 and "good.json" in refused.text and "models.edges.url" in refused.text
    assert "Traceback" not in refused.err
