"""What one build ships (`Shipped`), before it is described in the manifest, and the copies of
an upstream model a build starts from."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from zoo.files import atomic_copy

# what a build made for CUDA needs to be run where it is meant to run
CUDA_PROVIDER = "CUDAExecutionProvider"
CPU_PROVIDER = "CPUExecutionProvider"
# a build run by the runtime it is made for: named inputs in, named outputs out (None: not run there)
RunCandidate = Callable[[dict[str, Any]], dict[str, Any]]


@dataclass
class Shipped:
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


def copy_model(source: Path, src_info: Any, bdir: Path) -> tuple[Path, list[Path]]:
    """Copy an upstream ONNX model and its external data into a build folder as ``model.onnx``
    (the data files keep their names, which the model refers to); (model, data files)."""
    model = bdir / "model.onnx"
    atomic_copy(source, model, fsync=False)
    extra = []
    for location in src_info.external_data:
        atomic_copy(source.parent / location, bdir / location, fsync=False)
        extra.append(bdir / location)
    return model, extra


def stamped_copy(work: Path, name: str, source: Path, src_info: Any, props: Mapping[str, str]) -> Path:
    """A copy of `source` (and its external data) in the work folder, stamped with `props`."""
    from zoo_stages.lib.release.provenance import stamp_file

    folder = work / "stamped" / name
    if folder.exists():
        shutil.rmtree(folder)
    copy = folder / source.name
    atomic_copy(source, copy, fsync=False)
    for location in src_info.external_data:
        atomic_copy(source.parent / location, folder / location, fsync=False)
    return stamp_file(copy, props)
