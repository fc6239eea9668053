"""A stage's `resources:` (what a Dask worker must offer to run it): read as numbers, sizes as
bytes, never part of the cache key, and ignored by local runs. Where they take effect, on a real
cluster, is tests/test_dask_remote.py."""

from __future__ import annotations

import pytest

import zoo
from cli_helpers import write_recipe
from zoo.api import load

RECIPE = """\
schema_version: 1
name: tagged
version: 0.1.0
stages:
  a: {kind: writer, config: {text: "tagged"}RESOURCES}
  b: {kind: concat}
"""


def _recipe(tmp_path, resources: str = "", name: str = "recipe.yaml"):
    return write_recipe(tmp_path, RECIPE.replace("RESOURCES", f", resources: {resources}" if resources else ""), name)


@pytest.mark.parametrize("given, expected", [
    ("{GPU: 1}", {"GPU": 1}),
    ("{GPU: 0.5}", {"GPU": 0.5}),
    ("{memory: 8GB}", {"memory": 8 * 10**9}),
    ("{memory: 1.5 GiB, GPU: 2}", {"memory": 3 * 2**29, "GPU": 2}),
    ('{memory: "512MiB"}', {"memory": 512 * 2**20}),
])
def test_resources_are_numbers_and_sizes_are_bytes(tmp_path, given, expected):
    dag = load(_recipe(tmp_path, given))
    assert dag.nodes["a"].resources == expected
    assert dag.nodes["b"].resources == {}


@pytest.mark.parametrize("given, message", [
    ("{GPU: 0}", "must be a positive number"),
    ("{GPU: -1}", "must be a positive number"),
    ("{GPU: .inf}", "not a finite number"),
    ("{GPU: true}", "a number or a size"),
    ("{memory: 8 parsecs}", "is not a number or a size"),
    ('{"two words": 1}', "must be a word"),
])
def test_bad_resources_are_refused_at_their_line(tmp_path, given, message):
    from zoo.errors import RecipeError

    with pytest.raises(RecipeError) as e:
        load(_recipe(tmp_path, given))
    assert message in str(e.value) and "recipe.yaml:5:" in str(e.value)


def test_resources_do_not_enter_the_key(tmp_path):
    plain = zoo.plan(_recipe(tmp_path))
    tagged = zoo.plan(_recipe(tmp_path, "{GPU: 1, memory: 8GB}", "tagged.yaml"))
    assert [s.key for s in tagged.stages] == [s.key for s in plain.stages]


def test_a_local_run_ignores_them(tmp_path):
    result = zoo.run(_recipe(tmp_path, "{GPU: 4}"))
    assert [s.state for s in result.stages] == ["done", "done"]
