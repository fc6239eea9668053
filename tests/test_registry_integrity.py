"""The local zoo's integrity (issue #11): corrupt blobs, `zoo fsck`, `--to` copies, refused pulls
that install nothing, an index that follows the manifests, a full disk, tags and removals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from cli_helpers import zoo

from zoo import files
from zoo.registry.codec import load_manifest
from zoo.registry.manifest import MANIFEST_FILE, Build, Manifest
from zoo.registry.staging import file_ref, write_manifest
from zoo.registry.store import LocalZoo
from registry_servers import make_staging, tiny_onnx

TWO_BUILDS = {"cpu-fp32": {"metrics": {"latency_p50_ms": 2.0}}, "cpu-int8": {"metrics": {"latency_p50_ms": 1.0}}}


def _publish(tmp_path: Path, **kw) -> LocalZoo:
    z = LocalZoo()  # ZOO_HOME from conftest: the one the subprocesses see
    z.publish(make_staging(tmp_path / f"s-{kw.get('name', 'tiny')}-{kw.get('version', '1.0.0')}", **kw))
    return z


def _flip(path: Path) -> None:
    """Corrupt one byte in place (as a write through a hard link, or a bad disk, would)."""
    os.chmod(path, 0o644)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    with open(path, "r+b") as f:  # in place: same inode, like a write through a hard link
        f.write(data)


def _blob(z: LocalZoo, ref: str, build: str) -> Path:
    return z.blobs.path(z.resolve(ref).builds[build].file.sha256)


# ---- 2. a corrupted blob is never served ------------------------------------------------
@pytest.mark.parametrize("extra", [[], ["--offline"], ["--to", "DEST"]])
def test_a_corrupted_blob_is_refused_with_exit_4(tmp_path, extra):
    z = _publish(tmp_path, builds=TWO_BUILDS)
    extra = [str(tmp_path / "dest") if a == "DEST" else a for a in extra]
    assert zoo("pull", "tiny@1.0.0", "--build", "cpu-int8").code == 0  # placed once: the cheap path is armed
    _flip(_blob(z, "tiny@1.0.0", "cpu-int8"))
    r = zoo("pull", "tiny@1.0.0", "--build", "cpu-int8", *extra)
    assert r.code == 4, r.text
    assert "does not match its sha256" in r.err and "zoo fsck --repair" in r.err
    assert r.out == ""  # no path handed out
    if "--to" in extra:
        assert not (tmp_path / "dest/builds/cpu-int8/model.onnx").exists()


def test_verification_is_memoised_and_a_write_invalidates_it(tmp_path, monkeypatch):
    z = _publish(tmp_path)
    sha = z.resolve("tiny@1.0.0").builds["cpu-fp32"].file.sha256
    calls = []
    real = files.sha256_and_size
    monkeypatch.setattr(files, "sha256_and_size", lambda p: calls.append(p) or real(p))
    fresh = LocalZoo(z.root)
    assert fresh.blobs.has(sha) and fresh.blobs.has(sha)
    assert calls == []  # publish recorded the verified identity: a re-check is a stat
    path = fresh.blobs.path(sha)
    os.chmod(path, 0o644)
    path.write_bytes(path.read_bytes())  # same bytes, but a write: ctime moves, the memo no longer counts
    assert fresh.blobs.has(sha) and len(calls) == 1
    assert fresh.blobs.has(sha) and len(calls) == 1


def test_a_second_pull_stays_cheap_after_the_snapshot_links(tmp_path, monkeypatch):
    z = _publish(tmp_path)
    from zoo.registry import api

    first = api.pull("tiny@1.0.0", zoo=z).path
    calls = []
    real = files.sha256_and_size
    monkeypatch.setattr(files, "sha256_and_size", lambda p: calls.append(p) or real(p))
    assert api.pull("tiny@1.0.0", zoo=LocalZoo(z.root)).path == first
    assert calls == []  # hard-linking moved the blobs' ctime; the memo was kept valid, no re-hash


def test_fsck_reports_and_repairs(tmp_path):
    z = _publish(tmp_path, builds=TWO_BUILDS)
    assert zoo("pull", "tiny@1.0.0", "--build", "cpu-fp32").code == 0
    r = zoo("fsck")
    assert r.code == 0, r.text
    assert "problem" in r.out
    bad = _blob(z, "tiny@1.0.0", "cpu-fp32")
    _flip(bad)
    (z.model_dir("tiny") / "tags" / "prod").write_text("9.9.9\n")  # a tag pointing nowhere
    r = zoo("fsck", "--json")
    assert r.code == 4, r.text
    kinds = sorted({p["kind"] for p in json.loads(r.out)["problems"]})
    assert kinds == ["blob", "index", "snapshot", "tag"], kinds  # the hand-written tag is not in the index either
    r = zoo("fsck")
    assert r.code == 4 and "cpu-fp32/model.onnx" in r.out and "hint:" in r.err and "--repair" in r.err
    r = zoo("fsck", "--repair")
    assert r.code == 0, r.text
    assert not bad.exists()
    assert not (z.version_dir("tiny", "1.0.0") / "builds/cpu-fp32/model.onnx").exists()
    assert not (z.model_dir("tiny") / "tags" / "prod").exists()
    assert zoo("fsck").code == 0
    # the corrupt build is gone, not served; the other build is untouched
    assert zoo("pull", "tiny@1.0.0", "--build", "cpu-fp32", "--offline").code == 2
    assert zoo("pull", "tiny@1.0.0", "--build", "cpu-int8").code == 0


def test_republishing_the_same_release_restores_a_repaired_blob(tmp_path):
    """After `fsck --repair` removed a bad blob, publishing the same release again (what a cached
    deploy does on the next `zoo run`) puts it back, so the build pulls again."""
    staging = make_staging(tmp_path / "s", builds=TWO_BUILDS)
    z = LocalZoo()
    z.publish(staging)
    bad = _blob(z, "tiny@1.0.0", "cpu-int8")
    _flip(bad)
    assert zoo("fsck", "--repair").code == 0
    assert zoo("pull", "tiny@1.0.0", "--build", "cpu-int8").code != 0
    z.publish(staging)
    assert z.blobs.check(bad.name, rehash=True) == "ok"
    r = zoo("pull", "tiny@1.0.0", "--build", "cpu-int8")
    assert r.code == 0, r.text
    assert zoo("fsck").code == 0


def test_fsck_reports_an_unparseable_manifest_and_a_stale_index(tmp_path):
    z = _publish(tmp_path)
    _publish(tmp_path, name="other")
    mpath = z.manifest_path("other", "1.0.0")
    mpath.write_text("{not json")
    r = zoo("fsck", "--json")
    assert r.code == 4
    problems = json.loads(r.out)["problems"]
    assert any(p["kind"] == "manifest" and "other" in p["where"] for p in problems)
    assert any(p["kind"] == "index" and "other@1.0.0" in p["detail"] for p in problems)
    assert zoo("fsck", "tiny").code == 0  # one model only
    r = zoo("fsck", "--repair")
    assert r.code == 4 and "never deleted" in r.err  # a manifest is never deleted by a repair
    assert mpath.exists()


# ---- 3. --to gives real copies ------------------------------------------------------------
def test_pull_to_gives_copies_that_do_not_touch_the_zoo(tmp_path):
    z = _publish(tmp_path)
    dest = tmp_path / "mine"
    r = zoo("pull", "tiny@1.0.0", "--to", dest)
    assert r.code == 0, r.text
    mine = Path(r.out.strip())
    blob = _blob(z, "tiny@1.0.0", "cpu-fp32")
    original = blob.read_bytes()
    assert os.stat(mine).st_ino != os.stat(blob).st_ino
    with open(mine, "r+b") as f:  # the user edits "their copy"
        f.write(b"EDITED")
    assert blob.read_bytes() == original and not (blob.stat().st_mode & 0o222)
    r = zoo("pull", "tiny@1.0.0", "--to", tmp_path / "again")
    assert r.code == 0 and Path(r.out.strip()).read_bytes() == original
    r = zoo("pull", "tiny@1.0.0", "--to", dest)  # pulling into the same folder again repairs the copy
    assert r.code == 0 and mine.read_bytes() == original


def test_pull_to_writes_every_file_with_one_mode(tmp_path):
    _publish(tmp_path)
    dest = tmp_path / "mine"
    assert zoo("pull", "tiny@1.0.0", "--to", dest).code == 0
    modes = {p.relative_to(dest).as_posix(): p.stat().st_mode & 0o777 for p in dest.rglob("*") if p.is_file()}
    assert MANIFEST_FILE in modes and len(set(modes.values())) == 1, modes
    snapshot = LocalZoo().version_dir("tiny", "1.0.0")
    assert zoo("pull", "tiny@1.0.0").code == 0
    modes = {p.name: p.stat().st_mode & 0o777 for p in snapshot.rglob("*") if p.is_file()}
    assert set(modes.values()) == {0o444}, modes


# ---- 4. a refused pull installs nothing --------------------------------------------------
def _hostile_remote(tmp_path: Path) -> Path:
    """A folder remote holding evil@1.0.0: cpu-fp32 names external data outside its version."""
    staging = tmp_path / "evil-staging"
    tiny_onnx(staging / "builds/cpu-fp32/model.onnx", external="../../../../etc/passwd")
    tiny_onnx(staging / "builds/cpu-int8/model.onnx", scale=5.0)
    builds = {n: Build(name=n, file=file_ref(staging, f"builds/{n}/model.onnx")) for n in ("cpu-fp32", "cpu-int8")}
    write_manifest(staging, Manifest(name="evil", version="1.0.0", builds=builds))
    manifest = load_manifest((staging / MANIFEST_FILE).read_bytes(), "x")
    evil = LocalZoo(tmp_path / "evil-home")  # published around the checks, as a hostile party would
    for ref in manifest.all_files():
        evil.blobs.add(staging / ref.path, ref.sha256, ref.size, ref.path)
    evil.adopt(manifest)
    remote = tmp_path / "remote"
    env = {"ZOO_HOME": str(evil.root)}
    assert zoo("remote", "add", "shady", remote, env=env).code == 0
    assert zoo("push", "evil@1.0.0", "--to", "shady", env=env).code == 0
    return remote


def test_a_pull_refused_for_escaping_external_data_installs_nothing(tmp_path):
    remote = _hostile_remote(tmp_path)
    assert zoo("remote", "add", "shady", remote).code == 0
    r = zoo("pull", "evil@1.0.0", "--build", "cpu-fp32")
    assert r.code == 4 and "escapes" in r.err, r.text
    assert json.loads(zoo("list", "--json").out) == []
    z = LocalZoo()
    assert z.get("evil", "1.0.0") is None and z.tags("evil") == {}
    # nothing of it is local: another build is not served from a half-adopted version
    r = zoo("pull", "evil@1.0.0", "--build", "cpu-int8", "--offline")
    assert r.code == 2, r.text
    r = zoo("pull", "evil@1.0.0", "--build", "cpu-int8")
    assert r.code == 4, r.text  # the version's ONNX file held locally is hostile: refused again
    assert json.loads(zoo("list", "--json").out) == []
    assert zoo("remote", "add", "elsewhere", tmp_path / "elsewhere").code == 0
    assert zoo("push", "evil@1.0.0", "--to", "elsewhere").code == 2  # nothing to spread


# ---- 6. the index follows the manifests ---------------------------------------------------
def _two_versions_sharing_a_blob(tmp_path: Path) -> LocalZoo:
    z = _publish(tmp_path, version="1.0.0")
    _publish(tmp_path, version="1.1.0", scale=3.0)  # same model card as 1.0.0
    return z


def test_a_deleted_index_is_rebuilt_and_rm_keeps_shared_blobs(tmp_path):
    z = _two_versions_sharing_a_blob(tmp_path)
    card = z.resolve("tiny@1.0.0").card.sha256
    z.index.close()
    (z.root / "index.sqlite").unlink()
    r = zoo("list", "tiny", "--json")
    assert r.code == 0, r.text
    assert [v["version"] for v in json.loads(r.out)] == ["1.1.0", "1.0.0"], r.text
    (z.root / "index.sqlite").unlink()
    assert zoo("rm", "tiny@1.0.0").code == 0
    assert z.blobs.present(card)  # 1.1.0 still needs it
    assert zoo("pull", "tiny@1.1.0").code == 0


def test_a_damaged_index_is_rebuilt(tmp_path):
    z = _two_versions_sharing_a_blob(tmp_path)
    z.index.close()
    for suffix in ("-wal", "-shm"):
        Path(str(z.root / "index.sqlite") + suffix).unlink(missing_ok=True)
    (z.root / "index.sqlite").write_bytes(b"this is not a database" * 100)
    r = zoo("list", "tiny", "--json")
    assert r.code == 0, r.text
    assert [v["version"] for v in json.loads(r.out)] == ["1.1.0", "1.0.0"]


KILL_AFTER_MANIFEST = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    from zoo.registry import index
    from zoo.registry.store import LocalZoo
    def die(*a, **k):
        os.kill(os.getpid(), signal.SIGKILL)  # killed after the manifest, before the index
    index.Index.add = die
    LocalZoo().publish(Path(sys.argv[1]))
""")


