"""The `deploy` stage kind: device builds, test vectors, model card, manifest, publish.

Recipe usage::

    deploy:
      needs: [optimize, quantize, verify]
      config:
        builds:
          cpu-fp32:  {from: optimize}                  # shipped as is; verified under the same name
          cpu-int8:  {from: quantize}
          cuda-fp16: {from: optimize, convert: fp16}   # float16, float32 I/O, parity-checked on the CPU
          mobile:    {from: quantize, convert: ort}    # ORT format for onnxruntime mobile
          tensorrt-fp16: {from: export, convert: tensorrt}  # onnxruntime's TensorRT provider, fp16 engine
        publish: true

For every build, ``out_dir/release/`` gets ``builds/<build>/model.onnx`` (or ``model.ort``),
its test vectors (``builds/<build>/test_data_set_0/input_0.pb``... in the ONNX Model Zoo
layout) and a `Build` entry; then the model card ``README.md`` and, last, ``zoo-manifest.json``
(the manifest format of zoo/manifest.py). That folder is a complete release, and it is
byte-deterministic: the same inputs give the same bytes (no timestamps, sorted keys, one inference
thread). Deploy does not publish it: with ``publish: true`` it declares the folder as the version's
release (`release_output`) and the engine publishes it to the local zoo (zoo/engine/publish.py),
after a run or a cache hit alike, through `publication`, which adds the timings measured upstream.

Provenance (`zoo_stages.lib.provenance`): every shipped ONNX build is stamped with
``metadata_props`` (zoo version, recipe name@version and digest, deploy's key, build name,
source digest, license and the sources' attribution); an ORT-format build is converted from a
stamped copy of its source, so it carries the same props. The release also holds ``zoo.lock``
(the lock records of every ancestor stage: what reproduces it) and ``provenance.intoto.json``
(an in-toto statement, SLSA provenance v1, whose subjects are every build file), both listed
in the manifest's ``files``; the model card gets a Provenance section rendered from the
statement.

- Builds without conversion ship their upstream model unchanged, with verify's metrics and test
  vectors for the build of the same name (``verified_as`` overrides the name). Those vectors
  are re-run against the model (``check_vectors``) so a wrong name mapping fails loudly.
- ``convert: fp16`` and ``convert: ort`` builds are compared with their source on the CPU
  (held-out data when the recipe has a ``data:`` section, else verify's test inputs, else fixed
  random inputs); a difference beyond ``atol + rtol * |ref|`` raises GateFailed with a table.
  Their test vectors are the converted model's outputs on verify's test inputs.
- ``convert: tensorrt`` builds (`zoo_stages.lib.tensorrt_build`) ship their source model for
  onnxruntime's TensorRT provider, with the provider options (precision, engine cache) in the
  build's ``provider_options``: fp16 from a float model, int8 from a QDQ model made with
  quantize's ``preset: tensorrt``; a model TensorRT cannot compile as one engine is refused. On a
  host where onnxruntime offers the provider they are run there (parity, latency, measured_on
  with the GPU); elsewhere they are published ``verified: false`` with the reason.
- Every ONNX build whose bytes verify's checker gate did not see (a conversion, an unverified
  build) passes ``onnx.checker`` with ``full_check`` here, or the stage fails (StageFailed naming
  the build) and nothing is published: a build is valid ONNX, not only a graph onnxruntime
  tolerates.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, ClassVar, Literal, Mapping, Sequence

from pydantic import ConfigDict, Field, field_validator, model_validator

from zoo.errors import GateFailed, InvalidInput, StageFailed, ZooError
from zoo.files import atomic_copy, atomic_write
from zoo.manifest import BUILD_RE, MANIFEST_FILE, Build, FileRef, Lineage, Manifest, file_ref, read_manifest
from zoo.stage import (PUBLISHED, Column, Effect, Inputs, KeyContext, KindConfig, ReportTable, StageContext, StageKind,
                       Upstream, published_manifest)
from zoo_stages.lib.numeric_outputs import NumericOutputs
from zoo_stages.lib.conversion_check import BATCH_SIZE, ConversionCheck
from zoo_stages.lib.step_log import StepLog
from zoo_stages.lib.provenance import LOCK_FILE, STATEMENT_FILE
from zoo_stages.lib.release_folder import check_complete
from zoo_stages.lib.vectors import find_sets, read_tensors, vector_files, write_test_vectors
from zoo_stages.lib.verify_report import VerifyOutputs, read_verify_outputs

CARD_FILE = "README.md"
TOKENIZER_FILE = "tokenizer.json"  # a text model's tokenizer (Hugging Face `tokenizers` JSON), beside the card
# flatbuffers writes the canonical .ort bytes (see convert.canonical_ort_bytes), so its version
# matters to `convert: ort` builds; openvino to `convert: openvino` ones
BASE_TOOLS = ("onnx", "onnxruntime")
CONVERSION_TOOLS = {"ort": ("flatbuffers",), "openvino": ("openvino",)}
# default parity tolerances per conversion: fp16 rounds every weight and activation, while the
# ORT format runs the very same kernels (only graph optimizations are baked in)
DEFAULT_TOLERANCES = {"fp16": (1e-2, 1e-2), "ort": (1e-4, 1e-4), "openvino": (1e-3, 1e-3), "tensorrt": (1e-2, 1e-2)}
# what a build made for CUDA needs to be run where it is meant to run
CUDA_PROVIDER = "CUDAExecutionProvider"
CPU_PROVIDER = "CPUExecutionProvider"
# timings deploy measures itself (builds verify did not time: OpenVINO's, a CUDA build on a GPU host)
LATENCY_WARMUP, LATENCY_RUNS = 5, 30
# re-running verify's vectors: same model, same kernels; only thread scheduling may differ. Where
# verify ran on another platform class (a shared or remote cache, `zoo repro --check` across
# classes), a quantized model's int8 kernels differ more: its vectors pass by the quantized bar of
# zoo_stages.lib.equivalence (mean cosine), as `repro --check` judges them
VECTOR_CHECK_TOLERANCE = (1e-3, 1e-3)
# options about what happens around the release, not what it holds: left out of its provenance
_SIDE_EFFECT_OPTIONS = {"publish", "measurements"}


class BuildSpec(KindConfig):
    """One device build of the release."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    source: str = Field(alias="from", min_length=1,
                        description="id of the upstream stage whose `model` output this build ships")
    convert: Literal["fp16", "ort", "openvino", "tensorrt"] | None = Field(
        None, description="fp16: float16 weights/compute with float32 I/O (CUDA); ort: ORT format (mobile); "
                          "openvino: OpenVINO IR (model.xml + model.bin) for its CPU plugin, float32 inference "
                          "pinned; from a QDQ model it runs int8; tensorrt: the source model for onnxruntime's "
                          "TensorRT provider with its engine options (fp16, or int8 from a QDQ model)")
    verified_as: str | None = Field(
        None, description="name of the build in verify's report to take metrics/vectors from "
                          "(for converted builds: the verified build of the source model)")
    optimization_style: Literal["Fixed", "Runtime"] | None = Field(
        None, description="ORT format only: Fixed (default) bakes optimizations in; Runtime saves some "
                          "for compiling execution providers (NNAPI, CoreML)")
    atol: float | None = Field(None, ge=0, description="parity tolerance of a conversion (default fp16 1e-2, ort 1e-4)")
    rtol: float | None = Field(None, ge=0, description="relative parity tolerance (default fp16 1e-2, ort 1e-4)")
    precision: str | None = Field(None, description="override the precision read from the model (fp32, fp16, int8); "
                                                    "tensorrt: the engine's (default fp16, int8 for a QDQ model)")
    execution_providers: list[str] | None = Field(
        None, description="providers to list in the manifest (default: CUDA then CPU for fp16, CPU otherwise)")
    requires: dict[str, str] | None = Field(None, description="extra requirements, e.g. {device: cuda}")
    op_block_list: list[str] = Field(default_factory=list,
                                     description="fp16 only: operator types to keep in float32")

    @model_validator(mode="after")
    def _options_match_conversion(self):
        if self.optimization_style is not None and self.convert != "ort":
            raise ValueError("`optimization_style` applies to `convert: ort` builds only")
        if self.op_block_list and self.convert != "fp16":
            raise ValueError("`op_block_list` applies to `convert: fp16` builds only")
        return self


