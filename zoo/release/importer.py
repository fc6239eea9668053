"""`zoo import SOURCE [--name N --version V]`: a zoo version from an existing model, without writing a recipe.

    from zoo.release.importer import import_model
    r = import_model("hf://org/repo@main/model.onnx")
    print(r.ref, r.created, r.source["revision"])

Steps:

1. SOURCE is resolved and pinned (`zoo.release.import_source`: a local file, a URL with its
   sha256, a Hub repo at a commit, or a catalog name's pinned weights) and its file fetched into the
   run cache's source store with its sha256 checked: a wrong digest stops here, before any stage
   runs, and nothing is published.
2. A recipe is generated for the built-in kinds (the one place outside a recipe file that names
   them): ``export`` passes the ONNX file through (``onnx: {url|path, sha256, license,
   attribution}``) or builds a catalog name's architecture (``weights: torchvision:NAME``),
   ``verify`` runs the ONNX checker and a seeded random-input smoke run as gates, and ``deploy``
   packages the ``cpu-fp32`` build with its test vectors, card, ``zoo.lock`` and provenance
   statement, with ``publish: false``: publishing is this module's. The recipe lives in the run
   cache under ``imports/<digest of its text>/recipe.yaml``, so the same SOURCE gives the same
   recipe, the same lockfile and cached stages.
3. The recipe runs through the normal engine (`zoo.engine.pipeline.run`, which `zoo.api.run` is), which writes its lockfile.
4. The deploy stage's release folder is published to the local zoo together with the recipe and
   its lockfile (``import/recipe.yaml``, ``import/recipe.lock``, listed in the manifest's
   ``files``) and the source's provenance in ``extra.import`` (source, URL or path, resolved
   revision, sha256, license when the source states one). Importing the same source again is a
   no-op; other content under an existing version is a Conflict (exit 3).

Reproduce an import: ``zoo pull NAME@VERSION --to DIR`` places the recipe and its lockfile with the
build; ``zoo repro DIR/import/recipe.yaml --check`` rebuilds every stage and compares the bytes.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import yaml

from zoo.errors import GateFailed, InvalidInput, StageFailed, ZooError
from zoo.release.import_source import ImportSource

RECIPE_FILE = "import/recipe.yaml"  # where the version keeps the generated recipe
LOCK_FILE = "import/recipe.lock"  # and its lockfile (`zoo.engine.lockfile.lock_path` of the recipe)
PUBLISHING_STAGE = "deploy"  # the generated recipe's stage whose `release` folder becomes the version
BUILD = "cpu-fp32"
# ONNX TensorProto element types the recipe's `model.inputs` can declare
_ELEM_TYPES = {1: "float32", 2: "uint8", 3: "int8", 6: "int32", 7: "int64", 9: "bool", 10: "float16", 11: "float64"}


@dataclass
class ImportResult:
    """What `import_model` did. ``created`` is False when the zoo already held this exact version."""

    name: str
    version: str
    source: dict[str, Any]  # the provenance recorded in the manifest's extra.import
    recipe: str  # the generated recipe's path in the run cache
    created: bool = False
    executed: list[str] = field(default_factory=list)
    cached: list[str] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)  # version-level file -> sha256

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}"

    def to_json(self) -> dict[str, Any]:
        from dataclasses import asdict

        return {"schema_version": 1, "ref": self.ref, **asdict(self)}


def import_model(source: str, *, name: str | None = None, version: str | None = None,
                 shapes: Mapping[str, Iterable[int]] | None = None, zoo: Any = None,
                 on_update: Callable[[Any], None] | None = None) -> ImportResult:
    """Make `name@version` in the local zoo from `source` (see the module docstring).

    `shapes`: per-sample sizes (without the batch axis) of inputs whose dimensions the model
    leaves dynamic, which verify's random inputs need (``{"input_ids": [128]}``).
    """
    from zoo import paths
    from zoo.engine import pipeline
    from zoo.registry.refs import check_name, check_version
    from zoo.registry.store import LocalZoo
    from zoo.release import import_source
    from zoo.engine.runner import StageState

    src = import_source.resolve(source)
    name = check_name(name or src.name)
    version = check_version(version or src.version)
    cache_dir = paths.cache_dir()
    local_file = import_source.fetch(src, cache_dir)  # IntegrityError here: nothing ran, nothing is published
    if src.form == "catalog":  # an image classifier of fixed input: nothing dynamic to size
        if shapes:
            raise InvalidInput(f"--shape does not apply to {src.pinned}: the catalog fixes its input "
                               f"({'x'.join(map(str, src.input_shape or ()))})", hint="drop --shape")
        inputs = None
    else:
        inputs = _declared_inputs(local_file, shapes or {}) if local_file is not None else None
    text = recipe_text(src, name, version, inputs)
    recipe = _write_recipe(cache_dir, text)
    result = pipeline.run(recipe, on_update=on_update)
    if not result.ok:
        raise _stage_failure(result)
    out = ImportResult(name=name, version=version, source=src.provenance(), recipe=str(recipe),
                       executed=[s.id for s in result.stages if s.state == StageState.RAN],
                       cached=[s.id for s in result.stages if s.state == StageState.CACHED])
    zoo = zoo or LocalZoo()
    existed = zoo.get(name, version) is not None
    staging = _staging(result, recipe, out.source)
    try:
        manifest = zoo.publish(staging)
    finally:  # hard links to cache objects: they would keep a model's bytes alive past `zoo gc`
        shutil.rmtree(staging, ignore_errors=True)
    out.created = not existed
    out.files = {f.path: f.sha256 for f in manifest.files}
    return out


# ---------------------------------------------------------------------------------------------
# the recipe


def recipe_text(src: ImportSource, name: str, version: str, inputs: Mapping[str, Any] | None = None) -> str:
    """The recipe `zoo import` writes for `src` (deterministic: the same arguments, the same text).

    `inputs`: the recipe's ``model.inputs`` for a model with dynamic dimensions (None: not needed).
    """
    # Every value in the text comes from the emitter, the comment header's too: the source's own words
    # (a Hub card's license, a catalog's URL) are a stranger's text, and a newline in one written by
    # string formatting would start a section of the recipe (`data:` reading /etc/passwd).
    pinned = {"source": src.pinned}
    pinned.update({key: value for key, value in (("revision", src.revision), ("url", src.weights_url),
                                                 ("sha256", src.sha256), ("license", src.license)) if value})
    header = ["# Generated by `zoo import`; do not edit (import again instead)."]
    header += [f"# {line}" for line in _emit(pinned).splitlines()]
    header += ["# Rebuild every stage and compare the bytes with the lockfile beside it:",
               "#   zoo repro recipe.yaml --check",
               "# deploy does not publish: `zoo import` publishes its release together with this recipe",
               "# and its lockfile (import/recipe.yaml, import/recipe.lock in the version)."]
    doc: dict[str, Any] = {"schema_version": 1, "name": name, "version": version,
                           "description": f"{Path(src.pinned).name if src.form == 'file' else src.pinned}, "
                                          "imported with `zoo import`",
                           "license": src.license or "unspecified"}
    if src.form == "catalog":  # the catalog's name, not its URL: the export kind resolves it and keys the pin
        doc["task"] = "image-classification"
        doc["model"] = {"arch": src.arch, "num_classes": src.num_classes}
        export = {"weights": src.pinned, "input_shape": list(src.input_shape or ())}
    else:
        doc["task"] = "generic"  # nothing says what the outputs mean: verify checks parity and runs, no accuracy
        if inputs:
            doc["model"] = {"inputs": dict(inputs)}
        ref: dict[str, Any] = {"url" if src.is_url else "path": src.location, "sha256": src.sha256}
        ref.update({k: v for k, v in (("license", src.license), ("attribution", src.attribution)) if v})
        export = {"onnx": ref}
    doc["stages"] = {
        "export": {"config": export},
        "verify": {"needs": ["export"], "config": {
            "builds": {BUILD: "export"},
            "eval_samples": 8,  # seeded random inputs: the smoke run (no data ships with an imported model)
            "latency": {"warmup": 2, "runs": 10, "threads": 1, "batch_sizes": [1]},
            "gates": [f"{BUILD}.checker >= 1"],
        }},
        PUBLISHING_STAGE: {"needs": ["export", "verify"], "config": {
            "builds": {BUILD: {"from": "export"}},
            "publish": False,
        }},
    }
    text = "\n".join(header) + "\n" + _emit(doc)
    if yaml.safe_load(text) != doc:  # the text means the document and nothing else (comments stay comments)
        raise RuntimeError(f"zoo import generated a recipe that does not read back as itself: {text!r}")
    return text


def _emit(doc: Mapping[str, Any]) -> str:
    """`doc` as YAML text: PyYAML's emitter quotes and escapes every value (line breaks included)."""
    return yaml.safe_dump(dict(doc), sort_keys=False, allow_unicode=True, width=100)


