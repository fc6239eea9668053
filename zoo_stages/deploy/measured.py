"""Timings deploy measures itself (builds verify did not time: OpenVINO's, a CUDA or TensorRT
build on a host that has the device), measured as verify measures its builds."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from zoo_stages.lib.runtimes.step_log import StepLog

if TYPE_CHECKING:
    from zoo_stages.deploy.release import Release

# verify's defaults, used when there is no verify stage
LATENCY_WARMUP, LATENCY_RUNS = 5, 30


def timings(job: Release, name: str, session: Any, feeds: Mapping[str, Any]) -> dict[str, Any]:
    """Latency (batch 1), throughput and speedup of a build deploy runs itself, measured as verify
    measures its builds (its warmup, runs and batch sizes; defaults when there is no verify), so
    the figures sit beside verify's in the manifest. The speedup is against verify's reference
    build, timed on verify's host: comparable when deploy runs on the same kind of host."""
    from zoo_stages.lib.runtimes import onnx_run, timing

    settings = job.verify.latency
    warmup = int(settings.get("warmup", LATENCY_WARMUP))
    fixed = onnx_run.fixed_batch(session)
    runs = int(settings.get("runs", LATENCY_RUNS))
    stats = timing.measure_latency(session, timing.batch_of(feeds, fixed or 1), warmup=warmup, runs=runs,
                                   progress=StepLog(job.ctx.log, f"latency {name}", runs))
    out: dict[str, Any] = {"latency_p50_ms": stats["p50_ms"], "latency_p90_ms": stats["p90_ms"],
                           "latency_mean_ms": stats["mean_ms"]}
    sizes = [int(b) for b in settings.get("batch_sizes") or () if isinstance(b, int)]
    if sizes:
        throughput = timing.measure_throughput(session, feeds, sizes, warmup=min(warmup, 2),
                                               runs=int(settings.get("throughput_runs", 10)))
        out.update({f"throughput_bs{bs}": v for bs, v in throughput.items() if v is not None})
    reference = job.verify.reference_latency()
    if reference and stats["p50_ms"] > 0:
        out["speedup"] = reference / stats["p50_ms"]
    return out
