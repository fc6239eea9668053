"""What the SSH/SFTP backend (zoo/storage/backend_ssh.py) adds to the contract suites, against
OpenSSH's sshd on 127.0.0.1 (ssh_server.py): create-exclusive under a real race, uploads that
leave nothing partial, host keys checked (unknown and changed keys refused; the user's and the
system's known_hosts files, read only), ~/.ssh/config host aliases (in a temporary HOME),
credentials refused with a hint, a server that never answers timing out, the URL forms, and the
import discipline.

The store and remote-zoo promises on SSH are in test_cache_store_contract.py and
test_registry_remote_contract.py; `zoo run` A/B through an SSH run cache in test_remote_cache.py."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading

import pytest

from cli_helpers import write_recipe
from zoo.errors import AccessDenied, InvalidInput, SourceUnreachable
from zoo.storage import backend_ssh
from zoo.storage.backend_ssh import SshBackend, resolve_target
from zoo.registry.config import parse_options
from zoo.storage.urls import scheme_of
from zoo.storage.fsbackend import open_backend


@pytest.fixture
def ssh(sshd, tmp_path):
    """A backend on a fresh folder the server serves, and that folder."""
    root = tmp_path / "remote"
    return open_backend(sshd.url(root), sshd.options), root


def _leftovers(folder) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if p.name.endswith(".tmp"))


def test_ssh_and_sftp_urls_open_the_ssh_backend(sshd, tmp_path):
    assert scheme_of("ssh://h/x") == scheme_of("SFTP://u@h:2222/x") == "ssh"
    for scheme in ("ssh", "sftp"):
        b = open_backend(sshd.url(tmp_path / scheme).replace("ssh://", f"{scheme}://"), sshd.options)
        assert isinstance(b, SshBackend)
        b.write(b.path("a", "b.txt"), b"hello")
        assert (tmp_path / scheme / "a" / "b.txt").read_bytes() == b"hello"
    with pytest.raises(InvalidInput, match="not an SSH remote URL") as e:
        open_backend("ssh://host", {})
    assert "ssh://[user@]host[:port]/absolute/path" in e.value.hint


def test_of_two_racing_creators_exactly_one_wins_every_time(ssh):
    """Two threads (two SFTP sessions, two server processes) create the same entry at the same
    instant, 20 times over: each time exactly one gets True and the entry holds its bytes."""
    b, root = ssh
    for round_ in range(20):
        rpath = b.path("entries", f"{round_:02d}.json")
        start = threading.Barrier(2)
        results: dict[int, bool] = {}

        def create(i: int) -> None:
            writer = open_backend(b.url, b.options)
            start.wait()
            results[i] = writer.create(rpath, json.dumps({"writer": i}).encode())

        threads = [threading.Thread(target=create, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(results.values()) == [False, True], results
        winner = next(i for i, created in results.items() if created)
        assert json.loads(b.read(rpath)) == {"writer": winner}
    assert _leftovers(root) == []


def test_a_failed_upload_leaves_neither_a_partial_object_nor_a_temporary_file(ssh, tmp_path, monkeypatch):
    import shutil

    b, root = ssh
    local = tmp_path / "big"
    local.write_bytes(os.urandom(1 << 20))
    b.put_file(local, b.path("objects", "old"))
    real = shutil.copyfileobj

    def broken(src, dst, length=0):  # half the bytes reach the server, then the link drops
        dst.write(src.read(1 << 19))
        raise ConnectionResetError("link dropped mid-upload")

    monkeypatch.setattr(shutil, "copyfileobj", broken)
    with pytest.raises(SourceUnreachable):
        b.put_file(local, b.path("objects", "new"))
    with pytest.raises(SourceUnreachable):
        b.put_file(local, b.path("objects", "old"))  # replacing: the old object stays whole
    monkeypatch.setattr(shutil, "copyfileobj", real)
    assert not (root / "objects" / "new").exists()
    assert (root / "objects" / "old").read_bytes() == local.read_bytes()
    assert _leftovers(root) == []


def test_ranged_reads_stop_one_byte_past_the_expected_end(ssh):
    b, _ = ssh
    data = bytes(range(256)) * 1000
    b.write(b.path("obj"), data)
    assert b"".join(b.iter_from(b.path("obj"), 1000, len(data))) == data[1000:]
    assert b"".join(b.iter_from(b.path("obj"), 0, 100)) == data[:101]  # longer than expected: the caller sees it
    assert b"".join(b.iter_from(b.path("obj"), len(data), len(data))) == b""
    with pytest.raises(FileNotFoundError):
        list(b.iter_from(b.path("missing"), 0, 10))


def test_an_unknown_host_key_is_refused_with_the_keyscan_hint(sshd, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    b = open_backend(sshd.url(tmp_path / "r"), {**sshd.options, "known_hosts": str(empty)})
    with pytest.raises(AccessDenied, match="not in") as e:
        b.read(b.path("x"))
    assert f"ssh-keyscan -p {sshd.port} 127.0.0.1 >> {empty}" in e.value.hint


def test_a_changed_host_key_is_refused(sshd, tmp_path):
    other = tmp_path / "other_host_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    kind, key = other.with_suffix(".pub").read_text().split()[:2]
    forged = tmp_path / "known_hosts"
    forged.write_text(f"[127.0.0.1]:{sshd.port} {kind} {key}\n")
    b = open_backend(sshd.url(tmp_path / "r"), {**sshd.options, "known_hosts": str(forged)})
    with pytest.raises(AccessDenied, match="CHANGED"):
        b.read(b.path("x"))


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A temporary HOME with an empty ~/.ssh, and no system known_hosts (tests name their own)."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setattr(backend_ssh, "SYSTEM_KNOWN_HOSTS", (str(tmp_path / "etc" / "ssh_known_hosts"),))
    return home


def test_host_keys_are_read_from_the_users_file_then_the_systems(sshd, home, tmp_path):
    """As OpenSSH: ~/.ssh/known_hosts (the default user file) and the system file are both read,
    a key listed in either is accepted, and neither file is written."""
    listing = sshd.known_hosts.read_text()
    options = {"key_filename": str(sshd.client_key)}  # no known_hosts option: the defaults apply
    unknown = open_backend(sshd.url(tmp_path / "r0"), options)
    with pytest.raises(AccessDenied, match="not in") as e:
        unknown.read(unknown.path("x"))
    assert f">> {home / '.ssh' / 'known_hosts'}" in e.value.hint
    system = tmp_path / "etc" / "ssh_known_hosts"
    system.parent.mkdir()
    system.write_text(listing)
    (home / ".ssh" / "known_hosts").write_text("# the user's file lists other hosts only\n")
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in (system, home / ".ssh" / "known_hosts")}
    b = open_backend(sshd.url(tmp_path / "r1"), options)
    b.write(b.path("x"), b"via the system file")
    assert (tmp_path / "r1" / "x").read_bytes() == b"via the system file"
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in before} == before


def test_a_key_listed_in_any_file_is_accepted_a_key_listed_as_other_in_all_is_changed(sshd, home, tmp_path):
    other = tmp_path / "other_host_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    kind, key = other.with_suffix(".pub").read_text().split()[:2]
    forged = tmp_path / "forged_known_hosts"
    forged.write_text(f"[127.0.0.1]:{sshd.port} {kind} {key}\n")
    system = tmp_path / "etc" / "ssh_known_hosts"
    system.parent.mkdir()
    system.write_text(forged.read_text())
    b = open_backend(sshd.url(tmp_path / "r"), {**sshd.options, "known_hosts": str(forged)})
    with pytest.raises(AccessDenied, match="CHANGED") as e:
        b.read(b.path("x"))
    assert f"ssh-keygen -R 127.0.0.1 -f {forged}" in e.value.hint
    system.write_text(sshd.known_hosts.read_text())  # the system file has the right key: accepted
    b = open_backend(sshd.url(tmp_path / "r2"), {**sshd.options, "known_hosts": str(forged)})
    b.write(b.path("x"), b"ok")
    assert (tmp_path / "r2" / "x").read_bytes() == b"ok"


def _ssh_config(home, text: str) -> None:
    (home / ".ssh" / "config").write_text(text)


def test_a_host_alias_of_ssh_config_gives_host_port_user_key_and_known_hosts(sshd, home, tmp_path):
    _ssh_config(home, f"Host teamcache\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User {sshd.user}\n"
                      f"  IdentityFile {sshd.client_key}\n  UserKnownHostsFile {sshd.known_hosts}\n")
    b = open_backend(f"ssh://teamcache{tmp_path / 'r'}", {})
    assert (b.host, b.port, b.username) == ("127.0.0.1", sshd.port, sshd.user)
    b.write(b.path("a", "b.txt"), b"through the alias")
    assert (tmp_path / "r" / "a" / "b.txt").read_bytes() == b"through the alias"


def test_the_url_and_the_options_win_over_ssh_config(home, tmp_path):
    _ssh_config(home, "Host teamcache\n  HostName cache.example.com\n  Port 2200\n  User alice\n"
                      "  IdentityFile ~/.ssh/id_team\n  UserKnownHostsFile ~/.ssh/team_hosts\n"
                      f"  GlobalKnownHostsFile {tmp_path / 'global_hosts'}\nHost *\n  User everyone\n")
    (home / ".ssh" / "id_team").write_text("a key")
    t = resolve_target("ssh://teamcache/srv/zoo", {})
    assert (t.host, t.port, t.user) == ("cache.example.com", 2200, "alice")
    assert t.key_filenames == (str(home / ".ssh" / "id_team"),)
    assert t.known_hosts == (str(home / ".ssh" / "team_hosts"), str(tmp_path / "global_hosts"))
    t = resolve_target("ssh://bob@teamcache:2222/srv/zoo", {"key_filename": "/k", "known_hosts": "/kh"})
    assert (t.port, t.user, t.key_filenames, t.user_known_hosts) == (2222, "bob", ("/k",), ("/kh",))
    assert resolve_target("ssh://teamcache/srv", {"username": "carol"}).user == "carol"
    assert resolve_target("ssh://elsewhere/srv", {}).user == "everyone"  # Host * applies to any host
    assert resolve_target("ssh://elsewhere/srv", {}).host == "elsewhere"


def test_a_proxy_command_of_ssh_config_carries_the_connection(sshd, home, tmp_path):
    """ProxyCommand (here a relay script that notes it ran) carries the SSH connection."""
    relay = tmp_path / "relay.py"
    ran = tmp_path / "relay-ran"
    relay.write_text(
        "import socket, sys, threading\n"
        f"open({str(ran)!r}, 'w').write(sys.argv[1] + ':' + sys.argv[2])\n"
        "s = socket.create_connection((sys.argv[1], int(sys.argv[2])))\n"
        "def up():\n"
        "    while data := sys.stdin.buffer.read1(65536):\n"
        "        s.sendall(data)\n"
        "    s.shutdown(socket.SHUT_WR)\n"
        "threading.Thread(target=up, daemon=True).start()\n"
        "while data := s.recv(65536):\n"
        "    sys.stdout.buffer.write(data); sys.stdout.buffer.flush()\n")
    _ssh_config(home, f"Host behind-bastion\n  HostName 127.0.0.1\n  Port {sshd.port}\n"
                      f"  ProxyCommand {sys.executable} {relay} %h %p\n")
    b = open_backend(f"ssh://behind-bastion{tmp_path / 'r'}", sshd.options)
    b.write(b.path("x"), b"relayed")
    assert (tmp_path / "r" / "x").read_bytes() == b"relayed"
    assert ran.read_text() == f"127.0.0.1:{sshd.port}"


def test_proxy_jump_is_refused_with_the_proxy_command_to_write(home):
    _ssh_config(home, "Host inside\n  ProxyJump bastion.example.com\n")
    with pytest.raises(InvalidInput, match="ProxyJump") as e:
        open_backend("ssh://inside/srv/zoo", {})
    assert "ProxyCommand ssh -W %h:%p bastion.example.com" in e.value.hint


def test_a_key_the_server_does_not_accept_is_access_denied_with_the_credentials_hint(sshd, tmp_path):
    stranger = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    b = open_backend(sshd.url(tmp_path / "r"), {**sshd.options, "key_filename": str(stranger)})
    with pytest.raises(AccessDenied, match="refused access") as e:
        b.read(b.path("x"))
    assert "key_filename" in e.value.hint and "ssh-agent" in e.value.hint


def test_a_server_that_never_speaks_ssh_times_out_as_unreachable(sshd, tmp_path):
    """A port that accepts the connection and then says nothing (a stuck server, a firewall that
    swallows the banner): the connect timeout ends the wait with SourceUnreachable."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)
    try:
        url = f"ssh://{sshd.user}@127.0.0.1:{silent.getsockname()[1]}{tmp_path}"
        b = open_backend(url, {**sshd.options, "connect_timeout": 1})
        with pytest.raises(SourceUnreachable):
            b.read(b.path("x"))
    finally:
        silent.close()


