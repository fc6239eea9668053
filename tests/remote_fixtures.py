"""The remote backends, on servers on 127.0.0.1, as one shared set of pytest fixtures (loaded by
conftest.py as a plugin): test_registry_remotes.py, test_registry_remote_integrity.py and
test_registry_remote_contract.py all use these.

Servers (module-scoped, started only when a test asks for one): moto S3, wsgidav WebDAV (also
serving folders as plain read-only HTTP), Debian's docker-registry (an OCI registry,
distribution 2.8: `registry_servers.docker_registry`), OpenSSH's sshd (session-scoped; ssh_server.py),
fake-gcs-server and azurite (session-scoped, see cloud_servers.py), and a Hugging Face endpoint
that is partly a stand-in:
reads go to olah (a real Hub mirror serving git repos), the Hub's write API is
`tests/registry_servers.py`'s `HubWriteApp`; tests using it carry `hf-stand-in-write-api` in their ids.

`backend` is parametrised over the writable backends (`BACKENDS`); a test narrows it with
``@pytest.mark.parametrize("backend", [...], indirect=True)``. `publisher` is a local zoo holding
tiny@1.0.0 and tiny@1.1.0 (two builds) with the backend added as remote ``origin``; `consumer`
is an empty local zoo with the same remote.
"""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest

from zoo.registry import api
from zoo.registry.store import LocalZoo
from registry_servers import docker_registry, free_port, hub_server, make_staging, moto_s3, webdav_server

BACKENDS = ["folder", "s3", "gcs", "azure", "webdav", "ssh", "hf", "oci"]  # every writable kind
KINDS = [*BACKENDS, "http"]  # http: a folder remote served read-only over plain HTTP


# ---- servers (one per module) ----------------------------------------------------------------
@pytest.fixture(scope="module")
def s3_endpoint():
    with moto_s3("zoo") as endpoint:
        yield endpoint


@pytest.fixture(scope="session")
def gcs_endpoint():
    from cloud_servers import fake_gcs

    with fake_gcs("zoo") as endpoint:
        yield endpoint


@pytest.fixture(scope="session")
def azure_connection(tmp_path_factory):
    from cloud_servers import azurite

    with azurite(tmp_path_factory.mktemp("azurite"), "zoo") as conn:
        yield conn


@pytest.fixture(scope="module")
def dav(tmp_path_factory):
    root = tmp_path_factory.mktemp("dav")
    with webdav_server(root, user="zoo", password="dav-secret") as url:
        yield url, root


@pytest.fixture(scope="session")
def sshd(tmp_path_factory):
    """OpenSSH's sshd on 127.0.0.1 serving this machine's folders (an `ssh_server.SshServer`)."""
    from ssh_server import sshd_server

    with sshd_server(tmp_path_factory.mktemp("sshd")) as server:
        yield server


@pytest.fixture(scope="module")
def oci_registry(tmp_path_factory):
    """docker-registry on 127.0.0.1; yields (``127.0.0.1:PORT``, its storage folder)."""
    root = tmp_path_factory.mktemp("oci-registry")
    with docker_registry(root) as host:
        yield host, root / "data"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    with hub_server(tmp_path_factory.mktemp("hub")) as app:
        yield app


@pytest.fixture(scope="module")
def http_site(tmp_path_factory):
    """A folder served over plain HTTP (wsgidav without auth: Range support); yields (url, folder)."""
    root = tmp_path_factory.mktemp("site")
    with webdav_server(root, user=None) as url:
        yield url, root


@pytest.fixture
def hf_online(monkeypatch, tmp_path):
    """conftest sets HF_HUB_OFFLINE=1; the Hub tests talk to 127.0.0.1 only, so lift it."""
    import huggingface_hub.constants as c

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(c, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))


