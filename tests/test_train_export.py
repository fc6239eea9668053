"""The train and export kinds, called directly (tiny LeNet-5 on 8x8 digits; AlexNet-224 over HTTP)."""

from __future__ import annotations

import hashlib
import sys
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
import yaml

torch = pytest.importorskip("torch", reason="needs the torch extra; the torch-free tests of these kinds are in other modules")

import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402

from zoo.errors import GateFailed, InvalidInput  # noqa: E402
from zoo.stage import Inputs, KeyContext, RecipeInfo, StageContext, Upstream  # noqa: E402
from zoo_stages.export import Export  # noqa: E402
from zoo_stages.lib.data import datasets
from zoo_stages.lib.models import archs  # noqa: E402
from data_helpers import xy  # noqa: E402
from zoo_stages.train import Train  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DATA = {"source": "digits", "image_size": 8, "channels": 1}
LENET = {"arch": "lenet5", "num_classes": 10}
TRAIN = {"epochs": 3, "batch_size": 32, "optimizer": {"name": "adam", "lr": 3e-3}, "seed": 0}


def _recipe(tmp: Path) -> RecipeInfo:
    return RecipeInfo(name="t", version="0.1.0", description="", license="MIT", path=tmp / "recipe.yaml", digest="x")


def _ctx(tmp: Path, name: str, data=DATA, model=LENET) -> StageContext:
    return StageContext(stage_id=name, out_dir=tmp / name / "out", work_dir=tmp / name / "work",
                        recipe=_recipe(tmp), shared={"data": data, "model": model}, matrix={}, threads=1)


def _key_ctx(tmp: Path, data=DATA, model=LENET) -> KeyContext:
    return KeyContext(recipe=_recipe(tmp), shared={"data": data, "model": model}, matrix={})


