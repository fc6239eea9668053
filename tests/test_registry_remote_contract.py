"""The `RemoteZoo` contract (zoo/registry/remote.py), checked through the interface itself on every
backend against a real server on 127.0.0.1: a folder, S3 (moto), Google Cloud Storage
(fake-gcs-server), Azure Blob (azurite), WebDAV (wsgidav), SSH/SFTP (sshd), an OCI registry (Debian's
docker-registry, distribution 2.8), plain HTTP
(a folder served read-only) and a Hugging Face endpoint (olah for reads; the write API is the
`HubWriteApp` stand-in, so those ids carry `hf-stand-in-write-api`). Fixtures: remote_fixtures.py.
What a backend cannot do (write over HTTP, gc on the Hub or an OCI registry) must raise InvalidInput.

The scenarios through `zoo push/pull/...` are in test_registry_remotes.py; this suite calls the
interface's methods directly and checks what their docstrings promise."""

from __future__ import annotations

import pytest

from remote_fixtures import KINDS, backend_id
from zoo.errors import Conflict, IntegrityError, InvalidInput, NotFound, SourceUnreachable
from zoo.registry.blobs import BlobStore
from zoo.registry.config import RemoteConfig, RemotesConfig
from zoo.registry.refs import parse_ref
from zoo.registry.remote import RemoteZoo
from zoo.registry.remote_factory import open_remote
from zoo.registry.store import LocalZoo
from registry_servers import make_staging

WRITABLE = {"folder", "s3", "gcs", "azure", "webdav", "ssh", "hf", "oci"}
LOOSE_BLOBS = {"folder", "s3", "gcs", "azure", "webdav", "ssh"}  # backends whose gc frees blobs
FREED_KEYS = {"remote", "blobs_freed", "bytes_freed", "kept_young"}

every_kind = pytest.mark.parametrize("backend", KINDS, indirect=True, ids=backend_id)


def _open(zoo: LocalZoo, name: str = "origin") -> RemoteZoo:
    return open_remote(RemotesConfig(zoo.root).get(name))


@pytest.fixture
def remote(backend, consumer) -> RemoteZoo:
    """The remote under test, as a reader sees it."""
    return _open(consumer)


@pytest.fixture
def writer(backend, publisher) -> RemoteZoo:
    """The remote publishers write through (for http: the folder behind the site)."""
    return _open(publisher)


@pytest.fixture
def published(writer, publisher):
    """tiny@1.0.0 and tiny@1.1.0 on the remote, 1.0.0 tagged `prod`."""
    writer.push(publisher, publisher.resolve("tiny@1.0.0"), tags=["prod"])
    writer.push(publisher, publisher.resolve("tiny@1.1.0"))
    return publisher


@every_kind
def test_every_backend_implements_the_whole_interface(backend, remote):
    assert isinstance(remote, RemoteZoo) and not type(remote).__abstractmethods__
    assert remote.read_only is (backend.kind == "http")


def test_every_implementation_is_in_this_suite():
    """A new backend class must be added to KINDS (and so to this suite)."""
    import zoo.registry.fsremote
    import zoo.registry.hf
    import zoo.registry.oci  # noqa: F401

    def concrete(cls):
        for sub in cls.__subclasses__():
            yield from ([sub] if not sub.__abstractmethods__ else []) + list(concrete(sub))
    # KINDS reach three classes: FsRemoteZoo (folder, s3, gcs, azure, webdav, ssh, http), HfRemoteZoo (hf)
    # and OciRemoteZoo (oci)
    covered = {type(open_remote(RemoteConfig(name="x", url=url))).__name__
               for url in ("/tmp/x", "hf://ns", "oci://127.0.0.1:1/zoo")}
    assert {c.__name__ for c in concrete(RemoteZoo) if c.__module__.startswith("zoo.")} == covered


@every_kind
def test_resolve_list_and_tags(backend, remote, published):
    m = remote.resolve(parse_ref("tiny@1.0.0"))
    assert (m.name, m.version) == ("tiny", "1.0.0")
    assert m.builds["cpu-fp32"].file == published.resolve("tiny@1.0.0").builds["cpu-fp32"].file
    assert remote.resolve(parse_ref("tiny@prod")).version == "1.0.0"
    assert remote.resolve(parse_ref("tiny")).version == "1.1.0"  # latest
    assert remote.tags("tiny") == {"latest": "1.1.0", "prod": "1.0.0"}
    assert [(v.version, v.tags) for v in remote.list("tiny")] == [("1.1.0", ["latest"]), ("1.0.0", ["prod"])]


