"""The model zoo against hostile timing and input (issue #32): blobs freed while a publish is
about to name them, `latest` after a killed publish, names that end in a newline, symlinks out of
a folder remote, messages for a full disk and a cut-off push, concurrent pulls of one build."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from cli_helpers import zoo

from zoo.registry.store import LocalZoo
from registry_servers import make_staging, tiny_onnx


def _publish(tmp_path: Path, version: str = "1.0.0", **kw) -> LocalZoo:
    z = LocalZoo()  # ZOO_HOME from conftest: the one the subprocesses see
    z.publish(make_staging(tmp_path / f"s-{version}", version=version, **kw))
    return z


# ---- 0. a blob is never freed between being stored and being named ----------------------------
@pytest.mark.parametrize("freer", ["rm", "gc"])
def test_a_blob_is_not_freed_while_a_publish_is_about_to_name_it_stand_in_hook_before_commit(tmp_path, freer):
    """Two zoo objects on one root. The publisher's file is already stored (named by 1.0.0, which
    `zoo rm` removes; or unreferenced and old, which `zoo gc` removes), so the publish keeps the
    blob as it is. A stand-in hook holds the publish just before it commits its manifest, while
    the other zoo frees blobs; the freer must wait for the commit, and the new version must not
    name a deleted blob."""
    publisher = LocalZoo()
    freeing = LocalZoo(publisher.root)
    if freer == "rm":
        publisher.publish(make_staging(tmp_path / "s-old", version="1.0.0"))
    staging = make_staging(tmp_path / "s-new", version="1.1.0")
    sha = json.loads((staging / "zoo-manifest.json").read_text())["builds"]["cpu-fp32"]["file"]["sha256"]
    if freer == "gc":  # an unreferenced blob, as an interrupted publish leaves it
        publisher.blobs.add(staging / "builds/cpu-fp32/model.onnx", sha,
                            (staging / "builds/cpu-fp32/model.onnx").stat().st_size, "leftover")
    assert publisher.blobs.present(sha)

    at_commit, freer_done = threading.Event(), threading.Event()
    real_commit = publisher._commit

    def held_commit(manifest):  # the stand-in hook: the publish pauses before its manifest
        at_commit.set()
        freer_done.wait(timeout=3)  # without the lock the freer finishes well within this
        return real_commit(manifest)

    publisher._commit = held_commit
    errors: list[BaseException] = []

    def run(fn):
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(e)

    pub = threading.Thread(target=run, args=(lambda: publisher.publish(staging),))
    pub.start()
    assert at_commit.wait(timeout=60)
    if freer == "rm":
        free = threading.Thread(target=run, args=(lambda: (freeing.remove("tiny", "1.0.0"), freer_done.set()),))
    else:
        free = threading.Thread(target=run, args=(lambda: (freeing.gc(grace_s=0), freer_done.set()),))
    free.start()
    pub.join(timeout=120)
    free.join(timeout=120)
    assert not errors, errors
    assert publisher.blobs.has(sha), "the new version names a blob that was freed"
    r = zoo("pull", "tiny@1.1.0")
    assert r.code == 0, r.text
    assert zoo("fsck").code == 0


# ---- 10. `latest` after a publish killed between its manifest and its index ----------------------
KILLED_PUBLISH = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    from zoo.registry import index
    from zoo.registry.store import LocalZoo
    def die(*a, **k):
        os.kill(os.getpid(), signal.SIGKILL)  # a real kill, after the manifest, before the index and `latest`
    index.Index.add = die
    LocalZoo().publish(Path(sys.argv[1]))
""")


