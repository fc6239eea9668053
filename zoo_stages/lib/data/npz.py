"""numpy archives: one array per model input (samples along axis 0), plus the label array.

Features are the archive's arrays by their own names (``x`` becomes ``image``: the old image
archives keep working), or ``data.inputs: {model input: array name}``. The label array is
``data.label`` (default ``y``; ``label: null`` for data without labels). The ``image``
feature, when there is one, gets the image transforms (`images.transform_images`); every
other array is passed as stored (dtype kept: `onnx_run.prepare` casts within a kind).
"""

from __future__ import annotations

import difflib
from pathlib import Path

from zoo_stages.lib.data.errors import DataError
from zoo_stages.lib.data.images import IMAGE_FEATURE, ImageTransform, scaled
from zoo_stages.lib.data.loaded import Loaded, class_labels

LEGACY_IMAGE_ARRAY = "x"
_HINT = "save the archive with np.savez(path, input_name=array, ..., y=labels)"


def load_npz(path: Path, spec: dict, transform: ImageTransform) -> Loaded:
    """The archive's features and labels (see the module docstring)."""
    import numpy as np

    given = spec["path"]
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
    except (OSError, ValueError) as e:
        raise DataError(f"data.path {given!r} is not a readable .npz archive: {e}", hint=_HINT) from None
    check_names(list(arrays), spec)
    label = spec.get("label")
    if spec.get("inputs"):
        features = {name: arrays[array] for name, array in spec["inputs"].items()}
    else:
        features = {IMAGE_FEATURE if name == LEGACY_IMAGE_ARRAY else name: value
                    for name, value in arrays.items() if name != label}
    if not features:
        raise DataError(f"data.path {given!r} has no feature arrays (only the labels)", hint=_HINT)
    counts = {name: (int(v.shape[0]) if v.ndim else None) for name, v in features.items()}
    if None in counts.values() or len(set(counts.values())) > 1:
        shown = ", ".join(f"{n}: {'scalar' if c is None else c}" for n, c in counts.items())
        raise DataError(f"data.path {given!r}: the feature arrays hold different numbers of samples ({shown})",
                        hint="every array holds the samples along its first axis")
    n = next(iter(counts.values()))
    facts: dict = {"arrays": {name: {"shape": list(v.shape[1:]), "dtype": str(v.dtype)} for name, v in features.items()}}
    if IMAGE_FEATURE in features:
        x = features[IMAGE_FEATURE]
        if x.ndim == 3:
            x = x[:, None]
        if x.ndim != 4:
            raise DataError(f"data.path {given!r}: the images have shape {x.shape}, expected (N,H,W) or (N,C,H,W)")
        features[IMAGE_FEATURE], used = scaled(x, transform.scale, f"data.path {given!r}: the images")
        facts.update(source_sizes=[list(x.shape[-2:])], source_channels=int(x.shape[1]), scale=used)
    elif spec.get("image") or spec.get("image_size") is not None or spec.get("channels") is not None:
        raise DataError(f"data.image: {given!r} has no image array (`x`, or one mapped to `image` by data.inputs)",
                        hint="image transforms apply to the `image` feature; remove them for other data")
    else:
        for name, v in features.items():
            if np.issubdtype(v.dtype, np.floating) and v.size and not np.isfinite(v).all():
                raise DataError(f"data.path {given!r}: array {name!r} holds NaN or infinite values")
    if label is None:
        return Loaded(features, None, None, facts=facts)
    values = arrays[label]
    if values.ndim != 1 or len(values) != n:
        raise DataError(f"data.label: the array {label!r} in {given!r} has shape {values.shape}, "
                        f"expected ({n},): one label per sample")
    labels, kind, names = class_labels(values, f"data.label: the array {label!r} in {given!r}")
    return Loaded(features, labels, kind, class_names=names, facts=facts)


def check_names(arrays: list[str], spec: dict) -> None:
    """DataError unless the archive, whose arrays are named `arrays`, holds the label and the
    input arrays the section names (also checked before a run, from the zip's listing alone)."""
    given = spec["path"]
    label = spec.get("label")
    if label is not None and label not in arrays:
        raise DataError(f"data.label: {given!r} has no array {label!r}{_did_you_mean(label, arrays)} "
                        f"(it has: {', '.join(arrays) or 'nothing'})",
                        hint=_HINT + "; or `data.label: null` for data without labels")
    for name, array in (spec.get("inputs") or {}).items():
        if array not in arrays:
            raise DataError(f"data.inputs.{name}: {given!r} has no array {array!r}{_did_you_mean(array, arrays)} "
                            f"(it has: {', '.join(arrays)})", hint=_HINT)


def _did_you_mean(name: str, choices) -> str:
    close = difflib.get_close_matches(name, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
