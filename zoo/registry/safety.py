"""Refusing paths that escape their folder: manifest paths, staging files, ONNX external data.

Nothing here executes or imports a model: ONNX files are parsed as protobuf without their
external data, and only the recorded locations are checked.
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
    """The external-data locations an ONNX file references, read without loading the data."""
    import onnx
    from onnx.external_data_helper import ExternalDataInfo, _get_all_tensors

    model = onnx.load(str(onnx_path), load_external_data=False)
    found = []
    for tensor in _get_all_tensors(model):
        if tensor.HasField("data_location") and tensor.data_location == onnx.TensorProto.EXTERNAL:
            found.append(ExternalDataInfo(tensor).location)
    return sorted(set(found))


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
