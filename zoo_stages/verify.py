"""The `verify` kind: check several candidate builds of one model and gate the release on them.

Checks several builds of the model and gates the release on them. `builds` names each build and
the upstream stage providing its `model` (default: every upstream model, named after its stage
id, `quantize[cpu-int8]` → `quantize-cpu-int8`); `reference` (default: the first) is what drops,
parity and speedups are measured against.

Every build is fed all its named inputs: the held-out split's features, bound to the model's
inputs by name, or without a `data:` section seeded random inputs (floats uniform in [0, 1),
integers 0 or 1, booleans True), whose dynamic dimensions other than the batch take their sizes
from `model.inputs` (an error names the input otherwise).

Per build: `onnx.checker`; its ports (name, dtype, shape of every input and output); the metrics
of the recipe's [`task:`](#task) on the held-out labels and their change against the reference
(`accuracy_drop`, `mae_increase`, …: positive is worse), read from the output `output` names or
the first that fits (a classifier with an integer `(samples,)` label output, as scikit-learn
converters make, gets its accuracy from that output exactly and top-5 from its scores); parity
with the reference, every output matched by name: floats by distance (`max_abs`, `max_rel`,
`cosine`), integers, booleans and strings exactly (`exact_match`), `top1_agreement` on a
classifier's scores output, and a record per output under `parity`; batch-1 latency p50/p90
after warm-up on `latency.threads` threads; throughput at each of `latency.batch_sizes`; file
size. Test vectors (ONNX Model Zoo layout, `vectors/<build>/test_data_set_<i>/input_0.pb`,
`input_1.pb`, …, `output_0.pb`, …) hold every input, taken from the evaluation inputs at seeded
indices, and every output.

verify reports only the metrics that apply: none of the task's without labels, for a generic
task, or when no output fits (a detector's `(N, 1, H, W)` map gets no accuracy even under the
default task); no distance on an integer output. A gate on a metric that does not apply is
refused before anything is measured, with the reason and the list of metrics that do.

A classifier whose probabilities are a sequence of maps (ZipMap: ``list[{class: probability}]``,
scikit-learn models from skl2onnx) is read as its per-class matrix, columns the classes sorted
(`zoo_stages.lib.quality.class_maps`): it is the scores output of the task's metrics
(accuracy, top-1 agreement), its parity is per class, and its test vector holds the matrix with the
class keys (`zoo_stages.lib.release.vectors`).

**Generative builds** (`task: text-generation`, any `*-generation` task): each build is a decoder
with a KV cache in onnxruntime-genai's convention (inputs `input_ids`, `attention_mask`,
`past_key_values.N.key|value`; outputs `logits`, `present.N.key|value`), run by zoo's decoding loop;
its head size, context length and end-of-sequence ids come from a `genai_config.json` (beside the
model, in its stage's `genai` output, or in the first upstream `genai` output: a quantized build
shares its export's) when there is one. The data is the held-out split's `input_ids` array (fixed-length token
blocks, `[N, L]`). Per build:

- `perplexity`: exp of the mean negative log-likelihood of each next token of the held-out blocks
  (the first `generation.text_blocks`, default all), teacher-forced, one prefill per block; and
  `perplexity_increase`, relative to the reference's (`0.05` is 5% above it);
- greedy agreement with the reference on a fixed prompt set (the first `generation.prompt_tokens`
  tokens of the first `generation.prompts` held-out blocks, each continued by
  `generation.new_tokens` greedy tokens, no end-of-sequence stop): `greedy_matched_tokens` (tokens
  equal to the reference's before the first that differs, mean over the prompts),
  `greedy_agreement` (that as a share of the new tokens) and `greedy_exact_match` (the share of
  prompts whose new tokens all match); parity (`max_abs`, `cosine`, …) of the prompts' prefill
  outputs (logits and the present key/values) with the reference's;
- timings at batch 1 on `latency.threads` threads, `latency.warmup` untimed and `latency.runs` timed
  greedy runs of a seeded `generation.latency_prompt_tokens`-token prompt continued by
  `generation.latency_new_tokens` tokens: `latency_prefill_ms` (and `_p90_ms`: the prompt's run and
  its first token), `latency_p50_ms`/`latency_p90_ms` (one decode step: one new token after the
  prefill), `throughput_tokens_per_s` (decode tokens per second), `speedup` (the reference's decode
  step p50 / this build's); file size and `onnx.checker` as for every build;
- test vectors: for each of `vectors.count` prompts of the set (chosen by `vectors.seed`), one test
  data set per run of its greedy continuation: the prefill (the prompt's ids, its mask, the empty
  cache → logits and present key/values), then `generation.vector_steps` decode steps (the greedy
  token and the cache so far → the next logits and cache); each set's `input_ids` records its step
  and the greedy token that follows (`zoo_stages.lib.release.vectors`, `decoder_step` schema 1).

Without a `data:` section the prompts are seeded random token ids, perplexity is not measured and
the build's notes say so. A generative build never gets a classification or regression metric,
`exact_match`, `top1_agreement` or `throughput_bs<N>`, and no other model gets a generation metric:
a gate on one is refused with the reason. A decoder under another task, a `text-generation` task
whose reference is not a decoder, and `generation:` settings for another task are errors.

`report.json` holds everything deterministic (task, metrics output, task metrics, parity, ports,
sizes, gates on them; for generation, its settings, perplexity and agreement); timings
vary from run to run, so they stay in the stage's metrics (cache entry, lockfile, published
manifest) and out of the report, which is bit-reproducible.

**Gates** are strings `<build>.<metric> <op> <number>`: the build is everything before the last
dot of the left-hand side, the metric the word after it, and the threshold a plain number
(`0.95`, `1e-3`, `-2`); the operators and the metrics a gate may name are listed below. Unknown builds or metrics are errors
when the recipe is loaded, with a suggestion; a metric that does not apply to the model (see the
metrics table below) is refused when verify starts. A missing or non-finite value fails its gate. Every
build also has the implicit gate `<build>.checker == 1`. A failed gate fails the stage (after
the report is written) with a table of every gate.

- **Inputs**: the upstream `model`s of the builds (and `genai` outputs: a generative build's
  `genai_config.json`); the recipe's `data:` (optional), `task:` and `model.inputs`,
  `model.num_classes`.
- **Outputs**: `report` (`report.json`), `vectors` (folder).
- **Metrics**: `builds` (every metric that applies per build, plus `inputs`, `outputs`, `parity`,
  `model_digest`, `opset`, `notes`…), `gates` (value and result of each), `passed`, `task`,
  `task_kind`, `reference`, `threads`, `host` (CPU flags).

This docstring is the kind's description on the docs site (docs/kinds.md, written by
scripts/gen_kinds_doc.py): Markdown, for users.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Mapping, Sequence

from pydantic import AfterValidator, Field, ValidationInfo, field_validator, model_serializer, model_validator

from zoo.errors import GateFailed, InvalidInput
from zoo.stage import (Column, Effect, GateOutcome, Inputs, KeyContext, KindConfig, ReportTable, StageContext,
                       StageKind)
from zoo_stages.lib.quality.numeric_outputs import NumericOutputs
from zoo_stages.lib.quality import gates as gatelib
from zoo_stages.lib.quality import generation as genlib
from zoo_stages.lib.quality import tasks
from zoo_stages.lib.runtimes.step_log import StepLog

if TYPE_CHECKING:
    import logging

    import numpy as np

BUILD_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")

# Metrics every model gets (name -> meaning); throughput_bs<N> exists for every N in latency.batch_sizes.
MEASUREMENTS: dict[str, str] = {
    "latency_p50_ms": "median batch-1 latency in ms (a generative build: one decode step)",
    "latency_p90_ms": "90th percentile batch-1 latency in ms (a generative build: one decode step)",
    "speedup": "reference p50 / this build's p50",
    "size_bytes": "model file size in bytes",
    "size_mb": "model file size in MiB",
    "size_ratio": "model file size / reference file size",
    "checker": "1 when onnx.checker accepts the model, else 0",
}
# Parity with the reference, per kind of output.
FLOAT_PARITY: dict[str, str] = {
    "max_abs": "largest |output - reference output| over the float outputs",
    "max_rel": "largest |output - reference| / |reference| over the float outputs (where reference != 0)",
    "cosine": "lowest mean per-sample cosine similarity with the reference over the float outputs",
    "cosine_min": "smallest per-sample cosine similarity with the reference over the float outputs",
}
EXACT_PARITY: dict[str, str] = {
    "exact_match": "lowest share of elements equal to the reference's over the integer, boolean and string outputs",
}
SCORES_PARITY: dict[str, str] = {
    "top1_agreement": "share of samples whose top-1 class (on the classifier's scores output) equals the reference's",
}



def _all_metrics() -> dict[str, str]:
    """Every metric a gate may name, whatever the task, with when it applies (a gate on one that
    does not apply to the model is refused at run time, once the model and the data are known)."""
    out = {**MEASUREMENTS}
    out.update({k: f"(models with float outputs) {v}" for k, v in FLOAT_PARITY.items()})
    out.update({k: f"(models with integer, boolean or string outputs) {v}" for k, v in EXACT_PARITY.items()})
    out.update({k: f"(classification) {v}" for k, v in SCORES_PARITY.items()})
    for kind, names in tasks.METRICS.items():
        needs = "held-out input_ids" if kind == "generation" else "labelled data"
        out.update({k: f"({kind}, {needs}) {v}" for k, v in names.items()})
        out.update({k: f"({kind}, {needs}) {v}" for k, v in tasks.comparison_names(kind).items()})
    out.update({k: f"(generation) {v}" for k, v in genlib.GREEDY.items()})
    out.update({k: f"(generation) {v}" for k, v in genlib.TIMINGS.items() if k not in out})
    return out


METRICS: dict[str, str] = _all_metrics()


def metric_names(batch_sizes: list[int]) -> list[str]:
    """Every metric a gate may name (for some task), given the configured throughput batch sizes."""
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
    seed: int = Field(0, description="seed choosing the held-out samples (or random inputs) used as inputs")


class GenerationConfig(KindConfig):
    """What verify measures of a generative build (`task: text-generation`)."""

    prompts: int = Field(8, ge=1, le=10_000,
                         description="prompts of the fixed greedy-agreement set: the first `prompt_tokens` tokens of "
                                     "the first this many held-out `input_ids` blocks (fewer when the split holds "
                                     "fewer; without `data:`, this many seeded random token prompts)")
    prompt_tokens: int = Field(16, ge=1, le=100_000, description="tokens of each prompt of the agreement set")
    new_tokens: int = Field(16, ge=1, le=100_000,
                            description="greedy tokens each prompt is continued by, compared position by position "
                                        "with the reference's (no end-of-sequence stop)")
    text_blocks: int | None = Field(None, ge=1,
                                    description="held-out `input_ids` blocks perplexity is computed on, the first of "
                                                "the split (default: every one)")
    latency_prompt_tokens: int = Field(32, ge=1, le=100_000,
                                       description="prompt length of the timed runs (batch 1, seeded random ids)")
    latency_new_tokens: int = Field(32, ge=2, le=100_000,
                                    description="tokens each timed run generates after its prefill; its decode steps "
                                                "give latency_p50_ms and throughput_tokens_per_s")
    vector_steps: int = Field(3, ge=0, le=256,
                              description="greedy decode steps saved as test vectors after each vector prompt's "
                                          "prefill (one test data set per run)")
    seed: int = Field(0, description="seed of the random prompts (without `data:`) and of the timed prompt")


class VerifyConfig(KindConfig):
    builds: dict[str, str] | None = Field(
        None, min_length=1, description="build name -> upstream stage id providing `model` "
                                        "(default: every upstream model, named after its stage)")
    reference: str | None = Field(None, description="the build parity and drops are measured against (default: first)")
    latency: LatencyConfig = Field(default_factory=LatencyConfig)
    vectors: VectorsConfig = Field(default_factory=VectorsConfig)
    generation: GenerationConfig = Field(default_factory=GenerationConfig,
                                         description="prompts, lengths and text of a generative build's metrics "
                                                     "(`task: text-generation` only)")
    gates: list[Annotated[str, AfterValidator(_check_gate)]] = Field(
        default_factory=list, description="'<build>.<metric> <op> <number>' conditions, e.g. 'cpu-int8.speedup >= 1'")
    eval_samples: int | None = Field(
        None, ge=1, description="use at most this many held-out samples (without a `data:` section: this many "
                                "seeded random inputs, default 32; a text-generation task uses "
                                "`generation.text_blocks` instead)")
    output: str | None = Field(
        None, description="the model output the task's metrics read (default: the first that fits: a float "
                          "(samples, classes) output for classification, (samples,) or (samples, 1) for regression)")

    @field_validator("builds")
    @classmethod
    def _build_names(cls, v):
        for name, stage in (v or {}).items():
            if not BUILD_RE.match(name):
                raise ValueError(f"build name {name!r} may use letters, digits, '-' and '_' only")
            if not isinstance(stage, str) or not stage:
                raise ValueError(f"build {name!r} must name an upstream stage id")
        return v

    @model_serializer(mode="wrap")
    def _record(self, handler):
        """`generation` enters the stage's record only where it is set: the records (and lockfiles)
        of every verify stage that measures no decoder stay those of the config without it (its
        defaults are code, in the key)."""
        data = handler(self)
        if "generation" not in self.model_fields_set:
            data.pop("generation", None)
        return data

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


@dataclass
class Evaluation:
    """What every build is fed and scored against: named inputs (samples along axis 0) and labels."""

    features: dict[str, "np.ndarray"]
    labels: "np.ndarray | None"
    description: str

    def __len__(self) -> int:
        first = next(iter(self.features.values()), None)
        return 0 if first is None else int(first.shape[0])


@dataclass
class Opened:
    """One build loaded and run on the evaluation inputs."""

    model: Any  # onnx.ModelProto; without its external data's weights when it has some
    source: "bytes | str"  # what sessions load: the serialised model, or the path of one with external data
    session: Any  # the single-threaded, deterministic session
    feeds: dict[str, "np.ndarray"]
    outputs: dict[str, "np.ndarray"]


@dataclass
class Targets:
    """What verify measures for this model: the task, the outputs its metrics read, the metrics that apply."""

    task: str
    kind: str
    scores: str | None  # the (samples, classes) or regression output
    label: str | None  # a classifier's integer label output
    task_metrics: list[str]  # tasks.evaluate's metrics that apply
    parity_metrics: list[str]  # parity metrics that apply
    valid: list[str]  # every metric verify reports for this model
    reasons: dict[str, str]  # metric that does not apply -> why
    batched: bool = True  # whether throughput_bs<N> applies (not to a generative build)

    def outputs_json(self) -> dict[str, str]:
        """Which outputs the task metrics read ({} when none)."""
        out = {"scores": self.scores, "label": self.label}
        return {k: v for k, v in out.items() if v is not None}


class Verify(NumericOutputs, StageKind):
    name = "verify"
    # 2: parity over every output, matched by name (zoo_stages.lib.quality.parity)
    # 3: every named input fed (data bound by name, or random with model.inputs); task metrics
    #    (zoo_stages.lib.quality.tasks); parity per output kind (exact_match for integer outputs); ports recorded
    # 4: equivalence across platform classes by model outputs and quality (zoo_stages.lib.quality.equivalence)
    # (task kind generation — decoders: perplexity, greedy agreement with the reference, decode timings,
    # step-by-step test vectors, `generation:` settings — came without a bump: no output of a build
    # verify measured before changes, so the shipped records stay; zoo_stages.lib.quality.generation)
    version = "4"
    Config = VerifyConfig
    tools = ("onnx", "onnxruntime", "numpy")
    # the held-out split (every data field), the task choosing the metrics, the declared inputs
    # (sizes of dynamic dimensions for random inputs), and the class count its notes compare with
    shared = ("data", "task", "model.inputs", "model.num_classes")
    outputs = ("report", "vectors")
    summary = "checks each build (checker, task metrics, parity, latency, throughput), saves test vectors, applies gates"

    def dependencies(self, config: VerifyConfig, ctx: KeyContext) -> list[Path]:
        data = ctx.shared.get("data")
        if not data:
            return []
        from zoo_stages.lib.data.datasets import data_dependencies

        return data_dependencies(data, ctx.recipe.dir)

    def run(self, inputs: Inputs, config: VerifyConfig, context: StageContext) -> Mapping[str, Path]:
        from zoo.files import atomic_write_json
        from zoo_stages.lib.runtimes.host_info import host_info

        build_stages = config.resolve_builds(inputs)
        gates = config.parsed_gates(build_stages)
        paths = {name: _model_path(inputs, name, stage) for name, stage in build_stages.items()}
        ref_name = config.reference or next(iter(build_stages))
        task = context.shared.get("task") or "generic"
        vectors_dir = context.output_path("vectors")
        vectors_dir.mkdir(parents=True, exist_ok=True)
        if _generative(task, paths[ref_name], ref_name, config, context.stage_id):
            measured = _verify_decoders(inputs, build_stages, paths, ref_name, task, gates, config, context,
                                        vectors_dir)
        else:
            measured = _verify_models(build_stages, paths, ref_name, task, gates, config, context, vectors_dir)
        builds, targets = measured.builds, measured.targets
        ref = builds[ref_name]
        for name, m in builds.items():
            for metric in targets.task_metrics:
                m[tasks.comparison_name(metric)] = tasks.compare(metric, ref.get(metric), m.get(metric))
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
            "task": targets.task,
            "task_kind": targets.kind,
            "metric_outputs": targets.outputs_json(),
            "task_metrics": targets.task_metrics,
            "reference": ref_name,
            "threads": config.latency.threads,
            "latency": config.latency.model_dump(),
            "eval_data": measured.description,
            "eval_samples": measured.samples,
            **measured.report,
            "builds": {name: {k: v for k, v in m.items() if not MEASURED.match(k)} for name, m in builds.items()},
            "gates": [{k: v for k, v in g.items() if k not in ("value", "passed")} if MEASURED.match(str(g.get("metric", "")))
                      else g for g in gate_rows],
            "measured": sorted({k for m in builds.values() for k in m if MEASURED.match(k)}),
            "passed": passed,
        }
        out = atomic_write_json(context.output_path("report.json"), report, fsync=False)
        context.metrics.update({"task": targets.task, "task_kind": targets.kind, "reference": ref_name,
                                "threads": config.latency.threads, "builds": builds, "gates": gate_rows,
                                "passed": passed, "eval_data": measured.description, "host": host_info()})
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

    def stage_references(self, config: VerifyConfig) -> dict[tuple[str | int, ...], str]:
        """`builds: {NAME: STAGE}` names the stages whose models verify reads."""
        return {("builds", name): stage for name, stage in (config.builds or {}).items()}

    def report(self, stage_id: str, metrics: Mapping[str, Any], effects: Sequence[Effect]) -> list[ReportTable]:
        """A generative model's builds with their generation metrics, then the recipe's gates with
        their values and verdicts."""
        tables = _generation_table(stage_id, metrics)
        shown = [g for g in self.gates(metrics) if not g.implicit]
        columns = (Column("gate"), Column("value", align="right", format=".4g", missing="n/a"), Column("result"))
        if not shown:  # no gates in the recipe: no table (a bare "gates (verify)" title says nothing)
            return tables
        rows = tuple((g.gate, g.value, "PASS" if g.passed else "FAIL") for g in shown)
        return tables + [ReportTable(f"gates ({stage_id})", columns, rows, show_header=False)]


@dataclass
class Measured:
    """Every build's own metrics (comparisons with the reference but speedup and size included),
    what applies, and what the report says of the evaluation."""

    builds: dict[str, dict[str, Any]]
    targets: Targets
    description: str  # what the builds were fed (eval_data)
    samples: int  # how many held-out samples (blocks) were scored (eval_samples)
    report: dict[str, Any]  # more report fields (a generative build's settings)


def _verify_models(build_stages: Mapping[str, str], paths: Mapping[str, Path], ref_name: str, task: str,
                   gates: Sequence[gatelib.Gate], config: VerifyConfig, context: StageContext,
                   vectors_dir: Path) -> Measured:
    """Every build run on the evaluation inputs: task metrics, parity per output, latency, vectors."""
    from zoo_stages.lib.quality import parity

    model_spec = context.shared.get("model") or {}
    evaluation = _evaluation(context.shared.get("data"), paths[ref_name], config, context, model_spec.get("inputs"))
    # the reference first: its outputs decide what applies, and every build is compared with them
    ref_opened = open_build(paths[ref_name], evaluation)
    targets = choose_targets(task, ref_opened, evaluation, config)
    _refuse_inapplicable(gates, targets, config)
    builds: dict[str, dict[str, Any]] = {}
    for name in [ref_name] + [b for b in build_stages if b != ref_name]:
        opened = ref_opened if name == ref_name else open_build(paths[name], evaluation)
        metrics = check_build(name, build_stages[name], paths[name], opened, evaluation, targets, config,
                              vectors_dir / name, model_spec, scratch=context.work_dir / "verify", log=context.log)
        metrics.update(parity_metrics(parity.compare(ref_opened.outputs, opened.outputs), targets))
        builds[name] = metrics
    return Measured(builds, targets, evaluation.description, len(evaluation), {})


def _generative(task: str, reference: Path, ref_name: str, config: VerifyConfig, stage_id: str) -> bool:
    """Whether verify measures these builds as text generation: the task's kind is generation and
    the reference is a decoder with a KV cache. A decoder under another task, a generation task
    without a decoder, or `generation:` settings for another task are InvalidInput."""
    from zoo import decoder_io
    from zoo.errors import FieldError
    from zoo_stages.lib.onnx.ports import read_ports

    kind = tasks.kind_of(task)
    decoder = genlib.is_decoder_file(reference)
    if kind == "generation" and not decoder:
        try:
            names = ", ".join(p.name for p in read_ports(reference).inputs)
        except (OSError, ValueError):
            names = "unreadable"
        raise InvalidInput(f"task {task!r} measures a decoder with a KV cache, and the reference build {ref_name!r} "
                           f"is not one (its inputs: {names})",
                           hint=f"a generative build takes {decoder_io.INPUT_IDS}, {decoder_io.ATTENTION_MASK} and "
                                "past_key_values.N.key|value (onnxruntime-genai's convention); or fix the recipe's "
                                "`task:`")
    if decoder and kind != "generation":
        raise InvalidInput(f"the reference build {ref_name!r} is a decoder with a KV cache, and task {task!r} is {kind}",
                           hint="set the recipe's `task: text-generation`: verify then measures perplexity, greedy "
                                "agreement and decode speed")
    if kind != "generation" and "generation" in config.model_fields_set:
        raise FieldError(f"verify's `generation:` settings apply to a text-generation task; task {task!r} is {kind}",
                         field=genlib.config_field(stage_id), hint="remove `generation:`")
    # fields of the other path, which a generative build would silently ignore
    for field, instead in (("eval_samples", "generation.text_blocks (held-out blocks) or generation.prompts"),
                           ("output", "nothing: a decoder's metrics read its `logits`")):
        if kind == "generation" and field in config.model_fields_set:
            raise FieldError(f"verify's `{field}` does not apply to a text-generation task", hint=f"use {instead}",
                             field=("stages", stage_id, "config", field))
    return decoder


@dataclass
class DecoderRun:
    """One generative build measured: its metrics, its greedy continuations of the prompt set and
    the outputs of the prompts' prefill (compared with the reference's)."""

    metrics: dict[str, Any]
    tokens: "np.ndarray"
    prefill: dict[str, "np.ndarray"]


def _verify_decoders(inputs: Inputs, build_stages: Mapping[str, str], paths: Mapping[str, Path], ref_name: str,
                     task: str, gates: Sequence[gatelib.Gate], config: VerifyConfig, context: StageContext,
                     vectors_dir: Path) -> Measured:
    """Every generative build: perplexity on the held-out blocks, greedy continuations and prefill
    outputs on the prompt set (compared with the reference's), decode timings, test vectors."""
    from zoo_stages.lib.quality import parity
    from zoo_stages.lib.runtimes import ort_session

    gen = config.generation
    genai = _genai_folders(inputs, build_stages, paths)
    _, source = load_build(paths[ref_name])
    vocab = genlib.vocab_size(genlib.open_decoder(ort_session.make_session(source, threads=1, level="all"),
                                                  paths[ref_name], ref_name, genai[ref_name]))
    text = genlib.text_set(context.shared.get("data"), context.recipe.dir, stage_id=context.stage_id,
                           prompts=gen.prompts, prompt_tokens=gen.prompt_tokens, text_blocks=gen.text_blocks,
                           vocab_size=vocab, seed=gen.seed)
    targets = decoder_targets(task, text)
    _refuse_inapplicable(gates, targets, config)
    runs: dict[str, DecoderRun] = {}
    for name in [ref_name] + [b for b in build_stages if b != ref_name]:
        runs[name] = check_decoder_build(name, build_stages[name], paths[name], text, config, vectors_dir / name,
                                         genai=genai[name], verify_stage=context.stage_id,
                                         scratch=context.work_dir / "verify", log=context.log)
    ref = runs[ref_name]
    for run in runs.values():
        run.metrics.update(genlib.agreement(ref.tokens, run.tokens))
        run.metrics.update(parity_metrics(parity.compare(ref.prefill, run.prefill), targets))
    settings = {"generation": {**gen.model_dump(), "prompts": int(text.prompts.shape[0]), "vocab_size": vocab,
                               "text_blocks": len(text) or None}}
    return Measured({name: run.metrics for name, run in runs.items()}, targets, text.description, len(text), settings)


def _genai_folders(inputs: Inputs, build_stages: Mapping[str, str],
                   paths: Mapping[str, Path]) -> dict[str, Path | None]:
    """Each build's genai_config.json folder: beside its model, its stage's `genai` output, or the
    first upstream `genai` output (a quantized build shares its export's geometry)."""
    def genai_of(up: Any) -> Path | None:
        return Path(up.outputs["genai"]) if "genai" in up.outputs else None

    shared = next((genai_of(up) for up in inputs if genai_of(up) is not None), None)
    return {name: genlib.genai_folder(paths[name], genai_of(inputs.stage(stage)), shared)
            for name, stage in build_stages.items()}


def decoder_targets(task: str, text: "genlib.TextSet") -> Targets:
    """What applies to generative builds: the measurements, greedy agreement, parity of the
    prefill's float outputs, and perplexity when there are held-out blocks."""
    task_metrics = ["perplexity"] if text.blocks is not None else []
    parity_metrics = list(FLOAT_PARITY)
    valid = (list(MEASUREMENTS) + [k for k in genlib.TIMINGS if k not in MEASUREMENTS] + list(genlib.GREEDY)
             + parity_metrics + task_metrics + [tasks.comparison_name(m) for m in task_metrics])
    reasons: dict[str, str] = {}
    for family, names in tasks.METRICS.items():
        for metric in list(names) + list(tasks.comparison_names(family)):
            reasons[metric] = (f"it is a {family} metric and task {task!r} is generation" if family != "generation"
                               else "it needs the held-out `input_ids` blocks of a `data:` section, and the recipe "
                                    "has none")
    for name in EXACT_PARITY:
        reasons[name] = ("it compares integer, boolean or string outputs; a decoder's prefill outputs (logits, "
                         "present.*) are floats")
    reasons["top1_agreement"] = (f"it compares a classifier's scores output, and task {task!r} is generation "
                                 "(greedy_agreement compares continuations)")
    return Targets(task=task, kind="generation", scores=None, label=None, task_metrics=task_metrics,
                   parity_metrics=parity_metrics, valid=valid,
                   reasons={k: v for k, v in reasons.items() if k not in valid}, batched=False)


def check_decoder_build(name: str, stage_id: str, path: Path, text: "genlib.TextSet", config: VerifyConfig,
                        vectors_dir: Path, *, genai: Path | None, verify_stage: str, scratch: Path,
                        log: "logging.Logger | None" = None) -> DecoderRun:
    """Everything verify measures on one generative build but its comparisons with the reference
    (`genai`: the folder of its genai_config.json, if any; `verify_stage`: verify's stage id, for
    the recipe path of a `generation:` field at fault)."""
    import numpy as np

    from zoo_stages.lib.release import vectors
    from zoo_stages.lib.runtimes import ort_session
    from zoo_stages.lib.runtimes import timing as timinglib

    gen, lat = config.generation, config.latency
    model, source = load_build(path)
    decoder = genlib.open_decoder(ort_session.make_session(source, threads=1, level="all"), path, name, genai)
    _check_context(decoder, text, gen, verify_stage, name)
    metrics = describe_build(stage_id, path, model, source, decoder.session, scratch)
    notes: list[str] = []
    if text.blocks is not None:
        metrics["perplexity"] = genlib.perplexity(decoder, text.blocks, text.vocab_size)
    else:
        notes.append("no `data:` section: perplexity not measured; greedy agreement on seeded random token prompts")
    tokens = genlib.greedy_tokens(decoder, text.prompts, gen.new_tokens)
    prefill = genlib.prefill_outputs(decoder, text.prompts)

    timed = genlib.open_decoder(ort_session.make_session(source, threads=lat.threads, level="all"), path, name,
                                genai)
    prompt = np.random.default_rng(gen.seed).integers(0, text.vocab_size, size=(1, gen.latency_prompt_tokens),
                                                      dtype=np.int64)
    stats = timinglib.measure_decoding(timed, prompt, gen.latency_new_tokens, warmup=lat.warmup, runs=lat.runs,
                                       progress=StepLog(log, f"latency {name}", lat.runs))

    sets: list[Path] = []
    if config.vectors.count:
        rng = np.random.default_rng(config.vectors.seed)
        count, available = config.vectors.count, text.prompts.shape[0]
        for i, row in enumerate(rng.choice(available, size=count, replace=count > available)):
            sets += vectors.write_decoder_vectors(vectors_dir, decoder, text.prompts[row:row + 1], gen.vector_steps,
                                                  first=i * (gen.vector_steps + 1), prompt_index=i)
    metrics.update({
        "latency_p50_ms": stats["step_p50_ms"],
        "latency_p90_ms": stats["step_p90_ms"],
        "latency_prefill_ms": stats["prefill_p50_ms"],
        "latency_prefill_p90_ms": stats["prefill_p90_ms"],
        "throughput_tokens_per_s": stats["tokens_per_s"],
        "vectors": [p.relative_to(vectors_dir.parent.parent).as_posix() for p in sets],
        "notes": notes,
    })
    return DecoderRun(metrics, tokens, prefill)


def _check_context(decoder: Any, text: "genlib.TextSet", gen: GenerationConfig, verify_stage: str,
                   build: str) -> None:
    """FieldError naming the `generation:` field (or the data) whose tokens exceed the build's context length."""
    from zoo.errors import FieldError

    limit = decoder.context_length
    if limit is None:
        return
    asks = [(gen.prompt_tokens + gen.new_tokens, "new_tokens", "prompt_tokens + new_tokens"),
            (gen.latency_prompt_tokens + gen.latency_new_tokens, "latency_new_tokens",
             "latency_prompt_tokens + latency_new_tokens"),
            (gen.prompt_tokens + gen.vector_steps + 1, "vector_steps", "prompt_tokens + vector_steps + 1")]
    for tokens, field, what in asks:
        if tokens > limit:
            raise FieldError(f"generation: {what} is {tokens} tokens, and build {build!r} has a context length of "
                             f"{limit} (its genai_config.json)", field=genlib.config_field(verify_stage, field),
                             hint=f"keep each run within {limit} tokens")
    if text.blocks is not None and text.blocks.shape[1] > limit:
        raise FieldError(f"the held-out input_ids blocks hold {text.blocks.shape[1]} tokens, and build {build!r} has "
                         f"a context length of {limit} (its genai_config.json)", field=("data",),
                         hint=f"tokenize the text into blocks of at most {limit} tokens")


# the run summary's table of generative builds: (header, metric, format)
GENERATION_COLUMNS = (("perplexity", "perplexity", ".4g"), ("vs ref", "perplexity_increase", "+.1%"),
                      ("greedy agreement", "greedy_agreement", ".1%"), ("exact", "greedy_exact_match", ".0%"),
                      ("prefill ms", "latency_prefill_ms", ".3g"), ("decode ms", "latency_p50_ms", ".3g"),
                      ("tokens/s", "throughput_tokens_per_s", ".4g"))


def _generation_table(stage_id: str, metrics: Mapping[str, Any]) -> list[ReportTable]:
    """One row per generative build (none for another task): perplexity and its change against the
    reference, greedy agreement and exact matches, prefill and decode times, decode tokens/s."""
    builds = metrics.get("builds")
    if metrics.get("task_kind") != "generation" or not isinstance(builds, Mapping):
        return []
    columns = (Column("build"),) + tuple(Column(h, align="right", format=f, missing="n/a")
                                         for h, _, f in GENERATION_COLUMNS)
    rows = []
    for name, m in builds.items():
        m = m if isinstance(m, Mapping) else {}
        rows.append((str(name),) + tuple(_number(m.get(metric)) for _, metric, _ in GENERATION_COLUMNS))
    return [ReportTable(f"generation ({stage_id})", columns, tuple(rows))]


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


RANDOM_INPUTS = "random inputs (floats uniform in [0, 1), integers 0 or 1, booleans True), seed 0"


def _evaluation(data, reference: Path, config: VerifyConfig, context: StageContext,
                declared: Mapping[str, Any] | None) -> Evaluation:
    """The held-out split, or seeded random inputs for every input of the reference without data.

    Random inputs still give parity, latency and test vectors for recipes without a dataset
    (e.g. pretrained weights); the task's metrics then do not apply. A dynamic dimension other
    than the batch needs its size from the recipe's ``model.inputs``.
    """
    from zoo_stages.lib.runtimes import onnx_run, ort_session

    if data:
        from zoo_stages.lib.data.datasets import load_split

        split = load_split(data, context.recipe.dir, "val").head(config.eval_samples)
        if len(split) == 0:
            raise InvalidInput("the held-out split is empty", hint="raise data.val_fraction or add data")
        return Evaluation(dict(split.features), split.labels, "held-out split")
    session = ort_session.make_session(reference, threads=1, level="disable")
    shapes = onnx_run.declared_shapes(session, declared)
    example = ", ".join(f"{s.name}: {{shape: [batch, ...], dtype: {s.dtype}}}" for s in onnx_run.input_specs(session))
    try:
        feeds = onnx_run.random_feeds(session, config.eval_samples or 32, seed=0, shapes=shapes)
    except InvalidInput as e:
        raise InvalidInput(f"{e.message}: without a `data:` section verify invents every input, so each dynamic "
                           "dimension but the batch needs a size from the recipe's `model.inputs`",
                           hint=f"declare the inputs with fixed sizes (model.inputs: {{{example}}}), "
                                "or add a `data:` section") from None
    return Evaluation(feeds, None, RANDOM_INPUTS)


def load_build(path: Path) -> tuple[Any, "bytes | str"]:
    """(the ModelProto, what sessions load) of a build: its serialisation, or the path of a model
    whose weights lie in external data files (then the ModelProto holds the graph only)."""
    from zoo_stages.lib.onnx import onnx_io

    from zoo.pathsafety import external_data_files

    if external_data_files(path) and onnx_io.loadable_as_is(path):
        # weights beside the model (a dynamo export, a model above 2 GB): onnxruntime reads
        # them from the files; only the graph is parsed here
        return onnx_io.load_graph(path), str(path)
    model = onnx_io.load_model(path)
    return model, onnx_io.model_bytes(model)  # serialised once for every session


def open_build(path: Path, evaluation: Evaluation) -> Opened:
    """Load a build, bind the evaluation inputs to its inputs by name and run it single-threaded."""
    from zoo_stages.lib.runtimes import onnx_run, ort_session

    model, source = load_build(path)
    session = ort_session.make_session(source, threads=1, level="all")
    feeds = onnx_run.prepare(session, onnx_run.bind(session, evaluation.features, where=evaluation.description),
                             where=evaluation.description)
    outputs = onnx_run.run(session, feeds, batch_size=32, where=evaluation.description)
    return Opened(model=model, source=source, session=session, feeds=feeds, outputs=outputs)


def choose_targets(task: str, ref: Opened, evaluation: Evaluation, config: VerifyConfig) -> Targets:
    """The outputs the task's metrics read and every metric that applies, from the reference build."""
    import numpy as np

    from zoo_stages.lib.quality import parity
    from zoo_stages.lib.runtimes import onnx_run

    kind = tasks.kind_of(task)
    specs = onnx_run.output_specs(ref.session)
    scores = tasks.scores_output(specs, config.output, kind)
    label = tasks.label_output(specs) if kind == "classification" else None
    classes = None
    if scores is not None and kind == "classification":
        classes = int(np.asarray(ref.outputs[scores]).shape[1])
    labelled = evaluation.labels is not None
    task_metrics = tasks.applicable(kind, labelled=labelled, scores=scores, label=label, classes=classes)

    exact = [n for n, a in ref.outputs.items() if parity.is_exact(np.asarray(a).dtype)]
    floats = [n for n in ref.outputs if n not in exact]
    parity_metrics = (list(FLOAT_PARITY) if floats else []) + (list(EXACT_PARITY) if exact else [])
    if kind == "classification" and scores is not None:
        parity_metrics += list(SCORES_PARITY)

    reasons: dict[str, str] = {}
    ports = ", ".join(f"{s.name} {s.dtype} {list(s.shape or [])}" for s in specs)
    for name in FLOAT_PARITY:
        reasons[name] = f"it compares float outputs and the model has none (its outputs: {ports})"
    for name in EXACT_PARITY:
        reasons[name] = f"it compares integer, boolean or string outputs and the model has none (its outputs: {ports})"
    reasons["top1_agreement"] = ("it compares a classifier's scores output, and "
                                 + (f"task {task!r} is {kind}" if kind != "classification"
                                    else f"the model has none (its outputs: {ports})"))
    for metric in list(genlib.GREEDY) + [k for k in genlib.TIMINGS if k not in MEASUREMENTS]:
        reasons[metric] = f"it measures a generative build (task text-generation), and task {task!r} is {kind}"
    for other, names in tasks.METRICS.items():
        for metric in list(names) + list(tasks.comparison_names(other)):
            reasons[metric] = _task_metric_reason(metric, other, task, kind, labelled, scores or label, classes, ports)
    valid = list(MEASUREMENTS) + parity_metrics + task_metrics + [tasks.comparison_name(m) for m in task_metrics]
    return Targets(task=task, kind=kind, scores=scores, label=label, task_metrics=task_metrics,
                   parity_metrics=parity_metrics, valid=valid,
                   reasons={k: v for k, v in reasons.items() if k not in valid})


def _task_metric_reason(metric: str, family: str, task: str, kind: str, labelled: bool, readable: str | None,
                        classes: int | None, ports: str) -> str:
    """Why a task metric of `family` does not apply to this model (when it does not)."""
    if family != kind:
        return f"it is a {family} metric and task {task!r} is {kind}" + (
            " (a generic task has parity metrics only)" if kind == "generic" else "")
    if kind == "generation":  # a generative build is measured by _verify_decoders, never here
        return "it measures a decoder with a KV cache"
    if not labelled:
        return "it needs labelled data, but the recipe has no `data:` section (or its data has no labels)"
    if readable is None:
        want = ("a float (samples, classes) scores output or an integer (samples,) label output"
                if kind == "classification" else "a float (samples,) or (samples, 1) output")
        return f"it needs {want}, and the model has none (its outputs: {ports})"
    if metric.startswith("top5"):
        return (f"it needs more than {tasks.TOP_K} classes; the model's scores have {classes}" if classes
                else "it needs a float (samples, classes) scores output; the model has an integer label output only")
    return "it does not apply to this model"


BATCHED_REASON = ("a generative build is timed by its decode steps at batch 1 (throughput_tokens_per_s, "
                  "latency_p50_ms), not by batch size")


def _refuse_inapplicable(gates: Sequence[gatelib.Gate], targets: Targets, config: VerifyConfig) -> None:
    """InvalidInput naming the first gate on a metric verify does not report for this model."""
    batched = [f"throughput_bs{b}" for b in config.latency.batch_sizes]
    valid = sorted(targets.valid + (batched if targets.batched else []))
    for gate in gates:
        if gate.metric not in valid:
            why = targets.reasons.get(gate.metric, BATCHED_REASON if gate.metric in batched and not targets.batched
                                      else "it does not apply to this model")
            raise InvalidInput(f"gate {gate.text!r}: verify does not report {gate.metric!r} for this model: {why}",
                               hint=f"metrics that apply: {', '.join(valid)}")


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


def ports(specs: Sequence[Any]) -> list[dict[str, Any]]:
    """Ports as JSON: name, numpy-style dtype and shape (ints, names of dynamic dims, null)."""
    return [{"name": s.name, "dtype": s.dtype, "shape": None if s.shape is None else list(s.shape)} for s in specs]


def check_build(name: str, stage_id: str, path: Path, opened: Opened, evaluation: Evaluation, targets: Targets,
                config: VerifyConfig, vectors_dir: Path, model_spec: Mapping[str, Any], *,
                scratch: Path, log: "logging.Logger | None" = None) -> dict[str, Any]:
    """Everything verify measures on one build but its comparisons with the reference (`scratch`:
    a folder for temporary copies; `log`: where the latency runs' progress lines go)."""

    from zoo_stages.lib.runtimes import onnx_run, ort_session
    from zoo_stages.lib.runtimes import timing as timinglib

    notes: list[str] = []
    values = build_task_metrics(opened.outputs, evaluation, targets, notes)
    n_classes = model_spec.get("num_classes")
    scores = opened.outputs.get(targets.scores) if targets.kind == "classification" and targets.scores else None
    if n_classes and scores is not None and scores.ndim == 2 and scores.shape[1] != n_classes:
        notes.append(f"model outputs {scores.shape[1]} classes, the recipe's model.num_classes is {n_classes}")

    lat = config.latency
    timing = ort_session.make_session(opened.source, threads=lat.threads, level="all")
    fixed = onnx_run.fixed_batch(timing)
    stats = timinglib.measure_latency(timing, timinglib.batch_of(opened.feeds, fixed or 1), warmup=lat.warmup,
                                      runs=lat.runs, progress=StepLog(log, f"latency {name}", lat.runs))
    throughput = timinglib.measure_throughput(timing, opened.feeds, lat.batch_sizes, warmup=min(lat.warmup, 2),
                                              runs=lat.throughput_runs)
    if fixed is not None and any(v is None for v in throughput.values()):
        notes.append(f"the model's batch dimension is fixed to {fixed}; other throughput batch sizes were skipped")

    vector_sets = write_vectors(opened.session, opened.feeds, config.vectors.count, config.vectors.seed, vectors_dir)
    metrics: dict[str, Any] = {
        **describe_build(stage_id, path, opened.model, opened.source, opened.session, scratch),
        **values,
        "latency_p50_ms": stats["p50_ms"],
        "latency_p90_ms": stats["p90_ms"],
        "latency_mean_ms": stats["mean_ms"],
        "throughput": throughput,
        "vectors": [p.relative_to(vectors_dir.parent.parent).as_posix() for p in vector_sets],
        "notes": notes,
    }
    for bs, value in throughput.items():
        metrics[f"throughput_bs{bs}"] = value
    return metrics


def describe_build(stage_id: str, path: Path, model: Any, source: "bytes | str", session: Any,
                   scratch: Path) -> dict[str, Any]:
    """What a build is: its stage, digest, size, onnx.checker's verdict, IR version, opset, custom
    domains and ports."""
    from zoo_stages.lib.onnx import onnx_io
    from zoo_stages.lib.runtimes import onnx_run

    # weights in external data files are checked from the files
    checker_error = onnx_io.checker_error(Path(source) if isinstance(source, str) else model, scratch)
    size = onnx_io.model_size(Path(path))
    return {
        "stage": stage_id,
        "model_digest": onnx_io.model_digest(Path(path)),
        "size_bytes": size,
        "size_mb": size / 2**20,
        "checker": int(checker_error is None),
        "checker_error": checker_error,
        "ir_version": model.ir_version,
        "opset": onnx_io.opset_version(model),
        "custom_domains": onnx_io.custom_domains(model),
        "inputs": ports(onnx_run.input_specs(session)),
        "outputs": ports(onnx_run.output_specs(session)),
    }


def build_task_metrics(outputs: Mapping[str, "np.ndarray"], evaluation: Evaluation, targets: Targets,
                       notes: list[str]) -> dict[str, float | None]:
    """The task metrics that apply, from one build's outputs; None (failing any gate) for those a
    build cannot give because it lacks an output the reference has."""
    if not targets.task_metrics:
        return {}
    missing = [n for n in (targets.scores, targets.label) if n is not None and n not in outputs]
    if missing:
        notes.append(f"the build has no output {', '.join(map(repr, missing))}, which the task metrics read")
        return {m: None for m in targets.task_metrics}
    values = tasks.evaluate(targets.kind, outputs, evaluation.labels, targets.scores, label_output=targets.label)
    return {m: values.get(m) for m in targets.task_metrics}


def parity_metrics(report: Any, targets: Targets) -> dict[str, Any]:
    """The parity figures that apply to the model (by output kind), and one record per output."""
    out: dict[str, Any] = {}
    if "max_abs" in targets.parity_metrics:
        out.update(max_abs=report.max_abs, max_rel=report.max_rel, cosine=report.cosine,
                   cosine_min=report.cosine_min)
    if "exact_match" in targets.parity_metrics:
        out["exact_match"] = min(1.0 - o.mismatch_fraction for o in report.outputs if o.exact)
    if "top1_agreement" in targets.parity_metrics:
        scores = next((o for o in report.outputs if o.name == targets.scores), None)
        out["top1_agreement"] = scores.top1_agreement if scores is not None and scores.note is None else None
    out["parity"] = {o.name: _parity_record(o) for o in report.outputs}
    return out


def _parity_record(o: Any) -> dict[str, Any]:
    """One output's parity as the report keeps it: exact outputs never get distances."""
    record = o.to_json()
    if o.exact:
        record["exact_match"] = 1.0 - o.mismatch_fraction
    return record


def write_vectors(session: Any, feeds: Mapping[str, "np.ndarray"], count: int, seed: int, dest: Path) -> list[Path]:
    """`count` test data sets under `dest`, every input from `feeds` at seeded sample indices and
    every output computed by `session` (a fixed-batch model gets that many samples per set)."""
    import numpy as np

    from zoo_stages.lib.release import vectors
    from zoo_stages.lib.runtimes import onnx_run

    if count == 0:
        return []
    batch = onnx_run.fixed_batch(session) or 1
    n = onnx_run.sample_count(feeds)
    rng = np.random.default_rng(seed)
    need = count * batch
    idx = rng.choice(n, size=need, replace=need > n)
    sets = []
    for i in range(count):
        rows = idx[i * batch:(i + 1) * batch]
        sample = onnx_run.prepare(session, {k: (v[rows] if v.ndim > 0 else v) for k, v in feeds.items()})
        sets.append(vectors.write_test_vectors(dest / f"test_data_set_{i}", sample, onnx_run.run(session, sample)))
    return sets
