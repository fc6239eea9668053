"""Dask across machines (tests/plugins kinds): a real scheduler and two `dask worker` processes,
each with its own cache, ZOO_HOME and HOME and its own declared resources, and a real S3 server
(moto) as the remote run cache. Stages go to the worker that offers their `resources:`, inputs
and outputs move through the remote, and the shipper's publication lands in the caller's zoo only.
A worker that cannot see the caller's disk at all (its own mount namespace) runs recipes whose
stages read files of their folder (a test kind's folder and files; tabular-mlp's CSV) from what
the caller shipped through the remote."""

from __future__ import annotations

import shutil
import uuid

import pytest

import zoo
from cli_helpers import write_recipe, zoo as zoo_cli
from conftest import REPO
from dask_cluster import WorkerSpec, can_hide, cluster
from test_stage_files import PARENT  # a recipe whose one stage reads a `model.from` parent
from zoo.engine.cache import Cache
from zoo.errors import InvalidInput
from zoo.registry.store import LocalZoo

distributed = pytest.importorskip("distributed", reason="the dask extra is part of the dev set-up")

RECIPE = """\
schema_version: 1
name: shipped
version: 1.0.0
stages:
  a: {kind: writer, config: {text: "made on the gpu worker"}, resources: {GPU: 1}}
  b: {kind: concat, needs: [a], resources: {memory: 8GB}}
  ship: {kind: shipper, needs: [b]}
"""


@pytest.fixture(scope="module")
def workers(tmp_path_factory, s3_endpoint):
    """Two worker "machines": one offers GPU=1, the other memory=16e9; both reach the moto S3."""
    base = tmp_path_factory.mktemp("workers")
    specs = [WorkerSpec("gpu", base / "gpu", "GPU=1", {"AWS_ENDPOINT_URL": s3_endpoint}),
             WorkerSpec("mem", base / "mem", "memory=16e9", {"AWS_ENDPOINT_URL": s3_endpoint})]
    with cluster(specs) as address:
        yield {"address": address, "gpu": specs[0], "mem": specs[1]}


@pytest.fixture
def remote(s3_endpoint, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)  # the caller reaches moto the way the workers do
    return f"s3://zoo/{uuid.uuid4().hex[:10]}"


def _keys(result) -> dict[str, str]:
    return {s.id: s.key for s in result.stages}


def test_stages_run_where_their_resources_are_and_move_through_the_remote(tmp_path, workers, remote,
                                                                          isolated_zoo_paths):
    recipe = write_recipe(tmp_path, RECIPE)
    result = zoo.run(recipe, executor=workers["address"], cache_remote=remote)
    assert result.ok, [(s.id, s.error) for s in result.stages]
    assert [s.state for s in result.stages] == ["done", "done", "done"]
    assert result.stages[0].metrics["pid"] == workers["gpu"].pid
    # each worker's own cache holds what it computed, and only that: b read a's output from the remote
    keys = _keys(result)
    on_gpu = {e.key for e in Cache(workers["gpu"].cache).iter_entries()}
    on_mem = {e.key for e in Cache(workers["mem"].cache).iter_entries()}
    assert keys["a"] in on_gpu and keys["a"] not in on_mem
    assert keys["b"] in on_mem and keys["b"] not in on_gpu
    # the caller's cache ends as after a local run: every entry with its objects
    caller = Cache(isolated_zoo_paths / "cache")
    assert all(caller.lookup(k) is not None for k in keys.values())
    assert caller.log_path(keys["b"]).read_text()  # the worker's log came back
    # the effect happened at the caller, and only there
    ship = result.stages[2]
    assert [(e.kind, e.ref) for e in ship.effects] == [("published", "shipped@1.0.0")]
    assert LocalZoo().resolve("shipped@1.0.0").builds["data"]
    for w in (workers["gpu"], workers["mem"]):
        assert LocalZoo(w.home).list() == []


def test_the_result_equals_a_local_run(tmp_path, workers, remote):
    recipe = write_recipe(tmp_path, RECIPE.replace("made on the gpu worker", "same bytes anywhere"))
    on_cluster = zoo.run(recipe, executor=workers["address"], cache_remote=remote)
    local = zoo.run(recipe, cache_dir=tmp_path / "local-cache", cache_remote="none")
    assert on_cluster.ok and local.ok
    assert [s.state for s in local.stages] == ["done", "done", "done"]  # built afresh, not taken from anywhere
    # resources are not part of the key: the same keys, the same bytes
    assert _keys(on_cluster) == _keys(local)
    assert {s.id: s.outputs for s in on_cluster.stages} == {s.id: s.outputs for s in local.stages}