class DeployConfig(KindConfig):
    """Config of the deploy kind."""

    builds: dict[str, BuildSpec] = Field(min_length=1, description="build name -> how to make it")
    publish: bool = Field(True, description="publish the release to the local zoo")
    intended_use: str = Field("", description="model card: intended use (a generic text by default)")
    limitations: str = Field("", description="model card: limitations (a generic text by default)")
    parity_samples: int | None = Field(None, ge=1, description="held-out samples for parity checks (default: all)")
    vector_samples: int = Field(8, ge=1, description="samples per generated test vector when verify has none")
    check_vectors: bool = Field(True, description="re-run verify's test vectors against each shipped model")
    measurements: bool = Field(
        True, description="add verify's timing measurements (latency, throughput, speedup) to the PUBLISHED "
                          "manifest and card; the stage's own release output never holds them, so it stays "
                          "bit-reproducible")

    @field_validator("builds", mode="before")
    @classmethod
    def _shorthand(cls, v):
        # `cpu-fp32: optimize` is short for `cpu-fp32: {from: optimize}`
        if isinstance(v, dict):
            return {k: ({"from": spec} if isinstance(spec, str) else spec) for k, spec in v.items()}
        return v

    @field_validator("builds")
    @classmethod
    def _build_names(cls, v):
        for name in v:
            if not re.match(BUILD_RE, name):
                raise ValueError(f"build name {name!r} must be lowercase letters, digits, '.', '_' or '-' "
                                 "(e.g. cpu-fp32)")
        return v


@dataclass
class _Shipped:
    """What one build ships, before it is described in the manifest."""

    model: Path
    extra_files: list[Path] = field(default_factory=list)
    precision: str = "fp32"
    metrics: dict[str, Any] = field(default_factory=dict)
    execution_providers: list[str] = field(default_factory=lambda: ["CPUExecutionProvider"])
    provider_options: dict[str, dict[str, str]] = field(default_factory=dict)
    requires: dict[str, str] = field(default_factory=dict)
    conversion: dict[str, Any] | None = None
    runtime: str | None = None  # None: from the model's operator domains (portability.runtime_requirement)
    source: Path | None = None  # the ONNX model a conversion was made from (its ports are the build's)
    verified: bool = True
    unverified_reason: str = ""
    # timings deploy measured itself, with what they were measured on (stage metrics, never the release)
    measured: dict[str, Any] = field(default_factory=dict)
    compiled: Any = None  # an OpenVINO build's compiled model (1 thread): compiled once, run for parity and vectors
    parity_on: str = ""  # where a conversion's parity was run when not on onnxruntime's CPU provider


class Deploy(NumericOutputs, StageKind):
    """Package upstream models as device builds, write the model card and manifest, publish."""

    name: ClassVar[str] = "deploy"
    # 2: provenance (stamped builds, zoo.lock, in-toto statement); 3: reads only the recipe fields it
    # declares (the recipe's `task:` when there is no model section), zoo.lock records their values;
    # 4: publishing is an effect (context.effects), no longer a `published` metric; 5: one session builder
    # (deterministic compute, a model onnxruntime cannot load is InvalidInput), fixed-batch tails padded,
    # parity by output name with exact integer outputs and per-sample cosine (zoo_stages.lib.parity);
    # 6: any model: held-out data bound to every input by name, the task's metrics (zoo_stages.lib.tasks),
    # the manifest's `preprocessing:` and a text model's tokenizer.json; 7: zoo.lock in the lockfile's
    # schema 3 (records by platform class, the release's under `unknown`); 8: a quantized build's
    # vectors from verify on another platform class pass by the quantized bar; equivalence across
    # platform classes by model outputs (zoo_stages.lib.equivalence); 9: builds say their runtime, whether
    # they are portable ONNX (checked under onnx.reference) and whether they were run where they are made
    # to run (`verified`); a version needs one portable build; `convert: openvino`; timings with `measured_on`;
    # 10: `convert: tensorrt`, builds' `provider_options` (manifest schema 3), parity says where it ran
    version: ClassVar[str] = "10"
    Config: ClassVar[type[KindConfig]] = DeployConfig
    tools: ClassVar[tuple[str, ...]] = ("onnx", "onnxruntime", "flatbuffers", "openvino")
    # the dataset (card, conversion checks, its fingerprint) and the task the card names
    shared: ClassVar[tuple[str, ...]] = ("data", "model.task", "task")
    outputs: ClassVar[tuple[str, ...]] = ("release",)
    # the manifest and card name the recipe, so its identity enters the key; the release embeds
    # the lock records of every ancestor (context.lineage), so their digests enter it too
    recipe_fields: ClassVar[tuple[str, ...]] = ("name", "version", "description", "license", "digest")
    lineage: ClassVar[bool] = True
    summary: ClassVar[str] = "device builds (fp32, int8, fp16, ORT format), model card, manifest; publish to the zoo"
    # what `zoo release` requires of the version: what rebuilds it, and what says where it came from
    release_files: ClassVar[tuple[str, ...]] = (LOCK_FILE, STATEMENT_FILE)
    # files recording the other files' digests (or the run's figures): differ whenever the builds do
    derived_files: ClassVar[tuple[str, ...]] = (LOCK_FILE, STATEMENT_FILE, MANIFEST_FILE, "*.md")

    def tools_used(self, config: DeployConfig, ctx: KeyContext) -> tuple[str, ...]:
        """onnx and onnxruntime, and the converter of each `convert:` the builds use."""
        return tuple(sorted({*BASE_TOOLS, *(t for b in config.builds.values() for t in CONVERSION_TOOLS.get(b.convert, ()))}))

    def run(self, inputs: Inputs, config: DeployConfig, context: StageContext) -> Mapping[str, Path]:
        release = context.output_path("release")
        if release.exists():
            shutil.rmtree(release)
        release.mkdir(parents=True)
        work = Path(context.work_dir)
        work.mkdir(parents=True, exist_ok=True)

        job = _Release(inputs, config, context, release, work)
        manifest = job.build()
        context.metrics["builds"] = list(manifest.builds)
        context.metrics["release_files"] = len(manifest.all_files()) + 1
        if job.measured:  # deploy's own timings: metrics of its entry, added to the published manifest
            context.metrics["measured"] = job.measured
        return {"release": release}

    def report(self, stage_id: str, metrics: Mapping[str, Any], effects: Sequence[Effect]) -> list[ReportTable]:
        """The builds of the version this run published, read back from the local zoo."""
        return [_builds_table(e) for e in effects if e.kind == PUBLISHED]

    def release_output(self, config: DeployConfig) -> str | None:
        """The `release` folder is the version, when deploy publishes it (the engine does)."""
        return "release" if config.publish else None

    def publication(self, release: Path, config: DeployConfig, context: StageContext) -> Path:
        """The release with the timings measured upstream added (`_publication`), as the engine
        publishes it when the local zoo lacks the version: verify's (the metrics of its entry, in
        `context.inputs`) and deploy's own (its entry's `measured`). So a deploy that ran here, was
        taken from a cache or ran on a Dask worker publishes the same manifest and card on the same
        verify result. Without upstream results (a caller outside the engine), the release itself.
        """
        if context.inputs is None:
            return release
        measured = (context.entry_metrics or {}).get("measured")
        return _publication(release, read_manifest(release / MANIFEST_FILE),
                            read_verify_outputs(context.inputs, context.log), config,
                            context.shared.get("data") or None, _card_provenance(release), Path(context.work_dir),
                            measured if isinstance(measured, Mapping) else None)

    def check_release(self, manifest: Manifest, read: Callable[[str], bytes]) -> list[str]:
        """The provenance statement's subjects are exactly the build files, with their sha256."""
        from zoo_stages.lib.provenance import release_problems

        build_files = {f.path: f.sha256 for b in manifest.builds.values() for f in b.all_files()}
        return release_problems(read(STATEMENT_FILE), build_files)


