"""`zoo repro --check` with test kinds: identical rebuilds pass, differences are named."""

from __future__ import annotations

from cli_helpers import write_recipe, zoo as zoo_cli

import zoo
from zoo import repro


def test_deterministic_stages_are_identical(tmp_path):
    recipe = write_recipe(tmp_path, """\
schema_version: 1
name: det
version: 0.1.0
stages:
  a: {kind: writer, config: {text: "a"}}
  b: {kind: concat}
""")
    assert zoo.run(recipe).ok
    report = repro.check(recipe)
    assert report.ok and [s.status for s in report.stages] == ["identical", "identical"]
    cli = zoo_cli("repro", recipe, "--check")
    assert cli.code == 0 and "bit-identical" in cli.out


def test_a_nondeterministic_onnx_stage_names_the_tensor(tmp_path):
    recipe = write_recipe(tmp_path, """\
schema_version: 1
name: noisy
version: 0.1.0
stages:
  a: {kind: writer}
  n: {kind: noisy, config: {onnx: true}}
""")
    assert zoo.run(recipe).ok
    cli = zoo_cli("repro", recipe, "--check", "--stage", "n")
    assert cli.code == 1, cli.text
    assert "a                        reused" in cli.out
    assert "n                        differs" in cli.out
    assert "model.onnx differs: initializer 'w'" in cli.out and "values differ, first at flat index 0" in cli.out


def test_a_nondeterministic_file_is_reported(tmp_path):
    recipe = write_recipe(tmp_path, """\
schema_version: 1
name: noisy
version: 0.1.0
stages:
  n: {kind: noisy}
""")
    assert zoo.run(recipe).ok
    report = repro.check(recipe)
    assert not report.ok
    assert report.stages[0].status == "differs"
    assert any("data.bin differs" in d for d in report.stages[0].details)


def test_repro_without_lockfile_is_invalid_input(tmp_path):
    recipe = write_recipe(tmp_path, "schema_version: 1\nname: x\nversion: 0.1.0\nstages:\n  a: {kind: writer}\n")
    cli = zoo_cli("repro", recipe, "--check")
    assert cli.code == 2 and "no lockfile" in cli.err


def test_repro_does_not_touch_the_lockfile_or_cache(tmp_path):
    recipe = write_recipe(tmp_path, "schema_version: 1\nname: x\nversion: 0.1.0\nstages:\n  n: {kind: noisy}\n")
    zoo.run(recipe)
    lock = (tmp_path / "recipe.lock").read_text()
    repro.check(recipe)
    assert (tmp_path / "recipe.lock").read_text() == lock
    assert zoo.plan(recipe).stages[0].state == "cached"
