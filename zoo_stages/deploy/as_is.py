"""A build that ships its upstream model unchanged (graph, weights, external data) with verify's
metrics for the build of the same name, once the model is shown to be the one verify checked."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from zoo.errors import GateFailed
from zoo_stages.deploy.config import BuildSpec
from zoo_stages.deploy.shipped import CPU_PROVIDER, Shipped, copy_model

if TYPE_CHECKING:
    from zoo_stages.deploy.release import Release


def as_is(job: Release, name: str, spec: BuildSpec, vname: str | None, source: Path, src_info: Any,
          bdir: Path, props: Mapping[str, str]) -> Shipped:
    """An upstream model shipped as is (graph, weights, external data), with verify's metrics.

    Only the provenance metadata_props are added, after checking that the unstamped source
    is the model verify checked: metadata changes no output, so verify's figures and
    vectors still apply (the vectors are re-run against the stamped file).
    """
    from zoo_stages.lib.release.provenance import stamp_file

    model, extra = copy_model(source, src_info, bdir)
    metrics: dict[str, Any] = {}
    shipped = Shipped(model=model, extra_files=extra, precision=src_info.precision or "fp32")
    if vname is not None:
        check_digest(job, name, spec, vname, source)
        metrics = job.verify.verified_metrics(vname)
        target = (spec.execution_providers or [CPU_PROVIDER])[0]
        device = (spec.requires or {}).get("device", "cpu").lower()
        if target != CPU_PROVIDER or device != "cpu":  # verify runs every build on onnxruntime's CPU provider
            shipped.verified = False
            shipped.unverified_reason = (f"verify ran it with onnxruntime's {CPU_PROVIDER} only; it is made for "
                                         f"{target if target != CPU_PROVIDER else 'device ' + device}")
    else:
        shipped.verified = False
        shipped.unverified_reason = ("no verify stage checked it" if job.verify.builds is None else
                                     f"verify's report has no build {name!r} (set builds.{name}.verified_as)")
        if job.verify.builds is not None:
            job.ctx.log.warning("deploy: build %s was not verified (no build %r in verify's report)", name, name)
    stamp_file(model, props)
    shipped.metrics = metrics
    return shipped


def check_digest(job: Release, name: str, spec: BuildSpec, vname: str, source: Path) -> None:
    """verify records the digest of each model it checked: the shipped one must be that model."""
    from zoo_stages.lib.onnx.onnx_io import model_digest

    recorded = (job.verify.entry(vname) or {}).get("model_digest")
    if isinstance(recorded, str) and recorded != model_digest(source):
        raise GateFailed(f"build {name}: the model of stage {spec.source!r} is not the model verify checked "
                         f"as {vname!r}, so verify's metrics and vectors do not apply to it",
                         hint=f"set builds.{name}.verified_as to the verify build of stage {spec.source!r}, "
                              "or re-run verify")
