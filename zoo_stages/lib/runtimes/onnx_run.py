"""Running an onnxruntime session on named inputs, in batches along the sample axis (or any
session with its interface: `reference_run.ReferenceSession`, onnx's reference evaluator).

A model has N named inputs and M named outputs of any tensor type. Feeds are a dict
``{input name: array}`` whose arrays all hold the samples along axis 0 (an input of rank 0 is
a constant, given whole to every batch); results are a dict ``{output name: array}`` in the
model's output order, batches concatenated along axis 0. A sequence of maps (a classifier's
ZipMap, ``list[{class: probability}]``) comes back as a float32 (samples, classes) matrix, columns
the classes sorted (`zoo_stages.lib.quality.class_maps`); its spec keeps onnxruntime's type name.

- `input_specs` / `output_specs`: name, numpy element type and shape (ints for fixed dims,
  strings for symbolic ones, None for unknown ones) of a session's ports;
- `prepare`: check feeds against the inputs (names, element kind, rank, fixed dims, one sample
  count) and cast them to the input's element type;
- `run`: all outputs over every sample, `batch_size` samples at a time (all at once by
  default); a model whose batch dimension is fixed is fed exactly that many samples, the last
  batch padded with copies of its last sample (their outputs are dropped);
- `random_feeds`: seeded inputs for models without data (floats uniform in [0, 1), integers 0
  or 1, booleans True: values any index, id or mask input accepts);
- `declared_shapes`: per-sample shapes from the recipe's ``model.inputs``, for `random_feeds`;
- `bind` / `bind_names`: a dataset's named features as the feeds of a model's inputs (a session's,
  or a torch model's by input names);
- `single_input`: for kinds that still handle single-input models only.

A "session" is anything with onnxruntime's ``get_inputs()``/``get_outputs()``/``run()``:
`zoo_stages.lib.runtimes.openvino_build.CompiledSession` gives an OpenVINO compiled model that
interface, so both runtimes are fed by these rules. numpy is imported inside functions so
importing this module is cheap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from zoo.errors import InvalidInput, StageFailed, ZooError

if TYPE_CHECKING:
    import numpy as np

# onnxruntime spells element types "tensor(float)"; numpy's names are used everywhere else
_ORT_TYPES = {
    "float": "float32", "double": "float64", "float16": "float16", "bfloat16": "bfloat16",
    "int8": "int8", "uint8": "uint8", "int16": "int16", "uint16": "uint16", "int32": "int32",
    "uint32": "uint32", "int64": "int64", "uint64": "uint64", "bool": "bool", "string": "string",
}


@dataclass(frozen=True)
class TensorSpec:
    """One input or output of a session: name, numpy-style element type, shape."""

    name: str
    dtype: str  # "float32", "int64", "bool", ...; non-tensor ports keep onnxruntime's spelling
    shape: tuple[int | str | None, ...] | None  # () for a scalar or an unknown rank (onnxruntime tells neither apart)

    @property
    def fixed_batch(self) -> int | None:
        """The fixed size of the first dimension, or None when it is dynamic (or there is none)."""
        first = self.shape[0] if self.shape else None
        return first if isinstance(first, int) and first > 0 else None


def dtype_name(ort_type: str) -> str:
    """numpy-style element type name of an onnxruntime type (``tensor(float)`` -> ``float32``)."""
    inner = ort_type[len("tensor("):-1] if ort_type.startswith("tensor(") else ort_type
    return _ORT_TYPES.get(inner, inner)


def _spec(arg: Any) -> TensorSpec:
    shape = None if arg.shape is None else tuple(
        d if isinstance(d, (int, str)) or d is None else str(d) for d in arg.shape)
    return TensorSpec(name=arg.name, dtype=dtype_name(arg.type), shape=shape)


def input_specs(session: Any) -> list[TensorSpec]:
    """The session's inputs, in order."""
    return [_spec(a) for a in session.get_inputs()]


def output_specs(session: Any) -> list[TensorSpec]:
    """The session's outputs, in order."""
    return [_spec(a) for a in session.get_outputs()]


