"""`zoo run --frozen` (zoo/engine/frozen.py): the lockfile is the contract CI checks. It must fail, with
exit 1, a line naming each difference, nothing run and the lockfile untouched, for a stage added
to the recipe, a stage removed from it, a stage changed (config, or a lock whose key differs from
the cache hit), and for cached outputs whose digests differ from the lock's (naming both digests);
and pass, touching nothing, when the lock is up to date. Through the real CLI, with the test kinds
(tests/plugins), on this machine's real platform class (the lock's records are this class's;
tests/test_lock_platforms.py covers several classes)."""

from __future__ import annotations

import os

import yaml

from cli_helpers import write_recipe, zoo as zoo_cli
from zoo import host

HERE = host.platform_class()

RECIPE = """\
schema_version: 1
name: frozen
version: 0.1.0
stages:
  a:
    kind: writer
    config: {text: "x", repeat: 3}
  b:
    kind: concat
  side:
    kind: writer
    needs: []
    config: {text: "side"}
"""

EXTRA = """\
  extra:
    kind: writer
    needs: []
    config: {text: "extra"}
"""


def _locked(tmp_path, text=RECIPE):
    """A recipe run once without --frozen: its lockfile is up to date (returns recipe, lock path)."""
    recipe = write_recipe(tmp_path, text)
    cli = zoo_cli("run", recipe)
    assert cli.code == 0, cli.text
    lock = recipe.with_suffix(".lock")
    assert lock.is_file()
    return recipe, lock


def _frozen_fails(recipe, lock, *lines: str) -> str:
    """`zoo run --frozen` exits 1 naming every line, leaves the lock as it was and runs nothing."""
    before = lock.read_bytes() if lock.exists() else None
    cli = zoo_cli("run", recipe, "--frozen")
    assert cli.code == 1, cli.text
    assert "is out of date" in cli.err, cli.err
    for line in lines:
        assert line in cli.err, f"{line!r} not in:\n{cli.err}"
    assert (lock.read_bytes() if lock.exists() else None) == before  # --frozen never writes the lock
    assert "ran" not in cli.out  # refused before anything ran: no progress, no summary
    return cli.err


def test_an_up_to_date_lock_passes_and_is_left_as_it_is(tmp_path):
    recipe, lock = _locked(tmp_path)
    before = lock.read_bytes()
    cli = zoo_cli("run", recipe, "--frozen")
    assert cli.code == 0, cli.text
    assert "0 ran, 3 cached" in cli.out
    assert lock.read_bytes() == before


def test_no_lockfile_at_all_fails_for_every_stage(tmp_path):
    recipe = write_recipe(tmp_path, RECIPE)
    _frozen_fails(recipe, recipe.with_suffix(".lock"),
                  "+ a: not in the lockfile", "+ b: not in the lockfile", "+ side: not in the lockfile")
    assert not recipe.with_suffix(".lock").exists()


def test_an_added_stage_fails(tmp_path):
    recipe, lock = _locked(tmp_path)
    recipe.write_text(RECIPE + EXTRA)
    err = _frozen_fails(recipe, lock, "+ extra: not in the lockfile")
    assert " a:" not in err and " b:" not in err and "side:" not in err  # the unchanged stages are not listed


def test_an_added_stage_fails_even_when_its_output_is_already_cached(tmp_path):
    # the same stage ran under another recipe sharing the cache: a cache hit, but the lock lacks it
    write_recipe(tmp_path, RECIPE.replace("name: frozen", "name: other") + EXTRA, name="other.yaml")
    assert zoo_cli("run", tmp_path / "other.yaml").code == 0
    recipe, lock = _locked(tmp_path)
    recipe.write_text(RECIPE + EXTRA)
    _frozen_fails(recipe, lock, "+ extra: not in the lockfile")


def test_a_removed_stage_fails(tmp_path):
    recipe, lock = _locked(tmp_path)
    recipe.write_text(RECIPE.replace('  side:\n    kind: writer\n    needs: []\n    config: {text: "side"}\n', ""))
    err = _frozen_fails(recipe, lock, "- side: in the lockfile but not in the recipe")
    assert "~ a" not in err and "~ b" not in err


def test_a_changed_stage_fails_with_its_reason_and_its_dependents(tmp_path):
    recipe, lock = _locked(tmp_path)
    recipe.write_text(RECIPE.replace("repeat: 3", "repeat: 5"))
    err = _frozen_fails(recipe, lock, "~ a: would run (config changed: repeat: 3 → 5)", "~ b: would run")
    assert "side" not in err


def test_a_changed_stage_that_is_cached_fails_too(tmp_path):
    # repeat: 5 ran before (its entry is in the cache), then the recipe went back to repeat: 3 and
    # ran again: the cache now holds both. A lock pinning repeat: 3 must refuse repeat: 5, hit or not.
    recipe, lock = _locked(tmp_path)
    before = lock.read_bytes()
    recipe.write_text(RECIPE.replace("repeat: 3", "repeat: 5"))
    assert zoo_cli("run", recipe).code == 0
    lock.write_bytes(before)
    err = _frozen_fails(recipe, lock, f"~ a: differs from the lockfile's {HERE} record "
                                      "(config changed: repeat: 3 → 5)", "~ b: differs")
    assert "(cached)" not in err


