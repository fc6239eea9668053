"""The recipe's dataset as numpy arrays, with a fixed train/held-out split.

Shared by train (fit), quantize (calibration) and verify (accuracy), so all three see exactly
the same images in the same order. Only numpy, scikit-learn (digits) and, for common image
formats, Pillow are used; torch is never imported here.

Sources (the recipe's ``data:`` section, see `zoo.engine.recipe.DataSpec`):

- ``digits``: scikit-learn's bundled ``load_digits()`` (1797 real 8x8 images, values 0..16);
- ``folder``: one subfolder per class, class index = position of the subfolder name in sorted
  order. Binary PGM/PPM (P5/P6) files are read with numpy; PNG, JPEG, BMP, GIF, TIFF and WebP
  need Pillow. Hidden files and files with other extensions are ignored;
- ``npz``: a numpy archive with arrays ``x`` (N,H,W or N,C,H,W) and ``y`` (N integer labels).

What you get (`load_split`): a `Split` of named feature arrays (samples along axis 0) and
labels. The image sources give one feature, ``image`` (float32 NCHW in [0, 1]), and ``labels``
(int64 class indices); stages bind features to a model's inputs by name
(`zoo_stages.lib.onnx_run.bind`: a single feature feeds a single-input model whatever its name).
Normalisation is a plain rescale to [0, 1] and nothing else (no mean/std): digits are divided
by 16, 8-bit images by 255, 16-bit images by 65535; float ``npz`` arrays must already lie in
[0, 1]. Images are resized to ``image_size`` x ``image_size`` with a numpy bilinear resize
(half-pixel centres, edge clamping: the same as torch's ``interpolate(mode="bilinear",
align_corners=False)`` without antialiasing), so results do not depend on Pillow's version.
Grey images are replicated to ``channels``; RGB(A) images become grey (ITU-R 601 luma) when
``channels`` is 1, and lose alpha when ``channels`` is 3.

The split (documented because releases depend on it): every sample gets the sort key
``sha256(f"{split_seed}:{index}")``; samples are ordered by that key (a shuffle that is
identical on every machine and numpy version), ``limit`` keeps the first ``limit`` of that
order, then the split is stratified: ``ceil(val_fraction * N)`` held-out samples are shared
among classes by largest remainder (ties to the lower class index), and each class gives its
first samples (in shuffled order) to the held-out split. Both splits keep the shuffled order.

Results are cached in-process (keyed by the section, the resolved path and the files' sizes
and mtimes), and the returned arrays are read-only: copy them before modifying.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from zoo.errors import InvalidInput

if TYPE_CHECKING:
    import numpy as np

PILLOW_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")
NETPBM_SUFFIXES = (".pgm", ".ppm", ".pnm")
IMAGE_SUFFIXES = PILLOW_SUFFIXES + NETPBM_SUFFIXES

_DEFAULTS = {"path": None, "image_size": 8, "channels": 1, "val_fraction": 0.2, "split_seed": 0, "limit": None}


IMAGE_FEATURE = "image"  # the one feature of the image sources


@dataclass(frozen=True)
class Split:
    """One split of the recipe's dataset: named feature arrays and their labels.

    Every feature array holds the samples along axis 0, in the same order as ``labels``
    (None for data without labels). The arrays are read-only (cached): copy before modifying.
    """

    features: Mapping[str, "np.ndarray"]
    labels: "np.ndarray | None"

    def __len__(self) -> int:
        first = next(iter(self.features.values()), None)
        return 0 if first is None else int(first.shape[0])

    def take(self, indices: Any) -> "Split":
        """The samples at `indices` (an index array or a slice), in that order."""
        return Split({k: v[indices] for k, v in self.features.items()},
                     None if self.labels is None else self.labels[indices])

    def head(self, n: int | None) -> "Split":
        """The first `n` samples (all of them when `n` is None)."""
        return self if n is None else self.take(slice(0, n))

    def single(self, where: str) -> "np.ndarray":
        """The only feature array; InvalidInput naming `where` when the data has several."""
        if len(self.features) != 1:
            raise InvalidInput(f"{where} takes one input array, but the data has {len(self.features)} "
                               f"({', '.join(self.features)})")
        return next(iter(self.features.values()))


# ---------------------------------------------------------------------------------------------
# public API


def load_split(data: dict, recipe_dir: Path, split: str) -> Split:
    """One split ("train" or "val") of the recipe's dataset (see the module docstring).

    The arrays are read-only and cached, so repeated calls are cheap.
    """
    if split not in ("train", "val"):
        raise InvalidInput(f"unknown dataset split {split!r}", hint="use 'train' or 'val'")
    spec = _spec(data)
    x, y = _split_arrays(_cache_key(spec, Path(recipe_dir)), split)
    return Split({IMAGE_FEATURE: x}, y)


def split_info(data: dict, recipe_dir: Path) -> dict:
    """A JSON-able record of the split: source, sizes, seed, and digests of the index lists."""
    spec = _spec(data)
    key = _cache_key(spec, Path(recipe_dir))
    full = _full_dataset(key)
    train_idx, val_idx = _indices(key)
    info = {
        "source": spec["source"],
        "path": spec["path"],
        "image_size": spec["image_size"],
        "channels": spec["channels"],
        "num_samples": int(len(train_idx) + len(val_idx)),
        "num_available": int(len(full.y)),
        "num_train": int(len(train_idx)),
        "num_val": int(len(val_idx)),
        "num_classes": int(full.num_classes),
        "val_fraction": spec["val_fraction"],
        "split_seed": spec["split_seed"],
        "limit": spec["limit"],
        "method": "sha256-shuffle+stratified",
        "train_indices_sha256": _digest_indices(train_idx),
        "val_indices_sha256": _digest_indices(val_idx),
    }
    if full.class_names is not None:
        info["classes"] = list(full.class_names)
    return info


def data_dependencies(data: dict, recipe_dir: Path) -> list[Path]:
    """Files or folders whose content must enter cache keys (the folder or .npz; [] for digits)."""
    spec = _spec(data)
    if spec["source"] == "digits":
        return []
    return [_resolve_path(spec, Path(recipe_dir))]


def class_names(data: dict, recipe_dir: Path) -> list[str]:
    """Human-readable class names: folder names for ``folder``, else "0", "1", ..."""
    spec = _spec(data)
    full = _full_dataset(_cache_key(spec, Path(recipe_dir)))
    if full.class_names is not None:
        return list(full.class_names)
    return [str(i) for i in range(full.num_classes)]


def resize_bilinear(x: np.ndarray, size: int) -> np.ndarray:
    """Resize NCHW (or CHW) float images to size x size; half-pixel centres, edges clamped."""
    import numpy as np

    x = np.asarray(x, dtype=np.float32)
    if x.shape[-2:] == (size, size):
        return x
    rows_lo, rows_hi, rows_w = _bilinear_taps(x.shape[-2], size)
    cols_lo, cols_hi, cols_w = _bilinear_taps(x.shape[-1], size)
    rw = rows_w[:, None]
    x = x[..., rows_lo, :] * (1 - rw) + x[..., rows_hi, :] * rw
    x = x[..., cols_lo] * (1 - cols_w) + x[..., cols_hi] * cols_w
    return x.astype(np.float32, copy=False)


def clear_cache() -> None:
    """Forget every cached dataset (tests; long-lived processes after data changed on disk)."""
    _full_dataset.cache_clear()
    _indices.cache_clear()
    _split_arrays.cache_clear()


# ---------------------------------------------------------------------------------------------
# validation and caching


def _spec(data: Any) -> dict:
    """The `data:` section with defaults filled in, validated with the recipe's own model."""
    if not isinstance(data, dict) or not data:
        raise InvalidInput("this stage needs the recipe's `data:` section",
                           hint="add e.g. `data: {source: digits, image_size: 8}` to the recipe")
    from pydantic import ValidationError

    from zoo.engine.recipe import DataSpec

    try:
        spec = DataSpec.model_validate(data).model_dump(mode="json")
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise InvalidInput(f"data.{where}: {first['msg']}", hint="see `zoo schema` for the `data:` fields") from None
    if spec["source"] != "digits" and not spec["path"]:
        raise InvalidInput(f"data.path is required when data.source is {spec['source']!r}",
                           hint="set `data.path:` to the folder or .npz file, relative to the recipe")
    return spec