def single_input(session: Any) -> TensorSpec:
    """The session's only input; InvalidInput for a model with several."""
    specs = input_specs(session)
    if len(specs) != 1:
        names = ", ".join(s.name for s in specs)
        raise InvalidInput(f"the model has {len(specs)} inputs ({names}); this stage handles single-input models only")
    return specs[0]


def declared_shapes(session: Any, declared: Mapping[str, Mapping[str, Any]] | None, *,
                    sequence: int = 1) -> dict[str, list[int]]:
    """Per-sample shapes (batch axis dropped) of the inputs the recipe declares in ``model.inputs``.

    A named (dynamic) dimension other than the batch becomes `sequence` (at least 1), so a
    declared ``[batch, sequence]`` gives ``[sequence]``. InvalidInput when the recipe names an
    input the model does not have, or declares a rank the model contradicts.
    """
    if not declared:
        return {}
    specs = {s.name: s for s in input_specs(session)}
    unknown = [n for n in declared if n not in specs]
    if unknown:
        raise InvalidInput(f"model.inputs names {', '.join(map(repr, unknown))}, which the model does not take",
                           hint=f"the model's inputs are {', '.join(specs)}")
    shapes: dict[str, list[int]] = {}
    for name, entry in declared.items():
        dims = list(entry.get("shape") or [])
        model_shape = specs[name].shape
        if model_shape and len(model_shape) != len(dims):
            raise InvalidInput(f"model.inputs.{name}.shape has {len(dims)} dimensions, the model's input has "
                               f"{len(model_shape)} ({_dims(model_shape)})",
                               hint="declare one dimension per model dimension, the batch first")
        shapes[name] = [d if isinstance(d, int) else max(1, int(sequence)) for d in dims[1:]]
    return shapes


def bind(session: Any, features: Mapping[str, Any], *, where: str = "the data") -> dict[str, Any]:
    """The feeds for the session's inputs from a dataset's named `features` (`bind_names`)."""
    return bind_names([s.name for s in input_specs(session)], features, where=where)


def bind_names(inputs: Sequence[str], features: Mapping[str, Any], *, where: str = "the data") -> dict[str, Any]:
    """{input name: feature} for a model whose inputs are `inputs`, in that order.

    Each input takes the feature of its own name; a model with one input takes the only
    feature whatever its name (an image dataset's ``image`` feeds a model input ``input``).
    Features the model does not take are left out. InvalidInput names an input without data.
    Also what train uses to feed a torch model the data's features.
    """
    if len(inputs) == 1 and len(features) == 1:
        return {inputs[0]: next(iter(features.values()))}
    missing = [name for name in inputs if name not in features]
    if missing:
        raise InvalidInput(f"{where} has no values for model input(s) {', '.join(missing)} "
                           f"(it has: {', '.join(features) or 'nothing'})",
                           hint="name the data's arrays or columns after the model's inputs "
                                f"({', '.join(inputs)})")
    return {name: features[name] for name in inputs}


def fixed_batch(session: Any) -> int | None:
    """The batch size the model's inputs fix (their first dimension), or None when it is dynamic."""
    fixed = {s.fixed_batch for s in input_specs(session) if s.shape} - {None}
    if len(fixed) > 1:
        raise InvalidInput(f"the model's inputs fix different batch sizes ({', '.join(map(str, sorted(fixed)))})",
                           hint="every input must hold the samples along its first dimension")
    return fixed.pop() if fixed else None


def _numpy_dtype(spec: TensorSpec) -> "np.dtype":
    import numpy as np

    if spec.dtype == "string":
        return np.dtype(object)
    try:
        return np.dtype(spec.dtype)
    except TypeError:
        raise InvalidInput(f"model input {spec.name!r} has element type {spec.dtype!r}, which numpy cannot hold",
                           hint="only models with numpy-compatible tensor inputs can be run") from None


def _dims(shape: Sequence[Any]) -> str:
    return "x".join(str(d) if isinstance(d, int) and d > 0 else "?" for d in shape)