@every_kind
def test_resolve_of_what_is_not_there_is_not_found_and_names_what_is(backend, remote, published):
    with pytest.raises(NotFound) as e:
        remote.resolve(parse_ref("tiny@9.9.9"))
    assert "1.1.0" in (e.value.hint or "")
    with pytest.raises(NotFound, match="no model called"):
        remote.resolve(parse_ref("other"))


@every_kind
def test_fetch_places_only_verified_bytes(backend, remote, published, tmp_path):
    m = remote.resolve(parse_ref("tiny@1.0.0"))
    ref = m.builds["cpu-fp32"].file
    blobs = BlobStore(tmp_path / "fresh" / "blobs")
    remote.fetch(m, ref, blobs)
    assert blobs.check(ref.sha256, ref.size, rehash=True) == "ok"
    assert blobs.path(ref.sha256).read_bytes() == published.blobs.path(ref.sha256).read_bytes()

    backend.tamper("tiny", "1.0.0", ref.path, ref.sha256)
    other = BlobStore(tmp_path / "other" / "blobs")
    with pytest.raises(IntegrityError, match="checksum mismatch"):
        remote.fetch(m, ref, other)
    assert not other.present(ref.sha256)
    assert list(other.partial_dir.glob("*")) == []  # no temporary file left behind


@every_kind
def test_push_is_create_exclusive_idempotent_and_refuses_other_content(backend, remote, publisher, tmp_path):
    m = publisher.resolve("tiny@1.0.0")
    if backend.kind not in WRITABLE:
        with pytest.raises(InvalidInput, match="read-only"):
            remote.push(publisher, m)
        return
    first = remote.push(publisher, m)
    assert first["created"] and first["ref"] == "tiny@1.0.0" and first["remote"] == "origin"
    assert set(first) >= {"remote", "ref", "uploaded", "skipped", "bytes", "created"}
    again = remote.push(publisher, m)
    assert not again["created"] and again["uploaded"] == 0
    rival = LocalZoo(tmp_path / "rival")
    rival.publish(make_staging(tmp_path / "rival-staging", scale=99.0))
    with pytest.raises(Conflict):
        remote.push(rival, rival.resolve("tiny@1.0.0"))
    assert remote.resolve(parse_ref("tiny@1.0.0")).builds["cpu-fp32"].file == m.builds["cpu-fp32"].file


@every_kind
def test_attachments_travel_with_the_version_and_are_immutable(backend, remote, writer, publisher, tmp_path):
    """A version's signature and BOM (zoo.registry.attachments) go up with its first push, come back
    from `read_attachments` as the same bytes, cannot be replaced with others, and go with `remove`."""
    from zoo.registry.attachments import BOM, SIGNATURE

    bom = publisher.attachments("tiny", "1.0.0")[BOM]  # every version publishing makes carries its BOM (zoo.registry.bom)
    publisher.add_attachment("tiny", "1.0.0", SIGNATURE, b'{"sig": 1}')
    if backend.kind not in WRITABLE:
        with pytest.raises(InvalidInput, match="read-only"):
            remote.push(publisher, publisher.resolve("tiny@1.0.0"))
        return
    pushed = writer.push(publisher, publisher.resolve("tiny@1.0.0"))
    assert sorted(pushed["attachments"]) == [BOM, SIGNATURE]
    assert remote.read_attachments("tiny", "1.0.0") == {BOM: bom, SIGNATURE: b'{"sig": 1}'}
    assert writer.push(publisher, publisher.resolve("tiny@1.0.0"))["attachments"] == []  # idempotent
    writer.push(publisher, publisher.resolve("tiny@1.1.0"))
    assert remote.read_attachments("tiny", "1.1.0") == publisher.attachments("tiny", "1.1.0")  # its BOM alone
    rival = LocalZoo(tmp_path / "rival")
    rival.publish(make_staging(tmp_path / "rival-staging", version="1.0.0", big_bytes=3000))
    # the same content published elsewhere, later, makes the same BOM (no publish time in it): no conflict there
    assert rival.attachments("tiny", "1.0.0") == {BOM: bom}
    assert rival.resolve("tiny@1.0.0").all_files() == publisher.resolve("tiny@1.0.0").all_files()
    rival.add_attachment("tiny", "1.0.0", SIGNATURE, b'{"sig": "forged"}')
    with pytest.raises(Conflict, match="different signature"):
        writer.push(rival, rival.resolve("tiny@1.0.0"))
    assert remote.read_attachments("tiny", "1.0.0")[SIGNATURE] == b'{"sig": 1}'
    writer.remove("tiny", "1.0.0")
    with pytest.raises(NotFound):
        remote.resolve(parse_ref("tiny@1.0.0"))
    assert remote.read_attachments("tiny", "1.0.0") == {}


