"""A remote location on an SSH server, reached over SFTP: ``ssh://[user@]host[:port]/abs/path``
(``sftp://`` is the same).

The driver is fsspec's `SFTPFileSystem` (paramiko, the ``ssh`` extra), chosen over sshfs/asyncssh
because paramiko is synchronous like the rest of `FsBackend`, reads the user's ``~/.ssh`` keys and
agent out of the box, and has a plain ``known_hosts`` parser. paramiko is imported when a backend
first talks to its server, never at module import.

The atomic primitives (what `zoo.engine.cache_store` and `zoo.registry.fsremote` rely on):

- create-exclusive: upload to a temporary name in the same folder, then a plain SFTP RENAME
  (SSH_FXP_RENAME). OpenSSH's server performs it as link() + unlink(), so it fails when the
  target exists: of two creators exactly one renames, the other gets False and the entry stays
  as the first wrote it. (Opening with O_EXCL would be exclusive too, but a reader could see the
  entry half written.)
- absent-or-complete (`write`, `put_file`): temporary name + ``posix-rename@openssh.com``, which
  replaces the target atomically. Temporary files are removed when anything fails.
- reads: seek and read, one byte past the expected end (as `FsBackend.iter_from` promises), with
  paramiko's pipelined prefetch of just that range.

The URL's host may be a ``Host`` alias of ``~/.ssh/config`` (read with paramiko's SSHConfig, as
``ssh`` reads it: ``Host *`` stanzas too), whose HostName, User, Port, IdentityFile,
UserKnownHostsFile, GlobalKnownHostsFile and ProxyCommand apply; what the URL and the ``-o``
options say wins over the config, as ssh's command line does (`resolve_target`).

Credentials are the user's: the ssh-agent and ``~/.ssh/id_*`` keys, or ``-o key_filename=PATH``
(else the config's IdentityFile); the user is the URL's, else ``-o username=``, else the config's
User, else the local user; a password only from the environment variable named by
``-o password_env=VAR``. Host keys are checked as OpenSSH checks them: the user's files first
(``-o known_hosts=PATH``, else the config's UserKnownHostsFile, else ``~/.ssh/known_hosts`` and
``known_hosts2``), then the system's (the config's GlobalKnownHostsFile, else
``/etc/ssh/ssh_known_hosts`` and ``ssh_known_hosts2``), all read, never written. A key listed in
any of them is accepted; a host listed with another key of that type is refused as changed, an
unlisted one as unknown (AccessDenied): never trusted on first use. Connections time out after
``-o connect_timeout`` seconds (default 5), so an unreachable run cache degrades to a local run
quickly.

One SSH connection per server and credentials is shared by every backend in the process; each
thread opens its own SFTP channel on it (paramiko's SFTP client is not meant to be shared
between threads, and downloads run in a thread pool).
"""

from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass
from typing import Iterator
from urllib.parse import unquote, urlsplit

from zoo.errors import AccessDenied, InvalidInput, SourceUnreachable
from zoo.storage import fsbackend
from zoo.storage.fsbackend import FsBackend, credentials_hint

DEFAULT_CONNECT_TIMEOUT_S = 5
IO_TIMEOUT_S = 120
SSH_EXTRA = "pip install 'zoo-onnx[ssh]'"

SSH_CONFIG = "~/.ssh/config"
USER_KNOWN_HOSTS = ("~/.ssh/known_hosts", "~/.ssh/known_hosts2")  # OpenSSH's defaults
SYSTEM_KNOWN_HOSTS = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")

_connections: dict[tuple, object] = {}  # SshTarget and password_env -> paramiko.SSHClient
_connections_lock = threading.Lock()


class UnknownHostKey(Exception):
    """The server's host key is not in known_hosts (zoo never trusts a host on first use)."""


def parse_ssh_url(url: str) -> tuple[str | None, str, int | None, str]:
    """(user or None, host, port or None, absolute path) of an ``ssh://`` or ``sftp://`` URL."""
    parts = urlsplit(url)
    if not parts.hostname or not parts.path.startswith("/"):
        raise InvalidInput(f"{url!r} is not an SSH remote URL",
                           hint="write ssh://[user@]host[:port]/absolute/path (or sftp://…)")
    try:
        port = parts.port
    except ValueError:
        raise InvalidInput(f"{url!r}: the port is not a number", hint="write ssh://host:2222/path") from None
    path = unquote(parts.path).rstrip("/") or "/"
    return (unquote(parts.username) if parts.username else None), parts.hostname, port, path


