"""The run cache against live processes: `zoo gc` beside a running `zoo run`, entries that would
poison the cache, `gc --keep` mistakes, workers outliving a killed run, a full cache disk."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli_helpers import write_recipe, zoo as zoo_cli
from zoo.engine import lockfile
from zoo.engine.cache import Cache
from zoo.errors import StageFailed

POLL_LIMIT_S = 120  # a bound on waiting for an event, never an assertion about speed


def _popen_run(recipe: Path, *extra: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "zoo", "run", str(recipe), *extra], env={**os.environ, **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _wait_for(path: Path, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + POLL_LIMIT_S
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)


# --- 1. gc beside a live run -----------------------------------------------------------------

@pytest.mark.parametrize("keep", [False, True], ids=["gc", "gc-keep-other-recipe"])
def test_gc_in_a_loop_during_a_run_breaks_nothing(tmp_path, keep):
    marker = tmp_path / "slow.pid"
    gc_args = ["gc"]
    if keep:  # keep only another recipe's entries: the live run's new entries are in no lockfile yet
        other = write_recipe(tmp_path, "schema_version: 1\nname: other\nversion: 0.1.0\nstages:\n  w: {kind: writer}\n",
                             name="other.yaml")
        assert zoo_cli("run", other).code == 0
        gc_args += ["--keep", str(other)]
    recipe = write_recipe(tmp_path, f"""\
schema_version: 1
name: gcloop
version: 0.1.0
stages:
  a:
    kind: writer
    config: {{text: "x", repeat: 3}}
  slow:
    kind: slowcopy
    config: {{seconds: 4, marker: {marker}}}
  after:
    kind: concat
""")
    run = _popen_run(recipe)
    gcs = []
    try:
        while run.poll() is None:  # the repro: while kill -0 $!; do zoo gc; sleep 0.2; done
            gc = zoo_cli(*gc_args)
            gcs.append((marker.exists() and run.poll() is None, gc))
            time.sleep(0.2)
        out, err = run.communicate()
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    assert run.returncode == 0, out + err
    assert all(gc.code == 0 for _, gc in gcs), [gc.text for _, gc in gcs]
    during = [gc for slow_running, gc in gcs if slow_running]
    assert during, "no gc ran while the slow stage was running"
    assert any("skipped what a running `zoo run` holds" in gc.out for gc in during), [gc.out for gc in during]
    assert run.returncode == 0, out + err
    again = zoo_cli("run", recipe, "--json")
    assert again.code == 0, again.text
    if keep:
        # the loop's last gc may start after the run released its lease, and then `--keep other.yaml`
        # rightly drops gcloop's entries: the second run may recompute, but must succeed
        return
    cache = Cache(Path(os.environ["ZOO_CACHE_DIR"]))
    after = next(e for e in cache.iter_entries() if e.stage == "after")
    assert cache.output_paths(after)["data"].read_text() == "xxx copied"
    assert [s["state"] for s in json.loads(again.out)["stages"]] == ["cached"] * 3


def _commit(cache: Cache, out: Path, outputs: dict[str, str], key: str = "e" * 64):
    return cache.commit(key=key, stage="export", kind="export", out_dir=out, outputs=outputs, metrics={}, parts={},
                        duration_s=0.1)


def test_commit_refuses_missing_or_empty_outputs(tmp_path):
    cache = Cache(tmp_path / "c").ensure()
    out = tmp_path / "out"
    (out / "empty-folder").mkdir(parents=True)
    (out / "empty.bin").write_bytes(b"")
    (out / "other.txt").write_text("not an output")
    for outputs, named in (({"model": "model.onnx"}, "model.onnx"), ({"release": "empty-folder"}, "empty-folder"),
                           ({"model": "empty.bin"}, "empty.bin")):
        with pytest.raises(StageFailed) as info:
            _commit(cache, out, outputs)
        assert info.value.exit_code == 1
        assert "export" in str(info.value) and named in str(info.value)
        assert cache.read_entry("e" * 64) is None  # nothing recorded
    # the whole workspace gone (gc removed tmp/ under the stage)
    with pytest.raises(StageFailed, match="model"):
        _commit(cache, tmp_path / "vanished", {"model": "model.onnx"})
    assert not list(cache.entries.glob("*/*.json"))


def test_lookup_refuses_an_entry_whose_outputs_are_not_in_its_files(tmp_path):
    """An entry an older zoo committed with an empty file list must not count as a hit."""
    cache = Cache(tmp_path / "c").ensure()
    out = tmp_path / "out"
    out.mkdir()
    (out / "model.onnx").write_bytes(b"onnx")
    entry = _commit(cache, out, {"model": "model.onnx"})
    assert cache.lookup(entry.key) is not None
    poisoned = entry.to_json()
    poisoned["files"] = {}
    cache.entry_path(entry.key).write_text(json.dumps(poisoned))
    assert cache.read_entry(entry.key) is not None
    assert cache.lookup(entry.key) is None


def test_a_poisoned_entry_reruns_its_stage(tmp_path):
    recipe = write_recipe(tmp_path, """\
