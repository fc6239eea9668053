"""`zoo import SOURCE`: every source form against real servers on 127.0.0.1 (an HTTP server, olah as
the Hugging Face endpoint serving git repos), through the real `zoo` CLI.

Each import must publish a version whose manifest lists the generated recipe and its lockfile
as files and carries the source's provenance; importing the same source again is cached and
changes nothing; a wrong sha256 is refused before any stage runs; the recipe and lockfile
pulled from the version rebuild the same bytes (`zoo repro --check`). A catalog name
(torchvision:NAME) imports end to end through a stand-in catalog on ``ZOO_CATALOG_PATH`` whose
URL is the local HTTP server, serving a file of torchvision's tensor names and shapes (nothing
is downloaded from the internet).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import onnx
import pytest
import yaml

from cli_helpers import zoo
from onnx_models import detector_model, multi_io_model, sequence_model
from test_sources import _Server
from zoo.errors import InvalidInput
from zoo.host import platform_class
from zoo.registry.store import LocalZoo
from registry_servers import olah_server, tiny_onnx
from zoo.release import import_source
from zoo.release.importer import LOCK_FILE, RECIPE_FILE, graph_inputs, parse_shape, recipe_text

pytestmark = pytest.mark.slow  # every import runs export, verify and deploy


@pytest.fixture
def http():
    server = _Server()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """olah (a real Hugging Face mirror server) serving the git repos under ``mirrors/models``."""
    work = tmp_path_factory.mktemp("hub")
    with olah_server(work / "mirrors", work / "olah") as url:
        yield url, work / "mirrors" / "models"


@pytest.fixture
def hub_env(hub, tmp_path):
    """The environment of a `zoo` process that reaches the local Hub (conftest keeps HF offline)."""
    return {"HF_ENDPOINT": hub[0], "HF_HUB_OFFLINE": "0", "HF_HOME": str(tmp_path / "hf-home")}


def _git_repo(root: Path, repo_id: str, files: dict[str, bytes], tag: str | None = None) -> str:
    """A model repo at ``root/<org>/<name>`` (a git repo, as olah serves them) holding `files`,
    its commit tagged `tag`; returns the commit."""
    repo = root / repo_id
    repo.mkdir(parents=True)

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@localhost", *args],
                              check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q", "-b", "main")
    for name, data in files.items():
        (repo / name).write_bytes(data)
    git("add", "-A")
    git("commit", "-q", "-m", "model")
    if tag:
        git("tag", tag)
    return git("rev-parse", "HEAD")


def _tiny_bytes(tmp_path: Path, scale: float = 2.0) -> bytes:
    return tiny_onnx(tmp_path / f"tiny-{scale}.onnx", scale=scale).read_bytes()


def _version_file(zoo_: LocalZoo, ref: str, path: str) -> bytes:
    manifest = zoo_.resolve(ref)
    [found] = [f for f in manifest.files if f.path == path]
    return zoo_.blobs.path(found.sha256).read_bytes()


def _check_version(ref: str, source_file: bytes, form: str) -> dict:
    """The version carries the recipe and lockfile as files, the provenance, and the source's model."""
    local = LocalZoo()
    manifest = local.resolve(ref)
    paths = {f.path for f in manifest.files}
    assert {RECIPE_FILE, LOCK_FILE, "zoo.lock", "provenance.intoto.json"} <= paths, paths
    recipe = yaml.safe_load(_version_file(local, ref, RECIPE_FILE))
    lock = yaml.safe_load(_version_file(local, ref, LOCK_FILE))
    assert (recipe["name"], recipe["version"]) == (manifest.name, manifest.version)
    assert lock["recipe"]["name"] == manifest.name and set(lock["platforms"][platform_class()]) == {
        "export", "verify", "deploy"}
    assert lock["recipe"]["digest"] == manifest.lineage.recipe["digest"]  # the lock of the recipe that built it
    provenance = manifest.extra["import"]
    assert provenance["form"] == form and provenance["sha256"] == hashlib.sha256(source_file).hexdigest()
    assert provenance["recipe"] == RECIPE_FILE and provenance["lock"] == LOCK_FILE
    # the build is the source model, graph and weights unchanged (only provenance props added)
    build = onnx.load(local.materialize(manifest, "cpu-fp32"))
    assert build.graph == onnx.load_from_string(source_file).graph
    props = {p.key: p.value for p in build.metadata_props}
    assert provenance["sha256"] in props["zoo.attribution"]  # the source file, credited by its digest
    provenance["props"] = props
    return provenance


