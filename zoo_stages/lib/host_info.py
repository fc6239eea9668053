"""The host a figure was measured on: CPU, SIMD features, runtime versions, and what they imply
for onnxruntime's int8 kernels."""

from __future__ import annotations

import os
import platform
from typing import Any, Mapping


def host_info() -> dict[str, Any]:
    """CPU model, core count, the SIMD flags relevant to int8 kernels, and runtime versions."""
    from importlib.metadata import PackageNotFoundError, version

    from zoo import host

    versions = {}
    for dist in ("onnxruntime", "onnx", "numpy"):
        try:
            versions[dist] = version(dist)
        except PackageNotFoundError:
            versions[dist] = None
    return {
        "machine": platform.machine(),
        "system": platform.system(),
        "cpu": host.cpu_model(),
        "cpu_count": os.cpu_count(),
        "flags": host.kernel_features(),
        "python": platform.python_version(),
        "versions": versions,
    }


def int8_may_saturate(host: Mapping[str, Any] | None = None) -> bool:
    """True on x86-64 CPUs without VNNI (AVX-512 VNNI or AVX-VNNI): there onnxruntime's u8 x s8
    kernels use VPMADDUBSW, whose 16-bit intermediate sums can saturate unless the weights use
    7 bits (`reduce_range`). Measured accuracy of full-range int8 weights is then this host's
    kernels' accuracy, not the model's."""
    host = host if host is not None else host_info()
    if str(host.get("machine", "")).lower() not in ("x86_64", "amd64", "i686", "x86"):
        return False
    return not ({"avx512_vnni", "avx_vnni"} & set(host.get("flags", ())))
