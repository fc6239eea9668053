"""The shared dataset loader: sources, normalisation, resize, the fixed split, caching, errors."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from zoo.errors import InvalidInput
from zoo_stages.lib.data import datasets
from zoo_stages.lib.data.split import shuffle_order
from data_helpers import xy

DIGITS = {"source": "digits", "image_size": 8, "channels": 1}


@pytest.fixture(autouse=True)
def fresh_cache():
    datasets.clear_cache()
    yield
    datasets.clear_cache()


def test_digits_split_shapes_types_and_range(tmp_path):
    x, y = xy(datasets.load_split(DIGITS, tmp_path, "train"))
    xv, yv = xy(datasets.load_split(DIGITS, tmp_path, "val"))
    assert x.shape == (1437, 1, 8, 8) and xv.shape == (360, 1, 8, 8)
    assert x.dtype == np.float32 and y.dtype == np.int64
    assert 0.0 <= x.min() and x.max() == 1.0  # digits 0..16 divided by 16
    assert set(np.unique(y)) == set(range(10)) == set(np.unique(yv))


def test_split_is_disjoint_complete_and_stratified(tmp_path):
    from sklearn.datasets import load_digits

    full = load_digits()
    x, y = xy(datasets.load_split(DIGITS, tmp_path, "train"))
    xv, yv = xy(datasets.load_split(DIGITS, tmp_path, "val"))
    # every original image lands in exactly one split, with its own label
    seen = {}
    for images, labels in ((x, y), (xv, yv)):
        for img, label in zip(images, labels):
            key = (img[0] * 16).round().astype(np.int64).tobytes()
            seen.setdefault(key, []).append(int(label))
    expected = {}
    for img, label in zip(full.images, full.target):
        expected.setdefault(img.astype(np.int64).tobytes(), []).append(int(label))
    assert {k: sorted(v) for k, v in seen.items()} == {k: sorted(v) for k, v in expected.items()}
    # stratified: each class holds out its share, to within one sample
    counts = np.bincount(full.target)
    held = np.bincount(yv, minlength=10)
    assert np.all(np.abs(held - 0.2 * counts) <= 1)


def test_split_is_fixed_by_seed_and_recorded(tmp_path):
    info = datasets.split_info(DIGITS, tmp_path)
    x1, y1 = xy(datasets.load_split(DIGITS, tmp_path, "val"))
    datasets.clear_cache()
    assert datasets.split_info(DIGITS, tmp_path) == info
    x2, y2 = xy(datasets.load_split(DIGITS, tmp_path, "val"))
    assert np.array_equal(x1, x2) and np.array_equal(y1, y2)
    other = datasets.split_info({**DIGITS, "split_seed": 1}, tmp_path)
    assert other["val_indices_sha256"] != info["val_indices_sha256"]
    assert info["num_train"] == 1437 and info["num_val"] == 360 and info["split_seed"] == 0
    assert info["source"] == "digits" and info["num_classes"] == 10
    json.dumps(info)  # JSON-able


def test_split_uses_a_known_order():
    # the documented sha256 shuffle: pins the split for every machine and numpy version
    order = shuffle_order(5, 0)
    import hashlib

    keys = {i: hashlib.sha256(f"0:{i}".encode()).digest() for i in range(5)}
    assert list(order) == sorted(range(5), key=keys.__getitem__)


def test_limit_and_val_fraction(tmp_path):
    spec = {**DIGITS, "limit": 100, "val_fraction": 0.25}
    x, y = xy(datasets.load_split(spec, tmp_path, "train"))
    xv, yv = xy(datasets.load_split(spec, tmp_path, "val"))
    assert len(y) == 75 and len(yv) == 25
    with pytest.raises(InvalidInput, match="too few"):
        datasets.load_split({**DIGITS, "limit": 1}, tmp_path, "train")


def test_resize_and_channels(tmp_path):
    x, _ = xy(datasets.load_split({**DIGITS, "image_size": 16, "channels": 3}, tmp_path, "train"))
    assert x.shape == (1437, 3, 16, 16)
    assert np.array_equal(x[:, 0], x[:, 1]) and np.array_equal(x[:, 0], x[:, 2])
    # half-pixel bilinear with clamped edges
    row = np.array([[[[0.0, 1.0]]]], dtype=np.float32)
    out = datasets.resize_bilinear(np.repeat(row, 2, axis=2), 4)
    assert np.allclose(out[0, 0, 0], [0.0, 0.25, 0.75, 1.0])


def test_resize_matches_torch_bilinear():
    torch = pytest.importorskip("torch", reason="torch's bilinear interpolation is the reference (torch extra)")
    x = np.random.default_rng(0).random((2, 3, 8, 11), dtype=np.float32)
    for size in (4, 5, 13, 64):
        ref = torch.nn.functional.interpolate(torch.from_numpy(x), size=(size, size), mode="bilinear",
                                              align_corners=False).numpy()
        assert np.allclose(datasets.resize_bilinear(x, size), ref, atol=1e-6)


def test_results_are_cached_and_read_only(tmp_path):
    x1, y1 = xy(datasets.load_split(DIGITS, tmp_path, "train"))
    x2, _ = xy(datasets.load_split(dict(DIGITS), tmp_path, "train"))
    assert x1 is x2
    with pytest.raises(ValueError):
        x1[0, 0, 0, 0] = 5.0


def test_npz_source(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(40, 6, 6), dtype=np.uint8)
    y = np.arange(40) % 4
    np.savez(tmp_path / "d.npz", x=x, y=y)
    spec = {"source": "npz", "path": "d.npz", "image_size": 6, "channels": 1, "val_fraction": 0.25}
    xt, yt = xy(datasets.load_split(spec, tmp_path, "train"))
    xv, yv = xy(datasets.load_split(spec, tmp_path, "val"))
    assert xt.shape == (30, 1, 6, 6) and len(yv) == 10
    assert np.bincount(yv).tolist() == [3, 3, 2, 2]  # 10 held out shared by largest remainder
    # values are the uint8 pixels divided by 255
    all_x = np.concatenate([xt, xv])[:, 0]
    assert sorted(map(bytes, (all_x * 255).round().astype(np.uint8))) == sorted(map(bytes, x))
    assert datasets.data_dependencies(spec, tmp_path) == [(tmp_path / "d.npz").resolve()]
    assert datasets.data_dependencies(DIGITS, tmp_path) == []


def test_npz_changes_on_disk_are_seen(tmp_path):
    spec = {"source": "npz", "path": "d.npz", "image_size": 4, "val_fraction": 0.5}
    np.savez(tmp_path / "d.npz", x=np.zeros((4, 4, 4), np.float32), y=np.array([0, 1, 0, 1]))
    assert xy(datasets.load_split(spec, tmp_path, "train"))[0].max() == 0.0
    np.savez(tmp_path / "d.npz", x=np.ones((6, 4, 4), np.float32), y=np.array([0, 1, 0, 1, 0, 1]))
    assert xy(datasets.load_split(spec, tmp_path, "train"))[0].max() == 1.0


def test_npz_errors_name_the_field(tmp_path):
    np.savez(tmp_path / "nolabels.npz", x=np.zeros((4, 4, 4), np.uint8))
    np.savez(tmp_path / "range.npz", x=np.full((4, 4, 4), 3.0, np.float32), y=np.zeros(4, np.int64))
    base = {"source": "npz", "image_size": 4}
    with pytest.raises(InvalidInput, match="no array 'y'"):
        datasets.load_split({**base, "path": "nolabels.npz"}, tmp_path, "train")
    with pytest.raises(InvalidInput, match=r"\[0, 1\]"):
        datasets.load_split({**base, "path": "range.npz"}, tmp_path, "train")
    with pytest.raises(InvalidInput, match="data.path 'missing.npz'"):
        datasets.load_split({**base, "path": "missing.npz"}, tmp_path, "train")
    with pytest.raises(InvalidInput, match="data.path 'missing.npz'"):
        datasets.data_dependencies({**base, "path": "missing.npz"}, tmp_path)
    with pytest.raises(InvalidInput, match="data.path is required"):
        datasets.load_split({"source": "npz"}, tmp_path, "train")


def _write_pgm(path: Path, pixels: np.ndarray) -> None:
    h, w = pixels.shape
    path.write_bytes(b"P5\n# a comment\n%d %d\n255\n" % (w, h) + pixels.astype(np.uint8).tobytes())


def _write_ppm(path: Path, pixels: np.ndarray) -> None:
    h, w, _ = pixels.shape
    path.write_bytes(b"P6 %d %d 255\n" % (w, h) + pixels.astype(np.uint8).tobytes())


def test_folder_source_with_netpbm_images(tmp_path):
    root = tmp_path / "imgs"
    for cls, value in (("b_dog", 200), ("a_cat", 50)):
        (root / cls).mkdir(parents=True)
        for i in range(3):
            _write_pgm(root / cls / f"{i}.pgm", np.full((4, 6), value + i))
        (root / cls / "notes.txt").write_text("ignored")
    _write_ppm(root / "a_cat" / "rgb.ppm", np.tile(np.array([255, 0, 0], np.uint8), (5, 5, 1)))
    spec = {"source": "folder", "path": "imgs", "image_size": 4, "channels": 1, "val_fraction": 0.3}
    x, y = xy(datasets.load_split(spec, tmp_path, "train"))
    xv, yv = xy(datasets.load_split(spec, tmp_path, "val"))
    assert x.shape[1:] == (1, 4, 4) and len(y) + len(yv) == 7
    allx, ally = np.concatenate([x, xv]), np.concatenate([y, yv])
    # classes are the sorted folder names; pixel values survive (constant images)
    dogs = sorted(round(float(v) * 255) for v in allx[ally == 1][:, 0, 0, 0])
    assert dogs == [200, 201, 202]
    assert any(np.allclose(img, 0.299) for img in allx[ally == 0])  # pure red -> luma
    info = datasets.split_info(spec, tmp_path)
    assert info["classes"] == ["a_cat", "b_dog"]
    assert datasets.class_names(spec, tmp_path) == ["a_cat", "b_dog"]
    assert datasets.data_dependencies(spec, tmp_path) == [root.resolve()]


def _png_folder(tmp_path) -> dict:
    root = tmp_path / "imgs"
    png = _tiny_png()
    for cls in ("a", "b"):
        (root / cls).mkdir(parents=True)
        for i in range(2):
            (root / cls / f"{i}.png").write_bytes(png)
    return {"source": "folder", "path": str(root), "image_size": 2, "channels": 3, "val_fraction": 0.5}


def test_folder_of_pngs(tmp_path):
    x, _ = xy(datasets.load_split(_png_folder(tmp_path), tmp_path, "train"))  # Pillow is a core dependency
    assert x.shape == (2, 3, 2, 2) and np.allclose(x, 1.0)


def test_folder_png_without_pillow_says_so_with_a_stand_in_missing_package(tmp_path, monkeypatch):
    """Stand-in: Pillow is hidden from the import system (sys.modules entries None), as on a host
    without it."""
    for name in [m for m in sys.modules if m == "PIL" or m.startswith("PIL.")] + ["PIL"]:
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(InvalidInput, match="Pillow"):
        datasets.load_split(_png_folder(tmp_path), tmp_path, "train")


def _tiny_png() -> bytes:
    """A 1x1 white RGB PNG, built by hand (no Pillow needed to write it)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    raw = b"\x00\xff\xff\xff"
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def test_folder_errors(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidInput, match="no class subfolders"):
        datasets.load_split({"source": "folder", "path": "empty"}, tmp_path, "train")
    (tmp_path / "one" / "cls").mkdir(parents=True)
    with pytest.raises(InvalidInput, match="has no images"):
        datasets.load_split({"source": "folder", "path": "one"}, tmp_path, "train")
    with pytest.raises(InvalidInput, match="not a folder"):
        datasets.load_split({"source": "folder", "path": "nowhere"}, tmp_path, "train")


def test_bad_arguments(tmp_path):
    with pytest.raises(InvalidInput, match="split"):
        datasets.load_split(DIGITS, tmp_path, "test")
    with pytest.raises(InvalidInput, match="data:"):
        datasets.load_split({}, tmp_path, "train")
    with pytest.raises(InvalidInput, match="data.image_size"):
        datasets.load_split({**DIGITS, "image_size": 0}, tmp_path, "train")
    with pytest.raises(InvalidInput, match="data.colour"):
        datasets.load_split({**DIGITS, "colour": True}, tmp_path, "train")
    with pytest.raises(InvalidInput, match="channels"):
        np.savez(tmp_path / "rgb.npz", x=np.zeros((4, 3, 2, 2), np.uint8), y=np.arange(4) % 2)
        datasets.load_split({"source": "npz", "path": "rgb.npz", "channels": 2, "image_size": 2}, tmp_path, "train")