def _resolve_path(spec: dict, recipe_dir: Path) -> Path:
    p = Path(spec["path"]).expanduser()
    if not p.is_absolute():
        p = recipe_dir / p
    p = p.resolve()
    if spec["source"] == "folder" and not p.is_dir():
        raise InvalidInput(f"data.path {spec['path']!r} is not a folder ({p})",
                           hint="data.source: folder needs a folder with one subfolder per class")
    if spec["source"] == "npz" and not p.is_file():
        raise InvalidInput(f"data.path {spec['path']!r} is not a file ({p})",
                           hint="data.source: npz needs a .npz file with arrays `x` and `y`")
    return p


def _cache_key(spec: dict, recipe_dir: Path) -> str:
    """A string naming the section, the resolved data and its on-disk state (size, mtime)."""
    state: Any = None
    if spec["source"] != "digits":
        p = _resolve_path(spec, recipe_dir)
        if p.is_file():
            st = p.stat()
            state = [str(p), st.st_size, st.st_mtime_ns]
        else:
            state = [str(p)]
            for dirpath, dirnames, filenames in os.walk(p):
                dirnames.sort()
                for name in sorted(filenames):
                    st = os.stat(os.path.join(dirpath, name))
                    state.append([os.path.relpath(os.path.join(dirpath, name), p), st.st_size, st.st_mtime_ns])
    return json.dumps({"spec": spec, "state": state}, sort_keys=True)


