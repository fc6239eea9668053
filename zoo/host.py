"""What machine a stage ran on, as far as it decides float results: the CPU architecture and the
SIMD features that torch and onnxruntime choose their kernels by.

Recorded per stage in cache entries and the lockfile (never in a cache key: a key says what was
asked for, not where), so `zoo repro --check` can tell a real change from a rebuild on a CPU
with other kernels (an AVX-512 host and an AVX2 host train different checkpoint bytes).
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
    return _cpuinfo()[0] or platform.processor() or platform.machine()


def kernel_features() -> list[str]:
    """The SIMD features of this CPU among KERNEL_FEATURES, sorted."""
    flags = _cpuinfo()[1]
    return sorted(f for f in KERNEL_FEATURES if f in flags)


def describe() -> dict[str, Any]:
    """{"machine", "cpu", "features"} of this host, for cache entries and the lockfile."""
    return {"machine": platform.machine(), "cpu": cpu_model(), "features": kernel_features()}


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
