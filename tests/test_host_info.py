"""Tests of zoo_stages.lib.runtimes.host_info (its int8 saturation rule is tested with quantize, which uses it)."""

from __future__ import annotations

from zoo_stages.lib.runtimes.host_info import host_info


def test_host_info_describes_the_cpu():
    info = host_info()
    assert info["cpu_count"] >= 1 and info["machine"]
    assert info["versions"]["onnxruntime"]
    assert isinstance(info["flags"], list)
