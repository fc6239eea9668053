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


def measured_on(host: Mapping[str, Any] | None, *, runtime: str, runtime_version: str | None,
                execution_provider: str, threads: int | None = None, device: str | None = None) -> dict[str, str | int]:
    """What a timing was measured with (a build's ``measured_on`` in the manifest): the runtime and
    its version, the execution provider (or OpenVINO device), the hardware (`device`, else the CPU
    model of `host`, a `host_info()` record) and its platform class, the thread count."""
    from zoo import host as zoo_host

    host = host or {}
    out: dict[str, str | int] = {"runtime": runtime, "execution_provider": execution_provider}
    if runtime_version:
        out["runtime_version"] = runtime_version
    if device or host.get("cpu"):
        out["device"] = str(device or host.get("cpu"))
    if host.get("machine"):
        out["platform"] = zoo_host.platform_class({"machine": host.get("machine"), "features": host.get("flags")})
    if threads:
        out["threads"] = int(threads)
    return out


def gpu_name() -> str:
    """The first NVIDIA GPU's model name (nvidia-smi), or "CUDA GPU" when it cannot be read."""
    import shutil
    import subprocess

    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                 text=True, timeout=10, check=False).stdout.strip().splitlines()
        except (OSError, subprocess.SubprocessError):
            out = []
        if out and out[0].strip():
            return out[0].strip()
    return "CUDA GPU"


def int8_may_saturate(host: Mapping[str, Any] | None = None) -> bool:
    """True on x86-64 CPUs without VNNI (AVX-512 VNNI or AVX-VNNI): there onnxruntime's u8 x s8
    kernels use VPMADDUBSW, whose 16-bit intermediate sums can saturate unless the weights use
    7 bits (`reduce_range`). Measured accuracy of full-range int8 weights is then this host's
    kernels' accuracy, not the model's."""
    host = host if host is not None else host_info()
    if str(host.get("machine", "")).lower() not in ("x86_64", "amd64", "i686", "x86"):
        return False
    return not ({"avx512_vnni", "avx_vnni"} & set(host.get("flags", ())))
