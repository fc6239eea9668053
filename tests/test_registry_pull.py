"""`zoo pull` states its verification and resolution invariants directly (issue #18, mutation area
registry-pull): every file of a build hashes to its sha256 before anything is adopted; a corrupt
local blob is never served (fetched again from a remote, refused offline); a download that still
does not match is refused; resolution follows the documented order and a remote that was not used
says why. Remotes are real folder remotes, or a real http remote on a port where nothing listens;
where a remote must refuse (HTTP 401) or misbehave, a stand-in remote says so in its name."""

from __future__ import annotations

from pathlib import Path

import pytest

from zoo.errors import AccessDenied, IntegrityError, NotFound, SourceUnreachable, StorageError, no_space
from zoo.registry import api
from zoo.registry.pull import _fetch_any, resolve_manifest
from zoo.registry.refs import parse_ref
from zoo.registry.remote_factory import open_remote
from zoo.registry.config import RemotesConfig
from zoo.registry.store import LocalZoo
from registry_servers import free_port, make_staging

MODEL = "builds/cpu-fp32/model.onnx"
TWO = {"cpu-fp32": {"metrics": {"latency_p50_ms": 2.0}}, "cpu-int8": {"precision": "int8", "metrics": {"latency_p50_ms": 1.0}}}


class StandInRemote:
    """A stand-in for a remote (not a real backend): resolves or fetches by raising what it is given,
    or by doing what `fetch` says; records every call."""

    def __init__(self, name, *, resolve=None, fetch=None):
        self.name, self._resolve, self._fetch, self.calls = name, resolve, fetch, []

    def resolve(self, ref):
        self.calls.append(("resolve", str(ref)))
        if isinstance(self._resolve, BaseException):
            raise self._resolve
        return self._resolve

    def read_attachments(self, name, version):
        self.calls.append(("read_attachments", f"{name}@{version}"))
        return {}

    def fetch(self, manifest, f, blobs):
        self.calls.append(("fetch", f.path))
        if isinstance(self._fetch, BaseException):
            raise self._fetch
        if callable(self._fetch):
            self._fetch(manifest, f, blobs)


@pytest.fixture
def publisher(tmp_path) -> LocalZoo:
    z = LocalZoo(tmp_path / "publisher")
    z.publish(make_staging(tmp_path / "s1", version="1.0.0", big_bytes=3000))
    z.publish(make_staging(tmp_path / "s2", version="1.1.0", scale=7.0, builds=TWO))
    api.remote_add("origin", str(tmp_path / "remote"), zoo=z)
    api.push("tiny@1.0.0", "origin", tags=["prod"], zoo=z)
    api.push("tiny@1.1.0", "origin", zoo=z)
    return z


@pytest.fixture
def consumer(tmp_path, publisher) -> LocalZoo:
    z = LocalZoo(tmp_path / "consumer")
    api.remote_add("origin", str(tmp_path / "remote"), zoo=z)
    return z


def _flip(path: Path) -> None:
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    with open(path, "r+b") as f:
        f.write(data)


# ---- a pull's result ---------------------------------------------------------------------------
def test_a_pull_reports_what_it_downloaded_and_from_where(publisher, consumer):
    m = publisher.resolve("tiny@1.1.0")
    res = api.pull("tiny", zoo=consumer)
    files = consumer.build_files(m, m.builds["cpu-int8"])  # the build's files and the version's (card)
    assert {f.path for f in files} == {"builds/cpu-int8/model.onnx", "README.md"}
    assert (res.name, res.version, res.build, res.source, res.ref) == ("tiny", "1.1.0", "cpu-int8", "origin", "tiny@1.1.0")
    assert res.downloaded_files == len(files) and res.downloaded_bytes == sum(f.size for f in files) > 0
    assert res.fetched_from == ["origin"] and res.notes == []
    assert Path(res.path) == consumer.version_dir("tiny", "1.1.0") / "builds/cpu-int8/model.onnx"
    assert Path(res.path).read_bytes() == publisher.blobs.path(m.builds["cpu-int8"].file.sha256).read_bytes()
    again = api.pull("tiny", zoo=consumer)  # resolved on the remote again, nothing to download
    assert (again.source, again.downloaded_files, again.downloaded_bytes, again.fetched_from) == ("origin", 0, 0, [])
    pinned = api.pull("tiny@1.1.0", build="cpu-fp32", zoo=consumer)  # another build of a version held locally
    assert (pinned.source, pinned.build, pinned.downloaded_files) == ("local", "cpu-fp32", 1)
    assert pinned.fetched_from == ["origin"]
    cheap = api.pull("tiny@1.1.0", build="cpu-fp32", zoo=consumer)  # placed already: a manifest read and stats
    assert (cheap.source, cheap.path, cheap.downloaded_files, cheap.downloaded_bytes, cheap.fetched_from) == \
        ("local", pinned.path, 0, 0, [])


