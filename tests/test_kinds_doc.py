"""docs/kinds.md's generated tables are up to date with the code (scripts/gen_kinds_doc.py --check),
for every built-in kind (the entry points in pyproject.toml), and its YAML examples validate."""

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