def test_options_take_no_secrets():
    assert parse_options("ssh", {"username": "u", "key_filename": "~/.ssh/id_team", "known_hosts": "/k",
                                 "password_env": "SSH_PW", "connect_timeout": "3"})["connect_timeout"] == 3
    with pytest.raises(InvalidInput, match="never stores credentials"):
        parse_options("ssh", {"password": "x"})
    with pytest.raises(InvalidInput, match="unknown option") as e:
        parse_options("ssh", {"identity": "x"})
    assert "key_filename" in e.value.hint


def test_help_validate_and_a_cached_run_import_no_ssh_driver(tmp_path):
    """`zoo --help`, `zoo validate` and a run whose stages are all local hits, with an SSH run
    cache set (its server is never contacted), import neither paramiko nor fsspec's sftp module."""
    recipe = write_recipe(tmp_path, "schema_version: 1\nname: s\nversion: 0.1.0\nstages:\n"
                                    "  a: {kind: writer, config: {text: abc}}\n")
    env = {**os.environ, "ZOO_CACHE_DIR": str(tmp_path / "cache"), "ZOO_HOME": str(tmp_path / "home")}
    first = subprocess.run([sys.executable, "-m", "zoo", "run", str(recipe), "--cache-remote", "none"],
                           capture_output=True, text=True, env=env)
    assert first.returncode == 0, first.stderr
    probe = ("import sys\nsys.argv = ['zoo', *sys.argv[1:]]\nfrom zoo.entry import main\ntry:\n    main()\n"
             "except SystemExit as e:\n    print('EXIT', e.code, file=sys.stderr)\n"
             "print('SSH', [m for m in ('paramiko', 'fsspec.implementations.sftp', 'zoo.storage.backend_ssh') "
             "if m in sys.modules], file=sys.stderr)\n")
    for args in (["--help"], ["validate", str(recipe)],
                 ["run", str(recipe), "--cache-remote", "ssh://nobody@127.0.0.1:1/nowhere"]):
        proc = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, env=env)
        assert "EXIT 0" in proc.stderr and "SSH []" in proc.stderr, (args, proc.stderr)


