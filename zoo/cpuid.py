"""The x86-64 SIMD features the running process can use, read with the CPUID and XGETBV
instructions themselves: what torch's and onnxruntime's kernel dispatch read.

Why not /proc/cpuinfo alone: it is Linux's account of the host CPU, which is what the kernels see on
real hardware, but not under an emulator or a hypervisor that masks features (QEMU's CPU models,
which this project uses to build lock records for CPU classes it has no machine of), and it does
not exist on macOS or Windows. CPUID is the ground truth the dispatchers use, and XGETBV says
whether the operating system saves the AVX / AVX-512 / AMX registers, without which a feature
bit is unusable (MLAS checks the same).

`features()` runs two tiny fixed machine-code routines (below, 40 bytes) from an anonymous
executable page; where such a page cannot be made (a kernel that forbids writable-executable
memory, a platform without `mmap`'s protection flags) or the machine is not x86-64, it returns
None and callers fall back to /proc/cpuinfo. Names follow /proc/cpuinfo's (``avx512_vnni``).
"""

from __future__ import annotations

import functools
import platform
from typing import Callable, TypeVar

T = TypeVar("T")

# uint32 out[4] = cpuid(eax=leaf, ecx=subleaf), System V calling convention (rdi, rsi, rdx):
#   push rbx; mov eax, edi; mov ecx, esi; mov r8, rdx; cpuid;
#   mov [r8], eax; mov [r8+4], ebx; mov [r8+8], ecx; mov [r8+12], edx; pop rbx; ret
_CPUID = bytes.fromhex("53 89f8 89f1 4989d0 0fa2 418900 41895804 41894808 4189500c 5b c3")
# uint64 xgetbv(ecx=index): mov ecx, edi; xgetbv; shl rdx, 32; or rax, rdx; ret
_XGETBV = bytes.fromhex("89f9 0f01d0 48c1e220 4809d0 c3")

# (leaf, subleaf, register index into eax/ebx/ecx/edx, bit) -> feature name
_BITS = {
    (1, 0, 2, 19): "sse4_1", (1, 0, 2, 12): "fma", (1, 0, 2, 28): "avx", (1, 0, 2, 29): "f16c",
    (7, 0, 1, 5): "avx2", (7, 0, 1, 16): "avx512f", (7, 0, 1, 30): "avx512bw", (7, 0, 1, 31): "avx512vl",
    (7, 0, 2, 11): "avx512_vnni", (7, 0, 3, 22): "amx_bf16", (7, 0, 3, 23): "avx512_fp16",
    (7, 0, 3, 25): "amx_int8", (7, 1, 0, 4): "avx_vnni", (7, 1, 0, 5): "avx512_bf16",
}
_NEEDS_AVX_STATE = {"avx", "fma", "f16c", "avx2", "avx_vnni"}
_XCR0_AVX = 0b110  # SSE and AVX (YMM) state saved by the OS
_XCR0_AVX512 = 0b11100110  # plus opmask, ZMM_Hi256 and Hi16_ZMM
_XCR0_AMX = (1 << 17) | (1 << 18)  # XTILECFG and XTILEDATA


@functools.lru_cache(maxsize=1)
def features() -> frozenset[str] | None:
    """The usable SIMD features of this x86-64 process's CPU, or None where CPUID cannot be read."""
    return _read(_decode)


@functools.lru_cache(maxsize=1)
def brand() -> str | None:
    """The CPU's brand string (CPUID leaves 0x80000002-4: "AMD EPYC 9B14", or an emulator's CPU
    model name), or None where CPUID cannot be read or has none."""
    return _read(lambda cpuid, _: _brand(cpuid))


def _read(decode: Callable[[Callable, Callable], T]) -> T | None:
    """`decode(cpuid, xgetbv)` with the CPUID routines mapped, or None off x86-64 or where they
    cannot be mapped (the page is unmapped once `decode` returns: the routines point into it)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    try:
        page, cpuid, xgetbv = _routines()
    except (OSError, ValueError, AttributeError, TypeError):
        return None
    with page:
        return decode(cpuid, xgetbv)


def _brand(cpuid) -> str | None:
    if cpuid(0x80000000, 0)[0] < 0x80000004:
        return None
    raw = b"".join(r.to_bytes(4, "little") for leaf in (0x80000002, 0x80000003, 0x80000004) for r in cpuid(leaf, 0))
    return raw.split(b"\0", 1)[0].decode("ascii", "replace").strip() or None


def _decode(cpuid, xgetbv) -> frozenset[str]:
    max_leaf = cpuid(0, 0)[0]
    regs: dict[tuple[int, int], tuple[int, int, int, int]] = {(1, 0): cpuid(1, 0) if max_leaf >= 1 else (0, 0, 0, 0)}
    regs[(7, 0)] = cpuid(7, 0) if max_leaf >= 7 else (0, 0, 0, 0)
    regs[(7, 1)] = cpuid(7, 1) if max_leaf >= 7 and regs[(7, 0)][0] >= 1 else (0, 0, 0, 0)
    found = {name for (leaf, sub, reg, bit), name in _BITS.items() if regs[(leaf, sub)][reg] >> bit & 1}
    osxsave = regs[(1, 0)][2] >> 27 & 1
    xcr0 = xgetbv(0) if osxsave else 0
    if xcr0 & _XCR0_AVX != _XCR0_AVX:
        found -= _NEEDS_AVX_STATE
    if xcr0 & _XCR0_AVX512 != _XCR0_AVX512:
        found = {f for f in found if not f.startswith("avx512")}
    if xcr0 & _XCR0_AMX != _XCR0_AMX:
        found = {f for f in found if not f.startswith("amx")}
    return frozenset(found)


def _routines():
    """(the page holding the code, cpuid(leaf, subleaf) -> (eax, ebx, ecx, edx), xgetbv(index) -> int)."""
    import ctypes
    import mmap

    page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    page.write(_CPUID + _XGETBV)
    view = ctypes.c_char.from_buffer(page)
    base = ctypes.addressof(view)
    del view  # no buffer export may outlive this call, or the page could not be closed
    out = (ctypes.c_uint32 * 4)()
    raw_cpuid = ctypes.CFUNCTYPE(None, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_void_p)(base)
    raw_xgetbv = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_uint32)(base + len(_CPUID))

    def cpuid(leaf: int, subleaf: int) -> tuple[int, int, int, int]:
        raw_cpuid(leaf, subleaf, ctypes.addressof(out))
        return tuple(out)

    return page, cpuid, raw_xgetbv
