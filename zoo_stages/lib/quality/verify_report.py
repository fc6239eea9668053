"""verify's outputs as deploy reads them: its report, its measured metrics and its test vectors.

verify writes ``report.json`` (task, task kind, the outputs its metrics read, builds, reference,
gates, threads, eval_samples) and a ``vectors/<build>/test_data_set_N`` folder per build; its stage
metrics hold the same builds with their timings. A build reports only the task metrics that apply
to it (accuracy for a classifier with labelled data, mae for a regressor, none for a generic
model), so readers ask for the task's headline metrics (`headline_metrics`) rather than for
``accuracy`` by name. deploy takes every part as optional (a recipe may deploy without verify), so
everything here tolerates a missing or older report and says clearly when one cannot be read.
"""

from __future__ import annotations

import json
import logging
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from zoo.errors import InvalidInput
from zoo.stage import Inputs
from zoo_stages.lib.quality import tasks
from zoo_stages.lib.release.vectors import find_sets

# numeric entries of verify's report that describe the model rather than measure it
_NOT_METRICS = {"ir_version", "opset"}
# timings: measurements that change from run to run (everything else verify reports is deterministic)
MEASURED = re.compile(r"^(latency|throughput|speedup)")


def report_metrics(entry: Mapping[str, Any]) -> dict[str, float | int]:
    """The numeric metrics of one build in verify's report (``{metrics: {...}}`` or flat).

    Strings (stage id, digests, notes), nested values (throughput tables) and model properties
    the manifest records elsewhere (opset, IR version) are left out; non-finite numbers too.
    """
    raw = entry.get("metrics") if isinstance(entry.get("metrics"), Mapping) else entry
    out: dict[str, float | int] = {}
    for k, v in raw.items():
        if k in _NOT_METRICS:
            continue
        if isinstance(v, bool):
            out[str(k)] = int(v)
        elif isinstance(v, int):
            out[str(k)] = v
        elif isinstance(v, float) and math.isfinite(v):
            out[str(k)] = v
    return out


@dataclass
class VerifyOutputs:
    """verify's outputs as deploy reads them (all parts optional)."""

    stage_id: str | None = None
    builds: dict[str, dict[str, Any]] | None = None
    reference: str | None = None
    gates: list[Any] | None = None
    threads: int | None = None
    eval_samples: int | None = None
    vectors: Path | None = None
    measured: dict[str, dict[str, Any]] = field(default_factory=dict)  # verify's metrics, timings included
    measured_gates: list[Any] | None = None
    task: str | None = None  # the recipe's task as verify read it
    task_kind: str | None = None  # classification, regression, generic (None: an older report)
    metric_outputs: dict[str, str] = field(default_factory=dict)  # {"scores": ..., "label": ...}
    host: dict[str, Any] | None = None  # where verify measured its timings (host_info(), from its metrics)
    latency: dict[str, Any] = field(default_factory=dict)  # verify's latency settings (warmup, runs, batch_sizes...)

    def entry(self, name: str) -> dict[str, Any] | None:
        """verify's report entry of build `name`, if it checked one."""
        return (self.builds or {}).get(name)

    def vector_dir(self, name: str) -> Path | None:
        """The folder holding build `name`'s test data sets, if verify wrote any."""
        if self.vectors is None:
            return None
        for candidate in (self.vectors / name, self.vectors / "vectors" / name):
            if candidate.is_dir() and find_sets(candidate):
                return candidate
        return None

    def verified_metrics(self, name: str) -> dict[str, float | int]:
        """Build `name`'s deterministic metrics: timings (different on every run) left out."""
        return {k: v for k, v in report_metrics(self.entry(name) or {}).items() if not MEASURED.match(k)}

    def timings(self, name: str) -> dict[str, float | int]:
        """Build `name`'s timing metrics as measured on this host (latency, throughput, speedup)."""
        return {k: v for k, v in report_metrics(self.measured.get(name) or {}).items() if MEASURED.match(k)}

    def measured_on(self) -> dict[str, str | int]:
        """What verify's timings were measured with: onnxruntime's CPU provider on verify's host."""
        from zoo_stages.lib.runtimes.host_info import measured_on

        versions = (self.host or {}).get("versions") or {}
        return measured_on(self.host, runtime="onnxruntime", runtime_version=versions.get("onnxruntime"),
                           execution_provider="CPUExecutionProvider", threads=self.threads)

    def reference_latency(self) -> float | None:
        """The batch-1 latency verify measured for its reference build on its host (ms), if any."""
        value = (self.measured.get(self.reference or "") or {}).get("latency_p50_ms")
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    def reference_metric(self, metric: str) -> float | None:
        """The value of `metric` verify measured for its reference build, if it reported one."""
        entry = self.entry(self.reference) if self.reference else None
        value = report_metrics(entry or {}).get(metric)
        return float(value) if isinstance(value, (int, float)) else None

    def headline_metrics(self) -> list[str]:
        """The task's primary metric and its change against the reference, for a card's table:
        ``[accuracy, accuracy_drop]`` (classification), ``[mae, mae_increase]`` (regression), []
        for a generic task. A report without a task kind (older verify) is read as classification."""
        primary = tasks.primary_metric(self.task_kind or "classification")
        if primary is None:
            return []
        return [primary[0], tasks.comparison_name(primary[0])]

    def summary(self, measured: bool = False) -> dict[str, Any]:
        """What the manifest and card say about verification: stage, reference, gates, threads.

        Without `measured`, a timing gate keeps only what was required (its value and outcome are
        measurements too), so the release stays bit-reproducible.
        """
        out: dict[str, Any] = {}
        if self.stage_id:
            out["stage"] = self.stage_id
        if self.reference:
            out["reference"] = self.reference
        source = self.measured_gates if measured and self.measured_gates is not None else self.gates
        if source is not None:
            gates = json.loads(json.dumps(source, sort_keys=True, default=str))
            if not measured:
                gates = [{k: g[k] for k in g if k not in ("value", "passed")}
                         if isinstance(g, dict) and MEASURED.match(str(g.get("metric", ""))) else g for g in gates]
            out["gates"] = gates
        if self.threads is not None:
            out["threads"] = self.threads
        return out


