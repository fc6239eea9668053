"""The CLI as a whole (issue #17): --version, shell completion, --json on every command with one
documented shape (docs/cli-json.md), tables that fit 80 columns with rounded numbers, unknown
names (exit 2, did-you-mean), `search --remote`, and hints that lead somewhere (a failed gate's
recipe line; a republished version). Every command runs as a subprocess, as a user runs it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib.metadata import version as dist_version
from pathlib import Path

import pytest

from cli_helpers import SHIPPED, write_recipe, zoo
from zoo.registry import api
from zoo.registry.store import LocalZoo
from registry_servers import make_staging

HEAVY = ("torch", "onnx", "onnxruntime", "rich", "fsspec", "boto3", "huggingface_hub")

ACCURACY = 0.9722222222222222  # what verify records: the table must show 0.9722
MEASURED = {"runtime": "onnxruntime", "runtime_version": "1.32.0", "execution_provider": "CPUExecutionProvider",
            "device": "AMD EPYC 9B14", "platform": "x86-64-avx512-vnni", "threads": 1}
BUILDS = {  # the six builds lenet-digits publishes, with its kinds of metadata
    "cpu-fp32": {"runtime": "onnx", "portable": True, "verified": True, "measured_on": MEASURED,
                 "metrics": {"latency_p50_ms": 0.0512345, "accuracy": ACCURACY}},
    "cpu-int8": {"precision": "int8", "runtime": "onnxruntime>=1.32", "verified": True, "measured_on": MEASURED,
                 "metrics": {"latency_p50_ms": 0.04251, "accuracy": 0.9666666666666667}},
    "cuda-fp16": {"precision": "fp16", "runtime": "onnxruntime>=1.32", "verified": False,
                  "execution_providers": ["CUDAExecutionProvider", "CPUExecutionProvider"],
                  "unverified_reason": "no CUDA device on the publishing host: outputs checked on the CPU only",
                  "metrics": {"accuracy": ACCURACY}},
    "mobile": {"precision": "int8", "format": "ort", "runtime": "onnxruntime>=1.32", "verified": True,
               "metrics": {"accuracy": 0.9666666666666667}},
    "openvino-fp32": {"format": "openvino", "runtime": "openvino>=2026.4", "verified": True,
                      "execution_providers": ["CPU"], "measured_on": {**MEASURED, "runtime": "openvino",
                                                                      "runtime_version": "2026.4.0",
                                                                      "execution_provider": "CPU"},
                      "metrics": {"latency_p50_ms": 12.3456, "accuracy": ACCURACY}},
    "openvino-int8": {"precision": "int8", "format": "openvino", "runtime": "openvino>=2026.4", "verified": True,
                      "execution_providers": ["CPU"], "metrics": {"latency_p50_ms": 123.456, "accuracy": 0.95}},
}


def _publish(tmp_path: Path, name: str = "lenet-digits", version: str = "1.0.0", **kw) -> LocalZoo:
    z = LocalZoo()  # ZOO_HOME from conftest: the one the subprocesses see
    z.publish(make_staging(tmp_path / f"s-{name}-{version}", name=name, version=version,
                           **({"builds": BUILDS, "big_bytes": 250_000, "task": "image-classification",
                               "description": "LeNet-5 on scikit-learn's 8x8 digits, upsampled to 16x16"} | kw)))
    return z


def _imported(args: list[str], env: dict | None = None) -> tuple[subprocess.CompletedProcess, set[str]]:
    import os

    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "zoo", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})})
    return proc, {line.split("|")[-1].strip().split(".")[0] for line in proc.stderr.splitlines() if "|" in line}


# ---- --version ------------------------------------------------------------------------------
def test_version_prints_the_distributions_version_and_imports_nothing_heavy():
    proc, imported = _imported(["--version"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"zoo {dist_version('zoo-onnx')}\n"
    assert not imported & set(HEAVY), imported & set(HEAVY)


# ---- shell completion -----------------------------------------------------------------------
@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_show_completion_prints_the_script_of_the_shell_it_runs_in_zsh_by_a_stand_in(tmp_path, shell):
    """typer detects the shell `zoo` runs in from its parent processes; zsh is a stand-in there: bash
    started under the name zsh (what the detection reads), as this machine has no zsh."""
    import os

    (tmp_path / shell).symlink_to("/bin/bash")
    # `; true`: bash must not exec python in its own place, or python's parent would not be that shell
    proc = subprocess.run([str(tmp_path / shell), "-c", f"'{sys.executable}' -m zoo --show-completion; true"],
                          capture_output=True, text=True, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr
    assert f"_ZOO_COMPLETE=complete_{shell}" in proc.stdout
    assert re.search(r"^(complete -o default -F _zoo_completion zoo|#compdef zoo)$", proc.stdout, re.M), proc.stdout
    assert "not supported" not in proc.stdout + proc.stderr


def _complete_bash(words: str) -> list[str]:
    parts = words.split(" ")
    r = zoo(env={"_ZOO_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": str(len(parts) - 1)})
    assert r.code == 0, r.text
    return r.out.split()


def test_completion_protocol_completes_commands_model_names_versions_and_remotes(tmp_path):
    _publish(tmp_path)
    _publish(tmp_path, version="1.1.0")
    assert zoo("remote", "add", "team", tmp_path / "remote").code == 0
    assert _complete_bash("zoo li") == ["list"]
    assert set(_complete_bash("zoo re")) == {"release", "remote", "repro"}
    assert _complete_bash("zoo remote rem") == ["remove"]
    assert _complete_bash("zoo show len") == ["lenet-digits"]
    assert _complete_bash("zoo pull lenet-digits@") == ["lenet-digits@1.1.0", "lenet-digits@1.0.0",
                                                        "lenet-digits@latest"]
    assert _complete_bash("zoo list --remote t") == ["team"]
    assert _complete_bash("zoo show nothing-like-it") == []
    # zsh: typer's protocol (the words so far in _TYPER_COMPLETE_ARGS)
    r = zoo(env={"_ZOO_COMPLETE": "complete_zsh", "_TYPER_COMPLETE_ARGS": "zoo rm len"})
    assert r.code == 0 and "lenet-digits" in r.out, r.text


# ---- --json ---------------------------------------------------------------------------------
CHAIN = """\
schema_version: 1
name: chain
version: 0.1.0
stages:
  a: {kind: writer, config: {text: "payload"}}
  b: {kind: concat, needs: [a]}