class Backend:
    """One remote location for one test, and how to reach around zoo to damage it.

    `url` and `options` reach it through zoo; `write_url` is where zoo publishes to it (the
    same URL, except for http: the folder behind the read-only site)."""

    def __init__(self, kind: str, request, tmp_path: Path, monkeypatch):
        self.kind = kind
        self.monkeypatch = monkeypatch
        self.uid = uuid.uuid4().hex[:10]
        self.options: dict[str, str] = {}
        if kind == "folder":
            self.root = tmp_path / "remote"
            self.url = str(self.root)
        elif kind == "http":
            base, site = request.getfixturevalue("http_site")
            self.root = site / self.uid
            self.url = f"{base}/{self.uid}"
        elif kind == "s3":
            self.endpoint = request.getfixturevalue("s3_endpoint")
            self.url = f"s3://zoo/{self.uid}"
            self.options = {"endpoint_url": self.endpoint}
        elif kind == "gcs":
            self.endpoint = request.getfixturevalue("gcs_endpoint")
            self.url = f"gs://zoo/{self.uid}"
            self.options = {"endpoint_url": self.endpoint, "anon": True}
        elif kind == "azure":
            self.connection = request.getfixturevalue("azure_connection")
            monkeypatch.setenv("TEST_AZURE_CONNECTION", self.connection)
            self.url = f"az://zoo/{self.uid}"
            self.options = {"connection_string_env": "TEST_AZURE_CONNECTION"}
        elif kind == "webdav":
            base, self.dav_root = request.getfixturevalue("dav")
            monkeypatch.setenv("TEST_DAV_PASSWORD", "dav-secret")
            self.base = base
            self.url = f"webdav+{base}/{self.uid}"
            self.options = {"user": "zoo", "password_env": "TEST_DAV_PASSWORD"}
        elif kind == "ssh":  # the server runs on this machine: the remote is a local folder it serves
            self.sshd = request.getfixturevalue("sshd")
            self.root = tmp_path / "ssh-remote"
            self.url = self.sshd.url(self.root)
            self.options = self.sshd.options
        elif kind == "hf":
            request.getfixturevalue("hf_online")
            self.hub = request.getfixturevalue("hub")
            self.url = f"hf://ns{self.uid}"
            self.options = {"endpoint": self.hub.url}
        elif kind == "oci":  # one repository prefix per test on the module's registry
            self.host, self.registry_root = request.getfixturevalue("oci_registry")
            self.url = f"oci://{self.host}/t{self.uid}"
        self.request = request
        self.write_url = str(self.root) if kind == "http" else self.url

    def add_to(self, zoo: LocalZoo, name: str = "origin", **overrides) -> None:
        api.remote_add(name, overrides.pop("url", self.url), options={**self.options, **overrides.pop("options", {})},
                       zoo=zoo, replace=True, **overrides)

    def dead_options(self) -> tuple[str, dict]:
        """The same remote behind a port where nothing listens."""
        port = free_port()
        if self.kind in ("s3", "gcs"):
            return self.url, {**self.options, "endpoint_url": f"http://127.0.0.1:{port}"}
        if self.kind == "azure":
            from cloud_servers import azurite_connection_string

            self.monkeypatch.setenv("TEST_AZURE_DEAD_CONNECTION", azurite_connection_string(port))
            return self.url, {"connection_string_env": "TEST_AZURE_DEAD_CONNECTION"}
        if self.kind == "webdav":
            return f"webdav+http://127.0.0.1:{port}/{self.uid}", self.options
        if self.kind == "hf":
            return self.url, {"endpoint": f"http://127.0.0.1:{port}"}
        if self.kind == "http":
            return f"http://127.0.0.1:{port}/{self.uid}", {}
        if self.kind == "ssh":
            return f"ssh://{self.sshd.user}@127.0.0.1:{port}{self.root}", self.options
        if self.kind == "oci":
            return f"oci://127.0.0.1:{port}/t{self.uid}", {}
        raise AssertionError("a folder cannot be unreachable")

    def tamper(self, name: str, version: str, path: str, sha256: str) -> None:
        """Flip the last byte of a published file on the remote, bypassing zoo."""
        if self.kind != "hf":
            self.flip(f"blobs/sha256/{sha256[:2]}/{sha256}")
            return
        # a Hub that serves other bytes under the same version tag
        repo = self.hub.mirrors / "models" / f"ns{self.uid}" / name
        p = repo / path
        p.write_bytes(_flip(p.read_bytes()))
        git = ["git", "-C", str(repo), "-c", "user.name=x", "-c", "user.email=x@x"]
        subprocess.run([*git, "commit", "-qam", "tamper"], check=True)
        subprocess.run([*git, "tag", "-f", version], check=True, capture_output=True)

    def flip(self, key: str) -> None:
        """Flip the last byte of the file at `key` (a path under the remote's root), bypassing zoo
        (folder, http, s3, webdav and ssh remotes)."""
        if self.kind in ("folder", "http", "ssh"):
            p = self.root / key
            p.chmod(0o644)
            p.write_bytes(_flip(p.read_bytes()))
        elif self.kind == "oci":
            # the registry's own storage (filesystem driver): blobs/sha256/<aa>/<digest>/data. Blobs are
            # shared by every repository of the registry, so the byte is flipped back after the test
            # (a flip undoes itself), or the module's next push of the same bytes would find it bad
            sha = key.rsplit("/", 1)[-1]
            p = self.registry_root / "docker" / "registry" / "v2" / "blobs" / "sha256" / sha[:2] / sha / "data"
            p.write_bytes(_flip(p.read_bytes()))
            self.request.addfinalizer(lambda: p.write_bytes(_flip(p.read_bytes())))
        elif self.kind == "s3":
            import boto3

            s3 = boto3.client("s3", endpoint_url=self.endpoint)
            obj = f"{self.uid}/{key}"
            s3.put_object(Bucket="zoo", Key=obj, Body=_flip(s3.get_object(Bucket="zoo", Key=obj)["Body"].read()))
        elif self.kind in ("gcs", "azure"):
            self.put(key, _flip(self.get(key)))
        elif self.kind == "webdav":
            p = self.dav_root / self.uid / key
            p.write_bytes(_flip(p.read_bytes()))
        else:
            raise AssertionError(f"cannot flip a byte on a {self.kind} remote")


    def _cloud_fs(self):
        """The cloud store's own driver, not zoo's backend (gcsfs's JSON API class; adlfs)."""
        if self.kind == "gcs":
            from gcsfs.core import GCSFileSystem

            return GCSFileSystem(endpoint_url=self.endpoint, token="anon", use_listings_cache=False)
        from adlfs import AzureBlobFileSystem

        return AzureBlobFileSystem(connection_string=self.connection, use_listings_cache=False)

    def get(self, key: str) -> bytes:
        """The bytes at `key` under the remote's root, read around zoo (gcs and azure remotes)."""
        return self._cloud_fs().cat_file(f"zoo/{self.uid}/{key}")

    def stat_size(self, key: str) -> int | None:
        """The size of what is at `key` under the remote's root, or None, asked around zoo (gcs, azure)."""
        try:
            return self._cloud_fs().info(f"zoo/{self.uid}/{key}")["size"]
        except FileNotFoundError:
            return None

    def put(self, key: str, data: bytes) -> None:
        """Replace the bytes at `key` under the remote's root, around zoo (gcs and azure remotes)."""
        self._cloud_fs().pipe_file(f"zoo/{self.uid}/{key}", data)


