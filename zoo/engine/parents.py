"""The zoo models a recipe names (``model.from: zoo:NAME@VERSION``), resolved and pinned for the stages
that read them, before their keys are computed.

A recipe section names them (`zoo.section.RecipeSection.references`: {field: ``zoo:NAME@VERSION``
or ``zoo:NAME@VERSION#BUILD``}); the engine asks it with the values one kind declares, so a kind is
given exactly the models whose fields are in its key, as `zoo.stage.PinnedModel`s keyed by the field
(``ctx.references["model.from"]``). The engine knows no section or field by name.

Resolving takes the version from the local zoo, offline (a version the zoo lacks is an error naming
the recipe beside this one that publishes it, or `zoo pull`), and one of its ONNX builds: the one
the reference names, else its float32 build (`zoo.registry.select.float_build`), placed in the
version's folder with every file checked against its sha256.

What is read of the version's manifest (the build chosen, its file and sha256, the license, its
sidecars' sha256, the output shape) is written to a *pin*, ``<cache>/parents/<name>/<version>/<build>.json``
(canonical JSON with a schema_version, rewritten only when it changes). The pin, the ONNX file and its
sidecars are the model's `files`, which a kind that reads the model lists among its dependencies:
so its key holds exactly what is read of the model, named ``cache:parents/…`` and ``zoo-home:models/…``
(`keys.dependency_label`) and so the same on every machine whose zoo has that version (the manifest's
publish time and timing figures are not read). A Dask worker that shares no disk with the caller is
given those files like any other keyed file (zoo/engine/stage_files.py); where its zoo lacks the
version, the model is resolved from its pin, provided the files the pin names are in the zoo's
version folder with the pinned sha256. The worker needs no `zoo pull`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping

from zoo.errors import IntegrityError, InvalidInput, NotFound
from zoo.stage import PinnedModel

if TYPE_CHECKING:
    from zoo.registry.manifest import Build, Manifest
    from zoo.registry.store import LocalZoo

PREFIX = "zoo:"
BUILD_MARK = "#"  # zoo:NAME@VERSION#BUILD
PINS = "parents"  # <cache>/parents/<name>/<version>/<build or DEFAULT_BUILD>.json: what is read of a model
PIN_SCHEMA = 2  # 2: the build's sidecars (ONNX external data) with their sha256
DEFAULT_BUILD = "default"  # the pin of a reference that names no build (its float32 build)
PIN_FIELDS = ("ref", "build", "file", "sha256", "sidecars", "license", "outputs")


class StageReferences(Mapping[str, PinnedModel]):
    """`for_stage`, resolved when a kind first reads it (what contexts hold): a stage whose kind never
    reads its references (tools_used, an effect after the run) pays for no checksum of the model's
    files, and an error comes where the kind reads the model, as it would from the kind itself."""

    def __init__(self, shared: Mapping[str, Any], recipe_dir: Path):
        self._shared, self._recipe_dir = shared, recipe_dir
        self._found: dict[str, PinnedModel] | None = None

    def _models(self) -> dict[str, PinnedModel]:
        if self._found is None:
            self._found = for_stage(self._shared, self._recipe_dir)
        return self._found

    def __getitem__(self, field: str) -> PinnedModel:
        return self._models()[field]

    def __iter__(self) -> Iterator[str]:
        return iter(self._models())

    def __len__(self) -> int:
        return len(self._models())


def for_stage(shared: Mapping[str, Any], recipe_dir: Path) -> dict[str, PinnedModel]:
    """The zoo models that the recipe-wide values a kind declares (`shared`: {section: its declared
    values}) name, resolved and pinned: {"section.field": model}."""
    from zoo.engine import section_loader

    found: dict[str, PinnedModel] = {}
    for section, value in shared.items():
        if value is None or section not in section_loader.entries():
            continue
        plain = dict(value) if isinstance(value, Mapping) else value  # a SharedView copies its declared values
        for name, ref in section_loader.get(section).references(plain).items():
            where = f"{section}.{name}"
            found[where] = resolve(ref, recipe_dir, where=where)
    return found


def resolve(reference: str, recipe_dir: Path, *, where: str) -> PinnedModel:
    """The model `reference` names (``zoo:NAME@VERSION[#BUILD]``, written at recipe field `where`),
    from the local zoo (its pin written), or from its pin where the zoo lacks the version (a Dask
    worker given both); InvalidInput naming the command that makes it when neither has it."""
    from zoo.registry.refs import check_build, parse_pinned
    from zoo.registry.store import LocalZoo

    if not reference.startswith(PREFIX):
        raise InvalidInput(f"{where}: {reference!r} is not a zoo model (zoo:NAME@VERSION)",
                           hint="the recipe section's `references` must name zoo: models only")
    ref, _, build = reference.removeprefix(PREFIX).partition(BUILD_MARK)
    pinned = parse_pinned(ref)
    if build:
        check_build(build)
    zoo = LocalZoo()
    pin = pin_path(pinned.name, str(pinned.version), build or None)
    try:
        manifest = zoo.resolve(pinned)
    except NotFound:
        found = _from_pin(pin, zoo, f"{pinned.name}@{pinned.version}")
        if found is None:
            raise _missing(ref, recipe_dir, where) from None
        return found
    record = _from_zoo(zoo, manifest, build or None, f"{PREFIX}{ref}", where)
    _write_pin(pin, record)
    return _model(record, zoo.version_dir(manifest.name, manifest.version), pin)


def pin_path(name: str, version: str, build: str | None) -> Path:
    """Where the pin of `name@version`'s `build` (None: its float32 build) lies in the run cache."""
    from zoo import paths
    from zoo.pathsafety import safe_join

    return safe_join(paths.cache_dir(), f"{PINS}/{name}/{version}/{build or DEFAULT_BUILD}.json", what="parent pin")


def _model(record: Mapping[str, Any], folder: Path, pin: Path) -> PinnedModel:
    """The model a pin `record` describes, its files in the zoo's version `folder`."""
    from zoo.pathsafety import safe_join

    path = safe_join(folder, str(record["file"]), what="parent pin file")
    sidecars = [safe_join(folder, str(rel), what="parent pin file") for rel in record["sidecars"]]
    return PinnedModel(ref=str(record["ref"]), build=str(record["build"]), path=path, sha256=str(record["sha256"]),
                       license=str(record["license"]), outputs=tuple(record["outputs"]),
                       files=(pin, path, *sidecars))


def _pin_text(record: Mapping[str, Any]) -> str:
    return json.dumps({"schema_version": PIN_SCHEMA, **record}, sort_keys=True, indent=1) + "\n"


def _write_pin(pin: Path, record: Mapping[str, Any]) -> None:
    """Write the pin when it differs (its mtime stays, so the no-op fast path's stamp holds)."""
    from zoo.files import atomic_write_text

    text = _pin_text(record)
    try:
        if pin.read_text(encoding="utf-8") == text:
            return
    except OSError:
        pass
    pin.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(pin, text)


def _from_pin(pin: Path, zoo: "LocalZoo", ref: str) -> PinnedModel | None:
    """The model `ref` as its pin describes it, when the pin's files are in the zoo's version folder
    with the pinned sha256 (IntegrityError when one holds other bytes); None without a pin or its files."""
    from zoo.files import sha256_file

    try:
        record = json.loads(pin.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise InvalidInput(f"the parent pin {pin} cannot be read: {e}", hint=f"remove {pin}") from None
    if not isinstance(record, dict) or record.get("schema_version") != PIN_SCHEMA or record.get("ref") != ref \
            or any(f not in record for f in PIN_FIELDS) or not isinstance(record["outputs"], list) \
            or not isinstance(record["sidecars"], dict):
        raise InvalidInput(f"the parent pin {pin} is not a pin of {ref} (schema_version {PIN_SCHEMA})",
                           hint=f"remove {pin}; it is written again from a zoo that holds {ref}")
    name, version = ref.split("@", 1)
    model = _model(record, zoo.version_dir(name, version), pin)
    sha256s = [str(record["sha256"]), *(str(s) for s in record["sidecars"].values())]
    files = list(zip(model.files[1:], sha256s))
    if not all(path.is_file() for path, _ in files):
        return None
    for path, sha256 in files:
        if sha256_file(path) != sha256:
            raise IntegrityError(f"{path} does not hold the bytes its pin {pin} names (sha256 {sha256})",
                                 hint=f"remove {path} and `zoo pull {ref}`")
    return model


def _from_zoo(zoo: "LocalZoo", manifest: "Manifest", build_name: str | None, spec: str, where: str) -> dict[str, Any]:
    """The pin record of the model's build in the local zoo, placed in its version folder (each file
    checked against its sha256)."""
    from zoo.registry.pull import pull

    ref = manifest.ref
    build = _build(manifest, build_name, spec, where)
    pulled = pull(ref, build=build.name, offline=True, zoo=zoo)  # every file checked against its sha256
    folder = zoo.version_dir(manifest.name, manifest.version)
    return {"ref": ref, "build": build.name, "file": Path(pulled.path).relative_to(folder).as_posix(),
            "sha256": build.file.sha256,
            # the external data the ONNX file reads (the pull placed each beside it, checked)
            "sidecars": {f.path: f.sha256 for f in build.extra_files},
            "license": manifest.license, "outputs": list(build.outputs[0].shape) if build.outputs else []}


def _build(manifest: "Manifest", name: str | None, spec: str, where: str) -> "Build":
    """The ONNX build `name` of the version (None: its float32 one)."""
    from zoo.registry.select import float_build

    ref = manifest.ref
    try:
        build = manifest.builds[name] if name else float_build(manifest)
    except KeyError:
        raise InvalidInput(f"{where} {spec}: {ref} has no build {name!r}",
                           hint=f"its builds: {', '.join(sorted(manifest.builds))}") from None
    except NotFound as e:
        raise InvalidInput(f"{where} {spec}: {e.message}", hint="name one of its ONNX builds") from None
    if build.format != "onnx":
        raise InvalidInput(f"{where} {spec}: build {build.name!r} of {ref} is in {build.format.upper()} format, "
                           "which only onnxruntime reads", hint="start from one of its ONNX builds (e.g. its float32 one)")
    return build


def _missing(ref: str, recipe_dir: Path, where: str) -> InvalidInput:
    """The error for a model that is not in the local zoo, naming the recipe that makes it when one
    beside this recipe does."""
    name, _, version = ref.partition("@")
    maker = _recipe_making(name, version, recipe_dir)
    how = f"`zoo run {maker}`" if maker else "`zoo run RECIPE` with the recipe that builds it"
    return InvalidInput(f"{where}: the parent model {ref} is not in the local zoo",
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
