"""A real OpenSSH server on 127.0.0.1 for the SSH/SFTP remote tests (Debian's openssh-server,
installed by ./dev): its own host key, one client key in its AuthorizedKeysFile, a known_hosts
file for the client, and the internal SFTP subsystem. It serves this machine's filesystem as the
user running the tests, so a remote is a temporary folder named by an absolute path."""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from registry_servers import free_port, stop_process, wait_port

SSHD = "/usr/sbin/sshd"
INSTALL = "apt-get install -y openssh-server (./dev setup does it)"


@dataclass
class SshServer:
    host: str
    port: int
    user: str
    client_key: Path
    known_hosts: Path

    def url(self, path: Path | str) -> str:
        return f"ssh://{self.user}@{self.host}:{self.port}{path}"

    @property
    def options(self) -> dict[str, str]:
        """What a remote needs to reach this server (a key of its own, a known_hosts of its own)."""
        return {"key_filename": str(self.client_key), "known_hosts": str(self.known_hosts)}


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)


@contextlib.contextmanager
def sshd_server(work: Path):
    """Start ``sshd -D -e`` on a free port of 127.0.0.1; yield an `SshServer`; stop it."""
    if not os.path.exists(SSHD) or shutil.which("ssh-keygen") is None:
        raise AssertionError(f"the SSH remote tests need OpenSSH's server at {SSHD}: {INSTALL}")
    work.mkdir(parents=True, exist_ok=True)
    host_key, client_key = work / "host_ed25519", work / "client_ed25519"
    _keygen(host_key)
    _keygen(client_key)
    authorized = work / "authorized_keys"
    authorized.write_text(client_key.with_suffix(".pub").read_text())
    port = free_port()
    config = work / "sshd_config"
    config.write_text("\n".join([
        "ListenAddress 127.0.0.1",
        f"HostKey {host_key}",
        f"AuthorizedKeysFile {authorized}",
        f"PidFile {work / 'sshd.pid'}",
        "PermitRootLogin prohibit-password",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "StrictModes no",
        "Subsystem sftp internal-sftp",
        "MaxStartups 100:30:200",
        "MaxSessions 100",
        "LogLevel ERROR",
        "",
    ]))
    known_hosts = work / "known_hosts"
    pub = (host_key.with_suffix(".pub")).read_text().split()
    known_hosts.write_text(f"[127.0.0.1]:{port} {pub[0]} {pub[1]}\n")
    log = open(work / "sshd.log", "wb")
    # sshd insists on an absolute path and its privilege-separation folder
    os.makedirs("/run/sshd", exist_ok=True)
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config), "-p", str(port)], stdout=log, stderr=log)
    try:
        try:
            wait_port(port, 20, proc)
        except RuntimeError as e:
            raise AssertionError(f"sshd did not start ({e}): {(work / 'sshd.log').read_text()}") from None
        yield SshServer("127.0.0.1", port, getpass.getuser(), client_key, known_hosts)
    finally:
        stop_process(proc)
        log.close()
