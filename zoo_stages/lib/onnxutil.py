"""ONNX helpers shared by the optimize, quantize and verify kinds.

- loading with safety: external-data locations must stay inside the model's folder
  (`zoo.pathsafety.external_data_files`), and the IR version is lowered to what the installed
  onnxruntime reads (`MAX_IR_VERSION`);
- saving atomically (`zoo.files.atomic_write`) with deterministic protobuf bytes;
- onnxruntime sessions with fixed thread counts and deterministic compute;
- running models (batched, respecting a fixed batch dimension), comparing outputs;
- latency (p50/p90 after warm-up) and throughput at several batch sizes;
- a description of the host CPU for reports.

numpy, onnx and onnxruntime are imported inside functions so importing this module is cheap.
"""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from zoo.errors import InvalidInput

if TYPE_CHECKING:
    import numpy as np
    import onnx
    import onnxruntime as ort

# onnx 1.23 stamps IR version 14; onnxruntime 1.31 loads at most 13.
MAX_IR_VERSION = 13

# protobuf cannot serialise a message above 2 GiB; such models need external data.
_PROTOBUF_LIMIT = (1 << 31) - 1

OPT_LEVELS = ("disable", "basic", "extended", "all")


# ---------------------------------------------------------------------------------------------
# load / save


def loadable_as_is(path: Path) -> bool:
    """Whether onnxruntime can load the file at `path` directly: its IR version is at most
    `MAX_IR_VERSION`. Its external data must be files in its folder (UnsafePath, InvalidInput).

    Only the top-level fields and the tensors' external-data records are read, never the
    weights, so this costs microseconds where `load_model` parses the whole file.
    """
    from zoo.pathsafety import external_data_files
    from zoo_stages.lib import onnx_fields

    path = Path(path)
    if not path.is_file():
        raise InvalidInput(f"ONNX model {path} does not exist", hint="check the upstream stage's `model` output")
    header = onnx_fields.read_header(path)
    external_data_files(path)
    return header.ir_version is not None and header.ir_version <= MAX_IR_VERSION


def fix_ir_version(model: "onnx.ModelProto") -> "onnx.ModelProto":
    """Lower the model's IR version to `MAX_IR_VERSION` (in place) so onnxruntime can load it."""
    if model.ir_version > MAX_IR_VERSION:
        model.ir_version = MAX_IR_VERSION
    return model


def load_model(path: Path) -> "onnx.ModelProto":
    """Load an ONNX model fully into memory, checking external data paths and fixing the IR version.

    Raises InvalidInput for a missing or unparsable file and UnsafePath for external data
    that would escape the model's folder.
    """
    import onnx
    from onnx.external_data_helper import load_external_data_for_model

    from zoo.pathsafety import external_data_files

    path = Path(path)
    if not path.is_file():
        raise InvalidInput(f"ONNX model {path} does not exist", hint="check the upstream stage's `model` output")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # protobuf raises DecodeError, onnx raises its own; all mean "not a model"
        raise InvalidInput(f"{path} is not a readable ONNX model: {e}") from None
    if external_data_files(path):
        load_external_data_for_model(model, str(path.parent))
    return fix_ir_version(model)


def model_bytes(model: "onnx.ModelProto") -> bytes:
    """Deterministic serialisation of a model (IR version fixed), refusing models above 2 GiB."""
    fix_ir_version(model)
    try:
        return model.SerializeToString(deterministic=True)
    except Exception:  # protobuf raises ValueError/EncodeError depending on its backend
        size = model.ByteSize()  # only computed on failure: it costs as much as serialising
        if size > _PROTOBUF_LIMIT:
            raise InvalidInput(f"the model is {size / 2**30:.1f} GiB, above protobuf's 2 GiB limit",
                               hint="models this large need ONNX external data, which this stage does not write") from None
        raise


def save_model(model: "onnx.ModelProto", path: Path) -> Path:
    """Atomically save `model` as one self-contained .onnx file (IR version ≤ MAX_IR_VERSION)."""
    from zoo.files import atomic_write

    return atomic_write(Path(path), model_bytes(model), fsync=False)  # the cache fsyncs outputs it commits


def as_model(model: "onnx.ModelProto | Path | str | bytes") -> "onnx.ModelProto":
    """A ModelProto from a proto, a path (loaded safely) or serialised bytes."""
    import onnx

    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, (bytes, bytearray)):
        return fix_ir_version(onnx.load_from_string(bytes(model)))
    return load_model(Path(model))


