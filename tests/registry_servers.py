"""Test and benchmark helpers: tiny staging folders and real servers on 127.0.0.1.

Used by the tests and by bench/bench_registry.py and bench/bench_remote_cache.py (which put tests/
on sys.path); nothing here is used at run time, so it lives outside the installed packages.
Servers (moto S3, wsgidav WebDAV, olah as a Hugging Face endpoint plus a small Hub write API)
listen on loopback only and are stopped by their context managers.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from zoo.registry.manifest import Build, Lineage, Manifest, Port


def tiny_onnx(path: Path, *, scale: float = 2.0, external: str | None = None, big_bytes: int = 0) -> Path:
    """Write a tiny valid ONNX model (y = x * scale + w), ir_version 13.

    `external` stores the weight as external data at that location (unchecked: tests use it to
    write hostile locations); `big_bytes` pads the weight to about that many bytes.
    """
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    n = max(4, big_bytes // 4)
    w = np.full((n,), scale, dtype=np.float32)
    init = numpy_helper.from_array(w, "w")
    if external is not None:
        init.ClearField("raw_data")
        init.data_location = TensorProto.EXTERNAL
        for k, v in (("location", external), ("offset", "0"), ("length", str(w.nbytes))):
            e = init.external_data.add()
            e.key, e.value = k, v
    node = helper.make_node("Add", ["x", "w"], ["y"])
    graph = helper.make_graph([node], "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n])], [init])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="zoo-tests")
    model.ir_version = 13
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString())
    return path


def make_staging(root: Path, name: str = "tiny", version: str = "1.0.0", *,
                 builds: dict[str, dict] | None = None, scale: float = 2.0, card: str | None = "# tiny\n",
                 big_bytes: int = 0, task: str = "regression", description: str = "a tiny test model") -> Path:
    """A staging folder for `LocalZoo.publish`: one tiny ONNX model per build plus a model card.

    `builds` maps build name -> extra Build fields (metrics, execution_providers, requires...).
    """
    from zoo.registry.staging import file_ref, write_manifest

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    builds = builds if builds is not None else {"cpu-fp32": {"metrics": {"latency_p50_ms": 1.5, "accuracy": 0.9}}}
    built = {}
    for i, (bname, extra) in enumerate(builds.items()):
        rel = f"builds/{bname}/model.onnx"
        tiny_onnx(root / rel, scale=scale + i, big_bytes=big_bytes)
        built[bname] = Build(name=bname, file=file_ref(root, rel), opset=17,
                             inputs=[Port(name="x", dtype="float32", shape=[4])],
                             outputs=[Port(name="y", dtype="float32", shape=[4])], **extra)
    card_ref = None
    if card is not None:
        (root / "README.md").write_text(card)
        card_ref = file_ref(root, "README.md")
    manifest = Manifest(name=name, version=version, description=description, task=task, license="mit",
                        builds=built, card=card_ref,
                        lineage=Lineage(recipe={"name": name, "digest": "0" * 64}, tools={"onnx": "1.23"}))
    write_manifest(root, manifest)
    return root


def manifest_json(root: Path) -> dict:
    return json.loads((Path(root) / "zoo-manifest.json").read_text())


# ---- servers on 127.0.0.1 ------------------------------------------------------------------
import contextlib as _contextlib
import os as _os
import socket as _socket
import subprocess as _subprocess
import sys as _sys
import threading as _threading
import time as _time


def free_port() -> int:
    with _socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float = 30.0, proc=None) -> None:
    """Return once something listens on 127.0.0.1:`port`; RuntimeError if `proc` exits or time runs out."""
    deadline = _time.monotonic() + timeout
    while _time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode}")
        with _contextlib.suppress(OSError), _socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        _time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout}s")


def stop_process(proc) -> None:
    """Stop a test server: SIGTERM, then SIGKILL if it has not exited within 10 s."""
    proc.terminate()
    try:
        proc.wait(10)
    except _subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@_contextlib.contextmanager
def moto_s3(bucket: str = "zoo"):
    """A moto S3 server on 127.0.0.1 with `bucket` created; yields the endpoint URL.

    Sets fake AWS credentials in the environment for the duration (moto accepts any).
    """
    import boto3
    from moto.server import ThreadedMotoServer

    saved = {k: _os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")}
    _os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's request log
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
        yield endpoint
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                _os.environ.pop(k, None)
            else:
                _os.environ[k] = v


@_contextlib.contextmanager
def _cheroot(app):
    from cheroot import wsgi

    server = wsgi.Server(("127.0.0.1", 0), app, numthreads=8)
    server.prepare()
    t = _threading.Thread(target=server.serve, daemon=True, name="zoo-test-wsgi")
    t.start()
    try:
        yield server.bind_addr[1]
    finally:
        server.stop()
        t.join(5)


@_contextlib.contextmanager
def webdav_server(root: Path, user: str | None = "zoo", password: str = "secret"):
    """wsgidav (cheroot, in a thread) serving folder `root`; yields the base URL.

    With `user`, basic auth is required; with ``user=None`` anyone may read and write (used
    to serve a remote folder as plain read-only HTTP in tests)."""
    import logging

    from wsgidav.wsgidav_app import WsgiDAVApp

    Path(root).mkdir(parents=True, exist_ok=True)
    config = {
        "provider_mapping": {"/": str(root)},
        "http_authenticator": {"domain_controller": None, "accept_basic": True, "accept_digest": False,
                               "default_to_digest": False},
        "simple_dc": {"user_mapping": {"*": {user: {"password": password}} if user else True}},
        "verbose": 0,
        "logging": {"enable": False, "enable_loggers": []},
        "property_manager": True,
        "lock_storage": True,
    }
    app = WsgiDAVApp(config)
    logging.getLogger("wsgidav").setLevel(logging.ERROR)
    with _cheroot(app) as port:
        yield f"http://127.0.0.1:{port}"


@_contextlib.contextmanager
def olah_server(mirrors: Path, work: Path):
    """olah (a Hugging Face mirror server) on 127.0.0.1 serving the git repos under
    ``mirrors/models/<org>/<repo>``, offline; yields its endpoint URL. Runs as a subprocess."""
    port = free_port()
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    (Path(mirrors) / "models").mkdir(parents=True, exist_ok=True)
    cfg = work / "olah.toml"
    cfg.write_text(f'[basic]\nhost = "127.0.0.1"\nport = {port}\nrepos-path = "{work / "repos"}"\n'
                   f'mirrors-path = ["{mirrors}"]\nmetadata-cache-ttl = 0\n[accessibility]\noffline = true\n')
    log = open(work / "olah.log", "wb")
    proc = _subprocess.Popen([_sys.executable, "-m", "olah.server", "-c", str(cfg), "--log-path", str(work / "logs")],
                             cwd=work, stdout=log, stderr=_subprocess.STDOUT)
    try:
        wait_port(port, 60, proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_process(proc)
        log.close()


class HubWriteApp:
    """A test stand-in for the write half of the Hub API (not the Hub's code, and not a full
    implementation): enough for huggingface_hub's create_repo, create_commit (regular uploads),
    create_tag and delete_tag, committing into the git repos olah serves.
    Every other request is proxied to olah, so one endpoint serves reads and writes.

    Tag creation holds a lock and answers 409 when the tag exists: the same create-exclusive
    behaviour as the Hub."""

    def __init__(self, mirrors: Path, olah_url: str):
        self.mirrors = Path(mirrors)
        self.olah = olah_url
        self.lock = _threading.Lock()
        self.ranges: list[tuple[str, int]] = []  # (path, start) of every ranged GET answered
        self.break_next: set[str] = set()  # paths whose next GET is cut off half-way
        import httpx

        self.http = httpx.Client(base_url=olah_url, timeout=60)

    # -- git --
    def _git(self, repo: Path, *args: str) -> str:
        out = _subprocess.run(["git", "-C", str(repo), "-c", "user.name=zoo", "-c", "user.email=zoo@localhost", *args],
                              capture_output=True, text=True)
        if out.returncode:
            raise RuntimeError(f"git {' '.join(args)}: {out.stderr.strip()}")
        return out.stdout.strip()

    def _repo(self, org: str, name: str) -> Path:
        from zoo.pathsafety import safe_join

        return safe_join(self.mirrors / "models", f"{org}/{name}")

    # -- wsgi --
    def __call__(self, environ, start_response):

        method = environ["REQUEST_METHOD"]
        path = environ.get("PATH_INFO", "")
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else b""
        try:
            if method == "POST" and path == "/api/repos/create":
                return self._create(json.loads(body), start_response)
            if method == "POST" and path == "/api/validate-yaml":
                return _json(start_response, 200, {})
            m = re.match(r"^/api/models/([^/]+)/([^/]+)/(preupload|commit|tag)/(.+)$", path)
            if m and method == "POST":
                org, name, op, rev = m.groups()
                return getattr(self, f"_{op}")(self._repo(org, name), rev, body, start_response)
            if m and method == "DELETE" and m.group(3) == "tag":
                return self._delete_tag(self._repo(m.group(1), m.group(2)), m.group(4), start_response)
        except RuntimeError as e:
            return _json(start_response, 400, {"error": str(e)})
        return self._proxy(environ, method, path, body, start_response)

    def _create(self, payload, start_response):
        repo = self._repo(payload.get("organization") or "user", payload["name"])
        url = f"{self.olah}/{repo.parent.name}/{repo.name}"
        with self.lock:
            if repo.exists():
                return _json(start_response, 409, {"error": "You already created this model repo", "url": url})
            repo.mkdir(parents=True)
            self._git(repo, "init", "-q", "-b", "main")
            (repo / ".gitattributes").write_text("*.onnx binary\n")
            self._git(repo, "add", "-A")
            self._git(repo, "commit", "-q", "-m", "initial commit")
        return _json(start_response, 200, {"url": url})

    def _preupload(self, repo, rev, body, start_response):
        files = json.loads(body)["files"]
        return _json(start_response, 200, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                                                     for f in files]})

    def _commit(self, repo, rev, body, start_response):
        import base64

        from zoo.pathsafety import safe_join

        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        summary = next((x["value"]["summary"] for x in lines if x["key"] == "header"), "commit")
        with self.lock:
            for item in lines:
                if item["key"] == "file":
                    target = safe_join(repo, item["value"]["path"])
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(base64.b64decode(item["value"]["content"]))
                elif item["key"] == "deletedFile":
                    safe_join(repo, item["value"]["path"]).unlink(missing_ok=True)
                elif item["key"] != "header":
                    return _json(start_response, 400, {"error": f"unsupported commit operation {item['key']}"})
            self._git(repo, "add", "-A")
            self._git(repo, "commit", "-q", "--allow-empty", "-m", summary)
            oid = self._git(repo, "rev-parse", "HEAD")
        return _json(start_response, 200, {"commitUrl": f"{self.olah}/{repo.parent.name}/{repo.name}/commit/{oid}",
                                           "commitOid": oid, "pullRequestUrl": None})

    def _tag(self, repo, rev, body, start_response):
        tag = json.loads(body)["tag"]
        with self.lock:
            exists = _subprocess.run(["git", "-C", str(repo), "rev-parse", "-q", "--verify", f"refs/tags/{tag}"],
                                     capture_output=True).returncode == 0
            if exists:
                return _json(start_response, 409, {"error": f"tag {tag} already exists"})
            self._git(repo, "tag", tag, rev)
        return _json(start_response, 200, {})

    def _delete_tag(self, repo, tag, start_response):
        with self.lock:
            try:
                self._git(repo, "tag", "-d", tag)
            except RuntimeError:
                return _json(start_response, 404, {"error": f"tag {tag} not found"})
        return _json(start_response, 200, {})

    def _proxy(self, environ, method, path, body, start_response):
        headers = {k[5:].replace("_", "-").lower(): v for k, v in environ.items() if k.startswith("HTTP_")}
        headers.pop("host", None)
        if environ.get("CONTENT_TYPE"):
            headers["content-type"] = environ["CONTENT_TYPE"]
        query = environ.get("QUERY_STRING", "")
        wanted = headers.pop("range", None)
        r = self.http.request(method, path + (f"?{query}" if query else ""), headers=headers, content=body or None)
        hop = {"transfer-encoding", "connection", "keep-alive", "content-encoding", "content-length"}
        out = [(k, v) for k, v in r.headers.items() if k.lower() not in hop]
        data = r.content
        status = f"{r.status_code} {r.reason_phrase}"
        m = re.match(r"^bytes=(\d+)-$", wanted or "")
        if method == "GET" and r.status_code == 200 and m:
            # olah ignores Range for local mirrors; answer it here so clients can resume
            start = int(m.group(1))
            self.ranges.append((path, start))
            out.append(("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}"))
            data, status = data[start:], "206 Partial Content"
        if method == "GET" and path in self.break_next:
            # simulate a connection that drops mid-body (tests of resumable downloads)
            self.break_next.discard(path)
            out.append(("Content-Length", str(len(data))))
            start_response(status, out)
            return _Broken(data[: len(data) // 2])
        out.append(("Content-Length", str(len(data)) if method != "HEAD" else r.headers.get("content-length", "0")))
        start_response(status, out)
        return [data] if method != "HEAD" else []


class _Broken:
    """A WSGI body that sends some bytes and then fails, so the server drops the connection."""

    def __init__(self, head: bytes):
        self.head = head

    def __iter__(self):
        yield self.head
        raise ConnectionAbortedError("simulated connection drop")


def _json(start_response, status: int, obj) -> list[bytes]:
    data = json.dumps(obj).encode()
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 409: "Conflict"}.get(status, "")
    start_response(f"{status} {reason}", [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
    return [data]


@_contextlib.contextmanager
def hub_server(work: Path):
    """A Hub-like endpoint on 127.0.0.1: olah (a real Hub mirror) for reads + the `HubWriteApp`
    stand-in for writes.

    Yields the `HubWriteApp`; its ``url`` attribute is the endpoint to give huggingface_hub."""
    mirrors = Path(work) / "mirrors"
    with olah_server(mirrors, Path(work) / "olah") as olah_url:
        app = HubWriteApp(mirrors, olah_url)
        try:
            with _cheroot(app) as port:
                app.url = f"http://127.0.0.1:{port}"
                yield app
        finally:
            app.http.close()


DOCKER_REGISTRY = "/usr/bin/docker-registry"
DOCKER_REGISTRY_INSTALL = "apt-get install -y docker-registry (./dev setup does it)"


@_contextlib.contextmanager
def docker_registry(root: Path, *, htpasswd: Path | None = None, token: dict | None = None):
    """Debian's `docker-registry` (the CNCF distribution registry, 2.8) on a free port of
    127.0.0.1, storing in `root` (``docker/registry/v2/…`` under it), deletes enabled; with
    `htpasswd`, every request needs Basic credentials from that file; with `token` (realm, service,
    issuer, rootcertbundle), a Bearer token from that service (`token_registry`). Yields ``127.0.0.1:PORT``."""
    import json

    if not Path(DOCKER_REGISTRY).exists():
        raise AssertionError(f"{DOCKER_REGISTRY} is missing: {DOCKER_REGISTRY_INSTALL}")
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config = {
        "version": 0.1,
        "log": {"level": "warn", "accesslog": {"disabled": True}},
        "storage": {"filesystem": {"rootdirectory": str(root / "data")}, "delete": {"enabled": True},
                    "maintenance": {"uploadpurging": {"enabled": False}}},
        "http": {"addr": f"127.0.0.1:{port}", "secret": "zoo-tests"},
    }
    if htpasswd is not None:
        config["auth"] = {"htpasswd": {"realm": "zoo-tests", "path": str(htpasswd)}}
    if token is not None:
        config["auth"] = {"token": token}
    (root / "config.yml").write_text(json.dumps(config))  # JSON is YAML
    log = open(root / "registry.log", "wb")
    proc = _subprocess.Popen([DOCKER_REGISTRY, "serve", str(root / "config.yml")], stdout=log, stderr=_subprocess.STDOUT)
    try:
        try:
            wait_port(port, proc=proc)
        except RuntimeError as e:
            raise AssertionError(f"docker-registry did not start ({e}): {(root / 'registry.log').read_text()}") from None
        yield f"127.0.0.1:{port}"
    finally:
        stop_process(proc)
        log.close()


def htpasswd_file(path: Path, user: str, password: str) -> Path:
    """An htpasswd file with one bcrypt entry (what distribution's htpasswd auth reads)."""
    import bcrypt

    path.write_text(f"{user}:{bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()}\n")
    return path


@_contextlib.contextmanager
def token_registry(root: Path, user: str, password: str):
    """docker-registry with Docker's token authentication, as GHCR, Docker Hub and Harbor run it:
    the registry answers 401 with a Bearer challenge naming a token service; that service (a small
    http.server here, on 127.0.0.1) takes `user`/`password` by Basic auth and issues an ES256 JWT
    (its signing certificate in the registry's rootcertbundle) granting what the scope asks.
    Yields (``127.0.0.1:PORT`` of the registry, the scopes it issued tokens for)."""
    import base64
    import datetime
    import http.server
    import json
    import urllib.parse
    import uuid

    import jwt
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "zoo-test-token-issuer")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    bundle = root / "token-ca.pem"
    bundle.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    x5c = base64.b64encode(cert.public_bytes(serialization.Encoding.DER)).decode()
    want = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    issued: list[str] = []

    class Tokens(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet
            pass

        def do_GET(self):
            query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
            if self.headers.get("Authorization") != want:
                self.send_response(401)
                self.end_headers()
                return
            access = []
            for scope in query.get("scope", []):
                kind, _, rest = scope.partition(":")
                target, _, actions = rest.rpartition(":")
                access.append({"type": kind, "name": target, "actions": actions.split(",")})
            issued.extend(query.get("scope", []))
            t = int(_time.time())
            claims = {"iss": "zoo-test-issuer", "sub": user, "aud": query.get("service", [""])[0], "exp": t + 300,
                      "nbf": t - 10, "iat": t, "jti": uuid.uuid4().hex, "access": access}
            token = jwt.encode(claims, key, algorithm="ES256", headers={"x5c": [x5c]})
            body = json.dumps({"token": token, "expires_in": 300}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Tokens)
    thread = _threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    realm = f"http://127.0.0.1:{server.server_address[1]}/token"
    try:
        with docker_registry(root / "registry", token={"realm": realm, "service": "zoo-test-registry",
                                                       "issuer": "zoo-test-issuer", "rootcertbundle": str(bundle)}) as host:
            yield host, issued
    finally:
        server.shutdown()
        server.server_close()
