"""Latency and throughput of onnxruntime sessions (and of OpenVINO compiled models, which
`zoo_stages.lib.runtimes.openvino_build.CompiledSession` puts behind the same interface).

- `measure_latency`: p50/p90/mean/min of ``session.run`` after untimed warm-up runs;
- `compare_latency`: several sessions timed in interleaved rounds, stopping early once the
  fastest and slowest are clearly apart;
- `measure_throughput`: samples per second at several batch sizes (`batch_of` builds them);
- `measure_decoding`: a decoder's prefill and decode-step times and tokens/s at batch 1, from
  the timings of zoo's decoding loop (`zoo.textgen.Generation`).

Inputs are feeds ``{input name: array}`` (`zoo_stages.lib.runtimes.onnx_run.prepare` checks and casts
them once, outside the timed runs). Timings are metrics, never output files: they differ on
every run. numpy is imported inside functions so importing this module is cheap.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from zoo.errors import InvalidInput

if TYPE_CHECKING:
    import numpy as np


def measure_latency(session: Any, feeds: Mapping[str, "np.ndarray"], *, warmup: int = 5,
                    runs: int = 30, progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Wall-clock latency of `session.run` on `feeds` after `warmup` untimed runs.

    Returns p50_ms, p90_ms, mean_ms, min_ms (linear-interpolated percentiles), runs and warmup.
    `progress(i)`: called after timed run i (1..runs), outside the timed region
    (`zoo_stages.lib.runtimes.step_log.StepLog` logs it as ``latency NAME i/runs``).
    """
    import numpy as np

    from zoo_stages.lib.runtimes import onnx_run

    if runs < 1:
        raise InvalidInput(f"latency runs must be at least 1 (got {runs})")
    feed = onnx_run.prepare(session, feeds)
    for _ in range(max(0, warmup)):
        session.run(None, feed)
    times = np.empty(runs, dtype=np.float64)
    for i in range(runs):
        t0 = time.perf_counter_ns()
        session.run(None, feed)
        times[i] = (time.perf_counter_ns() - t0) / 1e6
        if progress is not None:
            progress(i + 1)
    return {
        "p50_ms": float(np.percentile(times, 50)),
        "p90_ms": float(np.percentile(times, 90)),
        "mean_ms": float(times.mean()),
        "min_ms": float(times.min()),
        "runs": runs,
        "warmup": warmup,
    }


def compare_latency(sessions: Mapping[str, Any], feeds: Mapping[str, "np.ndarray"], *, warmup: int = 5,
                    runs: int = 30, min_runs: int | None = None,
                    progress: Callable[[int], None] | None = None) -> dict[str, dict[str, Any]]:
    """Latency of several sessions on the same feeds, measured in interleaved rounds.

    Each round runs every session once, so machine load drifts over all of them alike. With
    `min_runs` set, measuring stops after at least that many rounds once the fastest and the
    slowest session are clearly apart (their interquartile ranges do not overlap and their
    medians differ by more than 15%): enough for a faster/slower verdict, at a fraction of
    the time. Returns `measure_latency`'s fields per session, plus ``stopped_early``.
    `progress(i)`: called after round i (1..runs).
    """
    import numpy as np

    from zoo_stages.lib.runtimes import onnx_run

    if runs < 1:
        raise InvalidInput(f"latency runs must be at least 1 (got {runs})")
    prepared = {key: onnx_run.prepare(session, feeds) for key, session in sessions.items()}
    for _ in range(max(0, warmup)):
        for key, session in sessions.items():
            session.run(None, prepared[key])
    times: dict[str, list[float]] = {key: [] for key in sessions}
    done = 0
    stopped_early = False
    while done < runs:
        for key, session in sessions.items():
            t0 = time.perf_counter_ns()
            session.run(None, prepared[key])
            times[key].append((time.perf_counter_ns() - t0) / 1e6)
        done += 1
        if progress is not None:
            progress(done)
        if min_runs is not None and done >= min_runs and done < runs and len(sessions) > 1 and _clearly_apart(times):
            stopped_early = True
            break
    out = {}
    for key, values in times.items():
        arr = np.asarray(values, dtype=np.float64)
        out[key] = {"p50_ms": float(np.percentile(arr, 50)), "p90_ms": float(np.percentile(arr, 90)),
                    "mean_ms": float(arr.mean()), "min_ms": float(arr.min()), "runs": done, "warmup": warmup,
                    "stopped_early": stopped_early}
    return out


