"""recipes/alexnet-imagenet.yaml cannot run offline: it must fail fast and clearly."""

from __future__ import annotations

import socket

from cli_helpers import zoo as zoo_cli
from conftest import REPO


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