class _Full:
    """Every sample of the source at its own size, with its labels (before limit and split)."""

    def __init__(self, x: np.ndarray, y: np.ndarray, num_classes: int, class_names: list[str] | None):
        self.x, self.y, self.num_classes, self.class_names = x, y, num_classes, class_names


@lru_cache(maxsize=4)
def _full_dataset(key: str) -> _Full:
    import numpy as np

    spec = json.loads(key)["spec"]
    state = json.loads(key)["state"]
    source = spec["source"]
    if source == "digits":
        x, y, names = _load_digits()
    elif source == "npz":
        x, y, names = _load_npz(Path(state[0]), spec["path"])
    else:
        x, y, names = _load_folder(Path(state[0]), spec["path"], spec["channels"], spec["image_size"])
    # resizing and channel replication happen per split, after `limit`: only the images used pay
    num_classes = len(names) if names is not None else int(y.max()) + 1 if len(y) else 0
    return _Full(x, y.astype(np.int64), num_classes, names)


@lru_cache(maxsize=8)
def _indices(key: str) -> tuple[np.ndarray, np.ndarray]:
    spec = json.loads(key)["spec"]
    full = _full_dataset(key)
    return _stratified_split(full.y, spec["val_fraction"], spec["split_seed"], spec["limit"])


@lru_cache(maxsize=8)
def _split_arrays(key: str, split: str) -> tuple[np.ndarray, np.ndarray]:
    import numpy as np

    spec = json.loads(key)["spec"]
    full = _full_dataset(key)
    train_idx, val_idx = _indices(key)
    idx = train_idx if split == "train" else val_idx
    # resize before replicating channels: both are per-image and linear, so the order only changes the cost
    x = resize_bilinear(full.x[idx], spec["image_size"])
    x = np.ascontiguousarray(_to_channels(x, spec["channels"], where="data.channels"), dtype=np.float32)
    y = full.y[idx]
    x.setflags(write=False)
    y.setflags(write=False)
    return x, y


# ---------------------------------------------------------------------------------------------
# split


def _shuffle_order(n: int, seed: int) -> np.ndarray:
    """A permutation of range(n) fixed by `seed`, the same on every machine and numpy version."""
    import numpy as np

    keys = [hashlib.sha256(f"{seed}:{i}".encode()).digest() for i in range(n)]
    return np.array(sorted(range(n), key=keys.__getitem__), dtype=np.int64)