def _reproduces(ref: str, tmp_path: Path, env: dict | None = None) -> None:
    """The recipe and lockfile pulled from the version rebuild every stage bit for bit, in a fresh
    cache (which fetches the source again)."""
    out = tmp_path / "pulled"
    assert zoo("pull", ref, "--to", out).code == 0
    assert (out / RECIPE_FILE).is_file() and (out / LOCK_FILE).is_file()
    lock_before = (out / LOCK_FILE).read_bytes()
    check = zoo("repro", out / RECIPE_FILE, "--check", env={**(env or {}), "ZOO_CACHE_DIR": str(tmp_path / "fresh-cache")})
    assert check.code == 0, check.text
    assert "every rebuilt stage is bit-identical to the lockfile" in check.out
    assert (out / LOCK_FILE).read_bytes() == lock_before


def test_a_local_file_imports_with_its_recipe_and_lock_and_a_second_import_is_cached(tmp_path):
    model = tmp_path / "My Model.onnx"
    model.write_bytes(_tiny_bytes(tmp_path))
    first = zoo("import", model)
    assert first.code == 0, first.text
    assert "imported my-model@1.0.0" in first.out and "3 stage(s) ran" in first.out
    provenance = _check_version("my-model@1.0.0", model.read_bytes(), "file")
    assert provenance["path"] == str(model.resolve()) and "license" not in provenance
    shown = zoo("show", "my-model@1.0.0")
    assert shown.code == 0 and RECIPE_FILE in shown.out and LOCK_FILE in shown.out and "imported from:" in shown.out
    before = LocalZoo().manifest_path("my-model", "1.0.0").read_bytes()

    again = zoo("import", model, "--json")
    assert again.code == 0, again.text
    result = json.loads(again.out)
    assert result["created"] is False and result["executed"] == [] and len(result["cached"]) == 3
    assert LocalZoo().manifest_path("my-model", "1.0.0").read_bytes() == before
    _reproduces("my-model@1.0.0", tmp_path)


def test_name_and_version_options_and_a_conflicting_reimport(tmp_path):
    model = tmp_path / "m.onnx"
    model.write_bytes(_tiny_bytes(tmp_path))
    ok = zoo("import", model, "--name", "edges", "--version", "2.1.0")
    assert ok.code == 0, ok.text
    assert LocalZoo().get("edges", "2.1.0") is not None
    model.write_bytes(_tiny_bytes(tmp_path, scale=3.0))  # other bytes under the same name and version
    clash = zoo("import", model, "--name", "edges", "--version", "2.1.0")
    assert clash.code == 3 and "already published with different content" in clash.err, clash.text
    bad = zoo("import", model, "--name", "Bad Name")
    assert bad.code == 2 and "invalid model name" in bad.err


def test_an_https_source_imports_pinned_and_a_second_import_needs_no_download(http, tmp_path):
    data = _tiny_bytes(tmp_path)
    digest = hashlib.sha256(data).hexdigest()
    http.files["/models/edge-net.onnx"] = data
    url = http.url("models/edge-net.onnx")
    first = zoo("import", f"{url}#sha256={digest}")
    assert first.code == 0, first.text
    provenance = _check_version("edge-net@1.0.0", data, "url")
    assert provenance["url"] == url
    recipe = yaml.safe_load(_version_file(LocalZoo(), "edge-net@1.0.0", RECIPE_FILE))
    assert recipe["stages"]["export"]["config"]["onnx"] == {"url": url, "sha256": digest}
    assert http.requests == [("/models/edge-net.onnx", None)]

    again = zoo("import", f"{url}#sha256={digest}", "--json")
    assert again.code == 0 and json.loads(again.out)["created"] is False, again.text
    assert len(http.requests) == 1  # the source store and the run cache answered
    _reproduces("edge-net@1.0.0", tmp_path)


def test_a_wrong_or_missing_sha256_is_refused_before_anything_runs(http, tmp_path):
    http.files["/m.onnx"] = _tiny_bytes(tmp_path)
    wrong = hashlib.sha256(b"another file").hexdigest()
    refused = zoo("import", f"{http.url('m.onnx')}#sha256={wrong}")
    assert refused.code == 4 and "checksum mismatch" in refused.err, refused.text
    assert "[zoo]" not in refused.err  # no stage ran
    assert LocalZoo().list() == []
    cache = Path(os.environ["ZOO_CACHE_DIR"])
    assert not (cache / "imports").exists() and not (cache / "entries").exists()

    unpinned = zoo("import", http.url("m.onnx"))
    assert unpinned.code == 2 and "no #sha256=" in unpinned.err and "sha256sum" in unpinned.err, unpinned.text
    short = zoo("import", f"{http.url('m.onnx')}#sha256={wrong[:8]}")
    assert short.code == 2 and "not 64 hex digits" in short.err
    assert LocalZoo().list() == []