@pytest.mark.parametrize("backend", sorted(WRITABLE), indirect=True, ids=backend_id)
def test_a_bom_another_zoo_made_never_blocks_a_push_but_a_signed_one_must_match(backend, writer, publisher, tmp_path):
    """Upgrade paths (attachments.reconcile): a version already on the remote without a BOM (pushed
    before zoo made them) or with another zoo's BOM of the same content takes a push of an unsigned
    local copy, keeping the remote's, with a note; a signed copy, whose signature covers its BOM,
    must find the same BOM there (Conflict) and, where it cannot be added, says so (InvalidInput)."""
    import shutil

    from zoo.registry.attachments import BOM, SIGNATURE

    bom = publisher.attachments("tiny", "1.0.0")[BOM]
    shutil.rmtree(publisher.attachments_dir("tiny", "1.0.0"))  # as published before BOMs existed
    writer.push(publisher, publisher.resolve("tiny@1.0.0"))
    assert writer.read_attachments("tiny", "1.0.0") == {}
    publisher.add_attachment("tiny", "1.0.0", BOM, bom)  # the upgraded zoo makes one
    again = writer.push(publisher, publisher.resolve("tiny@1.0.0"))
    if backend.kind in ("hf", "oci"):  # a published version cannot gain files there
        assert again["attachments"] == [] and "pushed without it" in " ".join(again["notes"])
        assert writer.read_attachments("tiny", "1.0.0") == {}
    else:
        assert again["attachments"] == [BOM] and writer.read_attachments("tiny", "1.0.0") == {BOM: bom}
    other = LocalZoo(tmp_path / "newer")  # a newer zoo whose BOM of the same content has other bytes
    other.publish(make_staging(tmp_path / "newer-staging", version="1.0.0", big_bytes=3000))
    shutil.rmtree(other.attachments_dir("tiny", "1.0.0"))
    other.add_attachment("tiny", "1.0.0", BOM, b'{"bomFormat": "CycloneDX", "specVersion": "1.7"}')
    backend.add_to(other, url=backend.write_url)
    newer = open_remote(RemotesConfig(other.root).get("origin"))
    pushed = newer.push(other, other.resolve("tiny@1.0.0"))
    assert pushed["notes"] and writer.read_attachments("tiny", "1.0.0").get(BOM) in (None, bom)
    other.add_attachment("tiny", "1.0.0", SIGNATURE, b'{"sig": 1}')  # signed over its own BOM
    with pytest.raises((Conflict, InvalidInput)) as e:
        newer.push(other, other.resolve("tiny@1.0.0"))
    assert isinstance(e.value, InvalidInput if backend.kind in ("hf", "oci") else Conflict)
    assert SIGNATURE not in writer.read_attachments("tiny", "1.0.0")


@every_kind
def test_push_of_a_version_the_local_zoo_lacks_files_of_is_refused(backend, remote, publisher, tmp_path):
    half = LocalZoo(tmp_path / "half")
    half.adopt(publisher.resolve("tiny@1.0.0"))  # the manifest, not the files
    with pytest.raises((NotFound, InvalidInput)) as e:  # InvalidInput: read-only, before anything else
        remote.push(half, half.resolve("tiny@1.0.0"))
    assert isinstance(e.value, NotFound) or backend.kind not in WRITABLE
    with pytest.raises(NotFound):
        remote.resolve(parse_ref("tiny@1.0.0"))


