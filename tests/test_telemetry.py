"""Telemetry off in every process zoo runs in (zoo/telemetry.py), and nothing written into the
user's home that docs/install.md does not name.

Each check runs a fresh interpreter with HOME set to an empty folder and none of the switches in its
environment (nor CI=true, which OpenVINO reads as "do not report"), as a user's shell would be. The
controls show the libraries do write there when zoo is not imported first, so the checks can fail.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from zoo import telemetry

# what a user's environment would not have: the switches, zoo's own folders, CI markers
_NOT_A_USERS = (*telemetry.OFF, "CI", "TF_BUILD", "JENKINS_URL", "HF_HUB_OFFLINE")

# what zoo may leave under HOME, each named in docs/install.md: the local zoo (ZOO_HOME's
# default) and the code memo (ZOO_CODE_MEMO's default)
DOCUMENTED_HOME_PATHS = (".local/share/zoo", ".cache/zoo")

ONNX_RELU = """
import onnx
from onnx import TensorProto, helper
graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
"""


def _user_env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _NOT_A_USERS and not k.startswith("ZOO_")}
    return {**env, "HOME": str(home), **extra}


def _python(code: str, home: Path, cwd: Path, **extra: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=_user_env(home, **extra),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def _written(home: Path) -> list[str]:
    return sorted(str(p.relative_to(home)) for p in home.rglob("*") if p.is_file())


def _fresh_home(tmp_path: Path, name: str) -> Path:
    home = tmp_path / name
    home.mkdir()
    return home


def test_import_zoo_switches_each_library_off_and_keeps_what_the_user_chose(tmp_path):
    code = ("import json, os, sys\nimport zoo\n"
            "print(json.dumps({'env': {k: os.environ.get(k) for k in %r},"
            " 'blocked': {m: m in sys.modules and sys.modules[m] is None for m in %r}}))"
            % (list(telemetry.OFF), list(telemetry.BLOCKED_MODULES)))
    got = json.loads(_python(code, _fresh_home(tmp_path, "home"), tmp_path).stdout)
    assert got["env"] == telemetry.OFF
    assert got["blocked"] == {m: True for m in telemetry.BLOCKED_MODULES}
    # a choice the user made stands, whatever it is
    chose = json.loads(_python(code, _fresh_home(tmp_path, "home2"), tmp_path, ORT_DISABLE_TELEMETRY="0",
                               HF_HUB_DISABLE_TELEMETRY="").stdout)
    assert chose["env"] == {**telemetry.OFF, "ORT_DISABLE_TELEMETRY": "0", "HF_HUB_DISABLE_TELEMETRY": ""}


def _writes_only_without_zoo(code: str, prefix: str, library: str, tmp_path) -> None:
    """`code` writes under HOME/`prefix` on its own (the control: else the check proves nothing),
    and nothing at all under HOME when zoo is imported first."""
    control = _fresh_home(tmp_path, "control")
    _python(code, control, tmp_path)
    assert any(p.startswith(prefix) for p in _written(control)), \
        f"{library} wrote nothing without zoo ({_written(control)}): the check below proves nothing; see zoo/telemetry.py"
    home = _fresh_home(tmp_path, "home")
    _python("import zoo\n" + code, home, tmp_path)
    assert _written(home) == []


def test_onnxruntime_writes_no_device_id_when_zoo_is_imported_first(tmp_path):
    code = "import onnxruntime, numpy\n" + ONNX_RELU + (
        "s = onnxruntime.InferenceSession(model.SerializeToString(), providers=['CPUExecutionProvider'])\n"
        "s.run(None, {'x': numpy.ones(1, numpy.float32)})\n")
    _writes_only_without_zoo(code, ".cache/Microsoft/", "onnxruntime", tmp_path)


def test_openvino_writes_no_client_id_when_zoo_is_imported_first(tmp_path):
    code = ONNX_RELU + (
        "import numpy, openvino\n"
        "path = %r\nonnx.save(model, path)\n"
        "core = openvino.Core()\n"
        "compiled = core.compile_model(openvino.convert_model(path), 'CPU')\n"
        "compiled({'x': numpy.ones(1, numpy.float32)})\n") % str(tmp_path / "relu.onnx")
    _writes_only_without_zoo(code, "intel/", "OpenVINO", tmp_path)


def test_install_doc_names_every_path_zoo_may_write_under_home():
    doc = (REPO / "docs" / "install.md").read_text()
    for path in DOCUMENTED_HOME_PATHS:
        assert f"~/{path}" in doc, path


@pytest.mark.slow
def test_a_shipped_recipe_run_leaves_only_documented_paths_under_home(tmp_path):
    """lenet-digits through the CLI, as a user runs it (no ZOO_HOME, ZOO_CACHE_DIR or ZOO_CODE_MEMO):
    its stages run in spawned workers, and its deploy converts to OpenVINO and times the builds
    under OpenVINO and onnxruntime, so each library above is loaded in a process zoo started."""
    work = tmp_path / "work"
    shutil.copytree(REPO / "recipes", work, ignore=shutil.ignore_patterns("*.lock"))
    home = _fresh_home(tmp_path, "home")
    proc = subprocess.run([sys.executable, "-m", "zoo", "run", "lenet-digits.yaml"], cwd=work,
                          env=_user_env(home), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "openvino-fp32" in proc.stdout + proc.stderr, "lenet-digits no longer builds for OpenVINO: pick a recipe that does"
    undocumented = [p for p in _written(home) if not any(p.startswith(d + "/") for d in DOCUMENTED_HOME_PATHS)]
    assert undocumented == []
    assert (home / ".local/share/zoo").is_dir()  # the run published into the default local zoo
