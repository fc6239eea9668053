"""`zoo repro --check` with test kinds: identical rebuilds pass, differences are named."""

from __future__ import annotations

from cli_helpers import table_rows, write_recipe, zoo as zoo_cli

import zoo
from zoo.release import repro


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
    # what it rebuilds is shown on stderr, as `zoo run` shows it; with --json, nothing
    assert "[zoo] a: running" in cli.err and "[zoo] b: done in" in cli.err, cli.err
    cli = zoo_cli("repro", recipe, "--check", "--json")
    assert cli.code == 0 and cli.err == "", cli.err


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
    rows = {r[0]: r[1:] for r in table_rows(cli.out)}
    assert rows["a"][0] == "reused" and rows["n"][0] == "differs"
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


def test_the_lockfile_records_where_each_stage_ran_and_frozen_ignores_it(tmp_path):
    import yaml

    from zoo import host
    from zoo.engine import lockfile

    recipe = write_recipe(tmp_path, "schema_version: 1\nname: x\nversion: 0.1.0\nstages:\n  a: {kind: writer}\n")
    assert zoo.run(recipe).ok
    lock_file = tmp_path / "recipe.lock"
    data = yaml.safe_load(lock_file.read_text())
    here = host.platform_class()
    assert data["platforms"][here]["a"]["host"] == host.describe()
    # the lock as another machine of this class would have written it: same outputs, other CPU model
    data["platforms"][here]["a"]["host"]["cpu"] = "Elsewhere"
    lock_file.write_text(yaml.safe_dump(data))
    assert lockfile.read(lock_file).record("a", here).host["cpu"] == "Elsewhere"
    cli = zoo_cli("run", recipe, "--frozen")
    assert cli.code == 0, cli.text  # the platform class decides the bytes, not the CPU's name


def test_a_difference_after_building_on_another_cpu_says_so(tmp_path):
    import yaml

    recipe = write_recipe(tmp_path, "schema_version: 1\nname: x\nversion: 0.1.0\nstages:\n  n: {kind: noisy}\n")
    assert zoo.run(recipe).ok
    lock_file = tmp_path / "recipe.lock"
    data = yaml.safe_load(lock_file.read_text())
    (record,) = [records["n"] for records in data["platforms"].values()]
    record["host"] = {"machine": record["host"]["machine"], "cpu": "Elsewhere", "features": ["made_up_simd"]}
    lock_file.write_text(yaml.safe_dump(data))
    details = repro.check(recipe).stages[0].details
    note = [d for d in details if d.startswith("note: the locked outputs were built on another kind of CPU")]
    assert note and "Elsewhere" in note[0] and "without made_up_simd" in note[0]


def test_a_difference_on_the_same_cpu_has_no_host_note(tmp_path):
    recipe = write_recipe(tmp_path, "schema_version: 1\nname: x\nversion: 0.1.0\nstages:\n  n: {kind: noisy}\n")
    assert zoo.run(recipe).ok
    details = repro.check(recipe).stages[0].details
    assert details and not any("another kind of CPU" in d for d in details)


def test_a_kind_with_the_first_form_of_the_equivalence_hook_still_answers():
    """Third-party kinds written before the hook took a context (locked, rebuilt, config) keep working."""
    from zoo.release.repro import _equivalence
    from zoo.stage import Equivalence

    class Old:
        def equivalence(self, locked, rebuilt, config):
            return Equivalence(equivalent=locked == rebuilt, details=("old form",))

    class New:
        def equivalence(self, locked, rebuilt, config, context):
            return Equivalence(equivalent=context == "ctx", details=("new form",))

    assert _equivalence(Old(), {"a": 1}, {"a": 1}, None, "ctx").details == ("old form",)
    assert not _equivalence(Old(), {"a": 1}, {"a": 2}, None, "ctx").equivalent
    assert _equivalence(New(), {}, {}, None, "ctx").equivalent