@dataclass(frozen=True)
class SshTarget:
    """Where and as whom to connect, once the URL, the options and ~/.ssh/config are combined."""

    host: str  # the real host name (what known_hosts lists)
    port: int
    user: str
    key_filenames: tuple[str, ...]  # besides the agent and ~/.ssh/id_*
    user_known_hosts: tuple[str, ...]
    system_known_hosts: tuple[str, ...]
    proxy_command: str | None

    @property
    def known_hosts(self) -> tuple[str, ...]:
        """Every known_hosts file, in the order OpenSSH reads them: the user's, then the system's."""
        return self.user_known_hosts + self.system_known_hosts


def _ssh_config(alias: str) -> dict:
    """What ``~/.ssh/config`` says for host `alias` ({} without a config file)."""
    import paramiko

    path = os.path.expanduser(SSH_CONFIG)
    if not os.path.exists(path):
        return {}
    try:
        return dict(paramiko.SSHConfig.from_path(path).lookup(alias))
    except (OSError, paramiko.ssh_exception.ConfigParseError, ImportError) as e:  # ImportError: Match exec needs invoke
        raise InvalidInput(f"{path}: cannot read it for host {alias!r}: {type(e).__name__}: {e}",
                           hint="fix the file (`ssh -G HOST` shows what ssh makes of it)") from e


def _paths(value) -> tuple[str, ...]:
    """File names from an option or ssh_config value (whitespace-separated, or a list), ~ expanded."""
    names = value.split() if isinstance(value, str) else list(value or [])
    return tuple(os.path.expanduser(n) for n in names if n.lower() != "none")


def resolve_target(url: str, options: dict) -> SshTarget:
    """The connection an ``ssh://`` URL and its options describe, with ``~/.ssh/config``'s entry for
    the URL's host filling what they leave open (the URL and the options win, as on ssh's command line)."""
    url_user, alias, url_port, _ = parse_ssh_url(url)
    cfg = _ssh_config(alias)
    if cfg.get("proxyjump"):
        raise InvalidInput(f"{SSH_CONFIG} reaches {alias} through ProxyJump {cfg['proxyjump']}, which zoo does not follow",
                           hint=f"add `ProxyCommand ssh -W %h:%p {cfg['proxyjump']}` to the Host entry instead")
    try:
        port = url_port or int(cfg.get("port") or 22)
    except ValueError:
        raise InvalidInput(f"{SSH_CONFIG}: Port {cfg.get('port')!r} of {alias} is not a number") from None
    keys = _paths(options.get("key_filename")) or _paths(cfg.get("identityfile"))
    return SshTarget(
        host=cfg.get("hostname") or alias,
        port=port,
        user=url_user or options.get("username") or cfg.get("user") or _local_user(),
        key_filenames=tuple(k for k in keys if options.get("key_filename") or os.path.exists(k)),
        user_known_hosts=_paths(options.get("known_hosts")) or _paths(cfg.get("userknownhostsfile")) or _paths(USER_KNOWN_HOSTS),
        system_known_hosts=_paths(cfg.get("globalknownhostsfile")) or _paths(SYSTEM_KNOWN_HOSTS),
        proxy_command=cfg.get("proxycommand") if str(cfg.get("proxycommand", "")).lower() != "none" else None,
    )


class HostKeyChanged(Exception):
    """A known_hosts file lists the host with another key of the type the server offered."""

    def __init__(self, hostname: str, key_type: str, path: str):
        super().__init__(f"the host key of {hostname} ({key_type}) has CHANGED since it was recorded in {path}")
        self.path = path


def _known_hosts_policy(files: tuple[str, ...]):
    """A paramiko policy for host keys: accept a key any of `files` lists for the host; refuse a
    host listed with another key of that type (changed) and an unlisted one (unknown)."""
    import paramiko

    class KnownHosts(paramiko.MissingHostKeyPolicy):
        def missing_host_key(self, client, hostname, key):
            changed_in = None
            for path in files:
                known = paramiko.HostKeys()
                with contextlib.suppress(FileNotFoundError, PermissionError, IsADirectoryError):
                    known.load(path)
                listed = (known.lookup(hostname) or {}).get(key.get_name())
                if listed == key:
                    return
                if listed is not None and changed_in is None:
                    changed_in = path
            if changed_in is not None:
                raise HostKeyChanged(hostname, key.get_name(), changed_in)
            raise UnknownHostKey(f"the host key of {hostname} ({key.get_name()}) is not in {' nor '.join(files)}")

    return KnownHosts()


