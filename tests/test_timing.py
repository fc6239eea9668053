"""Tests of zoo_stages.lib.runtimes.timing: latency, interleaved comparison, throughput (stand-in clock
and sessions for what a figure must be; a real session only for what holds on any machine)."""

from __future__ import annotations

import numpy as np
import pytest

from onnx_models import linear_model
from zoo.errors import InvalidInput
from zoo_stages.lib.runtimes import ort_session, timing


class _StandInClock:
    """Stand-in for `time` in zoo_stages.lib.runtimes.timing: perf_counter_ns only moves when a stand-in session runs."""

    def __init__(self):
        self.now_ns = 0

    def perf_counter_ns(self) -> int:
        return self.now_ns


class _StandInSession:
    """Stand-in for an InferenceSession whose runs take the given milliseconds on the stand-in
    clock, in turn (the last one repeats); records the batch sizes it was fed."""

    def __init__(self, clock: _StandInClock, ms: list[float], batch="N"):
        self.clock, self.ms, self.calls, self.batches = clock, list(ms), 0, []
        self.batch = batch

    def get_inputs(self):
        from types import SimpleNamespace

        return [SimpleNamespace(name="x", shape=[self.batch, 1, 4, 4], type="tensor(float)")]

    def run(self, outputs, feed):
        self.batches.append(len(feed["x"]))
        self.clock.now_ns += round(self.ms[min(self.calls, len(self.ms) - 1)] * 1e6)
        self.calls += 1
        return [feed["x"]]


@pytest.fixture
def clock(monkeypatch):
    c = _StandInClock()
    monkeypatch.setattr(timing, "time", c)
    return c


def test_latency_percentiles_with_a_stand_in_clock(clock):
    x = {"x": np.zeros((1, 1, 4, 4), np.float32)}
    # two warm-up runs (untimed, 100 ms each), then nine timed runs of 1..9 ms in shuffled order
    session = _StandInSession(clock, [100, 100, 5, 1, 9, 3, 7, 2, 8, 4, 6])
    stats = timing.measure_latency(session, x, warmup=2, runs=9)
    assert session.calls == 11
    assert stats == {"p50_ms": 5.0, "p90_ms": pytest.approx(8.2), "mean_ms": 5.0, "min_ms": 1.0, "runs": 9,
                     "warmup": 2}
    with pytest.raises(InvalidInput, match="at least 1"):
        timing.measure_latency(session, x, runs=0)


def test_throughput_from_the_median_batch_time_with_a_stand_in_clock(clock):
    samples = {"x": np.zeros((5, 1, 4, 4), np.float32)}
    session = _StandInSession(clock, [4.0])
    assert timing.measure_throughput(session, samples, [1, 8], warmup=1, runs=3) == {"1": 250.0, "8": 2000.0}
    assert session.batches == [1] * 4 + [8] * 4
    fixed = _StandInSession(clock, [4.0], batch=1)
    assert timing.measure_throughput(fixed, samples, [1, 8], warmup=0, runs=2) == {"1": 250.0, "8": None}


def test_compare_latency_stops_early_only_when_clearly_apart_with_a_stand_in_clock(clock):
    x = {"x": np.zeros((1, 1, 4, 4), np.float32)}
    fast, slow = _StandInSession(clock, [1.0]), _StandInSession(clock, [2.0])
    stats = timing.compare_latency({"a": fast, "b": slow}, x, warmup=1, runs=30, min_runs=5)
    assert stats["a"]["runs"] == stats["b"]["runs"] == 5 and stats["a"]["stopped_early"] is True
    assert (stats["a"]["p50_ms"], stats["b"]["p50_ms"]) == (1.0, 2.0)
    assert fast.calls == slow.calls == 6  # interleaved: one warm-up and five rounds each
    # medians 15% apart are not "clearly" apart (more than 15% is needed): every round runs
    near = timing.compare_latency({"a": _StandInSession(clock, [1.0]), "b": _StandInSession(clock, [1.15])}, x,
                                    warmup=0, runs=12, min_runs=5)
    assert near["a"]["runs"] == 12 and near["a"]["stopped_early"] is False
    apart = timing.compare_latency({"a": _StandInSession(clock, [1.0]), "b": _StandInSession(clock, [1.16])}, x,
                                     warmup=0, runs=12, min_runs=5)
    assert apart["a"]["runs"] == 5 and apart["a"]["stopped_early"] is True
    # without min_runs, or with one session, there is no early stop
    assert timing.compare_latency({"a": fast, "b": slow}, x, warmup=0, runs=7)["a"]["runs"] == 7
    assert timing.compare_latency({"a": fast}, x, warmup=0, runs=7, min_runs=2)["a"]["runs"] == 7


def test_latency_on_a_real_session_is_measured():
    """The real clock and a real session: only what holds whatever the machine's speed."""
    sess = ort_session.make_session(linear_model())
    x = {"input": np.random.default_rng(0).random((5, 1, 4, 4), dtype=np.float32)}
    stats = timing.measure_latency(sess, timing.batch_of(x, 1), warmup=2, runs=9)
    assert stats["min_ms"] <= stats["p50_ms"] <= stats["p90_ms"]
    assert stats["runs"] == 9 and stats["warmup"] == 2


def test_batch_of_takes_samples_cyclically_from_every_input():
    feeds = {"a": np.arange(3), "b": np.arange(3) * 10, "scale": np.float32(2)}
    batch = timing.batch_of(feeds, 7)
    assert batch["a"].tolist() == [0, 1, 2, 0, 1, 2, 0] and batch["b"].tolist() == [0, 10, 20, 0, 10, 20, 0]
    assert batch["scale"] == 2  # an input without a batch axis is kept whole
    with pytest.raises(InvalidInput, match="no samples"):
        timing.batch_of({"a": np.zeros((0, 2))}, 1)
