"""The version manifest: one per published `name@version`, the zoo's central on-disk format.

A manifest lists every build of a version (file, sha256, size, opset, I/O ports, execution
providers, metrics, test vectors) and its lineage (recipe digest, stage record digests, source digests,
tool versions). Every file it names is stored as a blob addressed by its sha256; paths are
relative POSIX paths inside the version and may never escape it.

The format is the engine's, and part of the kind interface: a kind that declares a release
(`zoo.stage.StageKind.release_output`) writes its release folder with these models and `file_ref`,
and the engine publishes that folder (zoo/engine/publish.py). So this module imports nothing of
the model zoo's store or remotes; the registry reads and stores the format through it
(`zoo.registry.manifest` is the registry's name for it, `zoo.registry.codec` its canonical bytes).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from zoo.files import sha256_and_size
from zoo.pathsafety import check_relative_path, safe_join

# 2: builds say what runs them (`runtime`, `portable`), whether they were run where they are meant to
#    run (`verified`, `unverified_reason`) and what their timings were measured on (`measured_on`);
#    the `openvino` format. A version-1 manifest still reads (those fields empty: not recorded).
# 3: builds carry the options their execution providers are created with (`provider_options`: a
#    TensorRT build's precision flags and engine cache); older manifests read with none.
# 4: builds may say how their weights were quantized (`quantization`: method, algorithm, bits, block size,
#    symmetric, accuracy level; quantize's `mode: weight_only`). A manifest is written at the lowest version
#    that holds what it says (`Manifest`'s schema_version when none is given): one without such a build
#    keeps its version-3 bytes, which older zoos read.
MANIFEST_SCHEMA_VERSION = 4
READABLE_SCHEMA_VERSIONS = (1, 2, 3, 4)
MANIFEST_FILE = "zoo-manifest.json"
NAME_RE = r"^[a-z0-9][a-z0-9._-]*$"
VERSION_RE = r"^\d+\.\d+\.\d+([-+][0-9A-Za-z.-]+)?$"
BUILD_RE = r"^[a-z0-9][a-z0-9._-]*$"


# The numbers a manifest may hold. A manifest from a remote is a stranger's file: a latency of 1e308 or
# a 400-digit integer must be refused where it is read (naming the remote, the version and the field),
# not crash whatever formats, sorts, plots or indexes it later (float() of a huge int overflows, SQLite
# holds 64 bits, a plot's scale overflows to inf). Integers stay within 2**53, which a float and the web
# catalog's JavaScript hold exactly (sizes up to 8 PiB); other figures are finite and within 1e15
# (latencies, metrics, throughputs, byte counts), larger than anything a model measures.
MAX_INT = 2**53
MAX_FIGURE = 1e15
MAX_NESTING = 32  # levels of lists and objects in `extra` and `preprocessing`


def check_bounded(value: Any, depth: int = 0) -> Any:
    """`value` when every number in it is an integer within `MAX_INT` or a finite float within
    `MAX_FIGURE`, and it nests at most `MAX_NESTING` levels; ValueError saying which bound it breaks."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        if not -MAX_INT <= value <= MAX_INT:
            # str() of an int of more than 4300 digits raises (Python's limit); 13000 bits are about 3900
            digits = len(str(abs(value))) if value.bit_length() <= 13000 else "over 3900"
            raise ValueError(f"an integer of {digits} digits is out of bounds (at most 2**53 in size)")
        return value
    if isinstance(value, float):
        if not math.isfinite(value) or abs(value) > MAX_FIGURE:
            raise ValueError(f"the number {value!r} is out of bounds (finite, at most {MAX_FIGURE:g} in size)")
        return value
    if depth >= MAX_NESTING:
        raise ValueError(f"nested more than {MAX_NESTING} levels deep")
    if isinstance(value, dict):
        for item in value.values():
            check_bounded(item, depth + 1)
    elif isinstance(value, (list, tuple)):
        for item in value:
            check_bounded(item, depth + 1)
    return value


# a manifest's number (or a value that may be one), checked by `check_bounded` after its type
Bounded = AfterValidator(check_bounded)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def describe_quantization(precision: str, quantization: dict | None) -> str:
    """A build's precision with how it was quantized, in one line: 'int4 (weight-only rtn, 4 bits, block 32,
    int8 compute)'; the bare precision when nothing is recorded. The card and the web catalog say it so."""
    if not quantization:
        return precision
    q = quantization
    parts = [f"{q['method'].replace('_', '-')} {q['algorithm']}" if q.get("method") and q.get("algorithm")
             else str(q.get("method") or q.get("algorithm") or "")]
    if q.get("bits") is not None:
        parts.append(f"{q['bits']} bits")
    if q.get("block_size") is not None:
        parts.append(f"block {q['block_size']}")
    if q.get("symmetric") is not None:
        parts.append("symmetric" if q["symmetric"] else "asymmetric")
    if q.get("accuracy_level"):
        parts.append(f"{q['accuracy_level']} compute")
    inner = ", ".join(p for p in parts if p)
    return f"{precision} ({inner})" if inner else precision


