"""A version's bill of materials (zoo/registry/bom.py): made when zoo publishes a version, valid
CycloneDX 1.6 (cyclonedx-python-lib's strict JSON-schema validator), listing what the version's own
files say — every build with its sha256, the dataset split and upstream sources with digests and
licenses from the provenance statement, the tools with the lock's versions, the parent model — in the
same bytes for the same content; hostile zoo.lock and statement bytes leave parts out, never crash;
shown by `zoo show` (and `--json`, `--bom`), carried by push and pull (never invented for a pulled
version), made by `zoo release` for a version published before BOMs."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from cli_helpers import zoo as zoo_cli
from conftest import REPO
from registry_servers import make_staging
from shipped_recipes import run_shipped
from zoo.registry import api
from zoo.registry.attachments import BOM
from zoo.registry.bom import BOM_SCHEMA_VERSION, build_bom, summary
from zoo.registry.manifest import Manifest
from zoo.registry.staging import file_ref, write_manifest
from zoo.registry.store import LocalZoo


def _validate(data: bytes) -> None:
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(data.decode())
    assert error is None, error


def _components(doc: dict) -> dict[str, dict]:
    return {c["bom-ref"]: c for c in doc.get("components", [])}


def _sha256(component: dict) -> str | None:
    return next((h["content"] for h in component.get("hashes", []) if h["alg"] == "SHA-256"), None)


def _reader(zoo: LocalZoo, manifest: Manifest):
    files = {f.path: f for f in manifest.files}
    return lambda path: zoo.blobs.path(files[path].sha256).read_bytes() if path in files else None


@pytest.fixture(scope="module")
def sobel(tmp_path_factory):
    """recipes/sobel-edges.yaml (an imported ONNX model on the digits) run and published as a user
    would, in its own folder, cache and zoo."""
    run = run_shipped("sobel-edges", tmp_path_factory.mktemp("sobel"))
    zoo = LocalZoo(Path(run["env"]["ZOO_HOME"]))
    manifest = zoo.resolve("sobel-edges@1.0.0")
    files = {f.path: zoo.blobs.path(f.sha256).read_bytes() for f in manifest.files}
    return {**run, "zoo": zoo, "manifest": manifest, "bom": zoo.attachments("sobel-edges", "1.0.0")[BOM],
            "lock": yaml.safe_load(files["zoo.lock"]), "statement": json.loads(files["provenance.intoto.json"])}


def test_a_published_version_carries_a_bom_that_validates_against_cyclonedx_1_6(sobel):
    _validate(sobel["bom"])
    doc = json.loads(sobel["bom"])
    assert doc["bomFormat"] == "CycloneDX" and doc["specVersion"] == "1.6" and doc["version"] == 1
    assert doc["serialNumber"].startswith("urn:uuid:")
    props = {p["name"]: p["value"] for p in doc["metadata"]["properties"]}
    assert props == {"zoo:bom_schema_version": str(BOM_SCHEMA_VERSION), "zoo:ref": "sobel-edges@1.0.0"}
    model = doc["metadata"]["component"]
    assert (model["type"], model["name"], model["version"]) == ("machine-learning-model", "sobel-edges", "1.0.0")
    assert model["licenses"] == [{"license": {"id": "Apache-2.0"}}]  # the recipe's license, an SPDX id
    assert model["modelCard"]["modelParameters"]["task"] == "generic"
    assert model["modelCard"]["modelParameters"]["inputs"] == [{"format": "image: float32 [batch, 1, height, width]"}]
    # the model depends on every other component listed
    depends = next(d for d in doc["dependencies"] if d["ref"] == model["bom-ref"])["dependsOn"]
    assert set(depends) == set(_components(doc))


def test_every_build_and_file_is_listed_with_the_manifests_sha256(sobel):
    manifest, doc = sobel["manifest"], json.loads(sobel["bom"])
    components = _components(doc)
    builds = {ref: c for ref, c in components.items() if ref.startswith("build:")}
    assert set(builds) == {f"build:{b}" for b in manifest.builds}
    for name, b in manifest.builds.items():
        c = builds[f"build:{name}"]
        assert c["type"] == "machine-learning-model" and _sha256(c) == b.file.sha256
        nested = {f["name"]: _sha256(f) for f in c.get("components", [])}
        assert nested == {f.path: f.sha256 for f in [*b.extra_files, *b.test_vectors]}
    for ref in manifest.files:  # zoo.lock and the provenance statement
        assert _sha256(components[f"file:{ref.path}"]) == ref.sha256
    # the card shows timings (each publisher's own): left out, like the timing metrics
    assert "file:README.md" not in components
    metrics = doc["metadata"]["component"]["modelCard"]["quantitativeAnalysis"]["performanceMetrics"]
    assert {"type": "cosine_min", "slice": "cpu-int8", "value": str(manifest.builds["cpu-int8"].metrics["cosine_min"])} \
        in metrics
    assert not any(m["type"].startswith(("latency", "throughput")) for m in metrics)


def test_the_dataset_and_the_imported_model_come_with_the_statements_digests(sobel):
    doc, statement = json.loads(sobel["bom"]), sobel["statement"]
    materials = {d["name"]: d for d in statement["predicate"]["buildDefinition"]["resolvedDependencies"]}
    components = _components(doc)
    data = components["data:digits"]
    assert data["type"] == "data" and data["data"] == [{"type": "dataset", "name": "digits"}]
    assert data["hashes"] == [{"alg": "BLAKE3", "content": materials["data:split"]["digest"]["blake3"]}]
    assert doc["metadata"]["component"]["modelCard"]["modelParameters"]["datasets"] == [{"ref": "data:digits"}]
    onnx = components["source:onnx"]
    assert _sha256(onnx) == hashlib.sha256((REPO / "recipes/models/sobel-edges.onnx").read_bytes()).hexdigest()
    assert _sha256(onnx) == materials["source:onnx"]["digest"]["sha256"] and "licenses" not in onnx  # none recorded
    # the files the stages read, with the digests the lock records pin
    read = {c["name"]: c["hashes"][0]["content"] for ref, c in components.items() if ref.startswith("read:")}
    locked = {label: digest for record in sobel["lock"]["platforms"]["unknown"].values()
              for label, digest in (record.get("files") or {}).items()}
    assert read == locked and "models/sobel-edges.onnx" in read


def test_tools_are_the_locks_with_their_versions_and_purls(sobel):
    doc = json.loads(sobel["bom"])
    locked = {(dist, version) for record in sobel["lock"]["platforms"]["unknown"].values()
              for dist, version in record["tools"].items()}
    tools = {(c["name"], c["version"]): c for c in doc["components"] if c["type"] == "library"}
    assert set(tools) == locked | set(sobel["manifest"].lineage.tools.items())
    ort = tools[("onnxruntime", sobel["manifest"].lineage.tools["onnxruntime"])]
    assert ort["purl"] == f"pkg:pypi/onnxruntime@{ort['version']}"
    stages = {sid for sid, r in sobel["lock"]["platforms"]["unknown"].items() if "onnxruntime" in r["tools"]}
    assert {p["value"] for p in ort["properties"] if p["name"] == "zoo:stages"} == {", ".join(sorted(stages))}


def test_the_same_content_gives_the_same_bytes_in_another_process_and_another_zoo(sobel, tmp_path):
    zoo, manifest = sobel["zoo"], sobel["manifest"]
    assert build_bom(manifest, _reader(zoo, manifest)) == sobel["bom"]
    code = ("import sys\nfrom zoo.registry.store import LocalZoo\nfrom zoo.registry.bom import build_bom\n"
            "z = LocalZoo(sys.argv[1]); m = z.resolve('sobel-edges@1.0.0'); f = {r.path: r for r in m.files}\n"
            "sys.stdout.buffer.write(build_bom(m, lambda p: z.blobs.path(f[p].sha256).read_bytes()))\n")
    other = subprocess.run([sys.executable, "-c", code, str(zoo.root)], capture_output=True, env={
        "PYTHONHASHSEED": "12345", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}, check=True)
    assert other.stdout == sobel["bom"]  # no set or dict order of one process in it
    # the version published again in another zoo, later (another publish time): the same BOM
    again = LocalZoo(tmp_path / "again")
    again.publish(_staging_of(zoo, manifest, tmp_path / "s"))
    assert again.resolve("sobel-edges@1.0.0").created != manifest.created
    assert again.attachments("sobel-edges", "1.0.0")[BOM] == sobel["bom"]


def _staging_of(zoo: LocalZoo, manifest: Manifest, dest: Path) -> Path:
    """A staging folder holding every file of a version of `zoo` (its blobs copied) and its manifest."""
    for ref in manifest.all_files():
        target = dest / ref.path
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(zoo.blobs.path(ref.sha256), target)
    write_manifest(dest, manifest)
    return dest


# ---- what the statement says of sources and parents (a version built from a zoo model) ----------

PARENT_SHA = "c94b27498feab137a6632bdaaf20f3f2670e71ff56386bb119f931505f3383da"
WEIGHTS_SHA = "5c0a9a3d6b2e8d1f4a7b0c3e6f9a2d5b8e1c4f7a0d3b6e9c2f5a8b1d4e7a0c3f"


def _with_files(staging: Path, files: dict[str, bytes]) -> Path:
    """`staging` with version-level `files` added to its manifest."""
    for path, data in files.items():
        (staging / path).write_bytes(data)
    m = Manifest.model_validate_json((staging / "zoo-manifest.json").read_bytes())
    write_manifest(staging, m.model_copy(update={"files": [file_ref(staging, p) for p in files]}))
    return staging


def _provenance(staging: Path, attribution: list[dict], tools: dict[str, str]) -> dict[str, bytes]:
    """A zoo.lock and provenance statement as deploy writes them (zoo_stages/lib/release/provenance.py)."""
    from zoo_stages.lib.release import provenance

    recipe = SimpleNamespace(name="tiny", version="1.0.0", digest="0" * 64, license="MIT")
    record = {"kind": "export", "kind_version": "10", "config": {}, "config_digest": "0" * 64, "matrix": {},
              "inputs": {}, "tools": tools, "outputs": {"model": "1" * 64}, "files": {"data/t.csv": "2" * 64}}
    subjects = [(ref.path, ref.sha256) for ref in
                Manifest.model_validate_json((staging / "zoo-manifest.json").read_bytes()).builds["cpu-fp32"].all_files()]
    stmt = provenance.statement(subjects=subjects, recipe=recipe, record="3" * 64, config={},
                                lineage={"export": record}, tools=tools,
                                data={"digest": "blake3:" + "4" * 64, "source": "csv", "license": "CC0-1.0"},
                                attribution=attribution)
    return {"zoo.lock": provenance.lock_yaml(recipe, {"export": record}).encode(),
            "provenance.intoto.json": provenance.statement_bytes(stmt)}


def test_a_parent_model_and_pretrained_weights_carry_their_digests_and_licenses(tmp_path):
    from zoo_stages.lib.release import provenance

    staging = make_staging(tmp_path / "s")
    attribution = [  # what a fine-tuned recipe's export records (zoo_stages/lib/models/finetune.py), and weights
        provenance.source_attribution("zoo:lenet-digits@1.0.0", url="zoo:lenet-digits@1.0.0#cpu-fp32",
                                      sha256=PARENT_SHA, license="CC-BY-4.0"),
        provenance.source_attribution("weights", url="https://download.pytorch.org/models/net.pth", sha256=WEIGHTS_SHA)]
    _with_files(staging, _provenance(staging, attribution, {"torch": "2.13.0+cpu", "onnx": "1.23.2"}))
    zoo = LocalZoo(tmp_path / "zoo")
    zoo.publish(staging)
    data = zoo.attachments("tiny", "1.0.0")[BOM]
    _validate(data)
    doc = json.loads(data)
    components = _components(doc)
    parent = components["parent:lenet-digits@1.0.0"]
    assert (parent["type"], parent["name"], parent["version"], _sha256(parent)) == (
        "machine-learning-model", "lenet-digits", "1.0.0", PARENT_SHA)
    assert parent["licenses"] == [{"license": {"id": "CC-BY-4.0"}}]
    assert {"name": "zoo:parent.build", "value": "cpu-fp32"} in parent["properties"]
    ancestors = doc["metadata"]["component"]["pedigree"]["ancestors"]
    assert [(a["name"], a["version"], _sha256(a)) for a in ancestors] == [("lenet-digits", "1.0.0", PARENT_SHA)]
    weights = components["source:weights"]
    assert _sha256(weights) == WEIGHTS_SHA and weights["licenses"] == [{"license": {"id": "BSD-3-Clause"}}]
    assert weights["externalReferences"] == [{"type": "distribution", "url": "https://download.pytorch.org/models/net.pth"}]
    assert weights["copyright"] == "torchvision pretrained weights, (c) PyTorch contributors"
    assert components["tool:torch@2.13.0+cpu"]["purl"] == "pkg:pypi/torch@2.13.0%2Bcpu"
    assert components["data:csv"]["hashes"] == [{"alg": "BLAKE3", "content": "4" * 64}]
    assert components["data:csv"]["licenses"] == [{"license": {"id": "CC0-1.0"}}]  # a license the statement states
    assert components["read:data/t.csv"]["hashes"] == [{"alg": "BLAKE3", "content": "2" * 64}]
    assert doc["metadata"]["component"]["licenses"] == [{"license": {"id": "MIT"}}]  # make_staging's "mit", fixed up
    s = summary(data)
    assert s["parents"] == [{"name": "lenet-digits", "version": "1.0.0", "sha256": PARENT_SHA, "blake3": None,
                             "license": "CC-BY-4.0"}]
    assert [(x["name"], x["license"]) for x in s["sources"]] == [("weights", "BSD-3-Clause")]
    assert s["datasets"][0]["blake3"] == "4" * 64 and s["datasets"][0]["license"] == "CC0-1.0"
    assert s["sha256"] == hashlib.sha256(data).hexdigest()


def test_a_license_that_is_no_spdx_id_is_kept_as_a_name_and_an_expression_as_an_expression(tmp_path):
    staging = make_staging(tmp_path / "s")
    m = Manifest.model_validate_json((staging / "zoo-manifest.json").read_bytes())
    for license, expected in (("MIT OR Apache-2.0", [{"expression": "MIT OR Apache-2.0"}]),
                              ("our own terms", [{"license": {"name": "our own terms"}}]), ("unspecified", None)):
        data = build_bom(m.model_copy(update={"license": license}), lambda path: None)
        _validate(data)
        assert json.loads(data)["metadata"]["component"].get("licenses") == expected, license


# ---- hostile inputs ------------------------------------------------------------------------------

def _bom_of(tmp_path: Path, files: dict[str, bytes]) -> dict:
    """The BOM of a version whose zoo.lock / statement are `files` (as a stranger's remote could serve them)."""
    staging = _with_files(make_staging(tmp_path / "s", card=None), files)
    m = Manifest.model_validate_json((staging / "zoo-manifest.json").read_bytes())
    data = build_bom(m, lambda path: (staging / path).read_bytes())
    _validate(data)
    return json.loads(data)


def _plain(doc: dict) -> set[str]:
    """The bom-refs of a BOM made of the manifest alone: its builds and the files it lists."""
    return {ref for ref in _components(doc) if not ref.startswith(("build:", "file:"))}


HOSTILE = {
    "huge": {"zoo.lock": b"platforms: {}\n" + b"#" * (5 * 1024 * 1024),
             "provenance.intoto.json": b" " * (5 * 1024 * 1024) + b"{}"},
    "deep": {"zoo.lock": b"a: " + b"[" * 100_000 + b"]" * 100_000 + b"\n",
             "provenance.intoto.json": b"[" * 100_000 + b"]" * 100_000},
    "not-text": {"zoo.lock": b"\xff\xfe\x00garbage: [", "provenance.intoto.json": b"\xff{not json"},
    "alias-bomb": {"zoo.lock": b"a: &a [x, x, x, x, x, x, x, x, x, x]\n" + b"".join(
        b"%s: &%s [*%s, *%s, *%s, *%s, *%s, *%s, *%s, *%s, *%s, *%s]\n" % ((bytes([98 + i]),) * 2 + (bytes([97 + i]),) * 10)
        for i in range(8)), "provenance.intoto.json": b"null"},
    "wrong-types": {
        "zoo.lock": yaml.safe_dump({"schema_version": 4, "platforms": {
            "unknown": {"export": {"tools": ["onnx", "1.0"], "files": "data.csv"}, "bad": "not a record",
                        "x": {"tools": {"onnx": {"v": 1}, "evil\x1b[31m": "1.0", "ok name": "1", "torch": 2}},
                        7: {"tools": {"numpy": "1.0\x1b]0;pwned\x07"}, "files": {"/etc/passwd": "zz", "a.csv": 5}}},
            "other": None}}).encode(),
        "provenance.intoto.json": json.dumps({"predicate": {"buildDefinition": {"resolvedDependencies": [
            "a string", {"name": 5}, {"name": "data:split", "digest": {"blake3": "../../etc"}, "annotations": []},
            {"name": "source:weights", "uri": "javascript:alert(1)", "digest": {"sha256": "Z" * 64},
             "annotations": {"license": "\x1b[2J"}},
            {"name": "source:zoo:../../x@1.0.0", "digest": "nope"},
            {"name": "source:" + "w" * 10_000}]}}}).encode()},
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_lock_or_statement_leaves_its_parts_out_and_the_bom_stays_valid(tmp_path, case):
    doc = _bom_of(tmp_path, HOSTILE[case])
    if case != "wrong-types":
        assert _plain(doc) == {"tool:onnx@1.23"}  # the manifest's lineage.tools only
        return
    refs = _plain(doc)
    # what is well-formed stays; a control character, a path, a non-hex digest or a non-string goes
    assert refs == {"tool:onnx@1.23", "data:split", "source:weights"}, refs
    assert "hashes" not in _components(doc)["data:split"]
    weights = _components(doc)["source:weights"]
    assert "hashes" not in weights and "licenses" not in weights and "externalReferences" not in weights
    assert "\x1b" not in json.dumps(doc)


def test_a_file_whose_bytes_are_not_the_manifests_is_not_read(tmp_path):
    staging = make_staging(tmp_path / "s", card=None)
    files = _provenance(staging, [], {"numpy": "2.4.6"})
    _with_files(staging, files)
    m = Manifest.model_validate_json((staging / "zoo-manifest.json").read_bytes())
    honest = json.loads(build_bom(m, lambda path: files.get(path)))
    assert "tool:numpy@2.4.6" in _components(honest) and "data:csv" in _components(honest)
    swapped = {p: d.replace(b"2.4.6", b"6.6.6").replace(b"csv", b"xyz") for p, d in files.items()}
    lied = json.loads(build_bom(m, lambda path: swapped.get(path)))
    assert _plain(lied) == {"tool:onnx@1.23"}  # neither file matched its sha256: nothing of them used


def test_a_hostile_bom_from_a_remote_is_summarised_without_its_malformed_parts():
    assert summary(b"\x1b[2J not json")["components"] == {}
    evil = json.dumps({"specVersion": "\x1b[31m1.6", "components": [
        {"type": "data", "name": "ok", "hashes": [{"alg": "BLAKE3", "content": "\x1b[2J"}], "licenses": [{"expression": 5}]},
        {"type": "library", "bom-ref": "tool:x", "name": "\x07bell", "version": "1"}, "nope", {"type": 3}]}).encode()
    s = summary(evil)
    assert s["spec_version"] is None and s["components"] == {"data": 1} and s["tools"] == []
    assert s["datasets"] == [{"name": "ok", "version": None, "sha256": None, "blake3": None, "license": None}]


# ---- zoo show, push and pull, release --------------------------------------------------------------

def test_zoo_show_prints_the_bom_section_its_json_and_the_document(sobel):
    env = sobel["env"]
    shown = zoo_cli("show", "sobel-edges@1.0.0", env=env)
    assert shown.code == 0, shown.text
    section = shown.out.split("bill of materials:", 1)[1]
    assert f"sha256 {hashlib.sha256(sobel['bom']).hexdigest()[:12]}" in section and "CycloneDX 1.6" in section
    assert "datasets: digits (blake3 " in section and "upstream: onnx (sha256 " in section
    assert "files read: models/sobel-edges.onnx (blake3 " in section
    tools = sobel["manifest"].lineage.tools
    assert f"onnxruntime {tools['onnxruntime']}" in section and f"numpy {tools['numpy']}" in section
    doc = json.loads(zoo_cli("show", "sobel-edges@1.0.0", "--json", env=env).out)
    assert doc["bom"] == summary(sobel["bom"]) and doc["bom"]["sha256"] == hashlib.sha256(sobel["bom"]).hexdigest()
    full = zoo_cli("show", "sobel-edges@1.0.0", "--bom", env=env)
    assert full.code == 0 and full.out.encode() == sobel["bom"]  # the stored bytes, as they are
    wrapped = json.loads(zoo_cli("show", "sobel-edges", "--bom", "--json", env=env).out)
    assert wrapped == {"schema_version": 1, "ref": "sobel-edges@1.0.0", "source": "local",
                       "sha256": hashlib.sha256(sobel["bom"]).hexdigest(), "bom": json.loads(sobel["bom"])}


def test_a_version_without_a_bom_says_so_and_a_republish_adds_it(tmp_path):
    zoo = LocalZoo()  # conftest's ZOO_HOME, which the CLI sees too
    staging = make_staging(tmp_path / "s")
    zoo.publish(staging)
    made = zoo.attachments("tiny", "1.0.0")[BOM]
    (zoo.attachments_dir("tiny", "1.0.0") / BOM).unlink()  # as a version published before zoo made BOMs
    shown = zoo_cli("show", "tiny@1.0.0")
    assert shown.code == 0 and "bill of materials: none (published before" in shown.out, shown.text
    assert json.loads(zoo_cli("show", "tiny@1.0.0", "--json").out)["bom"] is None
    missing = zoo_cli("show", "tiny@1.0.0", "--bom")
    assert missing.code == 2 and "carries no bill of materials" in missing.err
    zoo.publish(staging)  # the same content again
    assert zoo.attachments("tiny", "1.0.0")[BOM] == made


def test_push_and_pull_carry_the_bom_and_a_pull_never_invents_one(tmp_path):
    publisher = LocalZoo(tmp_path / "publisher")
    publisher.publish(make_staging(tmp_path / "s1"))
    publisher.publish(make_staging(tmp_path / "s2", version="1.1.0", scale=5.0))
    remote = tmp_path / "remote"
    api.remote_add("origin", str(remote), zoo=publisher)
    api.push("tiny@1.0.0", "origin", zoo=publisher)
    (publisher.attachments_dir("tiny", "1.1.0") / BOM).unlink()  # pushed as an older zoo would: without one
    api.push("tiny@1.1.0", "origin", zoo=publisher)
    consumer = LocalZoo(tmp_path / "consumer")
    api.remote_add("origin", str(remote), zoo=consumer)
    api.pull("tiny@1.0.0", zoo=consumer)
    api.pull("tiny@1.1.0", zoo=consumer)
    assert consumer.attachments("tiny", "1.0.0") == publisher.attachments("tiny", "1.0.0")
    assert consumer.attachments("tiny", "1.1.0") == {}
    shown = api.show("tiny@1.0.0", remote="origin", zoo=consumer)
    assert shown["bom"] == summary(publisher.attachments("tiny", "1.0.0")[BOM])
    assert api.show("tiny@1.1.0", remote="origin", zoo=consumer)["bom"] is None


def test_show_on_a_remote_whose_bom_is_hostile_shows_the_version_and_refuses_to_print_it(tmp_path):
    publisher = LocalZoo()
    publisher.publish(make_staging(tmp_path / "s"))
    remote = tmp_path / "remote"
    assert zoo_cli("remote", "add", "origin", remote).code == 0
    assert zoo_cli("push", "tiny@1.0.0", "--to", "origin").code == 0
    stored = remote / "models" / "tiny" / "attachments" / "1.0.0" / BOM
    stored.chmod(0o644)
    stored.write_bytes(b"\x1b[2J\x1b]0;owned\x07 not json")
    shown = zoo_cli("show", "tiny@1.0.0", "--remote", "origin")
    assert shown.code == 0, shown.text
    assert "\x1b" not in shown.out and "bill of materials: CycloneDX ?" in shown.out
    refused = zoo_cli("show", "tiny@1.0.0", "--remote", "origin", "--bom")
    assert refused.code == 2 and "is not valid JSON" in refused.err and "\x1b" not in refused.text


def test_release_gives_a_version_published_before_boms_its_bom_and_pushes_it(sobel, tmp_path):
    zoo, env = sobel["zoo"], sobel["env"]
    bom_path = zoo.attachments_dir("sobel-edges", "1.0.0") / BOM
    bom_path.unlink()  # as a version published before zoo made BOMs
    try:
        released = zoo_cli("release", sobel["recipe"], "--version", "1.0.0", "--to", tmp_path / "shipped",
                           "--json", env=env)
        assert released.code == 0, released.text
        assert bom_path.read_bytes() == sobel["bom"]
        assert (tmp_path / "shipped/models/sobel-edges/attachments/1.0.0" / BOM).read_bytes() == sobel["bom"]
    finally:
        if not bom_path.exists():
            zoo.ensure_bom(sobel["manifest"])


# ---- the catalog ---------------------------------------------------------------------------------

def test_the_catalog_copies_the_bom_and_links_it_from_the_version_page(sobel, tmp_path):
    from zoo.site.build import build_site

    zoo = sobel["zoo"]
    zoo.publish(make_staging(tmp_path / "s"))
    shutil.rmtree(zoo.model_dir("tiny") / "attachments")  # a version published before zoo made BOMs
    build_site(tmp_path / "site", zoo=zoo)
    doc = json.loads((tmp_path / "site" / "site.json").read_text())
    v = next(m for m in doc["models"] if m["name"] == "sobel-edges")["versions"][0]
    assert v["bom"] == {**summary(sobel["bom"]), "path": BOM, "href": f"models/sobel-edges/1.0.0/attachments/{BOM}"}
    assert (tmp_path / "site" / v["bom"]["href"]).read_bytes() == sobel["bom"]
    page = (tmp_path / "site" / v["page"]).read_text()
    assert f'<a href="attachments/{BOM}" class="bom">Bill of materials (CycloneDX 1.6)</a>' in page
    assert "<td>dataset</td><td>digits</td>" in page and "<td>upstream source</td><td>onnx</td>" in page
    assert "<td>file read</td><td>models/sobel-edges.onnx</td>" in page
    assert f"onnxruntime {sobel['manifest'].lineage.tools['onnxruntime']}" in page
    tiny = next(m for m in doc["models"] if m["name"] == "tiny")["versions"][0]
    assert tiny["bom"] is None and "carries no bill of" in (tmp_path / "site" / tiny["page"]).read_text()
