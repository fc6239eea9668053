"""The local zoo: publish, resolve, tags, remove, index, materialize, and the safety checks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from zoo.errors import Conflict, IntegrityError, InvalidInput, NotFound, UnsafePath
from zoo.registry import api
from zoo.registry.codec import dump_manifest, load_manifest, same_content
from zoo.registry.manifest import MANIFEST_FILE, Build, Manifest
from zoo.registry.staging import file_ref, write_manifest
from zoo.registry.store import LocalZoo
from registry_servers import make_staging, tiny_onnx

RACER = Path(__file__).resolve().parent / "racing_publisher.py"


@pytest.fixture
def zoo(tmp_path) -> LocalZoo:
    return LocalZoo(tmp_path / "home")


def test_default_root_is_zoo_home(tmp_path, monkeypatch):
    monkeypatch.setenv("ZOO_HOME", str(tmp_path / "elsewhere"))
    assert LocalZoo().root == (tmp_path / "elsewhere").resolve()


def test_publish_then_resolve_by_name_version_and_tag(zoo, tmp_path):
    m = zoo.publish(make_staging(tmp_path / "s1"))
    assert m.created and m.created.endswith("Z")
    assert zoo.resolve("tiny").version == "1.0.0"
    assert zoo.resolve("tiny@1.0.0") == m
    assert zoo.resolve("tiny@latest") == m
    # blobs are content-addressed, read-only, and the manifest is the last thing written
    for ref in m.all_files():
        blob = zoo.blobs.path(ref.sha256)
        assert blob.stat().st_size == ref.size and not (blob.stat().st_mode & 0o222)
    stored = zoo.manifest_path("tiny", "1.0.0").read_bytes()
    assert load_manifest(stored, "x") == m and stored == dump_manifest(m)


def test_latest_follows_the_highest_version(zoo, tmp_path):
    zoo.publish(make_staging(tmp_path / "a", version="1.0.0"))
    zoo.publish(make_staging(tmp_path / "b", version="2.0.0", scale=3))
    zoo.publish(make_staging(tmp_path / "c", version="1.5.0", scale=4))  # a hotfix of an older line
    assert zoo.read_tag("tiny", "latest") == "2.0.0"
    zoo.publish(make_staging(tmp_path / "d", version="2.1.0-rc.1", scale=5))
    assert zoo.read_tag("tiny", "latest") == "2.0.0"  # a pre-release never displaces a release
    zoo.publish(make_staging(tmp_path / "e", version="2.1.0", scale=6))
    assert zoo.read_tag("tiny", "latest") == "2.1.0"
    assert [v.version for v in zoo.list("tiny")] == ["2.1.0", "2.1.0-rc.1", "2.0.0", "1.5.0", "1.0.0"]


def test_republish_same_bytes_is_a_noop(zoo, tmp_path):
    first = zoo.publish(make_staging(tmp_path / "s1"))
    again = zoo.publish(make_staging(tmp_path / "s2"))  # rebuilt: identical bytes, new folder
    assert again == first and again.created == first.created


def test_same_version_different_bytes_is_a_conflict(zoo, tmp_path):
    zoo.publish(make_staging(tmp_path / "s1", scale=2.0))
    with pytest.raises(Conflict, match="already published"):
        zoo.publish(make_staging(tmp_path / "s2", scale=9.0))
    assert zoo.resolve("tiny@1.0.0").builds["cpu-fp32"].file.sha256 == \
        file_ref(tmp_path / "s1", "builds/cpu-fp32/model.onnx").sha256


def test_tampered_staging_file_is_refused_and_nothing_is_visible(zoo, tmp_path):
    staging = make_staging(tmp_path / "s")
    model = staging / "builds/cpu-fp32/model.onnx"
    data = bytearray(model.read_bytes())
    data[-1] ^= 0xFF
    model.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="does not match"):
        zoo.publish(staging)
    assert zoo.get("tiny", "1.0.0") is None and zoo.list() == []
    assert IntegrityError.exit_code == 4


@pytest.mark.parametrize("bad", ["builds/b/model.onnx", "README.md"])
def test_one_tampered_file_among_several_stored_side_by_side_refuses_the_version(zoo, tmp_path, bad):
    """The files of a version are hashed and stored side by side (`PUBLISH_THREADS`): a bad one,
    large or small, still refuses the whole version, and what the good ones left is only blobs
    no manifest names (harmless, as after any failed publish)."""
    staging = make_staging(tmp_path / "s", builds={"a": {}, "b": {}, "c": {}}, big_bytes=1 << 20)
    path = staging / bad
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match=f"{bad}: content does not match"):
        zoo.publish(staging)
    assert zoo.get("tiny", "1.0.0") is None and zoo.list() == []
    clean = make_staging(tmp_path / "clean", builds={"a": {}, "b": {}, "c": {}}, big_bytes=1 << 20)
    published = zoo.publish(clean)
    assert all(zoo.blobs.check(f.sha256, rehash=True) == "ok" for f in published.all_files())


def test_missing_staging_file_is_an_integrity_error(zoo, tmp_path):
    staging = make_staging(tmp_path / "s")
    (staging / "README.md").unlink()
    with pytest.raises(IntegrityError, match="missing"):
        zoo.publish(staging)


def test_manifest_paths_that_escape_are_refused(zoo, tmp_path):
    staging = make_staging(tmp_path / "s")
    raw = json.loads((staging / MANIFEST_FILE).read_text())
    raw["card"]["path"] = "../../outside.md"
    (staging / MANIFEST_FILE).write_text(json.dumps(raw))
    with pytest.raises(UnsafePath, match="card.path"):  # exit 4, as the README says
        zoo.publish(staging)


def test_symlink_leading_out_of_the_staging_folder_is_refused(zoo, tmp_path):
    staging = make_staging(tmp_path / "s")
    secret = tmp_path / "secret.md"
    secret.write_text("# tiny\n")  # same bytes as the card, so only the path check can catch it
    (staging / "README.md").unlink()
    os.symlink(secret, staging / "README.md")
    with pytest.raises(UnsafePath, match="outside"):
        zoo.publish(staging)


def _staging_with_external(tmp_path: Path, location: str, list_it: bool = True) -> Path:
    staging = tmp_path / "ext"
    model = tiny_onnx(staging / "builds/cpu-fp32/model.onnx", external=location)
    files = []
    if list_it:
        (staging / "builds/cpu-fp32/weights.bin").write_bytes(b"\x00" * 16)
        files = [file_ref(staging, "builds/cpu-fp32/weights.bin")]
    build = Build(name="cpu-fp32", file=file_ref(staging, "builds/cpu-fp32/model.onnx"), extra_files=files)
    write_manifest(staging, Manifest(name="ext", version="1.0.0", builds={"cpu-fp32": build}))
    assert model.exists()
    return staging


def test_onnx_external_data_inside_the_version_is_installed(zoo, tmp_path):
    m = zoo.publish(_staging_with_external(tmp_path, "weights.bin"))
    path = zoo.materialize(m, "cpu-fp32", tmp_path / "out")
    assert path == tmp_path / "out/builds/cpu-fp32/model.onnx"
    assert (tmp_path / "out/builds/cpu-fp32/weights.bin").read_bytes() == b"\x00" * 16


def test_external_data_not_listed_in_the_manifest_is_refused(zoo, tmp_path):
    staging = _staging_with_external(tmp_path, "weights.bin", list_it=False)
    (staging / "builds/cpu-fp32/weights.bin").write_bytes(b"\x00" * 16)
    with pytest.raises(UnsafePath, match="not a file of this version"):
        zoo.publish(staging)


def test_resolve_not_found_suggests(zoo, tmp_path):
    zoo.publish(make_staging(tmp_path / "s", name="alexnet"))
    with pytest.raises(NotFound) as e:
        zoo.resolve("alexnte")
    assert "alexnet" in e.value.hint
    with pytest.raises(NotFound) as e:
        zoo.resolve("alexnet@9.9.9")
    assert "1.0.0" in e.value.hint and NotFound.exit_code == 2


@pytest.mark.parametrize("bad", ["", "Alexnet", "../x", "a@", "a@1.2", "a@../x", "a@1.0.0@b", "a b"])
def test_bad_references_are_invalid_input(zoo, bad):
    with pytest.raises(InvalidInput):
        zoo.resolve(bad)


def test_tags_move_and_tag_names_cannot_look_like_versions(zoo, tmp_path):
    zoo.publish(make_staging(tmp_path / "a", version="1.0.0"))
    zoo.publish(make_staging(tmp_path / "b", version="1.1.0", scale=3))
    zoo.tag("tiny", "1.0.0", "prod")
    assert zoo.resolve("tiny@prod").version == "1.0.0"
    zoo.tag("tiny", "1.1.0", "prod")
    assert zoo.resolve("tiny@prod").version == "1.1.0"
    assert zoo.index.tags("tiny") == {"latest": "1.1.0", "prod": "1.1.0"}
    with pytest.raises(InvalidInput, match="looks like a version"):
        zoo.tag("tiny", "1.0.0", "2.0.0")
    with pytest.raises(NotFound):
        zoo.tag("tiny", "3.0.0", "prod")
    zoo.untag("tiny", "prod")
    with pytest.raises(NotFound):
        zoo.resolve("tiny@prod")


def test_remove_frees_only_unshared_blobs_and_moves_latest(zoo, tmp_path):
    a = zoo.publish(make_staging(tmp_path / "a", version="1.0.0"))
    b = zoo.publish(make_staging(tmp_path / "b", version="1.1.0", scale=3))  # same card, new model
    card = a.card.sha256
    assert card == b.card.sha256
    zoo.materialize(b, "cpu-fp32")
    assert zoo.remove("tiny", "1.1.0") == 1  # its model; the card is still used by 1.0.0
    assert not zoo.blobs.has(b.builds["cpu-fp32"].file.sha256) and zoo.blobs.has(card)
    assert zoo.read_tag("tiny", "latest") == "1.0.0"
    assert not zoo.version_dir("tiny", "1.1.0").exists()
    assert zoo.remove("tiny", "1.0.0") == 2
    assert zoo.list() == [] and not any((zoo.root / "blobs/sha256").rglob("*/*"))
    with pytest.raises(NotFound):
        zoo.remove("tiny", "1.0.0")


def test_interrupted_publish_leaves_no_version_and_can_be_resumed(zoo, tmp_path, monkeypatch):
    staging = make_staging(tmp_path / "s")
    real_add = zoo.blobs.add
    calls = []

    def flaky_add(*args, **kwargs):
        calls.append(args)
        if len(calls) == 2:
            raise OSError("disk went away")
        return real_add(*args, **kwargs)

    monkeypatch.setattr(zoo.blobs, "add", flaky_add)
    with pytest.raises(OSError):
        zoo.publish(staging)
    assert zoo.get("tiny", "1.0.0") is None and zoo.list() == []
    monkeypatch.setattr(zoo.blobs, "add", real_add)
    assert zoo.publish(staging).version == "1.0.0"


def test_concurrent_publishers_of_one_version_cannot_both_win(tmp_path):
    """Two publisher processes on one zoo root race to publish different bytes as tiny@1.0.0;
    both pass the "does it exist?" check before either writes (tests/racing_publisher.py)."""
    root = tmp_path / "home"
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    stagings = [make_staging(tmp_path / f"s{i}", scale=float(i + 2)) for i in range(2)]
    procs = [subprocess.Popen([sys.executable, str(RACER), "publish", str(root), str(stagings[i]), str(barrier), str(i)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    assert sorted(r["outcome"] for r in results) == ["conflict", "won"], results
    winner = next(r for r in results if r["outcome"] == "won")
    assert LocalZoo(root).resolve("tiny@1.0.0").builds["cpu-fp32"].file.sha256 == winner["sha256"]
    assert "already published with different content" in next(r for r in results if r["outcome"] == "conflict")["message"]


def test_reindex_rebuilds_the_same_index(zoo, tmp_path):
    zoo.publish(make_staging(tmp_path / "a", version="1.0.0"))
    zoo.publish(make_staging(tmp_path / "b", version="1.1.0", scale=3))
    zoo.tag("tiny", "1.0.0", "prod")
    before = zoo.list()
    zoo.index.close()
    (zoo.root / "index.sqlite").unlink()
    fresh = LocalZoo(zoo.root)
    assert fresh.list() == before  # a missing index is rebuilt from the manifests when opened
    assert fresh.reindex() == 2 and fresh.list() == before


def test_search_filters_on_build_metrics(zoo, tmp_path):
    zoo.publish(make_staging(tmp_path / "a", name="fast", task="classification", description="small and quick",
                             builds={"cpu-fp32": {"metrics": {"latency_p50_ms": 3.0, "accuracy": 0.91}},
                                     "cpu-int8": {"metrics": {"latency_p50_ms": 1.0, "accuracy": 0.89}}}))
    zoo.publish(make_staging(tmp_path / "b", name="slow", task="classification", description="large and accurate",
                             builds={"cpu-fp32": {"metrics": {"latency_p50_ms": 40.0, "accuracy": 0.97}}}))
    zoo.publish(make_staging(tmp_path / "c", name="reg", task="regression",
                             builds={"cpu-fp32": {"metrics": {}}}))
    zoo.tag("slow", "1.0.0", "prod")
    hits = lambda **kw: sorted((r["name"], r["build"]) for r in api.search(zoo=zoo, **kw))  # noqa: E731
    assert hits(max_latency=2.0) == [("fast", "cpu-int8")]
    assert hits(min_accuracy=0.9) == [("fast", "cpu-fp32"), ("slow", "cpu-fp32")]
    assert hits(min_accuracy=0.9, max_latency=5) == [("fast", "cpu-fp32")]
    assert hits(task="classification", tag="prod") == [("slow", "cpu-fp32")]
    assert hits(text="ACCURATE") == [("slow", "cpu-fp32")]
    assert hits(text="regression") == [("reg", "cpu-fp32")]
    assert hits(text="nothing-like-this") == []


def test_materialize_refuses_missing_blobs_and_is_idempotent(zoo, tmp_path):
    m = zoo.publish(make_staging(tmp_path / "s"))
    path = zoo.materialize(m, "cpu-fp32")
    assert path.read_bytes() == (tmp_path / "s/builds/cpu-fp32/model.onnx").read_bytes()
    assert zoo.is_materialized(m, "cpu-fp32") == path
    ino = path.stat().st_ino
    assert zoo.materialize(m, "cpu-fp32") == path and path.stat().st_ino == ino
    with pytest.raises(NotFound, match="no build"):
        zoo.materialize(m, "cuda-fp16")
    zoo.blobs.remove(m.builds["cpu-fp32"].file.sha256)
    with pytest.raises(NotFound, match="not downloaded"):
        zoo.materialize(m, "cpu-fp32", tmp_path / "other")


def test_a_version_folder_is_itself_a_staging_folder(zoo, tmp_path):
    """What pull places (manifest + files) can be published into another zoo unchanged."""
    m = zoo.publish(make_staging(tmp_path / "s"))
    zoo.materialize(m, "cpu-fp32", tmp_path / "copy")
    other = LocalZoo(tmp_path / "other")
    assert same_content(other.publish(tmp_path / "copy"), m)
