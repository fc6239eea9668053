"""Files a stage reads, shipped to a worker that shares no disk with the caller (zoo/engine/stage_files.py).

The "worker" here is a machine of its own inside this process: `execute_shipped` with its own
ZOO_CACHE_DIR and ZOO_HOME, while the caller's project folder is moved away, so the stage can
read its files only from what was shipped. The remote run cache is a folder. The real cluster
(dask workers, S3) runs the same recipe in tests/test_dask_remote.py."""

from __future__ import annotations

import os
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path

import pytest

import zoo
from cli_helpers import write_recipe
from zoo.engine.cache import Cache
from zoo.engine.cache_store import open_store
from zoo.engine.remote_stage import execute_shipped
from zoo.engine.stage_files import FileManifest, materialise, place
from zoo.errors import IntegrityError, UnsafePath
from zoo.files import sha256_and_size

RECIPE = """\
schema_version: 1
name: shipped-files
version: 1.0.0
stages:
  listing: {kind: tree, config: {folder: tokenizer, notes: data/notes.txt}}
  copy: {kind: script, needs: [listing], config: {file: model.py}}
"""


def _project(folder: Path) -> Path:
    """A project whose stages read a folder (two files, one nested), a data file and a code file."""
    (folder / "tokenizer" / "sub").mkdir(parents=True)
    (folder / "tokenizer" / "vocab.txt").write_text("a b c")
    (folder / "tokenizer" / "sub" / "merges.txt").write_text("ab")
    (folder / "data").mkdir()
    (folder / "data" / "notes.txt").write_text("notes")
    (folder / "model.py").write_text("print('model')\n")
    return write_recipe(folder, RECIPE)


class Worker:
    """A worker "machine" with its own cache and ZOO_HOME that cannot see the caller's `project`
    (moved away while a stage runs). `tamper(transfer, store)` may change what it receives."""

    remote_workers = True
    address = "in-process worker"

    def __init__(self, base: Path, project: Path, tamper=None):
        self.base, self.project, self.tamper = base, project, tamper
        self.ran: list[str] = []
        self.submitted: list[str] = []

    @property
    def cache(self) -> Path:
        return self.base / "cache"

    def sees(self, folder: Path) -> bool:
        return False

    def submit(self, task) -> Future:
        self.submitted.append(task.stage_id)
        if self.tamper is not None:
            task.transfer = self.tamper(task.transfer, open_store(task.transfer.setting.url, {}))
        hidden = self.project.with_name(self.project.name + "-away")
        os.rename(self.project, hidden)
        try:
            with pytest.MonkeyPatch.context() as env:
                env.setenv("ZOO_CACHE_DIR", str(self.cache))
                env.setenv("ZOO_HOME", str(self.base / "home"))
                result = execute_shipped(task)
        finally:
            os.rename(hidden, self.project)
        if result.ok:
            self.ran.append(task.stage_id)
        future: Future = Future()
        future.set_result(result)
        return future

    def shutdown(self) -> None:
        pass


def test_a_stage_reads_the_shipped_files_in_a_private_project_and_equals_a_local_run(tmp_path):
    project = tmp_path / "project"
    recipe = _project(project)
    worker = Worker(tmp_path / "worker", project)
    shipped = zoo.run(recipe, executor=worker, cache_remote=str(tmp_path / "remote"))
    assert shipped.ok, [(s.id, s.error) for s in shipped.stages]
    assert worker.ran == ["listing", "copy"]
    recipe_dir = Path(shipped.stages[0].metrics["recipe_dir"])
    assert recipe_dir.is_relative_to(worker.cache / "tmp") and not recipe_dir.exists()  # private, and cleaned up
    local = zoo.run(recipe, cache_dir=tmp_path / "local-cache", cache_remote="none")
    assert [s.state for s in local.stages] == ["done", "done"]
    assert {s.id: s.key for s in shipped.stages} == {s.id: s.key for s in local.stages}
    assert {s.id: s.outputs for s in shipped.stages} == {s.id: s.outputs for s in local.stages}
    caller = Cache(Path(os.environ["ZOO_CACHE_DIR"]))
    out = caller.output_paths(caller.lookup(shipped.stages[0].key))["data"]
    assert Path(out).read_text() == "sub/merges.txt:ab\nvocab.txt:a b c\nnotes"


