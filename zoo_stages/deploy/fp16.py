"""`convert: fp16` builds: float16 weights and compute with float32 I/O, for CUDA; run and timed
on CUDA where onnxruntime offers it here, else published unverified with the reason."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

from zoo_stages.deploy.config import BuildSpec
from zoo_stages.deploy.measured import timings
from zoo_stages.deploy.shipped import CPU_PROVIDER, CUDA_PROVIDER, RunCandidate, Shipped
from zoo_stages.lib.quality.conversion_check import BATCH_SIZE

if TYPE_CHECKING:
    from zoo_stages.deploy.release import Release


def build(job: Release, name: str, spec: BuildSpec, source: Path, bdir: Path,
          props: Mapping[str, str]) -> tuple[Shipped, RunCandidate | None]:
    """The float16 conversion of `source` (stamped with `props`) and, where CUDA is here, its run there."""
    from zoo_stages.lib.runtimes import convert as cv
    from zoo_stages.lib.release.provenance import stamp_file

    model = stamp_file(cv.to_fp16(source, bdir / "model.onnx", op_block_list=spec.op_block_list), props)
    sidecar = bdir / "model.onnx.data"  # only for models above protobuf's 2 GiB limit
    shipped = Shipped(model=model, extra_files=[sidecar] if sidecar.exists() else [], precision="fp16",
                      execution_providers=[CUDA_PROVIDER, CPU_PROVIDER], requires={"device": "cuda"})
    shipped.conversion = {"kind": "fp16", "from": spec.source, "keep_io_types": True,
                          "files": [p.name for p in [model, *shipped.extra_files]]}
    if spec.op_block_list:
        shipped.conversion["op_block_list"] = sorted(spec.op_block_list)
    return shipped, on_cuda(job, name, shipped)


def on_cuda(job: Release, name: str, shipped: Shipped) -> RunCandidate | None:
    """Where onnxruntime offers CUDA here: run the float16 build on it (its parity is then checked
    on the GPU) and time it; elsewhere mark it unverified and say why (None: parity on the CPU)."""
    import onnxruntime as ort

    if CUDA_PROVIDER not in ort.get_available_providers():
        shipped.verified = False
        shipped.unverified_reason = ("not run on a CUDA GPU: the host that built it had none (its outputs were "
                                     "checked against its source with onnxruntime on the CPU)")
        return None
    from zoo_stages.lib.runtimes import onnx_run, ort_session
    from zoo_stages.lib.runtimes.host_info import gpu_name, host_info, measured_on

    session = ort_session.make_session(shipped.model, providers=[CUDA_PROVIDER])
    shipped.parity_on = f"{CUDA_PROVIDER} ({gpu_name()})"
    feeds, _ = job.check.inputs_for(name, None, session)
    shipped.measured = {"metrics": timings(job, name, session, onnx_run.prepare(session, feeds)),
                        "measured_on": measured_on(host_info(), runtime="onnxruntime", execution_provider=CUDA_PROVIDER,
                                                   runtime_version=metadata.version("onnxruntime"),
                                                   device=gpu_name())}
    return lambda f: onnx_run.run(session, f, batch_size=BATCH_SIZE)