"""


def _json(*args) -> dict | list:
    r = zoo(*args, "--json")
    assert r.code == 0, (args, r.text)
    doc = json.loads(r.out)
    for obj in doc if isinstance(doc, list) else [doc]:
        assert isinstance(obj, dict) and isinstance(obj.get("schema_version"), int), (args, obj)
    return doc


def _commands(command, prefix: tuple[str, ...] = ()):
    subcommands = getattr(command, "commands", None)
    if not subcommands:
        yield " ".join(prefix), command
        return
    for name, sub in subcommands.items():
        yield from _commands(sub, prefix + (name,))


def test_every_command_takes_json_and_docs_cli_json_lists_its_shape():
    import typer

    from conftest import REPO
    from zoo.cli.main import app

    # the commands named in the first cell of each table row ("`list NAME`, `list --versions`" names list)
    documented = {c for row in re.findall(r"^\| (`.+?`) \|", (REPO / "docs/cli-json.md").read_text(), re.M)
                  for c in re.findall(r"`([a-z][a-z -]*?)(?: [A-Z\[-][^`]*)?`", row)}
    commands = dict(_commands(typer.main.get_command(app)))
    assert len(commands) > 20
    for name, command in commands.items():
        assert any("--json" in getattr(p, "opts", ()) for p in command.params), name
        assert name in documented, f"docs/cli-json.md has no row for `{name}`"


def test_every_command_that_lacked_json_prints_its_documented_shape(tmp_path):
    _publish(tmp_path)
    recipe = write_recipe(tmp_path, CHAIN)
    doc = _json("validate", recipe)
    assert doc["ok"] is True and doc["name"] == "chain" and [s["id"] for s in doc["stages"]] == ["a", "b"]
    assert doc["stages"][1] == {"id": "b", "kind": "concat", "needs": ["a"]}
    doc = _json("schema")
    assert doc["output"] is None and doc["schema"]["title"] and "stages" in doc["schema"]["properties"]
    doc = _json("schema", "-o", tmp_path / "s.json")
    assert doc == {"schema_version": 1, "output": str(tmp_path / "s.json"), "schema": None}
    assert json.loads((tmp_path / "s.json").read_text())["properties"]["stages"]
    doc = _json("gc", "--dry-run")
    assert doc["dry_run"] is True and {"bytes_freed", "objects_removed", "entries_removed", "cache_dir"} <= set(doc)
    kinds = _json("kinds")
    assert {"kind": "writer", "origin": "plugin"} in [{k: x[k] for k in ("kind", "origin")} for x in kinds]
    assert {"kind": "verify", "origin": "built-in"} in [{k: x[k] for k in ("kind", "origin")} for x in kinds]
    assert _json("tag", "lenet-digits@1.0.0", "prod") == {"schema_version": 1, "ref": "lenet-digits@1.0.0",
                                                          "tag": "prod", "remote": "local"}
    doc = _json("remote", "add", "team", tmp_path / "remote")
    assert doc["name"] == "team" and doc["url"] == str(tmp_path / "remote")
    assert [r["name"] for r in _json("remote", "list")] == ["team"]
    assert _json("remote", "remove", "team") == {"schema_version": 1, "removed": "team"}
    doc = _json("rm", "lenet-digits@1.0.0")
    assert doc["ref"] == "lenet-digits@1.0.0" and doc["tags_dropped"] == ["latest", "prod"] and doc["latest"] is None
    assert _json("list") == []


def test_commands_that_had_json_carry_schema_version(tmp_path):
    _publish(tmp_path)
    assert [m["name"] for m in _json("list")] == ["lenet-digits"]
    assert [v["version"] for v in _json("list", "lenet-digits")] == ["1.0.0"]
    assert _json("show", "lenet-digits")["schema_version"] == 3  # the manifest's own schema
    rows = _json("search", "lenet")
    assert [r["build"] for r in rows] == sorted(BUILDS)
    fp32 = next(r for r in rows if r["build"] == "cpu-fp32")
    assert fp32["accuracy"] == ACCURACY and fp32["size"] > 250_000 and len(fp32["sha256"]) == 64
    assert _json("fsck")["ok"] is True


def test_a_failing_command_with_json_prints_one_error_object(tmp_path):
    _publish(tmp_path)
    r = zoo("show", "lenet-digts", "--json")
    assert r.code == 2
    doc = json.loads(r.out)
    assert doc["ok"] is False and doc["schema_version"] == 1
    assert doc["error"]["type"] == "NotFound" and doc["error"]["exit_code"] == 2
    assert "lenet-digts" in doc["error"]["message"] and "lenet-digits" in doc["error"]["hint"]
    assert r.err == ""  # --json: the document only (docs/cli-json.md)
    r = zoo("show", "lenet-digts")
    assert r.code == 2 and "error: no model called 'lenet-digts'" in r.err and "ZOO_DEBUG" not in r.err
    r = zoo("validate", tmp_path / "missing.yaml", "--json")
    assert r.code == 2 and json.loads(r.out)["error"]["type"] == "RecipeError"


@pytest.mark.parametrize("args, message, command", [
    (["show"], "Missing argument 'ref'.", "zoo show"),
    (["list", "--bogus"], "No such option: --bogus", "zoo list"),
    (["bogus"], "No such command 'bogus'.", "zoo"),
])
def test_a_command_line_the_parser_refuses_gives_the_json_error_object_too(args, message, command):
    r = zoo(*args, "--json")
    assert r.code == 2
    doc = json.loads(r.out)  # the whole of stdout is one document
    assert doc == {"schema_version": 1, "ok": False,
                   "error": {"type": "UsageError", "message": message, "hint": f"see `{command} --help`",
                             "exit_code": 2, "table": ""}}
    assert r.err == ""  # the usage text is the document's message, not printed as well
    assert f"Error: {message}" in zoo(*args).err  # without --json: the framework's usage message


def test_a_command_that_exits_2_after_its_document_prints_no_second_one(tmp_path):
    r = zoo("list", "nothing-here", "--json")
    assert r.code == 2
    assert json.loads(r.out)["error"]["type"] == "NotFound"  # one document: json.loads refuses two


def test_a_failed_run_with_json_has_the_same_error_object(tmp_path):
    recipe = write_recipe(tmp_path, SHIPPED.replace("minimum: 3", "minimum: 30"))
    r = zoo("run", recipe, "--json")
    assert r.code == 1, r.text
    doc = json.loads(r.out)
    assert doc["ok"] is False and doc["error"]["type"] == "GateFailed" and doc["error"]["exit_code"] == 1
    assert doc["error"] == next(s["error"] for s in doc["stages"] if s["id"] == "check")


# ---- tables ---------------------------------------------------------------------------------
def _fits(text: str, columns: int = 80) -> None:
    long = [line for line in text.splitlines() if len(line) > columns]
    assert not long, "\n".join(long)


def test_tables_fit_80_columns_with_rounded_numbers_human_sizes_and_short_sha256(tmp_path):
    z = _publish(tmp_path)
    manifest = z.resolve("lenet-digits@1.0.0")
    narrow = {"COLUMNS": "80"}
    show = zoo("show", "lenet-digits", env=narrow)
    assert show.code == 0, show.text
    _fits(show.out)
    # the publish time as people read it: to the second, in UTC, saying so (no microseconds)
    assert re.search(r"^  created: \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$", show.out, re.M), show.out
    rows = {line.split()[0]: line.split() for line in show.out.splitlines() if line.split()[:1] and
            line.split()[0] in BUILDS}
    header = next(line.split() for line in show.out.splitlines() if line.startswith("build "))
    # what a build is judged by stays in the table at 80 columns, each value whole on its row
    assert header == ["build", "precision", "size", "p50", "ms", "accuracy", "verified", "sha256"]
    assert rows["cpu-fp32"] == ["cpu-fp32", "fp32", "244", "KB", "0.0512", "0.9722", "yes",
                                manifest.builds["cpu-fp32"].file.sha256[:12]]
    assert rows["openvino-fp32"][4:6] == ["12.3", "0.9722"] and rows["openvino-int8"][4] == "123"
    assert rows["cuda-fp16"][4:7] == ["-", "0.9722", "NO"]
    assert "0.97222" not in show.out and "250" not in show.out.split("lineage:")[0]
    # the columns left out at 80 are listed under the table, and `measured on` below it
    assert re.search(r"^  mobile: format ort; runtime onnxruntime>=1\.32; providers CPUExecutionProvider", show.out,
                     re.M)
    assert "latency measured on:" in show.out and "AMD EPYC 9B14" in show.out
    wide = zoo("show", "lenet-digits")  # piped without COLUMNS: every column, whole values
    assert next(line.split() for line in wide.out.splitlines() if line.startswith("build ")) == [
        "build", "format", "precision", "size", "p50", "ms", "accuracy", "verified", "sha256", "runtime", "providers",
        "portable", "downloaded"]

    search = zoo("search", env=narrow)
    assert search.code == 0, search.text
    _fits(search.out)
    assert re.search(r"^lenet-digits +1\.0\.0 +cpu-fp32 +244 KB +0\.0512 +0\.9722 +[0-9a-f]{12}\b", search.out, re.M), \
        search.out
    for args in (["list"], ["list", "lenet-digits"], ["kinds"]):
        r = zoo(*args, env=narrow)
        assert r.code == 0, r.text
        _fits(r.out)


# ---- unknown names --------------------------------------------------------------------------
@pytest.mark.parametrize("args", [["list", "lenet-digts"], ["show", "lenet-digts"], ["pull", "lenet-digts"],
                                  ["tag", "lenet-digts@1.0.0", "prod"], ["rm", "lenet-digts@1.0.0"],
                                  ["list", "lenet-digts", "--remote", "team"],
                                  ["show", "lenet-digts", "--remote", "team"]], ids=" ".join)
def test_an_unknown_name_is_exit_2_with_a_did_you_mean(tmp_path, args):
    _publish(tmp_path)
    assert zoo("remote", "add", "team", tmp_path / "remote").code == 0
    assert zoo("push", "lenet-digits@1.0.0", "--to", "team").code == 0
    r = zoo(*args)
    assert r.code == 2, r.text
    assert "lenet-digts" in r.err and "did you mean lenet-digits?" in r.err, r.err
    assert r.out == ""  # no empty table


def test_an_unknown_stage_in_needs_is_exit_2_with_a_did_you_mean(tmp_path):
    recipe = write_recipe(tmp_path, CHAIN.replace("needs: [a]", "needs: [aa]"))
    r = zoo("validate", recipe, "--json")
    assert r.code == 2, r.text
    error = json.loads(r.out)["error"]
    assert error["type"] == "RecipeError" and "recipe.yaml:6:" in error["message"] and "'aa'" in error["message"]
    assert error["hint"] == "did you mean 'a'?"


def test_an_unknown_name_with_nothing_close_names_where_to_look(tmp_path):
    _publish(tmp_path)
    r = zoo("list", "resnet-50")
    assert r.code == 2 and "no model called 'resnet-50'" in r.err and "zoo list" in r.err, r.err


# ---- search --remote ------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["folder", "s3"], indirect=True)
def test_search_remote_gives_the_rows_a_local_search_gives(publisher, consumer, backend):
    for ref in ("tiny@1.0.0", "tiny@1.1.0"):
        api.push(ref, "origin", zoo=publisher)
    api.tag("tiny@1.0.0", "prod", remote="origin", zoo=publisher)
    api.tag("tiny@1.0.0", "prod", zoo=publisher)
    for filters in ({}, {"all_versions": True}, {"max_latency": 1.5}, {"min_accuracy": 0.89, "all_versions": True},
                    {"tag": "prod", "all_versions": True}, {"text": "TINY"}, {"task": "regression"},
                    {"text": "no such words"}):
        local = api.search(zoo=publisher, **filters)
        assert api.search(remote="origin", zoo=consumer, **filters) == local, filters
    assert [(r["version"], r["build"]) for r in api.search(remote="origin", zoo=consumer, all_versions=True)] == [
        ("1.1.0", "cpu-fp32"), ("1.1.0", "cpu-int8"), ("1.0.0", "cpu-fp32")]
    assert not consumer.list()  # searching downloads nothing


def test_search_remote_on_the_command_line(tmp_path):
    _publish(tmp_path)
    assert zoo("remote", "add", "team", tmp_path / "remote").code == 0
    assert zoo("push", "lenet-digits@1.0.0", "--to", "team").code == 0
    local = _json("search", "lenet", "--max-latency", "1")
    assert [r["build"] for r in local] == ["cpu-fp32", "cpu-int8"]
    assert _json("search", "lenet", "--max-latency", "1", "--remote", "team") == local
    r = zoo("search", "--remote", "team", env={"COLUMNS": "80"})
    assert r.code == 0 and "openvino-int8" in r.out, r.text
    _fits(r.out)
    r = zoo("search", "--remote", "nowhere")
    assert r.code == 2 and "no remote called 'nowhere'" in r.err


# ---- hints that lead somewhere --------------------------------------------------------------
def test_a_failed_gate_names_its_value_and_recipe_line_and_suggests_no_rerun(tmp_path):
    recipe = write_recipe(tmp_path, SHIPPED.replace("minimum: 3", "minimum: 30"))
    r = zoo("run", recipe, cwd=tmp_path)
    assert r.code == 1, r.text
    assert "chars >= 30: got 7, at recipe.yaml:6:" in r.err, r.err  # the inspector words its gate: its config
    assert "--force" not in r.err and "retry with" not in r.err


def test_republishing_other_bytes_under_a_version_is_one_message_without_force(tmp_path):
    recipe = write_recipe(tmp_path, SHIPPED)
    assert zoo("run", recipe).code == 0
    recipe.write_text(SHIPPED.replace('"payload"', '"payloae"'))  # other bytes, same version
    r = zoo("run", recipe, cwd=tmp_path)
    assert r.code == 3, r.text
    assert "shipped@0.1.0 is already published with different content" in r.err
    hints = [line for line in r.err.splitlines() if line.startswith("hint:")]
    assert hints == ["hint: versions are immutable: bump `version:` in the recipe (recipe.yaml:3:10), or "
                     "`zoo rm shipped@0.1.0` if that local copy was never shared, then run the recipe again"], r.err
    assert "--force" not in r.err and "retry with" not in r.err


def test_verify_gates_are_found_at_their_line_in_the_recipe(tmp_path):
    """verify's own gates, as `zoo.api.run` explains them: a stand-in StageReport carrying the gate
    rows verify records (no model is trained here; the recipe is the shipped lenet-digits)."""
    from conftest import REPO
    from zoo import api as zoo_api
    from zoo.engine.failures import explain, retry_helps
    from zoo.engine.runner import StageReport, StageState
    from zoo.engine.worker import WorkerError

    dag = zoo_api.load(REPO / "recipes/lenet-digits.yaml")
    text = (REPO / "recipes/lenet-digits.yaml").read_text().splitlines()
    line = next(i for i, t in enumerate(text, 1) if "- cpu-int8.accuracy_drop <= 0.02" in t)
    col = text[line - 1].index("cpu-int8") + 1
    gates = [{"gate": "cpu-fp32.accuracy >= 0.9", "value": 0.95, "passed": True, "implicit": False},
             {"gate": "cpu-int8.accuracy_drop <= 0.02", "value": 0.0333333, "passed": False, "implicit": False}]
    report = StageReport(id="verify", kind="verify", needs=[], state=StageState.FAILED, metrics={"gates": gates},
                         error=WorkerError(type="GateFailed", message="verify: 1 of 2 gate(s) failed",
                                           hint="fix the model or the gate"))
    error = explain(report, dag)
    assert f"cpu-int8.accuracy_drop <= 0.02: got 0.03333, at recipes/lenet-digits.yaml:{line}:{col} " \
           "(stages.verify.config.gates.1)" in error.hint.replace(str(REPO) + "/", ""), error.hint
    assert "cpu-fp32.accuracy" not in error.hint  # the gate that passed is not named
    assert not retry_helps(error)
    assert retry_helps(WorkerError(type="RuntimeError", message="boom"))
