"""What `zoo run` shows while stages run (epoch, loss, metric, ETA; plain lines when not a
terminal; `-v` streaming a stage's log), the log's path on failure, and Ctrl-C.

The stage is the test kind `ticker` (tests/plugins): it logs one line per epoch as train does and
prints one as a custom `entry` would; with `go` it waits for a file before its last epoch, so a
test can read the output while the stage is still running (no timed assertions)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import zoo
from cli_helpers import write_recipe, zoo as zoo_cli
from zoo.cli.activity import StageActivity, parse_step
from zoo.cli.progress import PlainProgress, RichProgress
from zoo.engine.runner import StageReport, StageState

TICKER = """\
schema_version: 1
name: tick
version: 0.1.0
stages:
  train:
    kind: ticker
    config: CONFIG
"""


def _recipe(folder: Path, **config) -> Path:
    return write_recipe(folder, TICKER.replace("CONFIG", json.dumps(config)))


class Clock:
    """A stand-in clock the test moves by hand."""

    def __init__(self, t: float = 100.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def _running(sid: str = "train") -> StageReport:
    return StageReport(id=sid, kind="ticker", needs=[], state=StageState.RUNNING, started=1.0,
                       log_path="/c/logs/k.log", live_log="/c/tmp/run/train/stage.log")


def _epoch(i: int, n: int = 10, loss: float = 0.412, acc: float = 0.93) -> str:
    return f"2026-11-24 00:28:01,123 INFO epoch {i}/{n}: train_loss {loss:.4f} train_accuracy {acc:.4f}"


# --- reading a log ----------------------------------------------------------------------------

@pytest.mark.parametrize("line, expected", [
    (_epoch(3), ("epoch", 3, 10, [("train_loss", 0.412), ("train_accuracy", 0.93)])),
    ("calibration 4/16", ("calibration", 4, 16, [])),  # the line proposed for quantize's calibration
    ("latency cpu-int8 120/200: p50_ms 1.25", ("latency cpu-int8", 120, 200, [("p50_ms", 1.25)])),
    ("Epoch 2/5", ("Epoch", 2, 5, [])),  # Keras' own line, from a custom entry's output
    ("epoch 3/10: loss=0.5, val_accuracy=0.75", ("epoch", 3, 10, [("loss", 0.5), ("val_accuracy", 0.75)])),
])
def test_step_lines_are_read_with_their_figures(line, expected):
    step = parse_step(line)
    assert step is not None and (step.label, step.i, step.n, step.figures) == expected


@pytest.mark.parametrize("line", ["stage train (ticker) starting with 2 thread(s)", "read 3/4 files of data",
                                  "epoch 11/10", "exported model.onnx (dynamo, opset 17): parity max_abs 1e-06"])
def test_other_lines_are_not_steps(line):
    assert parse_step(line) is None


def test_eta_from_the_pace_of_the_epochs():
    activity = StageActivity(started=0.0)
    activity.feed(["stage train (ticker) starting with 2 thread(s)"], now=1.0)
    assert activity.detail(1.0) == "stage train (ticker) starting with 2 thread(s)"  # no step yet: the latest line
    activity.feed([_epoch(1)], now=10.0)  # one step seen: no pace yet (the 10 s since the start hold set-up)
    assert activity.detail(10.0) == "epoch 1/10 · train_loss 0.412 · train_accuracy 0.93"
    activity.feed([_epoch(3, loss=0.2)], now=16.0)  # from epoch 1 to 3: 3 s per epoch, 7 left
    assert activity.detail(16.0) == "epoch 3/10 · train_loss 0.2 · train_accuracy 0.93 · ETA 0:21"
    assert activity.detail(20.0).endswith("ETA 0:17")  # the clock runs on between lines
    activity.feed(["entry says: hello"], now=21.0)
    assert activity.detail(21.0).startswith("epoch 3/10")  # a count, once seen, is what is shown
    activity.feed(["calibration 1/4"], now=30.0)  # another label: a count of its own
    assert activity.detail(30.0) == "calibration 1/4"
    activity.feed(["calibration 2/4"], now=32.0)
    assert activity.detail(32.0) == "calibration 2/4 · ETA 0:04"


# --- the two displays ---------------------------------------------------------------------------

def test_the_live_table_shows_epoch_loss_metric_and_eta():
    from rich.console import Console

    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=120, color_system=None)
    clock = Clock(0.0)
    progress = RichProgress(["train", "export"], {"train": "train", "export": "export"}, console=console, clock=clock)
    report = _running()
    progress.update(report)
    clock.t = 10.0
    progress.log(report, [_epoch(1)])
    clock.t = 16.0
    progress.log(report, [_epoch(3), "[not markup] a printed line"])
    console.print(progress._render())
    text = buffer.getvalue()
    row = next(line for line in text.splitlines() if line.startswith("train"))
    assert "epoch 3/10 · train_loss 0.412 · train_accuracy 0.93 · ETA 0:21" in row
    assert "running" in row


def test_the_live_table_streams_log_lines_with_verbose():
    from rich.console import Console

    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=200, color_system=None)
    progress = RichProgress(["train"], {"train": "ticker"}, console=console, verbose=True, clock=Clock())
    report = _running()
    progress.update(report)
    progress.log(report, ["entry says: [bold]hi[/bold]"])
    text = buffer.getvalue()
    assert "train: log /c/tmp/run/train/stage.log (kept as /c/logs/k.log)" in text
    assert "train | entry says: [bold]hi[/bold]" in text  # as printed, never read as markup


def test_plain_lines_are_rate_limited_per_stage():
    out = io.StringIO()
    clock = Clock(0.0)
    progress = PlainProgress(out, clock=clock, every_s=10, quiet_s=60)
    report = _running()
    progress.update(report)
    printed = lambda: [line for line in out.getvalue().splitlines() if line.startswith("[zoo] train: ")][1:]  # noqa: E731
    clock.t = 1.0
    progress.log(report, ["stage train (ticker) starting with 2 thread(s)"])
    assert printed() == []  # not a count: waits for its turn
    clock.t = 2.0
    progress.log(report, [_epoch(1)])
    assert printed() == ["[zoo] train: epoch 1/10 · train_loss 0.412 · train_accuracy 0.93"]  # at once
    for t in (3.0, 5.0, 8.0):  # news within 10 s of the last line: not printed
        clock.t = t
        progress.log(report, [_epoch(int(t))])
    assert len(printed()) == 1
    clock.t = 12.5
    progress.log(report, [])  # a tick 10 s later prints the news it held back
    assert printed()[-1].startswith("[zoo] train: epoch 8/10")
    clock.t = 20.0
    progress.log(report, [])  # nothing new: nothing printed...
    assert len(printed()) == 2
    clock.t = 72.5
    progress.log(report, [])  # ...until 60 s have gone by without a line
    assert printed()[-1].startswith("[zoo] train: running for 1:12 · epoch 8/10")


# --- a real run, in a subprocess ----------------------------------------------------------------

AS_IN_A_TERMINAL = ("import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
                    "runpy.run_module('zoo', run_name='__main__', alter_sys=True)")


def _start(args, cwd: Path) -> subprocess.Popen:
    # PYTHONFAULTHANDLER: a run that hangs prints every thread's stack when `_rest` aborts it.
    # SIGINT as in a terminal: a process started with SIGINT ignored (pytest run as a background job,
    # as CI runners may) passes that on through exec, and Python then keeps ignoring it (as it should)
    return subprocess.Popen([sys.executable, "-c", AS_IN_A_TERMINAL, *map(str, args)], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "PYTHONFAULTHANDLER": "1"})


def _read_until(proc: subprocess.Popen, needle: str) -> list[str]:
    """The stdout lines up to the first one holding `needle` (fails if the process ends first)."""
    lines = []
    for line in proc.stdout:
        lines.append(line.rstrip("\n"))
        if needle in line:
            return lines
    raise AssertionError(f"{needle!r} never came; stdout: {lines}; stderr: {proc.stderr.read()}")


def _rest(proc: subprocess.Popen) -> tuple[str, str]:
    """The rest of stdout and stderr once the process ends (through the same buffered readers as
    `_read_until`: `communicate` would read the pipes underneath and lose what they hold); killed
    after 60 s, its threads' stacks on stderr first (SIGABRT, which faulthandler reports)."""
    import threading
    import time

    def hung():  # a hung run fails the test (-6 or -9) and says where it hung
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGABRT)
            time.sleep(3)
            os.killpg(proc.pid, signal.SIGKILL)

    deadline = threading.Timer(60, hung)
    deadline.start()
    try:
        out, err = proc.stdout.read(), proc.stderr.read()
        proc.wait()
    finally:
        deadline.cancel()
    return out, err


