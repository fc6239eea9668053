"""Choosing the best build of a version for this host (used by `zoo pull` without --build).

Only builds this host can run are considered: a build that needs a GPU (``requires: {device:
cuda}``, or no CPUExecutionProvider in its ``execution_providers``) only where onnxruntime
offers ``CUDAExecutionProvider``. Among them, in order:

1. builds that failed verification (metrics ``passed: false`` or ``status: failed``) come last;
2. builds verify measured (``latency_p50_ms``) come before builds it never ran, so an
   unverified build (a float16 build for CUDA made on a machine without a GPU) is never chosen
   over one that was run;
3. on a CUDA host, CUDA builds first;
4. the lowest measured ``latency_p50_ms``: a quantized build that verify measured slower than
   its float32 build is not the default (the name decides nothing while figures exist);
5. then ``cpu-int8``, ``cpu-fp32``, any other name (only builds without figures get this far).

Checking for CUDA imports onnxruntime; that only happens here, at pull time.

Loading a version back into torch (`float_build`) wants its float32 ONNX build instead.
"""

from __future__ import annotations

from zoo.errors import NotFound
from zoo.registry.index import build_passed
from zoo.registry.manifest import Build, Manifest

CPU_PREFERENCE = ("cpu-int8", "cpu-fp32")


def available_providers() -> list[str]:
    """Execution providers onnxruntime offers on this host ([] if onnxruntime is missing)."""
    try:
        import onnxruntime
    except ImportError:
        return []
    return list(onnxruntime.get_available_providers())


def needs_gpu(build: Build) -> bool:
    device = build.requires.get("device", "").lower()
    if device and device != "cpu":
        return True
    return "CPUExecutionProvider" not in build.execution_providers


def is_cuda(build: Build) -> bool:
    return "CUDAExecutionProvider" in build.execution_providers or build.requires.get("device", "").lower() == "cuda"


def _latency(build: Build) -> float:
    v = build.metrics.get("latency_p50_ms")
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else float("inf")


def rank_builds(manifest: Manifest, providers: list[str] | None = None) -> list[Build]:
    """The builds this host can run, best first (see the module docstring for the rule)."""
    providers = available_providers() if providers is None else providers
    cuda = "CUDAExecutionProvider" in providers
    usable = [b for b in manifest.builds.values() if (cuda and is_cuda(b)) or not needs_gpu(b)]

    def key(b: Build):
        latency = _latency(b)
        preference = CPU_PREFERENCE.index(b.name) if b.name in CPU_PREFERENCE else len(CPU_PREFERENCE)
        return (not build_passed(b.metrics), latency == float("inf"), not (cuda and is_cuda(b)), latency,
                preference, b.name)

    return sorted(usable, key=key)


def best_build(manifest: Manifest, providers: list[str] | None = None) -> Build:
    ranked = rank_builds(manifest, providers)
    if not ranked:
        raise NotFound(f"{manifest.ref} has no build this host can run (builds: {', '.join(sorted(manifest.builds))})",
                       hint="pick one with --build, or install an onnxruntime with the needed execution provider")
    return ranked[0]


def float_build(manifest: Manifest) -> Build:
    """The build to load back into a framework when none is named (`zoo.load_torch`, a recipe's
    ``model.from``): the version's float32 ONNX build (``cpu-fp32`` if several are)."""
    fp32 = sorted((b for b in manifest.builds.values() if b.format == "onnx" and b.precision == "fp32"),
                  key=lambda b: (b.name != "cpu-fp32", b.name))
    if not fp32:
        raise NotFound(f"{manifest.ref} has no float32 ONNX build (builds: {', '.join(sorted(manifest.builds))})",
                       hint="name the build to load")
    return fp32[0]
