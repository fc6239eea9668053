"""The `verify` kind: check several candidate builds of one model and gate the release on them.

Each named build comes from an upstream stage's `model` output::

    verify:
      needs: [optimize, quantize]
      config:
        builds: {cpu-fp32: optimize, cpu-int8: quantize}
        reference: cpu-fp32
        latency: {warmup: 5, runs: 30, threads: 1, batch_sizes: [1, 8, 32]}
        vectors: {count: 1, seed: 0}
        gates:
          - cpu-fp32.accuracy >= 0.95
          - cpu-int8.accuracy_drop <= 0.01
          - cpu-int8.speedup >= 1.0

Per build: ``onnx.checker``; accuracy on the held-out split and ``accuracy_drop`` against the
reference; parity against the reference on the same images, every output matched by name
(`zoo_stages.lib.parity`: ``max_abs`` over outputs, the lowest ``cosine`` and ``cosine_min``,
``top1_agreement`` of the first (samples, classes) output); latency p50/p90 at batch 1 after warm-up on
``latency.threads`` threads; throughput (samples/s) at each of ``latency.batch_sizes``; file
size; ``speedup`` = reference p50 / build p50. Test vectors go to
``vectors/<build>/test_data_set_<i>/input_0.pb … output_0.pb`` (ONNX Model Zoo layout), inputs
taken from the held-out split at seeded indices and outputs computed by that build.

Without ``builds:``, every upstream stage with a `model` output is a build named after its stage
id (``quantize[cpu-int8]`` -> ``quantize-cpu-int8``); the reference defaults to the first build.
Without a recipe ``data:`` section (e.g. pretrained weights), verify evaluates on seeded random
inputs (uniform in [0, 1)): parity, latency and vectors are measured, accuracy is not, and
gates on accuracy are refused up front.

Outputs: ``report`` (report.json: builds, gates, reference, threads, host) and ``vectors``.
Accuracy, parity and the vectors are computed single-threaded and are deterministic; the
latency/throughput numbers in report.json are measurements and differ from run to run, so
report.json is not byte-identical across runs. A failed gate raises GateFailed (after the
report is written) with a table of every gate. Every build also has an implicit gate
``<build>.checker == 1`` (the ONNX checker accepted it).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Annotated, Any, Mapping, Sequence

from pydantic import AfterValidator, Field, ValidationInfo, field_validator, model_validator

from zoo.errors import GateFailed, InvalidInput
from zoo.stage import (Column, Effect, GateOutcome, Inputs, KeyContext, KindConfig, ReportTable, StageContext,
                       StageKind)
from zoo_stages.lib import gates as gatelib

BUILD_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")

# Metric name -> meaning; throughput_bs<N> exists for every N in latency.batch_sizes.
METRICS: dict[str, str] = {
    "accuracy": "top-1 accuracy on the held-out split",
    "accuracy_drop": "reference accuracy minus this build's accuracy",
    "max_abs": "largest |output - reference output| on the held-out split",
    "cosine": "mean per-sample cosine similarity of outputs with the reference",
    "cosine_min": "smallest per-sample cosine similarity with the reference",
    "top1_agreement": "share of held-out samples whose top-1 class equals the reference's",
    "latency_p50_ms": "median batch-1 latency in ms",
    "latency_p90_ms": "90th percentile batch-1 latency in ms",
    "speedup": "reference p50 / this build's p50",
    "size_bytes": "model file size in bytes",
    "size_mb": "model file size in MiB",
    "size_ratio": "model file size / reference file size",
    "checker": "1 when onnx.checker accepts the model, else 0",
}


def metric_names(batch_sizes: list[int]) -> list[str]:
    """Every metric a gate may name, given the configured throughput batch sizes."""
    return sorted(list(METRICS) + [f"throughput_bs{b}" for b in batch_sizes])


def _check_gate(text: str, info: ValidationInfo) -> str:
    """Validate one gate against the builds and batch sizes validated before it (fields are in order)."""
    latency = info.data.get("latency")
    builds = info.data.get("builds")
    gatelib.parse_gate(text, metrics=metric_names(latency.batch_sizes) if latency else None,
                       builds=list(builds) if builds else None)
    return text


class LatencyConfig(KindConfig):
    """How latency and throughput are measured."""

    warmup: int = Field(5, ge=0, le=10_000, description="untimed runs before timing")
    runs: int = Field(30, ge=1, le=100_000, description="timed batch-1 runs (p50/p90 over these)")
    threads: int = Field(1, ge=1, le=1024, description="intra-op threads of the timed sessions (recorded)")
    batch_sizes: list[int] = Field(default_factory=lambda: [1, 8, 32], description="throughput batch sizes")
    throughput_runs: int = Field(10, ge=1, le=100_000, description="timed runs per throughput batch size")

    @field_validator("batch_sizes")
    @classmethod
    def _positive(cls, v):
        if any(b < 1 for b in v):
            raise ValueError("batch sizes must be at least 1")
        if len(set(v)) != len(v):
            raise ValueError("batch_sizes lists a size twice")
        return v


class VectorsConfig(KindConfig):
    """How many reference test vectors to save per build."""

    count: int = Field(1, ge=0, le=1000, description="test data sets per build (0: none)")
    seed: int = Field(0, description="seed choosing the held-out images (or random inputs) used as inputs")


class VerifyConfig(KindConfig):
    builds: dict[str, str] | None = Field(
        None, min_length=1, description="build name -> upstream stage id providing `model` "
                                        "(default: every upstream model, named after its stage)")
    reference: str | None = Field(None, description="the build parity and drops are measured against (default: first)")
    latency: LatencyConfig = Field(default_factory=LatencyConfig)
    vectors: VectorsConfig = Field(default_factory=VectorsConfig)
    gates: list[Annotated[str, AfterValidator(_check_gate)]] = Field(
        default_factory=list, description="'<build>.<metric> <op> <number>' conditions, e.g. 'cpu-int8.speedup >= 1'")
    eval_samples: int | None = Field(
        None, ge=1, description="use at most this many held-out images (without a `data:` section: this many "
                                "seeded random inputs, default 32)")

    @field_validator("builds")
    @classmethod
    def _build_names(cls, v):
        for name, stage in (v or {}).items():
            if not BUILD_RE.match(name):
                raise ValueError(f"build name {name!r} may use letters, digits, '-' and '_' only")
            if not isinstance(stage, str) or not stage:
                raise ValueError(f"build {name!r} must name an upstream stage id")
        return v

    @model_validator(mode="after")
    def _reference_is_a_build(self):
        if self.reference is not None and self.builds is not None and self.reference not in self.builds:
            raise ValueError(f"reference {self.reference!r} is not one of the builds: {', '.join(self.builds)}")
        return self

    def resolve_builds(self, inputs: Inputs) -> dict[str, str]:
        """Build name -> stage id: the configured builds, or every upstream stage with a `model`."""
        if self.builds is not None:
            return dict(self.builds)
        found = {_build_name(up.stage_id): up.stage_id for up in inputs if "model" in up.outputs}
        if not found:
            raise InvalidInput("verify found no upstream stage with a `model` output",
                               hint="add the stages producing models to verify's `needs:`, or set `builds:`")
        if self.reference is not None and self.reference not in found:
            raise InvalidInput(f"reference {self.reference!r} is not one of the builds: {', '.join(found)}",
                               hint="builds default to the upstream stage ids; set `builds:` to name them")
        return found

    def parsed_gates(self, builds: Mapping[str, str] | None = None) -> list[gatelib.Gate]:
        """The gates, checked against `builds` (default: the configured builds)."""
        valid = metric_names(self.latency.batch_sizes)
        names = builds if builds is not None else self.builds
        try:
            return [gatelib.parse_gate(t, metrics=valid, builds=names) for t in self.gates]
        except gatelib.GateSyntaxError as e:
            raise InvalidInput(str(e), hint="gate builds must be verify's build names") from None


def _build_name(stage_id: str) -> str:
    """A build name from a stage id: ``quantize[cpu-int8]`` -> ``quantize-cpu-int8``."""
    return re.sub(r"[^A-Za-z0-9_-]+", "-", stage_id).strip("-") or "model"


# timings: measurements that differ from run to run, kept out of the report artifact
MEASURED = re.compile(r"^(latency|throughput|speedup)")

# metrics that need labelled data; without a `data:` section they are not measured
DATA_METRICS = ("accuracy", "accuracy_drop")


class Verify(StageKind):
    name = "verify"
    version = "2"  # 2: parity over every output, matched by name (zoo_stages.lib.parity)
    Config = VerifyConfig
    tools = ("onnx", "onnxruntime", "numpy")
    # the held-out split (every data field), and the model fields its notes compare with the build
    shared = ("data", "model.input_name", "model.num_classes")
    outputs = ("report", "vectors")
    summary = "checks each build (checker, parity, accuracy, latency, throughput), saves test vectors, applies gates"

    def dependencies(self, config: VerifyConfig, ctx: KeyContext) -> list[Path]:
        data = ctx.shared.get("data")
        if not data:
            return []
        from zoo_stages.lib.datasets import data_dependencies

        return data_dependencies(data, ctx.recipe.dir)

    def run(self, inputs: Inputs, config: VerifyConfig, context: StageContext) -> Mapping[str, Path]:
        from zoo.files import atomic_write_json
        from zoo_stages.lib import parity
        from zoo_stages.lib.host_info import host_info

        build_stages = config.resolve_builds(inputs)
        gates = config.parsed_gates(build_stages)
        paths = {name: _model_path(inputs, name, stage) for name, stage in build_stages.items()}
        ref_name = config.reference or next(iter(build_stages))
        data = context.shared.get("data")
        x, y, eval_data = _evaluation_inputs(data, paths[ref_name], config, context)
        if y is None:
            needing = [g.text for g in gates if g.metric in DATA_METRICS]
            if needing:
                raise InvalidInput(f"gate {needing[0]!r} needs labelled data, but the recipe has no `data:` section",
                                   hint="add a `data:` section, or gate on parity metrics (top1_agreement, cosine)")

        # reference first: every other build is compared with its outputs
        order = [ref_name] + [b for b in build_stages if b != ref_name]
        vectors_dir = context.output_path("vectors")
        vectors_dir.mkdir(parents=True, exist_ok=True)
        model_spec = context.shared.get("model") or {}

        builds: dict[str, dict[str, Any]] = {}
        ref_outputs = None
        for name in order:
            metrics, outputs = check_build(name, build_stages[name], paths[name], x, y, config,
                                           vectors_dir / name, model_spec)
            if name == ref_name:
                ref_outputs = outputs
            report = parity.compare(ref_outputs, outputs)
            metrics.update({"max_abs": report.max_abs, "cosine": report.cosine, "cosine_min": report.cosine_min,
                            "top1_agreement": report.top1_agreement})
            builds[name] = metrics
        ref = builds[ref_name]
        for name, m in builds.items():
            m["accuracy_drop"] = (ref["accuracy"] - m["accuracy"]
                                  if ref["accuracy"] is not None and m["accuracy"] is not None else None)
            m["speedup"] = ref["latency_p50_ms"] / m["latency_p50_ms"] if m["latency_p50_ms"] > 0 else None
            m["size_ratio"] = m["size_bytes"] / ref["size_bytes"] if ref["size_bytes"] else None
        # recipe order in the report; NaN/inf (a broken build) become null, which fails any gate on them
        builds = {name: _json_safe(builds[name]) for name in build_stages}

        checks = gates + [gatelib.parse_gate(f"{b}.checker == 1") for b in build_stages]
        results = gatelib.evaluate(checks, builds)
        passed = all(r.passed for r in results)
        gate_rows = [dict(r.to_json(), implicit=i >= len(gates)) for i, r in enumerate(results)]
        # report.json is an artifact and must be bit-reproducible: timings (which differ on every
        # run) are left out of it and kept as metrics only (cache entry, lockfile, published manifest)
        report = {
            "reference": ref_name,
            "threads": config.latency.threads,
            "latency": config.latency.model_dump(),
            "eval_data": eval_data,
            "eval_samples": int(len(x)),
            "builds": {name: {k: v for k, v in m.items() if not MEASURED.match(k)} for name, m in builds.items()},
            "gates": [{k: v for k, v in g.items() if k not in ("value", "passed")} if MEASURED.match(str(g.get("metric", "")))
                      else g for g in gate_rows],
            "measured": sorted({k for m in builds.values() for k in m if MEASURED.match(k)}),
            "passed": passed,
        }
        out = atomic_write_json(context.output_path("report.json"), report, fsync=False)
        context.metrics.update({"reference": ref_name, "threads": config.latency.threads, "builds": builds,
                                "gates": gate_rows, "passed": passed, "eval_data": eval_data,
                                "host": host_info()})
        table = gatelib.format_table(results)
        context.log.info("verify gates:\n%s", table)
        if not passed:
            raise GateFailed(f"verify: {gatelib.failed_summary(results)}", table=table,
                             hint="`zoo plan`/`zoo run --json` show every build's metrics; fix the model or the gate")
        return {"report": out, "vectors": vectors_dir}

    def gates(self, metrics: Mapping[str, Any]) -> list[GateOutcome]:
        """Every gate verify checked (the recipe's, then the implicit checker gates), from its metrics."""
        rows = metrics.get("gates")
        return [GateOutcome(gate=str(g.get("gate", "")), value=g.get("value"), passed=g.get("passed") is True,
                            implicit=bool(g.get("implicit")))
                for g in (rows if isinstance(rows, list) else []) if isinstance(g, dict)]

    def report(self, stage_id: str, metrics: Mapping[str, Any], effects: Sequence[Effect]) -> list[ReportTable]:
        """The recipe's gates with their values and verdicts."""
        shown = [g for g in self.gates(metrics) if not g.implicit]
        columns = (Column("gate"), Column("value", align="right", format=".4g", missing="n/a"), Column("result"))
        rows = tuple((g.gate, g.value, "PASS" if g.passed else "FAIL") for g in shown)
        return [ReportTable(f"gates ({stage_id})", columns, rows, show_header=False)]


def _evaluation_inputs(data, reference: Path, config: VerifyConfig, context: StageContext):
    """(x, y or None, description): the held-out split, or seeded random inputs when there is no data.

    Random inputs (uniform in [0, 1), seed 0) still give parity, latency and test vectors for
    recipes without a dataset (e.g. pretrained weights); accuracy is then not measured.
    """
    from zoo_stages.lib import onnx_run, ort_session

    if data:
        from zoo_stages.lib.datasets import load_split

        split = load_split(data, context.recipe.dir, "val")
        x, y = split.single("verify"), split.labels
        if config.eval_samples is not None:
            x, y = x[:config.eval_samples], y[:config.eval_samples]
        if len(x) == 0:
            raise InvalidInput("the held-out split is empty", hint="raise data.val_fraction or add data")
        return x, y, "held-out split"
    session = ort_session.make_session(reference, threads=1, level="disable")
    spec = onnx_run.single_input(session)
    try:
        x = onnx_run.random_feeds(session, config.eval_samples or 32, seed=0)[spec.name]
    except InvalidInput:
        raise InvalidInput(f"the model input has dynamic dimensions {list(spec.shape)} and the recipe has no "
                           "`data:` section, so verify cannot make inputs for it",
                           hint="add a `data:` section to the recipe") from None
    return x, None, "random uniform [0, 1), seed 0"


def _json_safe(obj: Any) -> Any:
    """`obj` with non-finite floats replaced by None (JSON has no NaN) and numpy scalars made plain."""
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    if isinstance(obj, float) or type(obj).__name__.startswith("float"):
        value = float(obj)
        return value if math.isfinite(value) else None
    if type(obj).__name__.startswith(("int", "uint")) and not isinstance(obj, bool):
        return int(obj)
    return obj


def _model_path(inputs: Inputs, build: str, stage_id: str) -> Path:
    up = inputs.stage(stage_id)
    if "model" not in up.outputs:
        raise InvalidInput(f"build {build!r}: stage {stage_id!r} has no `model` output "
                           f"(it provides: {', '.join(up.outputs) or 'nothing'})",
                           hint="point the build at a stage that produces an ONNX model (export, optimize, quantize)")
    return Path(up.outputs["model"])


def check_build(name: str, stage_id: str, path: Path, x, y, config: VerifyConfig, vectors_dir: Path,
                model_spec: Mapping[str, Any]) -> tuple[dict[str, Any], Any]:
    """Everything verify measures on one build; returns (metrics, {output name: held-out outputs})."""
    import onnx

    from zoo.engine.hashing import hash_file_uncached
    from zoo_stages.lib import classification, onnx_io, onnx_run, ort_session
    from zoo_stages.lib import timing as timinglib

    model = onnx_io.load_model(path)
    try:
        onnx.checker.check_model(model, full_check=True)
        checker, checker_error = 1, None
    except Exception as e:  # ValidationError, InferenceError: both mean the checker refused it
        checker, checker_error = 0, str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__

    blob = onnx_io.model_bytes(model)  # serialised once for both sessions
    evaluator = ort_session.make_session(blob, threads=1, level="all")
    input_name = onnx_run.single_input(evaluator).name
    feeds = onnx_run.prepare(evaluator, {input_name: x}, where="the held-out split")
    outputs = onnx_run.run(evaluator, feeds, batch_size=32)
    logits = next(iter(outputs.values()))
    acc = classification.accuracy(logits, y) if y is not None else None

    notes = []
    if model_spec.get("input_name") and model_spec["input_name"] != input_name:
        notes.append(f"model input is {input_name!r}, the recipe's model.input_name is {model_spec['input_name']!r}")
    n_classes = model_spec.get("num_classes")
    if n_classes and logits.ndim == 2 and logits.shape[1] != n_classes:
        notes.append(f"model outputs {logits.shape[1]} classes, the recipe's model.num_classes is {n_classes}")

    lat = config.latency
    timing = ort_session.make_session(blob, threads=lat.threads, level="all")
    fixed = onnx_run.fixed_batch(timing)
    stats = timinglib.measure_latency(timing, timinglib.batch_of(feeds, fixed or 1), warmup=lat.warmup, runs=lat.runs)
    throughput = timinglib.measure_throughput(timing, feeds, lat.batch_sizes, warmup=min(lat.warmup, 2),
                                              runs=lat.throughput_runs)
    if fixed is not None and any(v is None for v in throughput.values()):
        notes.append(f"the model's batch dimension is fixed to {fixed}; other throughput batch sizes were skipped")

    vector_sets = write_vectors(evaluator, x, config.vectors.count, config.vectors.seed, vectors_dir)
    size = Path(path).stat().st_size
    metrics: dict[str, Any] = {
        "stage": stage_id,
        "model_digest": hash_file_uncached(Path(path)),
        "size_bytes": size,
        "size_mb": size / 2**20,
        "checker": checker,
        "checker_error": checker_error,
        "ir_version": model.ir_version,
        "opset": onnx_io.opset_version(model),
        "custom_domains": onnx_io.custom_domains(model),
        "accuracy": acc,
        "latency_p50_ms": stats["p50_ms"],
        "latency_p90_ms": stats["p90_ms"],
        "latency_mean_ms": stats["mean_ms"],
        "throughput": throughput,
        "vectors": [p.relative_to(vectors_dir.parent.parent).as_posix() for p in vector_sets],
        "notes": notes,
    }
    for bs, value in throughput.items():
        metrics[f"throughput_bs{bs}"] = value
    return metrics, outputs


def write_vectors(session, x, count: int, seed: int, dest: Path) -> list[Path]:
    """`count` test data sets under `dest` from held-out images at seeded indices; outputs from `session`."""
    import numpy as np

    from zoo_stages.lib import onnx_run, vectors

    if count == 0:
        return []
    batch = onnx_run.fixed_batch(session) or 1
    rng = np.random.default_rng(seed)
    need = count * batch
    idx = rng.choice(len(x), size=need, replace=need > len(x))
    input_name = onnx_run.single_input(session).name
    sets = []
    for i in range(count):
        sample = onnx_run.prepare(session, {input_name: x[idx[i * batch:(i + 1) * batch]]})
        sets.append(vectors.write_test_vectors(dest / f"test_data_set_{i}", sample, onnx_run.run(session, sample)))
    return sets