def test_plain_output_shows_epochs_while_the_stage_runs(tmp_path):
    recipe = _recipe(tmp_path, epochs=3, seconds=0.2, go="go")
    proc = _start(["run", recipe], tmp_path)
    try:
        before = _read_until(proc, "[zoo] train: epoch ")
        # the stage cannot end before `go` exists: these lines were printed while it ran
        assert not (tmp_path / "go").exists() and not any("done in" in line for line in before)
        # the first epoch line the runner saw: 1/3 (no ETA from one epoch), or 2/3 when a loaded host
        # polled the log after both
        assert re.match(r"\[zoo\] train: epoch (1/3 · train_loss 1 · train_accuracy 0.3333|"
                        r"2/3 · train_loss 0.5 · train_accuracy 0.6667 · ETA \d+:\d\d)$", before[-1]), before
        (tmp_path / "go").write_text("")
        out, err = _rest(proc)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "[zoo] train: done in" in out
    assert "entry says" not in out  # a stage's own output is shown with -v only


def test_verbose_prints_the_log_path_and_streams_the_stage_output(tmp_path):
    recipe = _recipe(tmp_path, epochs=2, seconds=0.1, go="go")
    proc = _start(["run", recipe, "-v"], tmp_path)
    try:
        before = _read_until(proc, "train | entry says: finished epoch 1")
        (tmp_path / "go").write_text("")
        out, err = _rest(proc)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    note = next(line for line in before if line.startswith("[zoo] train: log "))
    live, kept = note.removeprefix("[zoo] train: log ").removesuffix(")").split(" (kept as ")
    assert Path(live).name == "stage.log" and not Path(live).exists()  # the workspace is gone after the run
    assert Path(kept).parent.name == "logs"
    streamed = [line.split(" | ", 1)[1] for line in before + out.splitlines() if line.startswith("  train | ")]
    assert streamed == Path(kept).read_text().splitlines()  # every line of the log, in order
    assert any(line.endswith("INFO epoch 2/2: train_loss 0.5000 train_accuracy 1.0000") for line in streamed)


