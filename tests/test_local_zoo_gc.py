"""`zoo gc` in the local zoo: blobs no version references and partial downloads nothing resumes are
freed; a publish in flight (its blobs stored before its manifest) and a download in progress are not."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess

from cli_helpers import zoo as zoo_cli
from zoo.download import _HOST
from zoo.registry.store import LocalZoo
from registry_servers import make_staging


def _zoo_with_leftovers(tmp_path):
    zoo = LocalZoo(tmp_path / "home")
    published = zoo.publish(make_staging(tmp_path / "staging"))
    stray = tmp_path / "stray.bin"
    stray.write_bytes(b"a blob an interrupted publish left behind")
    sha = hashlib.sha256(stray.read_bytes()).hexdigest()
    zoo.blobs.add(stray, sha, stray.stat().st_size, "stray")
    partial = zoo.blobs.partial_dir
    partial.mkdir(parents=True, exist_ok=True)
    gone = subprocess.Popen(["true"])  # a process that has ended
    gone.wait()
    dead = partial / f"{'c' * 64}.{_HOST}.{gone.pid}.0a0a0a0a0a0a.incomplete"
    dead.write_bytes(b"x" * 1000)
    alive = partial / f"{'d' * 64}.{_HOST}.{os.getpid()}.0b0b0b0b0b0b.incomplete"  # this test is still running
    alive.write_bytes(b"y" * 10)
    return zoo, published, sha, dead, alive


def test_zoo_gc_frees_an_abandoned_partial_download_and_keeps_a_young_unreferenced_blob(tmp_path):
    zoo, published, sha, dead, alive = _zoo_with_leftovers(tmp_path)
    env = {"ZOO_HOME": str(zoo.root), "ZOO_CACHE_DIR": str(tmp_path / "cache")}
    dry = zoo_cli("gc", "--dry-run", "--json", env=env)
    assert dry.code == 0, dry.text
    assert json.loads(dry.out)["zoo"] == {"blobs": 0, "partials": 1, "bytes": 1000, "root": str(zoo.root)}
    assert dead.exists()  # a dry run removes nothing
    cli = zoo_cli("gc", env=env)
    assert cli.code == 0, cli.text
    assert "freed 1000 B in the local zoo: 0 unreferenced blobs, 1 abandoned partial downloads" in cli.out
    assert not dead.exists() and alive.exists()  # the download of a live process is left alone
    assert zoo.blobs.path(sha).exists()  # stored just now: it may be a publish in flight
    assert zoo_cli("pull", published.ref, env=env).code == 0


def test_local_zoo_gc_frees_unreferenced_blobs_past_the_grace_period_only(tmp_path):
    zoo, published, sha, _, _ = _zoo_with_leftovers(tmp_path)
    assert zoo.gc(dry_run=True, grace_s=0)["blobs"] == 1 and zoo.blobs.path(sha).exists()
    result = zoo.gc(grace_s=0)
    # both partials: this process's own is not being written (no download of it is active here)
    assert (result["blobs"], result["partials"]) == (1, 2)
    assert not zoo.blobs.path(sha).exists()
    for ref in published.all_files():  # every blob a version names stays
        assert zoo.blobs.path(ref.sha256).exists()
    assert zoo.gc(grace_s=0) == {"blobs": 0, "partials": 0, "bytes": 0}
