"""Remote zoos and bundles against hostile or broken states (issue #11): half-published pushes,
freeing blobs on remotes (rm, remote gc), remotes that refuse access, bundle bombs, escaping
paths and blobs with extra bytes. Servers are real ones on 127.0.0.1 (moto S3, wsgidav)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from remote_fixtures import Backend
from zoo.registry import api
from zoo.registry.store import LocalZoo

# the backends these tests reach around zoo to inspect (the shared `backend` fixture, narrowed)
folder_and_s3 = pytest.mark.parametrize("backend", ["folder", "s3"], indirect=True)


# ---- 5: a push cut off after its manifest is finished by the retry ----------------------------
class _Killed(BaseException):
    """Stands for kill -9: nothing after the raise point runs, no handler cleans up."""


def _cut_off_after_manifest(monkeypatch, version: str, kind: str) -> None:
    from remote_fixtures import backend_class

    owner = backend_class(kind)
    real = owner.create

    def create_then_die(self, rpath, data):
        done = real(self, rpath, data)
        if rpath.endswith(f"/versions/{version}.json"):
            raise _Killed()
        return done

    monkeypatch.setattr(owner, "create", create_then_die)


def _versions(remote: str, zoo: LocalZoo) -> list[str]:
    return [v.version for v in api.list_versions("tiny", remote=remote, zoo=zoo)]


@folder_and_s3
def test_a_push_cut_off_after_its_manifest_is_finished_by_the_retry(backend, publisher, consumer, monkeypatch):
    api.push("tiny@1.0.0", "origin", zoo=publisher)
    with monkeypatch.context() as m:
        _cut_off_after_manifest(m, "1.1.0", backend.kind)
        with pytest.raises(_Killed):
            api.push("tiny@1.1.0", "origin", zoo=publisher)
    # the half-published state the issue describes
    assert api.show("tiny@1.1.0", remote="origin", zoo=consumer)["version"] == "1.1.0"
    assert _versions("origin", consumer) == ["1.0.0"]
    assert api.show("tiny", remote="origin", zoo=consumer)["version"] == "1.0.0"

    again = api.push("tiny@1.1.0", "origin", zoo=publisher)
    assert not again["created"] and again["uploaded"] == 0
    assert _versions("origin", consumer) == ["1.1.0", "1.0.0"]
    shown = api.show("tiny", remote="origin", zoo=consumer)
    assert shown["version"] == "1.1.0" and shown["tags"] == ["latest"]
    assert [(m.name, m.latest, m.versions) for m in api.list_models(remote="origin", zoo=consumer)] == [("tiny", "1.1.0", 2)]
    assert api.pull("tiny", remote="origin", zoo=consumer).version == "1.1.0"


@folder_and_s3
def test_a_first_push_cut_off_after_its_manifest_is_listed_after_the_retry(backend, publisher, consumer, monkeypatch):
    with monkeypatch.context() as m:
        _cut_off_after_manifest(m, "1.0.0", backend.kind)
        with pytest.raises(_Killed):
            api.push("tiny@1.0.0", "origin", zoo=publisher)
    assert api.list_models(remote="origin", zoo=consumer) == []
    api.push("tiny@1.0.0", "origin", zoo=publisher)
    assert [m.name for m in api.list_models(remote="origin", zoo=consumer)] == ["tiny"]
    assert api.show("tiny", remote="origin", zoo=consumer)["tags"] == ["latest"]


# ---- reaching around zoo to change what a remote holds ----------------------------------------
def _remote_get(backend: Backend, key: str) -> bytes:
    if backend.kind == "folder":
        return (backend.root / key).read_bytes()
    if backend.kind == "s3":
        import boto3

        return boto3.client("s3", endpoint_url=backend.endpoint).get_object(Bucket="zoo", Key=f"{backend.uid}/{key}")["Body"].read()
    return (backend.dav_root / backend.uid / key).read_bytes()


def _remote_put(backend: Backend, key: str, data: bytes) -> None:
    if backend.kind == "folder":
        p = backend.root / key
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.exists():
            p.chmod(0o644)
        p.write_bytes(data)
    elif backend.kind == "s3":
        import boto3

        boto3.client("s3", endpoint_url=backend.endpoint).put_object(Bucket="zoo", Key=f"{backend.uid}/{key}", Body=data)
    else:
        p = backend.dav_root / backend.uid / key
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)


def _blob_key(sha256: str) -> str:
    return f"blobs/sha256/{sha256[:2]}/{sha256}"


# ---- 13: escaping paths are integrity errors; a blob with extra bytes is refused everywhere ----
@pytest.mark.parametrize("backend", ["folder", "s3", "webdav"], indirect=True)
def test_a_remote_blob_with_appended_bytes_is_refused(backend, publisher, consumer):
    from zoo.errors import IntegrityError

    api.push("tiny@1.0.0", "origin", zoo=publisher)
    ref = publisher.resolve("tiny@1.0.0").builds["cpu-fp32"].file
    key = _blob_key(ref.sha256)
    _remote_put(backend, key, _remote_get(backend, key) + b"appended by an attacker")
    with pytest.raises(IntegrityError, match="checksum mismatch"):
        api.pull("tiny@1.0.0", remote="origin", zoo=consumer)
    assert consumer.list() == [] and not consumer.blobs.has(ref.sha256, ref.size)


@pytest.mark.parametrize("backend", ["folder", "s3"], indirect=True)
def test_a_remote_manifest_with_an_escaping_path_exits_4(backend, publisher, consumer):
    from cli_helpers import zoo as zoo_cli
    from zoo.errors import UnsafePath

    api.push("tiny@1.0.0", "origin", zoo=publisher)
    key = "models/tiny/versions/1.0.0.json"
    m = json.loads(_remote_get(backend, key))
    m["builds"]["cpu-fp32"]["file"]["path"] = "../../../outside.onnx"
    _remote_put(backend, key, json.dumps(m).encode())
    with pytest.raises(UnsafePath, match="escapes its folder"):
        api.show("tiny@1.0.0", remote="origin", zoo=consumer)
    r = zoo_cli("pull", "tiny@1.0.0", "--remote", "origin", env={"ZOO_HOME": str(consumer.root)})
    assert r.code == 4, r.text
    assert "escapes its folder" in r.err and "Traceback" not in r.err
    assert consumer.list() == []


# ---- 9: a remote that refuses (no or wrong credentials) does not break local pulls ----------------
def _refuse(backend: Backend, monkeypatch, tmp_path, request) -> str:
    """Take the remote's credentials away; returns a word the hint must name."""
    if backend.kind == "s3":
        import s3fs

        # the client made without credentials must not outlive this test (fsspec caches instances)
        request.addfinalizer(s3fs.S3FileSystem.clear_instance_cache)
        for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
            monkeypatch.delenv(k, raising=False)
        # no config files, and never ask an instance-metadata address off this machine
        monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
        monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
        monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
        s3fs.S3FileSystem.clear_instance_cache()  # fsspec reuses clients made with the old credentials
        return "AWS_ACCESS_KEY_ID"
    if backend.kind == "azure":
        from cloud_servers import AZURITE_KEY

        wrong = backend.connection.replace(AZURITE_KEY, "d3Jvbmcta2V5" * 8)  # azurite answers 403
        monkeypatch.setenv("TEST_AZURE_CONNECTION", wrong)
        return "TEST_AZURE_CONNECTION"
    monkeypatch.setenv("TEST_DAV_PASSWORD", "wrong-password")  # wsgidav answers 401
    return "TEST_DAV_PASSWORD"


