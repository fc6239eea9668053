"""`convert: ort` builds: the ORT format for onnxruntime mobile, converted from a stamped copy
of the source so the build carries its metadata_props."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from zoo_stages.deploy.config import BuildSpec
from zoo_stages.deploy.shipped import Shipped, stamped_copy

if TYPE_CHECKING:
    from zoo_stages.deploy.release import Release


def build(job: Release, name: str, spec: BuildSpec, source: Path, src_info: Any, bdir: Path,
          props: Mapping[str, str]) -> Shipped:
    """The ORT-format build of `source`; its parity is checked on the CPU by the caller."""
    from zoo_stages.lib.runtimes import convert as cv

    style = spec.optimization_style or "Fixed"
    # the ORT format keeps metadata_props: convert a stamped copy so the build carries them
    result = cv.to_ort(stamped_copy(job.work, name, source, src_info, props), bdir, optimization_style=style,
                       work_dir=job.work)
    major, minor = metadata.version("onnxruntime").split(".")[:2]
    shipped = Shipped(model=result.model, extra_files=[result.operators_config],
                      precision=src_info.precision or "fp32",
                      runtime=f"onnxruntime>={major}.{minor}")  # ORT format is not backward-portable
    shipped.conversion = {"kind": "ort", "from": spec.source, "optimization_style": style,
                          "optimization_level": result.optimization_level,
                          "files": [result.model.name, result.operators_config.name]}
    return shipped
