"""Image sources (digits, folders) and the image transforms, with numpy only.

Transforms, in this order (`ImageTransform`, from ``data.image`` or the old
``image_size``/``channels``):

1. scale: stored values times ``scale``; by default uint8 (and 8-bit files) x 1/255, uint16
   x 1/65535, netpbm x 1/maxval, digits x 1/16, floats x 1, which must then lie in [0, 1];
2. channels: grey is replicated; RGB(A) becomes grey by ITU-R 601 luma for 1 channel, RGBA loses
   alpha for 3. Default: the images' own channels;
3. resize to ``size`` [H, W] with a numpy bilinear resize (half-pixel centres, clamped edges:
   torch's ``interpolate(mode="bilinear", align_corners=False)`` without antialiasing), so
   results do not depend on Pillow's version. Default: the images' own size; never a silent
   stretch to another size;
4. ``(x - mean[c]) / std[c]`` per channel;
5. layout: NCHW (default) or NHWC.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zoo.errors import InvalidInput
from zoo_stages.lib.data.errors import DataError
from zoo_stages.lib.data.loaded import Loaded

if TYPE_CHECKING:
    import numpy as np

IMAGE_FEATURE = "image"  # the one feature of the image sources
PILLOW_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")
NETPBM_SUFFIXES = (".pgm", ".ppm", ".pnm")
IMAGE_SUFFIXES = PILLOW_SUFFIXES + NETPBM_SUFFIXES


@dataclass(frozen=True)
class ImageTransform:
    """The declared image transforms (None: the images' own size / channels / scale by type)."""

    size: tuple[int, int] | None
    channels: int | None
    scale: float | None
    mean: tuple[float, ...] | None
    std: tuple[float, ...] | None
    layout: str

    @classmethod
    def of(cls, spec: dict) -> "ImageTransform":
        """From a validated `data:` section: ``image:``, or the old ``image_size``/``channels``."""
        image = spec.get("image") or {}
        if spec.get("image_size") is not None or spec.get("channels") is not None:
            n = spec.get("image_size")
            image = {"size": [n, n] if n is not None else None, "channels": spec.get("channels")}
        size = image.get("size")
        return cls(size=tuple(size) if size else None, channels=image.get("channels"), scale=image.get("scale"),
                   mean=tuple(image["mean"]) if image.get("mean") else None,
                   std=tuple(image["std"]) if image.get("std") else None, layout=image.get("layout") or "NCHW")


def scaled(x: "np.ndarray", scale: float | None, where: str) -> tuple["np.ndarray", float]:
    """Stored pixels as float32 times `scale` (default by type), and the scale used."""
    import numpy as np

    if scale is not None:
        if not (np.issubdtype(x.dtype, np.integer) or np.issubdtype(x.dtype, np.floating)):
            raise DataError(f"{where}: unsupported pixel type {x.dtype}", hint="store numbers")
        out = x.astype(np.float32) * np.float32(scale)
        if out.size and not np.isfinite(out).all():
            raise DataError(f"{where}: pixels include NaN or infinite values")
        return out, float(scale)
    if x.dtype == np.uint8:
        return x.astype(np.float32) / np.float32(255.0), 1 / 255
    if x.dtype == np.uint16:
        return x.astype(np.float32) / np.float32(65535.0), 1 / 65535
    if np.issubdtype(x.dtype, np.floating):
        x = x.astype(np.float32)
        if x.size and (not np.isfinite(x).all() or x.min() < 0 or x.max() > 1):
            raise DataError(f"{where}: float pixels must lie in [0, 1] unless data.image.scale is given "
                            f"(got {x.min():g}..{x.max():g})",
                            hint="set `data.image: {scale: 1}` to use the values as they are (with mean/std "
                                 "to normalise them), or store uint8 images")
        return x, 1.0
    raise DataError(f"{where}: pixel type {x.dtype} has no default scale",
                    hint="store uint8, uint16 or float32 in [0, 1], or set `data.image.scale`")


def load_digits(transform: ImageTransform) -> Loaded:
    """scikit-learn's bundled digits: 1797 grey 8x8 images, values 0..16 (default scale 1/16)."""
    import numpy as np

    from sklearn.datasets import load_digits as sk_digits

    bunch = sk_digits()
    scale = 1 / 16 if transform.scale is None else transform.scale
    x = (bunch.images.astype(np.float32) * np.float32(scale))[:, None, :, :]
    return Loaded({IMAGE_FEATURE: x}, bunch.target.astype(np.int64), "classes",
                  facts={"source_sizes": [[8, 8]], "source_channels": 1, "scale": scale})


def load_folder(root: Path, given: str, transform: ImageTransform) -> Loaded:
    """One subfolder per class (class index = position of the sorted folder name)."""
    import numpy as np

    classes = sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    if not classes:
        raise DataError(f"data.path {given!r} has no class subfolders",
                        hint="put the images of each class in their own subfolder, e.g. cats/1.png, dogs/2.png")
    images, labels, files_read, scales = [], [], [], set()
    for index, name in enumerate(classes):
        files = sorted(f for f in (root / name).iterdir()
                       if f.is_file() and not f.name.startswith(".") and f.suffix.lower() in IMAGE_SUFFIXES)
        if not files:
            raise DataError(f"data.path {given!r}: class folder {name!r} has no images",
                            hint=f"supported files: {', '.join(IMAGE_SUFFIXES)}")
        for f in files:
            raw, maxval = read_image(f, transform.channels)
            if transform.scale is None:
                scales.add(1 / maxval)
                images.append(raw / np.float32(maxval))
            else:
                scales.add(transform.scale)
                images.append(raw * np.float32(transform.scale))
            labels.append(index)
            files_read.append(f)
    sizes = sorted({tuple(int(d) for d in img.shape[-2:]) for img in images})
    if transform.size is None and len(sizes) > 1:
        examples = {tuple(img.shape[-2:]): f.name for img, f in zip(images, files_read)}
        shown = ", ".join(f"{h}x{w} ({examples[(h, w)]})" for h, w in sizes[:3])
        raise DataError(f"data.path {given!r}: the images have different sizes ({shown}...) and no size is declared",
                        hint="declare the model's input size: `data.image: {size: [H, W]}`")
    own_channels = {img.shape[0] for img in images}
    channels = transform.channels or (1 if own_channels == {1} else 4 if own_channels == {4} else 3)
    target = transform.size or sizes[0]
    # resized as they are read: folder images come in any size; later transforms see one array
    x = np.stack([resize_bilinear(to_channels(img[None], channels, where=str(f)), target)[0]
                  for img, f in zip(images, files_read)])
    return Loaded({IMAGE_FEATURE: x}, np.array(labels, dtype=np.int64), "classes", class_names=classes,
                  facts={"source_sizes": [list(s) for s in sizes], "source_channels": sorted(own_channels),
                         "scale": sorted(scales)[0] if len(scales) == 1 else sorted(scales)})


def transform_images(x: "np.ndarray", transform: ImageTransform, where: str) -> "np.ndarray":
    """Channels, resize, mean/std and layout applied to float32 NCHW images (already scaled)."""
    import numpy as np

    if transform.size is not None:
        x = resize_bilinear(x, transform.size)
    if transform.channels is not None:
        x = to_channels(x, transform.channels, where="data.image.channels")
    c = x.shape[1]
    for name, values in (("mean", transform.mean), ("std", transform.std)):
        if values is not None and len(values) not in (1, c):
            raise DataError(f"data.image.{name} has {len(values)} values but the images have {c} channel(s)",
                            hint=f"give one value, or {c}")
    if transform.mean is not None:
        x = x - np.asarray(transform.mean, dtype=np.float32).reshape(1, -1, 1, 1)
    if transform.std is not None:
        x = x / np.asarray(transform.std, dtype=np.float32).reshape(1, -1, 1, 1)
    if transform.layout == "NHWC":
        x = x.transpose(0, 2, 3, 1)
    return np.ascontiguousarray(x, dtype=np.float32)


def image_record(transform: ImageTransform, loaded: Loaded, x: "np.ndarray") -> dict[str, Any]:
    """What a user must do to an image before feeding the model (for `preprocessing`)."""
    c, h, w = (x.shape[3], x.shape[1], x.shape[2]) if transform.layout == "NHWC" else x.shape[1:4]
    facts = loaded.facts
    return {
        "feature": IMAGE_FEATURE,
        "source_sizes": facts.get("source_sizes"),
        "size": [int(h), int(w)],
        "resize": "bilinear, half-pixel centres, clamped edges, no antialiasing (torch interpolate "
                  "align_corners=False)",
        "channels": int(c),
        "channel_conversion": "grey replicated; RGB to grey by ITU-R 601 luma; RGBA to RGB drops alpha",
        "scale": facts.get("scale"),
        "mean": list(transform.mean) if transform.mean else None,
        "std": list(transform.std) if transform.std else None,
        "formula": "(pixel * scale - mean[c]) / std[c]",
        "layout": transform.layout,
        "dtype": "float32",
    }


def resize_bilinear(x: "np.ndarray", size: int | tuple[int, int] | list[int]) -> "np.ndarray":
    """Resize NCHW (or CHW) float images to `size` ([H, W], or N for N x N); half-pixel centres,
    edges clamped."""
    import numpy as np

    h, w = (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))
    x = np.asarray(x, dtype=np.float32)
    if x.shape[-2:] == (h, w):
        return x
    rows_lo, rows_hi, rows_w = _bilinear_taps(x.shape[-2], h)
    cols_lo, cols_hi, cols_w = _bilinear_taps(x.shape[-1], w)
    rw = rows_w[:, None]
    x = x[..., rows_lo, :] * (1 - rw) + x[..., rows_hi, :] * rw
    x = x[..., cols_lo] * (1 - cols_w) + x[..., cols_hi] * cols_w
    return x.astype(np.float32, copy=False)


