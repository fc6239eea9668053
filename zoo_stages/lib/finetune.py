"""Fine-tuning and transfer learning: a recipe's network taken from a model in the local zoo.

The recipe's ``model: {from: zoo:NAME@VERSION, build: BUILD, head: keep|new}`` names the parent:
a pinned version in the local zoo (published by its recipe's deploy stage, or pulled), and one of
its ONNX builds (default: its float32 one, `zoo.registry.select.float_build`). The build is pulled
offline (checked against its sha256) and converted back to torch by `zoo.onnx_to_torch`, weights
included; nothing in it is run. ``head: new`` replaces the parent's last Linear layer by a fresh
one of ``model.num_classes`` outputs (transfer learning); with ``keep`` (the default) the parent's
output width must be ``num_classes``.

train and export both build the network here (`archs.build_model`), so the parent's ONNX file and
its sidecars (external data) are dependencies of both (their digests enter the keys: a republished
parent retrains, even one whose weights alone changed), and export
records it as an attribution source, which deploy writes into the version's lineage
(``lineage.sources["zoo:NAME@VERSION"] = "sha256:..."``) and its model card.

What the kinds read of the parent's manifest (the build chosen, its file and sha256, the license,
its sidecars' sha256, the output shape) is written to a *pin*, ``<cache>/parents/<name>/<version>/<build>.json``
(canonical JSON, rewritten only when it changes), which is a dependency too. So the keys hold
exactly what is read of the parent, the same on every machine whose zoo has the same version
(the manifest's publish time and timing figures are not read, and stay out of the keys), and a
Dask worker that shares no disk with the caller is given the pin and the build's files like any
other keyed file (zoo/engine/stage_files.py): where the local zoo lacks the version, the parent
is taken from its pin, provided the files the pin names are in the zoo's version folder with the
pinned sha256. The worker needs no `zoo pull`.

`freeze` fixes parameters by name (``train.config.freeze``: fnmatch patterns such as
``features.*``) so that only the rest trains.
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from zoo.errors import InvalidInput, NotFound

PREFIX = "zoo:"
PINS = "parents"  # <cache>/parents/<name>/<version>/<build or DEFAULT_BUILD>.json: what is read of a parent
PIN_SCHEMA = 2  # 2: the build's sidecars (ONNX external data) with their sha256
DEFAULT_BUILD = "default"  # the pin of `model.from` without `model.build` (its float32 build)


@dataclass(frozen=True)
class Parent:
    """The zoo build a recipe's model starts from."""

    ref: str  # name@version
    build: str
    path: Path  # the build's ONNX file in the local zoo (verified)
    sha256: str
    sidecars: tuple[tuple[Path, str], ...]  # (file, sha256) of the build's other files: its external data
    license: str
    outputs: tuple[int | str | None, ...]  # the shape of its (first) output

    @property
    def source(self) -> str:
        return f"{PREFIX}{self.ref}"


def parent(model_section: Mapping[str, Any], recipe_dir: Path) -> Parent | None:
    """The parent the section names (None without ``from``), from the local zoo (its pin written),
    or from its pin where the zoo lacks the version (a Dask worker given both); InvalidInput naming
    the command that makes it when neither has it."""
    spec = model_section.get("from")
    if not spec:
        return None
    from zoo.registry.refs import parse_pinned
    from zoo.registry.store import LocalZoo

    ref = str(spec).removeprefix(PREFIX)
    pinned = parse_pinned(ref)
    zoo = LocalZoo()
    pin = pin_path(pinned.name, str(pinned.version), model_section.get("build"))
    try:
        manifest = zoo.resolve(pinned)
    except NotFound:
        found = _from_pin(pin, zoo, f"{pinned.name}@{pinned.version}")
        if found is None:
            raise _missing(ref, recipe_dir) from None
        return found
    found = _from_zoo(zoo, manifest, model_section, spec)
    _write_pin(pin, found, zoo)
    return found


def pin_path(name: str, version: str, build: str | None) -> Path:
    """Where the pin of `name@version`'s `build` (None: its float32 build) lies in the run cache."""
    from zoo import paths
    from zoo.pathsafety import safe_join

    return safe_join(paths.cache_dir(), f"{PINS}/{name}/{version}/{build or DEFAULT_BUILD}.json", what="parent pin")