def test_a_second_run_takes_everything_from_the_callers_cache(tmp_path, workers, remote):
    recipe = write_recipe(tmp_path, RECIPE.replace("made on the gpu worker", "twice"))
    assert zoo.run(recipe, executor=workers["address"], cache_remote=remote).ok
    again = zoo.run(recipe, executor=workers["address"], cache_remote=remote)
    assert [s.state for s in again.stages] == ["cached"] * 3 and again.executed == []
    assert [(e.kind, e.ref) for e in again.stages[2].effects] == [("published", "shipped@1.0.0")]


def test_a_machine_with_a_fresh_cache_gets_it_from_the_remote(tmp_path, workers, remote):
    recipe = write_recipe(tmp_path, RECIPE.replace("made on the gpu worker", "for another caller"))
    first = zoo.run(recipe, executor=workers["address"], cache_remote=remote)
    other = zoo.run(recipe, executor=workers["address"], cache_remote=remote, cache_dir=tmp_path / "fresh")
    assert first.ok and other.ok
    assert [s.state for s in other.stages] == ["cached"] * 3
    assert {s.id: s.outputs for s in other.stages} == {s.id: s.outputs for s in first.stages}


def test_a_stage_no_worker_offers_resources_for_fails_at_once(tmp_path, workers, remote):
    recipe = write_recipe(tmp_path, RECIPE.replace("resources: {GPU: 1}", "resources: {GPU: 2, TPU: 1}"))
    result = zoo.run(recipe, executor=f"{workers['address']}?resource_wait=0", cache_remote=remote)
    assert [s.state for s in result.stages] == ["failed", "skipped", "skipped"]
    error = result.stages[0].error
    assert error.type == "InvalidInput" and error.exit_code == 2
    assert "GPU=2 TPU=1" in error.message and "GPU=1" in error.message and "memory=1.6e+10" in error.message
    assert "--resources" in error.hint
    cli = zoo_cli("run", recipe, "--executor", f"{workers['address']}?resource_wait=0", "--cache-remote", remote)
    assert cli.code == 2 and "TPU=1" in cli.text



@pytest.fixture(scope="module")
def blind_worker(tmp_path_factory, s3_endpoint):
    """One worker that does not see the folder holding the caller's cache (its own mount namespace)."""
    if not can_hide():
        pytest.skip("hiding a folder from a worker needs `unshare -m` and mount (root)")
    hidden = tmp_path_factory.mktemp("callers-disk")
    spec = WorkerSpec("blind", tmp_path_factory.mktemp("blind"), env={"AWS_ENDPOINT_URL": s3_endpoint}, hide=hidden)
    with cluster([spec]) as address:
        yield address, hidden, spec


BLIND = RECIPE.replace(", resources: {GPU: 1}", "").replace(", resources: {memory: 8GB}", "")


def test_workers_that_cannot_read_the_cache_and_no_remote_are_refused_at_the_start(tmp_path, blind_worker):
    address, hidden, _ = blind_worker
    recipe = write_recipe(tmp_path, BLIND)
    with pytest.raises(InvalidInput) as e:
        zoo.run(recipe, executor=address, cache_dir=hidden / "cache", cache_remote="none")
    assert "cannot read the run cache" in e.value.message and "no remote run cache is set" in e.value.message
    assert "--cache-remote" in e.value.hint
    cli = zoo_cli("run", recipe, "--executor", address, "--cache-dir", hidden / "cache", "--cache-remote", "none")
    assert cli.code == 2 and "cannot read the run cache" in cli.text


def test_the_same_workers_run_it_through_the_remote(tmp_path, blind_worker, remote):
    address, hidden, _ = blind_worker
    result = zoo.run(write_recipe(tmp_path, BLIND), executor=address, cache_dir=hidden / "cache-2",
                     cache_remote=remote)
    assert [s.state for s in result.stages] == ["done", "done", "done"], [s.error for s in result.stages]
    assert [(e.kind, e.ref) for e in result.stages[2].effects] == [("published", "shipped@1.0.0")]


FILES = """\
schema_version: 1
name: reads-its-folder
version: 1.0.0
stages:
  listing: {kind: tree, config: {folder: tokenizer, notes: data/notes.txt}}
  copy: {kind: script, needs: [listing], config: {file: model.py}}
"""


