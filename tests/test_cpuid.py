"""zoo.cpuid: the SIMD features read with CPUID / XGETBV, the source of this host's platform class."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys

import pytest

from zoo import cpuid, host

x86_64 = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"),
                            reason="CPUID is an x86-64 instruction (other machines use /proc/cpuinfo)")


@x86_64
def test_cpuid_agrees_with_what_linux_reports_for_this_cpu():
    if not os.path.exists("/proc/cpuinfo"):
        pytest.skip("no /proc/cpuinfo to compare with")
    read = cpuid.features()
    assert read is not None, "CPUID could not be read on an x86-64 Linux host"
    linux = host._cpuinfo()[1]
    names = set(cpuid._BITS.values())
    assert read == frozenset(n for n in names if n in linux)
    assert "sse4_1" in read  # every x86-64 CPU onnxruntime supports has it
    assert host.kernel_features() == sorted(f for f in host.KERNEL_FEATURES if f in read)


@x86_64
def test_brand_is_the_cpus_model_name():
    brand = cpuid.brand()
    assert brand and brand.isprintable()
    assert host.cpu_model() == brand


def _fake(leaves: dict[tuple[int, int], tuple[int, int, int, int]]):
    return lambda leaf, sub: leaves.get((leaf, sub), (0, 0, 0, 0))


def _bits(*positions: int) -> int:
    return sum(1 << p for p in positions)


ZEN4 = {(0, 0): (0x10, 0, 0, 0),
        (1, 0): (0, 0, _bits(19, 12, 27, 28, 29), 0),  # sse4_1, fma, osxsave, avx, f16c
        (7, 0): (1, _bits(5, 16, 30, 31), _bits(11), 0),  # avx2, avx512 f/bw/vl; avx512_vnni
        (7, 1): (_bits(5), 0, 0, 0)}  # avx512_bf16


def test_decode_names_the_bits_the_os_lets_a_process_use():
    full = cpuid._decode(_fake(ZEN4), lambda index: 0b11100111)  # x87, SSE, AVX and AVX-512 state saved
    assert full == {"sse4_1", "fma", "avx", "f16c", "avx2", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
                    "avx512_bf16"}
    assert host.platform_class({"machine": "x86_64", "features": sorted(full)}) == "x86-64-avx512-vnni"
    # an OS that does not save the ZMM registers: AVX-512 is unusable, whatever CPUID says
    avx_only = cpuid._decode(_fake(ZEN4), lambda index: 0b111)
    assert avx_only == {"sse4_1", "fma", "avx", "f16c", "avx2"}
    assert host.platform_class({"machine": "x86_64", "features": sorted(avx_only)}) == "x86-64-avx2"
    # no OSXSAVE: no AVX state at all
    no_xsave = {**ZEN4, (1, 0): (0, 0, _bits(19, 12, 28, 29), 0)}
    assert cpuid._decode(_fake(no_xsave), lambda index: pytest.fail("xgetbv without osxsave")) == {"sse4_1"}
    # a CPU whose leaf 7 has no subleaf 1 is not asked for it
    one_subleaf = {**ZEN4, (7, 0): (0, _bits(5), 0, 0), (7, 1): (_bits(4), 0, 0, 0)}
    assert "avx_vnni" not in cpuid._decode(_fake(one_subleaf), lambda index: 0b111)


@x86_64
@pytest.mark.slow
def test_under_an_emulated_avx2_cpu_the_platform_class_is_avx2():
    """QEMU's EPYC-Milan model (Zen 3: AVX2, no AVX-512), whatever this host is: what
    scripts/lock_emulated.sh relies on to file lock records under that class."""
    qemu = shutil.which("qemu-x86_64")
    assert qemu, "qemu-x86_64 is missing: ./dev installs Debian's qemu-user (apt-get install qemu-user)"
    code = "import json; from zoo import host; print(json.dumps([host.platform_class(), host.describe()]))"
    out = subprocess.run([qemu, "-cpu", "EPYC-Milan", sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, check=True).stdout
    klass, info = json.loads(out)
    assert klass == "x86-64-avx2"
    assert "avx512f" not in info["features"] and {"avx2", "fma"} <= set(info["features"])
    assert "EPYC-Milan" in info["cpu"]  # the emulated model names itself in the records
