"""Running a model under ONNX's own reference evaluator (`onnx.reference.ReferenceEvaluator`), and
its test vectors against the outputs onnxruntime stored in them.

The reference evaluator implements each standard operator in numpy from the ONNX specification;
a model that gives its test vectors' outputs there and in onnxruntime does not depend on one
runtime's kernels (`zoo_stages.lib.onnx.portability` judges whether a build is portable with it).

- `ReferenceSession`: the evaluator behind onnxruntime's session interface (`get_inputs`,
  `get_outputs`, `run`), so `zoo_stages.lib.runtimes.onnx_run` checks, casts and batches its feeds as it
  does for onnxruntime (a fixed batch dimension padded, the padding's outputs dropped);
- `run_reference`: {output name: array} for named inputs, `batch_size` samples at a time (the
  evaluator computes in numpy: a convolution holds its whole im2col matrix, so big batches of
  big images cost gigabytes);
- `check_vectors`: every ``test_data_set_*`` run and compared with its stored outputs: float
  outputs within a `Tolerance` (`parity.compare`), integer outputs exactly, a quantized model's by
  the quantized bar (`equivalence.judge_outputs`): the evaluator dequantizes and computes in
  float where onnxruntime runs int8 kernels. A `ReferenceCheck` says how it went.

The model is loaded by `onnx_io.load_model`: external data must lie in the model's folder
(UnsafePath otherwise). onnx and numpy are imported inside functions so importing this module is
cheap.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from zoo.errors import GateFailed, InvalidInput, StageFailed
from zoo_stages.lib.quality.parity import Tolerance

if TYPE_CHECKING:
    import numpy as np
    import onnx

# the evaluator computes in numpy, in other orders than onnxruntime's kernels: the tolerance of a
# float model run on other kernels (equivalence.MODEL_TOLERANCE). Measured: an fp32 AlexNet at
# 224x224 (random weights) differs by 1.7e-6 at most.
DEFAULT_TOLERANCE = Tolerance(atol=1e-4, rtol=1e-3)
# for a float16 build (float16 weights and compute, float32 inputs and outputs): measured 1.2e-3
# max-abs, 5e-3 max-rel on that AlexNet (numpy's float16 arithmetic against onnxruntime's kernels)
FP16_TOLERANCE = Tolerance(atol=1e-2, rtol=1e-2)
# samples per evaluator run: that AlexNet takes 0.24 s and ~520 MB (its weights twice) per sample,
# ~90 MB more at 8 a batch; float16 is ten times slower (numpy computes it in software)
DEFAULT_BATCH = 8

RUN_HINT = ("onnx's reference evaluator implements the standard ONNX operators only; a model that needs "
            "onnxruntime's operators is not portable (its build says `runtime: onnxruntime`)")


@dataclass(frozen=True)
class _Port:
    """One input or output as onnxruntime's NodeArg shows it: name, type string, shape."""

    name: str
    type: str  # onnxruntime's spelling: tensor(float), seq(map(int64,tensor(float)))...
    shape: list[int | str | None] | None


def _type_name(tp: "onnx.TypeProto") -> str:
    from onnx import TensorProto

    kind = tp.WhichOneof("value")
    if kind == "tensor_type":
        return f"tensor({TensorProto.DataType.Name(tp.tensor_type.elem_type).lower()})"
    if kind == "sequence_type":
        return f"seq({_type_name(tp.sequence_type.elem_type)})"
    if kind == "map_type":
        key = TensorProto.DataType.Name(tp.map_type.key_type).lower()
        return f"map({key},{_type_name(tp.map_type.value_type)})"
    if kind == "optional_type":
        return f"optional({_type_name(tp.optional_type.elem_type)})"
    return str(kind)