# (fake-gcs-server checks no credentials, so GCS's refusal cannot be tested against it)
@pytest.mark.parametrize("backend", ["s3", "azure", "webdav"], indirect=True)
def test_a_refusing_remote_falls_back_to_the_local_zoo_with_a_note(backend, publisher, consumer, monkeypatch, tmp_path,
                                                                   request):
    from cli_helpers import zoo as zoo_cli
    from zoo.errors import AccessDenied

    api.push("tiny@1.0.0", "origin", zoo=publisher)
    first = api.pull("tiny", zoo=consumer)
    where_credentials_go = _refuse(backend, monkeypatch, tmp_path, request)

    again = api.pull("tiny", zoo=consumer)
    assert again.path == first.path and again.source == "local"
    assert any("refused" in n and "local zoo" in n for n in again.notes), again.notes
    with pytest.raises(AccessDenied) as e:  # nothing local to fall back to
        api.pull("tiny@1.1.0", zoo=consumer)
    assert where_credentials_go in (e.value.hint or "")

    env = {"ZOO_HOME": str(consumer.root)}
    ok = zoo_cli("pull", "tiny", env=env)
    assert ok.code == 0 and ok.out.strip() == first.path, ok.text
    assert "refused" in ok.err
    bad = zoo_cli("pull", "tiny@1.1.0", env=env)
    assert bad.code == 3 and "refused" in bad.err and where_credentials_go in bad.err, bad.text
    assert "Traceback" not in bad.err