def test_a_publish_killed_between_manifest_and_index(tmp_path):
    z = _publish(tmp_path, version="1.0.0")
    card = z.resolve("tiny@1.0.0").card.sha256
    z.index.close()
    staging = make_staging(tmp_path / "s-killed", version="1.1.0", scale=3.0)
    proc = subprocess.run([sys.executable, "-c", KILL_AFTER_MANIFEST, str(staging)], capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert z.manifest_path("tiny", "1.1.0").exists()  # the version is on disk; the index never heard of it
    r = zoo("list", "tiny", "--json")
    assert [v["version"] for v in json.loads(r.out)] == ["1.1.0", "1.0.0"], r.text
    r = zoo("rm", "tiny@1.0.0")
    assert r.code == 0, r.text
    assert z.blobs.present(card)  # 1.1.0 still uses the card
    assert zoo("pull", "tiny@1.1.0").code == 0
    assert zoo("fsck").code == 0


# ---- 11. a full disk -----------------------------------------------------------------------
@pytest.fixture
def small_disk(tmpfs):
    """A real 1 MB file system (tmpfs)."""
    return tmpfs("1m")


def test_pulling_into_a_full_zoo_home_says_so_and_installs_nothing(tmp_path, small_disk):
    _publish(tmp_path, big_bytes=2 << 20)  # a 2 MB model, in the default (large) zoo
    remote = tmp_path / "remote"
    assert zoo("remote", "add", "team", remote).code == 0
    assert zoo("push", "tiny@1.0.0", "--to", "team").code == 0
    env = {"ZOO_HOME": str(small_disk / "zoo")}
    assert zoo("remote", "add", "team", remote, env=env).code == 0
    r = zoo("pull", "tiny@1.0.0", env=env)
    assert r.code == 3, r.text
    assert "no space left on" in r.err and str(small_disk) in r.err and "Traceback" not in r.err
    assert json.loads(zoo("list", "--json", env=env).out) == []
    assert not list((small_disk / "zoo/models").glob("*/tags/*"))
    assert not list((small_disk / "zoo/models").glob(f"*/versions/*/{MANIFEST_FILE}"))


# ---- smaller things ----------------------------------------------------------------------
def test_pull_from_a_remote_leaves_no_lock_files_and_names_the_remote(tmp_path):
    _publish(tmp_path)
    remote = tmp_path / "remote"
    assert zoo("remote", "add", "team", remote).code == 0
    assert zoo("push", "tiny@1.0.0", "--to", "team").code == 0
    other = {"ZOO_HOME": str(tmp_path / "other")}
    assert zoo("remote", "add", "team", remote, env=other).code == 0
    r = zoo("pull", "tiny@1.0.0", env=other)
    assert r.code == 0 and "from team" in r.err, r.text
    assert list((tmp_path / "other/blobs/partial").glob("*")) == []
    # a pinned version known locally whose build is not downloaded: the bytes still come from the remote
    r = zoo("pull", "tiny@1.0.0", env=other)
    assert r.code == 0
    z = LocalZoo(tmp_path / "other")
    m = z.resolve("tiny@1.0.0")
    z.blobs.remove(m.builds["cpu-fp32"].file.sha256)
    r = zoo("pull", "tiny@1.0.0", "--to", tmp_path / "x", env=other)
    assert r.code == 0 and "from team" in r.err and "from local" not in r.err, r.text


def test_latest_cannot_be_set_by_hand(tmp_path):
    _publish(tmp_path, version="1.0.0")
    _publish(tmp_path, version="2.0.0", scale=3.0)
    r = zoo("tag", "tiny@1.0.0", "latest")
    assert r.code == 2 and "newest release" in r.err and "hint:" in r.err, r.text
    assert LocalZoo().read_tag("tiny", "latest") == "2.0.0"
    assert zoo("tag", "tiny@1.0.0", "stable").code == 0


def test_rm_says_which_tags_it_dropped_and_where_latest_moved(tmp_path):
    _publish(tmp_path, version="1.0.0")
    _publish(tmp_path, version="2.0.0", scale=3.0)
    assert zoo("tag", "tiny@2.0.0", "prod").code == 0
    r = zoo("rm", "tiny@2.0.0")
    assert r.code == 0, r.text
    assert "latest" in r.err and "prod" in r.err and "now points at 1.0.0" in r.err
    assert LocalZoo().tags("tiny") == {"latest": "1.0.0"}
