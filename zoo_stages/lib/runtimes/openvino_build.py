"""An OpenVINO build of an ONNX model: converting it, compiling it for the CPU, running and timing it.

- `version`: the installed ``openvino`` distribution's version (None without it);
- `to_openvino`: ``model.xml`` + ``model.bin`` (OpenVINO IR) from an ONNX file, byte for byte
  the same for the same model, written so that no half-written file is ever left;
- `compile_model`: the IR compiled for the CPU with every setting that changes numbers or
  timings pinned (f32 precision, a thread count, one stream, the latency hint);
- `run`: outputs by the ONNX output names over every sample, in batches (`onnx_run.run`'s rules);
- `measure_latency`: `timing.measure_latency`'s figures for a compiled model;
- `runtime_info`: what a latency figure was measured with.

A compiled model is driven through `CompiledSession`, which gives it onnxruntime's session
interface (``get_inputs``/``get_outputs``/``run``): `onnx_run` checks, casts, batches and pads
feeds for it and `timing` times it exactly as it does an onnxruntime session, so both runtimes
follow one set of rules.

openvino (the ``openvino`` extra) and numpy are imported inside functions, so importing this
module is cheap and `zoo --help`, plans and cached runs never load them.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from zoo.errors import InvalidInput, MissingExtra, StageFailed
from zoo.files import storage_error

if TYPE_CHECKING:
    import numpy as np

DEVICE = "CPU"
INSTALL_HINT = "pip install 'zoo-onnx[openvino]' (the 'openvino' extra)"

# The conversion runs in a fresh interpreter (`_CONVERT`) for two reasons:
# - determinism: OpenVINO names every node it creates without a name "<Type>_<N>", N from one
#   process-wide counter, and the ONNX frontend and its transformations create many (folded
#   constants keep such names: "Reshape_15"). Converting the same model twice in one process
#   gives "Reshape_15" then "Reshape_2641"; a fresh process starts the counter at the same place
#   every time, so the IR's bytes depend on the model alone;
# - no telemetry: `openvino.convert_model` reports every conversion to Google Analytics (and
#   writes a client id and a usage count under ~/intel) unless the user opted out. A build
#   tool must not phone home; blocking the `openvino_telemetry` import makes OpenVINO fall back
#   to its own no-op stub (openvino/tools/ovc/telemetry_stub.py).
# The model's rt_info "conversion_parameters" (``input_model: DIR/<source file name>``) is
# dropped: the source's file name is not part of the model, and a cached input is named after
# its place in the cache. "Runtime_version" (OpenVINO's version) stays: it is the same for the
# same OpenVINO, and says which one made the IR.
_CONVERT = """\
import sys
sys.modules["openvino_telemetry"] = None  # import fails: OpenVINO uses its no-op telemetry stub
import openvino as ov
source, xml, error = sys.argv[1:4]
try:
    model = ov.convert_model(source)
    rt_info = model.get_rt_info()
    if "conversion_parameters" in rt_info.keys():
        del rt_info["conversion_parameters"]
    ov.save_model(model, xml, compress_to_fp16=False)
except Exception as e:
    with open(error, "w") as f:
        f.write(str(e))
    raise
"""


def version() -> str | None:
    """The installed ``openvino`` distribution's version ("2026.4.1"), or None when it is absent."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("openvino")
    except PackageNotFoundError:
        return None


def require() -> None:
    """MissingExtra (an InvalidInput) naming the extra to install unless openvino is installed and
    importable. Imports nothing: the conversion itself runs in another process."""
    import importlib.util

    try:
        found = version() is not None and importlib.util.find_spec("openvino") is not None
    except (ImportError, ValueError):  # ValueError: a module that sys.modules holds as None (blocked)
        found = False
    if not found:
        raise MissingExtra("an OpenVINO build needs openvino, which is not installed", hint=INSTALL_HINT)


def _openvino() -> Any:
    """The openvino module (MissingExtra without it)."""
    require()
    try:
        import openvino
    except ImportError as e:
        raise MissingExtra(f"openvino is installed but cannot be imported: {e}", hint=INSTALL_HINT) from None
    return openvino


# ---------------------------------------------------------------------------------------------
# conversion