def _copy_model(source: Path, src_info: Any, bdir: Path) -> tuple[Path, list[Path]]:
    """Copy an upstream ONNX model and its external data into a build folder as ``model.onnx``
    (the data files keep their names, which the model refers to); (model, data files)."""
    model = bdir / "model.onnx"
    atomic_copy(source, model, fsync=False)
    extra = []
    for location in src_info.external_data:
        atomic_copy(source.parent / location, bdir / location, fsync=False)
        extra.append(bdir / location)
    return model, extra


def _card_provenance(release: Path) -> str:
    """The model card's Provenance section of a finished release, from its statement."""
    import json

    from zoo_stages.lib.provenance import card_section

    statement = release / STATEMENT_FILE
    return card_section(json.loads(statement.read_text(encoding="utf-8"))) if statement.is_file() else ""


def _publication(release: Path, manifest: Manifest, verify: VerifyOutputs, config: DeployConfig,
                 data_spec: Mapping[str, Any] | None, provenance_section: str, work: Path,
                 measured: Mapping[str, Any] | None = None) -> Path:
    """The folder to publish: `release` itself, or a copy whose manifest and card add the timings.

    The copy hardlinks every build file, so it costs no space; only the manifest and the model
    card are rewritten (read-only, as the release's files are), with the latency/throughput/speedup
    metrics verify measured (the metrics of its stage entry: they travel with it from the host
    that measured them) and those deploy measured itself (`measured`: OpenVINO builds, a CUDA
    build on a GPU host), each build with what its figures were measured on (``measured_on``).
    """
    verified_as = (manifest.extra.get("deploy") or {}).get("verified_as") or {}
    timings: dict[str, dict[str, Any]] = {}
    where: dict[str, dict[str, Any]] = {}
    for name in manifest.builds:
        spec, vname = config.builds.get(name), verified_as.get(name)
        own = (measured or {}).get(name)
        if isinstance(own, Mapping) and own.get("metrics"):
            timings[name] = dict(own["metrics"])
            where[name] = dict(own.get("measured_on") or {})
        elif spec is not None and spec.convert is None and vname and vname in verify.measured:
            timings[name] = verify.timings(vname)
            where[name] = verify.measured_on()
    if not config.measurements or not any(timings.values()):
        return release
    pub = work / "publish"
    if pub.exists():
        shutil.rmtree(pub)
    work.mkdir(parents=True, exist_ok=True)
    shutil.copytree(release, pub, copy_function=os.link)
    data = Manifest.model_validate(manifest.model_dump())
    for name, extra in timings.items():
        data.builds[name].metrics.update(extra)
        if extra:
            data.builds[name].measured_on = where.get(name) or {}
    verification = verify.summary(measured=True)
    deploy_extra = dict(data.extra.get("deploy") or {})
    if verification:
        deploy_extra["verification"] = verification
    deploy_extra["measured"] = {"threads": verify.threads, "builds": sorted(timings)}
    data.extra["deploy"] = deploy_extra
    from zoo_stages.lib.modelcard import render_card

    card = render_card(data, dataset=data_spec, intended_use=config.intended_use, limitations=config.limitations,
                       verification=verification, conversions=deploy_extra.get("conversions"),
                       appendix=provenance_section)
    # new files (the hardlinks to the release's card and manifest are replaced), read-only: a cached
    # release's folder is published by hard links
    atomic_write(pub / CARD_FILE, card.encode("utf-8"), fsync=False, mode=0o444)
    data.card = file_ref(pub, pub / CARD_FILE)
    data = Manifest.model_validate(data.model_dump())
    atomic_write(pub / MANIFEST_FILE, data.model_dump_json(indent=2).encode("utf-8"), fsync=False, mode=0o444)
    return pub


def _builds_table(published: Effect) -> ReportTable:
    """The published version's builds (format, precision, size, the task's headline metric when the
    builds have one, latency, sha256), from the local zoo."""
    ref = published.ref
    try:
        manifest = published_manifest(published)
    except (OSError, ValueError) as e:
        return ReportTable(f"(cannot read {ref} from the local zoo: {e})")
    # only a metric the builds were measured on: no accuracy column for a regression or generic model
    shown = [m for m in ("accuracy", "mae") if any(m in b.metrics for b in manifest.builds.values())]
    columns = (Column("build"), Column("format"), Column("precision"), Column("size", align="right", format="size"),
               *(Column(m, align="right", format=".4f") for m in shown), Column("p50 ms", align="right", format=".2f"),
               Column("sha256"))
    rows = tuple((name, b.format, b.precision, b.model_size(), *(b.metrics.get(m) for m in shown),
                  b.metrics.get("latency_p50_ms"), b.file.sha256[:12]) for name, b in manifest.builds.items())
    return ReportTable(f"builds of {ref}", columns, rows)


