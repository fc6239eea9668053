"""Recipe-wide sections are registered like kinds: a third-party package brings its own section
(`zoo.sections` entry point), validated with its schema and `check` at the YAML line, and its
kind's `shared` puts exactly the declared fields in the key.

The package is tests/plugins/sectioned (a .dist-info with both groups), put on the path only by
the `sectioned` fixture: its sections would otherwise join every test recipe's top-level keys.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import zoo
from cli_helpers import write_recipe, zoo as zoo_cli
from zoo.engine.cache import Cache
from zoo.engine import keys, kind_loader, recipe as recipe_mod, section_loader
from zoo.errors import InvalidInput, RecipeError

SECTIONED = Path(__file__).resolve().parent / "plugins" / "sectioned"

RECIPE = """\
schema_version: 1
name: labelled
version: 0.1.0
labels:
  names: [cat, dog]
  language: en
stages:
  l: {kind: labeler}
"""


@pytest.fixture
def sectioned(monkeypatch):
    """The plugin on sys.path (this process) and PYTHONPATH (the `zoo` commands it starts)."""
    monkeypatch.syspath_prepend(str(SECTIONED))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(SECTIONED), os.environ.get("PYTHONPATH", "")]))
    kind_loader.clear_cache()
    section_loader.clear_cache()
    yield
    kind_loader.clear_cache()
    section_loader.clear_cache()


def _validate_error(tmp_path, text: str) -> str:
    path = write_recipe(tmp_path, text)
    result = zoo_cli("validate", path)
    assert result.code == 2 and "Traceback" not in result.text, result.text
    return result.err.replace(str(path), "RECIPE")


def test_a_plugin_section_is_checked_by_its_schema_at_the_yaml_line(sectioned, tmp_path):
    err = _validate_error(tmp_path, RECIPE.replace("language: en", "langauge: en"))
    assert "RECIPE:6:3: unknown key 'langauge' in labels — did you mean 'language'?" in err
    assert "hint: allowed keys: names, language, source" in err
    err = _validate_error(tmp_path, RECIPE.replace("language: en", "language: english"))
    assert "RECIPE:6:13: labels.language: String should match pattern '^[a-z]{2}$' (got 'english')" in err
    err = _validate_error(tmp_path, RECIPE.replace("names: [cat, dog]", "names: []"))
    assert "RECIPE:5:10: labels.names: List should have at least 1 item" in err


def test_a_plugin_sections_check_points_at_the_field_it_names(sectioned, tmp_path):
    err = _validate_error(tmp_path, RECIPE.replace("language: en", "source: names.txt"))
    assert "RECIPE:6:11: labels.source 'names.txt' is not a file beside the recipe" in err
    assert "hint: name the file the names were taken from, relative to the recipe" in err
    (tmp_path / "names.txt").write_text("cat\ndog\n")
    assert zoo_cli("validate", write_recipe(tmp_path, RECIPE.replace("language: en", "source: names.txt"))).code == 0
    err = _validate_error(tmp_path, RECIPE.replace("[cat, dog]", "[cat, cat]"))
    assert "RECIPE:5:10: labels.names has a name twice" in err


def test_a_plain_value_section_has_its_default_and_its_constraints(sectioned, tmp_path):
    recipe = recipe_mod.load(write_recipe(tmp_path, RECIPE))
    assert recipe.shared() == {"data": None, "labels": {"names": ["cat", "dog"], "language": "en", "source": None},
                               "model": None, "stamp_note": "none", "task": None}  # no data, model: no task to tell
    err = _validate_error(tmp_path, "stamp_note: " + "x" * 41 + "\n" + RECIPE)
    assert "RECIPE:1:13: stamp_note: String should have at most 40 characters" in err


def test_unknown_top_level_keys_are_suggested_from_the_registered_sections(sectioned, tmp_path):
    err = _validate_error(tmp_path, RECIPE.replace("labels:", "lables:"))
    assert "RECIPE:4:1: unknown key 'lables' in the top level — did you mean 'labels'?" in err
    assert ("hint: allowed keys: schema_version, name, version, description, license, data, labels, model, "
            "stamp_note, task, stages") in err


def test_without_the_plugin_its_section_is_an_unknown_key(tmp_path):
    err = _validate_error(tmp_path, RECIPE)
    assert "RECIPE:4:1: unknown key 'labels' in the top level" in err
    assert "hint: allowed keys: schema_version, name, version, description, license, data, model, task, stages" in err


def test_a_kind_declares_a_plugin_sections_fields_and_only_those_enter_its_key(sectioned, tmp_path):
    assert keys.section_fields()["labels"] == ("names", "language", "source")
    assert keys.section_fields()["stamp_note"] is None
    assert keys.declared_fields(kind_loader.get("labeler")) == {"labels": ("names",)}

    path = write_recipe(tmp_path, RECIPE)
    run = zoo_cli("run", path)
    assert run.code == 0, run.text
    plan = zoo.plan(path)  # the run's entry, read through the cache
    cache = Cache(plan.cache_dir)
    assert cache.output_paths(cache.lookup(plan.stages[0].key))["labels"].read_text() == "cat\ndog\n"

    path.write_text(RECIPE.replace("language: en", "language: de"))  # undeclared: the stage stays cached
    plan = zoo_cli("plan", path)
    assert plan.code == 0 and "l [labeler]: cached" in plan.out, plan.text

    path.write_text(RECIPE.replace("[cat, dog]", "[cat, dog, bird]"))
    plan = zoo_cli("plan", path)
    assert "l [labeler]: run  (config changed: labels.names: ['cat', 'dog'] → ['cat', 'dog', 'bird'])" in plan.out, \
        plan.text


def test_a_kind_cannot_declare_what_a_plugin_section_lacks(sectioned):
    class Typo:
        name, shared = "typo", ("labels.nmaes",)

    with pytest.raises(InvalidInput) as e:
        keys.declared_fields(Typo)
    assert e.value.hint == "declare one of: labels.names, labels.language, labels.source"


def test_the_json_schema_holds_the_plugin_sections(sectioned):
    schema = recipe_mod.json_schema()
    assert schema["properties"]["labels"]["anyOf"][0] == {"$ref": "#/$defs/LabelsSpec"}
    assert schema["$defs"]["LabelsSpec"]["required"] == ["names"]
    assert schema["properties"]["stamp_note"]["maxLength"] == 40


def test_a_section_may_not_take_a_generic_fields_name(sectioned):
    labels = section_loader.get("labels")
    with pytest.raises(InvalidInput, match="'stages'.*has the name of a recipe's own field"):
        recipe_mod._recipe_model((("stages", labels),))


def test_the_built_in_sections_are_zoos_own_entry_points(tmp_path):
    builtin = {name: entry.target for name, entry in section_loader.entries().items() if entry.builtin}
    assert builtin == {"data": "zoo_stages.sections.data:DataSection", "model": "zoo_stages.sections.model:ModelSection",
                       "task": "zoo_stages.sections.task:TaskSection"}
    text = "schema_version: 1\nname: m\nversion: 1.0.0\nmodel: {framework: nosuch}\nstages: {w: {kind: writer}}\n"
    with pytest.raises(RecipeError, match="no exporter for framework 'nosuch'"):  # the model section's own check
        recipe_mod.load(write_recipe(tmp_path, text))


def test_the_engine_holds_only_the_generic_recipe_fields():
    """Every other top-level key is a registered section: no module of zoo/ reads one by name."""
    import re

    assert recipe_mod.GENERIC_FIELDS == ("schema_version", "name", "version", "description", "license", "stages")
    for module in Path(recipe_mod.__file__).parents[1].rglob("*.py"):
        found = re.search(r"spec\.(model|data|task)\b", module.read_text())
        assert not found, f"{module} reads the recipe's `{found.group(1)}:` section by name"
