"""Paths that must stay inside their folder: manifest paths, files of a staging folder or of a
pulled version, and ONNX external-data locations. The one place these rules live.

A path is accepted only as a relative POSIX path without ``..``, a backslash, a NUL byte or a
drive letter (`check_relative_path`); where the folder exists on disk, the joined path must also
resolve inside it, so no symbolic link leads out (`safe_join`). An ONNX model's external-data
locations follow the same rules (`external_data_locations`); next to a model on disk they must
also name files that are there (`external_data_files`), and in a version of the zoo files that
the version lists (`check_external_data`). A path under a folder that others may write to (a
folder remote) must resolve inside it (`inside_folder`). Escapes raise `zoo.errors.UnsafePath`.

ONNX files are read at the protobuf wire level (`zoo.onnxwire`): nothing here imports onnx,
loads weights or executes a model.
"""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath

from zoo.errors import InvalidInput, UnsafePath

EXTERNAL_DATA_HINT = ("external data must be a relative path inside the model's folder: save the model with its "
                      "data next to it (onnx.save(model, path, save_as_external_data=True, location='model.onnx.data'))")


class EscapingPath(ValueError):
    """A manifest path that is not a plain relative path inside its folder.

    A ValueError (so pydantic reports it as a field error) of its own type, so that loading a
    manifest can tell it apart and raise UnsafePath (exit 4) instead of InvalidInput (exit 2).
    """


def check_relative_path(value: str) -> str:
    """A relative POSIX path that stays inside its folder (no '..', no absolute, no backslash),
    normalised (``a/./b`` is ``a/b``); EscapingPath otherwise."""
    if not value or "\\" in value or "\x00" in value:
        raise EscapingPath(f"invalid path {value!r}")
    p = PurePosixPath(value)
    if p.is_absolute() or any(part in ("..", "") for part in p.parts) or re.match(r"^[A-Za-z]:", value):
        raise EscapingPath(f"path {value!r} escapes its folder")
    return p.as_posix()


def safe_join(root: Path, relative: str, *, what: str = "path") -> Path:
    """`root / relative`, refusing absolute paths, '..', and symlinks leading outside `root`."""
    try:
        rel = check_relative_path(relative)
    except ValueError as e:
        raise UnsafePath(f"{what} {relative!r} escapes its folder", hint="paths must be relative and stay inside") from e
    root = Path(root)
    target = root / rel
    real_root = os.path.realpath(root)
    real = os.path.realpath(target)
    if real != real_root and not real.startswith(real_root + os.sep):
        raise UnsafePath(f"{what} {relative!r} resolves outside {root} (symbolic link?)")
    return target


def inside_folder(root: str | Path, path: str | Path, *, what: str) -> Path:
    """`path`, which names something under the folder `root`, if it resolves inside `root`: no
    component (a symbolic link to a folder or file) leads out. UnsafePath naming `path` and `what`
    otherwise. `root` is taken as it resolves (the user named it); everything below it is not
    trusted (a folder remote anyone may have written to)."""
    real_root = os.path.realpath(root)
    absolute = os.path.abspath(path)
    real = os.path.realpath(absolute)
    if real == real_root or real.startswith(real_root + os.sep):
        return Path(absolute)
    raise UnsafePath(f"{absolute} resolves outside {what} {root} (to {real}, through a symbolic link)",
                     hint=f"remove the link from {root}: zoo reads and writes only inside the folder; nothing was "
                          "written outside it")


# ---------------------------------------------------------------------------------------------
# ONNX external data


def check_external_location(location: str, *, model: str, tensor: str = "", folder: Path | None = None) -> str:
    """`location`, an external-data location recorded in the ONNX file `model` (a name for
    messages), as a normalised relative POSIX path inside the model's folder.

    UnsafePath for an empty location, an absolute path, ``..``, a backslash or a drive letter;
    with `folder` (the model's folder on disk), also for one that resolves outside it.
    """
    of_tensor = f" of tensor {tensor!r}" if tensor else ""
    if not location:
        raise UnsafePath(f"{model}: tensor {tensor!r} is marked external but names no location",
                         hint=EXTERNAL_DATA_HINT)
    try:
        rel = check_relative_path(location)
    except EscapingPath:
        raise UnsafePath(f"{model}: external data location {location!r}{of_tensor} escapes the model's folder",
                         hint=EXTERNAL_DATA_HINT) from None
    if folder is not None:
        try:
            safe_join(folder, rel)
        except UnsafePath:
            raise UnsafePath(f"{model}: external data location {location!r}{of_tensor} resolves outside the "
                             f"model's folder {folder} (symbolic link?)", hint=EXTERNAL_DATA_HINT) from None
    return rel


def _scan(onnx_path: Path, model: str) -> list[tuple[str, str]]:
    from zoo.onnxwire import ScanError, external_tensors

    try:
        return external_tensors(onnx_path)
    except ScanError as e:
        raise InvalidInput(f"{model} is not a valid ONNX file ({e})",
                           hint="check the file (a build whose format says onnx must be an ONNX model)") from None


def external_data_locations(onnx_path: Path, *, model: str | None = None) -> list[str]:
    """The sorted, distinct external-data locations of the ONNX file at `onnx_path`, each checked
    by `check_external_location` (not against a folder: the file may be a blob of the zoo).

    `model` names the file in messages (default: its file name). InvalidInput when the file is
    not ONNX. Reads only the external-data records, never the weights.
    """
    onnx_path = Path(onnx_path)
    model = model or onnx_path.name
    return sorted({check_external_location(location, model=model, tensor=tensor)
                   for location, tensor in _scan(onnx_path, model)})


def external_data_files(onnx_path: Path) -> list[str]:
    """`external_data_locations` of the ONNX file at `onnx_path`, each also resolving inside the
    file's folder (no symbolic link out: UnsafePath) and naming a file there (InvalidInput)."""
    onnx_path = Path(onnx_path)
    if not onnx_path.is_file():
        raise InvalidInput(f"ONNX model {onnx_path} does not exist")
    folder, model = onnx_path.parent, onnx_path.name
    found: set[str] = set()
    for location, tensor in _scan(onnx_path, model):
        rel = check_external_location(location, model=model, tensor=tensor, folder=folder)
        if not (folder / rel).is_file():
            raise InvalidInput(f"{model}: external data file {location!r} is missing next to the model in {folder}",
                               hint="copy the .onnx file together with its external data file(s)")
        found.add(rel)
    return sorted(found)


def check_external_data(onnx_path: Path, model_relpath: str, version_files: set[str]) -> list[str]:
    """The version-relative paths of the external data of the ONNX file at `model_relpath` in a
    version of the zoo (`onnx_path`: its bytes, e.g. a blob).

    Each location must pass `check_external_location` and name a file the version's manifest
    lists (`version_files`); UnsafePath otherwise.
    """
    base = PurePosixPath(model_relpath).parent
    needed = []
    for location in external_data_locations(onnx_path, model=model_relpath):
        rel = (base / location).as_posix()
        if rel not in version_files:
            raise UnsafePath(f"{model_relpath}: external data {location!r} is not a file of this version",
                             hint="list the .data file in the build's extra_files")
        needed.append(rel)
    return needed