def to_channels(x: "np.ndarray", channels: int, where: str) -> "np.ndarray":
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
    raise DataError(f"{where}: cannot turn {have}-channel images into {channels}-channel images",
                    hint="set data.image.channels to 1, or to the images' own channel count")


def read_image(path: Path, channels: int | None) -> tuple["np.ndarray", int]:
    """One image file as float32 CHW of its stored values, and their maximum (255 for 8 bits)."""
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
            if channels is not None:
                mode = "L" if channels == 1 else "RGBA" if channels == 4 else "RGB"
            else:  # the image's own: grey, colour, or colour with alpha
                grey = im.mode in ("1", "L", "I", "I;16", "I;16B", "I;16L", "F")
                alpha = im.mode in ("RGBA", "LA", "PA") or "transparency" in im.info
                mode = "L" if grey else "RGBA" if alpha else "RGB"
            arr = np.asarray(im.convert(mode))
    except OSError as e:
        raise DataError(f"cannot read image {path}: {e}", hint="remove or replace the broken file") from None
    arr = arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1)
    return arr.astype(np.float32), 255


def _read_netpbm(path: Path) -> tuple["np.ndarray", int]:
    """Binary PGM (P5) or PPM (P6), 8 or 16 bits, as float32 CHW of the stored values and maxval."""
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
        raise DataError(f"cannot read image {path}: not a binary PGM/PPM file") from None
    if magic not in (b"P5", b"P6") or not 0 < maxval < 65536:
        raise DataError(f"cannot read image {path}: only binary PGM (P5) and PPM (P6) are supported",
                        hint="save the image as binary netpbm, or install Pillow and use PNG")
    c = 1 if magic == b"P5" else 3
    dtype = np.dtype(">u2") if maxval > 255 else np.dtype("u1")
    count = width * height * c
    if len(raw) - pos < count * dtype.itemsize:
        raise DataError(f"cannot read image {path}: the file is truncated")
    pixels = np.frombuffer(raw, dtype=dtype, count=count, offset=pos).reshape(height, width, c)
    return pixels.transpose(2, 0, 1).astype(np.float32), maxval


def _bilinear_taps(n_in: int, n_out: int) -> tuple["np.ndarray", "np.ndarray", "np.ndarray"]:
    import numpy as np

    scale = n_in / n_out
    src = np.clip((np.arange(n_out, dtype=np.float64) + 0.5) * scale - 0.5, 0, n_in - 1)
    lo = np.floor(src).astype(np.int64)
    hi = np.minimum(lo + 1, n_in - 1)
    return lo, hi, (src - lo).astype(np.float32)
