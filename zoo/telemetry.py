"""Usage reporting ("telemetry") of the libraries zoo loads, switched off for the process.

zoo is a build tool: a run must not report to anyone, nor leave identifiers in the user's home.
`switch_off` runs when the ``zoo`` package is imported (``zoo/__init__.py``), which is before any
runtime is, in every process zoo runs in: the CLI, a program using the Python API, the local
workers (spawned interpreters that import zoo to run their stage), Dask workers (they import zoo
to unpickle a stage) and, through the environment they inherit, every child process these start.

What each library does, and its switch (measured with onnxruntime 1.32 and OpenVINO 2026.4 on
Linux, `tests/test_telemetry.py`):

- onnxruntime: its import writes a device id and an event store
  (``~/.cache/Microsoft/DeveloperTools/.onnxruntime/{deviceid,onnxruntime.db}``) for Microsoft's
  1DS telemetry. ``ORT_DISABLE_TELEMETRY=1`` in the environment before that import stops both;
  ``onnxruntime.disable_telemetry_events()`` after it stops neither.
- OpenVINO: its import writes a client id and a usage count (``~/intel/openvino_ga_cid``,
  ``~/intel/stats``), and it reports usage and each ``convert_model`` to Google Analytics, unless
  the user opted out through a consent file in ``~/intel``; no environment variable turns it off
  (CI=true aside, which means more to other tools). When ``openvino_telemetry`` cannot be
  imported, OpenVINO uses its own no-op stub (``openvino/tools/ovc/telemetry_stub.py``): so that
  import is made to fail.
- huggingface_hub: ``HF_HUB_DISABLE_TELEMETRY=1``.
- DVC (`dvc.api`, for ``data: {source: dvc}``): ``DVC_NO_ANALYTICS=1`` and, for the
  ``iterative_telemetry`` package under it, ``ITERATIVE_DO_NOT_TRACK=1``.

A variable the user has set (to anything) is left as it is. A program that imported onnxruntime
or ``openvino_telemetry`` before zoo keeps what it chose (both decide at their import).
"""

from __future__ import annotations

import os
import sys

# each variable and the value that switches its library's reporting off
OFF: dict[str, str] = {
    "ORT_DISABLE_TELEMETRY": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "DVC_NO_ANALYTICS": "1",
    "ITERATIVE_DO_NOT_TRACK": "1",
}

# modules whose failed import makes their library report nothing
BLOCKED_MODULES = ("openvino_telemetry",)


def switch_off() -> None:
    """Switch the known libraries' telemetry off for this process and the processes it starts.
    Cheap (no import), and safe to call more than once."""
    for name, value in OFF.items():
        os.environ.setdefault(name, value)
    for module in BLOCKED_MODULES:
        # None in sys.modules makes `import module` raise ImportError; one already imported stays
        sys.modules.setdefault(module, None)