def _upstream(path: Path) -> Inputs:
    return Inputs([Upstream(stage_id="train", kind="train", outputs={"checkpoint": path}, metrics={})])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One LeNet-5 trained on 8x8 digits, shared by the export tests."""
    tmp = tmp_path_factory.mktemp("trained")
    ctx = _ctx(tmp, "a")
    out = Train().run(Inputs([]), Train.Config.model_validate(TRAIN), ctx)
    return tmp, out["checkpoint"], ctx.metrics


def test_train_writes_a_deterministic_checkpoint(trained):
    tmp, ckpt, metrics = trained
    assert ckpt.name == "model.safetensors" and ckpt.parent == tmp / "a" / "out"
    ctx = _ctx(tmp, "b")
    again = Train().run(Inputs([]), Train.Config.model_validate(TRAIN), ctx)["checkpoint"]
    assert again.read_bytes() == ckpt.read_bytes()
    assert ctx.metrics == {**metrics, "seconds": ctx.metrics["seconds"]}
    # the thread count is part of what fixes the bytes: pinning it in the config wins
    pinned = _ctx(tmp, "c")
    pinned.threads = 2
    out = Train().run(Inputs([]), Train.Config.model_validate({**TRAIN, "threads": 1}), pinned)["checkpoint"]
    assert out.read_bytes() == ckpt.read_bytes() and pinned.metrics["threads"] == 1


def test_train_metrics_and_accuracy(trained):
    tmp, ckpt, metrics = trained
    for key in ("train_loss", "train_accuracy", "val_loss", "val_accuracy", "epochs", "samples", "split"):
        assert key in metrics
    assert metrics["epochs"] == 3 and metrics["samples"] == 1437 and len(metrics["history"]) == 3
    assert metrics["split"] == datasets.split_info(DATA, tmp)
    assert metrics["val_accuracy"] > 0.8  # LeNet-5 really learns the digits in 3 epochs
    from safetensors.torch import load_file

    state = load_file(str(ckpt))
    model = archs.lenet5(10, 1)
    model.load_state_dict(state)
    x, y = xy(datasets.load_split(DATA, tmp, "val"))
    with torch.no_grad():
        acc = (model.eval()(torch.from_numpy(np.array(x))).argmax(1).numpy() == y).mean()
    assert abs(acc - metrics["val_accuracy"]) < 1e-6


def test_train_restores_global_torch_settings(tmp_path):
    before = (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled())
    Train().run(Inputs([]), Train.Config.model_validate({**TRAIN, "epochs": 1}), _ctx(tmp_path, "t"))
    assert (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()) == before


USER_CODE = '''
import torch

def make(num_classes, in_channels):
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(in_channels * 64, num_classes))

def fit(model, train, val, config, context):
    x, y = (torch.from_numpy(a.copy()) for a in train)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    for _ in range(config["epochs"] * 20):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    context.metrics["custom_steps"] = config["epochs"] * 20
    return model

def not_a_model(num_classes, in_channels):
    return 42

class Sneaky(torch.nn.Module):
    def __init__(self, num_classes, in_channels):
        super().__init__()
        self.fc = torch.nn.Linear(in_channels * 64, num_classes)
    def forward(self, x):
        out = self.fc(x.flatten(1))
        exporting = torch.jit.is_tracing() or torch.compiler.is_exporting()  # either exporter
        return out * 2 if exporting else out   # exports something else than it runs

def sneaky(num_classes, in_channels):
    return Sneaky(num_classes, in_channels)
'''


def test_custom_model_and_training_entry(tmp_path):
    (tmp_path / "user.py").write_text(USER_CODE)
    model = {"entry": "user.py:make", "num_classes": 10}
    ctx = _ctx(tmp_path, "t", model=model)
    config = Train.Config.model_validate({"epochs": 2, "entry": "user.py:fit"})
    out = Train().run(Inputs([]), config, ctx)
    assert ctx.metrics["custom_steps"] == 40
    assert ctx.metrics["val_accuracy"] > 0.85  # a linear model on digits, fitted by the user's code
    assert ctx.metrics["history"] == []
    # and export rebuilds the same user model around the checkpoint
    exp = _ctx(tmp_path, "e", model=model)
    Export().run(_upstream(out["checkpoint"]), Export.Config(), exp)
    assert exp.metrics["parity"]["passed"] is True
    deps = Train().dependencies(config, _key_ctx(tmp_path, model=model))
    assert deps == [(tmp_path / "user.py").resolve(), (tmp_path / "user.py").resolve()]


def test_train_refuses_a_model_that_does_not_fit(tmp_path):
    with pytest.raises(InvalidInput, match="model.num_classes"):
        Train().run(Inputs([]), Train.Config(epochs=1), _ctx(tmp_path, "t", model={"arch": "lenet5", "num_classes": 5}))
    with pytest.raises(InvalidInput, match="did you mean 'alexnet'"):
        Train().run(Inputs([]), Train.Config(epochs=1), _ctx(tmp_path, "u", model={"arch": "alexnet2"}))
    (tmp_path / "user.py").write_text(USER_CODE)
    with pytest.raises(InvalidInput, match="not a torch.nn.Module"):
        Train().run(Inputs([]), Train.Config(epochs=1), _ctx(tmp_path, "v", model={"entry": "user.py:not_a_model"}))


def test_export_is_deterministic_checked_and_runs(trained):
    tmp, ckpt, _ = trained
    paths = []
    for name in ("x1", "x2"):
        ctx = _ctx(tmp, name)
        paths.append(Export().run(_upstream(ckpt), Export.Config(), ctx)["model"])
    assert paths[0].name == "model.onnx"
    assert paths[0].read_bytes() == paths[1].read_bytes()
    model = onnx.load(str(paths[0]))
    assert model.ir_version <= 13
    onnx.checker.check_model(model, full_check=True)
    assert model.graph.input[0].name == "input" and model.graph.output[0].name == "logits"
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    # the ONNX model classifies the real held-out digits exactly like the checkpoint does
    x, y = xy(datasets.load_split(DATA, tmp, "val"))
    logits = ort.InferenceSession(str(paths[0]), providers=["CPUExecutionProvider"]).run(None, {"input": np.array(x)})[0]
    from safetensors.torch import load_file

    net = archs.lenet5(10, 1)
    net.load_state_dict(load_file(str(ckpt)))
    with torch.no_grad():
        expected = net.eval()(torch.from_numpy(np.array(x))).numpy()
    assert np.allclose(logits, expected, atol=1e-4)
    assert (logits.argmax(1) == y).mean() > 0.8
    metrics = ctx.metrics
    assert metrics["exporter"] == "dynamo" and metrics["source"] == "checkpoint"
    assert metrics["parity"]["passed"] is True and metrics["max_abs"] < 1e-4
    assert metrics["input_shapes"] == {"input": ["batch", 1, 8, 8]}


def test_export_fixed_batch_and_shape_override(trained, tmp_path):
    _, ckpt, _ = trained
    ctx = _ctx(tmp_path, "fixed", data=None)
    config = Export.Config.model_validate({"dynamic_batch": False, "input_shape": [1, 16, 16], "opset": 13,
                                           "exporter": "torchscript", "parity": {"samples": 3}})
    path = Export().run(_upstream(ckpt), config, ctx)["model"]
    model = onnx.load(str(path))
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [1, 1, 16, 16]
    assert {o.version for o in model.opset_import if o.domain in ("", "ai.onnx")} == {13}
    with pytest.raises(InvalidInput, match="input_shape"):
        Export().run(_upstream(ckpt), Export.Config(), _ctx(tmp_path, "noshape", data=None))


def test_export_parity_gate_fails_with_a_table(tmp_path):
    (tmp_path / "user.py").write_text(USER_CODE)
    model = {"entry": "user.py:sneaky", "num_classes": 10}
    net = archs.build_model(model, tmp_path, in_channels=1)
    torch.save(net.state_dict(), tmp_path / "w.pt")
    with pytest.raises(GateFailed) as err:
        Export().run(_upstream(tmp_path / "w.pt"), Export.Config(), _ctx(tmp_path, "e", model=model))
    assert "max_abs" in err.value.table and "logits" in err.value.table


def test_export_loads_pt_state_dicts_and_refuses_code(trained, tmp_path):
    _, ckpt, _ = trained
    from safetensors.torch import load_file

    torch.save(load_file(str(ckpt)), tmp_path / "w.pth")
    ctx = _ctx(tmp_path, "pt")
    Export().run(_upstream(tmp_path / "w.pth"), Export.Config(), ctx)
    assert ctx.metrics["parity"]["passed"] is True
    torch.save(archs.lenet5(10, 1), tmp_path / "whole-module.pt")  # a pickled module: code, not weights
    with pytest.raises(InvalidInput, match="state dict"):
        Export().run(_upstream(tmp_path / "whole-module.pt"), Export.Config(), _ctx(tmp_path, "code"))
    with pytest.raises(InvalidInput, match="do not fit the model"):
        Export().run(_upstream(ckpt), Export.Config(), _ctx(tmp_path, "bad", model={"arch": "lenet5", "num_classes": 3}))


def test_export_needs_exactly_one_weight_source(trained, tmp_path):
    _, ckpt, _ = trained
    with pytest.raises(InvalidInput, match="no weights"):
        Export().run(Inputs([]), Export.Config(), _ctx(tmp_path, "none"))
    both = Export.Config.model_validate({"weights": {"path": str(ckpt)}})
    with pytest.raises(InvalidInput, match="exactly one"):
        Export().run(_upstream(ckpt), both, _ctx(tmp_path, "both"))


def test_dynamo_exporter(trained, tmp_path):
    pytest.importorskip("onnxscript", reason="exporter: dynamo needs onnxscript (the torch extra installs it)")
    _, ckpt, _ = trained
    ctx = _ctx(tmp_path, "dyn")
    Export().run(_upstream(ckpt), Export.Config(exporter="dynamo", opset=18), ctx)
    assert ctx.metrics["exporter"] == "dynamo" and ctx.metrics["parity"]["passed"] is True


def test_dynamo_exporter_without_onnxscript_says_so_with_a_stand_in_missing_package(trained, tmp_path, monkeypatch):
    """Stand-in: onnxscript is hidden from the import system (sys.modules entry None), as on a host
    without it; the stage fails with InvalidInput naming the package and the way out."""
    _, ckpt, _ = trained
    monkeypatch.setitem(sys.modules, "onnxscript", None)
    with pytest.raises(InvalidInput, match="dynamo needs the onnxscript package") as err:
        Export().run(_upstream(ckpt), Export.Config(exporter="dynamo", opset=18), _ctx(tmp_path, "dyn"))
    assert "exporter: torchscript" in err.value.hint


# ---------------------------------------------------------------------------------------------
# AlexNet-224 from torchvision-style ImageNet weights, downloaded from a local HTTP server


def _torchvision_alexnet_state_dict():
    """torchvision's alexnet keys and shapes (as published), with small random values."""
    shapes = {
        "features.0.weight": (64, 3, 11, 11), "features.0.bias": (64,),
        "features.3.weight": (192, 64, 5, 5), "features.3.bias": (192,),
        "features.6.weight": (384, 192, 3, 3), "features.6.bias": (384,),
        "features.8.weight": (256, 384, 3, 3), "features.8.bias": (256,),
        "features.10.weight": (256, 256, 3, 3), "features.10.bias": (256,),
        "classifier.1.weight": (4096, 9216), "classifier.1.bias": (4096,),
        "classifier.4.weight": (4096, 4096), "classifier.4.bias": (4096,),
        "classifier.6.weight": (1000, 4096), "classifier.6.bias": (1000,),
    }
    g = torch.Generator().manual_seed(0)
    return {k: torch.randn(s, generator=g) * 0.02 for k, s in shapes.items()}


