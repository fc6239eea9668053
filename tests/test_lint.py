"""The source tree passes pyflakes-level checks (ruff, configured in pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO


def test_no_unused_or_undefined_names():
    # ruff comes with the dev extra
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise",
                           "zoo", "zoo_stages", "tests", "bench", "scripts"],
                          cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
