"""Typed values and what the docs say about them: `ExitCode` and README's exit-code table,
`ReasonCode` and docs/recipes.md's reason table, `StageState`; error classes that are also the builtin they
resemble; `WorkerError` (a failure crossing the worker boundary) and a closed stdout, through
real subprocess pipes."""

from __future__ import annotations

import json
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cli_helpers import write_recipe
from zoo import errors
from zoo.errors import ExitCode
from zoo.engine.explain import Reason, ReasonCode
from zoo.engine.runner import StageReport, StageState
from zoo.engine.worker import StageResult, WorkerError

README = Path(__file__).resolve().parent.parent / "README.md"
RECIPES_DOC = Path(__file__).resolve().parent.parent / "docs" / "recipes.md"


def _table_after(heading_line: str, doc: Path = README) -> list[list[str]]:
    """The rows (cells, stripped) of the first Markdown table after the line starting with `heading_line`."""
    lines = doc.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(heading_line))
    rows, seen_table = [], False
    for line in lines[start + 1:]:
        if line.startswith("|"):
            seen_table = True
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            if not set("".join(cells)) <= set("-: "):  # not the |---| line
                rows.append(cells)
        elif seen_table:
            break
    return rows[1:]  # without the header


def test_the_readme_exit_code_table_is_exit_code():
    rows = _table_after("### Exit codes")
    assert [int(r[0]) for r in rows] == [int(c) for c in ExitCode]
    assert len(rows) == len(ExitCode) and all(r[1] for r in rows)


def test_the_reason_table_of_the_recipes_doc_is_reason_code():
    rows = _table_after("Reasons `plan`", RECIPES_DOC)
    assert [r[0] for r in rows] == [f"`{c.value}`" for c in ReasonCode]


def test_every_error_class_exits_with_an_exit_code():
    classes = [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.ZooError)]
    assert len(classes) > 10
    for cls in classes:
        assert isinstance(cls.exit_code, ExitCode), cls


def test_errors_are_also_the_builtin_they_resemble():
    unreachable = errors.SourceUnreachable("cannot reach http://x", hint="check the network")
    assert isinstance(unreachable, ConnectionError) and isinstance(unreachable, errors.StorageError)
    assert unreachable.exit_code == ExitCode.STORAGE and str(unreachable) == "cannot reach http://x"
    with pytest.raises(LookupError):
        raise errors.NotFound("tiny@9.9.9 does not exist")
    # an error crosses a process boundary with its hint (a pool or dask worker pickles it)
    back = pickle.loads(pickle.dumps(unreachable))
    assert type(back) is errors.SourceUnreachable and back.hint == "check the network"
    # where a builtin base would make zoo's own handlers swallow the error, there is none
    assert not issubclass(errors.IntegrityError, ValueError) and not issubclass(errors.NoSpace, OSError)


def test_states_and_reasons_read_as_their_text():
    report = StageReport(id="s", kind="k", needs=[], state=StageState.SKIPPED,
                         reasons=[Reason(ReasonCode.NOT_RUN, "run stopped")])
    data = json.loads(json.dumps(report.to_json()))
    assert data["state"] == "skipped" and data["reasons"] == ["not run: run stopped"]
    assert StageState.RAN == "done" and f"{StageState.WILL_RUN}" == "will run"


def test_a_worker_error_carries_a_zoo_errors_exit_code_hint_and_table():
    try:
        raise errors.GateFailed("accuracy 0.5 < 0.9", table="accuracy  0.5  FAIL", hint="train longer")
    except errors.GateFailed as e:
        err = WorkerError.from_exception(e)
    assert (err.type, err.exit_code, err.hint, err.table) == ("GateFailed", ExitCode.FAILED, "train longer",
                                                            "accuracy  0.5  FAIL")
    assert "raise errors.GateFailed" in err.traceback
    assert err.to_json() == {"type": "GateFailed", "message": "accuracy 0.5 < 0.9", "hint": "train longer",
                             "exit_code": 1, "table": "accuracy  0.5  FAIL"}  # no traceback in --json
    bug = WorkerError.from_exception(KeyError("x"))
    assert (bug.type, bug.exit_code, bug.hint) == ("KeyError", ExitCode.FAILED, None)
    result = pickle.loads(pickle.dumps(StageResult(duration_s=1.0, error=err)))
    assert not result.ok and result.error == err
    assert StageResult(outputs={"model": "model.onnx"}).ok


def test_a_failed_stage_brings_its_error_back_from_the_worker_process(tmp_path):
    import zoo

    def failed_error(config: str) -> WorkerError:
        recipe = write_recipe(tmp_path, f"schema_version: 1\nname: f\nversion: 0.1.0\nstages:\n"
                                        f"  s: {{kind: failing, config: {config}}}\n")
        result = zoo.run(recipe)
        assert result.exit_code() == ExitCode.FAILED and result.to_json()["exit_code"] == 1
        shown = result.to_json()["stages"][0]["error"]
        assert shown["type"] == result.stages[0].error.type and "traceback" not in shown
        return result.stages[0].error

    gate = failed_error("{gate: true, message: accuracy too low}")
    assert isinstance(gate, WorkerError) and (gate.type, gate.message) == ("GateFailed", "accuracy too low")
    assert gate.table.startswith("metric  value  gate") and gate.exit_code == ExitCode.FAILED
    bug = failed_error("{message: a bug}")
    assert (bug.type, bug.message, bug.hint) == ("RuntimeError", "a bug", None) and "RuntimeError" in bug.traceback


@pytest.mark.parametrize("args", [["list"], ["search", "tiny"], ["kinds"], ["schema"], ["show", "tiny"],
                                  ["list", "--json"], ["--help"]], ids=" ".join)
def test_a_closed_stdout_ends_quietly(args, tmp_path):
    """The reading end of stdout is closed before zoo writes (as `| head -1` does once it has its line)."""
    from zoo.registry.store import LocalZoo
    from registry_servers import make_staging

    LocalZoo().publish(make_staging(tmp_path / "s"))
    proc = subprocess.Popen([sys.executable, "-m", "zoo", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == ExitCode.FAILED, err
    assert "Traceback" not in err and "Exception ignored" not in err and "BrokenPipe" not in err, err


def test_a_closed_stdout_ends_the_no_op_fast_path_quietly(tmp_path):
    recipe = write_recipe(tmp_path, "schema_version: 1\nname: fast\nversion: 0.1.0\nstages:\n  s: {kind: writer}\n")
    first = subprocess.run([sys.executable, "-m", "zoo", "run", str(recipe)], capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    proc = subprocess.Popen([sys.executable, "-m", "zoo", "run", str(recipe)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == ExitCode.FAILED and "Traceback" not in err, err