def _write_recipe(cache_dir: Path, text: str) -> Path:
    """The recipe's file in the run cache, named by its text: one folder (and lockfile) per recipe."""
    from zoo.files import atomic_write_text

    folder = cache_dir / "imports" / hashlib.sha256(text.encode()).hexdigest()[:16]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / Path(RECIPE_FILE).name
    if not path.is_file() or path.read_text() != text:
        atomic_write_text(path, text)
    return path


def _declared_inputs(model: Path, shapes: Mapping[str, Iterable[int]]) -> dict[str, Any] | None:
    """``model.inputs`` for the inputs whose per-sample dimensions are dynamic (sizes from `shapes`);
    None when the model fixes every dimension but the batch. InvalidInput names what is missing."""
    ports = graph_inputs(model)
    unknown = sorted(set(shapes) - {p[0] for p in ports})
    if unknown:
        raise InvalidInput(f"--shape names {', '.join(unknown)}, which the model does not take",
                           hint=f"its inputs: {', '.join(p[0] for p in ports)}")
    declared: dict[str, Any] = {}
    for port_name, elem_type, dims in ports:
        dynamic = not dims or any(not isinstance(d, int) for d in dims[1:])
        if port_name not in shapes and not dynamic:
            continue
        if port_name not in shapes:
            shown = "x".join(str(d) if isinstance(d, int) else "?" for d in dims[1:])
            example = ",".join(str(d) if isinstance(d, int) else "N" for d in dims[1:]) or "N"
            raise InvalidInput(f"the model's input {port_name!r} has dynamic dimensions ({shown or 'no shape'} after "
                               "the batch): verify's random inputs need sizes",
                               hint=f"give them: --shape {port_name}={example}")
        sizes = [int(d) for d in shapes[port_name]]
        if dims and len(sizes) != len(dims) - 1:
            raise InvalidInput(f"--shape {port_name}: {len(sizes)} size(s), but the input has {len(dims) - 1} "
                               "dimension(s) after the batch")
        if any(d < 1 for d in sizes) or any(isinstance(d, int) and d != s for d, s in zip(dims[1:], sizes)):
            raise InvalidInput(f"--shape {port_name}={','.join(map(str, sizes))} does not fit the input's "
                               f"dimensions {dims}")
        dtype = _ELEM_TYPES.get(elem_type)
        if dtype is None:
            raise InvalidInput(f"the model's input {port_name!r} has ONNX element type {elem_type}, which verify "
                               "cannot invent random values for", hint="import the model with a recipe instead")
        batch = dims[0] if dims and isinstance(dims[0], int) else "batch"
        declared[port_name] = {"shape": [batch, *sizes], "dtype": dtype}
    return declared or None