def test_a_hub_repo_imports_at_its_resolved_commit_with_the_cards_license(hub, hub_env, tmp_path):
    data = _tiny_bytes(tmp_path)
    commit = _git_repo(hub[1], "acme/Edge-Detector", {"model.onnx": data,
                                                      "README.md": b"---\nlicense: mit\n---\n# edges\n"})
    first = zoo("import", "hf://acme/Edge-Detector", env=hub_env)
    assert first.code == 0, first.text
    provenance = _check_version("edge-detector@1.0.0", data, "hf")
    assert provenance["revision"] == commit and provenance["license"] == "mit"
    assert provenance["props"]["zoo.license"] == "mit"  # stamped into the build, credited to the repo at its commit
    assert f"acme/Edge-Detector on the Hugging Face Hub (commit {commit})" in provenance["props"]["zoo.attribution"]
    assert provenance["url"] == f"hf://acme/Edge-Detector@{commit}/model.onnx"
    manifest = LocalZoo().resolve("edge-detector@1.0.0")
    assert manifest.license == "mit"
    recipe = yaml.safe_load(_version_file(LocalZoo(), "edge-detector@1.0.0", RECIPE_FILE))
    assert recipe["stages"]["export"]["config"]["onnx"]["url"] == provenance["url"]

    again = zoo("import", "hf://acme/Edge-Detector@main/model.onnx", "--json", env=hub_env)
    assert again.code == 0 and json.loads(again.out)["created"] is False, again.text
    _reproduces("edge-detector@1.0.0", tmp_path, hub_env)


def test_a_hub_repo_with_several_onnx_files_needs_one_named(hub, hub_env, tmp_path):
    _git_repo(hub[1], "acme/pair", {"a.onnx": _tiny_bytes(tmp_path), "b.onnx": _tiny_bytes(tmp_path, 3.0)})
    refused = zoo("import", "hf://acme/pair", env=hub_env)
    assert refused.code == 2 and "2 .onnx files: a.onnx, b.onnx" in refused.err, refused.text
    assert "zoo import hf://acme/pair@main/b.onnx" in refused.err
    named = zoo("import", "hf://acme/pair/b.onnx", "--version", "0.2.0", env=hub_env)
    assert named.code == 0, named.text
    provenance = _check_version("pair@0.2.0", _tiny_bytes(tmp_path, 3.0), "hf")
    assert "license" not in provenance  # the repo has no card: no license is claimed
    missing = zoo("import", "hf://acme/pair/c.onnx", env=hub_env)
    assert missing.code == 2 and "no file 'c.onnx'" in missing.err
    nowhere = zoo("import", "hf://acme/absent", env=hub_env)
    assert nowhere.code == 2 and "no Hugging Face model repo 'acme/absent'" in nowhere.err, nowhere.text


def test_a_hub_tag_that_is_a_version_names_the_version(hub, hub_env, tmp_path):
    commit = _git_repo(hub[1], "acme/tagged", {"net.onnx": _tiny_bytes(tmp_path)}, tag="v2.0.0")
    _git_repo(hub[1], "acme/other", {"net.onnx": _tiny_bytes(tmp_path)})
    tagged = zoo("import", "hf://acme/tagged@v2.0.0", "--json", env=hub_env)
    assert tagged.code == 0, tagged.text
    result = json.loads(tagged.out)
    assert result["ref"] == "tagged@2.0.0" and result["source"]["revision"] == commit
    missing = zoo("import", "hf://acme/other@v9.9.9", env=hub_env)
    assert missing.code == 2 and "acme/other" in missing.err and "v9.9.9" in missing.err, missing.text


def test_an_unreachable_or_offline_hub_is_a_storage_error():
    from registry_servers import free_port

    dead = zoo("import", "hf://acme/x", env={"HF_ENDPOINT": f"http://127.0.0.1:{free_port()}", "HF_HUB_OFFLINE": "0"})
    assert dead.code == 3 and "cannot reach the Hub" in dead.err, dead.text
    offline = zoo("import", "hf://acme/x")  # conftest sets HF_HUB_OFFLINE=1
    assert offline.code == 3 and "HF_HUB_OFFLINE is set" in offline.err, offline.text
    assert LocalZoo().list() == []