def test_a_file_changed_in_the_project_is_shipped_again_under_a_new_key(tmp_path):
    project = tmp_path / "project"
    recipe = _project(project)
    worker = Worker(tmp_path / "worker", project)
    first = zoo.run(recipe, executor=worker, cache_remote=str(tmp_path / "remote"))
    (project / "tokenizer" / "sub" / "merges.txt").write_text("ba")
    second = zoo.run(recipe, executor=worker, cache_remote=str(tmp_path / "remote"))
    assert first.ok and second.ok
    assert [s.state for s in second.stages] == ["done", "done"]
    assert first.stages[0].key != second.stages[0].key
    assert first.stages[0].outputs != second.stages[0].outputs


def test_a_file_outside_the_project_is_refused_before_anything_is_submitted(tmp_path):
    project = tmp_path / "project"
    _project(project)
    elsewhere = tmp_path / "elsewhere.py"
    elsewhere.write_text("x = 1\n")
    recipe = write_recipe(project, RECIPE.replace("file: model.py", f"file: {elsewhere}"))
    worker = Worker(tmp_path / "worker", project)
    result = zoo.run(recipe, executor=worker, cache_remote=str(tmp_path / "remote"))
    assert [s.state for s in result.stages] == ["done", "failed"]
    assert worker.submitted == ["listing"]
    error = result.stages[1].error
    assert error.type == "InvalidInput" and error.exit_code == 2
    assert str(elsewhere) in error.message and "move it into the recipe's folder" in error.hint


def _swap(label: str, data: bytes):
    """A tamper that ships `data` (uploaded, its own sha256) as the file `label`."""
    def tamper(transfer, store):
        other = Path(transfer.setting.url).parent / "other-bytes"
        other.write_bytes(data)
        sha256, size = sha256_and_size(other)
        store.put_object(other, sha256)
        files = {**transfer.files.files, label: (sha256, size)}
        return replace(transfer, files=FileManifest(files=files, folders=transfer.files.folders))
    return tamper


def _corrupt_object(label: str):
    """A tamper that overwrites the remote's object of `label` with other bytes of the same length."""
    def tamper(transfer, store):
        sha256, size = transfer.files.files[label]
        path, = (p for p in Path(transfer.setting.url).rglob(f"*{sha256}*") if p.is_file())
        path.write_bytes(b"x" * size)
        return transfer
    return tamper


@pytest.mark.parametrize("tamper", [_corrupt_object("model.py"), _swap("model.py", b"print('evil')\n")],
                         ids=["object-tampered-on-the-remote", "manifest-names-other-bytes"])
def test_a_tampered_shipped_file_fails_with_exit_4_and_nothing_runs(tmp_path, tamper):
    project = tmp_path / "project"
    recipe = _project(project)
    (tmp_path / "remote").mkdir()
    worker = Worker(tmp_path / "worker", project,
                    tamper=lambda t, s: tamper(t, s) if any(k == "model.py" for k in t.files.files) else t)
    result = zoo.run(recipe, executor=worker, cache_remote=str(tmp_path / "remote"))
    assert [s.state for s in result.stages] == ["done", "failed"]
    assert worker.ran == ["listing"]
    error = result.stages[1].error
    assert error.type == "IntegrityError" and error.exit_code == 4, error
    assert all(e.stage != "copy" for e in Cache(worker.cache).iter_entries())


@pytest.mark.parametrize("label", ["../x", "/etc/passwd", "a/../../x", "zoo-home:../x", "cache:/etc/passwd",
                                   "zoo-home:", "a\\..\\x", "C:/x"])
def test_a_label_that_leaves_its_folder_is_refused(tmp_path, label):
    with pytest.raises(UnsafePath):
        place(label, tmp_path / "project")