def _graph_domains(graph) -> set[str]:
    found = set()
    for node in graph.node:
        found.add(node.domain)
        for attr in node.attribute:
            if attr.HasField("g"):
                found |= _graph_domains(attr.g)
            for g in attr.graphs:
                found |= _graph_domains(g)
    return found


def prune_opset_imports(model: "onnx.ModelProto") -> "onnx.ModelProto":
    """Drop opset imports no node uses and sort the rest (in place).

    onnxruntime's optimizer and quantizer declare every domain they know (training, aten,
    nchwc...); keeping only the used ones makes the file smaller, stable and honest about
    which runtimes can load it. The default domain is always kept.
    """
    used = _graph_domains(model.graph)
    for function in model.functions:
        used.add(function.domain)
        for node in function.node:
            used.add(node.domain)
    used = {"" if d == "ai.onnx" else d for d in used} | {""}
    keep = sorted({(op.domain, op.version) for op in model.opset_import
                   if ("" if op.domain == "ai.onnx" else op.domain) in used})
    del model.opset_import[:]
    for domain, version in keep:
        entry = model.opset_import.add()
        entry.domain, entry.version = domain, version
    return model


def opset_version(model: "onnx.ModelProto") -> int | None:
    """The model's default-domain opset version."""
    for op in model.opset_import:
        if op.domain in ("", "ai.onnx"):
            return int(op.version)
    return None


def custom_domains(model: "onnx.ModelProto") -> list[str]:
    """Operator domains other than the standard ONNX one used by the graph's nodes (e.g. com.microsoft)."""
    return sorted({n.domain for n in model.graph.node if n.domain not in ("", "ai.onnx")})


def op_counts(model: "onnx.ModelProto") -> dict[str, int]:
    """Number of nodes per operator type (domain-qualified for non-standard domains)."""
    counts: dict[str, int] = {}
    for n in model.graph.node:
        name = n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}"
        counts[name] = counts.get(name, 0) + 1
    return dict(sorted(counts.items()))


# ---------------------------------------------------------------------------------------------
# sessions


