"""zoo.host: the CPU features recorded with each stage's outputs."""

from __future__ import annotations

import platform

from zoo import host


def test_describe_names_this_machine_and_only_kernel_features():
    info = host.describe()
    assert info["machine"] == platform.machine()
    assert set(info["features"]) <= set(host.KERNEL_FEATURES) and info["features"] == sorted(info["features"])
    if platform.machine() == "x86_64":
        assert "sse4_1" in info["features"]  # every x86-64 CPU onnxruntime supports has it


def test_same_kernels_compares_architecture_and_features_not_the_model_name():
    a = {"machine": "x86_64", "cpu": "AMD EPYC 9B14", "features": ["avx2", "avx512f"]}
    assert host.same_kernels(a, {**a, "cpu": "Intel Xeon"})
    assert not host.same_kernels(a, {**a, "features": ["avx2"]})
    assert not host.same_kernels(a, {**a, "machine": "aarch64"})


def test_kernel_difference_says_what_is_missing_and_what_is_new():
    locked = {"machine": "x86_64", "features": ["avx2", "avx512_vnni", "avx512f"]}
    here = {"machine": "x86_64", "features": ["avx2", "avx_vnni"]}
    assert host.kernel_difference(locked, here) == "without avx512_vnni, avx512f; with avx_vnni"
    assert host.kernel_difference(locked, {"machine": "aarch64"}) == "x86_64 → aarch64"