def _killed_publish(staging: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", KILLED_PUBLISH, str(staging)], capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr


@pytest.mark.parametrize("before", [None, "1.0.0"])
def test_latest_after_a_publish_killed_then_repeated_kill_9_before_the_index(tmp_path, before):
    if before:
        _publish(tmp_path, before)
    staging = make_staging(tmp_path / "s-1.0.1", version="1.0.1", scale=3.0)
    _killed_publish(staging)
    assert zoo("list", "tiny", "--json").code == 0  # a reader catches the index up
    LocalZoo().publish(staging)  # the same content again
    r = zoo("show", "tiny", "--json")
    assert r.code == 0, r.text
    assert json.loads(r.out)["version"] == "1.0.1", r.out
    r = zoo("pull", "tiny", "--json")
    assert r.code == 0, r.text
    assert json.loads(r.out)["version"] == "1.0.1", r.out
    assert zoo("fsck").code == 0


def test_latest_after_a_killed_publish_no_reader_in_between_kill_9(tmp_path):
    _publish(tmp_path, "1.0.0")
    _killed_publish(make_staging(tmp_path / "s-1.0.1", version="1.0.1", scale=3.0))
    r = zoo("pull", "tiny", "--json")  # the first command after the kill
    assert r.code == 0, r.text
    assert json.loads(r.out)["version"] == "1.0.1", r.out


def test_fsck_reports_and_repairs_a_latest_behind_the_newest_release(tmp_path):
    """A zoo where `latest` stayed behind (as a killed publish left it with an earlier zoo, whose
    index catch-up did not move it): fsck names it, --repair moves it, pull serves the newest."""
    z = _publish(tmp_path, "1.0.0")
    _publish(tmp_path, "1.0.1", scale=3.0)
    (z.model_dir("tiny") / "tags" / "latest").write_text("1.0.0\n")
    z.reindex()
    r = zoo("fsck")
    assert r.code == 4, r.text
    assert "tiny@latest points at 1.0.0; the newest release is 1.0.1" in r.out, r.text
    r = zoo("fsck", "--repair")
    assert r.code == 0, r.text
    assert json.loads(zoo("pull", "tiny", "--json").out)["version"] == "1.0.1"
    assert zoo("fsck").code == 0


# ---- 11a. a name that ends in a newline is not a name ------------------------------------------
def test_a_tag_ending_in_a_newline_is_refused(tmp_path):
    z = _publish(tmp_path)
    r = zoo("tag", "tiny@1.0.0", "prod\n")
    assert r.code == 2 and "invalid tag 'prod\\n'" in r.err and "Traceback" not in r.err, r.text
    assert not (z.model_dir("tiny") / "tags").exists() or \
        sorted(p.name for p in (z.model_dir("tiny") / "tags").iterdir()) == ["latest"]


def test_a_remote_name_ending_in_a_newline_is_refused(tmp_path):
    r = zoo("remote", "add", "team\n", tmp_path / "remote")
    assert r.code == 2 and "invalid remote name 'team\\n'" in r.err, r.text
    assert json.loads(zoo("remote", "list", "--json").out) == [] or "team" not in zoo("remote", "list").out


def test_a_pushed_tag_ending_in_a_newline_is_refused(tmp_path):
    _publish(tmp_path)
    assert zoo("remote", "add", "team", tmp_path / "remote").code == 0
    r = zoo("push", "tiny@1.0.0", "--to", "team", "--tag", "prod\n")
    assert r.code == 2 and "invalid tag 'prod\\n'" in r.err, r.text
    assert not [p for p in (tmp_path / "remote").rglob("*") if "\n" in p.name]


@pytest.mark.parametrize("option,value,says", [("--name", "imported\n", "invalid model name 'imported\\n'"),
                                                ("--version", "1.0.0\n", "invalid version '1.0.0\\n'")])
def test_an_imported_name_or_version_ending_in_a_newline_is_refused(tmp_path, option, value, says):
    model = tiny_onnx(tmp_path / "m.onnx")
    r = zoo("import", model, option, value)
    assert r.code == 2 and says in r.err and "Traceback" not in r.err, r.text
    assert json.loads(zoo("list", "--json").out) == []


def test_a_recipe_stage_id_ending_in_a_newline_is_refused(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text('schema_version: 1\nname: r\nversion: 0.1.0\nstages:\n  "a\\n": {kind: writer, config: {text: x}}\n')
    r = zoo("validate", recipe)
    assert r.code == 2 and "Traceback" not in r.err, r.text


# ---- 5. a folder remote's symbolic links never take a write (or a read) outside it ----------------
def _links_out(folder: Path, outside: Path) -> None:
    """Every two-hex-digit fan-out folder under `folder` a symbolic link to a folder of `outside`."""
    folder.mkdir(parents=True)
    for i in range(256):
        (outside / f"{i:02x}").mkdir(parents=True)
        os.symlink(outside / f"{i:02x}", folder / f"{i:02x}")


def test_push_to_a_folder_remote_refuses_a_symlinked_blob_folder(tmp_path):
    _publish(tmp_path)
    remote, outside = tmp_path / "remote", tmp_path / "outside"
    _links_out(remote / "blobs" / "sha256", outside)
    assert zoo("remote", "add", "team", remote).code == 0
    r = zoo("push", "tiny@1.0.0", "--to", "team")
    assert r.code == 4, r.text
    assert "resolves outside the folder of remote" in r.err and str(remote / "blobs" / "sha256") in r.err, r.text
    assert "Traceback" not in r.err
    assert not [p for p in outside.rglob("*") if p.is_file()]  # nothing written outside
    assert not (remote / "models").exists()  # and no version named blobs it could not store


def test_pull_from_a_folder_remote_refuses_a_symlinked_blob_folder(tmp_path):
    _publish(tmp_path)
    remote, outside = tmp_path / "remote", tmp_path / "outside"
    assert zoo("remote", "add", "team", remote).code == 0
    assert zoo("push", "tiny@1.0.0", "--to", "team").code == 0
    outside.mkdir()
    for d in sorted((remote / "blobs" / "sha256").iterdir()):  # the blobs moved out, links left in their place
        d.rename(outside / d.name)
        os.symlink(outside / d.name, d)
    other = {"ZOO_HOME": str(tmp_path / "other")}
    assert zoo("remote", "add", "team", remote, env=other).code == 0
    r = zoo("pull", "tiny@1.0.0", env=other)
    assert r.code == 4 and "resolves outside the folder of remote" in r.err, r.text


def test_cache_push_to_a_folder_remote_refuses_a_symlinked_object_folder(tmp_path):
    from cli_helpers import write_recipe

    recipe = tmp_path / "project"
    recipe.mkdir()
    recipe = write_recipe(recipe, "schema_version: 1\nname: shared\nversion: 0.1.0\nstages:\n"
                                  "  a: {kind: writer, config: {text: abc}}\n  b: {kind: writer, config: {text: xyz}}\n")
    remote, outside = tmp_path / "remote", tmp_path / "outside"
    _links_out(remote / "objects" / "sha256", outside)
    assert zoo("run", recipe, "--cache-remote", "none").code == 0
    r = zoo("cache", "push", recipe, "--remote", remote)
    assert r.code == 4, r.text
    assert "resolves outside the folder of remote" in r.err and "Traceback" not in r.err, r.text
    assert not [p for p in outside.rglob("*") if p.is_file()]


# ---- 12. messages: a full zoo disk during publish, a push cut off by an outage -------------------
def test_a_full_zoo_home_during_publish_names_the_zoo_and_its_remedy(tmp_path, tmpfs):
    from cli_helpers import write_recipe

    disk = tmpfs("1m")
    home = disk / "zoo"
    recipe = write_recipe(tmp_path, "schema_version: 1\nname: full\nversion: 0.1.0\nstages:\n"
                                    '  a: {kind: writer, config: {text: "abcdefgh", repeat: 300000}}\n'
                                    "  ship: {kind: shipper, needs: [a]}\n")
    r = zoo("run", recipe, env={"ZOO_HOME": str(home), "ZOO_CACHE_DIR": str(tmp_path / "cache")})
    assert r.code == 3, r.text
    message = next(line for line in r.err.splitlines() if line.startswith("stage ship failed:"))
    assert f"no space left on {disk}, the disk of the local zoo {home}" in message, r.err
    assert str(tmp_path / "cache") not in message
    hint = next(line for line in r.err.splitlines() if line.startswith("hint:"))
    assert "zoo rm NAME@VERSION" in hint and "ZOO_HOME" in hint and "run-cache" not in hint, r.err
    assert not list(home.glob("models/*/versions/*/zoo-manifest.json"))  # nothing half-published


class Cable:
    """A TCP cable between zoo and a real server on 127.0.0.1 that is pulled (every connection
    closed, the port closed: the next request is refused) when a request holding every string of
    `at` comes by: before it reaches the server, or (`after`) at the first request zoo sends once
    that request's whole answer has come back (so zoo has read the answer: pulling the cable right
    after forwarding it could lose the answer in flight on a loaded host)."""

    def __init__(self, upstream_port: int, at: tuple[bytes, ...], after: bool):
        import socket

        self.upstream, self.at, self.after = upstream_port, at, after
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.cut = threading.Event()
        self.answered = threading.Event()  # `after`: the watched request's whole answer went back
        self.socks: list = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket

        while not self.cut.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.upstream))
            self.socks += [client, server]
            answer = {"watch": False, "bytes": b""}
            threading.Thread(target=self._pipe, args=(client, server, True, answer), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, False, answer), daemon=True).start()

    def _pipe(self, src, dst, upstream: bool, answer: dict) -> None:
        try:
            while not self.cut.is_set():
                data = src.recv(65536)
                if not data:
                    return
                if upstream and self.answered.is_set():
                    return self.pull()
                if upstream and all(s in data for s in self.at):
                    if not self.after:
                        return self.pull()
                    answer["watch"] = True
                if not upstream and answer["watch"]:
                    answer["bytes"] += data
                    if _whole_answer(answer["bytes"]):
                        self.answered.set()  # before zoo can have it: its next request is cut
                dst.sendall(data)
        except OSError:
            return

    def pull(self) -> None:
        import socket

        self.cut.set()
        for s in [self.listener, *self.socks]:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