def session_options(threads: int = 1, level: str = "all", optimized_path: Path | None = None) -> "ort.SessionOptions":
    """SessionOptions with a fixed intra-op thread count, sequential execution, deterministic compute."""
    import onnxruntime as ort

    if level not in OPT_LEVELS:
        raise InvalidInput(f"unknown graph optimization level {level!r}", hint=f"use one of: {', '.join(OPT_LEVELS)}")
    if threads < 1:
        raise InvalidInput(f"thread count must be at least 1 (got {threads})")
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.use_deterministic_compute = True
    so.log_severity_level = 3  # errors only: ORT's warnings go to stderr, not our logs
    so.graph_optimization_level = {
        "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[level]
    if optimized_path is not None:
        so.optimized_model_filepath = str(optimized_path)
    return so


def make_session(model: "onnx.ModelProto | Path | str | bytes", *, threads: int = 1, level: str = "all",
                 providers: Sequence[str] = ("CPUExecutionProvider",),
                 optimized_path: Path | None = None) -> "ort.InferenceSession":
    """An InferenceSession on `model` with `threads` intra-op threads (models are loaded safely)."""
    import onnxruntime as ort

    available = ort.get_available_providers()
    missing = [p for p in providers if p not in available]
    if missing:
        raise InvalidInput(f"execution provider {missing[0]!r} is not available in this onnxruntime build",
                           hint=f"available: {', '.join(available)}")
    if isinstance(model, (bytes, bytearray)):
        data: "bytes | str" = bytes(model)
    elif isinstance(model, (str, Path)) and loadable_as_is(Path(model)):
        data = str(model)  # onnxruntime reads the file itself: no parse and re-serialise in Python
    else:
        data = model_bytes(as_model(model))
    so = session_options(threads, level, optimized_path)
    try:
        return ort.InferenceSession(data, sess_options=so, providers=list(providers))
    except Exception as e:  # onnxruntime raises Fail/InvalidGraph/... from C++; all mean "cannot run"
        raise InvalidInput(f"onnxruntime cannot load the model: {e}") from None


def single_input(session: "ort.InferenceSession") -> tuple[str, list]:
    """(name, shape) of the session's only input; an error for multi-input models."""
    inputs = session.get_inputs()
    if len(inputs) != 1:
        names = ", ".join(i.name for i in inputs)
        raise InvalidInput(f"the model has {len(inputs)} inputs ({names}); this stage handles single-input models only")
    return inputs[0].name, list(inputs[0].shape)


def fixed_batch(session: "ort.InferenceSession") -> int | None:
    """The model's fixed batch size (first input dimension), or None when it is dynamic."""
    _, shape = single_input(session)
    first = shape[0] if shape else None
    return first if isinstance(first, int) and first > 0 else None


def check_input_shape(session: "ort.InferenceSession", sample_shape: Sequence[int], where: str = "the dataset") -> None:
    """Refuse data whose per-sample shape (C,H,W) does not match the model's fixed input dims."""
    name, shape = single_input(session)
    want = shape[1:]
    if len(want) != len(sample_shape) or any(isinstance(w, int) and w > 0 and w != s for w, s in zip(want, sample_shape)):
        shown = "x".join(str(d) if isinstance(d, int) else "?" for d in want)
        have = "x".join(map(str, sample_shape))
        raise InvalidInput(f"{where} gives samples of shape {have} but the model input {name!r} expects {shown}",
                           hint="set data.channels / data.image_size in the recipe to match the model")


def run(session: "ort.InferenceSession", x: "np.ndarray") -> list["np.ndarray"]:
    """All outputs of one run on the single input `x`."""
    import numpy as np

    name, _ = single_input(session)
    return session.run(None, {name: np.ascontiguousarray(x, dtype=np.float32)})


def run_batched(session: "ort.InferenceSession", x: "np.ndarray", batch_size: int = 32) -> "np.ndarray":
    """The first output on every sample of `x`, run in batches (padding a fixed batch dimension)."""
    import numpy as np

    fixed = fixed_batch(session)
    bs = fixed or max(1, batch_size)
    outs = []
    for start in range(0, len(x), bs):
        chunk = np.asarray(x[start:start + bs], dtype=np.float32)
        n = len(chunk)
        if fixed and n < fixed:  # pad with copies of the last sample, drop their outputs
            chunk = np.concatenate([chunk, np.repeat(chunk[-1:], fixed - n, axis=0)])
        outs.append(run(session, chunk)[0][:n])
    return np.concatenate(outs) if outs else np.zeros((0,), dtype=np.float32)


def random_inputs(session: "ort.InferenceSession", count: int, seed: int,
                  shape: Sequence[int] | None = None) -> list["np.ndarray"]:
    """`count` fixed uniform [0, 1) float32 inputs for the session's input (dynamic dims -> 1)."""
    import numpy as np

    name, model_shape = single_input(session)
    if shape is None:
        if any(not (isinstance(d, int) and d > 0) for d in model_shape[1:]):
            raise InvalidInput(f"input {name!r} has dynamic dimensions {model_shape}; cannot invent test inputs",
                               hint="set `input_shape:` (e.g. [1, 3, 224, 224]) in the stage config")
        shape = [d if isinstance(d, int) and d > 0 else 1 for d in model_shape]
    rng = np.random.default_rng(seed)
    return [rng.random(tuple(shape), dtype=np.float32) for _ in range(count)]


# ---------------------------------------------------------------------------------------------
# comparing outputs


def allclose_report(a: "np.ndarray", b: "np.ndarray", atol: float, rtol: float) -> dict[str, Any]:
    """max_abs, max_rel (|a-b| / |b|, over elements where b != 0) and whether |a-b| <= atol + rtol*|b| everywhere."""
    import numpy as np

    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        return {"max_abs": float("inf"), "max_rel": float("inf"), "ok": False,
                "note": f"shape {list(a.shape)} != {list(b.shape)}"}
    diff = np.abs(a - b)
    nonzero = np.abs(b) > 0
    max_rel = float((diff[nonzero] / np.abs(b[nonzero])).max()) if nonzero.any() else 0.0
    finite = bool(np.isfinite(a).all() and np.isfinite(b).all())
    ok = finite and bool((diff <= atol + rtol * np.abs(b)).all())
    return {"max_abs": float(diff.max()) if diff.size else 0.0, "max_rel": max_rel, "ok": ok}


def compare_logits(out: "np.ndarray", ref: "np.ndarray") -> dict[str, float]:
    """Parity of a candidate's outputs against a reference's, per sample (first axis = samples).

    max_abs: largest absolute difference; cosine / cosine_min: mean / smallest per-sample cosine
    similarity; top1_agreement: share of samples whose argmax agrees. Non-finite outputs give NaN.
    """
    import numpy as np

    out = np.asarray(out, dtype=np.float64).reshape(len(out), -1)
    ref = np.asarray(ref, dtype=np.float64).reshape(len(ref), -1)
    if out.shape != ref.shape:
        raise InvalidInput(f"output shapes differ: {list(out.shape)} vs reference {list(ref.shape)}",
                           hint="the builds compared must share the same model outputs")
    if len(out) == 0:
        return {"max_abs": 0.0, "cosine": 1.0, "cosine_min": 1.0, "top1_agreement": 1.0}
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):  # non-finite rows are handled below
        dot = (out * ref).sum(axis=1)
        norms = np.linalg.norm(out, axis=1) * np.linalg.norm(ref, axis=1)
        # two all-zero vectors are identical; one zero vector against a non-zero one has cosine 0
        cos = np.where(norms > 0, dot / np.where(norms > 0, norms, 1.0),
                       np.where((np.abs(out).sum(axis=1) == 0) & (np.abs(ref).sum(axis=1) == 0), 1.0, 0.0))
        # non-finite outputs have no meaningful similarity: NaN makes every summary NaN, never "good"
        finite = np.isfinite(out).all(axis=1) & np.isfinite(ref).all(axis=1)
        cos = np.where(finite, cos, np.nan)
        max_abs = float(np.abs(out - ref).max())
    return {
        "max_abs": max_abs,
        "cosine": float(cos.mean()),
        "cosine_min": float(cos.min()),
        "top1_agreement": float((out.argmax(axis=1) == ref.argmax(axis=1)).mean()),
    }


