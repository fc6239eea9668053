"""The best-build rule used by `zoo pull` without --build."""

from __future__ import annotations

import pytest

from zoo.errors import NotFound
from zoo.registry.manifest import Build, FileRef, Manifest
from zoo.registry.select import HostRuntimes, best_build, rank_builds

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
    with pytest.raises(NotFound, match="no verified build this host can run") as e:
        best_build(_manifest(cuda_fp16=ALL["cuda_fp16"]), CPU)
    assert "cuda-fp16: needs a CUDA GPU" in e.value.message


def test_a_build_marked_unverified_is_never_the_default_even_where_it_could_run():
    reason = "not run on a CUDA GPU: the build host had none"
    m = _manifest(cpu_fp32={"verified": True, "metrics": {"latency_p50_ms": 5.0}},
                  cuda_fp16={**ALL["cuda_fp16"], "verified": False, "unverified_reason": reason,
                             "metrics": {"latency_p50_ms": 0.5}})
    assert [b.name for b in rank_builds(m, CUDA)] == ["cpu-fp32"]
    with pytest.raises(NotFound) as e:
        best_build(_manifest(cuda_fp16=m.builds["cuda-fp16"].model_dump(exclude={"name", "file"})), CUDA)
    assert f"cuda-fp16: not verified ({reason})" in e.value.message and "--build" in e.value.hint


ORT_ONLY = HostRuntimes({"onnxruntime": "1.32.0"}, tuple(CPU))
WITH_OPENVINO = HostRuntimes({"onnxruntime": "1.32.0", "openvino": "2026.4.1"}, tuple(CPU))


def test_a_build_for_a_runtime_that_is_not_installed_is_left_out():
    m = _manifest(cpu_fp32={"runtime": "onnx", "metrics": {"latency_p50_ms": 5.0}},
                  openvino_fp32={"format": "openvino", "runtime": "openvino>=2026.4", "execution_providers": ["CPU"],
                                 "requires": {"device": "cpu"}, "metrics": {"latency_p50_ms": 2.0}})
    assert [b.name for b in rank_builds(m, host=ORT_ONLY)] == ["cpu-fp32"]
    assert [b.name for b in rank_builds(m, host=WITH_OPENVINO)] == ["openvino-fp32", "cpu-fp32"]
    old = HostRuntimes({"onnxruntime": "1.32.0", "openvino": "2025.1.0"}, tuple(CPU))
    assert [b.name for b in rank_builds(m, host=old)] == ["cpu-fp32"]  # below the version the build asks for
    with pytest.raises(NotFound) as e:
        best_build(_manifest(openvino_fp32=m.builds["openvino-fp32"].model_dump(exclude={"name", "file"})), host=old)
    assert "needs openvino>=2026.4; openvino 2025.1.0 is installed" in e.value.message


def test_onnxruntime_minimum_versions_are_compared_as_numbers():
    m = _manifest(mobile={"format": "ort", "runtime": "onnxruntime>=1.32"})
    assert rank_builds(m, host=HostRuntimes({"onnxruntime": "1.9.0"}, tuple(CPU))) == []
    assert [b.name for b in rank_builds(m, host=HostRuntimes({"onnxruntime": "1.32.1"}, tuple(CPU)))] == ["mobile"]
    # a schema-1 build (no runtime recorded) is onnxruntime's
    assert [b.name for b in rank_builds(_manifest(cpu_fp32={}), host=ORT_ONLY)] == ["cpu-fp32"]


def test_default_providers_come_from_onnxruntime():
    import onnxruntime

    m = _manifest(**ALL)
    expected = "cuda-fp16" if "CUDAExecutionProvider" in onnxruntime.get_available_providers() else "cpu-int8"
    assert best_build(m).name == expected


def test_latency_measured_on_another_platform_class_counts_as_unknown():
    """An int8 build timed fast on an AVX-512 VNNI host says nothing about an AVX2 host's kernels."""
    vnni = {"platform": "x86-64-avx512-vnni", "runtime": "onnxruntime"}
    m = _manifest(cpu_fp32={"metrics": {"latency_p50_ms": 5.0}, "measured_on": vnni},
                  cpu_int8={"metrics": {"latency_p50_ms": 1.0}, "measured_on": vnni},
                  mobile={"metrics": {"latency_p50_ms": 4.0}})  # schema 1: no measured_on, counts anywhere
    here = HostRuntimes({"onnxruntime": "1.32.0"}, tuple(CPU), "x86-64-avx512-vnni")
    assert [b.name for b in rank_builds(m, host=here)] == ["cpu-int8", "mobile", "cpu-fp32"]
    avx2 = HostRuntimes({"onnxruntime": "1.32.0"}, tuple(CPU), "x86-64-avx2")
    assert [b.name for b in rank_builds(m, host=avx2)] == ["mobile", "cpu-int8", "cpu-fp32"]
    # a CUDA build's figure holds on any CUDA host, whatever its CPU
    m = _manifest(cuda_fp16={**ALL["cuda_fp16"], "metrics": {"latency_p50_ms": 0.5}, "measured_on": vnni},
                  cpu_fp32={"metrics": {"latency_p50_ms": 5.0}})
    cuda_avx2 = HostRuntimes({"onnxruntime": "1.32.0"}, tuple(CUDA), "x86-64-avx2")
    assert best_build(m, host=cuda_avx2).name == "cuda-fp16"


TRT = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]


def test_a_tensorrt_build_is_picked_only_where_onnxruntime_offers_tensorrt():
    """A TensorRT build verified on a GPU host (its latency measured there) is the best only where
    onnxruntime offers its provider: on a CUDA host without TensorRT the CUDA build is, and the
    reason it was left out names the provider."""
    gpu = {"platform": "x86-64-avx512-vnni", "execution_provider": "TensorrtExecutionProvider"}
    m = _manifest(cpu_fp32={"metrics": {"latency_p50_ms": 5.0}},
                  cuda_fp16={"execution_providers": ["CUDAExecutionProvider", "CPUExecutionProvider"],
                             "requires": {"device": "cuda"}, "metrics": {"latency_p50_ms": 0.9},
                             "measured_on": {**gpu, "execution_provider": "CUDAExecutionProvider"}},
                  tensorrt_fp16={"execution_providers": TRT, "requires": {"device": "cuda"}, "verified": True,
                                 "metrics": {"latency_p50_ms": 0.3}, "measured_on": gpu,
                                 "provider_options": {"TensorrtExecutionProvider": {"trt_fp16_enable": "True"}}})
    assert best_build(m, TRT).name == "tensorrt-fp16"
    assert best_build(m, CUDA).name == "cuda-fp16"
    assert best_build(m, CPU).name == "cpu-fp32"
    only_trt = Manifest(name="m", version="1.0.0", builds={"tensorrt-fp16": m.builds["tensorrt-fp16"]})
    with pytest.raises(NotFound) as e:
        best_build(only_trt, CUDA)
    assert "made for onnxruntime's TensorrtExecutionProvider, which onnxruntime does not offer here" in e.value.message