# ---- 8: rm --remote frees what nothing references; remote gc; the grace period --------------------
def _remote_blobs(backend: Backend) -> set[str]:
    if backend.kind == "folder":
        return {p.name for p in (backend.root / "blobs").rglob("*") if p.is_file()}
    import boto3

    pages = boto3.client("s3", endpoint_url=backend.endpoint).get_paginator("list_objects_v2").paginate(
        Bucket="zoo", Prefix=f"{backend.uid}/blobs/")
    return {o["Key"].rsplit("/", 1)[-1] for page in pages for o in page.get("Contents", [])}


def _shas(zoo: LocalZoo, ref: str) -> set[str]:
    return {f.sha256 for f in zoo.resolve(ref).all_files()}


@folder_and_s3
def test_rm_on_a_remote_frees_the_blobs_no_other_version_uses(backend, publisher, tmp_path):
    backend.add_to(publisher, options={"gc_grace": "0"})
    api.push("tiny@1.0.0", "origin", zoo=publisher)
    api.push("tiny@1.1.0", "origin", zoo=publisher)
    old, new = _shas(publisher, "tiny@1.0.0"), _shas(publisher, "tiny@1.1.0")
    assert old & new and new - old  # the model card is shared, the model is not
    assert _remote_blobs(backend) == old | new

    result = api.rm("tiny@1.1.0", remote="origin", zoo=publisher)
    assert result["blobs_freed"] == len(new - old)
    assert _remote_blobs(backend) == old  # the shared card stays: 1.0.0 still references it
    fresh = LocalZoo(tmp_path / "fresh")
    backend.add_to(fresh)
    assert Path(api.pull("tiny@1.0.0", remote="origin", zoo=fresh).path).is_file()


@folder_and_s3
def test_remote_gc_keeps_young_blobs_and_frees_old_unreferenced_ones(backend, publisher, tmp_path, monkeypatch):
    from cli_helpers import zoo as zoo_cli

    api.push("tiny@1.0.0", "origin", zoo=publisher)
    api.push("tiny@1.1.0", "origin", zoo=publisher)
    old, new = _shas(publisher, "tiny@1.0.0"), _shas(publisher, "tiny@1.1.0")
    # default grace (an hour): just-uploaded blobs may belong to a push whose manifest is not written yet
    result = api.rm("tiny@1.1.0", remote="origin", zoo=publisher)
    assert result["blobs_freed"] == 0 and result["kept_young"] == len(new - old)
    assert _remote_blobs(backend) == old | new

    env = {"ZOO_HOME": str(publisher.root)}
    dry = zoo_cli("remote", "gc", "origin", "--grace", "0", "--dry-run", env=env)
    assert dry.code == 0 and f"would free {len(new - old)} blob(s)" in dry.out, dry.text
    assert _remote_blobs(backend) == old | new
    kept = zoo_cli("remote", "gc", "origin", env=env)
    assert kept.code == 0 and "freed 0 blob(s)" in kept.out, kept.text
    done = zoo_cli("remote", "gc", "origin", "--grace", "0", env=env)
    assert done.code == 0 and f"freed {len(new - old)} blob(s)" in done.out, done.text
    assert _remote_blobs(backend) == old


@folder_and_s3
def test_a_gc_between_a_push_finding_a_blob_and_writing_its_manifest_does_not_break_the_version(
        backend, publisher, tmp_path, monkeypatch):
    from remote_fixtures import backend_class

    api.push("tiny@1.0.0", "origin", zoo=publisher)
    api.rm("tiny@1.0.0", remote="origin", zoo=publisher)  # blobs stay (young) and unreferenced
    owner = backend_class(backend.kind)
    real = owner.create

    def gc_then_create(self, rpath, data):
        if "/versions/" in rpath:  # the push found every blob present; now a gc frees them all
            assert api.remote_gc("origin", grace_s=0, zoo=publisher)["blobs_freed"] > 0
        return real(self, rpath, data)

    monkeypatch.setattr(owner, "create", gc_then_create)
    api.push("tiny@1.0.0", "origin", zoo=publisher)
    monkeypatch.setattr(owner, "create", real)
    assert _remote_blobs(backend) == _shas(publisher, "tiny@1.0.0")
    fresh = LocalZoo(tmp_path / "fresh")
    backend.add_to(fresh)
    assert Path(api.pull("tiny@1.0.0", remote="origin", zoo=fresh).path).is_file()