def test_a_pulled_tag_is_recorded_for_offline_use_but_latest_is_not_set_by_hand(publisher, consumer):
    api.pull("tiny@prod", zoo=consumer)
    assert consumer.resolve("tiny@prod").version == "1.0.0"
    api.tag("tiny@1.0.0", "beta", remote="origin", zoo=publisher)  # a tag that sorts before "latest"
    api.pull("tiny@beta", zoo=consumer)
    assert api.pull("tiny@beta", offline=True, zoo=consumer).version == "1.0.0"
    assert api.pull("tiny@prod", offline=True, zoo=consumer).version == "1.0.0"
    api.pull("tiny@latest", zoo=consumer)
    assert consumer.resolve("tiny").version == "1.1.0"


# ---- a corrupt local blob is never served --------------------------------------------------------
def test_a_corrupt_local_blob_is_fetched_again_with_a_note(publisher, consumer):
    first = api.pull("tiny@1.0.0", zoo=consumer)
    sha = consumer.resolve("tiny@1.0.0").builds["cpu-fp32"].file.sha256
    _flip(consumer.blobs.path(sha))
    res = api.pull("tiny@1.0.0", remote="origin", zoo=consumer, to=consumer.root.parent / "out")
    assert res.notes == [f"tiny@1.0.0: the stored copy of {MODEL} was corrupt; fetched it again from origin"]
    assert (res.downloaded_files, res.fetched_from) == (1, ["origin"])
    assert consumer.blobs.check(sha, rehash=True) == "ok"
    assert Path(res.path).read_bytes() == publisher.blobs.path(sha).read_bytes()
    assert first.path != res.path


def test_a_corrupt_local_blob_is_removed_even_when_fetching_it_again_fails(publisher, consumer, tmp_path):
    api.pull("tiny@1.0.0", zoo=consumer)
    sha = consumer.resolve("tiny@1.0.0").builds["cpu-fp32"].file.sha256
    _flip(consumer.blobs.path(sha))
    import shutil

    shutil.rmtree(tmp_path / "remote")  # the remote lost it too
    with pytest.raises((StorageError, NotFound)):
        api.pull("tiny@1.0.0", remote="origin", to=tmp_path / "out", zoo=consumer)
    assert not consumer.blobs.present(sha)  # the bad copy is gone, not kept to be served or resumed from


def test_a_pull_to_a_folder_copies_there_even_when_the_zoo_has_it_placed(publisher, consumer, tmp_path):
    from zoo.registry import pull as pull_mod

    placed = api.pull("tiny@1.0.0", zoo=consumer).path
    res = pull_mod.pull(ref="tiny@1.0.0", to=tmp_path / "out", zoo=consumer)  # every argument can be named
    assert res.path == str(tmp_path / "out" / MODEL) != placed and res.source == "local"
    assert Path(res.path).read_bytes() == Path(placed).read_bytes()


@pytest.mark.parametrize("how", ["offline", "no remote"])
def test_a_corrupt_local_blob_without_a_remote_to_fetch_from_is_refused(publisher, consumer, how, tmp_path):
    api.pull("tiny@1.0.0", zoo=consumer)
    sha = consumer.resolve("tiny@1.0.0").builds["cpu-fp32"].file.sha256
    _flip(consumer.blobs.path(sha))
    if how == "no remote":
        api.remote_remove("origin", zoo=consumer)
    with pytest.raises(IntegrityError) as e:
        api.pull("tiny@1.0.0", offline=how == "offline", to=tmp_path / "out", zoo=consumer)
    assert e.value.message == (f"tiny@1.0.0: the stored copy of {MODEL} does not match its sha256 (corrupted on disk); "
                               "refusing to serve it")
    assert "zoo fsck --repair" in e.value.hint and "--build cpu-fp32" in e.value.hint
    assert not (tmp_path / "out").exists()


