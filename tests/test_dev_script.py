"""`./dev`, the set-up script: what each of its two environments installs, and when.

The script itself runs here against stand-ins (a `python` that records the pip commands it is
given, `apt-get`, `sudo`, `npm` and `id` that record their calls) in a copy of the files it reads,
so the tests see what a real set-up would run without installing anything. Which extras the zoo
environment needs is checked against the shipped lockfiles: every tool a shipped recipe's stage
records must come with those extras (the dependency closure read from the installed metadata).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from conftest import REPO

DEV = REPO / "dev"


def _dev_list(name: str) -> list[str]:
    """An extras list as `dev` spells it (`NAME="a,b,…"`, `$RECIPE_EXTRAS` expanded)."""
    text = DEV.read_text()
    found = re.search(rf'^{name}="([^"]*)"$', text, re.M)
    assert found, f"dev no longer sets {name}"
    return [e for part in found.group(1).split(",") for e in
            (_dev_list("RECIPE_EXTRAS") if part == "$RECIPE_EXTRAS" else [part])]


def _closure(extras: list[str]) -> set[str]:
    """The distributions `pip install zoo-onnx[EXTRAS]` brings, read from the installed metadata."""
    seen: set[str] = set()
    todo: list[tuple[str, frozenset[str]]] = [("zoo-onnx", frozenset(extras))]
    while todo:
        name, wanted = todo.pop()
        key = (canonicalize_name(name), wanted)
        if key in seen:
            continue
        seen.add(key)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue  # a requirement for another platform (xgboost on macOS): not installed here
        for line in requires:
            req = Requirement(line)
            if req.marker and not any(req.marker.evaluate({"extra": e}) for e in (wanted or {""})):
                continue
            todo.append((req.name, frozenset(req.extras)))
    return {name for name, _ in seen}


def _locked_tools() -> dict[str, set[str]]:
    """recipe -> the distributions its lockfile records a version of (not "absent")."""
    tools: dict[str, set[str]] = {}
    for lock in sorted((REPO / "recipes").glob("*.lock")):
        for stages in yaml.safe_load(lock.read_text())["platforms"].values():
            for record in stages.values():
                tools.setdefault(lock.stem, set()).update(
                    canonicalize_name(t) for t, v in (record.get("tools") or {}).items() if v != "absent")
    return tools


def test_the_zoo_environment_brings_every_tool_the_shipped_recipes_record():
    have = _closure(_dev_list("RECIPE_EXTRAS"))
    missing = {recipe: sorted(t - have) for recipe, t in _locked_tools().items() if t - have}
    assert missing == {}, "./dev zoo would not install what these shipped recipes run with (dev's RECIPE_EXTRAS)"


def test_the_lighter_set_up_docs_install_md_shows_is_enough_for_alexnet():
    doc = (REPO / "docs" / "install.md").read_text()
    assert "ZOO_DEV_EXTRAS=torch,simplify ./dev zoo run recipes/alexnet.yaml" in doc
    assert _locked_tools()["alexnet"] - _closure(["torch", "simplify"]) == set()


def test_the_closure_tells_a_missing_extra():
    """The check above can fail: without `simplify`, every optimize stage's onnxsim is missing."""
    without = _closure([e for e in _dev_list("RECIPE_EXTRAS") if e != "simplify"])
    assert "onnxsim" not in without and "onnxsim" in _closure(["simplify"])


def test_the_test_environment_installs_every_extra_and_the_zoo_one_none_for_tests_only():
    declared = set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    assert set(_dev_list("TEST_EXTRAS")) == declared
    assert not {"dev", "s3", "gcs", "azure", "webdav", "ssh", "oci", "dask", "dvc"} & set(_dev_list("RECIPE_EXTRAS"))


def test_dev_parses_and_its_help_says_what_each_command_installs():
    assert subprocess.run(["bash", "-n", str(DEV)]).returncode == 0
    text = subprocess.run([str(DEV), "help"], capture_output=True, text=True, check=True).stdout
    assert "./dev zoo" in text and "./dev test" in text
    assert "no system" in text and "sudo" in text and "apt-get" in text
    assert " ".join(_dev_list("RECIPE_EXTRAS")) in text


# --- the script run against stand-ins ------------------------------------------------------------

RECORDER = """#!/bin/bash
echo "$(basename "$0") $*" >> "{log}"
{extra}
"""