def test_a_model_with_dynamic_dimensions_needs_their_sizes(tmp_path):
    model = tmp_path / "encoder.onnx"
    onnx.save(sequence_model(), model)
    refused = zoo("import", model)
    assert refused.code == 2 and "--shape ids=N" in refused.err, refused.text
    ok = zoo("import", model, "--shape", "ids=6")
    assert ok.code == 0, ok.text
    recipe = yaml.safe_load(_version_file(LocalZoo(), "encoder@1.0.0", RECIPE_FILE))
    assert recipe["model"]["inputs"] == {"ids": {"shape": ["batch", 6], "dtype": "int64"}}


def test_catalog_names_generate_a_recipe_for_the_export_kinds_catalog():
    from zoo import catalog

    source = import_source.resolve("torchvision:resnet18")
    pin = catalog.resolve("torchvision:resnet18")
    assert (source.form, source.name, source.version, source.license) == ("catalog", "resnet18", "1.0.0",
                                                                          "BSD-3-Clause")
    assert (source.sha256, source.weights_url) == (pin["sha256"], pin["url"])
    recipe = yaml.safe_load(recipe_text(source, source.name, source.version))
    assert recipe["model"] == {"arch": "resnet18", "num_classes": 1000}
    assert recipe["task"] == "image-classification" and recipe["license"] == "BSD-3-Clause"
    export = recipe["stages"]["export"]["config"]
    assert export == {"weights": "torchvision:resnet18", "input_shape": [3, 224, 224]}
    assert recipe["stages"]["verify"]["config"]["gates"] == ["cpu-fp32.checker >= 1"]
    assert recipe["stages"]["deploy"]["config"]["publish"] is False
    assert f"# url: {pin['url']}" in recipe_text(source, source.name, source.version)
    assert import_source.resolve("torchvision:mobilenet_v3_small").name == "mobilenet-v3-small"
    assert import_source.resolve("torchvision:alexnet").arch == "alexnet"


@pytest.mark.parametrize(("text", "message"), [
    ("torchvision:resnet", "has no model 'resnet' — did you mean 'resnet(18|50)'"),
    ("torchvision:ResNet 18", "is not a catalog name"),
    ("timm:resnet18", "no weights catalog called 'timm' and no such file"),
])
def test_unknown_catalog_names_say_what_there_is(text, message):
    with pytest.raises(InvalidInput, match=message) as error:
        import_source.resolve(text)
    assert "resnet18" in (error.value.hint or "") or "torchvision" in (error.value.hint or "")


@pytest.fixture
def stand_in_catalog(http, tmp_path):
    """A catalog on ZOO_CATALOG_PATH, shadowing zoo's torchvision one: its mobilenet_v3_small entry
    points at a file of torchvision's tensor names and shapes on the local HTTP server."""
    pytest.importorskip("torch", reason="exporting a torchvision architecture needs the torch extra")
    from test_vision_archs import _torchvision_shaped_file
    from zoo import catalog

    weights, digest = _torchvision_shaped_file("mobilenet_v3_small", tmp_path)
    http.files[f"/models/{weights.name}"] = weights.read_bytes()
    data = json.loads((catalog.CATALOG_DIR / "torchvision.json").read_text())
    entry = data["models"]["mobilenet_v3_small"]
    entry.update(url=http.url(f"models/{weights.name}"), sha256=digest, bytes=weights.stat().st_size)
    folder = tmp_path / "catalogs"
    folder.mkdir()
    (folder / "torchvision.json").write_text(json.dumps(data))
    return {"env": {catalog.PATH_ENV: str(folder)}, "entry": entry, "folder": folder, "data": data}