def test_a_worker_that_cannot_see_the_project_runs_its_stages_from_the_shipped_files(blind_worker, remote):
    """The project (recipe, a folder, a data file, a code file) lies in the folder the worker cannot
    see: its stages read what was shipped, in a private project folder of the worker's cache."""
    address, hidden, spec = blind_worker
    project = hidden / "project"
    (project / "tokenizer" / "sub").mkdir(parents=True)
    (project / "tokenizer" / "vocab.txt").write_text("a b c")
    (project / "tokenizer" / "sub" / "merges.txt").write_text("ab")
    (project / "data").mkdir()
    (project / "data" / "notes.txt").write_text("notes")
    (project / "model.py").write_text("print('model')\n")
    recipe = write_recipe(project, FILES)
    shipped = zoo.run(recipe, executor=address, cache_dir=hidden / "cache-files", cache_remote=remote)
    assert [s.state for s in shipped.stages] == ["done", "done"], [s.error for s in shipped.stages]
    ran_in = shipped.stages[0].metrics["recipe_dir"]
    assert ran_in.startswith(str(spec.cache / "tmp")), ran_in
    assert {e.stage for e in Cache(spec.cache).iter_entries()} >= {"listing", "copy"}
    local = zoo.run(recipe, cache_dir=hidden / "cache-local", cache_remote="none")
    assert [s.state for s in local.stages] == ["done", "done"]
    assert {s.id: s.key for s in shipped.stages} == {s.id: s.key for s in local.stages}
    assert {s.id: s.outputs for s in shipped.stages} == {s.id: s.outputs for s in local.stages}


def test_a_file_outside_the_project_is_refused_before_the_stage_is_submitted(tmp_path, blind_worker, remote):
    address, hidden, _ = blind_worker
    outside = tmp_path / "outside.py"
    outside.write_text("x = 1\n")
    recipe = write_recipe(hidden, BLIND.replace("kind: concat, needs: [a]", f"kind: script, needs: [a], "
                                                                           f"config: {{file: {outside}}}"))
    result = zoo.run(recipe, executor=address, cache_dir=hidden / "cache-outside", cache_remote=remote)
    assert [s.state for s in result.stages] == ["done", "failed", "skipped"]
    error = result.stages[1].error
    assert error.exit_code == 2 and str(outside) in error.message and "recipe's folder" in error.hint


def test_a_shipped_recipe_reading_a_csv_of_its_folder_equals_a_local_run(blind_worker, remote):
    """tabular-mlp's train and export (torch, onnxruntime) read data/breast-cancer.csv beside the
    recipe; the project lies where the worker cannot see it. Keys and bytes equal a local run's."""
    pytest.importorskip("torch")
    address, hidden, spec = blind_worker
    project = hidden / "tabular"
    (project / "data").mkdir(parents=True)
    shutil.copy(REPO / "recipes" / "data" / "breast-cancer.csv", project / "data")
    text = (REPO / "recipes" / "tabular-mlp.yaml").read_text()
    recipe = write_recipe(project, text[:text.index("  optimize:\n")], "tabular-mlp.yaml")  # train and export
    shipped = zoo.run(recipe, executor=address, cache_dir=hidden / "cache-tabular", cache_remote=remote)
    assert [s.state for s in shipped.stages] == ["done", "done"], [s.error for s in shipped.stages]
    assert {s.key for s in shipped.stages} <= {e.key for e in Cache(spec.cache).iter_entries()}  # ran there
    local = zoo.run(recipe, cache_dir=hidden / "cache-tabular-local", cache_remote="none")
    assert [s.state for s in local.stages] == ["done", "done"]
    assert {s.id: s.key for s in shipped.stages} == {s.id: s.key for s in local.stages}
    assert {s.id: s.outputs for s in shipped.stages} == {s.id: s.outputs for s in local.stages}