class _Counted:
    """A file being written whose writes are also reported to `progress(n)`."""

    def __init__(self, f, progress):
        self.f, self.progress = f, progress

    def write(self, data) -> int:
        written = self.f.write(data)
        self.progress(len(data))
        return written


class SshBackend(FsBackend):
    """A folder on an SSH server (SFTP), with the atomic primitives described in the module docstring."""

    # ---- opening ------------------------------------------------------------------------
    def _open(self):
        *_, root = parse_ssh_url(self.url)
        try:
            from fsspec.implementations.sftp import SFTPFileSystem
        except ImportError as e:
            raise InvalidInput("SSH remotes need paramiko", hint=SSH_EXTRA) from e
        self.target = resolve_target(self.url, self.options)
        self.host, self.port, self.username = self.target.host, self.target.port, self.target.user
        backend = self

        class LazySFTP(SFTPFileSystem):
            """fsspec's SFTP filesystem on the shared connection, one SFTP channel per thread,
            connected on first use (so opening a backend never blocks on the network)."""

            def _connect(self):
                self._channels = threading.local()

            @property
            def ftp(self):
                ch = getattr(self._channels, "sftp", None)
                if ch is None or ch.sock.closed:
                    ch = self._channels.sftp = backend._client().open_sftp()
                    ch.get_channel().settimeout(IO_TIMEOUT_S)  # a server that stops answering mid-transfer
                return ch

        fs = LazySFTP(self.host, skip_instance_cache=True)
        self._made: set[str] = set()  # folders known to exist (saves a stat per upload)
        return fs, root.rstrip("/") if root != "/" else ""

    def _connection_key(self) -> tuple:
        return (self.target, self.options.get("password_env"))

    def _client(self):
        """The process's SSH connection for this server and these credentials (opened if needed)."""
        key = self._connection_key()
        with _connections_lock:
            client = _connections.get(key)
            transport = client.get_transport() if client is not None else None
            if transport is not None and transport.is_active():
                return client
            client = self._connect()
            _connections[key] = client
            return client

    def _connect(self):
        import paramiko

        o, t = self.options, self.target
        timeout = float(o.get("connect_timeout") or DEFAULT_CONNECT_TIMEOUT_S)
        client = paramiko.SSHClient()
        client.set_missing_host_key_policy(_known_hosts_policy(t.known_hosts))
        password = None
        if o.get("password_env"):
            password = os.environ.get(str(o["password_env"])) or None
        sock = paramiko.ProxyCommand(t.proxy_command) if t.proxy_command else None
        try:
            client.connect(t.host, port=t.port, username=t.user, password=password,
                           key_filename=list(t.key_filenames) or None, timeout=timeout, banner_timeout=timeout,
                           auth_timeout=timeout, channel_timeout=timeout, sock=sock)
        except BaseException:
            client.close()
            if sock is not None:
                sock.close()
            raise
        return client

    # ---- errors -------------------------------------------------------------------------
    @contextlib.contextmanager
    def _errors(self, what: str):
        """The base class's sorting, after paramiko's own exceptions are turned into zoo errors."""
        with super()._errors(what):
            try:
                yield
            except UnknownHostKey as e:
                raise AccessDenied(f"{self.url}: {e}; zoo does not trust a host on first use ({what})",
                                   hint=f"check the key with the server's admin, then `ssh-keyscan -p {self.port} "
                                        f"{self.host} >> {self.target.user_known_hosts[0]}` (or point -o known_hosts=PATH "
                                        "at a file that lists it)") from e
            except HostKeyChanged as e:
                raise AccessDenied(f"{self.url}: {e} ({what})",
                                   hint="someone may be impersonating the server; if the change is expected, "
                                        f"remove the old key with `ssh-keygen -R {self.host} -f {e.path}` and add the new one") from e
            except Exception as e:
                import paramiko

                if isinstance(e, paramiko.AuthenticationException):
                    raise AccessDenied(f"{self.url} refused access: {type(e).__name__}: {e} ({what})",
                                       hint=credentials_hint(self.scheme, self.options)) from e
                if isinstance(e, (paramiko.SSHException, EOFError)):  # banner/negotiation timeouts, dropped links
                    raise SourceUnreachable(f"remote {self.url} is unreachable ({what}): {type(e).__name__}: {e}",
                                            hint="check the network and that sshd runs there; "
                                                 "--offline uses only the local zoo") from e
                raise

    # ---- reading ------------------------------------------------------------------------
    def iter_from(self, rpath: str, offset: int, size: int) -> Iterator[bytes]:
        """Seek and read up to byte `size` (one past the expected end), as the base class promises."""
        if offset > size:
            return
        with self._errors(f"download {rpath}"):
            f = self.fs.ftp.open(rpath, "rb")
        try:
            with self._errors(f"download {rpath}"):
                end = min(f.stat().st_size, size + 1)
                f.seek(offset)
                if end > offset:
                    f.prefetch(end)  # pipelined reads of [offset, end) only
            pos = offset
            while pos < end:
                with self._errors(f"download {rpath}"):
                    chunk = f.read(min(fsbackend.CHUNK, end - pos))
                if not chunk:
                    return
                pos += len(chunk)
                yield chunk
        finally:
            with contextlib.suppress(Exception):
                f.close()

    # ---- writing ------------------------------------------------------------------------
    def _makedirs(self, rpath: str) -> None:
        parent = rpath.rpartition("/")[0]
        if parent:
            with self._errors(f"mkdir {parent}"):
                self._mkdir_p(parent)

    def _mkdir_p(self, folder: str) -> None:
        """Make `folder` and its parents; a folder another writer made meanwhile is fine."""
        if not folder or folder in self._made:
            return
        ftp = self.fs.ftp
        try:
            ftp.stat(folder)
        except FileNotFoundError:
            self._mkdir_p(folder.rpartition("/")[0])
            try:
                ftp.mkdir(folder)
            except OSError:
                ftp.stat(folder)  # made concurrently: fine; else this raises the real error
        self._made.add(folder)

    def _upload_tmp(self, rpath: str, write) -> str:
        """Upload to a temporary name beside `rpath` with `write(file)`; the name (removed on failure)."""
        tmp = self._tmp_name(rpath)
        try:
            with self._errors(f"upload {rpath}"), self.fs.ftp.open(tmp, "wb") as f:
                f.set_pipelined(True)
                write(f)
        except BaseException:
            self._remove_quietly(tmp)
            raise
        return tmp

    def _remove_quietly(self, rpath: str) -> None:
        with contextlib.suppress(Exception):
            self.fs.ftp.remove(rpath)

    def _replace_with(self, tmp: str, rpath: str) -> None:
        try:
            with self._errors(f"upload {rpath}"):
                self.fs.ftp.posix_rename(tmp, rpath)
        except BaseException:
            self._remove_quietly(tmp)
            raise

    def write(self, rpath: str, data: bytes) -> None:
        """Write (replace) a small file atomically: temporary name, then posix-rename."""
        self._makedirs(rpath)
        self._replace_with(self._upload_tmp(rpath, lambda f: f.write(data)), rpath)

    def put_file(self, local, rpath: str, progress=None) -> None:
        """Upload a local file so that `rpath` is either absent or complete, never partial;
        `progress(n)`: n more bytes went up."""
        import shutil

        self._makedirs(rpath)

        def copy(f):
            with open(local, "rb") as src:
                shutil.copyfileobj(src, f if progress is None else _Counted(f, progress), fsbackend.CHUNK)

        self._replace_with(self._upload_tmp(rpath, copy), rpath)

    def create(self, rpath: str, data: bytes) -> bool:
        """Create `rpath` with `data` only if it does not exist; False if someone else has.
        A plain SFTP rename refuses an existing target (see the module docstring)."""
        self._makedirs(rpath)
        tmp = self._upload_tmp(rpath, lambda f: f.write(data))
        try:
            with self._errors(f"create {rpath}"):
                try:
                    self.fs.ftp.rename(tmp, rpath)
                except OSError as e:
                    if e.errno is not None and e.errno != 17:  # a reason of its own (not "exists")
                        raise
                    if self._exists(rpath):
                        return False
                    raise
            tmp = None  # renamed: nothing left to clean up
            return True
        finally:
            if tmp is not None:
                self._remove_quietly(tmp)

    def _exists(self, rpath: str) -> bool:
        try:
            self.fs.ftp.stat(rpath)
        except FileNotFoundError:
            return False
        return True


def _local_user() -> str:
    import getpass

    return getpass.getuser()
