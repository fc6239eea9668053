"""Refusing paths that escape their folder: manifest paths, staging files, ONNX external data.

Nothing here executes or imports a model: ONNX files are walked at the protobuf wire level
(`zoo.registry.onnxscan`), skipping weights, and only the recorded locations are checked.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from zoo.errors import UnsafePath
from zoo.registry.manifest import check_relative_path


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


def external_data_locations(onnx_path: Path) -> list[str]:
    """The external-data locations an ONNX file references, read without loading any weights."""
    from zoo.errors import InvalidInput
    from zoo.registry.onnxscan import ScanError, external_locations

    try:
        return external_locations(Path(onnx_path))
    except ScanError as e:
        raise InvalidInput(f"{Path(onnx_path).name} is not a valid ONNX file ({e})",
                           hint="the build's format says onnx; check the file or the format field") from e


def check_external_data(onnx_path: Path, model_relpath: str, version_files: set[str]) -> list[str]:
    """Check every external-data location of the ONNX file at `model_relpath` within its version.

    A location must be a relative path that stays inside the version and names a file the
    manifest lists; anything else (``../../etc/passwd``, ``/etc/passwd``) raises UnsafePath.
    Returns the version-relative paths of the external data files.
    """
    base = PurePosixPath(model_relpath).parent
    needed = []
    for location in external_data_locations(onnx_path):
        try:
            if not location:
                raise ValueError("empty location")
            check_relative_path(location)
        except ValueError as e:
            raise UnsafePath(f"{model_relpath}: external data location {location!r} escapes the model's folder",
                             hint="refusing to install a model that points outside its own files") from e
        rel = (base / location).as_posix()
        if rel not in version_files:
            raise UnsafePath(f"{model_relpath}: external data {location!r} is not a file of this version",
                             hint="list the .data file in the build's extra_files")
        needed.append(rel)
    return needed
