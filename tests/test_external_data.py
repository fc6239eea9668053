"""One rule for ONNX external data (zoo.pathsafety), at every door a model comes in by.

A location that is empty, absolute, climbs out with '..', holds a backslash or a drive letter,
or (next to a model on disk) leads out through a symbolic link is refused with UnsafePath: by the
wire-level check itself, by a stage loading a model (onnx_io, describe), by export's ONNX import,
by quantize, by publishing to the zoo, by materializing a version that reached the zoo another
way, by a pull, and by importing a bundle. The hostile tensor hides in a subgraph (an If branch), where only a walker
that descends into attributes finds it; a plain external tensor beside it is harmless.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from zoo.errors import InvalidInput, UnsafePath
from zoo.registry import api
from zoo.registry.codec import load_manifest
from zoo.registry.manifest import MANIFEST_FILE, Build, Manifest
from zoo.registry.staging import file_ref, write_manifest
from zoo.registry.store import LocalZoo

MODEL = "builds/cpu/model.onnx"
SAFE = "model.onnx.data"  # the harmless external tensor's file, next to the model
LEXICAL = ["../w.bin", "../../etc/passwd", "/etc/passwd", "a/../../w.bin", "w\\..\\x", "C:w.bin", ""]


def _external(name: str, location: str, values: np.ndarray) -> onnx.TensorProto:
    tensor = numpy_helper.from_array(values, name)
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", str(values.nbytes))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    return tensor


def hostile_model(staging: Path, location: str) -> Path:
    """A staging folder whose model keeps one tensor in SAFE (present) and one, inside an If
    branch, at `location`; returns the model's path."""
    values = np.ones(4, np.float32)
    branch = helper.make_graph([helper.make_node("Add", ["x", "b"], ["o"])], "then", [],
                               [helper.make_tensor_value_info("o", TensorProto.FLOAT, [4])],
                               [_external("b", location, values)])
    graph = helper.make_graph(
        [helper.make_node("If", ["flag"], ["y"], then_branch=branch, else_branch=branch)], "g",
        [helper.make_tensor_value_info("flag", TensorProto.BOOL, []), helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], [_external("w", SAFE, values)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    path = staging / MODEL
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString())
    (path.parent / SAFE).write_bytes(values.tobytes())
    return path


def _staging_manifest(staging: Path) -> Manifest:
    build = Build(name="cpu", file=file_ref(staging, MODEL), extra_files=[file_ref(staging, f"builds/cpu/{SAFE}")])
    manifest = Manifest(name="evil", version="1.0.0", builds={"cpu": build})
    write_manifest(staging, manifest)
    return load_manifest((staging / MANIFEST_FILE).read_bytes(), "staging")


def _adopted_without_checks(zoo: LocalZoo, staging: Path) -> Manifest:
    """The version as a remote or a hand-made zoo could hold it: blobs and manifest, never checked."""
    manifest = _staging_manifest(staging)
    for ref in manifest.all_files():
        zoo.blobs.add(staging / ref.path, ref.sha256, ref.size, ref.path)
    return zoo.adopt(manifest)


class SetUpFailed(AssertionError):
    """Preparing a door failed: the refusal under test must come from the door itself."""


def setting_up(what: str, fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except Exception as e:
        raise SetUpFailed(f"{what}: {e}") from e


# ---- the doors -------------------------------------------------------------------------------
def check(tmp_path: Path, model: Path) -> None:
    from zoo.pathsafety import external_data_locations

    external_data_locations(model)


def files_next_to_the_model(tmp_path: Path, model: Path) -> None:
    from zoo.pathsafety import external_data_files

    external_data_files(model)


def load_model(tmp_path: Path, model: Path) -> None:
    from zoo_stages.lib.onnx import onnx_io

    onnx_io.load_model(model)


def session_straight_from_the_file(tmp_path: Path, model: Path) -> None:
    from zoo_stages.lib.onnx import onnx_io

    onnx_io.loadable_as_is(model)


def describe(tmp_path: Path, model: Path) -> None:
    from zoo_stages.lib.onnx.model_info import describe

    describe(model)


def export_import(tmp_path: Path, model: Path) -> None:
    from zoo.stage import Inputs, RecipeInfo, StageContext
    from zoo_stages.export import Export

    recipe = RecipeInfo(name="t", version="0.1.0", description="", license="MIT", path=tmp_path / "recipe.yaml", digest="x")
    ctx = StageContext(stage_id="export", out_dir=tmp_path / "x" / "out", work_dir=tmp_path / "x" / "work", recipe=recipe,
                       shared={"data": None, "model": {}}, matrix={}, threads=1)
    Export().run(Inputs([]), Export.Config.model_validate({"onnx": {"path": str(model.relative_to(tmp_path))}}), ctx)


def quantize(tmp_path: Path, model: Path) -> None:
    from zoo.stage import Inputs, RecipeInfo, StageContext, Upstream
    from zoo_stages.quantize import Quantize, QuantizeConfig

    recipe = RecipeInfo(name="t", version="0.1.0", description="", license="", path=tmp_path / "recipe.yaml", digest="")
    ctx = StageContext(stage_id="quantize", out_dir=tmp_path / "q" / "out", work_dir=tmp_path / "q" / "work",
                       recipe=recipe, shared={"data": None}, matrix={})
    ctx.out_dir.mkdir(parents=True)
    inputs = Inputs([Upstream("optimize", "optimize", {"model": model}, {})])
    Quantize().run(inputs, QuantizeConfig(mode="dynamic"), ctx)


def publish(tmp_path: Path, model: Path) -> None:
    staging = model.parents[2]
    setting_up("writing the staging manifest", _staging_manifest, staging)
    zoo = LocalZoo(tmp_path / "zoo")
    try:
        zoo.publish(staging)
    finally:
        assert zoo.get("evil", "1.0.0") is None  # nothing published


def materialize(tmp_path: Path, model: Path) -> None:
    zoo = LocalZoo(tmp_path / "zoo")
    manifest = setting_up("adopting the version", _adopted_without_checks, zoo, model.parents[2])
    dest = tmp_path / "out"
    try:
        zoo.materialize(manifest, "cpu", dest)
    finally:
        assert not dest.exists() or not any(dest.rglob("*"))  # nothing placed


def pull(tmp_path: Path, model: Path) -> None:
    """From a real folder remote that a hand-made zoo pushed the version to."""
    evil = LocalZoo(tmp_path / "evil-zoo")
    setting_up("adopting the version", _adopted_without_checks, evil, model.parents[2])
    api.remote_add("origin", str(tmp_path / "remote"), zoo=evil)
    setting_up("pushing it to a folder remote", api.push, "evil@1.0.0", "origin", zoo=evil)
    consumer = LocalZoo(tmp_path / "consumer")
    api.remote_add("origin", str(tmp_path / "remote"), zoo=consumer)
    try:
        api.pull("evil@1.0.0", zoo=consumer)
    finally:
        assert consumer.list() == []  # a refused pull installs nothing, no version and no tag


def bundle_import(tmp_path: Path, model: Path) -> None:
    """From an air-gapped bundle that a hand-made zoo exported."""
    from zoo.registry.bundle import export_bundle, import_bundle

    evil = LocalZoo(tmp_path / "evil-zoo")
    setting_up("adopting the version", _adopted_without_checks, evil, model.parents[2])
    bundle = setting_up("exporting a bundle", export_bundle, ["evil@1.0.0"], tmp_path / "evil.tar", zoo=evil)
    consumer = LocalZoo(tmp_path / "consumer")
    try:
        import_bundle(bundle.path, zoo=consumer)
    finally:
        assert consumer.list() == []


ON_DISK = [check, files_next_to_the_model, load_model, session_straight_from_the_file, describe, export_import, quantize]
IN_THE_ZOO = [publish, materialize, pull, bundle_import]


@pytest.mark.parametrize("location", LEXICAL, ids=repr)
@pytest.mark.parametrize("door", ON_DISK + IN_THE_ZOO, ids=lambda f: f.__name__)
def test_an_escaping_location_is_refused_at_every_door(tmp_path, door, location):
    model = hostile_model(tmp_path / "m", location)
    with pytest.raises(UnsafePath) as e:
        door(tmp_path, model)
    if location:
        assert f"external data location {location!r} of tensor 'b' escapes the model's folder" in e.value.message
    else:
        assert "tensor 'b' is marked external but names no location" in e.value.message
    assert "relative path inside the model's folder" in e.value.hint


@pytest.mark.parametrize("door", [d for d in ON_DISK if d is not check], ids=lambda f: f.__name__)
def test_a_symbolic_link_out_of_the_folder_is_refused_where_the_folder_is_on_disk(tmp_path, door):
    model = hostile_model(tmp_path / "m", "link.bin")
    outside = tmp_path / "secret.bin"
    outside.write_bytes(np.ones(4, np.float32).tobytes())  # the right bytes: only the path check can catch it
    os.symlink(outside, model.parent / "link.bin")
    with pytest.raises(UnsafePath) as e:
        door(tmp_path, model)
    assert e.value.message.startswith(f"model.onnx: external data location 'link.bin' of tensor 'b' resolves outside "
                                      f"the model's folder {model.parent}")


@pytest.mark.parametrize("door", [d for d in ON_DISK if d is not check], ids=lambda f: f.__name__)
def test_a_missing_external_data_file_is_invalid_input_not_unsafe(tmp_path, door):
    model = hostile_model(tmp_path / "m", "sub/w.bin")
    with pytest.raises(InvalidInput) as e:
        door(tmp_path, model)
    assert not isinstance(e.value, UnsafePath)
    assert "external data file 'sub/w.bin' is missing next to the model" in e.value.message


def test_locations_inside_the_folder_are_accepted_and_normalised(tmp_path):
    from zoo.pathsafety import check_external_location, external_data_files, external_data_locations

    model = hostile_model(tmp_path / "m", "./sub/w.bin")
    assert external_data_locations(model) == [SAFE, "sub/w.bin"]
    (model.parent / "sub").mkdir()
    (model.parent / "sub/w.bin").write_bytes(np.ones(4, np.float32).tobytes())
    assert external_data_files(model) == [SAFE, "sub/w.bin"]
    os.symlink(model.parent / SAFE, model.parent / "inner-link.bin")  # a link that stays inside is fine
    assert check_external_location("inner-link.bin", model="m", folder=model.parent) == "inner-link.bin"
    for name in ("a..b", "..a", "a/..b/c", ".hidden", "1:2"):
        assert check_external_location(name, model="m") == name


def test_a_model_with_safe_external_data_loads_with_its_weights(tmp_path):
    from zoo_stages.lib.onnx import onnx_io

    model = hostile_model(tmp_path / "m", SAFE)
    loaded = onnx_io.load_model(model)
    assert [t.data_location for t in loaded.graph.initializer] == [TensorProto.DEFAULT]
    assert numpy_helper.to_array(loaded.graph.initializer[0]).tolist() == [1.0] * 4