schema_version: 1
name: poisoned
version: 0.1.0
stages:
  a: {kind: writer, config: {text: "abc"}}
  b: {kind: concat}
""")
    assert zoo_cli("run", recipe).code == 0
    cache = Cache(Path(os.environ["ZOO_CACHE_DIR"]))
    a = next(e for e in cache.iter_entries() if e.stage == "a")
    data = a.to_json()
    data["files"] = {}
    cache.entry_path(a.key).write_text(json.dumps(data))
    cache.gc()  # drops out/ so nothing is read from a stale materialisation
    again = zoo_cli("run", recipe, "--json")
    assert again.code == 0, again.text
    assert [s["state"] for s in json.loads(again.out)["stages"]] == ["done", "cached"]


# --- 7. gc --keep with a wrong path ----------------------------------------------------------

@pytest.mark.parametrize("case", ["missing", "no-lockfile"])
def test_gc_keep_with_a_path_without_a_lockfile_is_an_error_and_frees_nothing(tmp_path, case):
    recipe = write_recipe(tmp_path, """\
schema_version: 1
name: kept
version: 0.1.0
stages:
  a: {kind: writer}
""")
    assert zoo_cli("run", recipe).code == 0
    cache = Cache(Path(os.environ["ZOO_CACHE_DIR"]))
    before = sorted(p.name for p in cache.entries.glob("*/*.json"))
    if case == "missing":
        wrong = tmp_path / "typo.yaml"
    else:
        wrong = write_recipe(tmp_path, recipe.read_text().replace("kept", "other"), name="other.yaml")
    cli = zoo_cli("gc", "--keep", recipe, "--keep", wrong)
    assert cli.code == 2, cli.text
    assert str(wrong) in cli.err and "hint:" in cli.err
    assert sorted(p.name for p in cache.entries.glob("*/*.json")) == before


# --- 10. kill -9 of `zoo run` ----------------------------------------------------------------

def _children(pid: int) -> set[int]:
    found = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found.update(int(c) for c in (task / "children").read_text().split())
        except OSError:
            pass
    return found


def _descendants(pid: int) -> set[int]:
    result, todo = set(), [pid]
    while todo:
        for child in _children(todo.pop()):
            if child not in result:
                result.add(child)
                todo.append(child)
    return result


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited; its reaper collects it


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc to find the run's children")
def test_kill_9_of_zoo_run_leaves_no_process_behind(tmp_path):
    marker = tmp_path / "worker.pid"
    recipe = write_recipe(tmp_path, f"""\
schema_version: 1
name: orphan
version: 0.1.0
stages:
  slow:
    kind: sleeper
    config: {{seconds: 600, marker: {marker}}}
""")
    run = _popen_run(recipe)
    try:
        _wait_for(marker, run)
        worker = int(marker.read_text())
        children = _descendants(run.pid)
        assert worker in children
        assert len(children) >= 2, children  # the pool worker and multiprocessing's resource tracker
        os.kill(run.pid, signal.SIGKILL)  # the parent only, as a user or the OOM killer would
        run.wait()
        deadline = time.monotonic() + POLL_LIMIT_S
        while any(_alive(p) for p in children) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in children if _alive(p)]
    finally:
        try:
            os.killpg(run.pid, signal.SIGKILL)  # whatever survived a failing assertion
        except ProcessLookupError:
            pass


WATCHDOG_SCRIPT = """\
import multiprocessing, os, sys, time
from concurrent.futures import ProcessPoolExecutor
from zoo.engine.worker import init_worker