def _stratified_split(y: np.ndarray, val_fraction: float, seed: int, limit: int | None) -> tuple[np.ndarray, np.ndarray]:
    import numpy as np

    order = _shuffle_order(len(y), seed)
    if limit is not None:
        order = order[:limit]
    n = len(order)
    n_val = math.ceil(val_fraction * n)
    if n < 2 or n_val >= n:
        raise InvalidInput(f"the dataset has {n} samples: too few to hold out {val_fraction:.0%} and still train",
                           hint="raise data.limit, lower data.val_fraction or add data")
    labels = y[order]
    classes = np.unique(labels)
    counts = np.array([(labels == c).sum() for c in classes])
    exact = counts * (n_val / n)  # each class's ideal share; the shares sum to n_val
    share = np.floor(exact).astype(int)
    rest = n_val - int(share.sum())
    # largest remainder; stable sort keeps the lower class index first on ties
    for j in np.argsort(-(exact - share), kind="stable")[:rest]:
        share[j] += 1
    is_val = np.zeros(n, dtype=bool)
    for c, k in zip(classes, share):
        members = np.flatnonzero(labels == c)  # already in shuffled order
        is_val[members[:k]] = True
    return order[~is_val], order[is_val]


def _digest_indices(idx: np.ndarray) -> str:
    return hashlib.sha256(json.dumps([int(i) for i in idx], separators=(",", ":")).encode()).hexdigest()


# ---------------------------------------------------------------------------------------------
# sources


def _load_digits() -> tuple[np.ndarray, np.ndarray, None]:
    import numpy as np

    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = (bunch.images.astype(np.float32) / 16.0)[:, None, :, :]
    return x, bunch.target.astype(np.int64), None


def _load_npz(path: Path, given: str) -> tuple[np.ndarray, np.ndarray, None]:
    import numpy as np

    try:
        with np.load(path, allow_pickle=False) as archive:
            missing = [k for k in ("x", "y") if k not in archive.files]
            if missing:
                raise InvalidInput(f"data.path {given!r} has no array {missing[0]!r} (it has: {', '.join(archive.files) or 'nothing'})",
                                   hint="save the archive with np.savez(path, x=images, y=labels)")
            x, y = archive["x"], archive["y"]
    except InvalidInput:
        raise
    except (OSError, ValueError) as e:
        raise InvalidInput(f"data.path {given!r} is not a readable .npz archive: {e}",
                           hint="save the archive with np.savez(path, x=images, y=labels)") from None
    if x.ndim == 3:
        x = x[:, None]
    if x.ndim != 4:
        raise InvalidInput(f"data.path {given!r}: x has shape {x.shape}, expected (N,H,W) or (N,C,H,W)")
    if y.ndim != 1 or len(y) != len(x):
        raise InvalidInput(f"data.path {given!r}: y has shape {y.shape}, expected ({len(x)},) labels")
    if not np.issubdtype(y.dtype, np.integer):
        raise InvalidInput(f"data.path {given!r}: y must hold integer class indices (got {y.dtype})")
    if len(y) and y.min() < 0:
        raise InvalidInput(f"data.path {given!r}: y holds negative labels", hint="labels are class indices 0..K-1")
    return _scale(x, f"data.path {given!r}: x"), y.astype(np.int64), None


def _scale(x: np.ndarray, where: str) -> np.ndarray:
    """Integer pixels to [0, 1] by their type's range; float pixels must already be in [0, 1]."""
    import numpy as np

    if x.dtype == np.uint8:
        return x.astype(np.float32) / 255.0
    if x.dtype == np.uint16:
        return x.astype(np.float32) / 65535.0
    if np.issubdtype(x.dtype, np.floating):
        x = x.astype(np.float32)
        if x.size and (not np.isfinite(x).all() or x.min() < 0 or x.max() > 1):
            raise InvalidInput(f"{where}: float pixels must lie in [0, 1] (got {x.min():g}..{x.max():g})",
                               hint="store uint8 images, or divide by the maximum before saving")
        return x
    raise InvalidInput(f"{where}: unsupported pixel type {x.dtype}", hint="use uint8, uint16 or float32 in [0, 1]")


def _load_folder(root: Path, given: str, channels: int, size: int) -> tuple[np.ndarray, np.ndarray, list[str]]:
    import numpy as np

    classes = sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    if not classes:
        raise InvalidInput(f"data.path {given!r} has no class subfolders",
                           hint="put the images of each class in their own subfolder, e.g. cats/1.png, dogs/2.png")
    images, labels = [], []
    for index, name in enumerate(classes):
        files = sorted(f for f in (root / name).iterdir()
                       if f.is_file() and not f.name.startswith(".") and f.suffix.lower() in IMAGE_SUFFIXES)
        if not files:
            raise InvalidInput(f"data.path {given!r}: class folder {name!r} has no images",
                               hint=f"supported files: {', '.join(IMAGE_SUFFIXES)}")
        for f in files:
            img = _read_image(f, channels)
            images.append(resize_bilinear(_to_channels(img[None], channels, where=str(f))[0], size))
            labels.append(index)
    return np.stack(images), np.array(labels, dtype=np.int64), classes


