"""A remote run cache written by someone hostile (or damaged), through the real `zoo` CLI.

Machine A runs the recipe and pushes to the remote; the remote's entry is then rewritten by an
"attacker" with write access to it; machine B (its own cache and zoo: a fresh ZOO_CACHE_DIR and
ZOO_HOME) runs with that remote:

- an entry whose files are other bytes while its declared output digest is still the locked one
  (blake3 and sha256 of the files, the release's manifest and NOTICE all rewritten consistently)
  is refused with exit 4 before anything is installed, by `zoo run --frozen` and by `zoo release`:
  output digests are recomputed from the files an entry brings;
- an entry that is not a valid document (a list where a dict belongs, a symbolic link to
  /dev/zero) is a miss with a one-line note naming the remote and the entry: the stage runs on B,
  nothing of the entry is installed, and a local cache already holding such an entry heals (a
  miss, and `zoo gc` removes it).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from cli_helpers import SHIPPED, write_recipe, zoo as zoo_cli
from remote_fixtures import Backend
from zoo.engine.cache import Cache
from zoo.engine.cache_store import FsCacheStore
from zoo.engine.hashing import digest_bytes

EVIL = b"not the bytes the lockfile pins\n"
PAYLOAD = "release/builds/data/model.ort"


def _machine(tmp_path: Path, name: str, remote: Backend | str | None = None) -> dict[str, str]:
    env = {"ZOO_CACHE_DIR": str(tmp_path / name / "cache"), "ZOO_HOME": str(tmp_path / name / "home")}
    if remote is not None:  # the user's own config names the remote run cache
        url, options = (remote, {}) if isinstance(remote, str) else (remote.url, remote.options)
        home = Path(env["ZOO_HOME"])
        home.mkdir(parents=True, exist_ok=True)
        (home / "config.yaml").write_text(json.dumps({"schema_version": 1, "cache": {"remote": url, "options": options}}))
    return env


def _built_on_a(tmp_path: Path, remote: Backend | str) -> tuple[Path, dict[str, str]]:
    """The SHIPPED recipe (writer → inspector → shipper) run on machine A, which pushed every stage
    to `remote` and wrote the lockfile; {stage: key}."""
    project = tmp_path / "project"
    project.mkdir()
    recipe = write_recipe(project, SHIPPED)
    cli = zoo_cli("run", recipe, "--json", env=_machine(tmp_path, "a", remote))
    assert cli.code == 0, cli.text
    ran = json.loads(cli.out)
    assert {s["state"] for s in ran["stages"]} == {"done"} and ran["notes"] == [], ran
    return recipe, {s["id"]: s["key"] for s in ran["stages"]}


def _store(remote: Backend | str) -> FsCacheStore:
    return FsCacheStore(remote, {}) if isinstance(remote, str) else FsCacheStore(remote.url, remote.options)


def _overwrite_entry(store: FsCacheStore, key: str, doc: dict) -> None:
    """The attacker's write: the entry replaced in place (the store itself never overwrites one)."""
    path = store._entry_path(key)
    if store.backend.scheme == "file":
        os.chmod(path, 0o644)
    store.backend.write(path, json.dumps(doc, indent=1).encode())


def _forge_ship_entry(tmp_path: Path, store: FsCacheStore, key: str) -> str:
    """Rewrite the shipper's remote entry consistently around other payload bytes: the payload,
    the release's manifest.json and NOTICE.txt (each naming the payload's sha256 and size) become
    new objects with their true blake3 and sha256; only the declared output digest of `release`
    stays the one the lockfile pins. Returns that locked digest."""
    doc = json.loads(store.read_entry(key))
    files = doc["entry"]["files"]
    a = Cache(tmp_path / "a" / "cache")
    folder = tmp_path / "forged"
    shutil.copytree(a.materialize(a.lookup(key)), folder)
    (folder / PAYLOAD).chmod(0o644)
    (folder / PAYLOAD).write_bytes(EVIL)
    sha = hashlib.sha256(EVIL).hexdigest()
    notice = folder / "release" / "NOTICE.txt"
    first = notice.read_text().splitlines()[0]
    notice.chmod(0o644)
    notice.write_text(f"{first}\nbuilds/data/model.ort {sha}\n")
    manifests = [rel for rel in files if rel.endswith(".json")]
    assert len(manifests) == 1, files
    manifest_path = folder / manifests[0]
    manifest = json.loads(manifest_path.read_text())  # every reference to the payload and to NOTICE.txt
    _point_at(manifest, "builds/data/model.ort", sha, len(EVIL))
    _point_at(manifest, "NOTICE.txt", hashlib.sha256(notice.read_bytes()).hexdigest(), notice.stat().st_size)
    manifest_path.chmod(0o644)
    manifest_path.write_text(json.dumps(manifest, indent=2))
    for rel, meta in files.items():
        data = (folder / rel).read_bytes()
        digest, sha256 = digest_bytes(data), hashlib.sha256(data).hexdigest()
        if digest != meta["digest"]:
            upload = tmp_path / f"upload-{sha256}"
            upload.write_bytes(data)
            store.put_object(upload, sha256)
            doc["sha256"][digest] = sha256
            meta.update(digest=digest, size=len(data))
    assert files[PAYLOAD]["size"] == len(EVIL)
    _overwrite_entry(store, key, doc)
    return doc["entry"]["outputs"]["release"]["digest"]


