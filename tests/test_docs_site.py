"""The documentation site (mkdocs.yml, docs/): `mkdocs build --strict` passes offline, so every
internal link and anchor resolves and every page is in the nav; the pages generated from the
program (command help, recipe schema, exit codes) are there; and a broken link fails the build."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

MKDOCS_ENV = {"NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(REPO)}


def _build(project: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(project / "mkdocs.yml"),
                           "-d", str(out)], cwd=project, capture_output=True, text=True, timeout=600,
                          env={**os.environ, **MKDOCS_ENV})


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    proc = _build(REPO, out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def test_the_site_builds_strict_with_every_page(site):
    for page in ("index", "install", "recipes", "kinds", "cli", "cli-json", "api", "cache", "releases", "trust",
                 "tasks/bring-a-model", "tasks/scale-out"):
        assert (site / f"{page}.html").is_file(), page


def test_the_command_help_page_is_the_program_s(site):
    page = (site / "cli-help.html").read_text()
    for command in ("zoo run", "zoo cache push", "zoo remote add", "zoo site publish", "zoo config allow"):
        assert f"<code>{command}</code>" in page, command
    assert "--cache-remote" in page and "Show this message and exit." in page


def test_the_exit_codes_and_schema_pages_come_from_their_sources(site):
    from zoo.errors import ExitCode

    codes = (site / "exit-codes.html").read_text()
    assert [int(c) for c in re.findall(r"<tr>\s*<td>(\d+)</td>", codes)] == [int(c) for c in ExitCode]
    schema = (site / "recipe-schema.html").read_text()
    assert "<code>schema_version</code>" in schema and "<code>stages</code>" in schema


def test_the_site_loads_nothing_from_elsewhere(site):
    """Offline: no script, style sheet or font from another host."""
    for page in site.rglob("*.html"):
        text = page.read_text()
        assert not re.search(r"<(script|link)[^>]+(src|href)=\"https?://", text), page


def test_a_broken_link_or_anchor_fails_the_build(tmp_path):
    project = tmp_path / "project"
    shutil.copytree(REPO / "docs", project / "docs")
    (project / "scripts").mkdir()
    for name in ("mkdocs_hooks.py", "cli_commands.py"):
        shutil.copy(REPO / "scripts" / name, project / "scripts" / name)
    shutil.copy(REPO / "mkdocs.yml", project / "mkdocs.yml")
    shutil.copy(REPO / "README.md", project / "README.md")
    (project / "recipes").mkdir()
    shutil.copy(REPO / "recipes" / "recipe.schema.json", project / "recipes")
    index = project / "docs" / "index.md"
    good = index.read_text()
    index.write_text(good + "\n[gone](no-such-page.md)\n")
    proc = _build(project, tmp_path / "out1")
    assert proc.returncode != 0 and "no-such-page.md" in proc.stdout + proc.stderr
    index.write_text(good + "\n[no anchor](recipes.md#no-such-heading)\n")
    proc = _build(project, tmp_path / "out2")
    assert proc.returncode != 0 and "no-such-heading" in proc.stdout + proc.stderr