def test_a_catalog_name_imports_its_pinned_weights_as_an_onnx_version_that_reproduces(http, stand_in_catalog,
                                                                                     tmp_path):
    env, entry = stand_in_catalog["env"], stand_in_catalog["entry"]
    first = zoo("import", "torchvision:mobilenet_v3_small", env=env)
    assert first.code == 0, first.text
    assert "imported mobilenet-v3-small@1.0.0" in first.out and f"source: {entry['url']}" in first.out
    assert len(http.requests) == 1  # fetched once, checked, and found by the export stage in the source store
    local = LocalZoo()
    manifest = local.resolve("mobilenet-v3-small@1.0.0")
    assert {RECIPE_FILE, LOCK_FILE, "zoo.lock", "provenance.intoto.json"} <= {f.path for f in manifest.files}
    provenance = manifest.extra["import"]
    assert provenance == {**provenance, "form": "catalog", "source": "torchvision:mobilenet_v3_small",
                          "url": entry["url"], "sha256": entry["sha256"], "license": "BSD-3-Clause",
                          "arch": "mobilenet_v3_small"}
    recipe = yaml.safe_load(_version_file(local, "mobilenet-v3-small@1.0.0", RECIPE_FILE))
    assert recipe["stages"]["export"]["config"]["weights"] == "torchvision:mobilenet_v3_small"
    import numpy as np
    import onnxruntime as ort

    build = local.materialize(manifest, "cpu-fp32")
    session = ort.InferenceSession(str(build), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).random((2, 3, 224, 224), dtype=np.float32)
    (logits,) = session.run(None, {session.get_inputs()[0].name: x})
    assert logits.shape == (2, 1000) and np.isfinite(logits).all()
    props = {p.key: p.value for p in onnx.load(build).metadata_props}
    assert entry["sha256"] in props["zoo.attribution"] and entry["url"] in props["zoo.attribution"]
    assert "BSD-3-Clause" in props["zoo.attribution"]  # the weights' license, credited with their source

    again = zoo("import", "torchvision:mobilenet_v3_small", "--json", env=env)
    assert again.code == 0 and json.loads(again.out)["created"] is False, again.text
    assert len(http.requests) == 1
    _reproduces("mobilenet-v3-small@1.0.0", tmp_path, env=env)


def test_a_catalog_name_whose_served_file_differs_from_its_pin_publishes_nothing(http, stand_in_catalog):
    data, folder = stand_in_catalog["data"], stand_in_catalog["folder"]
    data["models"]["mobilenet_v3_small"]["sha256"] = "0" * 64  # the served file no longer matches
    (folder / "torchvision.json").write_text(json.dumps(data))
    bad = zoo("import", "torchvision:mobilenet_v3_small", env=stand_in_catalog["env"])
    assert bad.code == 4 and "sha256" in bad.err, bad.text
    assert LocalZoo().get("mobilenet-v3-small", "1.0.0") is None


def test_pull_points_at_import_for_names_and_sources_it_does_not_have():
    by_name = zoo("pull", "resnet18")
    assert by_name.code == 2 and "no model called 'resnet18'" in by_name.err
    assert "zoo import torchvision:resnet18" in by_name.err
    by_source = zoo("pull", "hf://org/model")
    assert by_source.code == 2 and "is a source to import" in by_source.err
    assert "hint: make a zoo version from it first: zoo import hf://org/model" in by_source.err
    assert "zoo import torchvision:alexnet" in zoo("show", "torchvision:alexnet").err
    other = zoo("pull", "mobilenet-v3-small")  # the catalog's model under zoo's spelling of a name
    assert other.code == 2 and "`zoo import torchvision:mobilenet_v3_small`" in other.err
    unknown = zoo("pull", "segmenter")
    assert unknown.code == 2 and "zoo import CATALOG:MODEL" in unknown.err and "torchvision:segmenter" not in unknown.err


@pytest.mark.parametrize("make", [multi_io_model, detector_model, sequence_model], ids=lambda f: f.__name__)
def test_the_wire_reader_sees_the_inputs_onnx_sees(make, tmp_path):
    model = make()
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    dims = [[d.dim_value if d.HasField("dim_value") else d.dim_param or None for d in i.type.tensor_type.shape.dim]
            for i in model.graph.input]
    expected = [(i.name, i.type.tensor_type.elem_type, d) for i, d in zip(model.graph.input, dims)]
    assert graph_inputs(path) == expected


def test_source_and_shape_parsing():
    assert import_source.parse_hub("hf://o/r") == ("o/r", None, None)
    assert import_source.parse_hub("hf://o/r@v1.2.0/sub/m.onnx") == ("o/r", "v1.2.0", "sub/m.onnx")
    for bad in ("hf://o", "hf://o/r@", "hf://o/r/"):
        with pytest.raises(InvalidInput):
            import_source.parse_hub(bad)
    assert import_source._version_of("v1.2.0") == "1.2.0" and import_source._version_of("main") == "1.0.0"
    assert parse_shape("ids=3x224, 224") == ("ids", [3, 224, 224])
    with pytest.raises(InvalidInput, match="NAME=D1,D2"):
        parse_shape("ids")
    with pytest.raises(InvalidInput, match="unknown scheme 'ftp'"):
        import_source.resolve("ftp://host/m.onnx")
    with pytest.raises(InvalidInput, match="does not exist"):
        import_source.resolve("no/such/file.onnx")