def _port(value_info: "onnx.ValueInfoProto") -> _Port:
    tp = value_info.type
    shape = None
    if tp.WhichOneof("value") == "tensor_type" and tp.tensor_type.HasField("shape"):
        shape = [d.dim_value if d.HasField("dim_value") else d.dim_param if d.HasField("dim_param") else None
                 for d in tp.tensor_type.shape.dim]
    return _Port(name=value_info.name, type=_type_name(tp), shape=shape)


# Operators onnx's evaluator has no kernel for at older opsets, and the kernel of a later opset
# that computes them: onnx 1.23 implements DequantizeLinear from opset 19 only ("No implementation
# for operator 'DequantizeLinear' ... version 17, found 19, 21, 23, 25"), yet onnxruntime's
# quantizer writes it at the model's opset (13 and up). Opset 19 only added types (float8 inputs,
# float16 scales), so its kernel computes the int8/uint8/int32 dequantization of opsets 10 and 13.
_LATER_KERNELS = {"DequantizeLinear": ("onnx.reference.ops.op_dequantize_linear", "DequantizeLinear_19")}


def _missing_kernels(model: "onnx.ModelProto") -> list[type]:
    """Kernels (`_LATER_KERNELS`) standing in for standard operators the evaluator lacks at the
    model's opset, none where the installed onnx has its own; and ZipMap (ai.onnx.ml), which it
    lacks at every opset (`zipmap_kernel`)."""
    import importlib

    from onnx.defs import get_schema
    from onnx.reference.ops import load_op

    from zoo_stages.lib.onnx import zipmap_kernel

    opset = next((op.version for op in model.opset_import if op.domain in ("", "ai.onnx")), None)
    found = [zipmap_kernel.kernel()] if zipmap_kernel.uses_zipmap(model) else []
    for op_type, (module, cls) in _LATER_KERNELS.items():
        try:
            schema = get_schema(op_type, opset, "")
        except Exception:  # SchemaError: the operator is not in this opset, so the model cannot use it
            continue
        try:
            load_op("", op_type, opset)
            continue
        except Exception:  # onnx raises RuntimeError for a version it has no kernel for
            pass
        later = getattr(importlib.import_module(module), cls)
        # the evaluator matches kernels by class name, and takes their attributes from `op_schema`
        # (else the latest schema's: opset 25's block_size and output_dtype, which opset 19's kernel refuses)
        found.append(type(op_type, (later,), {"op_domain": "", "op_schema": schema}))
    return found


def _summary(e: Exception) -> str:
    """The error in one line (the evaluator's messages list the kernels it has over several)."""
    text = " ".join(str(e).split())
    return (text[:297] + "...") if len(text) > 300 else text or type(e).__name__


class ReferenceSession:
    """`onnx.reference.ReferenceEvaluator` over a model, with onnxruntime's session interface.

    StageFailed when the evaluator cannot load the model (an operator or domain it lacks) or
    fails running it; `name` names the model in those messages.
    """

    def __init__(self, model: "onnx.ModelProto", name: str = "the model"):
        from onnx.reference import ReferenceEvaluator

        self.name = name
        try:
            self._evaluator = ReferenceEvaluator(model, new_ops=_missing_kernels(model) or None)
        except Exception as e:  # NotImplementedError, RuntimeError, KeyError...: all mean "cannot run it"
            raise StageFailed(f"onnx's reference evaluator cannot load {name}: {_summary(e)}",
                              hint=RUN_HINT) from None
        # an initializer listed as a graph input (IR < 4) is a default, not an input to feed; as in onnxruntime
        constants = {t.name for t in model.graph.initializer} | {t.values.name for t in model.graph.sparse_initializer}
        self._inputs = [_port(v) for v in model.graph.input if v.name not in constants]
        self._outputs = [_port(v) for v in model.graph.output]

    def get_inputs(self) -> list[_Port]:
        return list(self._inputs)

    def get_outputs(self) -> list[_Port]:
        return list(self._outputs)

    def run(self, output_names: Sequence[str] | None, feeds: Mapping[str, Any]) -> list[Any]:
        try:
            return list(self._evaluator.run(list(output_names) if output_names else None, dict(feeds)))
        except Exception as e:  # numpy and the evaluator raise anything; all mean "it did not run"
            raise StageFailed(f"onnx's reference evaluator failed running {self.name}: {_summary(e)}",
                              hint=RUN_HINT) from None