def describe_measured_on(where: dict | None) -> str:
    """A build's ``measured_on`` in one line: 'onnxruntime 1.32.0 CPUExecutionProvider, AMD EPYC
    (x86-64-avx512-vnni), 1 thread'; '' when the build has no timings. The model card, the CLI
    and the web catalog all say it so."""
    if not where:
        return ""
    runtime = " ".join(str(where[k]) for k in ("runtime", "runtime_version", "execution_provider") if where.get(k))
    device = str(where.get("device") or "")
    if where.get("platform"):
        device = f"{device} ({where['platform']})" if device else str(where["platform"])
    threads = where.get("threads")
    parts = [p for p in (runtime, device, f"{threads} thread{'' if threads == 1 else 's'}" if threads else "") if p]
    return ", ".join(parts)


# The figures verify records for a text-generation build (issue #35; zoo_stages/verify.py names
# them), in the order `zoo show` and the catalog list them: (metric, its name for people, which way
# is better). perplexity on held-out text and its _increase over the reference (0.05: 5% above it);
# greedy agreement with the reference on fixed prompts (tokens matched before the first divergence,
# as a count and as a share of the new tokens) and the share of prompts matched whole; the prefill's
# latency and the decode speed at batch 1 (its `latency_p50_ms` is one decode step).
GENERATION_METRICS = (
    ("perplexity", "perplexity", "lower"),
    ("perplexity_increase", "perplexity increase", "lower"),
    ("greedy_matched_tokens", "greedy matched tokens", "higher"),
    ("greedy_agreement", "greedy agreement", "higher"),
    ("greedy_exact_match", "greedy exact match", "higher"),
    ("latency_prefill_ms", "prefill (ms)", "lower"),
    ("throughput_tokens_per_s", "decode tokens/s", "higher"),
)


def generation_figures(metrics: dict) -> dict:
    """The `GENERATION_METRICS` a build's metrics hold, in their order ({} for any other build)."""
    return {name: metrics[name] for name, _, _ in GENERATION_METRICS if metrics.get(name) is not None}


class FileRef(_Strict):
    """A file of a version: where it goes (relative path) and what its bytes are."""

    path: str
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = Field(ge=0, le=MAX_INT)

    _check = field_validator("path")(classmethod(lambda cls, v: check_relative_path(v)))


class Port(_Strict):
    """An input or output of a model: name, element type, shape (ints or symbolic names)."""

    name: str
    dtype: str
    shape: list[Annotated[int | str | None, Bounded]]


class Build(_Strict):
    """One device build of a version (cpu-fp32, cpu-int8, cuda-fp16, mobile...)."""

    name: str = Field(pattern=BUILD_RE)
    file: FileRef
    format: Literal["onnx", "ort", "openvino"] = "onnx"
    precision: str = "fp32"
    opset: Annotated[int | None, Bounded] = None
    inputs: list[Port] = Field(default_factory=list)
    outputs: list[Port] = Field(default_factory=list)
    runtime: str = Field("", description="what can run it: 'onnx' (any runtime implementing its opsets: standard "
                                         "domains only), 'onnxruntime>=1.32' (com.microsoft ops, ORT format), "
                                         "'openvino>=2026.4'; empty in manifests older than schema 2")
    portable: bool | None = Field(None, description="standard ONNX domains only, onnx.checker full_check passed and "
                                                    "its test vectors reproduced by onnx.reference and onnxruntime "
                                                    "(None: not checked, an older manifest)")
    execution_providers: list[str] = Field(default_factory=lambda: ["CPUExecutionProvider"],
                                           description="onnxruntime's providers, or the runtime's devices ('CPU' "
                                                       "for OpenVINO), the one it is made for first")
    provider_options: dict[str, dict[str, str]] = Field(
        default_factory=dict, description="onnxruntime provider name -> the options to create it with (e.g. "
                                          "TensorrtExecutionProvider: {trt_fp16_enable: 'True'}); `zoo.load` "
                                          "passes them")
    requires: dict[str, str] = Field(default_factory=dict, description="hardware it needs, e.g. {'device': 'cuda'}")
    verified: bool | None = Field(None, description="run on the runtime and device it is made for, its outputs "
                                                    "checked (None: an older manifest that does not say)")
    unverified_reason: str = Field("", description="why `verified` is false")
    metrics: dict[str, Annotated[float | int | str | None, Bounded]] = Field(default_factory=dict)
    measured_on: dict[str, Annotated[str | int, Bounded]] = Field(
        default_factory=dict, description="what the timing metrics were measured with: runtime, runtime_version, "
                                          "execution_provider, device, platform, threads (empty: no timings)")
    test_vectors: list[FileRef] = Field(default_factory=list)
    extra_files: list[FileRef] = Field(default_factory=list, description="external data and other sidecars")
    quantization: dict[str, Annotated[str | int | bool | None, Bounded]] | None = Field(
        None, exclude_if=lambda v: v is None,
        description="how its weights were quantized (schema 4): method (weight_only), algorithm (rtn, hqq, gptq, "
                    "k_quant), bits, block_size, symmetric, accuracy_level (what MatMulNBits computes in); "
                    "absent when not recorded")

    def all_files(self) -> list[FileRef]:
        return [self.file, *self.test_vectors, *self.extra_files]

    def model_size(self) -> int:
        """Bytes a user downloads for the model: its file and its sidecars (external data)."""
        return self.file.size + sum(f.size for f in self.extra_files)


