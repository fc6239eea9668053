"""Shared fixtures. Every zoo path (run cache, local zoo) points at a fresh temp dir per test."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PLUGINS = Path(__file__).resolve().parent / "plugins"

# The engine tests use stage kinds from tests/plugins, registered through a .dist-info with
# `zoo.stages` entry points: the same way a third-party package registers its kinds.
if str(PLUGINS) not in sys.path:
    sys.path.insert(0, str(PLUGINS))
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PLUGINS), os.environ.get("PYTHONPATH")]))

# the user's named remotes (zoo.registry.config) for what runs outside a test's own temp paths (a
# module- or session-scoped fixture): never the real ~/.config/zoo
os.environ["ZOO_CONFIG_DIR"] = tempfile.mkdtemp(prefix="zoo-config-")

# the remote backends and their servers (fixtures shared by the test_registry_remote*.py suites)
pytest_plugins = ["remote_fixtures"]


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """Test files holding `slow` tests (real recipes end to end) run first, each file's tests in
    their own order. `./dev test` hands whole files to its xdist workers in collection order
    (--dist loadfile --no-loadscope-reorder): the long files start at once and the short ones fill
    in around them, instead of a long file collected last running alone at the end."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)  # a stable sort: no file is split


@pytest.fixture(autouse=True)
def isolated_zoo_paths(tmp_path_factory, monkeypatch):
    """Point ZOO_CACHE_DIR, ZOO_HOME, ZOO_CONFIG_DIR and the code memo at temp dirs so no test touches the user's files."""
    base = tmp_path_factory.mktemp("zoo-env")
    monkeypatch.setenv("ZOO_CACHE_DIR", str(base / "cache"))
    monkeypatch.setenv("ZOO_HOME", str(base / "home"))
    monkeypatch.setenv("ZOO_CONFIG_DIR", str(base / "config"))  # the user's named remotes (zoo.registry.config)
    monkeypatch.setenv("ZOO_CODE_MEMO", str(base / "code.sqlite"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("DVC_NO_ANALYTICS", "1")
    monkeypatch.delenv("ZOO_DEBUG", raising=False)
    # the output's width as a serial run from a script sees it: none given. pytest-xdist's workers
    # have COLUMNS=80 and LINES=24 in their environment, which every `zoo` a test starts would
    # inherit (tables cut to 80 columns); a test that wants a width sets COLUMNS itself
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("LINES", raising=False)
    from zoo.engine import kind_loader, section_loader

    kind_loader.clear_cache()
    section_loader.clear_cache()
    yield base


@pytest.fixture
def tmpfs(tmp_path):
    """mount(size) -> a real tmpfs of that size (e.g. "1m") under tmp_path, for full-disk tests;
    unmounted afterwards. Mounting needs root, which this machine and CI have; elsewhere the test
    skips, saying why."""
    mounted: list[Path] = []

    def mount(size: str) -> Path:
        folder = tmp_path / f"tmpfs-{len(mounted)}"
        folder.mkdir()
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here (needs root): {proc.stderr.strip()}")
        mounted.append(folder)
        return folder

    yield mount
    for folder in mounted:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)