def prepare(session: Any, feeds: Mapping[str, Any], *, where: str = "the inputs") -> dict[str, "np.ndarray"]:
    """`feeds` checked against the session's inputs and cast to their element types (contiguous).

    InvalidInput when an input has no value or a value names no input, when an element type
    cannot be cast without changing kind (a float into an integer input), when a rank or a
    fixed dimension other than the batch differs, or when batched inputs hold different
    numbers of samples. `where` names the feeds' origin in messages ("the held-out split").
    """
    import numpy as np

    specs = input_specs(session)
    names = [s.name for s in specs]
    missing = [n for n in names if n not in feeds]
    if missing:
        raise InvalidInput(f"no values for model input(s) {', '.join(missing)}",
                           hint=f"the model expects inputs {', '.join(names)}")
    unknown = [n for n in feeds if n not in names]
    if unknown:
        raise InvalidInput(f"{where}: values for {', '.join(unknown)}, which the model does not take as inputs",
                           hint=f"the model expects inputs {', '.join(names)}")
    out: dict[str, np.ndarray] = {}
    counts: dict[str, int] = {}
    for spec in specs:
        value = np.asarray(feeds[spec.name])
        want = _numpy_dtype(spec)
        if want != object and not np.can_cast(value.dtype, want, casting="same_kind"):
            raise InvalidInput(f"{where}: {value.dtype} values for model input {spec.name!r}, which takes {spec.dtype}")
        if spec.shape:  # onnxruntime reports an unknown rank as [] too: only a known rank is checked
            fixed = spec.shape[1:]
            if len(spec.shape) != value.ndim or any(isinstance(w, int) and w > 0 and w != h
                                                    for w, h in zip(fixed, value.shape[1:])):
                raise InvalidInput(f"{where}: samples of shape {_dims(value.shape[1:])} but the model input "
                                   f"{spec.name!r} expects {_dims(fixed)}",
                                   hint="make the data match the model's input (for images: data.channels / "
                                        "data.image_size in the recipe)")
        out[spec.name] = np.ascontiguousarray(value, dtype=want)
        if value.ndim > 0:
            counts[spec.name] = int(value.shape[0])
    if len(set(counts.values())) > 1:
        shown = ", ".join(f"{n}: {c}" for n, c in counts.items())
        raise InvalidInput(f"{where}: different numbers of samples per input ({shown})",
                           hint="every input holds the samples along its first dimension")
    return out


def sample_count(feeds: Mapping[str, "np.ndarray"]) -> int:
    """The number of samples in (prepared) feeds: the common first dimension, 1 without one."""
    counts = [int(a.shape[0]) for a in feeds.values() if a.ndim > 0]
    return counts[0] if counts else 1


def run_once(session: Any, feeds: Mapping[str, "np.ndarray"], outputs: Sequence[str] | None = None) -> list:
    """One `session.run` on prepared feeds; onnxruntime's failures become StageFailed (a session
    that raises a zoo error itself, like openvino_build.CompiledSession or reference_run's
    ReferenceSession, keeps its own message)."""
    try:
        return session.run(list(outputs) if outputs else None, dict(feeds))
    except ZooError:  # a session of another runtime (OpenVINO's, the reference evaluator's) names its own failure
        raise
    except Exception as e:  # onnxruntime raises Fail/InvalidArgument/RuntimeException from C++
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise StageFailed(f"onnxruntime failed running the model: {first}",
                          hint="the model may need inputs of another shape or type") from None