def backend_class(kind: str) -> type:
    """The byte-level class zoo opens for a test kind (tests patch it to stop a push mid-way): an
    FsBackend class, or the OCI registry client."""
    import importlib

    if kind == "oci":
        from zoo.storage.oci_client import OciClient

        return OciClient

    from zoo.storage.fsbackend import SCHEME_BACKENDS, FsBackend

    if kind in SCHEME_BACKENDS:
        module, name = SCHEME_BACKENDS[kind]
        return getattr(importlib.import_module(module), name)
    return FsBackend


def _flip(data: bytes) -> bytes:
    return data[:-1] + bytes([data[-1] ^ 0xFF])


def backend_id(kind: str) -> str:
    return "hf-stand-in-write-api" if kind == "hf" else kind


@pytest.fixture(params=BACKENDS, ids=backend_id)
def backend(request, tmp_path, monkeypatch) -> Backend:
    return Backend(request.param, request, tmp_path, monkeypatch)


@pytest.fixture
def publisher(tmp_path, backend) -> LocalZoo:
    zoo = LocalZoo(tmp_path / "publisher")
    zoo.publish(make_staging(tmp_path / "s100", version="1.0.0", big_bytes=3000))
    zoo.publish(make_staging(tmp_path / "s110", version="1.1.0", scale=7.0, big_bytes=3000,
                             builds={"cpu-fp32": {"metrics": {"latency_p50_ms": 2.0, "accuracy": 0.9}},
                                     "cpu-int8": {"precision": "int8", "metrics": {"latency_p50_ms": 1.0, "accuracy": 0.88}}}))
    backend.add_to(zoo, url=backend.write_url)
    return zoo


@pytest.fixture
def consumer(tmp_path, backend) -> LocalZoo:
    zoo = LocalZoo(tmp_path / "consumer")
    backend.add_to(zoo)
    return zoo


