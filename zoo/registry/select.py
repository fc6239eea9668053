"""Choosing the best build of a version for this host (used by `zoo pull` without --build).

Only builds this host can run are considered:

- its runtime is installed in a version the build allows (``runtime: onnx`` needs onnxruntime or
  OpenVINO; ``onnxruntime>=1.32`` that onnxruntime version; ``openvino>=2026.4`` OpenVINO), a
  manifest older than schema 2 (no ``runtime``) being read as onnxruntime's;
- a build that needs a GPU (``requires: {device: cuda}``, or onnxruntime providers without
  ``CPUExecutionProvider``) only where onnxruntime offers ``CUDAExecutionProvider``;
- a build made for another onnxruntime provider than CPU and CUDA (its first: a TensorRT build's
  ``TensorrtExecutionProvider``) only where onnxruntime offers that provider;
- never a build marked ``verified: false`` (made for a device that was not there to run it: a
  float16 build for CUDA made without a GPU): it is pulled only by name, with --build.

Among them, in order:

1. builds that failed verification (metrics ``passed: false`` or ``status: failed``) come last;
2. builds with a ``latency_p50_ms`` measured on this host's platform class (``measured_on.platform``;
   any, for manifests older than schema 2) come before builds never timed here;
3. on a CUDA host, CUDA builds first;
4. the lowest measured ``latency_p50_ms``: a quantized build that verify measured slower than
   its float32 build is not the default (the name decides nothing while figures exist);
5. then ``cpu-int8``, ``cpu-fp32``, any other name (only builds without figures get this far).

The latency is the publisher's, measured on the host that ran verify or deploy (``measured_on``
says which runtime, provider, CPU and platform class); figures from another platform class (other
CPU kernels: int8 is fast with VNNI, not always without) count as unknown, and nothing is re-timed
here. A CUDA build's figure counts on any CUDA host.
Checking for CUDA imports onnxruntime; that only happens here, at pull time.

Loading a version back into torch (`float_build`) wants its float32 ONNX build instead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from zoo.errors import NotFound
from zoo.registry.index import build_passed
from zoo.registry.manifest import Build, Manifest

CPU_PREFERENCE = ("cpu-int8", "cpu-fp32")
# runtimes a build may name, by the distribution that provides them
RUNTIMES = ("onnxruntime", "openvino")


@dataclass(frozen=True)
class HostRuntimes:
    """What this host can run builds with: installed runtimes (name -> version), onnxruntime's
    providers, and its platform class (zoo.host.platform_class: the CPU kernels timings depend on)."""

    versions: dict[str, str] = field(default_factory=dict)
    providers: tuple[str, ...] = ()
    platform: str = ""

    @property
    def cuda(self) -> bool:
        return "CUDAExecutionProvider" in self.providers


def host_runtimes(providers: list[str] | None = None) -> HostRuntimes:
    """The runtimes installed here and onnxruntime's providers (`providers` overrides the latter)."""
    from importlib.metadata import PackageNotFoundError, version

    versions = {}
    for dist in RUNTIMES:
        try:
            versions[dist] = version(dist)
        except PackageNotFoundError:
            pass
    from zoo.host import platform_class

    return HostRuntimes(versions, tuple(available_providers() if providers is None else providers), platform_class())


def available_providers() -> list[str]:
    """Execution providers onnxruntime offers on this host ([] if onnxruntime is missing)."""
    try:
        import onnxruntime
    except ImportError:
        return []
    return list(onnxruntime.get_available_providers())


def needs_gpu(build: Build) -> bool:
    device = build.requires.get("device", "").lower()
    if device:
        return device != "cpu"
    if build_runtime(build) == "openvino":
        return False  # OpenVINO builds name the runtime's devices, not onnxruntime's providers
    return "CPUExecutionProvider" not in build.execution_providers


def is_cuda(build: Build) -> bool:
    return "CUDAExecutionProvider" in build.execution_providers or build.requires.get("device", "").lower() == "cuda"


def provider_missing(build: Build, host: HostRuntimes) -> str | None:
    """Why `host` lacks the onnxruntime provider `build` is made for (its first), None when it has
    it. CPU and CUDA are judged by `runtime_missing` and `needs_gpu`; OpenVINO builds name devices."""
    if build_runtime(build) == "openvino" or not build.execution_providers:
        return None
    target = build.execution_providers[0]
    if target in ("CPUExecutionProvider", "CUDAExecutionProvider") or target in host.providers:
        return None
    return f"made for onnxruntime's {target}, which onnxruntime does not offer here"


