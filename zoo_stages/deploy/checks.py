"""Whether each build is valid ONNX (onnx.checker's full check) and portable ONNX (standard
domains, its vectors reproduced by ONNX's reference evaluator), and that a version has one
portable build."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Mapping

from zoo.errors import StageFailed
from zoo.manifest import Build
from zoo_stages.deploy.shipped import Shipped

if TYPE_CHECKING:
    from zoo_stages.deploy.release import Release


def check_onnx(job: Release, name: str, model: Path) -> None:
    """`onnx.checker` (full check) of a build: a build is valid ONNX that any runtime may load,
    not only a graph onnxruntime tolerates. StageFailed naming the build otherwise."""
    from zoo_stages.lib.onnx import onnx_io

    why = onnx_io.checker_error(model, job.work)
    if why is not None:
        raise StageFailed(f"build {name}: {model.name} is not valid ONNX (onnx.checker: {why}); nothing was "
                          "published", hint="drop the build, or change how it is made (its `convert`, "
                                            "`op_block_list` or `from`)") from None


def runtime(job: Release, name: str, shipped: Shipped, vectors: list[Path]) -> tuple[str, bool]:
    """(runtime requirement, portable) of a shipped build: portable ONNX is standard domains
    only, valid under onnx.checker's full check, and its test vectors reproduced by ONNX's
    reference evaluator as by onnxruntime (zoo_stages.lib.onnx.portability). The verdict's reason is
    kept for the manifest (``extra.deploy.portability``)."""
    from zoo_stages.lib.onnx import portability
    from zoo_stages.lib.onnx.reference_run import DEFAULT_TOLERANCE, FP16_TOLERANCE

    if shipped.runtime is not None:  # OpenVINO IR, ORT format: their runtime, never portable ONNX
        job.portability[name] = f"{shipped.runtime} only"
        return shipped.runtime, False
    tolerance = FP16_TOLERANCE if shipped.precision == "fp16" else DEFAULT_TOLERANCE
    report = portability.assess(shipped.model, sorted({v.parent for v in vectors}), scratch=job.work,
                                tolerance=tolerance)
    job.ctx.log.info("deploy: %s %s portable ONNX: %s", name, "is" if report.portable else "is not",
                     report.reason)
    job.portability[name] = (f"standard ONNX domains, onnx.checker full check, {report.reference.sets} test "
                             "vector set(s) reproduced by onnx.reference" if report.portable else report.reason)
    return report.runtime, report.portable


def require_portable(builds: Mapping[str, Build], portability: Mapping[str, str]) -> None:
    """Every version holds one build any ONNX runtime can run: standard domains, checker, reference."""
    if any(b.portable for b in builds.values()):
        return
    why = "; ".join(f"{n}: {portability.get(n) or b.runtime or b.format}" for n, b in builds.items())
    raise StageFailed(f"no build of this version is portable ONNX ({why}); every version ships one build in "
                      "standard ONNX domains that onnx.checker and ONNX's reference evaluator accept",
                      hint="add a build of the plain export (e.g. `portable: {from: export}`), or "
                           "optimize at `level: basic` (extended adds onnxruntime-only fused ops)")