def _clearly_apart(times: Mapping[str, list[float]]) -> bool:
    import numpy as np

    stats = sorted((float(np.percentile(v, 50)), float(np.percentile(v, 25)), float(np.percentile(v, 75)))
                   for v in times.values())
    fastest, slowest = stats[0], stats[-1]
    return fastest[2] < slowest[1] and slowest[0] > 1.15 * fastest[0]


def batch_of(feeds: Mapping[str, "np.ndarray"], batch_size: int) -> dict[str, "np.ndarray"]:
    """Feeds of exactly `batch_size` samples, taken cyclically from `feeds` (samples along axis 0)."""
    import numpy as np

    batched = {name: a for name, a in feeds.items() if np.ndim(a) > 0}
    if not batched or any(len(a) == 0 for a in batched.values()):
        raise InvalidInput("no samples to build a batch from")
    out = dict(feeds)
    for name, a in batched.items():
        out[name] = np.ascontiguousarray(np.asarray(a)[np.arange(batch_size) % len(a)])
    return out


def measure_throughput(session: Any, feeds: Mapping[str, "np.ndarray"], batch_sizes: Sequence[int], *,
                       warmup: int = 2, runs: int = 10) -> dict[str, Any]:
    """Samples per second at each batch size (from the median batch time), samples from `feeds`.

    Batch sizes a model cannot take (its batch dimension is fixed to another value) map to
    None, so a report shows they were asked for but not measurable.
    """
    from zoo_stages.lib.runtimes import onnx_run

    fixed = onnx_run.fixed_batch(session)
    result: dict[str, Any] = {}
    for bs in batch_sizes:
        if fixed is not None and bs != fixed:
            result[str(bs)] = None
            continue
        stats = measure_latency(session, batch_of(feeds, bs), warmup=warmup, runs=runs)
        result[str(bs)] = float(bs * 1000.0 / stats["p50_ms"]) if stats["p50_ms"] > 0 else None
    return result


def measure_decoding(decoder: Any, prompt: "np.ndarray", new_tokens: int, *, warmup: int = 5, runs: int = 30,
                     progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Batch-1 generation timings of a `zoo.textgen.Decoder`: each run is a greedy continuation of
    `prompt` [1, P] by `new_tokens` tokens, its prefill (the prompt's run and the first token) and
    its decode steps (one new token each) timed apart by the decoding loop itself.

    Returns prefill_p50_ms, prefill_p90_ms, step_p50_ms, step_p90_ms (each run's mean decode step),
    tokens_per_s (decode tokens per second of the median run: 1000 / step_p50_ms), runs, warmup.
    `progress(i)`: called after timed run i (1..runs), outside the timed region.
    """
    import numpy as np

    if runs < 1:
        raise InvalidInput(f"latency runs must be at least 1 (got {runs})")
    if new_tokens < 2:
        raise InvalidInput(f"decode timing needs at least 2 new tokens (the first comes from the prefill; got {new_tokens})")
    for _ in range(max(0, warmup)):
        decoder.greedy(prompt, new_tokens, eos=[]).run()
    prefill = np.empty(runs, dtype=np.float64)
    step = np.empty(runs, dtype=np.float64)
    for i in range(runs):
        generation = decoder.greedy(prompt, new_tokens, eos=[]).run()
        prefill[i] = generation.prefill_s * 1000.0
        step[i] = generation.decode_s * 1000.0 / generation.decode_steps
        if progress is not None:
            progress(i + 1)
    step_p50 = float(np.percentile(step, 50))
    return {
        "prefill_p50_ms": float(np.percentile(prefill, 50)),
        "prefill_p90_ms": float(np.percentile(prefill, 90)),
        "step_p50_ms": step_p50,
        "step_p90_ms": float(np.percentile(step, 90)),
        "tokens_per_s": 1000.0 / step_p50 if step_p50 > 0 else None,
        "runs": runs,
        "warmup": warmup,
    }
