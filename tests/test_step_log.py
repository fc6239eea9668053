"""Progress lines of a stage's long loops (zoo_stages/lib/runtimes/step_log.py): calibration batches and
latency runs log ``LABEL i/N``, which `zoo run` shows as a count with an ETA (zoo/cli/activity.py)."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from zoo.cli.activity import parse_step
from zoo_stages.lib.runtimes import step_log
from zoo_stages.lib.runtimes.step_log import StepLog


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def log(caplog):
    caplog.set_level(logging.INFO, logger="zoo.test.steps")
    return logging.getLogger("zoo.test.steps")


def _steps(caplog) -> list[tuple[str, int, int]]:
    steps = [parse_step(r.getMessage()) for r in caplog.records]
    return [(s.label, s.i, s.n) for s in steps if s is not None]


def test_the_first_and_last_step_and_at_most_one_line_per_interval(log, caplog, monkeypatch):
    clock = Clock()
    monkeypatch.setattr(step_log.time, "monotonic", clock)
    steps = StepLog(log, "latency cpu-int8", 200, every_s=0.5)
    for i in range(1, 201):
        clock.t = i * 0.01  # 10 ms a run: 2 s in all
        steps(i)
    logged = _steps(caplog)
    assert logged[0] == ("latency cpu-int8", 1, 200) and logged[-1] == ("latency cpu-int8", 200, 200)
    assert [i for _, i, _ in logged] == [1, 51, 101, 151, 200]  # 200 runs, 5 lines


def test_no_logger_no_lines(caplog):
    StepLog(None, "calibration", 3)(1)
    assert caplog.records == []


def test_each_latency_run_is_counted_outside_the_timed_region():
    from zoo_stages.lib.runtimes import timing

    class Session:
        runs = 0

        def get_inputs(self):
            return []

        def run(self, outputs, feed):
            Session.runs += 1

    seen: list[int] = []
    timing.measure_latency(Session(), {}, warmup=2, runs=5, progress=seen.append)
    assert seen == [1, 2, 3, 4, 5] and Session.runs == 7  # warm-up runs are not counted
    seen.clear()
    timing.compare_latency({"a": Session(), "b": Session()}, {}, warmup=1, runs=3, progress=seen.append)
    assert seen == [1, 2, 3]  # one per round of every session


def test_calibration_logs_the_batches_the_calibrator_took(log, caplog):
    from zoo_stages.lib.quantization.quant_ops import calibration_reader

    reader = calibration_reader({"x": np.zeros((10, 3), np.float32)}, batch_size=4, fixed=False, log=log)
    while reader.get_next() is not None:
        pass
    assert _steps(caplog) == [("calibration", 1, 3), ("calibration", 3, 3)]  # 10 samples in batches of 4