def test_a_build_missing_offline_is_not_found(publisher, consumer):
    api.pull("tiny@1.1.0", build="cpu-int8", zoo=consumer)
    with pytest.raises(NotFound) as e:
        api.pull("tiny@1.1.0", build="cpu-fp32", offline=True, zoo=consumer)
    assert e.value.message == "tiny@1.1.0 build cpu-fp32 is not in the local cache (offline)"
    assert e.value.hint == "pull it once while online"


def test_a_download_that_still_does_not_match_is_refused(publisher, consumer):
    """A stand-in remote that claims success without delivering: pull checks the blob itself."""
    m = publisher.resolve("tiny@1.0.0")
    consumer.adopt(m)
    liar = StandInRemote("liar", fetch=lambda *a: None)
    from zoo.registry import pull as pull_mod

    with pytest.raises(IntegrityError, match=f"tiny@1.0.0: {MODEL} does not match its sha256 after the download"):
        pull_mod._fetch_needed(consumer, m, "cpu-fp32", m.builds["cpu-fp32"].all_files(), [liar], False, [], [], [])


def test_a_full_disk_is_a_storage_error_and_adopts_nothing(publisher, consumer):
    """A stand-in remote whose download fails with a full disk (the downloader gives its
    temporary file back: test_download.py)."""
    m = publisher.resolve("tiny@1.0.0")

    def fill(manifest, ref, blobs):
        raise no_space("/zoo")
    from zoo.registry import pull as pull_mod

    full = StandInRemote("full", resolve=m, fetch=fill)
    orig = pull_mod.candidate_remotes
    pull_mod.candidate_remotes = lambda zoo, remote: [full]
    try:
        with pytest.raises(StorageError, match="no space left"):
            pull_mod.pull("tiny", zoo=consumer)
    finally:
        pull_mod.candidate_remotes = orig
    assert consumer.get("tiny", "1.0.0") is None


# ---- _fetch_any: which error a failed fetch reports ----------------------------------------------
def test_fetch_any_reports_the_most_telling_error(publisher, consumer):
    m = publisher.resolve("tiny@1.0.0")
    f = m.builds["cpu-fp32"].file
    bad, down, gone, disk = (IntegrityError("bad bytes"), SourceUnreachable("down"), NotFound("gone"), StorageError("disk"))

    def fails(*errors):
        with pytest.raises(Exception) as e:
            _fetch_any([StandInRemote(f"r{i}", fetch=x) for i, x in enumerate(errors)], m, f, consumer)
        return e.value
    assert fails(down, bad, gone) is bad  # bad bytes anywhere outrank the rest
    worse = IntegrityError("other bad bytes")
    assert fails(gone, bad, worse) is bad and fails(down, StorageError("x"), SourceUnreachable("y")) is down  # the first of its kind
    assert fails(gone, down, disk) is down  # then an unreachable remote
    assert fails(gone, disk) is gone and fails(disk, gone) is disk  # else the first
    with pytest.raises(NotFound, match=f"tiny@1.0.0: {MODEL} is not cached and no remote is configured"):
        _fetch_any([], m, f, consumer)
    ok = StandInRemote("good", fetch=lambda *a: None)
    skipped = StandInRemote("after")
    assert _fetch_any([StandInRemote("down", fetch=down), ok, skipped], m, f, consumer) == "good"
    assert skipped.calls == []


# ---- resolve_manifest: the documented order ----------------------------------------------------------
def _resolve(zoo, ref, remotes, offline=False):
    notes: list[str] = []
    m, src = resolve_manifest(zoo, parse_ref(ref), remotes, offline, notes)
    return m, src, notes


