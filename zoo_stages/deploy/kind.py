"""The `deploy` kind's class: its contract with the engine (key, outputs, report, the release it
declares and publishes, the checks `zoo release` asks of it); the run itself is `Release`."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Callable, ClassVar, Mapping, Sequence

from zoo.manifest import MANIFEST_FILE, Manifest, read_manifest
from zoo.stage import (PUBLISHED, Column, Effect, Inputs, KeyContext, KindConfig, ReportTable, StageContext, StageKind,
                       published_manifest)
from zoo_stages.deploy.card import card_provenance, publication
from zoo_stages.deploy.config import DeployConfig
from zoo_stages.deploy.release import Release
from zoo_stages.lib.quality.numeric_outputs import NumericOutputs
from zoo_stages.lib.release.provenance import LOCK_FILE, STATEMENT_FILE
from zoo_stages.lib.quality.verify_report import read_verify_outputs


class Deploy(NumericOutputs, StageKind):
    """Package upstream models as device builds, write the model card and manifest, publish."""

    name: ClassVar[str] = "deploy"
    # 2: provenance (stamped builds, zoo.lock, in-toto statement); 3: reads only the recipe fields it
    # declares (the recipe's `task:` when there is no model section), zoo.lock records their values;
    # 4: publishing is an effect (context.effects), no longer a `published` metric; 5: one session builder
    # (deterministic compute, a model onnxruntime cannot load is InvalidInput), fixed-batch tails padded,
    # parity by output name with exact integer outputs and per-sample cosine (zoo_stages.lib.quality.parity);
    # 6: any model: held-out data bound to every input by name, the task's metrics (zoo_stages.lib.quality.tasks),
    # the manifest's `preprocessing:` and a text model's tokenizer.json; 7: zoo.lock in the lockfile's
    # schema 3 (records by platform class, the release's under `unknown`); 8: a quantized build's
    # vectors from verify on another platform class pass by the quantized bar; equivalence across
    # platform classes by model outputs (zoo_stages.lib.quality.equivalence); 9: builds say their runtime, whether
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

    def stage_references(self, config: DeployConfig) -> dict[tuple[str | int, ...], str]:
        """Each build's `from:` is a stage deploy reads (`Release._source_model`)."""
        return {("builds", name, "from"): spec.source for name, spec in config.builds.items()}

    def tools_used(self, config: DeployConfig, ctx: KeyContext) -> tuple[str, ...]:
        """onnx and onnxruntime, and the converter of each `convert:` the builds use."""
        return config.tools()

    def run(self, inputs: Inputs, config: DeployConfig, context: StageContext) -> Mapping[str, Path]:
        release = context.output_path("release")
        if release.exists():
            shutil.rmtree(release)
        release.mkdir(parents=True)
        work = Path(context.work_dir)
        work.mkdir(parents=True, exist_ok=True)

        job = Release(inputs, config, context, release, work, publisher=(self.name, self.version))
        manifest = job.build()
        context.metrics["builds"] = list(manifest.builds)
        context.metrics["release_files"] = len(manifest.all_files()) + 1
        if job.measured:  # deploy's own timings: metrics of its entry, added to the published manifest
            context.metrics["measured"] = job.measured
        return {"release": release}

    def report(self, stage_id: str, metrics: Mapping[str, Any], effects: Sequence[Effect]) -> list[ReportTable]:
        """The builds of the version this run published, read back from the local zoo."""
        return [builds_table(e) for e in effects if e.kind == PUBLISHED]

    def release_output(self, config: DeployConfig) -> str | None:
        """The `release` folder is the version, when deploy publishes it (the engine does)."""
        return "release" if config.publish else None

    def publication(self, release: Path, config: DeployConfig, context: StageContext) -> Path:
        """The release with the timings measured upstream added (`zoo_stages.deploy.card.publication`), as the engine
        publishes it when the local zoo lacks the version: verify's (the metrics of its entry, in
        `context.inputs`) and deploy's own (its entry's `measured`). So a deploy that ran here, was
        taken from a cache or ran on a Dask worker publishes the same manifest and card on the same
        verify result. Without upstream results (a caller outside the engine), the release itself.
        """
        if context.inputs is None:
            return release
        measured = (context.entry_metrics or {}).get("measured")
        return publication(release, read_manifest(release / MANIFEST_FILE),
                            read_verify_outputs(context.inputs, context.log), config,
                            context.shared.get("data") or None, card_provenance(release), Path(context.work_dir),
                            measured if isinstance(measured, Mapping) else None)

    def check_release(self, manifest: Manifest, read: Callable[[str], bytes]) -> list[str]:
        """The provenance statement's subjects are exactly the build files, with their sha256."""
        from zoo_stages.lib.release.provenance import release_problems

        build_files = {f.path: f.sha256 for b in manifest.builds.values() for f in b.all_files()}
        return release_problems(read(STATEMENT_FILE), build_files)


def builds_table(published: Effect) -> ReportTable:
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