def _point_at(node, rel: str, sha: str, size: int) -> None:
    if isinstance(node, dict):
        if node.get("path") == rel:
            node.update(sha256=sha, size=size)
        for value in node.values():
            _point_at(value, rel, sha, size)
    elif isinstance(node, list):
        for value in node:
            _point_at(value, rel, sha, size)


def _refused_and_nothing_installed(cli, env: dict, key: str, remote_url: str, locked: str) -> None:
    assert cli.code == 4, cli.text
    assert "Traceback" not in cli.text
    assert f"remote cache {remote_url}: the entry entries/{key[:2]}/{key}.json (stage ship) declares output " \
           f"'release' as {locked}, but the files it brings make" in cli.err, cli.err
    cache = Cache(Path(env["ZOO_CACHE_DIR"]))
    assert cache.read_entry(key) is None
    assert not cache.object_path(digest_bytes(EVIL)).exists()
    assert not (Path(env["ZOO_HOME"]) / "models" / "shipped").exists() and "shipped@0.1.0" not in \
        zoo_cli("list", env=env).out


@pytest.mark.parametrize("command", ["run --frozen", "release"])
def test_other_bytes_under_the_locked_output_digest_are_refused(tmp_path, command):
    remote = str(tmp_path / "remote")
    recipe, keys = _built_on_a(tmp_path, remote)
    locked = _forge_ship_entry(tmp_path, _store(remote), keys["ship"])
    lock = recipe.with_suffix(".lock").read_text()
    assert locked in lock

    if command == "run --frozen":
        b = _machine(tmp_path, "b")
        cli = zoo_cli("run", recipe, "--frozen", "--cache-remote", remote, env=b)
        _refused_and_nothing_installed(cli, b, keys["ship"], remote, locked)
        assert recipe.with_suffix(".lock").read_text() == lock
        return
    c = _machine(tmp_path, "c", remote)
    site = tmp_path / "site"
    assert zoo_cli("remote", "add", "site", site, env=c).code == 0
    cli = zoo_cli("release", recipe, "--version", "0.1.0", "--to", "site", env=c)
    _refused_and_nothing_installed(cli, c, keys["ship"], remote, locked)
    listed = zoo_cli("list", "--remote", "site", "--json", env=c)
    assert listed.code == 0 and "shipped" not in listed.out, listed.text


def test_other_bytes_under_the_locked_output_digest_are_refused_over_s3(tmp_path, request, monkeypatch):
    """The same forged entry served by a real S3 server (moto on 127.0.0.1)."""
    remote = Backend("s3", request, tmp_path, monkeypatch)
    recipe, keys = _built_on_a(tmp_path, remote)
    locked = _forge_ship_entry(tmp_path, _store(remote), keys["ship"])
    b = _machine(tmp_path, "b", remote)
    cli = zoo_cli("run", recipe, "--frozen", env=b)
    _refused_and_nothing_installed(cli, b, keys["ship"], remote.url, locked)


@pytest.mark.parametrize("field", ["host", "metrics", "outputs"])
def test_an_entry_with_a_field_of_the_wrong_type_is_a_miss_with_a_note(tmp_path, field):
    remote = str(tmp_path / "remote")
    recipe, keys = _built_on_a(tmp_path, remote)
    store = _store(remote)
    doc = json.loads(store.read_entry(keys["check"]))
    doc["entry"][field] = ["not", "a", "mapping"]
    _overwrite_entry(store, keys["check"], doc)

    b = _machine(tmp_path, "b", remote)
    for frozen in ((), ("--frozen",)):  # a damaged entry is no reason to refuse: B builds the stage and checks it
        cli = zoo_cli("run", recipe, "--json", *frozen, env=b)
        assert cli.code == 0 and "Traceback" not in cli.text, cli.text
        got = json.loads(cli.out)
        states = {s["id"]: s["state"] for s in got["stages"]}
        if not frozen:
            assert states == {"a": "cached", "check": "done", "ship": "cached"}, got
            name = f"entries/{keys['check'][:2]}/{keys['check']}.json"
            [note] = got["notes"]
            assert note.startswith(f"remote cache {remote}: the entry {name} is not a valid entry (entry.{field}: "
                                   "Input should be a valid dictionary") and note.endswith("); taken as a miss"), note
            assert "note:" not in cli.err  # --json: the note is in the document only
        else:
            assert set(states.values()) == {"cached"}, got
    # what B cached is its own run's entry, and every later run (without the remote too) reads it
    assert Cache(Path(b["ZOO_CACHE_DIR"])).lookup(keys["check"]).host != ["not", "a", "mapping"]
    again = zoo_cli("run", recipe, "--cache-remote", "none", env=b)
    assert again.code == 0 and "Traceback" not in again.text, again.text