def accuracy(logits: "np.ndarray", labels: "np.ndarray") -> float:
    """Top-1 accuracy of `logits` (N, classes) against integer `labels` (N,)."""
    import numpy as np

    logits = np.asarray(logits).reshape(len(logits), -1)
    if len(labels) == 0:
        return 0.0
    if int(np.max(labels)) >= logits.shape[1]:
        raise InvalidInput(f"the dataset has label {int(np.max(labels))} but the model outputs {logits.shape[1]} classes",
                           hint="check model.num_classes against the dataset")
    return float((logits.argmax(axis=1) == np.asarray(labels)).mean())


# ---------------------------------------------------------------------------------------------
# timing


def measure_latency(session: "ort.InferenceSession", x: "np.ndarray", *, warmup: int = 5, runs: int = 30) -> dict[str, Any]:
    """Wall-clock latency of `session.run` on input `x` after `warmup` untimed runs.

    Returns p50_ms, p90_ms, mean_ms, min_ms (linear-interpolated percentiles), runs and warmup.
    """
    import numpy as np

    if runs < 1:
        raise InvalidInput(f"latency runs must be at least 1 (got {runs})")
    name, _ = single_input(session)
    feed = {name: np.ascontiguousarray(x, dtype=np.float32)}
    for _ in range(max(0, warmup)):
        session.run(None, feed)
    times = np.empty(runs, dtype=np.float64)
    for i in range(runs):
        t0 = time.perf_counter_ns()
        session.run(None, feed)
        times[i] = (time.perf_counter_ns() - t0) / 1e6
    return {
        "p50_ms": float(np.percentile(times, 50)),
        "p90_ms": float(np.percentile(times, 90)),
        "mean_ms": float(times.mean()),
        "min_ms": float(times.min()),
        "runs": runs,
        "warmup": warmup,
    }