class _Release:
    """One run of deploy: the state shared by the builds of a release."""

    def __init__(self, inputs: Inputs, config: DeployConfig, context: StageContext, release: Path, work: Path):
        self.inputs = inputs
        self.config = config
        self.ctx = context
        self.release = release
        self.work = work
        model_spec = context.shared.get("model") or {}
        self.data_spec: dict[str, Any] | None = context.shared.get("data") or None
        self.task = str(model_spec.get("task") or context.shared.get("task") or "")
        self.verify: VerifyOutputs = read_verify_outputs(inputs, context.log)
        self.check = ConversionCheck(
            self.verify, data_spec=self.data_spec, recipe_dir=context.recipe.dir, task=self.task,
            parity_samples=config.parity_samples, vector_samples=config.vector_samples, log=context.log)
        self.attribution: dict[str, list[dict[str, str]]] = {}  # build -> its sources' attribution
        self.measured: dict[str, dict[str, Any]] = {}  # build -> timings deploy measured and what on
        self.portability: dict[str, str] = {}  # build -> why it is (not) portable ONNX

    # -- verify's outputs -------------------------------------------------------------------

    def _verified_name(self, name: str, spec: BuildSpec) -> str | None:
        """The name under which verify checked this build's model (its source's, for conversions)."""
        v = self.verify
        if spec.verified_as is not None:
            if v.builds is None:
                raise InvalidInput(f"builds.{name}.verified_as is {spec.verified_as!r} but there is no verify report",
                                   hint="add the verify stage to deploy's `needs:` or drop `verified_as`")
            if spec.verified_as not in v.builds:
                raise InvalidInput(f"builds.{name}.verified_as: verify's report has no build {spec.verified_as!r} "
                                   f"(it has: {', '.join(sorted(v.builds)) or 'none'})",
                                   hint="use one of the build names of verify's `builds:`")
            return spec.verified_as
        if v.builds is None:
            return None
        if spec.convert is None and name in v.builds:
            return name
        # verify may record which stage each of its builds came from
        by_stage = sorted(b for b, e in v.builds.items() if e.get("stage") == spec.source or e.get("from") == spec.source)
        if len(by_stage) == 1:
            return by_stage[0]
        # a converted build's source is verified under the name of the unconverted build shipping it
        siblings = sorted(b for b, s in self.config.builds.items()
                          if s.convert is None and s.source == spec.source and (s.verified_as or b) in v.builds)
        if spec.convert is not None and siblings:
            sib = self.config.builds[siblings[0]]
            return sib.verified_as or siblings[0]
        return None

    # -- the release --------------------------------------------------------------------------

    def build(self) -> Manifest:
        builds: dict[str, Build] = {}
        conversions: dict[str, dict[str, Any]] = {}
        verified: dict[str, str | None] = {}
        for name, spec in self.config.builds.items():
            build, conversion, vname = self._one(name, spec)
            builds[name] = build
            verified[name] = vname
            if conversion:
                conversions[name] = conversion
        self._require_portable(builds)
        recipe = self.ctx.recipe
        extra: dict[str, Any] = {"deploy": {"verified_as": verified, "portability": dict(self.portability)}}
        if conversions:
            extra["deploy"]["conversions"] = conversions
        verification = self.verify.summary()
        if verification:
            extra["deploy"]["verification"] = verification
        lineage = self._lineage()
        preprocessing, data_files = self._preprocessing()
        files, stmt = self._provenance_files(builds, lineage)
        files = data_files + files
        extra["provenance"] = {"statement": STATEMENT_FILE, "lock": LOCK_FILE,
                               "license": stmt["predicate"]["buildDefinition"]["internalParameters"]["license"],
                               "attribution": self._all_attribution()}
        manifest = Manifest(
            name=recipe.name, version=recipe.version, description=recipe.description, license=recipe.license,
            task=self.task, preprocessing=preprocessing,
            builds=builds, lineage=lineage, files=files, extra=extra,
        )
        from zoo_stages.lib.modelcard import render_card
        from zoo_stages.lib.provenance import card_section

        card = render_card(manifest, dataset=self.data_spec, intended_use=self.config.intended_use,
                           limitations=self.config.limitations, verification=verification, conversions=conversions,
                           appendix=card_section(stmt))
        card_path = self.release / CARD_FILE
        atomic_write(card_path, card.encode("utf-8"), fsync=False)
        manifest.card = file_ref(self.release, card_path)
        manifest = Manifest.model_validate(manifest.model_dump())
        check_complete(self.release, manifest)
        # written last: a release folder with a manifest is a finished one
        atomic_write(self.release / MANIFEST_FILE, manifest.model_dump_json(indent=2).encode("utf-8"), fsync=False)
        return manifest

    def _preprocessing(self) -> tuple[dict[str, Any], list[FileRef]]:
        """The data transforms a user must apply (the manifest's `preprocessing:`), and the files they
        need: the tokenizer of a text model, written into the release as tokenizer.json."""
        if not self.data_spec:
            return {}, []
        from zoo_stages.lib import datasets

        record = datasets.preprocessing(self.data_spec, self.ctx.recipe.dir)
        if not self.data_spec.get("text"):  # only text data has a tokenizer
            return record, []
        tokenizer = datasets.tokenizer_json(self.data_spec, self.ctx.recipe.dir)
        path = self.release / TOKENIZER_FILE
        atomic_write(path, tokenizer.encode("utf-8"), fsync=False)
        return record, [file_ref(self.release, path)]

    def _provenance_files(self, builds: dict[str, Build], lineage: Lineage) -> tuple[list[FileRef], dict[str, Any]]:
        """Write zoo.lock and the in-toto statement into the release; their FileRefs and the statement."""
        from zoo_stages.lib import provenance

        recipe, lineage_records = self.ctx.recipe, dict(self.ctx.lineage)
        lock_path = self.release / LOCK_FILE
        atomic_write(lock_path, provenance.lock_yaml(recipe, lineage_records).encode("utf-8"), fsync=False)
        lock_ref = file_ref(self.release, lock_path)
        # direct inputs the engine did not describe (a deploy run outside the engine, as in tests)
        unrecorded = provenance.input_digests(up for up in self.inputs if up.stage_id not in lineage_records)
        data = None
        if "data" in lineage.sources:
            data = {"digest": lineage.sources["data"], "source": str((self.data_spec or {}).get("source", ""))}
        subjects = [(ref.path, ref.sha256) for b in builds.values() for ref in b.all_files()]
        stmt = provenance.statement(subjects=subjects, recipe=recipe, record=self.ctx.record,
                                    config=self.config.model_dump(mode="json", by_alias=True,
                                                                  exclude=_SIDE_EFFECT_OPTIONS),
                                    lineage=lineage_records, tools=lineage.tools, inputs=unrecorded, data=data,
                                    attribution=self._all_attribution(), lock_sha256=lock_ref.sha256,
                                    publisher={"stage": self.ctx.stage_id, "kind": Deploy.name,
                                               "kind_version": Deploy.version, "record": self.ctx.record,
                                               "inputs": sorted({up.stage_id for up in self.inputs})})
        stmt_path = self.release / STATEMENT_FILE
        atomic_write(stmt_path, provenance.statement_bytes(stmt), fsync=False)
        return [lock_ref, file_ref(self.release, stmt_path)], stmt

    def _all_attribution(self) -> list[dict[str, str]]:
        from zoo_stages.lib.provenance import merge_attribution

        return merge_attribution(*self.attribution.values())

    def _props(self, name: str, spec: BuildSpec, source: Path) -> dict[str, str]:
        """The metadata_props of build `name`: release identity, its source's digest, license."""
        from zoo.engine.hashing import ALGORITHM, hash_file_uncached
        from zoo_stages.lib import provenance

        self.attribution[name] = provenance.model_attribution(source)
        sources = {f"{spec.source}.model": f"{ALGORITHM}:{hash_file_uncached(source)}"}
        return provenance.release_props(self.ctx.recipe, self.ctx.record, name, sources, self.attribution[name])

    def _one(self, name: str, spec: BuildSpec) -> tuple[Build, dict[str, Any] | None, str | None]:
        """Stage one build under builds/<name>/; returns its Build entry, conversion record, verified name."""
        from zoo_stages.lib.model_info import describe

        source = self._source_model(name, spec)
        bdir = self.release / "builds" / name
        bdir.mkdir(parents=True, exist_ok=True)
        vname = self._verified_name(name, spec)
        src_info = describe(source)
        props = self._props(name, spec, source)
        if spec.convert is None:
            shipped = self._as_is(name, spec, vname, source, src_info, bdir, props)
        else:
            shipped = self._converted(name, spec, vname, source, src_info, bdir, props)
        info = describe(shipped.model) if spec.convert != "openvino" else None
        if info is not None and info.format == "onnx" and (spec.convert is not None or vname is None):
            self._check_onnx(name, shipped.model)  # bytes verify's checker gate did not see
        vectors = self._vectors(name, spec, vname, shipped, bdir)
        runtime, portable = self._runtime(name, spec, shipped, vectors)
        if shipped.measured:
            self.measured[name] = shipped.measured
        metrics = dict(shipped.metrics)
        # what a runtime loads: the model and its external data (not the operator list for minimal builds)
        metrics["size_bytes"] = shipped.model.stat().st_size + sum(
            p.stat().st_size for p in shipped.extra_files if not p.name.endswith(".required_operators.config"))
        build = Build(
            name=name,
            file=file_ref(self.release, shipped.model),
            format=info.format if info is not None else "openvino",
            precision=spec.precision or shipped.precision,
            opset=(info.opset if info is not None and info.opset is not None else src_info.opset),
            inputs=info.inputs if info is not None else src_info.inputs,
            outputs=info.outputs if info is not None else src_info.outputs,
            runtime=runtime,
            portable=portable,
            execution_providers=list(spec.execution_providers or shipped.execution_providers),
            provider_options=shipped.provider_options,
            requires=dict(sorted({**shipped.requires, **(spec.requires or {})}.items())),
            verified=shipped.verified,
            unverified_reason=shipped.unverified_reason,
            metrics=dict(sorted(metrics.items())),
            test_vectors=[file_ref(self.release, p) for p in vectors],
            extra_files=[file_ref(self.release, p) for p in sorted(shipped.extra_files)],
        )
        return build, shipped.conversion, vname

    def _check_onnx(self, name: str, model: Path) -> None:
        """`onnx.checker` (full check) of a build: a build is valid ONNX that any runtime may load,
        not only a graph onnxruntime tolerates. StageFailed naming the build otherwise."""
        from zoo_stages.lib import onnx_io

        why = onnx_io.checker_error(model, self.work)
        if why is not None:
            raise StageFailed(f"build {name}: {model.name} is not valid ONNX (onnx.checker: {why}); nothing was "
                              "published", hint="drop the build, or change how it is made (its `convert`, "
                                                "`op_block_list` or `from`)") from None

    def _as_is(self, name: str, spec: BuildSpec, vname: str | None, source: Path, src_info: Any,
               bdir: Path, props: Mapping[str, str]) -> _Shipped:
        """An upstream model shipped as is (graph, weights, external data), with verify's metrics.

        Only the provenance metadata_props are added, after checking that the unstamped source
        is the model verify checked: metadata changes no output, so verify's figures and
        vectors still apply (the vectors are re-run against the stamped file).
        """
        from zoo_stages.lib.provenance import stamp_file

        model, extra = _copy_model(source, src_info, bdir)
        metrics: dict[str, Any] = {}
        shipped = _Shipped(model=model, extra_files=extra, precision=src_info.precision or "fp32")
        if vname is not None:
            self._check_digest(name, spec, vname, source)
            metrics = self.verify.verified_metrics(vname)
            target = (spec.execution_providers or [CPU_PROVIDER])[0]
            device = (spec.requires or {}).get("device", "cpu").lower()
            if target != CPU_PROVIDER or device != "cpu":  # verify runs every build on onnxruntime's CPU provider
                shipped.verified = False
                shipped.unverified_reason = (f"verify ran it with onnxruntime's {CPU_PROVIDER} only; it is made for "
                                             f"{target if target != CPU_PROVIDER else 'device ' + device}")
        else:
            shipped.verified = False
            shipped.unverified_reason = ("no verify stage checked it" if self.verify.builds is None else
                                         f"verify's report has no build {name!r} (set builds.{name}.verified_as)")
            if self.verify.builds is not None:
                self.ctx.log.warning("deploy: build %s was not verified (no build %r in verify's report)", name, name)
        stamp_file(model, props)
        shipped.metrics = metrics
        return shipped

    def _converted(self, name: str, spec: BuildSpec, vname: str | None, source: Path, src_info: Any,
                   bdir: Path, props: Mapping[str, str]) -> _Shipped:
        """An fp16 or ORT-format conversion of an upstream model, parity-checked against it on the CPU."""
        from zoo_stages.lib import convert as cv
        from zoo_stages.lib.provenance import stamp_file

        atol, rtol = DEFAULT_TOLERANCES[spec.convert]
        atol = spec.atol if spec.atol is not None else atol
        rtol = spec.rtol if spec.rtol is not None else rtol
        run_candidate = None
        if spec.convert == "fp16":
            model = stamp_file(cv.to_fp16(source, bdir / "model.onnx", op_block_list=spec.op_block_list), props)
            sidecar = bdir / "model.onnx.data"  # only for models above protobuf's 2 GiB limit
            shipped = _Shipped(model=model, extra_files=[sidecar] if sidecar.exists() else [], precision="fp16",
                               execution_providers=[CUDA_PROVIDER, CPU_PROVIDER], requires={"device": "cuda"})
            shipped.conversion = {"kind": "fp16", "from": spec.source, "keep_io_types": True,
                                  "files": [p.name for p in [model, *shipped.extra_files]]}
            if spec.op_block_list:
                shipped.conversion["op_block_list"] = sorted(spec.op_block_list)
            run_candidate = self._on_cuda(name, shipped)
        elif spec.convert == "tensorrt":
            shipped, run_candidate = self._tensorrt(name, spec, source, src_info, bdir, props)
        elif spec.convert == "openvino":
            shipped, run_candidate = self._openvino(name, spec, self._stamped_copy(name, source, src_info, props),
                                                    src_info, bdir)
        else:
            style = spec.optimization_style or "Fixed"
            # the ORT format keeps metadata_props: convert a stamped copy so the build carries them
            result = cv.to_ort(self._stamped_copy(name, source, src_info, props), bdir, optimization_style=style,
                               work_dir=self.work)
            major, minor = metadata.version("onnxruntime").split(".")[:2]
            shipped = _Shipped(model=result.model, extra_files=[result.operators_config],
                               precision=src_info.precision or "fp32",
                               runtime=f"onnxruntime>={major}.{minor}")  # ORT format is not backward-portable
            shipped.conversion = {"kind": "ort", "from": spec.source, "optimization_style": style,
                                  "optimization_level": result.optimization_level,
                                  "files": [result.model.name, result.operators_config.name]}
        parity, accuracy, feeds = self.check.parity(name, vname, source, shipped.model, atol=atol, rtol=rtol,
                                                    run_candidate=run_candidate)
        judged = None
        if not parity.passed and spec.convert in ("openvino", "tensorrt") and shipped.precision == "int8":
            # two int8 runtimes round differently: judged by the quantized bar, as across platform classes
            judged = self._int8_equivalent(name, source, feeds, run_candidate)
            shipped.conversion["parity_judged_by"] = judged
        if judged is None:
            parity.require(f"build {name} ({spec.convert} conversion of {spec.source}): outputs differ from the source "
                           f"model beyond tolerance (max |diff| {parity.max_abs:.3g})",
                           hint="raise `atol`/`rtol` for this build if the difference is acceptable, "
                                "or keep the model in its source precision")
        if spec.convert == "ort" and shipped.conversion["optimization_style"] == "Runtime":
            shipped.conversion["runtime_optimizations_replay"] = self.check.replay_status(
                name, source, shipped.model, feeds, atol=atol, rtol=rtol)
        figures = parity.metrics()
        if shipped.parity_on:
            shipped.conversion["parity_on"] = shipped.parity_on
        shipped.metrics = {**figures, **accuracy}
        shipped.conversion.update(figures)
        if vname is not None:
            shipped.conversion["source_verified_as"] = vname
        return shipped

    def _on_cuda(self, name: str, shipped: _Shipped) -> Callable[[dict[str, Any]], dict[str, Any]] | None:
        """Where onnxruntime offers CUDA here: run the float16 build on it (its parity is then checked
        on the GPU) and time it; elsewhere mark it unverified and say why (None: parity on the CPU)."""
        import onnxruntime as ort

        if CUDA_PROVIDER not in ort.get_available_providers():
            shipped.verified = False
            shipped.unverified_reason = ("not run on a CUDA GPU: the host that built it had none (its outputs were "
                                         "checked against its source with onnxruntime on the CPU)")
            return None
        from zoo_stages.lib import onnx_run, ort_session
        from zoo_stages.lib.host_info import gpu_name, host_info, measured_on

        session = ort_session.make_session(shipped.model, providers=[CUDA_PROVIDER])
        shipped.parity_on = f"{CUDA_PROVIDER} ({gpu_name()})"
        feeds, _ = self.check.inputs_for(name, None, session)
        shipped.measured = {"metrics": self._timings(name, session, onnx_run.prepare(session, feeds)),
                            "measured_on": measured_on(host_info(), runtime="onnxruntime", execution_provider=CUDA_PROVIDER,
                                                       runtime_version=metadata.version("onnxruntime"),
                                                       device=gpu_name())}
        return lambda f: onnx_run.run(session, f, batch_size=BATCH_SIZE)

    def _tensorrt(self, name: str, spec: BuildSpec, source: Path, src_info: Any, bdir: Path,
                  props: Mapping[str, str]) -> tuple[_Shipped, Callable[[dict[str, Any]], dict[str, Any]] | None]:
        """A build for onnxruntime's TensorRT provider: the source model (stamped) and the provider
        options that make its engine (zoo_stages.lib.tensorrt_build). InvalidInput, before anything
        is written, for a model TensorRT cannot compile as one engine or a precision it cannot have."""
        from zoo_stages.lib import onnx_io
        from zoo_stages.lib import tensorrt_build as trt
        from zoo_stages.lib.provenance import stamp_file

        where = f"builds.{name} (convert: tensorrt, from: {spec.source})"
        try:
            precision = trt.precision_for(src_info.precision, spec.precision)
        except ValueError as e:
            raise InvalidInput(f"{where}: {e}", hint=f"set builds.{name}.precision to fp16 or fp32 for a float "
                                                     "source, or leave it out") from None
        problems = trt.problems(onnx_io.load_graph(source), base_dir=source.parent)
        if problems:
            fixes = []
            if any("domain" in p for p in problems):
                fixes.append("build from the plain export (`from: export`: optimize's extended level adds "
                             "onnxruntime-only ops)")
            if any("QuantizeLinear" in p or "int32" in p for p in problems):
                fixes.append("build int8 from a quantize stage with `preset: tensorrt` (symmetric int8, float biases)")
            raise InvalidInput(f"{where}: TensorRT cannot compile the model of stage {spec.source!r} as one engine: "
                               + "; ".join(problems), hint="; ".join(fixes))
        model, extra = _copy_model(source, src_info, bdir)
        stamp_file(model, props)
        options = trt.provider_options(precision)
        shipped = _Shipped(model=model, extra_files=extra, precision=precision,
                           execution_providers=[trt.TENSORRT_PROVIDER, CUDA_PROVIDER, CPU_PROVIDER],
                           provider_options={trt.TENSORRT_PROVIDER: options}, requires={"device": "cuda"})
        shipped.conversion = {"kind": "tensorrt", "from": spec.source, "precision": precision,
                              "provider_options": options, "files": [p.name for p in [model, *extra]]}
        return shipped, self._on_tensorrt(name, shipped, options)

    def _on_tensorrt(self, name: str, shipped: _Shipped,
                     options: dict[str, str]) -> Callable[[dict[str, Any]], dict[str, Any]] | None:
        """Where onnxruntime offers TensorRT here: build the engine (cached in the work folder), run
        the build on it for parity and time it; elsewhere mark it unverified and say why."""
        from zoo_stages.lib import tensorrt_build as trt

        if not trt.available():
            shipped.verified = False
            shipped.unverified_reason = (
                f"not run with TensorRT: the host that built it had no NVIDIA GPU with onnxruntime's "
                f"{trt.TENSORRT_PROVIDER} (its file is the source model, run on the CPU for its test vectors; "
                "the engine is built where it first runs)")
            return None
        from zoo_stages.lib import onnx_run
        from zoo_stages.lib.host_info import gpu_name, host_info, measured_on

        session = trt.make_session(shipped.model, options, self.work / "tensorrt-engines" / name)
        device = gpu_name()
        feeds, _ = self.check.inputs_for(name, None, session)
        version = metadata.version("onnxruntime")
        engine = trt.tensorrt_version()
        shipped.parity_on = f"{trt.TENSORRT_PROVIDER} ({device})"
        shipped.measured = {"metrics": self._timings(name, session, onnx_run.prepare(session, feeds)),
                            "measured_on": measured_on(host_info(), runtime="onnxruntime",
                                                       execution_provider=trt.TENSORRT_PROVIDER,
                                                       runtime_version=f"{version} (TensorRT {engine})" if engine
                                                       else version, device=device)}
        return lambda f: onnx_run.run(session, f, batch_size=BATCH_SIZE)

    def _openvino(self, name: str, spec: BuildSpec, stamped: Path, src_info: Any,
                  bdir: Path) -> tuple[_Shipped, Callable[[dict[str, Any]], dict[str, Any]]]:
        """OpenVINO IR of a stamped copy of the source (its metadata_props become the IR's rt_info),
        run by OpenVINO's CPU plugin with float32 inference pinned: parity, the task's metrics and
        test vectors come from that run, and its latency is timed (one thread unless verify used more)."""
        from zoo_stages.lib import openvino_build, ort_session
        from zoo_stages.lib.host_info import host_info, measured_on

        xml, weights = openvino_build.to_openvino(stamped, bdir)
        compiled = openvino_build.compile_model(xml, threads=1)
        precision = src_info.precision or "fp32"
        version = openvino_build.version()
        major, minor = (version or "0.0").split(".")[:2]
        shipped = _Shipped(model=xml, extra_files=[weights], precision=precision, execution_providers=["CPU"],
                           requires={"device": "cpu"}, runtime=f"openvino>={major}.{minor}", source=stamped,
                           compiled=compiled)
        shipped.conversion = {"kind": "openvino", "from": spec.source, "inference_precision": "f32",
                              "files": [xml.name, weights.name]}
        feeds, _ = self.check.inputs_for(name, None, ort_session.make_session(stamped))
        threads = self.verify.threads or 1
        timed = compiled if threads == 1 else openvino_build.compile_model(xml, threads=threads)
        info = openvino_build.runtime_info()
        shipped.measured = {"metrics": self._timings(name, openvino_build.CompiledSession(timed), feeds),
                            "measured_on": measured_on(host_info(), runtime="openvino", runtime_version=version,
                                                       execution_provider="CPU", threads=threads,
                                                       device=info.get("device_name"))}
        return shipped, lambda f: openvino_build.run(compiled, f, batch_size=BATCH_SIZE)

    def _timings(self, name: str, session: Any, feeds: Mapping[str, Any]) -> dict[str, Any]:
        """Latency (batch 1), throughput and speedup of a build deploy runs itself, measured as verify
        measures its builds (its warmup, runs and batch sizes; defaults when there is no verify), so
        the figures sit beside verify's in the manifest. The speedup is against verify's reference
        build, timed on verify's host: comparable when deploy runs on the same kind of host."""
        from zoo_stages.lib import onnx_run, timing

        settings = self.verify.latency
        warmup = int(settings.get("warmup", LATENCY_WARMUP))
        fixed = onnx_run.fixed_batch(session)
        runs = int(settings.get("runs", LATENCY_RUNS))
        stats = timing.measure_latency(session, timing.batch_of(feeds, fixed or 1), warmup=warmup, runs=runs,
                                       progress=StepLog(self.ctx.log, f"latency {name}", runs))
        out: dict[str, Any] = {"latency_p50_ms": stats["p50_ms"], "latency_p90_ms": stats["p90_ms"],
                               "latency_mean_ms": stats["mean_ms"]}
        sizes = [int(b) for b in settings.get("batch_sizes") or () if isinstance(b, int)]
        if sizes:
            throughput = timing.measure_throughput(session, feeds, sizes, warmup=min(warmup, 2),
                                                   runs=int(settings.get("throughput_runs", 10)))
            out.update({f"throughput_bs{bs}": v for bs, v in throughput.items() if v is not None})
        reference = self.verify.reference_latency()
        if reference and stats["p50_ms"] > 0:
            out["speedup"] = reference / stats["p50_ms"]
        return out

    def _int8_equivalent(self, name: str, source: Path, feeds: dict[str, Any],
                         run_candidate: Callable[[dict[str, Any]], dict[str, Any]] | None) -> str | None:
        """Whether an int8 build run by another runtime is equivalent to its QDQ source by the
        quantized bar (zoo_stages.lib.equivalence); the verdict line, or None when it is not."""
        from zoo_stages.lib import equivalence, onnx_run, ort_session

        if run_candidate is None:
            return None
        ref = onnx_run.run(ort_session.make_session(source), feeds, batch_size=BATCH_SIZE)
        ok, line = equivalence.judge_outputs(ref, run_candidate(feeds), quantized=True)
        self.ctx.log.info("deploy: %s against its int8 source: %s", name, line)
        return line if ok else None

    def _runtime(self, name: str, spec: BuildSpec, shipped: _Shipped, vectors: list[Path]) -> tuple[str, bool]:
        """(runtime requirement, portable) of a shipped build: portable ONNX is standard domains
        only, valid under onnx.checker's full check, and its test vectors reproduced by ONNX's
        reference evaluator as by onnxruntime (zoo_stages.lib.portability). The verdict's reason is
        kept for the manifest (``extra.deploy.portability``)."""
        from zoo_stages.lib import portability
        from zoo_stages.lib.reference_run import DEFAULT_TOLERANCE, FP16_TOLERANCE

        if shipped.runtime is not None:  # OpenVINO IR, ORT format: their runtime, never portable ONNX
            self.portability[name] = f"{shipped.runtime} only"
            return shipped.runtime, False
        tolerance = FP16_TOLERANCE if shipped.precision == "fp16" else DEFAULT_TOLERANCE
        report = portability.assess(shipped.model, sorted({v.parent for v in vectors}), scratch=self.work,
                                    tolerance=tolerance)
        self.ctx.log.info("deploy: %s %s portable ONNX: %s", name, "is" if report.portable else "is not",
                          report.reason)
        self.portability[name] = (f"standard ONNX domains, onnx.checker full check, {report.reference.sets} test "
                                  "vector set(s) reproduced by onnx.reference" if report.portable else report.reason)
        return report.runtime, report.portable

    def _require_portable(self, builds: Mapping[str, Build]) -> None:
        """Every version holds one build any ONNX runtime can run: standard domains, checker, reference."""
        if any(b.portable for b in builds.values()):
            return
        why = "; ".join(f"{n}: {self.portability.get(n) or b.runtime or b.format}" for n, b in builds.items())
        raise StageFailed(f"no build of this version is portable ONNX ({why}); every version ships one build in "
                          "standard ONNX domains that onnx.checker and ONNX's reference evaluator accept",
                          hint="add a build of the plain export (e.g. `portable: {from: export}`), or "
                               "optimize at `level: basic` (extended adds onnxruntime-only fused ops)")

    def _stamped_copy(self, name: str, source: Path, src_info: Any, props: Mapping[str, str]) -> Path:
        """A copy of `source` (and its external data) in the work folder, stamped with `props`."""
        from zoo_stages.lib.provenance import stamp_file

        folder = self.work / "stamped" / name
        if folder.exists():
            shutil.rmtree(folder)
        copy = folder / source.name
        atomic_copy(source, copy, fsync=False)
        for location in src_info.external_data:
            atomic_copy(source.parent / location, folder / location, fsync=False)
        return stamp_file(copy, props)

    def _check_digest(self, name: str, spec: BuildSpec, vname: str, source: Path) -> None:
        """verify records the digest of each model it checked: the shipped one must be that model."""
        from zoo_stages.lib.onnx_io import model_digest

        recorded = (self.verify.entry(vname) or {}).get("model_digest")
        if isinstance(recorded, str) and recorded != model_digest(source):
            raise GateFailed(f"build {name}: the model of stage {spec.source!r} is not the model verify checked "
                             f"as {vname!r}, so verify's metrics and vectors do not apply to it",
                             hint=f"set builds.{name}.verified_as to the verify build of stage {spec.source!r}, "
                                  "or re-run verify")

    def _source_model(self, name: str, spec: BuildSpec) -> Path:
        try:
            up: Upstream = self.inputs.stage(spec.source)
        except InvalidInput:
            have = ", ".join(up.stage_id for up in self.inputs if "model" in up.outputs) or "none"
            raise InvalidInput(f"builds.{name}.from: deploy does not need a stage called {spec.source!r}",
                               hint=f"add {spec.source!r} to deploy's `needs:` (stages with a model: {have})") from None
        model = up.outputs.get("model")
        if model is None:
            raise InvalidInput(f"builds.{name}.from: stage {spec.source!r} ({up.kind}) has no `model` output",
                               hint="name a stage that produces a model (export, optimize, quantize)")
        model = Path(model)
        if model.is_dir():
            found = sorted(model.glob("*.onnx"))
            if len(found) != 1:
                raise InvalidInput(f"builds.{name}.from: stage {spec.source!r}'s model folder holds "
                                   f"{len(found)} .onnx files; expected one")
            model = found[0]
        return model

    # -- test vectors -------------------------------------------------------------------------

    def _vectors(self, name: str, spec: BuildSpec, vname: str | None, shipped: _Shipped, bdir: Path) -> list[Path]:
        """Copy verify's vectors (unconverted, verified builds) or generate them by running the model
        (an OpenVINO build by OpenVINO, on the inputs of its source)."""
        from zoo_stages.lib import onnx_run, ort_session
        from zoo_stages.lib.model_info import session_ports

        model_file = shipped.model
        if spec.convert == "openvino":
            return self._openvino_vectors(name, vname, shipped, bdir)
        session = ort_session.make_session(model_file)
        ports, out_ports = session_ports(session)
        vdir = self.verify.vector_dir(vname) if (vname and spec.convert is None) else None
        written: list[Path] = []
        if vdir is not None:
            for set_dir in find_sets(vdir):
                for f in vector_files(set_dir):
                    dst = bdir / set_dir.name / f.name
                    atomic_copy(f, dst, fsync=False)
                    written.append(dst)
                if self.config.check_vectors:
                    self._check_vector_set(name, vname, session, ports, out_ports, set_dir, model_file)
            if written:
                return written
        feeds, origin = self.check.inputs_for(name, vname, session)
        feeds = onnx_run.prepare(session, feeds)
        set_dir = write_test_vectors(bdir / "test_data_set_0", {p.name: feeds[p.name] for p in ports},
                                     onnx_run.run(session, feeds, batch_size=BATCH_SIZE))
        written += vector_files(set_dir)
        self.ctx.log.info("deploy: %s test vectors generated from %s", name, origin)
        return written

    def _openvino_vectors(self, name: str, vname: str | None, shipped: _Shipped, bdir: Path) -> list[Path]:
        from zoo_stages.lib import onnx_run, openvino_build, ort_session
        from zoo_stages.lib.model_info import session_ports

        session = ort_session.make_session(shipped.source)  # the source's ports name and type the IR's
        ports, _ = session_ports(session)
        feeds, origin = self.check.inputs_for(name, vname, session)
        feeds = onnx_run.prepare(session, feeds)
        compiled = shipped.compiled or openvino_build.compile_model(shipped.model, threads=1)
        set_dir = write_test_vectors(bdir / "test_data_set_0", {p.name: feeds[p.name] for p in ports},
                                     openvino_build.run(compiled, feeds, batch_size=BATCH_SIZE))
        self.ctx.log.info("deploy: %s test vectors generated by OpenVINO from %s", name, origin)
        return vector_files(set_dir)

    def _check_vector_set(self, name: str, vname: str, session: Any, ports: list, out_ports: list,
                          set_dir: Path, model_file: Path) -> None:
        from zoo_stages.lib import equivalence, onnx_run
        from zoo_stages.lib import parity as paritylib

        inputs = read_tensors(set_dir, "input")
        expected = read_tensors(set_dir, "output")
        if len(inputs) != len(ports) or len(expected) != len(out_ports):
            raise GateFailed(f"build {name}: verify's test vectors of {vname!r} have {len(inputs)} inputs and "
                             f"{len(expected)} outputs; the model has {len(ports)} and {len(out_ports)}",
                             hint=f"set builds.{name}.verified_as to the verify build that checked this model")
        got = onnx_run.run(session, {p.name: a for p, a in zip(ports, inputs)}, where="verify's test vectors")
        atol, rtol = VECTOR_CHECK_TOLERANCE
        reference = {p.name: a for p, a in zip(out_ports, expected)}
        parity = paritylib.compare(reference, got, tolerance=paritylib.Tolerance(atol=atol, rtol=rtol))
        if not parity.passed and equivalence.is_quantized(model_file) \
                and equivalence.judge_outputs(reference, got, quantized=True)[0]:
            return  # int8 kernels of another platform class computed verify's vectors
        parity.require(f"build {name}: the model from stage {self.config.builds[name].source!r} does not "
                       f"reproduce verify's test vectors of {vname!r} ({set_dir.name})",
                       hint=f"set builds.{name}.verified_as to the verify build that checked this model")

    # -- manifest parts -----------------------------------------------------------------------

    def _lineage(self) -> Lineage:
        recipe = self.ctx.recipe
        stages = {up.stage_id: up.record for up in sorted(self.inputs, key=lambda u: u.stage_id) if up.record}
        # the tools every ancestor used (their lock records) and deploy's own: all in deploy's key
        tools = {dist: version for record in self.ctx.lineage.values()
                 for dist, version in (record.get("tools") or {}).items()}
        for dist in Deploy().tools_used(self.config, None):
            with contextlib.suppress(metadata.PackageNotFoundError):
                tools[dist] = metadata.version(dist)
        tools = dict(sorted(tools.items()))
        sources: dict[str, str] = {}
        if self.data_spec:
            try:
                from zoo.engine.hashing import digest_json
                from zoo_stages.lib.datasets import split_info

                sources["data"] = digest_json(split_info(self.data_spec, recipe.dir))
            except ZooError as e:  # the card and manifest still say which data section was used
                self.ctx.log.warning("deploy: could not fingerprint the dataset: %s", e)
        for record in self._all_attribution():  # third-party files (pretrained weights...) the builds derive from
            if record.get("sha256"):
                sources[record.get("source", "source")] = f"sha256:{record['sha256']}"
        return Lineage(recipe={"name": recipe.name, "version": recipe.version, "digest": recipe.digest},
                       stages=stages, sources=sources, tools=tools)