def _pin_text(found: Parent, zoo: Any) -> str:
    import json

    name, version = found.ref.split("@", 1)
    folder = zoo.version_dir(name, version)
    record = {"schema_version": PIN_SCHEMA, "ref": found.ref, "build": found.build,
              "file": found.path.relative_to(folder).as_posix(), "sha256": found.sha256,
              "sidecars": {path.relative_to(folder).as_posix(): sha256 for path, sha256 in found.sidecars},
              "license": found.license, "outputs": list(found.outputs)}
    return json.dumps(record, sort_keys=True, indent=1) + "\n"


def _write_pin(pin: Path, found: Parent, zoo: Any) -> None:
    """Write the pin when it differs (its mtime stays, so the no-op fast path's stamp holds)."""
    from zoo.files import atomic_write_text

    text = _pin_text(found, zoo)
    try:
        if pin.read_text(encoding="utf-8") == text:
            return
    except OSError:
        pass
    pin.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(pin, text)


def _from_pin(pin: Path, zoo: Any, ref: str) -> Parent | None:
    """The parent `ref` as its pin describes it, when the pin's file is in the zoo's version folder
    with the pinned sha256 (IntegrityError when it holds other bytes); None without a pin or its file."""
    import json

    from zoo.errors import IntegrityError
    from zoo.files import sha256_file
    from zoo.pathsafety import safe_join

    try:
        record = json.loads(pin.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise InvalidInput(f"the parent pin {pin} cannot be read: {e}", hint=f"remove {pin}") from None
    fields = ("ref", "build", "file", "sha256", "sidecars", "license", "outputs")
    if not isinstance(record, dict) or record.get("schema_version") != PIN_SCHEMA or record.get("ref") != ref \
            or any(f not in record for f in fields) or not isinstance(record["outputs"], list) \
            or not isinstance(record["sidecars"], dict):
        raise InvalidInput(f"the parent pin {pin} is not a pin of {ref} (schema_version {PIN_SCHEMA})",
                           hint=f"remove {pin}; it is written again from a zoo that holds {ref}")
    name, version = ref.split("@", 1)
    folder = zoo.version_dir(name, version)
    files = [(safe_join(folder, str(rel), what="parent pin file"), str(sha256))
             for rel, sha256 in [(record["file"], record["sha256"]), *record["sidecars"].items()]]
    if not all(path.is_file() for path, _ in files):
        return None
    for path, sha256 in files:
        if sha256_file(path) != sha256:
            raise IntegrityError(f"{path} does not hold the bytes its pin {pin} names (sha256 {sha256})",
                                 hint=f"remove {path} and `zoo pull {ref}`")
    (path, sha256), sidecars = files[0], tuple(files[1:])
    return Parent(ref=ref, build=str(record["build"]), path=path, sha256=sha256, sidecars=sidecars,
                  license=str(record["license"]), outputs=tuple(record["outputs"]))


def _from_zoo(zoo: Any, manifest: Any, model_section: Mapping[str, Any], spec: Any) -> Parent:
    """The parent's build in the local zoo, placed in its version folder (checked against its sha256)."""
    from zoo.pathsafety import safe_join
    from zoo.registry.pull import pull
    from zoo.registry.select import float_build

    ref = manifest.ref
    try:
        build = manifest.builds[model_section["build"]] if model_section.get("build") else float_build(manifest)
    except KeyError:
        raise InvalidInput(f"model.build {model_section['build']!r}: {ref} has no such build",
                           hint=f"its builds: {', '.join(sorted(manifest.builds))}") from None
    except NotFound as e:
        raise InvalidInput(f"model.from {spec}: {e.message}", hint="set `model.build` to one of its ONNX builds") from None
    if build.format != "onnx":
        raise InvalidInput(f"model.build {build.name!r} of {ref} is in {build.format.upper()} format, which only "
                           "onnxruntime reads", hint="start from one of its ONNX builds (e.g. its float32 one)")
    pulled = pull(ref, build=build.name, offline=True, zoo=zoo)  # every file checked against its sha256
    outputs = tuple(build.outputs[0].shape) if build.outputs else ()
    folder = zoo.version_dir(manifest.name, manifest.version)
    # the external data the ONNX file reads (the pull placed each beside it, checked)
    sidecars = tuple((safe_join(folder, f.path, what="build file"), f.sha256) for f in build.extra_files)
    return Parent(ref=manifest.ref, build=build.name, path=Path(pulled.path), sha256=build.file.sha256,
                  sidecars=sidecars, license=manifest.license, outputs=outputs)


def _missing(ref: str, recipe_dir: Path) -> InvalidInput:
    """The error for a parent that is not in the local zoo, naming the recipe that makes it when
    one beside this recipe does."""
    name, _, version = ref.partition("@")
    maker = _recipe_making(name, version, recipe_dir)
    how = f"`zoo run {maker}`" if maker else "`zoo run RECIPE` with the recipe that builds it"
    return InvalidInput(f"model.from: the parent model {ref} is not in the local zoo",
                        hint=f"publish it first: {how}; or `zoo pull {ref}` from a remote that has it")


def _recipe_making(name: str, version: str, recipe_dir: Path) -> str | None:
    from zoo import yamlio

    for path in sorted(Path(recipe_dir).glob("*.yaml")):
        try:
            data = yamlio.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, yamlio.YAMLError):
            continue
        if isinstance(data, dict) and data.get("name") == name and str(data.get("version")) == version:
            relative = os.path.relpath(path)
            return relative if not relative.startswith("..") else str(path)
    return None


