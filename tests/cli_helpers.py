"""Run the real `zoo` CLI in a subprocess, as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from zoo.engine.executors import ProcessExecutor as _ProcessExecutor


@dataclass
class CliResult:
    code: int
    out: str
    err: str

    @property
    def text(self) -> str:
        return self.out + self.err


def zoo(*args: str | Path, cwd: Path | None = None, env: dict | None = None, timeout: float = 600) -> CliResult:
    """`python -m zoo ARGS` with the test's environment (temp ZOO_HOME / ZOO_CACHE_DIR)."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    proc = subprocess.run([sys.executable, "-m", "zoo", *map(str, args)], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)
    return CliResult(proc.returncode, proc.stdout, proc.stderr)


# the plugin test kinds (tests/plugins) in a chain with a gate (inspector) and an effect (shipper)
SHIPPED = """\
schema_version: 1
name: shipped
version: 0.1.0
stages:
  a: {kind: writer, config: {text: "payload"}}
  check: {kind: inspector, config: {minimum: 3}}
  ship: {kind: shipper, needs: [check]}
"""


def write_recipe(folder: Path, text: str, name: str = "recipe.yaml") -> Path:
    path = folder / name
    path.write_text(text)
    return path


class RecordingExecutor(_ProcessExecutor):
    """A real process executor that remembers every stage submitted to it."""

    def __init__(self, jobs: int = 1):
        super().__init__(jobs)
        self.submitted: list[str] = []

    def submit(self, task):
        self.submitted.append(task.stage_id)
        return super().submit(task)


def table_rows(text: str) -> list[list[str]]:
    """The rows of the rich tables in `text` (zoo/cli/tables.py, piped: no edge), header rows included,
    as stripped cells."""
    import re

    return [[cell.strip() for cell in re.split("[│┃]", line)] for line in text.splitlines() if re.search("[│┃]", line)]
