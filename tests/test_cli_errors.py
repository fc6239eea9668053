"""How the CLI ends on an error: a user error is its message and hint (no note about tracebacks),
a bug says it is one and how to see its traceback, and with --json only the error object is
printed (stdout), nothing on stderr."""

from __future__ import annotations

import json
import subprocess
import sys

from cli_helpers import zoo

# a command that fails the way a bug in zoo would, run through the real entry point
_BUGGY = """
import sys
from zoo.cli import main as cli

@cli.app.command("boom")
def boom(json_: bool = cli.typer.Option(False, "--json")) -> None:
    {}.pop("missing")

sys.argv = ["zoo", *sys.argv[1:]]
cli.main()
"""


def _buggy(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([sys.executable, "-c", _BUGGY, *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=120)


def test_a_user_error_is_its_message_and_hint_only(tmp_path):
    r = zoo("validate", tmp_path / "missing.yaml")
    assert r.code == 2 and r.err.startswith("error: ") and "missing.yaml" in r.err, r.text
    assert "ZOO_DEBUG" not in r.err and "Traceback" not in r.err


def test_a_bug_says_so_and_how_to_see_its_traceback():
    r = _buggy("boom")
    assert r.returncode == 1, r.stderr
    assert "error: unexpected KeyError: 'missing'" in r.stderr and "a bug in zoo" in r.stderr
    assert "(set ZOO_DEBUG=1 to see the traceback)" in r.stderr and "Traceback" not in r.stderr
    r = _buggy("boom", env={"ZOO_DEBUG": "1"})
    assert r.returncode == 1 and "Traceback" in r.stderr and "KeyError" in r.stderr


def test_with_json_an_error_is_the_document_and_stderr_stays_empty(tmp_path):
    r = zoo("validate", tmp_path / "missing.yaml", "--json")
    assert r.code == 2 and r.err == "", r.err
    assert json.loads(r.out)["error"]["type"] == "RecipeError"
    r = _buggy("boom", "--json")
    assert r.returncode == 1 and r.stderr == "", r.stderr
    error = json.loads(r.stdout)["error"]
    assert error["type"] == "InternalError" and error["exit_code"] == 1 and "KeyError" in error["message"]


def test_an_os_error_nothing_caught_is_a_storage_error_not_a_traceback():
    script = _BUGGY.replace('{}.pop("missing")', 'open("/nonexistent-dir/x", "w")')
    r = subprocess.run([sys.executable, "-c", script, "boom"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 3, r.stderr
    assert r.stderr.startswith("error: No such file or directory (/nonexistent-dir/x)") and "Traceback" not in r.stderr
    assert "(set ZOO_DEBUG=1 to see the traceback)" in r.stderr


def test_a_failed_run_with_json_and_a_remote_cache_writes_nothing_on_stderr(tmp_path):
    from cli_helpers import write_recipe

    recipe = write_recipe(tmp_path, """\
schema_version: 1
name: fails
version: 0.1.0
stages:
  a: {kind: writer, config: {text: "x"}}
  b: {kind: failing, config: {message: "boom"}}
""")
    r = zoo("run", recipe, "--json", "--cache-remote", tmp_path / "run-cache")
    assert r.code == 1 and r.err == "", r.err
    doc = json.loads(r.out)
    assert doc["cache_remote_origin"] == "--cache-remote" and "boom" in doc["error"]["message"]
    # without --json the same run names its remote run cache on stderr, for people
    human = zoo("run", recipe, "--cache-remote", tmp_path / "run-cache")
    assert human.code == 1 and "remote run cache:" in human.err