def parse_shape(text: str) -> tuple[str, list[int]]:
    """``NAME=3,224,224`` (or ``NAME=3x224x224``) -> ("NAME", [3, 224, 224]) for `import_model`'s shapes."""
    m = re.fullmatch(r"\s*([^=\s]+)\s*=\s*(\d+(?:\s*[,x]\s*\d+)*)\s*", text)
    if not m:
        raise InvalidInput(f"--shape {text!r} is not NAME=D1,D2,...",
                           hint="the input's sizes after the batch axis, e.g. --shape input_ids=128")
    return m.group(1), [int(d) for d in re.split(r"\s*[,x]\s*", m.group(2))]


# ONNX field numbers (onnx.proto): ModelProto.graph; GraphProto.input/initializer; ValueInfoProto.name/type;
# TypeProto.tensor_type; TypeProto.Tensor.elem_type/shape; TensorShapeProto.dim; Dimension.dim_value/dim_param
_GRAPH, _INPUT, _INITIALIZER, _NAME, _TYPE, _TENSOR_TYPE, _ELEM, _SHAPE, _DIM, _VALUE, _PARAM = \
    7, 11, 5, 1, 2, 1, 1, 2, 1, 1, 2
_TENSOR_NAME = 8


def graph_inputs(path: Path) -> list[tuple[str, int, list[int | str | None]]]:
    """(name, ONNX element type, dims) of the graph's inputs that are not initializers, read at the
    wire level (`zoo.onnxwire`: no onnx import, no weight byte copied). A dim is an int (fixed), a
    name (symbolic) or None (unknown); dims are [] for an input without a shape."""
    import mmap

    from zoo import onnxwire as w

    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        buf = memoryview(mm)
        try:
            graph = next((g for g in w.fields(buf, 0, len(buf)) if g.number == _GRAPH), None)
            if graph is None:
                raise InvalidInput(f"{path.name} has no graph: not an ONNX model")
            ports, initializers = [], set()
            for f_ in w.fields(buf, graph.value_start, graph.stop):
                if f_.number == _INPUT:
                    ports.append(_value_info(buf, f_))
                elif f_.number == _INITIALIZER:
                    initializers.update(w.text(buf, t) for t in w.fields(buf, f_.value_start, f_.stop)
                                        if t.number == _TENSOR_NAME)
            return [p for p in ports if p[0] not in initializers]
        except w.ScanError as e:
            raise InvalidInput(f"{path.name} is not an ONNX model: {e}") from None
        finally:
            buf.release()


