"""Equivalence of two builds of one stage's outputs made from the same inputs on CPUs of different
platform classes (zoo/host.py): what the built-in kinds answer to `StageKind.equivalence`, for
`zoo repro --check` on a platform the lockfile has no records for.

Why not weights within a tolerance: measured on lenet-digits, the checkpoint trained on an AVX2
CPU and on an AVX-512 one differ by 0.22 in a weight after 10 epochs (each step's rounding feeds
the next), and one quantized model's scales decide which int8 values its weights get; even one
int8 model computes other logits on AVX2 and on AVX-512 VNNI kernels (max-abs 2.4, mean cosine
0.9988, held-out accuracy 0.9194 and 0.9361: tests/data/cross_platform/README.md). What must
agree is what the models *do*, so each kind of file is judged by that, and every line says which
kind of equivalence it judged:

- models (``.onnx``; ``.ort``, whose graph onnx cannot read): the same graph structure (ops,
  topology, attributes, input/output and initializer names, types and shapes; not the weights'
  values, nor metadata and doc strings, which are provenance naming the other build's digests),
  and the same **outputs** on the same inputs (onnxruntime): the test vectors beside the model
  when it has them (``test_data_set_*``, as deploy ships them), else `SEEDED_SAMPLES` seeded
  inputs made from the model's declared input shapes and types (dynamic dimensions other than the
  batch: `DYNAMIC_SIZE`). A float model's outputs must agree within `MODEL_TOLERANCE` (that of a
  converted model); a quantized model's (QDQ or integer ops), whose int8 kernels differ by CPU,
  within the bar a quantized build must meet against fp32 elsewhere in zoo: mean cosine at least
  `QUANTIZED_MIN_COSINE` (quantize's ``accept.min_cosine``). Top-1 agreement and max-abs are
  reported;
- test vectors (``input_K.pb``, ``output_K.pb``): inputs within `MODEL_TOLERANCE`; outputs, which
  the other CPU's kernels computed, within it or, failing that, by the quantized bar (the models
  that made them are judged by the stages that built them);
- ``.json``: quality metrics (`zoo_stages.lib.quality.tasks`: accuracy, macro_f1, mae, perplexity...
  and their ``_drop`` / ``_increase``) within the quality tolerance
  (`EquivalenceContext.quality_tolerance`: an absolute change for scores in [0, 1], relative for
  error metrics and perplexity, absolute for perplexity_increase, a ratio already); parity figures
  against a reference computed on each machine (max_abs, cosine, top1_agreement, a generative
  build's greedy agreement...) are reported, not judged; every other float within `MODEL_TOLERANCE`, integers (counts, sizes) and every other
  value exact;
- ``.npz`` / ``.npy`` / ``.safetensors`` / ``.pt``: the arrays within `MODEL_TOLERANCE` (the train
  kind judges its checkpoint by held-out quality instead: `zoo_stages.lib.quality.training_quality`);
- files a kind names in `derived` (records of the other outputs' digests: zoo.lock, provenance,
  cards) are listed as not compared; any other file whose bytes differ is not equivalent.
"""

from __future__ import annotations

import fnmatch
import json
import re
from pathlib import Path
from typing import Any, Mapping

from zoo.stage import Equivalence
from zoo_stages.lib.quality.parity import Tolerance

MODEL_TOLERANCE = Tolerance(atol=1e-4, rtol=1e-3)  # a float model's outputs on other kernels (a conversion's)
QUANTIZED_MIN_COSINE = 0.99  # quantize's accept.min_cosine: what a quantized build keeps to fp32
QUALITY_TOLERANCE = 0.01  # EquivalenceContext's default: one point of accuracy
SEEDED_SAMPLES = 32
SEED = 0
DYNAMIC_SIZE = 8
# ops that make a model quantized: its int8 kernels differ by CPU (VNNI or not) more than float rounding
QUANTIZED_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "ConvInteger",
                           "MatMulInteger", "QGemm", "DynamicQuantizeMatMul", "QAttention"})
# figures of a build against a reference run on the same machine: they move with the kernels
# a generative build's greedy agreement is one too: its continuations against the reference's, on each machine
PARITY_FIGURES = frozenset({"max_abs", "max_rel", "mean_abs", "cosine", "cosine_min", "top1_agreement",
                            "exact_match", "violations", "worst_excess", "passed", "greedy_matched_tokens",
                            "greedy_agreement", "greedy_exact_match"})