def _whole_answer(data: bytes) -> bool:
    """Whether `data` holds an HTTP response's head and its whole body (by Content-Length)."""
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        return False
    length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    return len(body) >= (int(length.group(1)) if length else 0)


@pytest.mark.parametrize("cut", ["before-the-manifest", "after-the-manifest"])
def test_a_push_cut_off_by_an_outage_says_whether_the_version_is_visible_and_how_to_finish(tmp_path, cut, dav):
    base, _ = dav
    url = f"webdav+{base}/{os.urandom(5).hex()}"
    options = ["-o", "user=zoo", "-o", "password_env=TEST_DAV_PASSWORD"]
    env = {"TEST_DAV_PASSWORD": "dav-secret"}
    _publish(tmp_path)
    # blobs go up (PUT) before the manifest, which is created by a MOVE of its temporary file onto
    # models/tiny/versions/1.0.0.json (the create-exclusive step that makes the version visible)
    after = cut == "after-the-manifest"
    at = (b"MOVE ", b"/versions/1.0.0.json") if after else (b"PUT ", b"/blobs/sha256/")
    cable = Cable(int(base.rsplit(":", 1)[1]), at, after)
    cut_url = url.replace(base, f"http://127.0.0.1:{cable.port}")
    assert zoo("remote", "add", "team", cut_url, *options, env=env).code == 0
    r = zoo("push", "tiny@1.0.0", "--to", "team", env=env)
    assert cable.cut.is_set()
    assert r.code == 3, r.text
    assert "--offline" not in r.err and "Traceback" not in r.err, r.err
    assert "push of tiny@1.0.0 to remote team was cut off" in r.err, r.err
    visible = "is already visible on remote team" if after else "is not visible on remote team yet"
    assert visible in r.err and "Run `zoo push tiny@1.0.0 --to team` again" in r.err, r.err
    # the server never went away: through a cable that works, the same push finishes it
    assert zoo("remote", "add", "team", url, *options, "--replace", env=env).code == 0
    shown = zoo("show", "tiny@1.0.0", "--remote", "team", "--json", env=env)
    assert (shown.code == 0) == after, shown.text
    again = zoo("push", "tiny@1.0.0", "--to", "team", env=env)
    assert again.code == 0, again.text
    listed = json.loads(zoo("list", "--remote", "team", "--json", env=env).out)
    assert [(m["name"], m["latest"]) for m in listed] == [("tiny", "1.0.0")], listed


