"""Image transforms: non-square resize, NHWC, scale, mean/std, the old spellings, the record."""

from __future__ import annotations

import json

import numpy as np
import pytest

from zoo.errors import InvalidInput
from zoo_stages.lib.data import datasets


@pytest.fixture(autouse=True)
def fresh_cache():
    datasets.clear_cache()
    yield
    datasets.clear_cache()


def test_non_square_nhwc_mean_std_match_a_numpy_computation(tmp_path):
    plain = datasets.load_split({"source": "digits"}, tmp_path, "train").features["image"]
    assert plain.shape == (1437, 1, 8, 8)  # no size declared: the images' own, never stretched
    spec = {"source": "digits", "image": {"size": [20, 16], "mean": [0.3], "std": [0.4], "layout": "NHWC"}}
    x = datasets.load_split(spec, tmp_path, "train").features["image"]
    assert x.shape == (1437, 20, 16, 1) and x.dtype == np.float32
    expected = (datasets.resize_bilinear(plain, (20, 16)) - 0.3) / 0.4
    assert np.allclose(x, expected.transpose(0, 2, 3, 1), atol=1e-6)


def test_resize_non_square_matches_torch():
    torch = pytest.importorskip("torch", reason="torch's bilinear interpolation is the reference (torch extra)")
    x = np.random.default_rng(0).random((2, 3, 8, 11), dtype=np.float32)
    for size in ((4, 9), (13, 5), (8, 22)):
        ref = torch.nn.functional.interpolate(torch.from_numpy(x), size=size, mode="bilinear",
                                              align_corners=False).numpy()
        assert np.allclose(datasets.resize_bilinear(x, size), ref, atol=1e-6)


def test_per_channel_mean_std_and_channels(tmp_path):
    rng = np.random.default_rng(1)
    np.savez(tmp_path / "rgb.npz", x=rng.integers(0, 256, (10, 3, 6, 8), dtype=np.uint8), y=np.arange(10) % 2)
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    spec = {"source": "npz", "path": "rgb.npz", "image": {"mean": mean, "std": std}, "val_fraction": 0.5}
    x = datasets.load_split(spec, tmp_path, "train").features["image"]
    idx = datasets._indices(datasets._key(spec, tmp_path))[0]
    raw = np.load(tmp_path / "rgb.npz")["x"][idx].astype(np.float32) / 255
    ref = (raw - np.array(mean, np.float32)[None, :, None, None]) / np.array(std, np.float32)[None, :, None, None]
    assert x.shape == (5, 3, 6, 8) and np.allclose(x, ref, atol=1e-6)
    with pytest.raises(InvalidInput, match=r"data.image.mean has 2 values but the images have 3"):
        datasets.load_split({**spec, "image": {"mean": [0.5, 0.5]}}, tmp_path, "train")


def test_float_images_outside_unit_range_need_a_scale(tmp_path):
    np.savez(tmp_path / "f.npz", x=np.full((4, 5, 3), 200.0, np.float32), y=np.array([0, 1, 0, 1]))
    base = {"source": "npz", "path": "f.npz", "val_fraction": 0.5}
    with pytest.raises(InvalidInput, match=r"\[0, 1\] unless data.image.scale") as e:
        datasets.load_split(base, tmp_path, "train")
    assert "scale: 1" in e.value.hint
    x = datasets.load_split({**base, "image": {"scale": 1}}, tmp_path, "train").features["image"]
    assert x.shape == (2, 1, 5, 3) and np.all(x == 200.0)
    x = datasets.load_split({**base, "image": {"scale": 0.5}}, tmp_path, "train").features["image"]
    assert np.all(x == 100.0)


def test_old_spelling_maps_onto_image(tmp_path):
    old = datasets.load_split({"source": "digits", "image_size": 12, "channels": 3}, tmp_path, "val").features["image"]
    new = datasets.load_split({"source": "digits", "image": {"size": [12, 12], "channels": 3}}, tmp_path,
                              "val").features["image"]
    assert old.shape == (360, 3, 12, 12) and np.array_equal(old, new)
    with pytest.raises(InvalidInput, match="not both"):
        datasets.load_split({"source": "digits", "image_size": 12, "image": {"size": [12, 12]}}, tmp_path, "train")


def test_folder_of_different_sizes_needs_a_declared_size(tmp_path):
    for cls, shape in (("a", (4, 6)), ("b", (5, 5))):
        (tmp_path / "imgs" / cls).mkdir(parents=True)
        for i in range(2):
            h, w = shape
            (tmp_path / "imgs" / cls / f"{i}.pgm").write_bytes(b"P5 %d %d 255\n" % (w, h) + bytes([100] * (h * w)))
    spec = {"source": "folder", "path": "imgs", "val_fraction": 0.5}
    with pytest.raises(InvalidInput, match="different sizes") as e:
        datasets.load_split(spec, tmp_path, "train")
    assert "data.image: {size: [H, W]}" in e.value.hint
    x = datasets.load_split({**spec, "image": {"size": [3, 7]}}, tmp_path, "train").features["image"]
    assert x.shape == (2, 1, 3, 7) and np.allclose(x, 100 / 255)
    record = datasets.preprocessing({**spec, "image": {"size": [3, 7]}}, tmp_path)["image"]
    assert record["source_sizes"] == [[4, 6], [5, 5]] and record["size"] == [3, 7]


def test_image_preprocessing_record(tmp_path):
    spec = {"source": "digits", "image": {"size": [20, 16], "channels": 3, "mean": [0.3], "std": [0.4]}}
    record = datasets.preprocessing(spec, tmp_path)
    assert record["schema_version"] == datasets.PREPROCESSING_SCHEMA_VERSION
    image = record["image"]
    assert (image["size"], image["channels"], image["layout"], image["scale"]) == ([20, 16], 3, "NCHW", 1 / 16)
    assert (image["mean"], image["std"], image["source_sizes"]) == ([0.3], [0.4], [[8, 8]])
    assert record["labels"]["classes"] == [str(i) for i in range(10)]
    datasets.clear_cache()
    assert json.dumps(datasets.preprocessing(spec, tmp_path), sort_keys=True) == json.dumps(record, sort_keys=True)
    info = datasets.split_info(spec, tmp_path)
    assert info["image"] == {"size": [20, 16], "channels": 3, "layout": "NCHW"} and "image_size" not in info