def test_cache_push_then_pull_over_ssh_gives_machine_b_every_stage(tmp_path, request, monkeypatch):
    """`zoo cache push` from machine A and `zoo cache pull` on machine B through an SSH run cache
    (the setting in each machine's config, with the key and known_hosts options): B then runs
    the recipe with the remote off and every stage is a local hit."""
    from cli_helpers import zoo as zoo_cli
    from remote_fixtures import Backend
    from test_remote_cache import _machine, _recipe, _run, _user_config

    remote = Backend("ssh", request, tmp_path, monkeypatch)
    recipe = _recipe(tmp_path)
    a, b = _machine(tmp_path, "a"), _machine(tmp_path, "b")
    assert _run(recipe, a, "--cache-remote", "none")[0] == 0
    _user_config(a, remote)
    _user_config(b, remote)
    pushed = zoo_cli("cache", "push", recipe, "--json", env=a)
    assert pushed.code == 0 and json.loads(pushed.out)["entries"] == 3, pushed.text
    pulled = zoo_cli("cache", "pull", recipe, "--json", env=b)
    assert pulled.code == 0 and json.loads(pulled.out)["pulled"] == 3, pulled.text
    code, got, _ = _run(recipe, b, "--cache-remote", "none")
    assert code == 0 and {s["state"] for s in got["stages"]} == {"cached"}
    assert _leftovers(remote.root) == []