def test_the_api_hands_log_lines_over_while_the_stage_runs(tmp_path):
    recipe = _recipe(tmp_path, epochs=2, seconds=0.1, go="go")
    seen: list[tuple[str, list[str]]] = []

    def on_log(report, lines):
        seen.append((report.state, lines))
        if any("entry says: finished epoch 1" in line for line in lines):
            (tmp_path / "go").write_text("")  # let it finish only once the first epoch came through

    result = zoo.run(recipe, on_log=on_log)
    assert result.ok
    while_running = [line for state, lines in seen if state == StageState.RUNNING for line in lines]
    assert any("epoch 1/2" in line for line in while_running)
    every = [line for _, lines in seen for line in lines]
    assert every == Path(result.stages[0].log_path).read_text().splitlines()  # each line once, the last ones too
    assert "stage train done in" in every[-1]


def test_a_failed_stage_names_its_log(tmp_path):
    recipe = _recipe(tmp_path, epochs=1, seconds=0, fail=True)
    cli = zoo_cli("run", recipe)
    assert cli.code == 1
    line = next(line for line in cli.err.splitlines() if line.startswith("log: "))
    log = Path(line.removeprefix("log: "))
    assert "ticker failed on purpose" in log.read_text()
    data = json.loads(zoo_cli("run", recipe, "--json").out)
    assert data["stages"][0]["log"] == str(log)  # --json: the stage's `log` field, as before


# --- Ctrl-C -------------------------------------------------------------------------------------

@pytest.mark.parametrize("whom", ["group", "zoo"])
def test_ctrl_c_says_what_it_stopped_and_leaves_no_temporary_files(tmp_path, whom):
    """`group`: Ctrl-C in a terminal (SIGINT to every process of the run, workers included);
    `zoo`: `kill -INT` of the zoo process alone (its workers must be stopped, not waited for: the
    stage would run for 1000 s)."""
    recipe = _recipe(tmp_path, epochs=2000, seconds=0.5, scratch_mb=20, marker="started")
    cache = Path(os.environ["ZOO_CACHE_DIR"])
    proc = _start(["run", recipe], tmp_path)
    try:
        _read_until(proc, "[zoo] train: epoch 1/2000")
        assert (tmp_path / "started").exists()
        assert sum(p.stat().st_size for p in (cache / "tmp").rglob("*") if p.is_file()) >= 20 << 20
        if whom == "group":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            os.kill(proc.pid, signal.SIGINT)
        out, err = _rest(proc)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("interrupted: stage train (after ")
    assert f" of zoo run {recipe}; nothing was half-published (" in lines[0]
    assert not list((cache / "tmp").rglob("*")), "the run left temporary files"
    assert not list((cache / "entries").rglob("*.json"))  # nothing recorded
    worker = int((tmp_path / "started").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(worker, 0)  # the stage's process is gone too


def test_a_line_that_names_its_stage_is_not_prefixed_twice():
    """Kinds start their log lines with their name ("deploy: cpu-fp32 parity …"): shown under the
    stage's name, the line does not say "deploy: deploy:"; another stage's name stays."""
    out = io.StringIO()
    clock = Clock(0.0)
    progress = PlainProgress(out, clock=clock, every_s=10, quiet_s=60)
    report = _running("deploy")
    progress.update(report)
    clock.t = 11.0
    progress.log(report, ["2026-11-28 09:25:21,776 INFO deploy: cuda-fp16 parity on held-out split (360 samples)"])
    assert out.getvalue().splitlines()[-1] == "[zoo] deploy: cuda-fp16 parity on held-out split (360 samples)"
    ship = _running("ship")
    progress.update(ship)
    clock.t = 22.0
    progress.log(ship, ["2026-11-28 09:25:21,776 INFO deploy: cuda-fp16 test vectors"])
    assert out.getvalue().splitlines()[-1] == "[zoo] ship: deploy: cuda-fp16 test vectors"
    matrix = _running("export[resnet]")
    progress.update(matrix)
    clock.t = 33.0
    progress.log(matrix, ["export: wrote model.onnx"])
    assert out.getvalue().splitlines()[-1] == "[zoo] export[resnet]: wrote model.onnx"