def read_verify_outputs(inputs: Inputs, log: logging.Logger | logging.LoggerAdapter) -> VerifyOutputs:
    """The outputs of the one verify stage among `inputs` (empty when there is none)."""
    providers = [up for up in inputs if "report" in up.outputs or up.kind == "verify"]
    if not providers:
        log.warning("deploy: no verify stage upstream; builds ship without verified metrics")
        return VerifyOutputs()
    if len(providers) > 1:
        raise InvalidInput(f"several upstream stages provide a verify report: "
                           f"{', '.join(up.stage_id for up in providers)}",
                           hint="deploy needs exactly one verify stage")
    up = providers[0]
    v = VerifyOutputs(stage_id=up.stage_id,
                      vectors=Path(up.outputs["vectors"]) if "vectors" in up.outputs else None)
    metrics = up.metrics if isinstance(up.metrics, Mapping) else {}
    measured = metrics.get("builds")
    if isinstance(measured, Mapping):
        v.measured = {str(k): dict(e) for k, e in measured.items() if isinstance(e, Mapping)}
    gates = metrics.get("gates")
    v.measured_gates = gates if isinstance(gates, list) else None
    v.host = dict(metrics["host"]) if isinstance(metrics.get("host"), Mapping) else None
    report_path = up.outputs.get("report")
    if report_path is None:
        return v
    report_path = Path(report_path)
    if report_path.is_dir():
        report_path = report_path / "report.json"
    try:
        report = json.loads(report_path.read_text())
    except (OSError, ValueError) as e:
        raise InvalidInput(f"cannot read verify's report {report_path}: {e}",
                           hint=f"re-run stage {up.stage_id!r}") from e
    if not isinstance(report, dict):
        raise InvalidInput(f"verify's report {report_path} is not a JSON object", hint=f"re-run stage {up.stage_id!r}")
    builds = report.get("builds")
    if isinstance(builds, list):  # tolerate [{name: ..., metrics: ...}, ...]
        builds = {str(b.get("name")): b for b in builds if isinstance(b, dict) and b.get("name")}
    v.builds = {str(k): (e if isinstance(e, dict) else {}) for k, e in (builds or {}).items()}
    v.reference = report.get("reference") if isinstance(report.get("reference"), str) else None
    gates = report.get("gates")
    v.gates = gates if isinstance(gates, list) else None
    v.threads = report.get("threads") if isinstance(report.get("threads"), int) else None
    v.latency = dict(report["latency"]) if isinstance(report.get("latency"), dict) else {}
    v.task = report.get("task") if isinstance(report.get("task"), str) else None
    kind = report.get("task_kind")
    v.task_kind = kind if kind in tasks.METRICS else None
    outputs = report.get("metric_outputs")
    v.metric_outputs = ({str(k): str(o) for k, o in outputs.items() if isinstance(o, str)}
                        if isinstance(outputs, dict) else {})
    samples = report.get("eval_samples")
    v.eval_samples = samples if isinstance(samples, int) and not isinstance(samples, bool) and samples > 0 else None
    return v
