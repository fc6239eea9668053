"""torchvision's ImageNet classifiers in plain torch.nn (zoo_stages.lib.models.vision_archs): state dicts
name for name and shape for shape against a listing written from torchvision's source, parameter
counts against torchvision's published ``num_params``, and the string form ``weights:
torchvision:NAME`` exported from a local HTTP server (a stand-in catalog points there)."""

from __future__ import annotations

import hashlib
import json
import shutil
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="needs the torch extra; the torch-free catalog tests are in test_catalog.py")

import onnxruntime as ort  # noqa: E402

from zoo.errors import InvalidInput  # noqa: E402
from zoo.stage import Inputs, RecipeInfo, StageContext  # noqa: E402
from zoo_stages.export import Export  # noqa: E402
from zoo import catalog  # noqa: E402
from zoo_stages.lib.models import archs, checkpoints, vision_archs  # noqa: E402

# torchvision's `meta["num_params"]` of each architecture's IMAGENET1K_V1 weights
# (torchvision/models/resnet.py, mobilenetv3.py, efficientnet.py)
NUM_PARAMS = {"resnet18": 11689512, "resnet50": 25557032, "mobilenet_v3_small": 2542856, "efficientnet_b0": 5288548,
              "alexnet": 61100840}


# ---------------------------------------------------------------------------------------------
# the state-dict listing, written from torchvision's source (not from zoo's modules)