if __name__ == "__main__":
    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=init_worker,
                               initargs=(os.getpid(), False))  # no PR_SET_PDEATHSIG: the watchdog alone
    print(pool.submit(os.getpid).result(), flush=True)
    time.sleep(600)
"""


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc to see the worker")
def test_worker_watchdog_ends_a_worker_whose_parent_died(tmp_path):
    """The portable fallback (for systems without PR_SET_PDEATHSIG) on its own."""
    script = tmp_path / "pool.py"
    script.write_text(WATCHDOG_SCRIPT)
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        worker = int(parent.stdout.readline())
        assert _alive(worker)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + POLL_LIMIT_S
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(worker)
    finally:
        try:
            os.killpg(parent.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# --- 11. a full cache disk -------------------------------------------------------------------

@pytest.fixture
def small_disk(tmpfs):
    """A real 4 MiB file system (tmpfs)."""
    return tmpfs("4m")


@pytest.mark.parametrize("swallow", [False, True], ids=["oserror", "truncated-file"])
def test_a_full_cache_fails_the_stage_with_no_space_exit_3_and_records_nothing(tmp_path, small_disk, swallow):
    cache_dir = small_disk / "cache"
    recipe = write_recipe(tmp_path, f"""\
schema_version: 1
name: full
version: 0.1.0
stages:
  small: {{kind: writer, config: {{text: "fits"}}}}
  big: {{kind: filler, config: {{size_mb: 16, swallow: {str(swallow).lower()}}}}}
""")
    cli = zoo_cli("run", recipe, "--cache-dir", cache_dir)
    assert cli.code == 3, cli.text
    assert f"no space left on {cache_dir}" in cli.err
    assert "INVALID_PROTOBUF" not in cli.err.split("---")[0]  # the message is the disk, not the symptom
    cache = Cache(cache_dir)
    assert {e.stage for e in cache.iter_entries()} == {"small"}  # nothing half-recorded
    assert "big" not in lockfile.read(lockfile.lock_path(recipe)).stage_ids()

    subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)
    again = zoo_cli("run", recipe, "--cache-dir", cache_dir, "--json")
    assert again.code == 0, again.text
    assert [s["state"] for s in json.loads(again.out)["stages"]] == ["cached", "done"]


def test_a_full_disk_anywhere_is_one_message_and_exit_3(tmp_path, small_disk):
    with open(small_disk / "filler", "wb") as f:  # fill the disk to the last block
        try:
            f.write(b"\0" * (8 << 20))
        except OSError:
            pass
    target = small_disk / "schema.json"
    cli = zoo_cli("schema", "-o", target)
    assert cli.code == 3, cli.text
    assert f"no space left on {small_disk}" in cli.err and "hint:" in cli.err and "Traceback" not in cli.err
    assert not target.exists() and not list(small_disk.glob(".schema.json*"))  # no temp file left

    # an OSError(ENOSPC) that escapes any command (here a raw write) gets the same treatment
    script = tmp_path / "raw_write.py"
    script.write_text(
        "import sys\n"
        "from zoo.cli import main as cli\n\n"
        "@cli.app.command('raw-write')\n"
        "def raw_write(path: str) -> None:\n"
        "    with open(path, 'wb') as f:\n"
        "        f.write(b'x' * (8 << 20))\n\n"
        "sys.argv = ['zoo', 'raw-write', sys.argv[1]]\n"
        "cli.main()\n")
    raw = subprocess.run([sys.executable, str(script), str(small_disk / "raw.bin")], capture_output=True, text=True)
    assert raw.returncode == 3, raw.stderr
    assert f"no space left on {small_disk / 'raw.bin'}" in raw.stderr and "Traceback" not in raw.stderr