def _value_info(buf, info) -> tuple[str, int, list[int | str | None]]:
    from zoo import onnxwire as w

    def sub(parent, number):
        return [f for f in w.fields(buf, parent.value_start, parent.stop) if f.number == number]

    name = "".join(w.text(buf, f) for f in sub(info, _NAME))
    elem, dims = 0, []
    for tensor in (t for typ in sub(info, _TYPE) for t in sub(typ, _TENSOR_TYPE)):
        for f in w.fields(buf, tensor.value_start, tensor.stop):
            if f.number == _ELEM and f.wire == w.VARINT:
                elem = w.read_varint(buf, f.value_start, f.stop)[0]
            elif f.number == _SHAPE:
                for dim in sub(f, _DIM):
                    value: int | str | None = None
                    for d in w.fields(buf, dim.value_start, dim.stop):
                        if d.number == _VALUE and d.wire == w.VARINT:
                            value = w.read_varint(buf, d.value_start, d.stop)[0]
                        elif d.number == _PARAM:
                            value = w.text(buf, d) or None
                    dims.append(value)
    return name, elem, dims


# ---------------------------------------------------------------------------------------------
# publishing


def _staging(result, recipe: Path, provenance: dict[str, Any]) -> Path:
    """A folder holding the deploy stage's release (hard links) plus the recipe and its lockfile,
    with a manifest that lists them and carries the source's provenance."""
    from zoo.engine import lockfile
    from zoo.engine.cache import Cache
    from zoo.registry.codec import load_manifest
    from zoo.registry.manifest import MANIFEST_FILE
    from zoo.registry.staging import file_ref, write_manifest

    report = next(s for s in result.stages if s.id == PUBLISHING_STAGE)
    cache = Cache(result.cache_dir)
    entry = cache.lookup(report.key) if report.key else None
    if entry is None:
        raise StageFailed(f"stage {PUBLISHING_STAGE} finished but its release is not in the cache {cache.root}",
                          stage_id=PUBLISHING_STAGE, hint="run the import again")
    release = cache.output_paths(entry)["release"]
    staging = recipe.parent / "publish"
    if staging.exists():
        shutil.rmtree(staging)
    shutil.copytree(release, staging, copy_function=os.link)
    for target, src in ((RECIPE_FILE, recipe), (LOCK_FILE, lockfile.lock_path(recipe))):
        (staging / target).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, staging / target)
    manifest = load_manifest((release / MANIFEST_FILE).read_bytes(), str(release / MANIFEST_FILE))
    files = [f for f in manifest.files if f.path not in (RECIPE_FILE, LOCK_FILE)]
    files += [file_ref(staging, RECIPE_FILE), file_ref(staging, LOCK_FILE)]
    extra = {**manifest.extra, "import": {**provenance, "recipe": RECIPE_FILE, "lock": LOCK_FILE}}
    (staging / MANIFEST_FILE).unlink()  # a hard link into the cache: never written through
    write_manifest(staging, manifest.model_copy(update={"files": files, "extra": extra}))
    return staging


def _stage_failure(result) -> ZooError:
    """The first failed stage as an error with its own exit code (gate 1, storage 3, integrity 4...)."""
    from zoo.engine.worker import WorkerError

    failed = result.failed[0]
    err = failed.error or WorkerError(type="", message="unknown error")
    message = f"stage {failed.id} of the generated recipe failed: {err.message}; nothing was imported"
    if err.table:
        exc: ZooError = GateFailed(message, table=err.table, hint=err.hint)
    else:
        hint = err.hint or f"see the log: {failed.log_path} (recipe: {result.path})"
        if failed.id == "deploy" and "portable ONNX" in err.message:
            # deploy's own hint is about editing one's recipe; an imported file is what must change
            hint = ("the file runs in onnxruntime, but ONNX's reference evaluator refuses it: it does not "
                    "follow the ONNX standard as written; re-export it with a current converter, or check "
                    "it with onnx.checker.check_model(model, full_check=True)")
        exc = StageFailed(message, stage_id=failed.id, hint=hint)
    exc.exit_code = err.exit_code
    return exc
