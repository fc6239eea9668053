"""Running a shipped recipe as a user on a fresh clone would: the recipe and what it reads copied
into a folder of its own, with its own run cache and zoo (shared by the test_recipes_* files)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from cli_helpers import zoo as zoo_cli
from conftest import REPO


def copy_recipe(name: str, dest: Path) -> Path:
    """The recipe and what it reads (recipes/data, recipes/models, recipes/entries), as a fresh clone has them."""
    for sub in ("data", "models", "entries"):
        if (REPO / "recipes" / sub).is_dir():
            shutil.copytree(REPO / "recipes" / sub, dest / sub)
    shutil.copy(REPO / "recipes" / f"{name}.yaml", dest / f"{name}.yaml")
    return dest / f"{name}.yaml"


def run_shipped(name: str, base: Path) -> dict:
    """`zoo run --json` of the shipped recipe `name`, copied into `base`: {name, dir, recipe, env, result}."""
    recipe = copy_recipe(name, base)
    env = {"ZOO_CACHE_DIR": str(base / "cache"), "ZOO_HOME": str(base / "home")}
    cli = zoo_cli("run", recipe, "--json", env=env, timeout=900)
    assert cli.code == 0, cli.text
    return {"name": name, "dir": base, "recipe": recipe, "env": env, "result": json.loads(cli.out)}