def compare_outputs(locked: Mapping[str, Path], rebuilt: Mapping[str, Path], *,
                    tolerance: Tolerance = MODEL_TOLERANCE, derived: tuple[str, ...] = (),
                    quality_tolerance: float = QUALITY_TOLERANCE) -> Equivalence:
    """Whether `rebuilt` is equivalent to `locked` ({output name: file or folder}), file by file."""
    details: list[str] = []
    ok = True
    for name in sorted(set(locked) | set(rebuilt)):
        if name not in locked or name not in rebuilt:
            details.append(f"output {name!r}: only in the {'rebuilt' if name in rebuilt else 'locked'} outputs")
            ok = False
            continue
        old, new = _files(Path(locked[name])), _files(Path(rebuilt[name]))
        for rel in sorted(set(old) | set(new)):
            label = f"{name}/{rel}" if rel else name
            if rel not in old or rel not in new:
                details.append(f"{label}: only in the {'rebuilt' if rel in new else 'locked'} outputs")
                ok = False
                continue
            if old[rel].read_bytes() == new[rel].read_bytes():
                continue
            if any(fnmatch.fnmatch(old[rel].name, pattern) for pattern in derived):
                details.append(f"{label}: not compared (it records the other outputs' digests)")
                continue
            passed, line = compare_file(old[rel], new[rel], tolerance, quality_tolerance=quality_tolerance)
            details.append(f"{label}: {line}")
            ok = ok and passed
    return Equivalence(equivalent=ok, details=tuple(details))


def compare_file(old: Path, new: Path, tolerance: Tolerance = MODEL_TOLERANCE, *,
                 quality_tolerance: float = QUALITY_TOLERANCE) -> tuple[bool, str]:
    """(equivalent, one line) for two versions of one file whose bytes differ."""
    suffix = old.suffix.lower()
    try:
        if suffix in (".onnx", ".ort"):
            return compare_models(old, new, tolerance)
        if suffix == ".pb" and _VECTOR.match(old.name):
            return _compare_vector(old, new, tolerance)
        if suffix == ".json":
            return _compare_json(old, new, tolerance, quality_tolerance)
        reader = _ARRAY_READERS.get(suffix)
        if reader is None:
            return False, "bytes differ and it holds no numbers this check reads"
        (old_arrays, old_rest), (new_arrays, new_rest) = reader(old), reader(new)
    except Exception as e:  # an unreadable file cannot be shown equivalent
        return False, f"cannot read it as {suffix}: {type(e).__name__}: {str(e)[:160]}"
    if old_rest != new_rest or set(old_arrays) != set(new_arrays):
        return False, "not equivalent: the structure differs (keys, strings or non-numeric values), not only the numbers"
    return _arrays_line(old_arrays, new_arrays, tolerance, "arrays")


# -- models -------------------------------------------------------------------------------------

def compare_models(old: Path, new: Path, tolerance: Tolerance = MODEL_TOLERANCE, *,
                   vectors: Path | None = None) -> tuple[bool, str]:
    """Two builds of one model: the same structure, and outputs that agree on the same inputs
    (the test vectors in `vectors`, or beside `old`; else seeded inputs). See the module docstring."""
    from zoo_stages.lib.runtimes import onnx_run, ort_session

    if old.suffix.lower() == ".onnx":
        old_structure, new_structure = _structure(old), _structure(new)
        if old_structure != new_structure:
            return False, "not equivalent: the graphs differ (ops, topology, attributes or tensor shapes)"
        structure = "same graph"
    else:
        structure = "ORT format: graph structure not read"
    quantized = is_quantized(old)
    sessions = [ort_session.make_session(p) for p in (old, new)]
    feeds, origin = _inputs(sessions[0], vectors if vectors is not None else old.parent)
    if [s.name for s in onnx_run.input_specs(sessions[1])] != list(feeds):
        return False, "not equivalent: the models take other inputs"
    ref, got = (onnx_run.run(s, feeds, where=origin) for s in sessions)
    passed, line = judge_outputs(ref, got, quantized=quantized, tolerance=tolerance)
    return passed, line.replace("outputs", f"outputs ({structure}; {origin})", 1)


