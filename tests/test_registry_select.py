"""The best-build rule used by `zoo pull` without --build."""

from __future__ import annotations

import pytest

from zoo.errors import NotFound
from zoo.registry.manifest import Build, FileRef, Manifest
from zoo.registry.select import best_build, rank_builds

CPU = ["CPUExecutionProvider"]
CUDA = ["CUDAExecutionProvider", "CPUExecutionProvider"]


def _manifest(**builds: dict) -> Manifest:
    out = {}
    for i, (name, extra) in enumerate(builds.items()):
        name = name.replace("_", "-")
        out[name] = Build(name=name, file=FileRef(path=f"{name}/model.onnx", sha256=f"{i:064x}", size=1), **extra)
    return Manifest(name="m", version="1.0.0", builds=out)


ALL = dict(cpu_fp32={}, cpu_int8={"precision": "int8"},
           cuda_fp16={"execution_providers": ["CUDAExecutionProvider"], "requires": {"device": "cuda"}})


def test_cuda_build_first_only_when_onnxruntime_offers_cuda():
    m = _manifest(**ALL)
    assert best_build(m, CUDA).name == "cuda-fp16"
    assert best_build(m, CPU).name == "cpu-int8"
    assert [b.name for b in rank_builds(m, CPU)] == ["cpu-int8", "cpu-fp32"]  # the GPU build is not runnable here


def test_failed_int8_falls_back_to_fp32():
    m = _manifest(cpu_fp32={}, cpu_int8={"metrics": {"passed": False}})
    assert best_build(m, CPU).name == "cpu-fp32"
    m = _manifest(cpu_fp32={"metrics": {"status": "failed"}}, cpu_int8={"metrics": {"status": "failed"}})
    assert best_build(m, CPU).name == "cpu-int8"  # nothing passed: the preference order still holds


def test_other_cpu_builds_by_latency():
    m = _manifest(mobile_a={"metrics": {"latency_p50_ms": 9.0}}, mobile_b={"metrics": {"latency_p50_ms": 3.0}})
    assert best_build(m, CPU).name == "mobile-b"
    # a build verify measured comes before one it never ran, whatever their names
    assert best_build(_manifest(cpu_fp32={}, mobile_b={"metrics": {"latency_p50_ms": 0.1}}), CPU).name == "mobile-b"


def test_an_int8_build_measured_slower_than_fp32_is_not_the_default():
    """As lenet-digits' was: verify measured its int8 build at speedup 0.70."""
    m = _manifest(cpu_fp32={"metrics": {"latency_p50_ms": 0.07}},
                  cpu_int8={"precision": "int8", "metrics": {"latency_p50_ms": 0.10, "speedup": 0.70}})
    assert [b.name for b in rank_builds(m, CPU)] == ["cpu-fp32", "cpu-int8"]
    m.builds["cpu-int8"].metrics["latency_p50_ms"] = 0.02
    assert best_build(m, CPU).name == "cpu-int8"


def test_an_unmeasured_cuda_build_is_not_chosen_over_measured_ones_on_a_gpu_host():
    """A float16 build for CUDA made where there was no GPU has no latency: it was never run on its
    device, so a GPU host still gets a build that was."""
    m = _manifest(cpu_fp32={"metrics": {"latency_p50_ms": 5.0}}, cpu_int8={"metrics": {"latency_p50_ms": 2.0}},
                  cuda_fp16=ALL["cuda_fp16"])
    assert [b.name for b in rank_builds(m, CUDA)] == ["cpu-int8", "cpu-fp32", "cuda-fp16"]
    m.builds["cuda-fp16"].metrics["latency_p50_ms"] = 9.0  # measured on a GPU: first on a GPU host
    assert best_build(m, CUDA).name == "cuda-fp16"


def test_fastest_cuda_build_wins_on_a_gpu_host():
    m = _manifest(cuda_fp32={"execution_providers": CUDA, "metrics": {"latency_p50_ms": 2.0}},
                  cuda_fp16={"execution_providers": CUDA, "metrics": {"latency_p50_ms": 1.0}}, cpu_int8={})
    assert best_build(m, CUDA).name == "cuda-fp16"


def test_no_runnable_build_is_not_found():
    with pytest.raises(NotFound, match="no build this host can run"):
        best_build(_manifest(cuda_fp16=ALL["cuda_fp16"]), CPU)


def test_default_providers_come_from_onnxruntime():
    import onnxruntime

    m = _manifest(**ALL)
    expected = "cuda-fp16" if "CUDAExecutionProvider" in onnxruntime.get_available_providers() else "cpu-int8"
    assert best_build(m).name == expected
