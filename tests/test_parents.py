"""The zoo models a recipe names, resolved by the engine (zoo/engine/parents.py): asked of the
section (`RecipeSection.references`) with the values each kind declares, so only a kind that
declares `model.from` is given the parent, and its key holds the pinned files; errors name the
field the recipe wrote."""

from __future__ import annotations

import pytest

from cli_helpers import write_recipe
from zoo.engine import keys, parents, planner
from zoo.engine.recipe import load
from zoo.errors import InvalidInput
from zoo.registry.store import LocalZoo
from registry_servers import make_staging
from zoo_stages.sections.model import ModelSection

RECIPE = """\
schema_version: 1
name: from-a-parent
version: 1.0.0
model: {{from: "zoo:tiny@1.0.0"{build}}}
stages:
  read: {{kind: parent}}
  write: {{kind: writer}}
"""


@pytest.fixture
def published(tmp_path):
    LocalZoo().publish(make_staging(tmp_path / "staging", builds={"cpu-fp32": {}, "mobile": {"format": "ort"}}))


def _dag(tmp_path, build: str = ""):
    return planner.build(load(write_recipe(tmp_path, RECIPE.format(build=build))))


def test_the_model_section_names_from_with_its_build():
    assert ModelSection.references({"from": "zoo:tiny@1.0.0", "build": "cpu-fp32"}) == {
        "from": "zoo:tiny@1.0.0#cpu-fp32"}
    assert ModelSection.references({"from": "zoo:tiny@1.0.0"}) == {"from": "zoo:tiny@1.0.0"}
    assert ModelSection.references({"arch": "lenet5", "from": None}) == {}


def test_only_a_kind_that_declares_the_field_is_given_the_parent_and_keys_its_files(published, tmp_path):
    dag = _dag(tmp_path)
    read = keys.key_context(dag.recipe, dag.nodes["read"])
    found = read.references["model.from"]
    assert (found.ref, found.build, found.source) == ("tiny@1.0.0", "cpu-fp32", "zoo:tiny@1.0.0")  # its float32 build
    assert found.files == (parents.pin_path("tiny", "1.0.0", None), found.path)
    assert dict(keys.key_context(dag.recipe, dag.nodes["write"]).references) == {}  # writer declares no model field
    files = keys.file_digests(dag.recipe, dag.nodes["read"], keys.StatCache(tmp_path / "h.sqlite"))
    assert sorted(files) == ["cache:parents/tiny/1.0.0/default.json",
                             "zoo-home:models/tiny/versions/1.0.0/builds/cpu-fp32/model.onnx"]


def test_a_build_that_is_not_there_or_not_onnx_is_refused_at_the_field(published, tmp_path):
    dag = _dag(tmp_path, build=", build: cuda-fp16")
    with pytest.raises(InvalidInput, match="model.from zoo:tiny@1.0.0: tiny@1.0.0 has no build .cuda-fp16.") as e:
        dict(keys.key_context(dag.recipe, dag.nodes["read"]).references)
    assert "cpu-fp32, mobile" in e.value.hint
    dag = _dag(tmp_path, build=", build: mobile")
    with pytest.raises(InvalidInput, match="ORT format, which only onnxruntime reads"):
        dict(keys.key_context(dag.recipe, dag.nodes["read"]).references)


def test_the_parent_is_resolved_only_when_a_kind_reads_it(tmp_path):
    """tools_used reads no reference: a missing parent is reported where the kind lists its files."""
    dag = _dag(tmp_path)
    assert keys.tools_used(dag.recipe, dag.nodes["read"]) == ()
    with pytest.raises(InvalidInput, match="not in the local zoo"):
        keys.file_digests(dag.recipe, dag.nodes["read"], keys.StatCache(tmp_path / "h.sqlite"))


def test_a_missing_parent_names_the_field_and_the_recipe_that_publishes_it(tmp_path):
    write_recipe(tmp_path, "schema_version: 1\nname: tiny\nversion: 1.0.0\nstages: {}\n", name="tiny.yaml")
    dag = _dag(tmp_path)
    with pytest.raises(InvalidInput, match="model.from: the parent model tiny@1.0.0 is not in the local zoo") as e:
        dict(keys.key_context(dag.recipe, dag.nodes["read"]).references)
    assert "publish it first: `zoo run" in e.value.hint and "tiny.yaml" in e.value.hint
