"""The OCI registry remote's own claims (zoo/registry/oci.py), against Debian's docker-registry
(distribution 2.8) on 127.0.0.1; the RemoteZoo contract itself runs on it in
test_registry_remote_contract.py and test_registry_remotes.py.

- the layout, read back by a plain OCI client (the oras SDK): a repository per model, a tag per
  version and zoo tag, ModelPack media types and file paths on the layers, their digests the
  builds' sha256, zoo's manifest as a layer;
- what oras pushes in ModelPack form (config + raw layers with file paths, no zoo manifest)
  pulled and verified by `zoo pull`; what cannot map refused, nothing installed;
- through the CLI: a tampered blob is exit 4 and installs nothing, other bytes under a released
  version exit 3; `+build` versions as ``_`` tags;
- credentials: a registry with htpasswd auth refuses a pull without them (AccessDenied naming
  `docker login`), takes them from $DOCKER_CONFIG/config.json or the variables the options
  name, and zoo writes them nowhere; a registry with Docker's token authentication (a Bearer
  challenge, a token service on 127.0.0.1 issuing signed JWTs) is answered with its token;
- mirrors: another registry tried when the primary is down or serves bad bytes;
- a push killed after its version tag is finished by the retry; a registry refusing the
  credentials falls back to the local zoo with a note.
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest
from cli_helpers import zoo as zoo_cli

from remote_fixtures import _flip
from zoo.errors import AccessDenied, InvalidInput
from zoo.registry import api
from zoo.registry.codec import dump_manifest
from zoo.registry.store import LocalZoo
from registry_servers import docker_registry, free_port, htpasswd_file, make_staging, tiny_onnx

MODEL = "builds/cpu-fp32/model.onnx"


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    root = tmp_path_factory.mktemp("oci")
    with docker_registry(root) as host:
        yield host, root / "data"


@pytest.fixture
def prefix(request) -> str:
    import uuid

    return f"p{uuid.uuid4().hex[:10]}"


@pytest.fixture
def publisher(tmp_path, registry, prefix) -> LocalZoo:
    z = LocalZoo(tmp_path / "pub")
    z.publish(make_staging(tmp_path / "s100", version="1.0.0", big_bytes=3000))
    z.publish(make_staging(tmp_path / "s110", version="1.1.0", scale=7.0,
                           builds={"cpu-fp32": {}, "cpu-int8": {"precision": "int8"}}))
    api.remote_add("reg", f"oci://{registry[0]}/{prefix}", zoo=z)
    return z


def _oras(host: str):
    import oras.client

    return oras.client.OrasClient(hostname=host, insecure=True)


def _blob_file(storage: Path, sha256: str) -> Path:
    return storage / "docker" / "registry" / "v2" / "blobs" / "sha256" / sha256[:2] / sha256 / "data"


def test_a_plain_oci_client_lists_and_fetches_what_zoo_pushed(registry, prefix, publisher, tmp_path):
    host, _ = registry
    api.push("tiny@1.0.0", "reg", tags=["prod"], zoo=publisher)
    api.push("tiny@1.1.0", "reg", zoo=publisher)
    client = _oras(host)
    target = f"{host}/{prefix}/tiny"
    assert sorted(client.get_tags(target)) == ["1.0.0", "1.1.0", "latest", "prod"]
    assert f"{prefix}/tiny" in client.session.get(f"http://{host}/v2/_catalog").json()["repositories"]

    m = publisher.resolve("tiny@1.1.0")
    oci = client.get_manifest(f"{target}:1.1.0")
    assert oci["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    assert oci["artifactType"] == "application/vnd.cncf.model.manifest.v1+json"
    assert oci["config"]["mediaType"] == "application/vnd.cncf.model.config.v1+json"
    assert oci["annotations"]["org.opencontainers.image.version"] == "1.1.0"
    assert oci["annotations"]["dev.zoo.schema_version"] == "1"
    layers = {(d["annotations"] or {}).get("org.cncf.model.filepath"): d for d in oci["layers"]}
    for build in m.builds.values():
        d = layers[build.file.path]
        assert d["mediaType"] == "application/vnd.cncf.model.weight.v1.raw"
        assert d["digest"] == f"sha256:{build.file.sha256}" and d["size"] == build.file.size
        assert d["annotations"]["org.opencontainers.image.title"] == build.file.path
    assert layers["README.md"]["mediaType"] == "application/vnd.cncf.model.doc.v1.raw"
    zoo_layer = layers["zoo-manifest.json"]
    assert zoo_layer["mediaType"] == "application/vnd.zoo.manifest.v1+json"

    config = client.get_blob(target, oci["config"]["digest"]).json()
    assert config["descriptor"]["name"] == "tiny" and config["descriptor"]["version"] == "1.1.0"
    assert config["config"]["format"] == "onnx"
    assert config["modelfs"]["diffIds"] == [d["digest"] for d in oci["layers"]]

    # fetched by the plain client: the bytes zoo's manifest names, at their paths
    out = tmp_path / "oras-out"
    client.pull(target=f"{target}:1.1.0", outdir=str(out))
    for f in m.all_files():
        assert hashlib.sha256((out / f.path).read_bytes()).hexdigest() == f.sha256
    assert (out / "zoo-manifest.json").read_bytes() == dump_manifest(m)
    # a zoo tag is the same manifest as its version
    assert client.get_manifest(f"{target}:prod") == client.get_manifest(f"{target}:1.0.0")


def _modelpack(folder: Path, files: dict[str, tuple[bytes, str]], *, version: str = "2.0.0") -> tuple[list[str], Path, Path]:
    """Files, an annotation file and a ModelPack config in `folder`, as a ModelPack packer writes them."""
    names = []
    notes = {}
    digests = []
    for path, (data, media_type) in files.items():
        local = folder / path.replace("/", "__")
        local.write_bytes(data)
        names.append(f"{local.name}:{media_type}")
        notes[local.name] = {"org.cncf.model.filepath": path, "org.opencontainers.image.title": path}
        digests.append("sha256:" + hashlib.sha256(data).hexdigest())
    config = folder / "config.json"
    config.write_text(json.dumps({"descriptor": {"name": "edge", "version": version, "createdAt": "2026-01-02T03:04:05Z",
                                                 "licenses": ["Apache-2.0"], "description": "packed by oras"},
                                  "config": {"format": "onnx"}, "modelfs": {"type": "layers", "diffIds": digests}}))
    annotations = folder / "annotations.json"
    annotations.write_text(json.dumps(notes))
    return names, config, annotations


WEIGHT = "application/vnd.cncf.model.weight.v1.raw"
DOC = "application/vnd.cncf.model.doc.v1.raw"


def _oras_push(host: str, target: str, folder: Path, files: dict, monkeypatch, **kw) -> None:
    names, config, annotations = _modelpack(folder, files, **kw)
    monkeypatch.chdir(folder)  # oras pushes paths relative to the working folder
    _oras(host).push(target=target, files=names, manifest_config=f"{config.name}:application/vnd.cncf.model.config.v1+json",
                     annotation_file=str(annotations), disable_path_validation=False, quiet=True)


def test_zoo_pulls_what_oras_pushed_in_modelpack_form(registry, prefix, tmp_path, monkeypatch):
    host, _ = registry
    onnx = tiny_onnx(tmp_path / "m.onnx", scale=5.0).read_bytes()
    folder = tmp_path / "pack"
    folder.mkdir()
    _oras_push(host, f"{host}/{prefix}/edge:2.0.0", folder, {"model.onnx": (onnx, WEIGHT), "README.md": (b"# edge\n", DOC)},
               monkeypatch)
    url = f"oci://{host}/{prefix}"
    listed = zoo_cli("list", "edge", "--remote", url, "--json")
    assert listed.code == 0, listed.text
    shown = zoo_cli("show", "edge@2.0.0", "--remote", url, "--json")
    assert shown.code == 0, shown.text
    info = json.loads(shown.out)
    assert info["license"] == "Apache-2.0" and info["description"] == "packed by oras"
    assert info["builds"]["cpu-fp32"]["file"]["sha256"] == hashlib.sha256(onnx).hexdigest()
    pulled = zoo_cli("pull", "edge@2.0.0", "--remote", url, "--to", tmp_path / "out")
    assert pulled.code == 0, pulled.text
    assert (tmp_path / "out" / "model.onnx").read_bytes() == onnx
    local = LocalZoo().resolve("edge@2.0.0")  # ZOO_HOME from conftest: the CLI's
    assert local.card.path == "README.md" and set(local.builds) == {"cpu-fp32"}
    # no `latest` tag (oras pushed the version tag only): the bare name is the newest version
    bare = zoo_cli("pull", "edge", "--remote", url, "--to", tmp_path / "bare", "--json")
    assert bare.code == 0 and json.loads(bare.out)["version"] == "2.0.0", bare.text
    found = zoo_cli("search", "packed", "--remote", url, "--json")
    assert found.code == 0, found.text
    assert [(r["name"], r["version"], r["build"]) for r in json.loads(found.out)] == [("edge", "2.0.0", "cpu-fp32")]


@pytest.mark.parametrize("case", ["tar-layer", "no-onnx", "escaping-path"])
def test_a_modelpack_artifact_that_cannot_map_is_refused_and_nothing_installed(registry, prefix, tmp_path, monkeypatch, case):
    host, _ = registry
    onnx = tiny_onnx(tmp_path / "m.onnx").read_bytes()
    files = {"tar-layer": {"model.onnx": (onnx, "application/vnd.cncf.model.weight.v1.tar")},
             "no-onnx": {"model.safetensors": (b"\0" * 64, WEIGHT)},
             "escaping-path": {"../evil.onnx": (onnx, WEIGHT)}}[case]
    folder = tmp_path / "pack"
    folder.mkdir()
    _oras_push(host, f"{host}/{prefix}/bad:1.0.0", folder, files, monkeypatch, version="1.0.0")
    r = zoo_cli("pull", "bad@1.0.0", "--remote", f"oci://{host}/{prefix}", "--to", tmp_path / "out")
    assert r.code == (4 if case == "escaping-path" else 2), r.text
    assert f"{prefix}/bad:1.0.0" in r.text
    assert not (tmp_path / "out").exists() and LocalZoo().get("bad", "1.0.0") is None


def test_tampered_blob_is_exit_4_and_other_bytes_under_a_version_exit_3(registry, prefix, publisher, tmp_path):
    host, storage = registry
    url = f"oci://{host}/{prefix}"
    api.push("tiny@1.0.0", "reg", zoo=publisher)
    LocalZoo(tmp_path / "rival-home").publish(make_staging(tmp_path / "rival", version="1.0.0", scale=99.0))
    r = zoo_cli("push", "tiny@1.0.0", "--to", url, env={"ZOO_HOME": str(tmp_path / "rival-home")})
    assert r.code == 3 and "different content" in r.text, r.text

    sha = publisher.resolve("tiny@1.0.0").builds["cpu-fp32"].file.sha256
    blob = _blob_file(storage, sha)
    blob.write_bytes(_flip(blob.read_bytes()))
    try:
        r = zoo_cli("pull", "tiny@1.0.0", "--remote", url, "--to", tmp_path / "out")
        assert r.code == 4 and "checksum mismatch" in r.text, r.text
        assert not (tmp_path / "out" / MODEL).exists() and LocalZoo().get("tiny", "1.0.0") is None
    finally:
        blob.write_bytes(_flip(blob.read_bytes()))  # blobs are the registry's, shared by its repositories


def test_build_metadata_versions_are_underscore_tags(registry, prefix, tmp_path):
    host, _ = registry
    z = LocalZoo(tmp_path / "z")
    z.publish(make_staging(tmp_path / "s", version="1.0.0+cu12"))
    api.remote_add("reg", f"oci://{host}/{prefix}", zoo=z)
    api.push("tiny@1.0.0+cu12", "reg", zoo=z)
    assert "1.0.0_cu12" in _oras(host).get_tags(f"{host}/{prefix}/tiny")
    assert [v.version for v in api.list_versions("tiny", remote="reg", zoo=z)] == ["1.0.0+cu12"]
    fresh = LocalZoo(tmp_path / "fresh")
    api.remote_add("reg", f"oci://{host}/{prefix}", zoo=fresh)
    assert api.pull("tiny@1.0.0+cu12", remote="reg", zoo=fresh).version == "1.0.0+cu12"
    with pytest.raises(InvalidInput, match="reads as version"):
        api.tag("tiny@1.0.0+cu12", "1.0.0_x", remote="reg", zoo=z)


def test_credentials_come_from_the_docker_config_or_named_variables_and_are_never_written(tmp_path, monkeypatch):
    auth = tmp_path / "auth"
    auth.mkdir()
    htpasswd = htpasswd_file(auth / "htpasswd", "zoo-user", "s3cret-pass-word")
    with docker_registry(tmp_path / "reg", htpasswd=htpasswd) as host:
        url = f"oci://{host}/secured"
        z = LocalZoo()  # ZOO_HOME from conftest
        z.publish(make_staging(tmp_path / "s"))
        monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "no-docker"))
        api.remote_add("reg", url, zoo=z)
        with pytest.raises(AccessDenied) as e:
            api.push("tiny@1.0.0", "reg", zoo=z)
        assert "docker login" in (e.value.hint or "") and "DOCKER_CONFIG" in (e.value.hint or "")

        docker = tmp_path / "docker"
        docker.mkdir()
        (docker / "config.json").write_text(json.dumps(
            {"auths": {host: {"auth": base64.b64encode(b"zoo-user:s3cret-pass-word").decode()}}}))
        monkeypatch.setenv("DOCKER_CONFIG", str(docker))
        assert api.push("tiny@1.0.0", "reg", tags=["prod"], zoo=z)["created"]

        monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "no-docker"))
        r = zoo_cli("pull", "tiny@prod", "--remote", url, env={"ZOO_HOME": str(tmp_path / "consumer")})
        assert r.code == 3 and "docker login" in r.text, r.text
        monkeypatch.setenv("REG_USER", "zoo-user")
        monkeypatch.setenv("REG_PASS", "s3cret-pass-word")
        api.remote_add("env", url, options={"username_env": "REG_USER", "password_env": "REG_PASS"}, zoo=z)
        r = zoo_cli("pull", "tiny@prod", "--remote", "env", env={"ZOO_HOME": str(tmp_path / "consumer")})
        assert r.code == 0, r.text
        with pytest.raises(InvalidInput, match="credential"):
            api.remote_add("bad", url, options={"password": "s3cret-pass-word"}, zoo=z)

    import os

    written = [tmp_path / "consumer", Path(os.environ["ZOO_HOME"]), Path(os.environ["ZOO_CONFIG_DIR"]),
               Path(os.environ["ZOO_CACHE_DIR"])]
    for folder in written:
        for f in folder.rglob("*") if folder.exists() else []:
            if f.is_file() and not f.is_symlink():
                data = f.read_bytes()
                assert b"s3cret-pass-word" not in data and base64.b64encode(b"zoo-user:s3cret-pass-word") not in data, f


def test_mirrors_are_other_registries_tried_in_order(registry, prefix, publisher, tmp_path):
    host, storage = registry
    api.push("tiny@1.0.0", "reg", zoo=publisher)
    with docker_registry(tmp_path / "mirror") as mirror_host:
        mirror = f"oci://{mirror_host}/copy"
        api.remote_add("copy", mirror, zoo=publisher)
        api.push("tiny@1.0.0", "copy", zoo=publisher)
        ref = publisher.resolve("tiny@1.0.0").builds["cpu-fp32"].file
        blob = _blob_file(storage, ref.sha256)
        blob.write_bytes(_flip(blob.read_bytes()))
        try:
            consumer = LocalZoo(tmp_path / "consumer")
            api.remote_add("reg", f"oci://{host}/{prefix}", mirrors=[mirror], zoo=consumer)
            res = api.pull("tiny@1.0.0", remote="reg", zoo=consumer)  # the primary's blob is bad: the mirror's is used
            assert Path(res.path).read_bytes() == publisher.blobs.path(ref.sha256).read_bytes()
        finally:
            blob.write_bytes(_flip(blob.read_bytes()))
        fresh = LocalZoo(tmp_path / "fresh")  # the primary down: manifest and blobs from the mirror
        api.remote_add("reg", f"oci://127.0.0.1:{free_port()}/{prefix}", mirrors=[mirror], zoo=fresh)
        assert api.pull("tiny@1.0.0", remote="reg", zoo=fresh).version == "1.0.0"
        with pytest.raises(InvalidInput, match="cannot mirror"):
            api.remote_add("mixed", f"oci://{host}/{prefix}", mirrors=[str(tmp_path / "folder")], zoo=fresh)


def test_what_an_oci_remote_cannot_do_is_refused(registry, prefix, publisher, tmp_path):
    host, _ = registry
    with pytest.raises(InvalidInput, match="garbage collection"):
        api.remote_gc("reg", zoo=publisher)
    with pytest.raises(InvalidInput, match="not an OCI registry location"):
        api.remote_add("x", "oci://", zoo=publisher)
    with pytest.raises(InvalidInput, match="run cache"):
        from zoo.engine.cache_config import _setting

        _setting(f"oci://{host}/{prefix}", {}, True, "test")
    with pytest.raises(InvalidInput, match="repository name"):
        LocalZoo(tmp_path / "odd").publish(make_staging(tmp_path / "odd-s", name="odd..name"))
        api.remote_add("reg", f"oci://{host}/{prefix}", zoo=LocalZoo(tmp_path / "odd"))
        api.push("odd..name@1.0.0", "reg", zoo=LocalZoo(tmp_path / "odd"))


def test_attachments_are_layers_of_the_version_and_cannot_be_added_later(registry, prefix, publisher):
    from zoo.registry.attachments import BOM, SIGNATURE

    host, _ = registry
    bom = publisher.attachments("tiny", "1.0.0")[BOM]  # the BOM publishing made (zoo/registry/bom.py)
    assert api.push("tiny@1.0.0", "reg", zoo=publisher)["attachments"] == [BOM]
    oci = _oras(host).get_manifest(f"{host}/{prefix}/tiny:1.0.0")
    [layer] = [d for d in oci["layers"] if d["annotations"]["org.cncf.model.filepath"] == BOM]
    assert layer["mediaType"] == "application/vnd.cyclonedx+json"
    assert layer["digest"] == "sha256:" + hashlib.sha256(bom).hexdigest()
    publisher.add_attachment("tiny", "1.0.0", SIGNATURE, b'{"sig": 1}')
    with pytest.raises(InvalidInput, match="without its signature.*cannot change once it is published"):
        api.push("tiny@1.0.0", "reg", zoo=publisher)


def test_a_registry_serving_the_wrong_version_or_an_index_is_refused(registry, prefix, publisher, tmp_path):
    """Hostile answers through `zoo pull`: the manifest of 1.0.0 tagged 2.0.0 (its zoo manifest
    says 1.0.0), an image index where a version should be; nothing installed."""
    import requests

    host, _ = registry
    api.push("tiny@1.0.0", "reg", zoo=publisher)
    base = f"http://{host}/v2/{prefix}/tiny/manifests"
    accept = {"Accept": "application/vnd.oci.image.manifest.v1+json"}
    body = requests.get(f"{base}/1.0.0", headers=accept).content
    oci = {"Content-Type": "application/vnd.oci.image.manifest.v1+json"}
    assert requests.put(f"{base}/2.0.0", data=body, headers=oci).status_code == 201
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
             "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digest, "size": len(body)}]}
    r = requests.put(f"{base}/3.0.0", data=json.dumps(index),
                     headers={"Content-Type": "application/vnd.oci.image.index.v1+json"})
    assert r.status_code == 201, r.text
    url = f"oci://{host}/{prefix}"
    for version, code, words in (("2.0.0", 3, "describes tiny@1.0.0"), ("3.0.0", 2, "image index")):
        cli = zoo_cli("pull", f"tiny@{version}", "--remote", url, "--to", tmp_path / version)
        assert cli.code == code and words in cli.text and f"{prefix}/tiny:{version}" in cli.text, cli.text
        assert not (tmp_path / version).exists() and LocalZoo().get("tiny", version) is None


def test_a_registry_with_token_authentication_is_answered_with_a_bearer_token(tmp_path, monkeypatch):
    """Docker's token protocol (GHCR, Docker Hub, Harbor): the registry's Bearer challenge names a
    token service; zoo asks it with the Docker config's credentials for the challenge's scope and
    sends the token it gets. Push, list and pull go through; without credentials, AccessDenied."""
    from registry_servers import token_registry

    with token_registry(tmp_path / "tok", "zoo-user", "tok3n-pass") as (host, issued):
        url = f"oci://{host}/team"
        z = LocalZoo(tmp_path / "z")
        z.publish(make_staging(tmp_path / "s"))
        api.remote_add("reg", url, zoo=z)
        monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "none"))
        with pytest.raises(AccessDenied, match="refused access"):
            api.push("tiny@1.0.0", "reg", zoo=z)
        docker = tmp_path / "docker"
        docker.mkdir()
        (docker / "config.json").write_text(json.dumps({"auths": {host: {"username": "zoo-user", "password": "tok3n-pass"}}}))
        monkeypatch.setenv("DOCKER_CONFIG", str(docker))
        assert api.push("tiny@1.0.0", "reg", tags=["prod"], zoo=z)["created"]
        assert any(s.startswith("repository:team/tiny:") and "push" in s for s in issued), issued
        fresh = LocalZoo(tmp_path / "fresh")
        api.remote_add("reg", url, zoo=fresh)
        assert [m.name for m in api.list_models(remote="reg", zoo=fresh)] == ["tiny"]  # the catalog's own scope
        assert api.pull("tiny@prod", remote="reg", zoo=fresh).version == "1.0.0"


class _Killed(BaseException):
    """Stands for kill -9: nothing after the raise point runs, no handler cleans up."""


def test_a_push_killed_after_its_version_tag_is_finished_by_the_retry(registry, prefix, publisher, monkeypatch):
    """The version's manifest is written, `latest` not yet moved: the version is visible by its
    version, `latest` still names the old one, and the retry moves it without uploading anything."""
    from zoo.storage.oci_client import OciClient

    api.push("tiny@1.0.0", "reg", zoo=publisher)
    real = OciClient.put_manifest

    def put_then_die(self, repo, reference, data, media_type="application/vnd.oci.image.manifest.v1+json"):
        real(self, repo, reference, data, media_type)
        if reference == "1.1.0":
            raise _Killed()

    with monkeypatch.context() as m:
        m.setattr(OciClient, "put_manifest", put_then_die)
        with pytest.raises(_Killed):
            api.push("tiny@1.1.0", "reg", zoo=publisher)
    assert api.show("tiny@1.1.0", remote="reg", zoo=publisher)["version"] == "1.1.0"
    assert api.show("tiny", remote="reg", zoo=publisher)["version"] == "1.0.0"
    again = api.push("tiny@1.1.0", "reg", zoo=publisher)
    assert not again["created"] and again["uploaded"] == 0
    assert api.show("tiny", remote="reg", zoo=publisher)["version"] == "1.1.0"


def test_a_refusing_registry_falls_back_to_the_local_zoo_with_a_note(tmp_path, monkeypatch):
    htpasswd = htpasswd_file(tmp_path / "htpasswd", "zoo-user", "pw-for-fallback")
    with docker_registry(tmp_path / "reg", htpasswd=htpasswd) as host:
        docker = tmp_path / "docker"
        docker.mkdir()
        (docker / "config.json").write_text(json.dumps({"auths": {host: {"username": "zoo-user", "password": "pw-for-fallback"}}}))
        monkeypatch.setenv("DOCKER_CONFIG", str(docker))
        z = LocalZoo(tmp_path / "z")
        z.publish(make_staging(tmp_path / "s"))
        api.remote_add("reg", f"oci://{host}/team", zoo=z)
        api.push("tiny@1.0.0", "reg", zoo=z)
        consumer = LocalZoo(tmp_path / "consumer")
        api.remote_add("reg", f"oci://{host}/team", zoo=consumer)
        first = api.pull("tiny", zoo=consumer)
        (docker / "config.json").write_text(json.dumps({"auths": {host: {"username": "zoo-user", "password": "wrong"}}}))
        again = api.pull("tiny", zoo=consumer)
        assert again.path == first.path and again.source == "local"
        assert any("refused" in n and "local zoo" in n for n in again.notes), again.notes
        with pytest.raises(AccessDenied, match="refused access"):
            api.pull("tiny@1.1.0", zoo=consumer)


def test_a_docker_credential_helper_gives_the_credentials(tmp_path, monkeypatch):
    """`credHelpers` in the Docker config (what `docker login` sets up with a keychain): zoo runs
    ``docker-credential-NAME get`` with the registry's host on stdin, as docker does (a helper
    written here in Python, speaking the helper protocol)."""
    import os
    import sys

    htpasswd = htpasswd_file(tmp_path / "htpasswd", "helper-user", "helper-pass")
    with docker_registry(tmp_path / "reg", htpasswd=htpasswd) as host:
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        helper = bin_dir / "docker-credential-zootest"
        helper.write_text(f"#!{sys.executable}\nimport json, sys\nassert sys.argv[1:] == ['get']\n"
                          f"host = sys.stdin.read().strip()\nassert host == {host!r}, host\n"
                          "print(json.dumps({'ServerURL': host, 'Username': 'helper-user', 'Secret': 'helper-pass'}))\n")
        helper.chmod(0o755)
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        docker = tmp_path / "docker"
        docker.mkdir()
        (docker / "config.json").write_text(json.dumps({"credHelpers": {host: "zootest"}}))
        monkeypatch.setenv("DOCKER_CONFIG", str(docker))
        z = LocalZoo(tmp_path / "z")
        z.publish(make_staging(tmp_path / "s"))
        api.remote_add("reg", f"oci://{host}/team", zoo=z)
        assert api.push("tiny@1.0.0", "reg", zoo=z)["created"]


def test_a_big_blob_goes_up_in_chunks_and_comes_back_whole(registry, prefix, publisher, monkeypatch):
    """Above `CHUNKED_ABOVE` a blob is uploaded in PATCHes (lowered here to a few KB so the tiny
    model takes several) and a closing PUT; a plain client fetches the same bytes, and every byte
    is reported to the progress display once."""
    from zoo.storage import oci_client

    host, _ = registry
    monkeypatch.setattr(oci_client, "CHUNKED_ABOVE", 1000)
    monkeypatch.setattr(oci_client, "UPLOAD_CHUNK", 1024)
    seen: list[int] = []
    result = api.push("tiny@1.0.0", "reg", zoo=publisher, progress=seen.append)
    ref = publisher.resolve("tiny@1.0.0").builds["cpu-fp32"].file
    assert ref.size > 3000 and sum(seen) == result["bytes"] and 1024 in seen
    got = _oras(host).get_blob(f"{host}/{prefix}/tiny", f"sha256:{ref.sha256}").content
    assert got == publisher.blobs.path(ref.sha256).read_bytes()


def test_a_registry_with_immutable_tags_refusing_the_later_write_is_a_conflict_stand_in_registry_refusal(
        registry, prefix, publisher, tmp_path, monkeypatch):
    """Stand-in: distribution 2.8 has no tag immutability (Harbor and ECR do), so the refusal is a
    patched `put_manifest` that lets a rival's manifest land on the version tag first and then
    answers as such a registry does (an HTTP 4xx). The push reads what is there: a Conflict."""
    from zoo.errors import Conflict, StorageError
    from zoo.storage.oci_client import OciClient

    host, _ = registry
    rival = LocalZoo(tmp_path / "rival")
    rival.publish(make_staging(tmp_path / "rs", scale=42.0))
    api.remote_add("reg", f"oci://{host}/{prefix}", zoo=rival)
    api.push("tiny@1.0.0", "reg", zoo=rival)
    client = OciClient(host)
    theirs = client.get_manifest(f"{prefix}/tiny", "1.0.0")[0]
    client.delete_manifest(f"{prefix}/tiny", client.manifest_digest(f"{prefix}/tiny", "1.0.0"))
    real = OciClient.put_manifest

    def immutable(self, repo, reference, data, media_type="application/vnd.oci.image.manifest.v1+json"):
        if reference == "1.0.0":
            real(self, repo, reference, theirs, media_type)  # the rival got there first
            raise StorageError(f"the OCI registry {host}: write {repo}:1.0.0 failed: HTTP 409 tag is immutable")
        return real(self, repo, reference, data, media_type)

    monkeypatch.setattr(OciClient, "put_manifest", immutable)
    with pytest.raises(Conflict, match="concurrently with different content"):
        api.push("tiny@1.0.0", "reg", zoo=publisher)