class Lineage(_Strict):
    """Where a version came from: enough to rebuild it and to check a rebuild."""

    recipe: dict[str, str] = Field(default_factory=dict, description="name, version, digest")
    stages: dict[str, str] = Field(default_factory=dict, description="stage id -> the digest of its lock record (zoo.engine.lockfile.record_identity)")
    sources: dict[str, str] = Field(default_factory=dict, description="source name -> digest")
    tools: dict[str, str] = Field(default_factory=dict, description="distribution -> version")


class Manifest(_Strict):
    """The manifest of one published version."""

    schema_version: Literal[1, 2, 3, 4] = MANIFEST_SCHEMA_VERSION
    name: str = Field(pattern=NAME_RE)
    version: str = Field(pattern=VERSION_RE)
    description: str = ""
    task: str = ""
    license: str = "unspecified"
    created: str | None = Field(None, description="ISO-8601 UTC; set by the store at publish time")
    builds: dict[str, Build]
    lineage: Lineage = Field(default_factory=Lineage)
    card: FileRef | None = Field(None, description="model card (README.md)")
    files: list[FileRef] = Field(default_factory=list, description="version-level files: lockfile, provenance...")
    preprocessing: dict[str, Any] = Field(
        default_factory=dict, description="what to do to an input before feeding the model (the recipe's data "
                                          "transforms: image size, layout, scale, mean/std; table columns and "
                                          "normalisation; tokenizer and max length); empty when unknown")
    extra: dict[str, Any] = Field(default_factory=dict)

    _bounded = field_validator("preprocessing", "extra")(classmethod(lambda cls, v: check_bounded(v)))

    @model_validator(mode="after")
    def _schema(self):
        quantized = any(b.quantization for b in self.builds.values())
        needed = 4 if quantized else 3
        if "schema_version" not in self.model_fields_set:
            self.schema_version = needed  # the lowest version that holds it (older zoos read version 3)
        elif quantized and self.schema_version < needed:
            raise ValueError(f"a build records `quantization`, which manifest schema_version {self.schema_version} "
                             f"does not have (schema {needed})")
        return self

    def all_files(self) -> list[FileRef]:
        """Every file of the version, builds first, without duplicates."""
        seen: dict[str, FileRef] = {}
        for build in self.builds.values():
            for ref in build.all_files():
                seen.setdefault(ref.path, ref)
        for ref in ([self.card] if self.card else []) + self.files:
            seen.setdefault(ref.path, ref)
        return list(seen.values())

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}"


def file_ref(folder: Path, path: str | Path) -> FileRef:
    """The FileRef (relative POSIX path, sha256, size) of a file inside a release folder.

    `path` is either a manifest path (a str, relative to `folder`) or the file's Path (a path
    inside `folder`, as a kind writing its release has them); UnsafePath for a file outside it.
    """
    relative = Path(os.path.relpath(path, folder)).as_posix() if isinstance(path, Path) else path
    digest, size = sha256_and_size(safe_join(Path(folder), relative))
    return FileRef(path=relative, sha256=digest, size=size)


def read_manifest(path: Path) -> Manifest:
    """The manifest in `path`, a file zoo wrote (a release folder's, or the local zoo's copy of a
    version this machine published): validated, but not the registry's reading of a stranger's file
    (`zoo.registry.codec.load_manifest`, which names the source of a bad field)."""
    return Manifest.model_validate_json(Path(path).read_bytes())