def _divisible(v: float, d: int = 8) -> int:  # torchvision.models._utils._make_divisible
    new = max(d, int(v + d / 2) // d * d)
    return new + d if new < 0.9 * v else new


def _bn(prefix: str, c: int) -> dict:
    return {f"{prefix}.weight": (c,), f"{prefix}.bias": (c,), f"{prefix}.running_mean": (c,),
            f"{prefix}.running_var": (c,), f"{prefix}.num_batches_tracked": ()}


def _conv_bn(prefix: str, cin: int, cout: int, k: int, groups: int = 1) -> dict:
    """ops.misc.Conv2dNormActivation: [0] conv without bias, [1] BatchNorm2d, [2] activation."""
    return {f"{prefix}.0.weight": (cout, cin // groups, k, k), **_bn(f"{prefix}.1", cout)}


def _se(prefix: str, c: int, squeeze: int) -> dict:
    return {f"{prefix}.fc1.weight": (squeeze, c, 1, 1), f"{prefix}.fc1.bias": (squeeze,),
            f"{prefix}.fc2.weight": (c, squeeze, 1, 1), f"{prefix}.fc2.bias": (c,)}


def _resnet(layers, bottleneck: bool) -> dict:
    exp = 4 if bottleneck else 1
    keys = {"conv1.weight": (64, 3, 7, 7), **_bn("bn1", 64)}
    inplanes = 64
    for i, (planes, blocks) in enumerate(zip((64, 128, 256, 512), layers), start=1):
        for j in range(blocks):
            p = f"layer{i}.{j}"
            cin = inplanes if j == 0 else planes * exp
            if bottleneck:
                keys |= {f"{p}.conv1.weight": (planes, cin, 1, 1), **_bn(f"{p}.bn1", planes),
                         f"{p}.conv2.weight": (planes, planes, 3, 3), **_bn(f"{p}.bn2", planes),
                         f"{p}.conv3.weight": (planes * 4, planes, 1, 1), **_bn(f"{p}.bn3", planes * 4)}
            else:
                keys |= {f"{p}.conv1.weight": (planes, cin, 3, 3), **_bn(f"{p}.bn1", planes),
                         f"{p}.conv2.weight": (planes, planes, 3, 3), **_bn(f"{p}.bn2", planes)}
            if j == 0 and (i > 1 or inplanes != planes * exp):
                keys |= {f"{p}.downsample.0.weight": (planes * exp, inplanes, 1, 1),
                         **_bn(f"{p}.downsample.1", planes * exp)}
        inplanes = planes * exp
    return keys | {"fc.weight": (1000, 512 * exp), "fc.bias": (1000,)}


def _mobilenet_v3_small() -> dict:
    # mobilenetv3.py `_mobilenet_v3_conf("mobilenet_v3_small")`: bneck_conf(input, kernel, expanded,
    # out, use_se, activation, stride, dilation)
    conf = [(16, 3, 16, 16, True), (16, 3, 72, 24, False), (24, 3, 88, 24, False), (24, 5, 96, 40, True),
            (40, 5, 240, 40, True), (40, 5, 240, 40, True), (40, 5, 120, 48, True), (48, 5, 144, 48, True),
            (48, 5, 288, 96, True), (96, 5, 576, 96, True), (96, 5, 576, 96, True)]
    keys = _conv_bn("features.0", 3, 16, 3)
    for n, (cin, k, exp, out, se) in enumerate(conf, start=1):
        p, i = f"features.{n}.block", 0
        if exp != cin:
            keys |= _conv_bn(f"{p}.{i}", cin, exp, 1)
            i += 1
        keys |= _conv_bn(f"{p}.{i}", exp, exp, k, groups=exp)
        i += 1
        if se:
            keys |= _se(f"{p}.{i}", exp, _divisible(exp // 4))
            i += 1
        keys |= _conv_bn(f"{p}.{i}", exp, out, 1)
    keys |= _conv_bn("features.12", 96, 576, 1)
    return keys | {"classifier.0.weight": (1024, 576), "classifier.0.bias": (1024,),
                   "classifier.3.weight": (1000, 1024), "classifier.3.bias": (1000,)}


def _efficientnet_b0() -> dict:
    # efficientnet.py `_efficientnet_conf("efficientnet_b0")`: bneck_conf(expand_ratio, kernel,
    # stride, input_channels, out_channels, num_layers)
    conf = [(1, 3, 1, 32, 16, 1), (6, 3, 2, 16, 24, 2), (6, 5, 2, 24, 40, 2), (6, 3, 2, 40, 80, 3),
            (6, 5, 1, 80, 112, 3), (6, 5, 2, 112, 192, 4), (6, 3, 1, 192, 320, 1)]
    keys = _conv_bn("features.0", 3, 32, 3)
    for n, (ratio, k, _, cin, out, layers) in enumerate(conf, start=1):
        for j in range(layers):
            c = cin if j == 0 else out
            exp = _divisible(c * ratio)
            p, i = f"features.{n}.{j}.block", 0
            if exp != c:
                keys |= _conv_bn(f"{p}.{i}", c, exp, 1)
                i += 1
            keys |= _conv_bn(f"{p}.{i}", exp, exp, k, groups=exp)
            keys |= _se(f"{p}.{i + 1}", exp, max(1, c // 4))
            keys |= _conv_bn(f"{p}.{i + 2}", exp, out, 1)
    keys |= _conv_bn("features.8", 320, 1280, 1)
    return keys | {"classifier.1.weight": (1000, 1280), "classifier.1.bias": (1000,)}


TORCHVISION_KEYS = {"resnet18": lambda: _resnet((2, 2, 2, 2), False), "resnet50": lambda: _resnet((3, 4, 6, 3), True),
                    "mobilenet_v3_small": _mobilenet_v3_small, "efficientnet_b0": _efficientnet_b0}


@pytest.mark.parametrize("arch", vision_archs.VISION_ARCHS)
def test_state_dict_names_and_shapes_are_torchvision_s(arch):
    net = archs.build_model({"arch": arch, "num_classes": 1000}, Path("."), in_channels=3)
    got = {k: tuple(v.shape) for k, v in net.state_dict().items()}
    expected = TORCHVISION_KEYS[arch]()
    assert sorted(set(got) - set(expected)) == [] and sorted(set(expected) - set(got)) == []
    assert got == expected
    assert list(got) == list(expected)  # in torchvision's order too (what torch.save writes)
    assert sum(p.numel() for p in net.parameters()) == NUM_PARAMS[arch]


def test_every_catalog_model_builds_its_arch():
    models = catalog.load("torchvision")["models"]
    assert sorted(models) == sorted([*vision_archs.VISION_ARCHS, "alexnet"])  # alexnet: zoo_stages.lib.models.archs
    for name, entry in models.items():
        net = archs.build_model({"arch": entry["arch"], "num_classes": entry["num_classes"]}, Path("."))
        assert sum(p.numel() for p in net.parameters()) == NUM_PARAMS[name]


@pytest.mark.parametrize("arch", vision_archs.VISION_ARCHS)
def test_each_arch_runs_nchw_and_nhwc_with_other_widths(arch):
    net = archs.build_model({"arch": arch, "num_classes": 5}, Path("."), in_channels=1).eval()
    x = torch.rand(2, 1, 64, 64)
    with torch.no_grad():
        out = net(x)
        nhwc = archs.build_model({"arch": arch, "num_classes": 5}, Path("."), in_channels=1, layout="NHWC").eval()
        nhwc.load_state_dict(net.state_dict())
        assert torch.equal(nhwc(x.permute(0, 2, 3, 1)), out)
    assert out.shape == (2, 5) and torch.isfinite(out).all()


def test_weights_without_num_batches_tracked_load(tmp_path):
    """Older torchvision files carry no `num_batches_tracked` buffers: they still load (torch fills them)."""
    net = archs.build_model({"arch": "resnet18", "num_classes": 1000}, tmp_path)
    state = {k: v for k, v in net.state_dict().items() if not k.endswith("num_batches_tracked")}
    torch.save(state, tmp_path / "old.pth")
    loaded = checkpoints.build_with_weights({"arch": "resnet18", "num_classes": 1000}, tmp_path, tmp_path / "old.pth",
                                            "weights", in_channels=3)
    assert torch.equal(loaded.fc.weight, net.fc.weight)


def test_stochastic_depth_drops_rows_only_while_training():
    sd = vision_archs._classes().StochasticDepth(0.5)
    x = torch.ones(64, 3, 2, 2)
    assert torch.equal(sd.eval()(x), x)
    torch.manual_seed(0)
    y = sd.train()(x)
    rows = y.flatten(1)
    assert set(rows[:, 0].tolist()) == {0.0, 2.0} and torch.equal(rows.min(1).values, rows.max(1).values)


# ---------------------------------------------------------------------------------------------
# `weights: torchvision:NAME` end to end, from a local HTTP server


def _torchvision_shaped_file(arch: str, folder: Path) -> tuple[Path, str]:
    """A .pth of torchvision's keys and shapes for `arch` (seeded values, batch-norm statistics
    kept sane), named like torchvision's files (`<arch>-<first 8 digits of its sha256>.pth`)."""
    g = torch.Generator().manual_seed(0)
    state = {}
    for key, shape in TORCHVISION_KEYS[arch]().items():
        if key.endswith("num_batches_tracked"):
            state[key] = torch.tensor(0)
        elif key.endswith("running_var"):
            state[key] = torch.ones(shape)
        elif key.endswith("running_mean") or key.endswith(".bias"):
            state[key] = torch.zeros(shape)
        elif len(shape) == 1:  # batch-norm scale
            state[key] = torch.ones(shape)
        else:
            fan_in = int(np.prod(shape[1:]))
            state[key] = torch.randn(shape, generator=g) * (2.0 / fan_in) ** 0.5
    raw = folder / "raw.pth"
    torch.save(state, raw)
    digest = hashlib.sha256(raw.read_bytes()).hexdigest()
    path = raw.rename(folder / f"{arch}-{digest[:8]}.pth")
    return path, digest


@pytest.fixture
def served(tmp_path):
    root = tmp_path / "served"
    root.mkdir()
    handler = partial(SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a: None
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield root, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def stand_in_catalog(tmp_path, monkeypatch, served):
    """Stand-in: a copy of zoo's torchvision catalog whose resnet18 entry points at a file of
    torchvision's shapes on a local HTTP server (the real 47 MB download is never made)."""
    root, base = served
    path, digest = _torchvision_shaped_file("resnet18", root)
    data = json.loads((catalog.CATALOG_DIR / "torchvision.json").read_text())
    data["models"]["resnet18"].update(url=f"{base}/{path.name}", sha256=digest, bytes=path.stat().st_size)
    folder = tmp_path / "catalog"
    folder.mkdir()
    (folder / "torchvision.json").write_text(json.dumps(data))
    monkeypatch.setattr(catalog, "CATALOG_DIR", folder)
    return data["models"]["resnet18"]


def _ctx(tmp: Path, name: str, model: dict | None) -> StageContext:
    recipe = RecipeInfo(name="t", version="0.1.0", description="", license="BSD-3-Clause", path=tmp / "recipe.yaml",
                        digest="x")
    return StageContext(stage_id=name, out_dir=tmp / name / "out", work_dir=tmp / name / "work", recipe=recipe,
                        shared={"data": None, "model": model, "task": "image-classification"}, matrix={}, threads=1)


def test_weights_by_catalog_name_export_resnet18_from_a_local_server_with_a_stand_in_catalog(tmp_path,
                                                                                           stand_in_catalog):
    config = Export.Config.model_validate({"weights": "torchvision:resnet18", "parity": {"samples": 2}})
    assert config.weights.url == stand_in_catalog["url"] and config.weights.arch == "resnet18"
    ctx = _ctx(tmp_path, "export", None)  # no model: section: the catalog names the arch and width
    out = Export().run(Inputs([]), config, ctx)["model"]
    metrics = ctx.metrics
    assert metrics["parity"]["passed"] is True and metrics["num_parameters"] == NUM_PARAMS["resnet18"]
    assert metrics["weights"]["catalog"] == "torchvision:resnet18"
    assert metrics["weights"]["sha256"] == stand_in_catalog["sha256"]
    assert metrics["weights"]["preprocessing"]["mean"] == [0.485, 0.456, 0.406]
    assert metrics["input_shapes"] == {"input": ["batch", 3, 224, 224]}
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    (logits,) = session.run(None, {"input": np.random.default_rng(1).random((1, 3, 224, 224), dtype=np.float32)})
    assert logits.shape == (1, 1000) and np.isfinite(logits).all()
    import onnx

    props = {p.key: p.value for p in onnx.load(str(out)).metadata_props}
    assert "BSD-3-Clause" in props.values() or any("BSD-3-Clause" in v for v in props.values())


def test_catalog_weights_refuse_a_recipe_model_of_another_arch(tmp_path, stand_in_catalog):
    config = Export.Config.model_validate({"weights": "torchvision:resnet18"})
    with pytest.raises(InvalidInput, match="fit arch resnet18, but the recipe's model is resnet50"):
        Export().run(Inputs([]), config, _ctx(tmp_path, "e", {"arch": "resnet50", "num_classes": 1000}))


@pytest.mark.parametrize("arch", ["mobilenet_v3_small", "efficientnet_b0", "resnet50"])
def test_torchvision_shaped_weights_export_with_parity_from_url_and_sha(tmp_path, served, arch):
    """The recipe form `weights: {url, sha256}` with `model: {arch}`: the file a torchvision
    checkpoint of that arch would be (its keys and shapes), served locally."""
    root, base = served
    path, digest = _torchvision_shaped_file(arch, root)
    config = Export.Config.model_validate({"weights": {"url": f"{base}/{path.name}", "sha256": digest},
                                           "input_shape": [3, 96, 96], "parity": {"samples": 2}})
    ctx = _ctx(tmp_path, arch, {"arch": arch, "num_classes": 1000})
    Export().run(Inputs([]), config, ctx)
    assert ctx.metrics["parity"]["passed"] is True and ctx.metrics["num_parameters"] == NUM_PARAMS[arch]
    shutil.rmtree(tmp_path / arch)