# ---- 13. concurrent pulls of one build download it once ------------------------------------------
PULLS = 4


@pytest.fixture
def counting_site(tmp_path):
    """A folder remote served read-only over plain HTTP by wsgidav (as the `http` remote kind),
    counting the GETs of each path. A GET of a blob is answered once every pull has asked for it,
    or 3 s after every pull has read the manifest: so a pull that would download the blob itself
    has asked for it before any download of it finishes."""
    import collections
    import time

    from wsgidav.wsgidav_app import WsgiDAVApp

    from registry_servers import _cheroot

    root = tmp_path / "site"
    root.mkdir()
    dav = WsgiDAVApp({"provider_mapping": {"/": str(root)}, "simple_dc": {"user_mapping": {"*": True}},
                      "http_authenticator": {"domain_controller": None}, "verbose": 0,
                      "logging": {"enable": False, "enable_loggers": []}})
    gets: collections.Counter = collections.Counter()
    manifests_read: dict[str, float] = {}  # blob path -> when its GET saw every manifest read
    lock = threading.Lock()

    def app(environ, start_response):
        path = environ.get("PATH_INFO", "")
        if environ["REQUEST_METHOD"] == "GET":
            with lock:
                gets[path] += 1
            if "/blobs/sha256/" in path:
                give_up = time.monotonic() + 60
                while gets[path] < PULLS and time.monotonic() < give_up:
                    if sum(n for p, n in gets.items() if p.endswith("/versions/1.0.0.json")) >= PULLS:
                        give_up = min(give_up, manifests_read.setdefault(path, time.monotonic()) + 3)
                    time.sleep(0.02)
        return dav(environ, start_response)

    with _cheroot(app) as port:
        yield f"http://127.0.0.1:{port}", root, gets