def dependencies(model_section: Mapping[str, Any], recipe_dir: Path) -> list[Path]:
    """The parent's pin, ONNX file and its sidecars (external data), whose contents enter the key of
    every stage that builds the network (and travel to a Dask worker with the stage)."""
    found = parent(model_section, recipe_dir)
    if found is None:
        return []
    name, version = found.ref.split("@", 1)
    return [pin_path(name, version, model_section.get("build")), found.path, *(path for path, _ in found.sidecars)]


def build_model(model_section: Mapping[str, Any], recipe_dir: Path, outputs: int) -> Any:
    """The parent converted to torch (its weights), with its head kept or replaced (`outputs` wide)."""
    from zoo import onnx_to_torch

    found = parent(model_section, recipe_dir)
    module = onnx_to_torch.convert(found.path, where=f"model.from {found.source} build {found.build}")
    if model_section.get("head") == "new":
        onnx_to_torch.replace_head(module, outputs)
        return module
    width = found.outputs[-1] if found.outputs else None
    if isinstance(width, int) and width != outputs:
        raise InvalidInput(f"model.from {found.source} gives {width} outputs but the recipe's model has {outputs} "
                           "(model.num_classes)",
                           hint=f"set `model.num_classes: {width}`, or `model.head: new` for a fresh last layer "
                                f"of {outputs} outputs")
    return module


def attribution(model_section: Mapping[str, Any], recipe_dir: Path) -> list[dict[str, str]]:
    """The parent as an attribution record (export stamps it; deploy puts it in the lineage)."""
    from zoo_stages.lib import provenance

    found = parent(model_section, recipe_dir)
    if found is None:
        return []
    return [provenance.source_attribution(found.source, url=f"{found.source}#{found.build}", sha256=found.sha256,
                                          license=found.license)]


def freeze(model: Any, patterns: list[str]) -> int:
    """Fix the parameters whose names match any of `patterns` (fnmatch); returns how many tensors.
    A pattern that matches nothing is InvalidInput listing the model's parameter names."""
    names = [name for name, _ in model.named_parameters()]
    for pattern in patterns:
        if not any(fnmatch.fnmatchcase(n, pattern) for n in names):
            raise InvalidInput(f"config.freeze: {pattern!r} matches none of the model's parameters",
                               hint=f"its parameters: {', '.join(names[:20])}" + (" ..." if len(names) > 20 else ""))
    frozen = 0
    for name, p in model.named_parameters():
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns):
            p.requires_grad_(False)
            frozen += 1
    return frozen
