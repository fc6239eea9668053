"""recipes/alexnet-imagenet.yaml: it pins torchvision's weights, and it cannot run offline: it
must fail fast and clearly. Nothing here needs torch."""

from __future__ import annotations

import socket

import pytest
import yaml
from pydantic import ValidationError

from cli_helpers import zoo as zoo_cli
from conftest import REPO
from zoo_stages.export import Export

# sha256 of https://download.pytorch.org/models/alexnet-owt-7be5be79.pth (torchvision's name
# carries its first 8 digits; the Hub's copies of the file list all 64)
ALEXNET_OWT_SHA256 = "7be5be791159472b1fbf3c69796f7cb30dca7ad8466c2df70058c37116cdee02"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the socket is: nothing listens there


def test_shipped_recipe_validates():
    result = zoo_cli("validate", REPO / "recipes" / "alexnet-imagenet.yaml")
    assert result.code == 0, result.text
    assert "export, optimize, quantize, verify, deploy" in result.out


def test_unreachable_weights_fail_fast_with_exit_3(tmp_path):
    url = f"http://127.0.0.1:{_closed_port()}/models/alexnet-owt-7be5be79.pth"
    text = (REPO / "recipes" / "alexnet-imagenet.yaml").read_text()
    assert "https://download.pytorch.org/models/alexnet-owt-7be5be79.pth" in text
    recipe = tmp_path / "alexnet-imagenet.yaml"
    recipe.write_text(text.replace("https://download.pytorch.org/models/alexnet-owt-7be5be79.pth", url))
    result = zoo_cli("run", recipe, timeout=120)
    assert result.code == 3, result.text  # storage / I/O class
    assert f"cannot reach {url}" in result.err
    assert "hint: no network?" in result.err
    assert "[zoo] optimize: not run" in result.out  # nothing downstream was scheduled


def test_alexnet_imagenet_recipe_pins_the_real_weights():
    recipe = yaml.safe_load((REPO / "recipes" / "alexnet-imagenet.yaml").read_text())
    config = Export.Config.model_validate(recipe["stages"]["export"]["config"])
    assert config.weights.url == "https://download.pytorch.org/models/alexnet-owt-7be5be79.pth"
    assert config.weights.sha256 == ALEXNET_OWT_SHA256
    assert recipe["model"] == {**recipe["model"], "arch": "alexnet", "num_classes": 1000}
    assert "train" not in recipe["stages"]
    assert config.input_shape == [3, 224, 224]


@pytest.mark.parametrize("field", ["weights", "onnx"])
def test_a_source_sha256_must_be_the_full_digest(field):
    ok = Export.Config.model_validate({field: {"url": "https://x/w.pth", "sha256": "SHA256:" + ALEXNET_OWT_SHA256.upper()}})
    assert getattr(ok, field).sha256 == ALEXNET_OWT_SHA256  # normalised as `sha256sum` prints it
    assert Export.Config.model_validate({field: {"path": "w.pth"}}).model_dump()[field]["sha256"] is None
    for bad in ("7be5be79", ALEXNET_OWT_SHA256[:-1], ALEXNET_OWT_SHA256 + "0", ALEXNET_OWT_SHA256[:-1] + "g", ""):
        with pytest.raises(ValidationError, match="full 64 hex digits"):
            Export.Config.model_validate({field: {"url": "https://x/w.pth", "sha256": bad}})
    # a download without a pin is refused (even when its file name carries a prefix, as torchvision's do)
    with pytest.raises(ValidationError, match="must be pinned by its full `sha256`"):
        Export.Config.model_validate({field: {"url": "https://x/alexnet-owt-7be5be79.pth"}})


def test_validate_refuses_a_recipe_that_pins_a_prefix(tmp_path):
    text = (REPO / "recipes" / "alexnet-imagenet.yaml").read_text()
    recipe = tmp_path / "alexnet-imagenet.yaml"
    recipe.write_text(text.replace(f"sha256: {ALEXNET_OWT_SHA256}", "sha256: 7be5be79"))
    result = zoo_cli("validate", recipe)
    assert result.code == 2 and "full 64 hex digits" in result.err, result.text