def test_four_concurrent_pulls_download_the_build_once(tmp_path, counting_site):
    url, root, gets = counting_site
    z = _publish(tmp_path)
    assert zoo("remote", "add", "origin", root).code == 0
    assert zoo("push", "tiny@1.0.0", "--to", "origin").code == 0  # the folder the site serves
    model = z.resolve("tiny@1.0.0").builds["cpu-fp32"].file.sha256
    other = {"ZOO_HOME": str(tmp_path / "other"), "ZOO_CONFIG_DIR": str(tmp_path / "other-config")}  # another user
    assert zoo("remote", "add", "site", url, env=other).code == 0
    env = {**os.environ, **other}
    procs = [subprocess.Popen([sys.executable, "-m", "zoo", "pull", "tiny@1.0.0", "--json"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(PULLS)]
    results = [(p.wait(timeout=300), *p.communicate()) for p in procs]
    assert all(code == 0 for code, _, _ in results), results
    paths = {json.loads(out)["path"] for _, out, _ in results}
    assert len(paths) == 1 and Path(paths.pop()).is_file()
    model_gets = sum(n for p, n in gets.items() if p.endswith(model))
    assert model_gets == 1, dict(gets)  # one download served the four pulls
    assert sum(n for p, n in gets.items() if p.endswith("/versions/1.0.0.json")) >= PULLS
    assert not list((tmp_path / "other/blobs/partial").glob("*"))  # no lock file, no temporary file left
    assert zoo("fsck", env=other).code == 0


def test_gc_removes_the_lock_file_a_killed_download_left_and_keeps_a_held_one(tmp_path):
    import fcntl

    partial = LocalZoo().blobs.partial_dir
    partial.mkdir(parents=True)
    left, held = partial / f"{'a' * 64}.lock", partial / f"{'b' * 64}.lock"
    left.touch()  # a download killed (kill -9) while it held its turn leaves its lock file
    held.touch()
    with open(held) as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # a download in progress
        r = zoo("gc")
        assert r.code == 0, r.text
        assert not left.exists() and held.exists()
