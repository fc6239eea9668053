"""A converted build (`convert:` fp16, ort, openvino, tensorrt): made by its runtime's module,
then compared with its source model (on the device where it ran, else on the CPU)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from zoo_stages.deploy import fp16, openvino, ort_format, tensorrt
from zoo_stages.deploy.config import BuildSpec
from zoo_stages.deploy.shipped import RunCandidate, Shipped, stamped_copy
from zoo_stages.lib.quality.conversion_check import BATCH_SIZE

if TYPE_CHECKING:
    from zoo_stages.deploy.release import Release


def converted(job: Release, name: str, spec: BuildSpec, vname: str | None, source: Path, src_info: Any,
              bdir: Path, props: Mapping[str, str]) -> Shipped:
    """A conversion of an upstream model, parity-checked against it (GateFailed beyond tolerance)."""
    atol, rtol = spec.tolerance()
    run_candidate = None
    if spec.convert == "fp16":
        shipped, run_candidate = fp16.build(job, name, spec, source, bdir, props)
    elif spec.convert == "tensorrt":
        shipped, run_candidate = tensorrt.build(job, name, spec, source, src_info, bdir, props)
    elif spec.convert == "openvino":
        shipped, run_candidate = openvino.build(job, name, spec, stamped_copy(job.work, name, source, src_info, props),
                                                src_info, bdir)
    else:
        shipped = ort_format.build(job, name, spec, source, src_info, bdir, props)
    parity, accuracy, feeds = job.check.parity(name, vname, source, shipped.model, atol=atol, rtol=rtol,
                                               run_candidate=run_candidate)
    judged = None
    if not parity.passed and spec.convert in ("openvino", "tensorrt") and shipped.precision == "int8":
        # two int8 runtimes round differently: judged by the quantized bar, as across platform classes
        judged = int8_equivalent(job, name, source, feeds, run_candidate)
        shipped.conversion["parity_judged_by"] = judged
    if judged is None:
        parity.require(f"build {name} ({spec.convert} conversion of {spec.source}): outputs differ from the source "
                       f"model beyond tolerance (max |diff| {parity.max_abs:.3g})",
                       hint="raise `atol`/`rtol` for this build if the difference is acceptable, "
                            "or keep the model in its source precision")
    if spec.convert == "ort" and shipped.conversion["optimization_style"] == "Runtime":
        shipped.conversion["runtime_optimizations_replay"] = job.check.replay_status(
            name, source, shipped.model, feeds, atol=atol, rtol=rtol)
    figures = parity.metrics()
    if shipped.parity_on:
        shipped.conversion["parity_on"] = shipped.parity_on
    shipped.metrics = {**figures, **accuracy}
    shipped.conversion.update(figures)
    if vname is not None:
        shipped.conversion["source_verified_as"] = vname
    return shipped


def int8_equivalent(job: Release, name: str, source: Path, feeds: dict[str, Any],
                    run_candidate: RunCandidate | None) -> str | None:
    """Whether an int8 build run by another runtime is equivalent to its QDQ source by the
    quantized bar (zoo_stages.lib.quality.equivalence); the verdict line, or None when it is not."""
    from zoo_stages.lib.quality import equivalence
    from zoo_stages.lib.runtimes import onnx_run, ort_session

    if run_candidate is None:
        return None
    ref = onnx_run.run(ort_session.make_session(source), feeds, batch_size=BATCH_SIZE)
    ok, line = equivalence.judge_outputs(ref, run_candidate(feeds), quantized=True)
    job.ctx.log.info("deploy: %s against its int8 source: %s", name, line)
    return line if ok else None