def test_offline_and_pinned_local_versions_never_ask_a_remote(publisher, consumer):
    api.pull("tiny@1.0.0", zoo=consumer)
    never = StandInRemote("never", resolve=AssertionError("asked"))
    m, src, notes = _resolve(consumer, "tiny@1.0.0", [never])
    assert (m.version, src, notes, never.calls) == ("1.0.0", None, [], [])
    m, src, notes = _resolve(consumer, "tiny", [never], offline=True)
    assert (m.version, src, never.calls) == ("1.0.0", None, [])
    with pytest.raises(NotFound) as e:
        _resolve(consumer, "tiny@1.1.0", [never], offline=True)
    assert e.value.message == "tiny@1.1.0 is not in the local zoo (offline)" and e.value.hint == "pull it once while online"
    # not pinned (a tag): the remote is asked even though the local zoo has the model
    remote = open_remote(RemotesConfig(consumer.root).get("origin"))
    m, src, _ = _resolve(consumer, "tiny", [remote])
    assert (m.version, src) == ("1.1.0", remote)
    m, src, _ = _resolve(consumer, "tiny@1.1.0", [remote])  # pinned, not local yet: remote
    assert src is remote


def test_the_first_remote_that_answers_wins(publisher, consumer):
    remote = open_remote(RemotesConfig(consumer.root).get("origin"))
    missing = StandInRemote("empty", resolve=NotFound("no tiny here"))
    after = StandInRemote("after", resolve=AssertionError("asked"))
    m, src, notes = _resolve(consumer, "tiny@prod", [missing, remote, after])
    assert (m.version, src, notes, after.calls) == ("1.0.0", remote, [], [])


def test_an_unreachable_remote_falls_back_to_the_local_zoo_with_a_note(publisher, consumer):
    api.pull("tiny", zoo=consumer)
    api.remote_add("origin", f"http://127.0.0.1:{free_port()}/zoo", zoo=consumer, replace=True)  # nothing listens
    res = api.pull("tiny", zoo=consumer)
    assert res.source == "local" and res.version == "1.1.0" and len(res.notes) == 1
    assert res.notes[0].startswith("remote origin (") and res.notes[0].endswith(") unreachable: using tiny@1.1.0 from the local cache")
    with pytest.raises(SourceUnreachable) as e:
        api.pull("other", zoo=consumer)
    assert e.value.message.startswith("cannot resolve other@latest: no remote could be reached (origin (")
    assert "--offline" in e.value.hint


def test_a_refusing_remote_falls_back_to_the_local_zoo_with_a_note(publisher, consumer):
    """Stand-in remotes that refuse (as an HTTP 401/403 does)."""
    api.pull("tiny@1.0.0", zoo=consumer)
    with_hint = StandInRemote("hub", resolve=AccessDenied("401 unauthorized", hint="set HF_TOKEN"))
    no_hint = StandInRemote("s3", resolve=AccessDenied("403 forbidden"))
    m, src, notes = _resolve(consumer, "tiny", [with_hint, no_hint])
    assert (m.version, src) == ("1.0.0", None)
    assert notes == ["remote hub refused: 401 unauthorized; using tiny@1.0.0 from the local zoo; to use the remote: set HF_TOKEN",
                     "remote s3 refused: 403 forbidden; using tiny@1.0.0 from the local zoo"]


