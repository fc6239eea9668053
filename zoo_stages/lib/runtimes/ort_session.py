"""The one way the built-in kinds open an onnxruntime session.

Every session is built the same way, so outputs are the same bits on every run: a fixed number
of intra-op threads, one inter-op thread, sequential execution, ``use_deterministic_compute``,
and an explicit graph optimization level. Only errors are logged (onnxruntime's warnings would
go to stderr, not to the stage's log).

A model onnxruntime cannot load (a damaged file, an operator or opset this build lacks, an
execution provider it was not built with) is the stage's *input* that is wrong, like a file
that is not ONNX at all (`onnx_io.load_model`): it raises `zoo.errors.InvalidInput` (exit 2)
wherever it is opened.

onnxruntime is imported inside functions so importing this module is cheap.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence

from zoo.errors import InvalidInput

if TYPE_CHECKING:
    import onnx
    import onnxruntime as ort

OPT_LEVELS = ("disable", "basic", "extended", "all")

LOAD_HINT = ("the model may use operators or an opset this onnxruntime lacks, or the file may be damaged; "
             "check the upstream stage's output")


def session_options(*, threads: int = 1, level: str = "all", optimized_path: Path | None = None,
                    runtime_optimizations: bool = False, profile_prefix: Path | None = None) -> "ort.SessionOptions":
    """SessionOptions: `threads` intra-op threads, sequential execution, deterministic compute.

    `level` is the graph optimization level (one of `OPT_LEVELS`); `optimized_path` saves the
    optimized graph there; `runtime_optimizations` replays the optimizations a Runtime-style
    ORT-format model saved; `profile_prefix` turns onnxruntime's profiler on (benchmarks only).
    """
    import onnxruntime as ort

    if level not in OPT_LEVELS:
        raise InvalidInput(f"unknown graph optimization level {level!r}", hint=f"use one of: {', '.join(OPT_LEVELS)}")
    if threads < 1:
        raise InvalidInput(f"thread count must be at least 1 (got {threads})")
    so = ort.SessionOptions()
    so.intra_op_num_threads = int(threads)
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.use_deterministic_compute = True
    so.log_severity_level = 3  # errors only
    so.graph_optimization_level = {
        "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[level]
    if optimized_path is not None:
        so.optimized_model_filepath = str(optimized_path)
    if runtime_optimizations:
        so.add_session_config_entry("session.enable_saved_runtime_optimizations", "1")
    if profile_prefix is not None:
        so.enable_profiling = True
        so.profile_file_prefix = str(profile_prefix)
    return so


def make_session(model: "onnx.ModelProto | Path | str | bytes", *, threads: int = 1, level: str = "all",
                 providers: Sequence[str] = ("CPUExecutionProvider",), optimized_path: Path | None = None,
                 runtime_optimizations: bool = False, profile_prefix: Path | None = None,
                 provider_options: Mapping[str, Mapping[str, str]] | None = None) -> "ort.InferenceSession":
    """An InferenceSession on `model`: a ModelProto, serialised bytes, or a path to an .onnx or
    .ort file (see `session_options` for the other arguments; `provider_options` maps a provider
    to the options it is created with).

    An .onnx path that onnxruntime can read as it is (IR version, external data inside its
    folder: `onnx_io.loadable_as_is`) is handed over by name, so it is never parsed in Python;
    others are loaded safely (`onnx_io.load_model`) and serialised. Raises InvalidInput when the
    model, a provider or an option is not usable.
    """
    import onnxruntime as ort

    from zoo_stages.lib.onnx import onnx_io

    available = ort.get_available_providers()
    missing = [p for p in providers if p not in available]
    if missing:
        raise InvalidInput(f"execution provider {missing[0]!r} is not available in this onnxruntime build",
                           hint=f"available: {', '.join(available)}")
    what = "the model"
    if isinstance(model, (bytes, bytearray)):
        data: "bytes | str" = bytes(model)
    elif isinstance(model, (str, Path)):
        path = Path(model)
        what = str(path)
        if path.suffix.lower() == ".ort":  # a flatbuffer: onnx cannot read it, onnxruntime must
            if not path.is_file():
                raise InvalidInput(f"model file {path} does not exist", hint="check the upstream stage's `model` output")
            data = str(path)
        elif onnx_io.loadable_as_is(path):
            data = str(path)
        else:
            data = onnx_io.model_bytes(onnx_io.load_model(path))
    else:
        data = onnx_io.model_bytes(onnx_io.as_model(model))
    so = session_options(threads=threads, level=level, optimized_path=optimized_path,
                         runtime_optimizations=runtime_optimizations, profile_prefix=profile_prefix)
    try:
        options = provider_options or {}
        return ort.InferenceSession(data, sess_options=so, providers=list(providers),
                                    provider_options=[dict(options.get(p, {})) for p in providers])
    except Exception as e:  # onnxruntime raises Fail/InvalidGraph/NoSuchFile/... from C++: all mean "cannot load"
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InvalidInput(f"onnxruntime cannot load {what}: {first}", hint=LOAD_HINT) from None