def judge_outputs(reference: Mapping[str, Any], candidate: Mapping[str, Any], *, quantized: bool,
                  tolerance: Tolerance = MODEL_TOLERANCE) -> tuple[bool, str]:
    """(equivalent, one line) for two builds' outputs on the same inputs ({name: array}): within
    `tolerance`, or for a quantized model a mean cosine of at least `QUANTIZED_MIN_COSINE` (exact
    outputs still exact)."""
    import math

    from zoo_stages.lib.quality import parity as paritylib

    report = paritylib.compare(reference, candidate, tolerance=tolerance)
    figures = _figures(report)
    if report.passed:
        return True, f"equivalent outputs within {tolerance.describe(False)} ({figures})"
    if not quantized:
        return False, f"not equivalent: outputs outside {tolerance.describe(False)} ({figures})"
    exact_ok = all(o.passed for o in report.outputs if o.exact) and not any(o.note for o in report.outputs)
    if exact_ok and not math.isnan(report.cosine) and report.cosine >= QUANTIZED_MIN_COSINE:
        return True, (f"equivalent quantized outputs: mean cosine {report.cosine:.6f} >= {QUANTIZED_MIN_COSINE} "
                      f"({figures})")
    return False, (f"not equivalent: quantized outputs below mean cosine {QUANTIZED_MIN_COSINE}, or exact outputs "
                   f"that differ ({figures})")


def is_quantized(path: Path) -> bool:
    """Whether a model (.onnx, or .ort) has quantized ops (`QUANTIZED_OPS`, QLinear*)."""
    if Path(path).suffix.lower() == ".ort":  # a flatbuffer: op types are stored in it as strings
        data = Path(path).read_bytes()
        return any(op.encode() in data for op in QUANTIZED_OPS) or b"QLinear" in data
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return any(node.op_type in QUANTIZED_OPS or node.op_type.startswith("QLinear") for node in _nodes(model.graph))


def _nodes(graph: Any) -> list[Any]:
    """The nodes of a graph and of its subgraphs (If, Loop, Scan bodies)."""
    found, graphs = [], [graph]
    while graphs:
        current = graphs.pop()
        for node in current.node:
            found.append(node)
            for attr in node.attribute:
                graphs.extend([attr.g] if attr.HasField("g") else [])
                graphs.extend(attr.graphs)
    return found


def _structure(path: Path) -> bytes:
    """The graph without initializer values, metadata or doc strings (what it computes, not with what)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    graphs = [model.graph]
    while graphs:
        graph = graphs.pop()
        for tensor in graph.initializer:
            _strip_values(tensor)
        for node in graph.node:
            node.doc_string = ""
            for attr in node.attribute:
                if attr.HasField("t"):
                    _strip_values(attr.t)
                graphs.extend([attr.g] if attr.HasField("g") else [])
                graphs.extend(attr.graphs)
        graph.doc_string = ""
    del model.metadata_props[:]
    model.doc_string = ""
    model.producer_version = ""
    return model.SerializeToString(deterministic=True)


def _strip_values(tensor: Any) -> None:
    """Keep a tensor's name, type and shape; drop its values (they are judged by the outputs)."""
    for name in ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data",
                 "string_data", "external_data"):
        tensor.ClearField(name)
    tensor.data_location = 0
    tensor.doc_string = ""


def _inputs(session: Any, folder: Path) -> tuple[dict[str, Any], str]:
    """(feeds, where they came from): the test vectors in `folder`, else seeded inputs."""
    import numpy as np

    from zoo_stages.lib.runtimes import onnx_run
    from zoo_stages.lib.release.vectors import find_sets, read_tensors

    names = [s.name for s in onnx_run.input_specs(session)]
    sets = find_sets(folder) if folder.is_dir() else []
    loaded = [read_tensors(s, "input") for s in sets]
    loaded = [tensors for tensors in loaded if len(tensors) == len(names)]
    if loaded:
        feeds = {n: np.concatenate([t[i] for t in loaded]) for i, n in enumerate(names)}
        return feeds, f"{len(loaded)} test vector set(s), {onnx_run.sample_count(feeds)} samples"
    shapes = {s.name: [d if isinstance(d, int) and d > 0 else DYNAMIC_SIZE for d in (s.shape or [])[1:]]
              for s in onnx_run.input_specs(session)}
    feeds = onnx_run.random_feeds(session, onnx_run.fixed_batch(session) or SEEDED_SAMPLES, SEED, shapes)
    return feeds, f"{onnx_run.sample_count(feeds)} seeded inputs (seed {SEED})"