def reference_session(path: Path) -> ReferenceSession:
    """A `ReferenceSession` of the ONNX model at `path`, its external data loaded from its folder
    (UnsafePath for a location outside it; InvalidInput for a file that is not ONNX)."""
    from zoo_stages.lib.onnx import onnx_io

    path = Path(path)
    if path.suffix.lower() == ".ort":
        raise InvalidInput(f"{path.name} is in ORT format, which only onnxruntime reads",
                           hint="run the .onnx build it was converted from under the reference evaluator")
    return ReferenceSession(onnx_io.load_model(path), name=path.name)


def run_reference(path: Path, feeds: Mapping[str, Any], *, batch_size: int | None = DEFAULT_BATCH,
                  outputs: Sequence[str] | None = None) -> dict[str, "np.ndarray"]:
    """{output name: array} of the model at `path` under onnx's reference evaluator, over every
    sample of `feeds` ({input name: array}, samples along axis 0), `batch_size` at a time (None:
    all at once). A fixed batch dimension is fed whole, the last batch padded (`onnx_run.run`).
    `outputs` picks outputs by name (default: all)."""
    from zoo_stages.lib.runtimes import onnx_run

    return onnx_run.run(reference_session(path), feeds, batch_size=batch_size, outputs=outputs)


@dataclass(frozen=True)
class ReferenceCheck:
    """How a model's test vectors ran under the reference evaluator.

    `passed` when every set ran and its outputs matched the stored ones; `detail` says over
    what, or names the set and output that failed; `error` is set when the evaluator could not
    run the model at all. `max_abs` is the largest float difference over the sets compared.
    """

    passed: bool
    sets: int
    samples: int
    max_abs: float
    detail: str
    seconds: float
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The record a manifest or report stores."""
        max_abs = self.max_abs if math.isfinite(self.max_abs) else None  # a missing output's; JSON has no inf
        out: dict[str, Any] = {"passed": self.passed, "sets": self.sets, "samples": self.samples,
                               "max_abs": max_abs, "detail": self.detail, "seconds": round(self.seconds, 3)}
        if self.error is not None:
            out["error"] = self.error
        return out

    def require(self, what: str = "the model") -> None:
        """Raise unless it passed: StageFailed when the evaluator could not run `what`,
        GateFailed when its outputs differ from the stored ones."""
        if self.passed:
            return
        if self.error is not None:
            raise StageFailed(f"{what}: {self.error}", hint=RUN_HINT)
        raise GateFailed(f"{what}: its test vectors do not hold under onnx's reference evaluator: {self.detail}",
                         hint="the stored outputs came from onnxruntime: an operator the two runtimes compute "
                              "differently, or a tolerance too tight for the model's precision (float16 needs "
                              "about 1e-2)")


def check_vectors(path: Path, set_dirs: Sequence[Path], *, quantized: bool,
                  tolerance: Tolerance = DEFAULT_TOLERANCE, batch_size: int | None = DEFAULT_BATCH) -> ReferenceCheck:
    """Run each test data set's inputs (``test_data_set_N``, `vectors.find_sets`) through the model
    at `path` under the reference evaluator and compare the outputs with the stored ones.

    Float outputs pass within `tolerance`, integer, boolean and string outputs exactly; with
    `quantized` (a QDQ or integer-op model) outputs outside `tolerance` still pass at the
    quantized bar (mean cosine, `equivalence.judge_outputs`). Stops at the first set that fails.
    No sets is a failure: nothing was shown to run. Unreadable vectors and unsafe external data
    raise (InvalidInput, UnsafePath); the evaluator's own failures are recorded in `error`.
    """
    from zoo_stages.lib.runtimes import onnx_run
    from zoo_stages.lib.release.vectors import read_test_vectors

    start = time.perf_counter()
    sets = [Path(s) for s in set_dirs]

    def result(passed: bool, detail: str, *, done: int, samples: int, max_abs: float,
               error: str | None = None) -> ReferenceCheck:
        return ReferenceCheck(passed=passed, sets=done, samples=samples, max_abs=max_abs, detail=detail,
                              seconds=time.perf_counter() - start, error=error)

    if not sets:
        return result(False, "no test vectors (test_data_set_*) to run", done=0, samples=0, max_abs=0.0)
    vectors = [(s, *read_test_vectors(s)) for s in sets]  # unreadable vectors fail before the slow part
    try:
        session = reference_session(path)
    except StageFailed as e:
        return result(False, e.message, done=0, samples=0, max_abs=0.0, error=e.message)
    samples, max_abs = 0, 0.0
    outputs = [o.name for o in session.get_outputs()]
    for done, (set_dir, inputs, stored) in enumerate(vectors, start=1):
        if not stored:
            raise InvalidInput(f"{set_dir} holds no output_0.pb", hint="re-run the stage that wrote the vectors")
        unknown = [name for name in stored if name not in outputs]
        if unknown:
            raise InvalidInput(f"{set_dir.name} holds outputs {', '.join(map(repr, unknown))}, which the model "
                               f"{Path(path).name} does not have", hint=f"its outputs are {', '.join(outputs)}")
        try:
            got = onnx_run.run(session, inputs, batch_size=batch_size, outputs=list(stored), where=set_dir.name)
        except StageFailed as e:
            return result(False, f"{set_dir.name}: {e.message}", done=done - 1, samples=samples, max_abs=max_abs,
                          error=e.message)
        passed, line, figure = _judge(stored, got, quantized=quantized, tolerance=tolerance)
        samples += onnx_run.sample_count(inputs)
        max_abs = max(max_abs, figure)
        if not passed:
            return result(False, f"{set_dir.name}: {line}", done=done, samples=samples, max_abs=max_abs)
    rule = f"{tolerance.describe(False)}{' or the quantized bar' if quantized else ''}"
    return result(True, f"{len(vectors)} set(s), {samples} sample(s) within {rule}; max_abs {max_abs:.3g}",
                  done=len(vectors), samples=samples, max_abs=max_abs)


def _judge(stored: Mapping[str, Any], got: Mapping[str, Any], *, quantized: bool,
           tolerance: Tolerance) -> tuple[bool, str, float]:
    """(passed, a line naming the outputs that failed, max_abs) for one set's outputs."""
    from zoo_stages.lib.quality import equivalence, parity

    report = parity.compare(stored, got, tolerance=tolerance)
    if report.passed:
        return True, "", report.max_abs
    if quantized:
        passed, line = equivalence.judge_outputs(stored, got, quantized=True, tolerance=tolerance)
        if passed:
            return True, "", report.max_abs
        # the quantized bar is the mean cosine over outputs: name those below it, and exact ones that differ
        failing = [o for o in report.outputs if o.note or (o.exact and not o.passed) or
                   (not o.exact and not (o.cosine is not None and o.cosine >= equivalence.QUANTIZED_MIN_COSINE))]
    else:
        line = f"outside {tolerance.describe(False)}"
        failing = [o for o in report.outputs if not o.passed]
    named = "; ".join(_describe(o) for o in failing) or "outputs"
    return False, f"{named}: {line}", report.max_abs


def _describe(o: Any) -> str:
    """One failing output (`parity.OutputParity`) in a line."""
    if o.note:
        return f"output {o.name!r} ({o.note})"
    if o.exact:
        return f"output {o.name!r} ({o.violations}/{o.elements} elements differ)"
    return (f"output {o.name!r} (max_abs {o.max_abs:.3g}, cosine {o.cosine:.6f}, "
            f"{o.violations}/{o.elements} elements outside)")
