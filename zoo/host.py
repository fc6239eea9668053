"""What machine a stage ran on, as far as it decides float results: the CPU architecture and the
SIMD features that torch and onnxruntime choose their kernels by, and the platform class they make.

Recorded per stage in cache entries and the lockfile (never in a cache key: a key says what was
asked for, not where), so `zoo repro --check` can tell a real change from a rebuild on a CPU
with other kernels (an AVX-512 host and an AVX2 host train different checkpoint bytes).

Platform classes (`platform_class`): the lockfile keeps one set of stage records per class
(zoo/engine/lockfile.py), as conda-lock keeps one per platform. A class is the most capable
kernel tier torch (ATen's CPU capability: default, AVX2, AVX-512; oneDNN's ISA) and onnxruntime
(MLAS: SSE/AVX, AVX2+FMA, AVX-VNNI, AVX-512, AVX-512 VNNI, AMX; NEON, dot product, i8mm, SVE)
dispatch to on that CPU, so two machines of one class run the same kernels and produce the same
bytes, and machines of different classes may not. Finer differences (the model name, cache
sizes, avx512_bf16) choose no other float32 kernel, so they would only split the records
without making them truer:

=====================  ==========================================================================
class                  CPU features
=====================  ==========================================================================
x86-64-amx             AMX (amx_int8 or amx_bf16) with AVX-512 F/BW/VL (Sapphire Rapids and later)
x86-64-avx512-vnni     AVX-512 F/BW/VL with avx512_vnni (Cascade Lake, Ice Lake, Zen 4)
x86-64-avx512          AVX-512 F/BW/VL (Skylake-SP)
x86-64-avx2-vnni       AVX2 + FMA with avx_vnni, no AVX-512 (Alder Lake and later client CPUs)
x86-64-avx2            AVX2 + FMA (Haswell to Comet Lake, Zen 1-3)
x86-64                 neither (SSE4.1/AVX only: ATen's and MLAS's baseline kernels)
arm64-sve              SVE (Graviton 3/4, Neoverse V1/V2)
arm64-i8mm             i8mm without SVE (int8 matrix multiply)
arm64-dotprod          asimddp (Graviton 2, Neoverse N1)
arm64                  NEON only
ARCH-unknown           no feature list (no /proc/cpuinfo: macOS, Windows): the architecture only
ARCH                   any other architecture (ppc64le, s390x, riscv64...)
=====================  ==========================================================================

Features come from the CPUID instruction on x86-64 (zoo/cpuid.py: what the kernels' dispatch
reads, also under an emulator's CPU model, which /proc/cpuinfo does not show), else from
/proc/cpuinfo (arm64 Linux), else none (``ARCH-unknown``).

The class is derived from a `describe()` record, so the producer's class of any cache entry
(which records its host) can be named on another machine.
"""

from __future__ import annotations

import functools
import platform
from typing import Any

# Features that change which kernels run, hence float rounding (and int8 speed).
KERNEL_FEATURES = ("sse4_1", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
                   "avx_vnni", "avx512_bf16", "avx512_fp16", "amx_int8", "amx_bf16",
                   "asimd", "asimddp", "asimdhp", "i8mm", "bf16", "sve", "sve2")


@functools.lru_cache(maxsize=1)
def _cpuinfo() -> tuple[str, frozenset[str]]:
    """(CPU model name, all feature flags) from /proc/cpuinfo; ('', {}) where there is none."""
    model, flags = "", set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "Hardware") and not model:
                    model = value.strip()
                elif key in ("flags", "Features"):
                    flags.update(value.split())
    except OSError:  # not Linux: platform.machine() still says x86_64 or arm64
        pass
    return model, frozenset(flags)


def cpu_model() -> str:
    """The CPU's model name, or the architecture when unknown."""
    from zoo import cpuid

    return cpuid.brand() or _cpuinfo()[0] or platform.processor() or platform.machine()


def kernel_features() -> list[str]:
    """The SIMD features of this CPU among KERNEL_FEATURES, sorted: CPUID's where it can be read
    (x86-64), else /proc/cpuinfo's."""
    from zoo import cpuid

    flags = cpuid.features()
    if flags is None:
        flags = _cpuinfo()[1]
    return sorted(f for f in KERNEL_FEATURES if f in flags)


def describe() -> dict[str, Any]:
    """{"machine", "cpu", "features"} of this host, for cache entries and the lockfile."""
    return {"machine": platform.machine(), "cpu": cpu_model(), "features": kernel_features()}


UNKNOWN_PLATFORM = "unknown"  # records that name no host (written by an older zoo, or a release's zoo.lock)
_ARCH_NAMES = {"x86_64": "x86-64", "amd64": "x86-64", "x86-64": "x86-64", "aarch64": "arm64", "arm64": "arm64"}
_AVX512 = ("avx512f", "avx512bw", "avx512vl")


def platform_class(info: dict[str, Any] | None = None) -> str:
    """The platform class of a `describe()` record (this host's when None); see the module docstring.

    A record without a machine (an older cache entry or lock record) is `UNKNOWN_PLATFORM`.
    """
    info = describe() if info is None else info
    machine = str(info.get("machine") or "").lower()
    if not machine:
        return UNKNOWN_PLATFORM
    arch = _ARCH_NAMES.get(machine, machine)
    features = set(info.get("features") or [])
    if arch not in ("x86-64", "arm64"):
        return arch
    if not features:  # no /proc/cpuinfo: the features are not known, not absent
        return f"{arch}-unknown"
    if arch == "arm64":
        for feature, name in (("sve", "arm64-sve"), ("i8mm", "arm64-i8mm"), ("asimddp", "arm64-dotprod")):
            if feature in features:
                return name
        return "arm64"
    if all(f in features for f in _AVX512):
        if features & {"amx_int8", "amx_bf16"}:
            return "x86-64-amx"
        return "x86-64-avx512-vnni" if "avx512_vnni" in features else "x86-64-avx512"
    if {"avx2", "fma"} <= features:
        return "x86-64-avx2-vnni" if "avx_vnni" in features else "x86-64-avx2"
    return "x86-64"


def same_kernels(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two `describe()` records would run the same kernels (architecture and features)."""
    return a.get("machine") == b.get("machine") and sorted(a.get("features", [])) == sorted(b.get("features", []))


def kernel_difference(locked: dict[str, Any], here: dict[str, Any]) -> str:
    """One line naming what differs between two hosts' kernel features, for repro reports."""
    if locked.get("machine") != here.get("machine"):
        return f"{locked.get('machine')} → {here.get('machine')}"
    old, new = set(locked.get("features", [])), set(here.get("features", []))
    parts = []
    if old - new:
        parts.append("without " + ", ".join(sorted(old - new)))
    if new - old:
        parts.append("with " + ", ".join(sorted(new - old)))
    return "; ".join(parts) or "same features"