def _figures(report: Any) -> str:
    parts = [f"max-abs {report.max_abs:.3g}", f"mean cosine {report.cosine:.6f}"]
    if report.top1_agreement is not None:
        parts.append(f"top-1 agreement {report.top1_agreement:.4f}")
    return ", ".join(parts)


# -- test vectors -------------------------------------------------------------------------------

_VECTOR = re.compile(r"^(input|output)_\d+\.pb$")


def _compare_vector(old: Path, new: Path, tolerance: Tolerance) -> tuple[bool, str]:
    """One test vector: an input within `tolerance`; an output (which the other CPU's kernels
    computed) within it, or by the quantized bar: the model that computed it is judged by the
    stage that built it, and a test vector does not say whether that model is quantized."""
    from onnx import TensorProto, numpy_helper

    tensors = []
    for path in (old, new):
        proto = TensorProto()
        proto.ParseFromString(path.read_bytes())
        tensors.append((proto.name, numpy_helper.to_array(proto)))
    (old_name, a), (new_name, b) = tensors
    if old_name != new_name:
        return False, f"not equivalent: the tensor is named {new_name!r}, not {old_name!r}"
    passed, line = judge_outputs({old_name: a}, {old_name: b}, quantized=old.name.startswith("output"),
                                 tolerance=tolerance)
    return passed, line.replace("outputs", "input values" if old.name.startswith("input") else "model outputs", 1)


# -- JSON -----------------------------------------------------------------------------------------

def _compare_json(old: Path, new: Path, tolerance: Tolerance, quality_tolerance: float) -> tuple[bool, str]:
    """Quality metrics within `quality_tolerance`, parity figures reported, other numbers within
    `tolerance`, everything else exact."""
    import numpy as np

    from zoo_stages.lib.quality import tasks

    old_numbers, old_shape = _json(old)
    new_numbers, new_shape = _json(new)
    if old_shape != new_shape or set(old_numbers) != set(new_numbers):
        return False, "not equivalent: the structure differs (keys, strings or non-numeric values), not only the numbers"
    quality, figures, other = {}, {}, {}
    for path, (key, value) in old_numbers.items():
        metric = _metric_of(key)
        if metric in tasks.HIGHER_IS_BETTER:
            # a relative change against the reference (perplexity_increase) is a ratio already: judged absolutely
            ratio = metric in tasks.RELATIVE and key == tasks.comparison_name(metric)
            quality[path] = ("" if ratio else metric, float(value), float(new_numbers[path][1]))
        elif key in PARITY_FIGURES or ".parity." in f".{path}":
            figures[path] = (value, new_numbers[path][1])
        else:
            other[path] = (value, new_numbers[path][1])
    lines, ok = [], True
    moved = [(abs(b - a), path, metric, a, b) for path, (metric, a, b) in quality.items()
             if _quality_change(metric, a, b) > quality_tolerance]
    if moved:
        ok = False
        _, path, metric, a, b = min(moved, key=lambda m: (-m[0], m[1]))  # the largest change, first by path
        lines.append(f"quality outside {quality_tolerance:g}: {path} {a:.4f} vs {b:.4f} ({len(moved)} metric(s))")
    elif quality:
        _, path, metric, a, b = min(((abs(b - a), p, m, a, b) for p, (m, a, b) in quality.items()),
                                    key=lambda m: (-m[0], m[1]))
        lines.append(f"equivalent quality within {quality_tolerance:g} (largest change: {path} {a:.4f} vs {b:.4f})")
    if other:
        olds = {p: np.asarray(a) for p, (a, _) in other.items()}
        news = {p: np.asarray(b) for p, (_, b) in other.items()}
        passed, line = _arrays_line(olds, news, tolerance, "other numbers")
        if not passed or not lines:
            lines.append(line.removeprefix("equivalent ") if passed else line.removeprefix("not equivalent: "))
        ok = ok and passed
    if figures:
        largest = max(figures.items(), key=lambda kv: abs(kv[1][1] - kv[1][0]))
        lines.append(f"parity figures reported, not judged (largest change: {largest[0]} {largest[1][0]:.4g} vs "
                     f"{largest[1][1]:.4g})")
    return ok, ("equivalent: " if ok else "not equivalent: ") + "; ".join(lines)