def test_without_a_local_copy_a_refusal_or_an_outage_is_the_error(publisher, consumer):
    """Stand-in remotes that refuse, are down, or do not have the model."""
    denied = StandInRemote("hub", resolve=AccessDenied("401", hint="set HF_TOKEN"))
    denied2 = StandInRemote("s3", resolve=AccessDenied("403", hint="other"))
    down = StandInRemote("dav", resolve=SourceUnreachable("connection refused"))
    down2 = StandInRemote("dav2", resolve=SourceUnreachable("timeout"))
    missing = StandInRemote("empty", resolve=NotFound("no tiny on empty", hint="did you mean tinx?"))
    missing2 = StandInRemote("empty2", resolve=NotFound("no tiny on empty2", hint="other"))
    with pytest.raises(AccessDenied) as e:
        _resolve(consumer, "tiny", [denied, denied2, down])
    assert e.value.message == "cannot resolve tiny@latest: remote hub refused: 401" and e.value.hint == "set HF_TOKEN"
    with pytest.raises(SourceUnreachable) as e:
        _resolve(consumer, "tiny", [down, down2])
    assert e.value.message == ("cannot resolve tiny@latest: no remote could be reached "
                               "(dav (connection refused); dav2 (timeout))")
    with pytest.raises(NotFound) as e:  # one remote: its own answer
        _resolve(consumer, "tiny", [missing])
    assert e.value is missing._resolve
    for remotes in ([missing, missing2], [denied, missing], [down, missing], [missing, down]):
        with pytest.raises(NotFound) as e:  # the model exists nowhere that answered: not found
            _resolve(consumer, "tiny", remotes)
        assert type(e.value) is NotFound
        names = ", ".join(r.name for r in remotes)
        assert e.value.message == f"tiny@latest was found neither in the local zoo nor on remote(s) {names}"
        assert e.value.hint == "did you mean tinx?"
    with pytest.raises(AccessDenied, match="remote hub refused"):
        _resolve(consumer, "tiny", [down, denied])  # refused and down, none without the model: the refusal is the news


def test_with_no_remote_at_all_the_local_suggestions_are_the_error(tmp_path):
    z = LocalZoo(tmp_path / "z")
    z.publish(make_staging(tmp_path / "s", name="alexnet"))
    with pytest.raises(NotFound) as e:
        _resolve(z, "alexnte", [])
    assert "alexnet" in (e.value.hint or "")


def test_external_data_listed_by_another_build_is_fetched_with_the_model(tmp_path):
    """A model whose weights file is listed only under another build of the version: pulling the
    model's build fetches that file too (it is checked to be inside the version first)."""
    from zoo.registry.manifest import Build, Manifest
    from zoo.registry.staging import file_ref, write_manifest
    from registry_servers import tiny_onnx

    staging = tmp_path / "ext"
    tiny_onnx(staging / "builds/a/model.onnx", external="w.bin")
    (staging / "builds/a/w.bin").write_bytes(b"\x00" * 16)
    tiny_onnx(staging / "builds/b/model.onnx", scale=3.0)
    a = Build(name="a", file=file_ref(staging, "builds/a/model.onnx"))
    b = Build(name="b", file=file_ref(staging, "builds/b/model.onnx"), extra_files=[file_ref(staging, "builds/a/w.bin")])
    write_manifest(staging, Manifest(name="ext", version="1.0.0", builds={"a": a, "b": b}))
    pub = LocalZoo(tmp_path / "pub")
    pub.publish(staging)
    api.remote_add("origin", str(tmp_path / "remote"), zoo=pub)
    api.push("ext@1.0.0", "origin", zoo=pub)
    con = LocalZoo(tmp_path / "con")
    api.remote_add("origin", str(tmp_path / "remote"), zoo=con)
    res = api.pull("ext@1.0.0", build="a", zoo=con)
    w = b.extra_files[0]
    assert res.downloaded_files == 2 and res.downloaded_bytes == a.file.size + w.size
    assert con.blobs.check(w.sha256, w.size, rehash=True) == "ok"
    assert not con.blobs.present(b.file.sha256)  # the other build's model is not fetched
    assert api.pull("ext@1.0.0", build="a", offline=True, zoo=con).path == res.path


@pytest.fixture
def small_disk(tmpfs):
    """A real 1 MB file system (tmpfs)."""
    return tmpfs("1m")


def test_pulling_onto_a_full_disk_is_a_storage_error_and_installs_nothing(tmp_path, small_disk):
    pub = LocalZoo(tmp_path / "pub")
    pub.publish(make_staging(tmp_path / "s", big_bytes=2 << 20))  # a 2 MB model
    api.remote_add("origin", str(tmp_path / "remote"), zoo=pub)
    api.push("tiny@1.0.0", "origin", zoo=pub)
    con = LocalZoo(small_disk / "zoo")
    api.remote_add("origin", str(tmp_path / "remote"), zoo=con)
    with pytest.raises(StorageError) as e:
        api.pull("tiny@1.0.0", zoo=con)
    assert e.value.message.startswith(f"no space left on {small_disk}") and e.value.exit_code == 3
    assert con.list() == []