def test_a_recipe_in_the_callers_cache_naming_absolute_paths_in_its_cache_and_zoo_home_runs_on_the_worker(
        blind_worker, remote, monkeypatch):
    """As `zoo import` leaves them: the recipe lies in the caller's run cache (imports/…), with a
    folder beside it, and its config names files by absolute paths inside the caller's cache and
    ZOO_HOME, all where the worker cannot see them. The worker puts them at the same places of its
    own cache and ZOO_HOME, runs the recipe there with those paths rewritten, and equals a local run."""
    address, hidden, spec = blind_worker
    cache, home = hidden / "cache-import", hidden / "home-import"
    monkeypatch.setenv("ZOO_CACHE_DIR", str(cache))  # the caller's folders, as the `cache:`/`zoo-home:` labels see them
    monkeypatch.setenv("ZOO_HOME", str(home))
    folder = cache / "imports" / "0123456789abcdef"
    (folder / "tokenizer").mkdir(parents=True)
    (folder / "tokenizer" / "vocab.txt").write_text("a b c")
    source = cache / "sources" / "sha256" / "ab" / ("ab" * 32)
    source.parent.mkdir(parents=True)
    source.write_text("a source file in the cache")
    (home / "scripts").mkdir(parents=True)
    (home / "scripts" / "model.py").write_text("print('in the zoo home')\n")
    recipe = write_recipe(folder, FILES.replace("notes: data/notes.txt", f"notes: {source}")
                          .replace("file: model.py", f"file: {home / 'scripts' / 'model.py'}"))
    shipped = zoo.run(recipe, executor=address, cache_dir=cache, cache_remote=remote)
    assert [s.state for s in shipped.stages] == ["done", "done"], [s.error for s in shipped.stages]
    assert shipped.stages[0].metrics["recipe_dir"] == str(spec.cache / "imports" / "0123456789abcdef")
    assert (spec.home / "scripts" / "model.py").read_text() == "print('in the zoo home')\n"
    local = zoo.run(recipe, cache_dir=hidden / "cache-import-local", cache_remote="none")
    assert [s.state for s in local.stages] == ["done", "done"]
    assert {s.id: s.key for s in shipped.stages} == {s.id: s.key for s in local.stages}
    assert {s.id: s.outputs for s in shipped.stages} == {s.id: s.outputs for s in local.stages}




def test_a_model_from_parent_in_the_callers_zoo_only_runs_on_the_worker(blind_worker, remote, monkeypatch):
    """The parent is in the caller's zoo, where the worker cannot see it, and not in the worker's:
    the stage reads it from its pin and file, shipped with it; no `zoo pull` on the worker."""
    from registry_servers import make_staging

    address, hidden, spec = blind_worker
    monkeypatch.setenv("ZOO_HOME", str(hidden / "home-parent"))
    LocalZoo().publish(make_staging(hidden / "staging"))
    project = hidden / "parent-project"
    project.mkdir()
    recipe = write_recipe(project, PARENT)
    shipped = zoo.run(recipe, executor=address, cache_dir=hidden / "cache-parent", cache_remote=remote)
    assert [s.state for s in shipped.stages] == ["done"], [s.error for s in shipped.stages]
    assert shipped.stages[0].metrics["parent_path"].startswith(str(spec.home / "models" / "tiny"))
    assert LocalZoo(spec.home).list() == []
    local = zoo.run(recipe, cache_dir=hidden / "cache-parent-local", cache_remote="none")
    assert [s.state for s in local.stages] == ["done"]
    assert shipped.stages[0].key == local.stages[0].key and shipped.stages[0].outputs == local.stages[0].outputs


def test_a_zoo_import_recipe_of_a_file_in_the_callers_source_store_runs_on_the_worker(
        tmp_path, blind_worker, remote, monkeypatch):
    """The recipe `zoo import` generates for a model file kept in the caller's source store
    (`python -m zoo.sources add`), written where `zoo import` writes it (`<cache>/imports/…`):
    export (passing the file through), verify and deploy run on a worker that sees neither the
    cache nor the file, and give a local run's keys and bytes."""
    import hashlib

    from zoo import sources
    from registry_servers import tiny_onnx
    from zoo.release import import_source
    from zoo.release.importer import recipe_text

    address, hidden, spec = blind_worker
    cache = hidden / "cache-imported"
    monkeypatch.setenv("ZOO_CACHE_DIR", str(cache))
    monkeypatch.setenv("ZOO_HOME", str(hidden / "home-imported"))
    stored = sources.add(tiny_onnx(tmp_path / "tiny.onnx"), cache)
    text = recipe_text(import_source.resolve(str(stored)), "tiny-import", "1.0.0")
    assert str(stored) in text  # the recipe names the file by its absolute path in the cache
    folder = cache / "imports" / hashlib.sha256(text.encode()).hexdigest()[:16]
    folder.mkdir(parents=True)
    recipe = write_recipe(folder, text)
    shipped = zoo.run(recipe, executor=address, cache_dir=cache, cache_remote=remote)
    assert [s.state for s in shipped.stages] == ["done"] * 3, [s.error for s in shipped.stages]
    assert {s.key for s in shipped.stages} <= {e.key for e in Cache(spec.cache).iter_entries()}  # ran there
    local = zoo.run(recipe, cache_dir=hidden / "cache-imported-local", cache_remote="none")
    assert [s.state for s in local.stages] == ["done"] * 3
    assert {s.id: s.key for s in shipped.stages} == {s.id: s.key for s in local.stages}
    assert {s.id: s.outputs for s in shipped.stages} == {s.id: s.outputs for s in local.stages}