@every_kind
def test_set_tag_and_remove(backend, remote, published):
    if backend.kind not in WRITABLE:
        with pytest.raises(InvalidInput, match="read-only"):
            remote.set_tag("tiny", "stable", "1.0.0")
        with pytest.raises(InvalidInput, match="read-only"):
            remote.remove("tiny", "1.1.0")
        return
    remote.set_tag("tiny", "stable", "1.0.0")
    assert remote.resolve(parse_ref("tiny@stable")).version == "1.0.0"
    remote.set_tag("tiny", "stable", "1.1.0")  # moved
    assert remote.tags("tiny")["stable"] == "1.1.0"
    with pytest.raises(NotFound):
        remote.set_tag("tiny", "stable", "7.0.0")
    freed = remote.remove("tiny", "1.1.0")
    assert set(freed) >= FREED_KEYS
    with pytest.raises(NotFound):
        remote.resolve(parse_ref("tiny@1.1.0"))
    assert "stable" not in remote.tags("tiny")  # the tags on a removed version go with it
    assert [v.version for v in remote.list("tiny")] == ["1.0.0"]
    with pytest.raises(NotFound):
        remote.remove("tiny", "1.1.0")


@every_kind
def test_gc_frees_only_old_unreferenced_blobs_or_refuses(backend, remote, published, tmp_path):
    if backend.kind not in LOOSE_BLOBS:
        with pytest.raises(InvalidInput):
            remote.gc(grace_s=0)
        return
    kept = published.resolve("tiny@1.0.0")
    only_in_new = {f.sha256 for f in published.resolve("tiny@1.1.0").all_files()} - {f.sha256 for f in kept.all_files()}
    remote.remove("tiny", "1.1.0")  # default grace: its blobs are young, so they stay
    dry = remote.gc(grace_s=0, dry_run=True)
    assert set(dry) >= FREED_KEYS | {"grace_s", "dry_run"}
    assert dry["dry_run"] and dry["blobs_freed"] == len(only_in_new)
    young = remote.gc()
    assert young["blobs_freed"] == 0 and young["kept_young"] == len(only_in_new)
    done = remote.gc(grace_s=0)
    assert done["blobs_freed"] == len(only_in_new) and not done["dry_run"]
    assert remote.gc(grace_s=0)["blobs_freed"] == 0
    blobs = BlobStore(tmp_path / "after-gc" / "blobs")
    for f in kept.all_files():  # every referenced blob is still there
        remote.fetch(kept, f, blobs)
        assert blobs.has(f.sha256, f.size)


@pytest.mark.parametrize("backend", [k for k in KINDS if k != "folder"], indirect=True, ids=backend_id)
def test_an_unreachable_remote_is_source_unreachable(backend, consumer):
    """(Every kind but the local folder, which has no server to be down.)"""
    url, options = backend.dead_options()
    from zoo.registry import api

    api.remote_add("dead", url, options=options, zoo=consumer)
    with pytest.raises(SourceUnreachable):
        _open(consumer, "dead").resolve(parse_ref("tiny@1.0.0"))


@pytest.mark.parametrize("backend", sorted(LOOSE_BLOBS | {"oci"}), indirect=True, ids=backend_id)
def test_push_reports_every_byte_it_uploads(backend, publisher):
    """`zoo push`'s progress: the bytes each backend's driver reports as they go up, topped up to
    the file's size where a driver reports less; in all, exactly what the push uploaded."""
    from zoo.registry import api

    seen: list[int] = []
    result = api.push("tiny@1.0.0", "origin", zoo=publisher, progress=seen.append)
    assert result["bytes"] > 3000 and sum(seen) == result["bytes"] and all(n > 0 for n in seen)


def test_a_folder_upload_reports_its_bytes_chunk_by_chunk(tmp_path):
    """Progress within a file, not only once it is up: a 70 MB file goes to a folder remote in
    three 32 MB-at-most chunks, each reported as it is written."""
    from zoo.storage.fsbackend import CHUNK, FsBackend

    local = tmp_path / "big"
    with open(local, "wb") as f:
        f.truncate(2 * CHUNK + 6 * (1 << 20))
    seen: list[int] = []
    backend = FsBackend(str(tmp_path / "remote"))
    backend.put_file(local, backend.path("blobs", "big"), progress=seen.append)
    assert seen == [CHUNK, CHUNK, 6 << 20]
    assert (tmp_path / "remote" / "blobs" / "big").stat().st_size == local.stat().st_size