def test_a_lock_whose_record_differs_fails_even_on_a_cache_hit(tmp_path):
    recipe, lock = _locked(tmp_path)
    for other in ("0", "99"):  # a locked kind version that sorts before, and one after, the real one
        data = yaml.safe_load(lock.read_text())
        data["platforms"][HERE]["side"]["kind_version"] = other
        lock.write_text(yaml.safe_dump(data))
        err = _frozen_fails(recipe, lock, f"~ side: differs from the lockfile's {HERE} record (kind version changed")
        assert "~ a" not in err


def test_a_key_moved_by_code_alone_rebuilds_and_passes_when_the_bytes_are_the_locked_ones(tmp_path):
    """The kind epoch (zoo.stage.KIND_EPOCH, in every key, in no record) stands for a change of code:
    every key moves, no record does. `--frozen` rebuilds, compares bytes, passes with a note; a
    plain run leaves the lockfile byte for byte; `status --why` names the change."""
    recipe, lock = _locked(tmp_path)
    before = lock.read_bytes()
    bumped = {"PYTHONPATH": os.pathsep.join([str(tmp_path / "epoch"), os.environ.get("PYTHONPATH", "")])}
    (tmp_path / "epoch").mkdir()
    # a sitecustomize that bumps the epoch in the zoo process, as a new zoo release would
    (tmp_path / "epoch" / "sitecustomize.py").write_text("import zoo.stage\nzoo.stage.KIND_EPOCH += 1\n")
    why = zoo_cli("status", recipe, "--why", env=bumped)
    assert why.code == 0 and "code changed: kind epoch 1 → 2" in why.out, why.text
    cli = zoo_cli("run", recipe, "--frozen", env=bumped)
    assert cli.code == 0, cli.text
    assert "3 ran" in cli.out and "its outputs are the lockfile's, so the lockfile holds" in cli.text, cli.text
    assert lock.read_bytes() == before
    assert zoo_cli("run", recipe, env=bumped).code == 0 and lock.read_bytes() == before


def test_cached_outputs_that_differ_from_the_lock_fail(tmp_path):
    # a nondeterministic stage built on two machines (here: two caches) with the same key: the
    # lock pins the first build's bytes, the second cache holds other bytes under the same key
    text = "schema_version: 1\nname: noisy\nversion: 0.1.0\nstages:\n  n:\n    kind: noisy\n  w:\n    kind: writer\n    needs: []\n"
    first, second = {"ZOO_CACHE_DIR": str(tmp_path / "cache-1")}, {"ZOO_CACHE_DIR": str(tmp_path / "cache-2")}
    recipe = write_recipe(tmp_path, text)
    lock = recipe.with_suffix(".lock")
    assert zoo_cli("run", recipe, env=first).code == 0
    pinned = lock.read_bytes()
    assert zoo_cli("run", recipe, env=second).code == 0
    assert lock.read_bytes() != pinned  # the same key, other bytes: a plain run re-pins them
    repinned = yaml.safe_load(lock.read_text())
    lock.write_bytes(pinned)
    assert zoo_cli("run", recipe, "--frozen", env=first).code == 0  # this cache holds the pinned bytes
    cli = zoo_cli("run", recipe, "--frozen", env=second)
    assert cli.code == 1, cli.text
    locked = yaml.safe_load(pinned)["platforms"][HERE]["n"]["outputs"]["data"]
    built = repinned["platforms"][HERE]["n"]["outputs"]["data"]  # what the second cache holds
    assert locked != built
    assert f"~ n: outputs differ from the lockfile's {HERE} record:\n    output 'data': built {built}, locked {locked}" in cli.err
    assert "w:" not in cli.err
    assert lock.read_bytes() == pinned


def test_every_difference_is_listed_at_once(tmp_path):
    recipe, lock = _locked(tmp_path)
    recipe.write_text(RECIPE.replace("repeat: 3", "repeat: 4").replace(
        '  side:\n    kind: writer\n    needs: []\n    config: {text: "side"}\n', "") + EXTRA)
    _frozen_fails(recipe, lock, "~ a: would run", "~ b: would run", "+ extra: not in the lockfile",
                  "- side: in the lockfile but not in the recipe")


def test_frozen_with_force_rebuilds_the_stage_and_checks_its_bytes(tmp_path):
    recipe, lock = _locked(tmp_path)
    before = lock.read_bytes()
    cli = zoo_cli("run", recipe, "--frozen", "--force", "side")
    assert cli.code == 0 and "1 ran, 2 cached" in cli.out, cli.text  # rebuilt, the same bytes: passes
    assert lock.read_bytes() == before
    noisy = write_recipe(tmp_path, "schema_version: 1\nname: n\nversion: 0.1.0\nstages:\n  n: {kind: noisy}\n",
                         name="noisy.yaml")
    assert zoo_cli("run", noisy).code == 0
    pinned = noisy.with_suffix(".lock").read_bytes()
    cli = zoo_cli("run", noisy, "--frozen", "--force", "n")
    assert cli.code == 1 and f"~ n: outputs differ from the lockfile's {HERE} record" in cli.err, cli.text
    assert noisy.with_suffix(".lock").read_bytes() == pinned
    assert os.path.exists(lock)
