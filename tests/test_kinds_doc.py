"""docs/kinds.md's generated blocks are up to date with the code (scripts/gen_kinds_doc.py --check),
for every built-in kind (the entry points in pyproject.toml): each kind's description is its
module docstring, its fields its `Config`; and its YAML examples validate."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO

SCRIPT = REPO / "scripts" / "gen_kinds_doc.py"


def _check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--check", *args], cwd=REPO, capture_output=True, text=True)


def test_the_committed_kinds_doc_is_what_the_script_generates():
    proc = _check()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "generated tables are up to date" in proc.stdout and ", 0 failing" in proc.stdout


def test_check_fails_on_a_stale_table_and_on_a_kind_without_a_section(tmp_path):
    doc = (REPO / "docs" / "kinds.md").read_text()
    stale = tmp_path / "stale.md"
    stale.write_text(doc.replace("| `epochs` |", "| `epochs_renamed` |", 1))
    proc = _check("--no-examples", "--doc", str(stale))
    assert proc.returncode == 1 and "is out of date" in proc.stderr, proc.stderr
    assert stale.read_text() != doc  # --check changes nothing
    start, end = "<!-- BEGIN GENERATED: fields:optimize -->", "<!-- END GENERATED: fields:optimize -->"
    missing = tmp_path / "missing.md"
    missing.write_text(doc[:doc.index(start)] + doc[doc.index(end) + len(end):])
    proc = _check("--no-examples", "--doc", str(missing))
    assert proc.returncode == 1 and "has no block for 'fields:optimize'" in proc.stderr, proc.stderr


def test_each_kind_is_described_by_its_docstring_alone():
    """Under each kind's heading comes its docstring's block first: no second, hand-written description."""
    import re

    from zoo.engine import kind_loader

    doc = (REPO / "docs" / "kinds.md").read_text()
    for name in kind_loader.builtin_names():
        section = doc.split(f"\n## {name}\n", 1)[1]
        assert section.lstrip().startswith(f"<!-- BEGIN GENERATED: doc:{name} -->"), name
        between = section.split(f"<!-- END GENERATED: doc:{name} -->", 1)[1].split(f"<!-- BEGIN GENERATED: fields:{name}", 1)[0]
        prose = [line for line in re.sub(r"<!-- BEGIN GENERATED: (\S+) -->.*?<!-- END GENERATED: \1 -->", "", between,
                                         flags=re.S).splitlines() if line.strip() and not line.startswith("### ")]
        assert prose == [], f"{name}: hand-written text between its description and its fields: {prose}"


def test_check_fails_when_a_kind_docstring_changed(tmp_path):
    doc = (REPO / "docs" / "kinds.md").read_text()
    start = doc.index("<!-- BEGIN GENERATED: doc:optimize -->")
    stale = tmp_path / "stale.md"
    stale.write_text(doc[:start] + doc[start:].replace("Offline graph optimization", "Graph optimization", 1))
    proc = _check("--no-examples", "--doc", str(stale))
    assert proc.returncode == 1 and "is out of date" in proc.stderr, proc.stderr
