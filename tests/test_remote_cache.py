"""`zoo run` with a remote run cache, as users run it (the CLI in subprocesses), with the test kinds:
two machines (each its own ZOO_CACHE_DIR and ZOO_HOME) sharing a remote; a tampered object; an
unreachable remote; a process killed between a push's objects and its entry; where the setting
comes from; `zoo cache push | pull | status`; on a folder, S3 (moto), GCS (fake-gcs-server), Azure
Blob (azurite) and WebDAV (wsgidav). The lenet-digits run through S3 is in
test_remote_cache_lenet.py; the store contract on every backend in test_cache_store_contract.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli_helpers import table_rows, write_recipe, zoo as zoo_cli
from remote_fixtures import Backend
from zoo.engine.cache import Cache

RECIPE = """\
schema_version: 1
name: shared
version: 0.1.0
stages:
  a: {kind: writer, config: {text: "abc", repeat: 2000}}
  b: {kind: writer, config: {text: "xyz"}}
  c: {kind: concat, needs: [a, b]}
"""


def _machine(tmp_path: Path, name: str) -> dict[str, str]:
    return {"ZOO_CACHE_DIR": str(tmp_path / name / "cache"), "ZOO_HOME": str(tmp_path / name / "home")}


def _user_config(env: dict, remote: Backend | str, **extra) -> None:
    """$ZOO_HOME/config.yaml naming the remote run cache."""
    home = Path(env["ZOO_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    url, options = (remote, {}) if isinstance(remote, str) else (remote.url, remote.options)
    cache = {"remote": url, "options": options, **extra}
    (home / "config.yaml").write_text(json.dumps({"schema_version": 1, "cache": cache}))


def _run(recipe: Path, env: dict, *args: str) -> tuple[int, dict, str]:
    cli = zoo_cli("run", recipe, "--json", *args, env=env)
    assert cli.out, cli.err
    return cli.code, json.loads(cli.out), cli.err


def _recipe(tmp_path: Path, folder: str = "project") -> Path:
    (tmp_path / folder).mkdir(parents=True, exist_ok=True)
    return write_recipe(tmp_path / folder, RECIPE)


@pytest.fixture(params=["folder", "s3", "gcs", "azure", "webdav", "ssh"])
def remote(request, tmp_path, monkeypatch) -> Backend:
    return Backend(request.param, request, tmp_path, monkeypatch)


def test_machine_b_takes_every_stage_from_the_remote_and_runs_nothing(tmp_path, remote):
    recipe = _recipe(tmp_path)
    a, b = _machine(tmp_path, "a"), _machine(tmp_path, "b")
    _user_config(a, remote)
    _user_config(b, remote)
    code, ran, _ = _run(recipe, a)
    assert code == 0 and {s["state"] for s in ran["stages"]} == {"done"}
    assert ran["cache_remote"] == remote.url and ran["notes"] == []
    recipe.with_suffix(".lock").unlink()  # machine B has no lockfile of A's either
    code, got, _ = _run(recipe, b)
    assert code == 0, got
    assert {s["state"] for s in got["stages"]} == {"cached"}
    assert all(s["reasons"] == [f"cached: from the remote cache {remote.url}"] for s in got["stages"])
    assert {s["id"]: s["outputs"] for s in got["stages"]} == {s["id"]: s["outputs"] for s in ran["stages"]}
    ca, cb = Cache(Path(a["ZOO_CACHE_DIR"])), Cache(Path(b["ZOO_CACHE_DIR"]))
    for stage in got["stages"]:
        ea, eb = ca.lookup(stage["key"]), cb.lookup(stage["key"])
        assert eb is not None
        for rel in ea.files:
            assert (cb.materialize(eb) / rel).read_bytes() == (ca.materialize(ea) / rel).read_bytes()
        # the log B prints is there, with what A's stage wrote
        assert stage["log"] == str(cb.log_path(stage["key"]))
        assert Path(stage["log"]).read_bytes() == ca.log_path(stage["key"]).read_bytes()
    assert "writer wrote data.txt" in Path(got["stages"][0]["log"]).read_text()


def test_plan_and_status_on_machine_b_see_what_the_remote_holds_without_downloading(tmp_path, remote):
    recipe = _recipe(tmp_path)
    a, b = _machine(tmp_path, "a"), _machine(tmp_path, "b")
    _user_config(a, remote)
    _user_config(b, remote)
    assert _run(recipe, a)[0] == 0
    recipe.with_suffix(".lock").unlink()
    plan = zoo_cli("plan", recipe, "--json", env=b)
    assert plan.code == 0, plan.text
    got = json.loads(plan.out)
    assert {s["state"] for s in got["stages"]} == {"cached"}  # c's key follows from a's and b's remote entries
    assert all(s["reasons"] == [f"cached: on the remote cache {remote.url}"] for s in got["stages"])
    assert got["cache_remote"] == remote.url and got["notes"] == []
    cache_b = Path(b["ZOO_CACHE_DIR"])
    assert not (cache_b / "objects").exists() or not any((cache_b / "objects").rglob("*.*"))  # nothing downloaded
    status = zoo_cli("status", recipe, env=b)
    assert status.code == 0 and "Everything is up to date." in status.out, status.text
    local_only = json.loads(zoo_cli("plan", recipe, "--json", "--cache-remote", "none", env=b).out)
    assert {s["state"] for s in local_only["stages"]} != {"cached"}
    if remote.kind == "folder":
        return  # a folder cannot be unreachable; the servers below can
    url, options = remote.dead_options()
    (Path(b["ZOO_HOME"]) / "config.yaml").write_text(
        json.dumps({"schema_version": 1, "cache": {"remote": url, "options": options}}))
    offline = zoo_cli("plan", recipe, "--json", env=b)
    assert offline.code == 0 and "note:" not in offline.err, offline.text  # a client library may still log
    assert any(n.startswith("remote cache") for n in json.loads(offline.out)["notes"]), offline.out
    assert json.loads(offline.out)["stages"][0]["state"] != "cached"


def test_a_tampered_remote_object_fails_with_exit_4_and_installs_nothing(tmp_path, remote):
    recipe = _recipe(tmp_path)
    a, b = _machine(tmp_path, "a"), _machine(tmp_path, "b")
    code, ran, _ = _run(recipe, a, "--cache-remote", "none")
    assert code == 0
    _user_config(a, remote)
    push = zoo_cli("cache", "push", "--json", env=a)
    assert push.code == 0 and json.loads(push.out)["entries"] == 3, push.text
    key_a = next(s["key"] for s in ran["stages"] if s["id"] == "a")
    doc = json.loads(zoo_cli("cache", "status", "--json", env=a).out)
    assert doc["remote_entries"] == 3
    entry_a = Cache(Path(a["ZOO_CACHE_DIR"])).lookup(key_a)
    remote_doc = _remote_entry(remote, key_a)
    sha = remote_doc["sha256"][entry_a.files["data.txt"]["digest"]]
    remote.flip(f"objects/sha256/{sha[:2]}/{sha}")
    _user_config(b, remote)
    code, got, err = _run(recipe, b)
    assert code == 4, (got, err)
    stages = {s["id"]: s for s in got["stages"]}
    assert stages["a"]["state"] == "failed" and stages["a"]["error"]["type"] == "IntegrityError"
    assert "checksum mismatch" in stages["a"]["error"]["message"]
    assert stages["c"]["state"] == "skipped"
    cb = Cache(Path(b["ZOO_CACHE_DIR"]))
    assert cb.read_entry(key_a) is None and not cb.object_path(entry_a.files["data.txt"]["digest"]).exists()
    # the stage was not run either: nothing of it is in B's cache
    assert not (cb.root / "logs" / f"{key_a}.log").exists()


def _pushed_from_a(tmp_path: Path) -> tuple[Path, dict, dict, dict, Path]:
    """Machine A runs the recipe with a folder remote run cache; (recipe, A's env, B's env (same
    remote), A's run report, the remote folder)."""
    recipe = _recipe(tmp_path)
    folder = tmp_path / "remote"
    a, b = _machine(tmp_path, "a"), _machine(tmp_path, "b")
    _user_config(a, str(folder))
    _user_config(b, str(folder))
    code, ran, err = _run(recipe, a)
    assert code == 0, err
    recipe.with_suffix(".lock").unlink()
    return recipe, a, b, ran, folder


def _remote_doc_path(folder: Path, key: str) -> Path:
    return folder / "entries" / key[:2] / f"{key}.json"


def test_a_pushed_entry_names_its_log_as_a_content_addressed_object(tmp_path):
    import hashlib

    _, a, _, ran, folder = _pushed_from_a(tmp_path)
    for stage in ran["stages"]:
        doc = json.loads(_remote_doc_path(folder, stage["key"]).read_text())
        log = Path(stage["log"]).read_bytes()
        assert doc["schema_version"] == 1
        assert doc["log"] == {"sha256": hashlib.sha256(log).hexdigest(), "size": len(log)}
        sha = doc["log"]["sha256"]
        assert (folder / "objects" / "sha256" / sha[:2] / sha).read_bytes() == log


def test_an_entry_without_a_log_still_installs_its_outputs(tmp_path):
    """Entries pushed by older zoos name no log: B takes the stage, quietly without a log."""
    recipe, _, b, ran, folder = _pushed_from_a(tmp_path)
    for stage in ran["stages"]:
        path = _remote_doc_path(folder, stage["key"])
        doc = json.loads(path.read_text())
        del doc["log"]
        path.chmod(0o644)
        path.write_text(json.dumps(doc))
    code, got, err = _run(recipe, b)
    assert code == 0 and {s["state"] for s in got["stages"]} == {"cached"} and got["notes"] == [], err
    assert not any(Path(s["log"]).exists() for s in got["stages"])


def test_a_tampered_log_is_not_installed_and_the_stage_is_still_taken_with_a_note(tmp_path):
    recipe, _, b, ran, folder = _pushed_from_a(tmp_path)
    first = ran["stages"][0]
    sha = json.loads(_remote_doc_path(folder, first["key"]).read_text())["log"]["sha256"]
    obj = folder / "objects" / "sha256" / sha[:2] / sha
    obj.chmod(0o644)
    obj.write_bytes(obj.read_bytes()[:-1] + b"!")
    code, got, err = _run(recipe, b)
    assert code == 0 and {s["state"] for s in got["stages"]} == {"cached"}, err
    stages = {s["id"]: s for s in got["stages"]}
    assert not Path(stages[first["id"]]["log"]).exists()
    assert all(Path(s["log"]).exists() for s in got["stages"] if s["id"] != first["id"])
    assert [n for n in got["notes"] if "without its log" in n and f"stage {first['id']}" in n], got["notes"]


def test_a_malformed_log_reference_is_an_integrity_error():
    from zoo.engine.remote_cache import parse_log_ref
    from zoo.errors import IntegrityError

    assert parse_log_ref(b'{"schema_version": 1}', "k" * 64, "u") is None
    assert parse_log_ref(json.dumps({"log": {"sha256": "a" * 64, "size": 3}}).encode(), "k" * 64, "u") == \
        {"sha256": "a" * 64, "size": 3}
    for bad in ({"sha256": "a" * 63, "size": 3}, {"sha256": "A" * 64, "size": 3}, {"sha256": "a" * 64, "size": -1},
                {"sha256": "a" * 64, "size": True}, {"sha256": "a" * 64}, "a" * 64):
        with pytest.raises(IntegrityError, match="malformed log"):
            parse_log_ref(json.dumps({"log": bad}).encode(), "k" * 64, "u")


def _remote_entry(remote: Backend, key: str) -> dict:
    from zoo.engine.cache_store import FsCacheStore

    return json.loads(FsCacheStore(remote.url, remote.options).read_entry(key))


@pytest.mark.parametrize("remote", ["s3", "gcs", "azure", "webdav", "ssh"], indirect=True)
def test_an_unreachable_remote_degrades_to_a_local_run_with_a_note(tmp_path, remote):
    recipe = _recipe(tmp_path)
    env = _machine(tmp_path, "a")
    url, options = remote.dead_options()
    home = Path(env["ZOO_HOME"])
    home.mkdir(parents=True)
    (home / "config.yaml").write_text(json.dumps({"schema_version": 1, "cache": {"remote": url, "options": options}}))
    code, got, err = _run(recipe, env)
    assert code == 0, (got, err)
    assert {s["state"] for s in got["stages"]} == {"done"}
    assert len(got["notes"]) == 1 and "is unreachable" in got["notes"][0] and url in got["notes"][0]
    assert "local cache only" in got["notes"][0]
    assert "note:" not in err  # --json: the note is in the document (a client library may still log)


KILLER = """\
import os, signal, sys
from zoo.engine.cache_store import FsCacheStore

def killed(self, key, data):  # the process dies after the stage's objects were uploaded
    os.kill(os.getpid(), signal.SIGKILL)

FsCacheStore.create_entry = killed
sys.argv = ["zoo", "run", sys.argv[1], "--cache-remote", sys.argv[2]]
from zoo.entry import main
main()
"""


def test_a_run_killed_between_objects_and_entry_leaves_no_hit_stand_in_kill(tmp_path):
    """Stand-in: the store's create_entry is replaced by a SIGKILL of the running `zoo run`, so
    the process dies at exactly the instant between a push's objects and its entry."""
    recipe = _recipe(tmp_path)
    remote = tmp_path / "remote"
    proc = subprocess.run([sys.executable, "-c", KILLER, str(recipe), str(remote)], capture_output=True, text=True,
                          env={**os.environ, **_machine(tmp_path, "a")})
    assert proc.returncode == -9, proc.stdout + proc.stderr
    assert any((remote / "objects").rglob("*")), "the objects were uploaded before the kill"
    assert not (remote / "entries").exists() or not any(p.is_file() for p in (remote / "entries").rglob("*"))
    code, got, _ = _run(recipe, _machine(tmp_path, "b"), "--cache-remote", str(remote))
    assert code == 0 and {s["state"] for s in got["stages"]} == {"done"}  # no false hit: B ran them


FETCH_ORDER = """\
import json, sys
from zoo.engine.remote_cache import RemoteCache

log = sys.argv[2]
real_begin, real_finish = RemoteCache.begin, RemoteCache.finish

def note(event, key):  # as it happens: zoo exits without running atexit hooks
    with open(log, "a") as f:
        f.write(json.dumps([event, key]) + "\\n")

def begin(self, key):
    note("begin", key)
    return real_begin(self, key)

def finish(self, pending):
    got = real_finish(self, pending)
    note("finish", pending.key)
    return got

RemoteCache.begin, RemoteCache.finish = begin, finish
sys.argv = ["zoo", "run", sys.argv[1], "--json"]
from zoo.entry import main
main()
"""


def test_the_fetches_of_remote_hits_overlap_and_each_stage_says_it_came_from_the_remote(tmp_path):
    """B begins every stage's fetch (its entry read, its objects downloading) before waiting for the
    first: a stage's key needs only its upstream's entry, not its bytes."""
    recipe, _, b, ran, folder = _pushed_from_a(tmp_path)
    log = tmp_path / "fetches.json"
    proc = subprocess.run([sys.executable, "-c", FETCH_ORDER, str(recipe), str(log)], capture_output=True, text=True,
                          env={**os.environ, **b}, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = json.loads(proc.stdout)
    assert {s["state"] for s in got["stages"]} == {"cached"}
    assert all(s["reasons"] == [f"cached: from the remote cache {folder}"] for s in got["stages"]), got
    events = [json.loads(line) for line in log.read_text().splitlines()]
    keys = {s["key"] for s in ran["stages"]}
    assert [e for e, _ in events] == ["begin"] * 3 + ["finish"] * 3, events
    assert {k for _, k in events} == keys  # each stage fetched once, under A's key
    for stage in got["stages"]:  # installed: a rerun is a plain local hit
        assert Cache(Path(b["ZOO_CACHE_DIR"])).lookup(stage["key"]) is not None


def test_the_flag_wins_then_the_project_config_then_the_user_config(tmp_path):
    recipe = _recipe(tmp_path, "project/recipes")
    env = _machine(tmp_path, "a")
    user, project, flag = tmp_path / "user-remote", tmp_path / "project-remote", tmp_path / "flag-remote"
    _user_config(env, str(user))
    assert _run(recipe, env)[1]["cache_remote"] == str(user)
    config = tmp_path / "project" / ".zoo" / "config.yaml"  # the nearest folder above the recipe's
    config.parent.mkdir()
    config.write_text(f"schema_version: 1\ncache:\n  remote: {project}\n")
    assert _run(recipe, env, "-f")[1]["cache_remote"] == str(project)
    assert _run(recipe, env, "-f", "--cache-remote", str(flag))[1]["cache_remote"] == str(flag)
    assert _run(recipe, env, "-f", "--cache-remote", "none")[1]["cache_remote"] is None
    config.write_text("schema_version: 1\ncache:\n  remote: none\n")  # the project switches the user's off
    assert _run(recipe, env, "-f")[1]["cache_remote"] is None
    config.write_text("schema_version: 3\ncache: {remote: /x}\n")  # 2 adds `signing:` (zoo.registry.zoo_config)
    bad = zoo_cli("run", recipe, "-f", env=env)
    assert bad.code == 2 and "schema_version 3 is not supported" in bad.err
    config.write_text(f"schema_version: 1\ncache: {{remote: {project}, options: {{password: x}}}}\n")
    bad = zoo_cli("run", recipe, "-f", env=env)
    assert bad.code == 2 and "never stores credentials" in bad.err


def test_push_false_reads_the_remote_but_never_writes_it(tmp_path):
    recipe = _recipe(tmp_path)
    env = _machine(tmp_path, "a")
    remote = tmp_path / "remote"
    _user_config(env, str(remote), push=False)
    code, got, _ = _run(recipe, env)
    assert code == 0 and got["cache_remote"] == str(remote)
    assert not remote.exists()


def test_a_named_zoo_remote_keeps_its_run_cache_in_its_run_cache_folder(tmp_path):
    recipe = _recipe(tmp_path)
    env = _machine(tmp_path, "a")
    assert zoo_cli("remote", "add", "team", str(tmp_path / "team"), env=env).code == 0
    code, got, _ = _run(recipe, env, "--cache-remote", "team")
    assert code == 0 and got["cache_remote"] == str(tmp_path / "team" / "run-cache")
    assert len(list((tmp_path / "team" / "run-cache" / "entries").rglob("*.json"))) == 3


def test_cache_status_push_and_pull_move_entries_between_machines(tmp_path):
    recipe = _recipe(tmp_path)
    a, b = _machine(tmp_path, "a"), _machine(tmp_path, "b")
    remote = str(tmp_path / "remote")
    assert _run(recipe, a, "--cache-remote", "none")[0] == 0
    before = zoo_cli("cache", "status", recipe, "--remote", remote, env=a)
    assert before.code == 0, before.text
    rows = {r[1]: r for r in table_rows(before.out)[1:]}
    assert set(rows) == {"a", "b", "c"} and all(r[3] == "yes" and r[4] == "no" for r in rows.values())
    pushed = zoo_cli("cache", "push", recipe, "--remote", remote, "--json", env=a)
    assert pushed.code == 0 and json.loads(pushed.out)["entries"] == 3, pushed.text
    again = json.loads(zoo_cli("cache", "push", "--remote", remote, "--json", env=a).out)
    assert again["entries"] == 0 and again["already"] == 3
    on_b = json.loads(zoo_cli("cache", "status", recipe, "--remote", remote, "--json", env=b).out)
    assert [(s["stage"], s["local"], s["remote"]) for s in on_b["stages"]] == \
        [("a", False, True), ("b", False, True), ("c", False, True)]  # keys known from the remote's entries
    pulled = zoo_cli("cache", "pull", recipe, "--remote", remote, "--json", env=b)
    assert pulled.code == 0 and json.loads(pulled.out)["pulled"] == 3, pulled.text
    code, got, _ = _run(recipe, b, "--cache-remote", "none")
    assert code == 0 and {s["state"] for s in got["stages"]} == {"cached"}
    counts = json.loads(zoo_cli("cache", "status", "--remote", remote, "--json", env=b).out)
    assert (counts["local"], counts["remote_entries"], counts["both"]) == (3, 3, 3)


def test_cache_commands_without_a_remote_say_how_to_set_one(tmp_path):
    cli = zoo_cli("cache", "status", env=_machine(tmp_path, "a"), cwd=tmp_path)
    assert cli.code == 2 and "no remote run cache is set" in cli.err and "--remote" in cli.err


@pytest.mark.parametrize("url", ["s3://nowhere/cache", "gs://nowhere/cache", "az://nowhere/cache"])
def test_a_cached_run_with_a_remote_set_contacts_nothing_and_imports_nothing_heavy(tmp_path, url):
    """Every stage a local hit: the remote (a URL nothing serves) is never opened, so neither its
    driver nor torch, onnx, onnxruntime are imported (the full path: a flag)."""
    recipe = _recipe(tmp_path)
    env = _machine(tmp_path, "a")
    assert _run(recipe, env, "--cache-remote", "none")[0] == 0
    code = ("import sys\nsys.argv = ['zoo', 'run', sys.argv[1], '--cache-remote', sys.argv[2], '--json']\n"
            "from zoo.entry import main\ntry:\n    main()\nexcept SystemExit as e:\n    print('EXIT', e.code, file=sys.stderr)\n"
            "heavy = ('torch', 'onnx', 'onnxruntime', 'boto3', 'botocore', 's3fs', 'gcsfs', 'google.cloud', 'adlfs',\n"
            "         'azure', 'dvc', 'paramiko')\n"
            "print('HEAVY', [m for m in heavy if m in sys.modules], file=sys.stderr)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(recipe), url], capture_output=True, text=True,
                          env={**os.environ, **env})
    assert "EXIT 0" in proc.stderr and "HEAVY []" in proc.stderr, proc.stderr
    result = json.loads(proc.stdout)
    assert {s["state"] for s in result["stages"]} == {"cached"} and result["notes"] == []
