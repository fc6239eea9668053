"""`zoo schema`: the JSON Schema editors use, shipped beside the recipes and kept current."""

from __future__ import annotations

import json

import jsonschema
import pytest
import yaml

from cli_helpers import zoo as zoo_cli
from conftest import REPO

RECIPES = sorted((REPO / "recipes").glob("*.yaml"))


def test_shipped_schema_is_current():
    cli = zoo_cli("schema", env={"PYTHONPATH": ""})  # built-in kinds only, as shipped
    assert cli.code == 0, cli.err
    shipped = (REPO / "recipes" / "recipe.schema.json").read_text()
    assert json.loads(cli.out) == json.loads(shipped), "run `zoo schema -o recipes/recipe.schema.json`"


@pytest.mark.parametrize("recipe", RECIPES, ids=[r.stem for r in RECIPES])
def test_shipped_recipes_reference_and_satisfy_the_schema(recipe):
    text = recipe.read_text()
    assert text.startswith("# yaml-language-server: $schema=./recipe.schema.json")
    schema = json.loads((REPO / "recipes" / "recipe.schema.json").read_text())
    jsonschema.validate(yaml.safe_load(text), schema)


def test_schema_rejects_an_unknown_config_key():
    schema = json.loads((REPO / "recipes" / "recipe.schema.json").read_text())
    bad = yaml.safe_load((REPO / "recipes" / "lenet-digits.yaml").read_text())
    bad["stages"]["train"]["kind"] = "train"
    bad["stages"]["train"]["config"]["epoch"] = 3
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)