def test_alexnet_imagenet_weights_over_http(tmp_path):
    served = tmp_path / "served"
    served.mkdir()
    raw = served / "raw.pth"
    torch.save(_torchvision_alexnet_state_dict(), raw)
    digest = hashlib.sha256(raw.read_bytes()).hexdigest()
    name = f"alexnet-owt-{digest[:8]}.pth"
    raw.rename(served / name)
    handler = partial(SimpleHTTPRequestHandler, directory=str(served))
    handler.log_message = lambda *a: None
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}/{name}"
        recipe = yaml.safe_load((REPO / "recipes" / "alexnet-imagenet.yaml").read_text())
        export_cfg = dict(recipe["stages"]["export"]["config"])
        export_cfg["weights"] = {"url": url, "sha256": digest}
        export_cfg["parity"] = {**export_cfg.get("parity", {}), "samples": 2}
        config = Export.Config.model_validate(export_cfg)
        ctx = _ctx(tmp_path, "export", data=recipe.get("data"), model=recipe["model"])
        out = Export().run(Inputs([]), config, ctx)["model"]
    finally:
        httpd.shutdown()
        httpd.server_close()
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).random((1, 3, 224, 224), dtype=np.float32)
    (logits,) = session.run(None, {"input": x})
    assert logits.shape == (1, 1000) and np.isfinite(logits).all()
    assert ctx.metrics["weights"] == {"source": url, "sha256": digest}
    assert ctx.metrics["parity"]["passed"] is True and ctx.metrics["num_parameters"] == 61100840