def test_an_entry_that_is_a_link_to_dev_zero_is_not_read(tmp_path):
    remote = str(tmp_path / "remote")
    recipe, keys = _built_on_a(tmp_path, remote)
    path = Path(_store(remote)._entry_path(keys["a"]))
    path.unlink()
    path.symlink_to("/dev/zero")
    b = _machine(tmp_path, "b", remote)
    cli = zoo_cli("run", recipe, "--json", env=b, timeout=60)
    assert cli.code == 0 and "Traceback" not in cli.text, cli.text
    got = json.loads(cli.out)
    assert {s["id"]: s["state"] for s in got["stages"]}["a"] == "done"
    assert got["notes"] == [f"remote cache {remote}: the entry entries/{keys['a'][:2]}/{keys['a']}.json is a "
                            "symbolic link, not a regular file; taken as a miss"], got["notes"]


@pytest.mark.parametrize("poison", [{"host": [1]}, {"metrics": [1]}, {"outputs": [1]}, {"files": {"f": "x"}},
                                    {"stage": "check\x1b[2J"},  # a terminal escape in what a message prints
                                    # what a forged remote entry left before outputs were recomputed
                                    {"outputs": {"data": {"path": "checked.txt", "digest": "0" * 64}}}])
def test_a_poisoned_local_entry_is_a_miss_and_gc_removes_it(tmp_path, poison):
    """An entry already installed by an older zoo from a hostile remote: every later run treated it
    as a hit and crashed. Now it is a miss with a note, the run recomputes the stage (replacing the
    entry), and `zoo gc` removes such an entry."""
    project = tmp_path / "project"
    project.mkdir()
    recipe = write_recipe(project, SHIPPED)
    env = _machine(tmp_path, "b")
    cli = zoo_cli("run", recipe, "--json", env=env)
    assert cli.code == 0, cli.text
    keys = {s["id"]: s["key"] for s in json.loads(cli.out)["stages"]}
    cache = Cache(Path(env["ZOO_CACHE_DIR"]))
    path = cache.entry_path(keys["check"])
    good = path.read_text()
    poisoned = {**json.loads(good), **poison}
    path.chmod(0o644)
    path.write_text(json.dumps(poisoned))

    plan = zoo_cli("plan", recipe, "--cache-remote", "none", env=env)
    assert plan.code == 0 and "Traceback" not in plan.text, plan.text
    why = "declares output 'data' as " + "0" * 64 if "outputs" in poison and isinstance(poison["outputs"], dict) \
        else "is not a valid entry ("
    assert f"note: the cache entry {path} {why}" in plan.err, plan.err
    assert "treated as a miss (`zoo gc` removes it)" in plan.err

    gc = zoo_cli("gc", env=env)
    assert gc.code == 0 and "Traceback" not in gc.text, gc.text
    assert not path.exists()

    path.write_text(json.dumps(poisoned))
    cli = zoo_cli("run", recipe, "--json", "--cache-remote", "none", env=env)
    assert cli.code == 0 and "Traceback" not in cli.text, cli.text
    assert {s["id"]: s["state"] for s in json.loads(cli.out)["stages"]}["check"] == "done"
    assert json.loads(path.read_text())["host"] == json.loads(good)["host"]  # healed: the run's own entry


def test_an_entry_larger_than_the_bound_is_a_miss_unread_with_a_stand_in_bound(tmp_path, monkeypatch):
    """Stand-in: the bound (64 MiB) lowered to 4 KiB, in-process. A larger entry is a miss with a
    note, and the store asks its backend for no more than the bound (it reads one byte more)."""
    from zoo.engine import entry_schema
    from zoo.engine.cache_config import RemoteCacheSetting
    from zoo.engine.remote_cache import RemoteCache
    from zoo.storage import fsbackend

    monkeypatch.setattr(entry_schema, "ENTRY_MAX_BYTES", 4096)
    url = str(tmp_path / "remote")
    store = FsCacheStore(url)
    key = "ab" * 32
    store.create_entry(key, b"{" + b" " * 100_000 + b"}")
    asked: list[int] = []
    real = fsbackend.FsBackend.read
    monkeypatch.setattr(fsbackend.FsBackend, "read",
                        lambda self, rpath, limit=None: (asked.append(limit), real(self, rpath, limit))[1])
    remote = RemoteCache(Cache(tmp_path / "b").ensure(), RemoteCacheSetting(url), store=store)
    assert remote.fetch(key) is None and asked == [4096]
    assert remote.notes == [f"remote cache {url}: the entry entries/ab/{key}.json is larger than 4 KiB; "
                            "taken as a miss"]