def _read_image(path: Path, channels: int) -> np.ndarray:
    """One image file as float32 CHW in [0, 1]."""
    import numpy as np

    if path.suffix.lower() in NETPBM_SUFFIXES:
        return _read_netpbm(path)
    try:
        from PIL import Image
    except ImportError:
        raise InvalidInput(f"reading {path.suffix} images ({path}) needs Pillow, which is not installed",
                           hint="pip install Pillow, or convert the images to .pgm/.ppm, or use data.source: npz") from None
    try:
        with Image.open(path) as im:
            im = im.convert("L" if channels == 1 else "RGBA" if channels == 4 else "RGB")
            arr = np.asarray(im)
    except OSError as e:
        raise InvalidInput(f"cannot read image {path}: {e}", hint="remove or replace the broken file") from None
    arr = arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1)
    return arr.astype(np.float32) / 255.0


def _read_netpbm(path: Path) -> np.ndarray:
    """Binary PGM (P5) or PPM (P6), 8 or 16 bits, as float32 CHW in [0, 1]."""
    import numpy as np

    raw = path.read_bytes()
    fields: list[bytes] = []
    pos = 0
    while len(fields) < 4:
        while pos < len(raw) and raw[pos:pos + 1].isspace():
            pos += 1
        if raw[pos:pos + 1] == b"#":  # comment up to end of line
            pos = raw.find(b"\n", pos) + 1 or len(raw)
            continue
        start = pos
        while pos < len(raw) and not raw[pos:pos + 1].isspace():
            pos += 1
        if start == pos:
            break
        fields.append(raw[start:pos])
    pos += 1  # exactly one whitespace byte separates the header from the pixels
    try:
        magic, width, height, maxval = fields[0], int(fields[1]), int(fields[2]), int(fields[3])
    except (IndexError, ValueError):
        raise InvalidInput(f"cannot read image {path}: not a binary PGM/PPM file") from None
    if magic not in (b"P5", b"P6") or not 0 < maxval < 65536:
        raise InvalidInput(f"cannot read image {path}: only binary PGM (P5) and PPM (P6) are supported",
                           hint="save the image as binary netpbm, or install Pillow and use PNG")
    c = 1 if magic == b"P5" else 3
    dtype = np.dtype(">u2") if maxval > 255 else np.dtype("u1")
    count = width * height * c
    if len(raw) - pos < count * dtype.itemsize:
        raise InvalidInput(f"cannot read image {path}: the file is truncated")
    pixels = np.frombuffer(raw, dtype=dtype, count=count, offset=pos).reshape(height, width, c)
    return pixels.transpose(2, 0, 1).astype(np.float32) / float(maxval)


def _to_channels(x: np.ndarray, channels: int, where: str) -> np.ndarray:
    """NCHW images with `channels` channels: replicate grey, luma for grey, drop alpha."""
    import numpy as np

    have = x.shape[1]
    if have == channels:
        return x
    if have == 1:
        return np.repeat(x, channels, axis=1)
    if have in (3, 4) and channels == 1:
        luma = np.array([0.299, 0.587, 0.114], dtype=np.float32)
        return np.tensordot(x[:, :3], luma, axes=([1], [0]))[:, None].astype(np.float32)
    if have == 4 and channels == 3:
        return x[:, :3]
    raise InvalidInput(f"{where}: cannot turn {have}-channel images into {channels}-channel images",
                       hint="set data.channels to 1, or to the images' own channel count")


def _bilinear_taps(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    import numpy as np

    scale = n_in / n_out
    src = np.clip((np.arange(n_out, dtype=np.float64) + 0.5) * scale - 0.5, 0, n_in - 1)
    lo = np.floor(src).astype(np.int64)
    hi = np.minimum(lo + 1, n_in - 1)
    return lo, hi, (src - lo).astype(np.float32)