def test_a_label_through_a_symbolic_link_out_of_the_folder_is_refused(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    home = Path(os.environ["ZOO_HOME"])
    (home / "blobs").mkdir(parents=True)
    (home / "blobs" / "ab").symlink_to(outside)
    with pytest.raises(UnsafePath):
        place("zoo-home:blobs/ab/cd", tmp_path / "project")
    store = open_store(str(tmp_path / "remote"), {})
    with pytest.raises(UnsafePath):
        materialise(FileManifest(files={"zoo-home:blobs/ab/cd": ("0" * 64, 1)}), store, tmp_path / "project")
    assert list(outside.iterdir()) == []


def test_zoo_folder_files_go_into_the_workers_own_zoo_home_and_cache(tmp_path):
    src = tmp_path / "src"
    src.write_bytes(b"parent model")
    sha256, size = sha256_and_size(src)
    store = open_store(str(tmp_path / "remote"), {})
    store.put_object(src, sha256)
    manifest = FileManifest(files={f"zoo-home:blobs/sha256/{sha256}": (sha256, size),
                                   "cache:dvc/pins/pin.json": (sha256, size), "data/x.csv": (sha256, size)})
    materialise(manifest, store, tmp_path / "project")
    assert (Path(os.environ["ZOO_HOME"]) / "blobs" / "sha256" / sha256).read_bytes() == b"parent model"
    assert (Path(os.environ["ZOO_CACHE_DIR"]) / "dvc" / "pins" / "pin.json").read_bytes() == b"parent model"
    assert (tmp_path / "project" / "data" / "x.csv").read_bytes() == b"parent model"
    # a worker's own copy with other bytes is never overwritten
    (Path(os.environ["ZOO_CACHE_DIR"]) / "dvc" / "pins" / "pin.json").write_bytes(b"the worker's own")
    with pytest.raises(IntegrityError) as e:
        materialise(manifest, store, tmp_path / "project-2")
    assert e.value.exit_code == 4
    assert (Path(os.environ["ZOO_CACHE_DIR"]) / "dvc" / "pins" / "pin.json").read_bytes() == b"the worker's own"


PARENT = """\
schema_version: 1
name: from-a-parent
version: 1.0.0
model: {from: "zoo:tiny@1.0.0", build: cpu-fp32}
stages:
  read: {kind: parent}
"""


def test_a_model_from_parent_needs_nothing_on_the_worker(tmp_path):
    """The parent is in the caller's zoo only: the worker (its own empty ZOO_HOME and cache) is
    given its pin and ONNX file, reads the same parent, and never holds it as a version."""
    from zoo.registry.store import LocalZoo
    from registry_servers import make_staging

    LocalZoo().publish(make_staging(tmp_path / "staging"))
    project = tmp_path / "project"
    project.mkdir()
    recipe = write_recipe(project, PARENT)
    worker = Worker(tmp_path / "worker", project)
    shipped = zoo.run(recipe, executor=worker, cache_remote=str(tmp_path / "remote"))
    assert shipped.ok, [(s.id, s.error) for s in shipped.stages]
    assert worker.ran == ["read"]
    found = Path(shipped.stages[0].metrics["parent_path"])
    assert found == tmp_path / "worker" / "home" / "models" / "tiny" / "versions" / "1.0.0" / "builds" / "cpu-fp32" / "model.onnx"
    assert LocalZoo(tmp_path / "worker" / "home").list() == []  # a file where a pull puts it, not a version
    local = zoo.run(recipe, cache_dir=tmp_path / "local-cache", cache_remote="none")
    assert [s.state for s in local.stages] == ["done"]
    assert shipped.stages[0].key == local.stages[0].key and shipped.stages[0].outputs == local.stages[0].outputs
    pin = "cache:parents/tiny/1.0.0/cpu-fp32.json"
    assert pin in Cache(Path(os.environ["ZOO_CACHE_DIR"])).lookup(shipped.stages[0].key).parts["files"]


def test_a_worker_whose_own_zoo_has_other_bytes_for_the_parent_refuses_it(tmp_path):
    """The worker's zoo holds tiny@1.0.0 with other bytes: the caller's file is not placed over
    its own, and the stage does not run (exit 4)."""
    from zoo.registry.store import LocalZoo
    from registry_servers import make_staging

    LocalZoo().publish(make_staging(tmp_path / "staging"))
    LocalZoo(tmp_path / "worker" / "home").publish(make_staging(tmp_path / "other", scale=5.0))
    project = tmp_path / "project"
    project.mkdir()
    recipe = write_recipe(project, PARENT)
    worker = Worker(tmp_path / "worker", project)
    result = zoo.run(recipe, executor=worker, cache_remote=str(tmp_path / "remote"))
    assert [s.state for s in result.stages] == ["failed"] and worker.ran == []
    assert result.stages[0].error.exit_code == 4, result.stages[0].error


def test_an_absolute_path_into_the_project_is_rewritten_to_the_workers_copy(tmp_path):
    """`file: /…/project/model.py`: the worker cannot read the caller's path (the project is moved
    away), so it reads the shipped copy, through the config rewritten to its private project."""
    project = tmp_path / "project"
    recipe = _project(project)
    write_recipe(project, RECIPE.replace("file: model.py", f"file: {project / 'model.py'}"))
    worker = Worker(tmp_path / "worker", project)
    shipped = zoo.run(recipe, executor=worker, cache_remote=str(tmp_path / "remote"))
    assert shipped.ok, [(s.id, s.error) for s in shipped.stages]
    assert worker.ran == ["listing", "copy"]
    local = zoo.run(recipe, cache_dir=tmp_path / "local-cache", cache_remote="none")
    assert {s.id: s.key for s in shipped.stages} == {s.id: s.key for s in local.stages}
    assert {s.id: s.outputs for s in shipped.stages} == {s.id: s.outputs for s in local.stages}


def test_the_parent_pin_records_what_is_read_and_stands_in_where_the_zoo_lacks_the_version(tmp_path, monkeypatch):
    import json

    from zoo.errors import InvalidInput
    from zoo.registry.store import LocalZoo
    from registry_servers import make_staging
    from zoo.engine import parents

    LocalZoo().publish(make_staging(tmp_path / "staging"))
    ref = "zoo:tiny@1.0.0#cpu-fp32"  # model.from with model.build
    found = parents.resolve(ref, tmp_path, where="model.from")
    pin = parents.pin_path("tiny", "1.0.0", "cpu-fp32")
    assert json.loads(pin.read_text()) == {"schema_version": 2, "ref": "tiny@1.0.0", "build": "cpu-fp32",
                                           "file": "builds/cpu-fp32/model.onnx", "sha256": found.sha256,
                                           "sidecars": {}, "license": "mit", "outputs": [4]}
    # a zoo without the version, holding only the file where a pull puts it (as a Dask worker's does)
    monkeypatch.setenv("ZOO_HOME", str(tmp_path / "worker-home"))
    copy = LocalZoo().version_dir("tiny", "1.0.0") / "builds" / "cpu-fp32" / "model.onnx"
    copy.parent.mkdir(parents=True)
    copy.write_bytes(found.path.read_bytes())
    assert parents.resolve(ref, tmp_path, where="model.from") == replace(found, path=copy, files=(pin, copy))
    copy.write_bytes(b"other bytes")
    with pytest.raises(IntegrityError):
        parents.resolve(ref, tmp_path, where="model.from")
    pin.write_text(pin.read_text().replace("tiny@1.0.0", "tiny@2.0.0"))
    with pytest.raises(InvalidInput, match="not a pin of tiny@1.0.0"):
        parents.resolve(ref, tmp_path, where="model.from")
    copy.unlink()
    pin.unlink()
    with pytest.raises(InvalidInput, match="not in the local zoo"):
        parents.resolve(ref, tmp_path, where="model.from")