@pytest.fixture
def checkout(tmp_path):
    """A copy of what dev reads, a fake venv python, and a PATH of only stand-ins and the few
    tools dev uses; `run(*args, uid=0)` runs dev there and returns the commands it called."""
    root = tmp_path / "repo"
    root.mkdir()
    for name in ("dev", "pyproject.toml", "constraints.txt"):
        shutil.copy(REPO / name, root / name)
    log = tmp_path / "calls.log"
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for tool in ("bash", "env", "cat", "cp", "sha256sum", "cut", "sed", "dirname", "basename", "mv"):
        os.symlink(shutil.which(tool), bin_ / tool)

    def stand_in(path: Path, extra: str = "") -> None:
        path.write_text(RECORDER.format(log=log, extra=extra))
        path.chmod(0o755)

    venv_bin = root / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    # what `python -c` prints is torch's version (dev's check of the CPU build): ZOO_TEST_TORCH, else the CPU one
    stand_in(venv_bin / "python", '[[ $1 == -c ]] && echo "${ZOO_TEST_TORCH:-2.13.0+cpu}"; exit 0')
    stand_in(venv_bin / "zoo")
    stand_in(bin_ / "sudo", 'exec "$@"')
    # Debian's npm package, which the stand-in apt-get installs, is a stand-in too
    stand_in(tmp_path / "npm")
    stand_in(bin_ / "apt-get", f'[[ " $* " == *" npm "* ]] && cp "{tmp_path}/npm" "{bin_}/npm"; exit 0')

    def run(*args: str, uid: int = 0, code: int = 0, torch: str | None = None) -> list[str]:
        stand_in(bin_ / "id", f"echo {uid}")
        log.write_text("")
        env = {"PATH": str(bin_), "HOME": str(tmp_path), **({"ZOO_TEST_TORCH": torch} if torch else {})}
        proc = subprocess.run([str(bin_ / "bash"), str(root / "dev"), *args], cwd=root, env=env,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == code, proc.stdout + proc.stderr
        run.stderr = proc.stderr
        return [line.replace(str(root), "REPO") for line in log.read_text().splitlines()]

    return run


def _pip_installs(calls: list[str]) -> list[str]:
    return [c for c in calls if c.startswith("python -m pip install") and "--upgrade pip" not in c]


def test_dev_zoo_installs_the_recipes_extras_only_once_and_nothing_from_apt_or_npm(checkout):
    calls = checkout("zoo", "run", "x.yaml")
    extras = ",".join(_dev_list("RECIPE_EXTRAS"))
    assert _pip_installs(calls) == ["python -m pip install -q -c constraints.txt torch==2.13.0",
                                    f"python -m pip install -q -c constraints.txt -e .[{extras}]"]
    assert not [c for c in calls if c.split()[0] in ("apt-get", "sudo", "npm")]
    assert calls[-1] == "zoo run x.yaml"
    assert checkout("zoo", "--help") == ["zoo --help"]  # set up: nothing installed again


def test_dev_test_after_dev_zoo_adds_the_test_world_then_neither_installs_again(checkout):
    checkout("zoo", "--help")
    calls = checkout("test", "-k", "x", uid=1000)
    assert _pip_installs(calls)[-1] == f"python -m pip install -q -c constraints.txt -e .[{','.join(_dev_list('TEST_EXTRAS'))}]"
    # azurite's npm comes from Debian's package, through sudo when not root (this host's sshd,
    # qemu and chromium are in place: their apt-get calls go the same way)
    assert "sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q nodejs npm" in calls
    assert "npm install --prefix .tools --no-audit --no-fund --loglevel=error azurite@3.35.0" in calls
    # a whole-suite run (-k names no file) goes on xdist's workers (dev's xdist_args)
    assert calls[-1] == "python -m pytest -q -n logical --maxprocesses 4 --dist loadfile --no-loadscope-reorder -k x"
    assert not _pip_installs(checkout("zoo", "--help"))
    assert not _pip_installs(checkout("test", "-k", "x"))


def test_dev_zoo_after_dev_test_installs_nothing(checkout):
    checkout("test")
    assert checkout("zoo", "--help") == ["zoo --help"]


def test_a_changed_pyproject_sets_up_again(checkout, tmp_path):
    checkout("zoo", "--help")
    pyproject = tmp_path / "repo" / "pyproject.toml"
    pyproject.write_text(pyproject.read_text() + "\n# changed\n")
    assert len(_pip_installs(checkout("zoo", "--help"))) == 2


def test_a_command_the_zoo_environment_lacks_says_how_to_get_it(checkout):
    checkout("lint-imports", code=127)
    assert "lint-imports is not in the zoo environment; ./dev setup installs the test environment" in checkout.stderr



def test_a_torch_that_is_not_the_cpu_build_is_named_with_what_it_changes(checkout, tmp_path):
    checkout("zoo", "--version")
    assert "warning: torch" not in checkout.stderr  # the CPU build: nothing to say
    (tmp_path / "repo" / ".venv" / ".zoo-setup-zoo").unlink()  # set up again, and pip finds a CUDA build
    checkout("zoo", "--version", torch="2.13.0")
    assert "warning: torch 2.13.0 is not the CPU build the shipped lockfiles were made with (2.13.0+cpu)" in \
        checkout.stderr, checkout.stderr
    assert "https://download.pytorch.org/whl/cpu" in checkout.stderr