def to_openvino(source: Path, out_dir: Path) -> tuple[Path, Path]:
    """Convert the ONNX model `source` to OpenVINO IR: ``out_dir/model.xml`` and ``model.bin``.

    ``openvino.convert_model`` then ``openvino.save_model`` with ``compress_to_fp16=False``
    (weights keep their precision: an f32 model stays f32, a QDQ model's int8 weights stay
    int8), in a fresh Python process (see `_CONVERT` for why). Both files are written in a temp
    folder inside `out_dir` and renamed into place, the .bin first: a model.xml is only ever
    there with its whole .bin, and a failed conversion leaves `out_dir` as it was. Returns
    (xml, bin). StageFailed (with OpenVINO's message) when OpenVINO cannot convert the model.
    """
    require()
    source, out_dir = Path(source), Path(out_dir)
    if not source.is_file():
        raise InvalidInput(f"no ONNX model at {source}")
    xml, weights = out_dir / "model.xml", out_dir / "model.bin"
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".openvino-", dir=out_dir))
    except OSError as e:
        raise storage_error(out_dir, e) from e
    try:
        error = staging / "error.txt"
        proc = subprocess.run([sys.executable, "-c", _CONVERT, str(source.resolve()), str(staging / xml.name),
                               str(error)], capture_output=True, text=True, env=_child_env())
        if proc.returncode != 0:
            # OpenVINO's own message when it raised, else the last line of what the child printed
            message = _first_lines(error.read_text()) if error.exists() else (
                proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
            raise StageFailed(f"OpenVINO could not convert {source.name}: {message}", log_tail=proc.stderr[-4000:],
                              hint="the model may use an operator OpenVINO's ONNX frontend does not support")
        os.replace(staging / weights.name, weights)
        os.replace(staging / xml.name, xml)
    except OSError as e:
        raise storage_error(xml, e) from e
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return xml, weights


def _child_env() -> dict[str, str]:
    """The converter's environment: ours, with our import path (the child must find the same openvino)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env


# lines of OpenVINO's C++ error messages that say where in OpenVINO's source it failed, not why
_SOURCE_LINES = re.compile(r"^(Check '.*' failed at |Exception from src/|FrontEnd API failed with |Summary:$)")


def _first_lines(message: str, limit: int = 3) -> str:
    """The gist of an OpenVINO error `message`: its first `limit` lines that say what went wrong
    ("No conversion rule found for operations: zoo.test.NoSuchOp"), joined."""
    lines = [line.strip().lstrip("- ") for line in message.strip().splitlines()]
    lines = [line for line in lines if line and not _SOURCE_LINES.match(line)]
    return " ".join(lines[:limit]) or message.strip()


# ---------------------------------------------------------------------------------------------
# compiling and running


def compile_model(xml: Path, *, threads: int = 1) -> Any:
    """The IR at `xml` compiled for OpenVINO's CPU plugin, every setting that matters pinned.

    - ``INFERENCE_PRECISION_HINT`` f32: on a CPU with bf16 (AVX512_BF16, AMX) or fp16 units the
      plugin runs float layers in bf16/fp16 by default; outputs would then differ from the ONNX
      model's by far more than float rounding, and from machine to machine. (QDQ int8 layers
      still run int8 kernels: the hint is about floating-point layers.)
    - ``INFERENCE_NUM_THREADS`` = `threads`: the default is every core, so timings would depend
      on the machine's size and load; zoo times every runtime at the same thread count.
    - ``NUM_STREAMS`` 1 and ``PERFORMANCE_HINT`` LATENCY: one request at a time on one stream,
      which is what a latency figure measures (the THROUGHPUT hint splits the cores into
      streams and batches requests).
    """
    ov = _openvino()
    if threads < 1:
        raise InvalidInput(f"thread count must be at least 1 (got {threads})")
    config = {
        "INFERENCE_PRECISION_HINT": "f32",
        "INFERENCE_NUM_THREADS": int(threads),
        "NUM_STREAMS": 1,
        "PERFORMANCE_HINT": "LATENCY",
    }
    try:
        return ov.Core().compile_model(str(xml), DEVICE, config)
    except Exception as e:  # OpenVINO raises RuntimeError from C++
        raise StageFailed(f"OpenVINO could not compile {Path(xml).name} for the CPU: {_first_lines(str(e))}",
                          hint="check that model.xml and model.bin come from the same conversion") from None


@dataclass(frozen=True)
class _Port:
    """One input or output of a compiled model, as onnxruntime describes one (a NodeArg)."""

    name: str
    type: str  # numpy's element type name: onnx_run.dtype_name passes it through
    shape: tuple[int | None, ...] | None  # None for a dimension (or a rank) OpenVINO leaves dynamic


def _port(port: Any) -> _Port:
    shape = port.get_partial_shape()
    dims = None if shape.rank.is_dynamic else tuple(
        d.get_length() if d.is_static else None for d in shape)
    element = port.get_element_type()
    try:
        dtype = element.to_dtype().name
    except Exception:  # an element type numpy has no dtype for (bf16, u4...): onnx_run refuses it by name
        dtype = element.get_type_name()
    return _Port(name=port.get_any_name(), type=dtype, shape=dims)


class CompiledSession:
    """An OpenVINO compiled model behind onnxruntime's session interface.

    Inputs and outputs are named by their tensors' names, which OpenVINO's ONNX frontend takes
    from the ONNX graph's input and output names, in the graph's order. `run` uses one infer
    request, so a session is not for several threads at once.
    """

    def __init__(self, compiled: Any):
        self.compiled = compiled
        self._request = compiled.create_infer_request()
        self._inputs = [_port(p) for p in compiled.inputs]
        self._outputs = [_port(p) for p in compiled.outputs]
        self._output_index = {p.name: i for i, p in enumerate(self._outputs)}

    def get_inputs(self) -> list[_Port]:
        return list(self._inputs)

    def get_outputs(self) -> list[_Port]:
        return list(self._outputs)

    def run(self, output_names: Sequence[str] | None, feeds: Mapping[str, "np.ndarray"]) -> list["np.ndarray"]:
        """The outputs named (all, in order, for None) for `feeds` {input name: array}."""
        ports = self.compiled.outputs
        wanted = [ports[self._output_index[n]] for n in output_names] if output_names else list(ports)
        try:
            results = self._request.infer({name: value for name, value in feeds.items()})
        except Exception as e:  # OpenVINO raises RuntimeError from C++
            raise StageFailed(f"OpenVINO failed running the model: {_first_lines(str(e), 1)}",
                              hint="the model may need inputs of another shape or type") from None
        return [results[port] for port in wanted]


def run(compiled: Any, feeds: Mapping[str, Any], *, batch_size: int | None = None,
        outputs: Sequence[str] | None = None, where: str = "the inputs") -> dict[str, "np.ndarray"]:
    """{output name: array} over every sample of `feeds`, `batch_size` samples at a time.

    The rules of `onnx_run.run`: feeds checked against the inputs and cast to their element
    types; all samples at once without `batch_size`; a model with a fixed batch dimension fed
    exactly that many samples (the last batch padded with copies of its last sample, their
    outputs dropped); batches concatenated along axis 0; outputs in the model's order.
    """
    from zoo_stages.lib.runtimes import onnx_run

    return onnx_run.run(_session(compiled), feeds, batch_size=batch_size, outputs=outputs, where=where)


def measure_latency(compiled: Any, feeds: Mapping[str, "np.ndarray"], *, warmup: int = 5,
                    runs: int = 30) -> dict[str, Any]:
    """`timing.measure_latency`'s figures (p50_ms, p90_ms, mean_ms, min_ms, runs, warmup) for
    one inference of `compiled` on `feeds` (checked and cast once, outside the timed runs)."""
    from zoo_stages.lib.runtimes import timing

    return timing.measure_latency(_session(compiled), feeds, warmup=warmup, runs=runs)


def _session(compiled: Any) -> CompiledSession:
    return compiled if isinstance(compiled, CompiledSession) else CompiledSession(compiled)


def runtime_info() -> dict[str, str]:
    """What `compile_model`'s latency figures are measured with: runtime, its version, the
    device, the CPU's name as OpenVINO reports it, and the pinned inference precision."""
    ov = _openvino()
    return {
        "runtime": "openvino",
        "runtime_version": version() or "",
        "device": DEVICE,
        "device_name": str(ov.Core().get_property(DEVICE, "FULL_DEVICE_NAME")),
        "inference_precision": "f32",
    }
