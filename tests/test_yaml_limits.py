"""Every YAML file zoo reads, not only recipes, is read within the recipe parser's limits
(zoo/yamlio.py): a project's `.zoo/config.yaml`, the user's `$ZOO_HOME/config.yaml` and a
lockfile nested thousands of levels deep, or holding an alias bomb, are one error line naming the
file, its line and the limit, exit 2, at once (they were a RecursionError traceback, or 16 s and
1.1 GB then a MemoryError). The `.dvc` files are in test_data_dvc.py. The CLI runs in a subprocess
whose timeout is a guard against a hang, not a timed assertion."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cli_helpers import write_recipe, zoo

RECIPE = """\
schema_version: 1
name: bounded
version: 0.1.0
stages:
  a: {kind: writer, config: {text: "abc"}}
"""
# ten aliases of ten aliases … nine levels deep: 10^9 values once expanded, a few hundred bytes
BOMB = "".join(f"b{i}: &b{i} [" + ", ".join([f"*b{i - 1}" if i else '"x"'] * 10) + "]\n" for i in range(9))
DEEP = "deep: " + "[" * 100_000 + "]" * 100_000 + "\n"
HOSTILE = {
    "deep": (DEEP, 1, "nests deeper than 64 levels"),
    "bomb": (BOMB, None, "expands to more than"),
}


def _project(tmp_path: Path) -> Path:
    (tmp_path / "project").mkdir()
    return write_recipe(tmp_path / "project", RECIPE)


def _one_error(done, where: str, limit: str) -> None:
    assert done.code == 2, done.text
    errors = [line for line in done.err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: {where}") and limit in errors[0], done.err
    assert "Traceback" not in done.err and "RecursionError" not in done.err and "MemoryError" not in done.err


@pytest.mark.parametrize("hostile", sorted(HOSTILE))
def test_a_project_config_past_the_limits_is_one_error(tmp_path, hostile):
    text, line, limit = HOSTILE[hostile]
    recipe = _project(tmp_path)
    config = recipe.parent / ".zoo" / "config.yaml"
    config.parent.mkdir()
    config.write_text(f"schema_version: 1\n{text}")
    done = zoo("plan", recipe, timeout=20)
    where = f"{config}:{(line or 0) + 1}:" if line else f"{config}:"
    _one_error(done, where, limit)


@pytest.mark.parametrize("hostile", sorted(HOSTILE))
def test_the_users_config_past_the_limits_is_one_error(tmp_path, hostile):
    text, line, limit = HOSTILE[hostile]
    recipe = _project(tmp_path)
    config = Path(os.environ["ZOO_HOME"]) / "config.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(text + "schema_version: 1\n")
    done = zoo("run", recipe, timeout=20)
    _one_error(done, f"{config}:{line}:" if line else f"{config}:", limit)


@pytest.mark.parametrize("hostile", sorted(HOSTILE))
def test_a_lockfile_past_the_limits_is_one_error(tmp_path, hostile):
    text, line, limit = HOSTILE[hostile]
    recipe = _project(tmp_path)
    lock = recipe.with_suffix(".lock")
    lock.write_text(text + "schema_version: 3\n")
    for command in ("plan", "run"):
        done = zoo(command, recipe, timeout=20)
        _one_error(done, f"{lock}: unreadable lockfile:", limit)
        assert f"(line {line})" in done.err if line else "(line " in done.err


def test_a_config_larger_than_the_limit_is_refused_unread(tmp_path):
    recipe = _project(tmp_path)
    config = recipe.parent / ".zoo" / "config.yaml"
    config.parent.mkdir()
    with open(config, "w") as f:
        f.write("schema_version: 1\n# " + "x" * (5 << 20) + "\n")
    _one_error(zoo("plan", recipe, timeout=20), f"{config}:", "larger than 4 MiB")