def compare_latency(sessions: Mapping[str, "ort.InferenceSession"], x: "np.ndarray", *, warmup: int = 5,
                    runs: int = 30, min_runs: int | None = None) -> dict[str, dict[str, Any]]:
    """Latency of several sessions on the same input, measured in interleaved rounds.

    Each round runs every session once, so machine load drifts over all of them alike. With
    `min_runs` set, measuring stops after at least that many rounds once the fastest and the
    slowest session are clearly apart (their interquartile ranges do not overlap and their
    medians differ by more than 15%): enough for a faster/slower verdict, at a fraction of
    the time. Returns `measure_latency`'s fields per session, plus ``stopped_early``.
    """
    import numpy as np

    if runs < 1:
        raise InvalidInput(f"latency runs must be at least 1 (got {runs})")
    feeds = {}
    for key, session in sessions.items():
        name, _ = single_input(session)
        feeds[key] = {name: np.ascontiguousarray(x, dtype=np.float32)}
    for _ in range(max(0, warmup)):
        for key, session in sessions.items():
            session.run(None, feeds[key])
    times: dict[str, list[float]] = {key: [] for key in sessions}
    done = 0
    stopped_early = False
    while done < runs:
        for key, session in sessions.items():
            t0 = time.perf_counter_ns()
            session.run(None, feeds[key])
            times[key].append((time.perf_counter_ns() - t0) / 1e6)
        done += 1
        if min_runs is not None and done >= min_runs and done < runs and len(sessions) > 1 and _clearly_apart(times):
            stopped_early = True
            break
    out = {}
    for key, values in times.items():
        arr = np.asarray(values, dtype=np.float64)
        out[key] = {"p50_ms": float(np.percentile(arr, 50)), "p90_ms": float(np.percentile(arr, 90)),
                    "mean_ms": float(arr.mean()), "min_ms": float(arr.min()), "runs": done, "warmup": warmup,
                    "stopped_early": stopped_early}
    return out


def _clearly_apart(times: Mapping[str, list[float]]) -> bool:
    import numpy as np

    stats = sorted((float(np.percentile(v, 50)), float(np.percentile(v, 25)), float(np.percentile(v, 75)))
                   for v in times.values())
    fastest, slowest = stats[0], stats[-1]
    return fastest[2] < slowest[1] and slowest[0] > 1.15 * fastest[0]


def batch_of(samples: "np.ndarray", batch_size: int) -> "np.ndarray":
    """A batch of exactly `batch_size` samples taken cyclically from `samples` (N, ...)."""
    import numpy as np

    if len(samples) == 0:
        raise InvalidInput("no samples to build a batch from")
    idx = np.arange(batch_size) % len(samples)
    return np.ascontiguousarray(samples[idx], dtype=np.float32)


def measure_throughput(session: "ort.InferenceSession", samples: "np.ndarray", batch_sizes: Sequence[int], *,
                       warmup: int = 2, runs: int = 10) -> dict[str, Any]:
    """Samples per second at each batch size (from the median batch time).

    Batch sizes a model cannot take (its batch dimension is fixed to another value) map to
    None, so a report shows they were asked for but not measurable.
    """
    fixed = fixed_batch(session)
    result: dict[str, Any] = {}
    for bs in batch_sizes:
        if fixed is not None and bs != fixed:
            result[str(bs)] = None
            continue
        stats = measure_latency(session, batch_of(samples, bs), warmup=warmup, runs=runs)
        result[str(bs)] = float(bs * 1000.0 / stats["p50_ms"]) if stats["p50_ms"] > 0 else None
    return result


# ---------------------------------------------------------------------------------------------
# host


def host_info() -> dict[str, Any]:
    """CPU model, core count, the SIMD flags relevant to int8 kernels, and runtime versions."""
    from importlib.metadata import PackageNotFoundError, version

    from zoo import host

    versions = {}
    for dist in ("onnxruntime", "onnx", "numpy"):
        try:
            versions[dist] = version(dist)
        except PackageNotFoundError:
            versions[dist] = None
    return {
        "machine": platform.machine(),
        "system": platform.system(),
        "cpu": host.cpu_model(),
        "cpu_count": os.cpu_count(),
        "flags": host.kernel_features(),
        "python": platform.python_version(),
        "versions": versions,
    }


def int8_may_saturate(host: Mapping[str, Any] | None = None) -> bool:
    """True on x86-64 CPUs without VNNI (AVX-512 VNNI or AVX-VNNI): there onnxruntime's u8 x s8
    kernels use VPMADDUBSW, whose 16-bit intermediate sums can saturate unless the weights use
    7 bits (`reduce_range`). Measured accuracy of full-range int8 weights is then this host's
    kernels' accuracy, not the model's."""
    host = host if host is not None else host_info()
    if str(host.get("machine", "")).lower() not in ("x86_64", "amd64", "i686", "x86"):
        return False
    return not ({"avx512_vnni", "avx_vnni"} & set(host.get("flags", ())))
