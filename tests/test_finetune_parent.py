"""A `model.from` parent whose build keeps its weights as ONNX external data: the sidecar is a keyed
dependency (so a parent whose weights alone changed retrains, and a Dask worker is given the file),
its sha256 is in the pin, and a machine that has the pin and the files but not the version checks
every one of them. The engine resolves it (zoo/engine/parents.py); zoo_stages/lib/models/finetune.py only
reads the files it is given."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from zoo.errors import IntegrityError, InvalidInput
from zoo.registry.manifest import Build, Manifest
from zoo.registry.staging import file_ref, write_manifest
from zoo.registry.store import LocalZoo
from registry_servers import tiny_onnx
from zoo.engine import parents
from zoo_stages.lib.models import finetune

SECTION = {"from": "zoo:ext@1.0.0"}
REF = "zoo:ext@1.0.0"


def _resolve(tmp_path):
    return parents.resolve(REF, tmp_path, where="model.from")


def _dependencies(tmp_path) -> list[Path]:
    """What train and export list: the files of the parent the engine resolved for `model.from`."""
    return finetune.dependencies(parents.for_stage({"model": SECTION}, tmp_path))
WEIGHTS = b"\x00\x00\x00@" * 4  # four float32 2.0: the tiny model's external weight


@pytest.fixture
def zoo_with_parent(tmp_path, monkeypatch) -> LocalZoo:
    monkeypatch.setenv("ZOO_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("ZOO_CACHE_DIR", str(tmp_path / "cache"))
    staging = tmp_path / "staging"
    tiny_onnx(staging / "builds/cpu-fp32/model.onnx", external="weights.bin")
    (staging / "builds/cpu-fp32/weights.bin").write_bytes(WEIGHTS)
    build = Build(name="cpu-fp32", file=file_ref(staging, "builds/cpu-fp32/model.onnx"),
                  extra_files=[file_ref(staging, "builds/cpu-fp32/weights.bin")])
    write_manifest(staging, Manifest(name="ext", version="1.0.0", builds={"cpu-fp32": build}))
    zoo = LocalZoo()
    zoo.publish(staging)
    return zoo


def test_the_parents_external_data_is_a_dependency_and_in_its_pin(zoo_with_parent, tmp_path):
    deps = _dependencies(tmp_path)
    folder = zoo_with_parent.version_dir("ext", "1.0.0")
    assert deps[1:] == [folder / "builds/cpu-fp32/model.onnx", folder / "builds/cpu-fp32/weights.bin"]
    assert deps[1].is_file() and deps[2].read_bytes() == WEIGHTS
    pin = json.loads(deps[0].read_text())
    assert pin["schema_version"] == parents.PIN_SCHEMA == 2
    manifest = zoo_with_parent.resolve("ext@1.0.0")
    assert pin["sidecars"] == {"builds/cpu-fp32/weights.bin": manifest.builds["cpu-fp32"].extra_files[0].sha256}


def test_a_machine_with_the_pin_and_files_but_not_the_version_checks_every_file(zoo_with_parent, tmp_path,
                                                                                 monkeypatch):
    """As a Dask worker is given them: the pin in its cache, the build's files in its zoo's version
    folder, no manifest. A sidecar with other bytes is refused; a missing one means no parent."""
    _dependencies(tmp_path)  # writes the pin
    worker_home = tmp_path / "worker-home"
    folder = zoo_with_parent.version_dir("ext", "1.0.0")
    target = LocalZoo(worker_home).version_dir("ext", "1.0.0")
    for rel in ("builds/cpu-fp32/model.onnx", "builds/cpu-fp32/weights.bin"):
        (target / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(folder / rel, target / rel)
    monkeypatch.setenv("ZOO_HOME", str(worker_home))
    found = _resolve(tmp_path)
    assert found.files[2:] == (target / "builds/cpu-fp32/weights.bin",)

    sidecar = target / "builds/cpu-fp32/weights.bin"
    sidecar.write_bytes(b"\x00\x00\x80?" * 4)  # other weights, same size
    with pytest.raises(IntegrityError, match="weights.bin does not hold the bytes its pin"):
        _resolve(tmp_path)
    sidecar.unlink()
    with pytest.raises(InvalidInput, match="not in the local zoo"):
        _resolve(tmp_path)


def test_a_pin_of_the_previous_schema_is_refused_with_its_remedy(zoo_with_parent, tmp_path, monkeypatch):
    pin = _dependencies(tmp_path)[0]
    record = json.loads(pin.read_text())
    record["schema_version"] = 1
    del record["sidecars"]
    pin.write_text(json.dumps(record))
    monkeypatch.setenv("ZOO_HOME", str(tmp_path / "empty-home"))
    with pytest.raises(InvalidInput, match="is not a pin of ext@1.0.0") as e:
        _resolve(Path(tmp_path))
    assert f"remove {pin}" in e.value.hint