def run(session: Any, feeds: Mapping[str, Any], *, batch_size: int | None = None,
        outputs: Sequence[str] | None = None, where: str = "the inputs") -> dict[str, "np.ndarray"]:
    """{output name: array} over every sample of `feeds`, run `batch_size` samples at a time.

    `batch_size` None runs all samples at once; a model with a fixed batch dimension is always
    fed exactly that many (the last batch padded with its last sample, whose outputs are
    dropped). `outputs` picks outputs by name (default: all, in the model's order). An output
    without a batch axis cannot be split into batches: it is returned as it is from a single
    run, and InvalidInput when the samples needed several.
    """
    import numpy as np

    prepared = prepare(session, feeds, where=where)
    names = list(outputs) if outputs else [o.name for o in session.get_outputs()]
    n = sample_count(prepared)
    if n == 0:
        raise InvalidInput(f"{where}: no samples to run the model on")
    fixed = fixed_batch(session)
    step = fixed or (max(1, int(batch_size)) if batch_size else n)
    batched = {k: v for k, v in prepared.items() if v.ndim > 0}
    chunks: list[tuple[int, int, list]] = []  # (samples, samples fed, outputs)
    for start in range(0, n, step):
        batch = {k: v[start:start + step] for k, v in batched.items()}
        real = min(step, n - start)
        fed = real
        if fixed and real < fixed:  # pad with copies of the last sample
            batch = {k: np.concatenate([v, np.repeat(v[-1:], fixed - real, axis=0)]) for k, v in batch.items()}
            fed = fixed
        chunks.append((real, fed, run_once(session, {**prepared, **batch}, names)))
    from zoo_stages.lib.quality import class_maps

    result: dict[str, np.ndarray] = {}
    for i, name in enumerate(names):
        maps = class_maps.join([(real, out[i]) for real, _, out in chunks])
        if maps is not None:  # a sequence of {class: score} maps (ZipMap): one per-class matrix, keys sorted
            result[name] = maps
            continue
        parts = [(real, fed, np.asarray(out[i])) for real, fed, out in chunks]
        if len(parts) == 1 and parts[0][0] == parts[0][1]:
            result[name] = parts[0][2]
            continue
        if any(a.ndim == 0 or a.shape[0] != fed for _, fed, a in parts):
            raise InvalidInput(f"model output {name!r} has no batch axis (shape {list(parts[0][2].shape)}), so "
                               "the model cannot be run in batches",
                               hint="run it on one batch of samples")
        result[name] = np.concatenate([a[:real] for real, _, a in parts], axis=0)
    return result


def random_feeds(session: Any, samples: int, seed: int, shapes: Mapping[str, Sequence[int]] | None = None, *,
                 hint: str = "set `input_shape:` (e.g. [1, 3, 224, 224]) in the stage config") -> dict[str, "np.ndarray"]:
    """Seeded feeds of `samples` samples for every input of the session, in input order.

    Per-sample shapes come from `shapes` (input name -> shape without the batch axis) or from
    the model's fixed dimensions; InvalidInput (with `hint`) when a dimension is dynamic. Values
    come from one generator seeded with `seed`, input after input: floats uniform in [0, 1),
    integers 0 or 1 (valid for any index or id input), booleans True (a mask that hides
    nothing: an all-False row would make attention-like models divide by zero).
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for spec in input_specs(session):
        per_sample = (shapes or {}).get(spec.name)
        if per_sample is None:
            dims = list(spec.shape[1:]) if spec.shape else []
            if not spec.shape or any(not (isinstance(d, int) and d > 0) for d in dims):
                raise InvalidInput(f"input {spec.name!r} has dynamic dimensions {list(spec.shape or [])}; "
                                   "cannot invent test inputs", hint=hint)
            per_sample = dims
        shape = (int(samples), *(int(d) for d in per_sample))
        dtype = _numpy_dtype(spec)
        if np.issubdtype(dtype, np.floating):
            draw = rng.random(shape, dtype=np.float64 if dtype == np.float64 else np.float32)
            feeds[spec.name] = draw.astype(dtype, copy=False)
        elif dtype == np.bool_:
            feeds[spec.name] = np.ones(shape, dtype=bool)
        elif np.issubdtype(dtype, np.integer):
            feeds[spec.name] = rng.integers(0, 2, shape).astype(dtype)
        else:
            raise InvalidInput(f"input {spec.name!r} takes {spec.dtype} values; cannot invent test inputs", hint=hint)
    return feeds
