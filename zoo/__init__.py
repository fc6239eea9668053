"""zoo: declarative pipelines and a model zoo for ONNX.

The Python API (`zoo.run`, `zoo.plan`, `zoo.status`, `zoo.load_torch`, `zoo.save_torch`) is loaded lazily so that `import zoo`
stays cheap; the CLI only calls this API.
"""

from __future__ import annotations

from zoo import telemetry as _telemetry

# before anything imports a runtime: every process zoo runs in imports this package first (zoo/telemetry.py)
_telemetry.switch_off()

__version__ = "0.1.0"

__all__ = ["run", "plan", "status", "load_torch", "save_torch", "__version__"]


def __getattr__(name: str):
    if name in ("run", "plan", "status", "load_torch", "save_torch"):
        from zoo import api

        return getattr(api, name)
    raise AttributeError(f"module 'zoo' has no attribute {name!r}")