def build_runtime(build: Build) -> str:
    """The runtime's name a build asks for: 'onnx' (any), 'onnxruntime' or 'openvino'."""
    name = re.split(r"[<>=!~ ]", build.runtime.strip(), maxsplit=1)[0].lower() if build.runtime.strip() else ""
    if name:
        return name
    return "openvino" if build.format == "openvino" else "onnxruntime"  # before schema 2 every build was onnxruntime's


def runtime_missing(build: Build, host: HostRuntimes) -> str | None:
    """Why `host` cannot run `build` with an installed runtime (None: it can)."""
    name = build_runtime(build)
    if name == "onnx":
        return None if host.versions else "no ONNX runtime installed (onnxruntime or openvino)"
    if name not in host.versions:
        return f"needs {build.runtime or name}, which is not installed"
    minimum = re.search(r">=\s*([0-9][0-9.]*)", build.runtime)
    if minimum and _version_tuple(host.versions[name]) < _version_tuple(minimum.group(1)):
        return f"needs {build.runtime}; {name} {host.versions[name]} is installed"
    return None


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def _latency(build: Build, host: HostRuntimes) -> float:
    """The build's measured batch-1 latency where it tells something about this host: timed on this
    platform class (or on an unnamed one: a manifest older than schema 2), else unknown (inf)."""
    v = build.metrics.get("latency_p50_ms")
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return float("inf")
    where = str(build.measured_on.get("platform") or "")
    if where and host.platform and where != host.platform and not (is_cuda(build) and host.cuda):
        return float("inf")  # other CPU kernels: an int8 build fast with VNNI may be slow here
    try:
        latency = float(v)
    except OverflowError:  # an int past a float (a manifest bounds them): no figure to rank by
        return float("inf")
    return latency if latency == latency else float("inf")  # NaN would make the order arbitrary


def rank_builds(manifest: Manifest, providers: list[str] | None = None, *,
                host: HostRuntimes | None = None) -> list[Build]:
    """The builds this host can run and that were verified, best first (see the module docstring)."""
    host = host or host_runtimes(providers)
    usable = [b for b in manifest.builds.values()
              if b.verified is not False and runtime_missing(b, host) is None and provider_missing(b, host) is None
              and ((host.cuda and is_cuda(b)) or not needs_gpu(b))]

    def key(b: Build):
        latency = _latency(b, host)
        preference = CPU_PREFERENCE.index(b.name) if b.name in CPU_PREFERENCE else len(CPU_PREFERENCE)
        return (not build_passed(b.metrics), latency == float("inf"), not (host.cuda and is_cuda(b)), latency,
                preference, b.name)

    return sorted(usable, key=key)


def best_build(manifest: Manifest, providers: list[str] | None = None, *, host: HostRuntimes | None = None) -> Build:
    """The build `zoo pull` takes when none is named; NotFound saying why each build was left out."""
    host = host or host_runtimes(providers)
    ranked = rank_builds(manifest, host=host)
    if not ranked:
        why = "; ".join(f"{name}: {_left_out(b, host)}" for name, b in sorted(manifest.builds.items()))
        raise NotFound(f"{manifest.ref} has no verified build this host can run ({why})",
                       hint="pick one with --build, or install the runtime or execution provider it needs")
    return ranked[0]


def _left_out(build: Build, host: HostRuntimes) -> str:
    if build.verified is False:
        return f"not verified ({build.unverified_reason or 'no reason recorded'})"
    missing = runtime_missing(build, host) or provider_missing(build, host)
    if missing:
        return missing
    return "needs a CUDA GPU (onnxruntime offers no CUDAExecutionProvider here)"


def float_build(manifest: Manifest) -> Build:
    """The build to load back into a framework when none is named (`zoo.load_torch`, a recipe's
    ``model.from``): the version's float32 ONNX build (``cpu-fp32`` if several are)."""
    fp32 = sorted((b for b in manifest.builds.values() if b.format == "onnx" and b.precision == "fp32"),
                  key=lambda b: (b.name != "cpu-fp32", b.name))
    if not fp32:
        raise NotFound(f"{manifest.ref} has no float32 ONNX build (builds: {', '.join(sorted(manifest.builds))})",
                       hint="name the build to load")
    return fp32[0]