def _metric_of(key: str) -> str:
    """The quality metric a JSON key names (``accuracy``, ``accuracy_drop`` -> accuracy), else ''."""
    from zoo_stages.lib.quality import tasks

    for metric in tasks.HIGHER_IS_BETTER:
        if key in (metric, tasks.comparison_name(metric), f"val_{metric}"):
            return metric
    return ""


def _quality_change(metric: str, a: float, b: float) -> float:
    """How far a quality metric moved: absolute for scores (accuracy, f1, r2: higher is better),
    relative for errors (mae, rmse), whose scale is the data's."""
    from zoo_stages.lib.quality import tasks

    if not metric or tasks.HIGHER_IS_BETTER[metric]:  # "": a ratio (perplexity_increase)
        return abs(b - a)
    return abs(b - a) / max(abs(a), 1e-12)


def _json(path: Path) -> tuple[dict[str, tuple[str, int | float]], Any]:
    """({JSON path: (its key, number)}, the document with numbers blanked out). In a list of
    gates, a gate's value takes the metric its text names as its key."""
    numbers: dict[str, tuple[str, float]] = {}

    def walk(value: Any, where: str, key: str) -> Any:
        if isinstance(value, bool) or value is None or isinstance(value, str):
            return value
        if isinstance(value, (int, float)):
            numbers[where] = (key, value)  # an int stays one: counts and sizes are compared exactly
            return "#"
        if isinstance(value, list):
            return [walk(v, f"{where}[{i}]", key) for i, v in enumerate(value)]
        gate_metric = _gate_metric(value.get("gate")) if isinstance(value.get("gate"), str) else None
        return {k: walk(v, f"{where}.{k}" if where else k, gate_metric if (k == "value" and gate_metric) else k)
                for k, v in sorted(value.items())}

    shape = walk(json.loads(path.read_text(encoding="utf-8")), "", "")
    return numbers, shape


def _gate_metric(gate: str) -> str | None:
    """The metric of a gate's text: 'cpu-int8.accuracy_drop <= 0.02' -> 'accuracy_drop'."""
    m = re.match(r"^\s*[^.\s]+\.(\w+)", gate)
    return m.group(1) if m else None


# -- arrays -------------------------------------------------------------------------------------

def _arrays_line(old: Mapping[str, Any], new: Mapping[str, Any], tolerance: Tolerance, what: str) -> tuple[bool, str]:
    from zoo_stages.lib.quality import parity

    report = parity.compare(old, new, tolerance=tolerance, samples=len(old))
    failing = [o.name for o in report.outputs if not o.passed]
    figures = f"max-abs {report.max_abs:.3g}, max-rel {report.max_rel:.3g} over {len(old)} {what}"
    if failing:
        return False, f"not equivalent: {', '.join(failing[:3])} outside {tolerance.describe(False)} ({figures})"
    return True, f"equivalent {what} within {tolerance.describe(False)} ({figures})"


def _files(path: Path) -> dict[str, Path]:
    if path.is_dir():
        return {p.relative_to(path).as_posix(): p for p in sorted(path.rglob("*")) if p.is_file()}
    return {"": path}


def _npz(path: Path) -> tuple[dict[str, Any], Any]:
    import numpy as np

    with np.load(path, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}, None


def _npy(path: Path) -> tuple[dict[str, Any], Any]:
    import numpy as np

    return {"array": np.load(path, allow_pickle=False)}, None


def _safetensors(path: Path) -> tuple[dict[str, Any], Any]:
    from safetensors.numpy import load_file

    return dict(load_file(str(path))), None


def _torch(path: Path) -> tuple[dict[str, Any], Any]:
    import torch

    state = torch.load(str(path), map_location="cpu", weights_only=True)
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    arrays, rest = {}, {}
    for k, v in (state.items() if isinstance(state, dict) else [("value", state)]):
        if isinstance(v, torch.Tensor):
            arrays[str(k)] = v.detach().float().numpy() if v.is_floating_point() else v.numpy()
        else:
            rest[str(k)] = repr(v)
    return arrays, rest


_ARRAY_READERS = {".npz": _npz, ".npy": _npy, ".safetensors": _safetensors, ".pt": _torch, ".pth": _torch}
