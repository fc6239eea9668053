"""One run of deploy (`Release`): the state the builds of a release share, each build staged under
``builds/<name>/`` by its module (as is, or converted), then the card and, last, the manifest."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zoo.errors import InvalidInput
from zoo.files import atomic_write
from zoo.manifest import MANIFEST_FILE, Build, Manifest, file_ref
from zoo.stage import Inputs, StageContext, Upstream
from zoo_stages.deploy import checks, genai_files, manifest_parts, provenance_files
from zoo_stages.deploy.as_is import as_is
from zoo_stages.deploy.card import CARD_FILE
from zoo_stages.deploy.config import BuildSpec, DeployConfig
from zoo_stages.deploy.conversion import converted
from zoo_stages.deploy.vectors import vectors
from zoo_stages.lib.quality.conversion_check import ConversionCheck
from zoo_stages.lib.release.provenance import LOCK_FILE, STATEMENT_FILE
from zoo_stages.lib.release.release_folder import check_complete
from zoo_stages.lib.quality.verify_report import VerifyOutputs, read_verify_outputs


class Release:
    """One run of deploy: the state shared by the builds of a release."""

    def __init__(self, inputs: Inputs, config: DeployConfig, context: StageContext, release: Path, work: Path,
                 publisher: tuple[str, str]):
        self.inputs = inputs
        self.config = config
        self.ctx = context
        self.release = release
        self.work = work
        self.publisher = publisher  # (kind, kind version) that the provenance statement names
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
        checks.require_portable(builds, self.portability)
        recipe = self.ctx.recipe
        extra: dict[str, Any] = {"deploy": {"verified_as": verified, "portability": dict(self.portability)}}
        if conversions:
            extra["deploy"]["conversions"] = conversions
        verification = self.verify.summary()
        if verification:
            extra["deploy"]["verification"] = verification
        lineage = manifest_parts.lineage(self)
        preprocessing, data_files = manifest_parts.preprocessing(self)
        files, stmt = provenance_files.write(self, builds, lineage)
        files = data_files + files
        extra["provenance"] = {"statement": STATEMENT_FILE, "lock": LOCK_FILE,
                               "license": stmt["predicate"]["buildDefinition"]["internalParameters"]["license"],
                               "attribution": provenance_files.all_attribution(self)}
        manifest = Manifest(
            name=recipe.name, version=recipe.version, description=recipe.description, license=recipe.license,
            task=self.task, preprocessing=preprocessing,
            builds=builds, lineage=lineage, files=files, extra=extra,
        )
        from zoo_stages.lib.release.modelcard import render_card
        from zoo_stages.lib.release.provenance import card_section

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

    def _source_model(self, name: str, spec: BuildSpec) -> Path:
        """The ONNX file of the upstream stage a build names (`from:`): its `model` output."""
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

    def _one(self, name: str, spec: BuildSpec) -> tuple[Build, dict[str, Any] | None, str | None]:
        """Stage one build under builds/<name>/; returns its Build entry, conversion record, verified name."""
        from zoo_stages.lib.onnx.model_info import describe, quantization_record

        source = self._source_model(name, spec)
        bdir = self.release / "builds" / name
        bdir.mkdir(parents=True, exist_ok=True)
        vname = self._verified_name(name, spec)
        src_info = describe(source)
        props = provenance_files.props(self, name, spec, source)
        if spec.convert is None:
            shipped = as_is(self, name, spec, vname, source, src_info, bdir, props)
        else:
            shipped = converted(self, name, spec, vname, source, src_info, bdir, props)
        info = describe(shipped.model) if spec.convert != "openvino" else None
        sidecars: list[Path] = []
        if info is not None and info.format == "onnx" and genai_files.is_generative(info):
            # genai_config.json and the tokenizer beside the model: onnxruntime_genai loads the build folder
            sidecars = genai_files.ship(self, name, info, bdir)
            shipped.extra_files.extend(sidecars)
        if info is not None and info.format == "onnx" and (spec.convert is not None or vname is None):
            checks.check_onnx(self, name, shipped.model)  # bytes verify's checker gate did not see
        written = vectors(self, name, spec, vname, shipped, bdir)
        runtime, portable = checks.runtime(self, name, shipped, written)
        if shipped.measured:
            self.measured[name] = shipped.measured
        metrics = dict(shipped.metrics)
        # what a runtime loads: the model and its external data (not the operator list for minimal builds)
        metrics["size_bytes"] = shipped.model.stat().st_size + sum(
            p.stat().st_size for p in shipped.extra_files
            if not p.name.endswith(".required_operators.config") and p not in sidecars)
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
            test_vectors=[file_ref(self.release, p) for p in written],
            extra_files=[file_ref(self.release, p) for p in sorted(shipped.extra_files)],
            quantization=quantization_record(source) if spec.convert is None else None,
        )
        _check_name(self.ctx.log, name, build.precision)
        return build, shipped.conversion, vname


_PRECISION_WORDS = ("fp32", "fp16", "bf16", "int8", "int4")


def _check_name(log, name: str, precision: str) -> None:
    """A warning when a build's name says one precision and its model is another (`cpu-int8` holding int4)."""
    import re

    said = [w for w in re.split(r"[-_.]", name) if w in _PRECISION_WORDS]
    if said and precision not in said:
        log.warning("deploy: build %s is named for %s but its model is %s; rename it (e.g. cpu-%s) or set "
                    "builds.%s.precision", name, "/".join(said), precision, precision, name)
