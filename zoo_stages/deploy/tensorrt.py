"""`convert: tensorrt` builds: the source model for onnxruntime's TensorRT provider with the
provider options that make its engine (zoo_stages.lib.runtimes.tensorrt_build); run and timed on TensorRT
where onnxruntime offers it here, else published unverified with the reason."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from zoo.errors import InvalidInput
from zoo_stages.deploy.config import BuildSpec
from zoo_stages.deploy.measured import timings
from zoo_stages.deploy.shipped import CPU_PROVIDER, CUDA_PROVIDER, RunCandidate, Shipped, copy_model
from zoo_stages.lib.quality.conversion_check import BATCH_SIZE

if TYPE_CHECKING:
    from zoo_stages.deploy.release import Release


def build(job: Release, name: str, spec: BuildSpec, source: Path, src_info: Any, bdir: Path,
          props: Mapping[str, str]) -> tuple[Shipped, RunCandidate | None]:
    """A build for onnxruntime's TensorRT provider: the source model (stamped) and the provider
    options that make its engine (zoo_stages.lib.runtimes.tensorrt_build). InvalidInput, before anything
    is written, for a model TensorRT cannot compile as one engine or a precision it cannot have."""
    from zoo_stages.lib.onnx import onnx_io
    from zoo_stages.lib.runtimes import tensorrt_build as trt
    from zoo_stages.lib.release.provenance import stamp_file

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
    model, extra = copy_model(source, src_info, bdir)
    stamp_file(model, props)
    options = trt.provider_options(precision)
    shipped = Shipped(model=model, extra_files=extra, precision=precision,
                      execution_providers=[trt.TENSORRT_PROVIDER, CUDA_PROVIDER, CPU_PROVIDER],
                      provider_options={trt.TENSORRT_PROVIDER: options}, requires={"device": "cuda"})
    shipped.conversion = {"kind": "tensorrt", "from": spec.source, "precision": precision,
                          "provider_options": options, "files": [p.name for p in [model, *extra]]}
    return shipped, on_tensorrt(job, name, shipped, options)


def on_tensorrt(job: Release, name: str, shipped: Shipped, options: dict[str, str]) -> RunCandidate | None:
    """Where onnxruntime offers TensorRT here: build the engine (cached in the work folder), run
    the build on it for parity and time it; elsewhere mark it unverified and say why."""
    from zoo_stages.lib.runtimes import tensorrt_build as trt

    if not trt.available():
        shipped.verified = False
        shipped.unverified_reason = (
            f"not run with TensorRT: the host that built it had no NVIDIA GPU with onnxruntime's "
            f"{trt.TENSORRT_PROVIDER} (its file is the source model, run on the CPU for its test vectors; "
            "the engine is built where it first runs)")
        return None
    from zoo_stages.lib.runtimes import onnx_run
    from zoo_stages.lib.runtimes.host_info import gpu_name, host_info, measured_on

    session = trt.make_session(shipped.model, options, job.work / "tensorrt-engines" / name)
    device = gpu_name()
    feeds, _ = job.check.inputs_for(name, None, session)
    version = metadata.version("onnxruntime")
    engine = trt.tensorrt_version()
    shipped.parity_on = f"{trt.TENSORRT_PROVIDER} ({device})"
    shipped.measured = {"metrics": timings(job, name, session, onnx_run.prepare(session, feeds)),
                        "measured_on": measured_on(host_info(), runtime="onnxruntime",
                                                   execution_provider=trt.TENSORRT_PROVIDER,
                                                   runtime_version=f"{version} (TensorRT {engine})" if engine
                                                   else version, device=device)}
    return lambda f: onnx_run.run(session, f, batch_size=BATCH_SIZE)
