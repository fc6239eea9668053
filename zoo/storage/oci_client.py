"""Byte-level access to an OCI registry (the distribution HTTP API, v2), through `requests`.

`OciClient` knows repositories, blobs, manifests and tags, never a zoo manifest
(`zoo.registry.oci` maps zoo onto it). What it does, and why it is here rather than oras-py:

- blobs: ``HEAD`` (present, and its size), ``GET`` with ``Range: bytes=N-`` (resumed downloads),
  upload by ``POST`` then one streamed ``PUT ?digest=`` (the monolithic upload every registry
  takes; oras-py reads the whole file into memory first), or ``PATCH`` chunks for a big blob;
  reads answered 5xx are asked again (a tag being rewritten), writes never;
- manifests: ``GET`` (read with a size bound: a stranger's JSON), ``HEAD`` (its digest),
  ``PUT`` by tag, ``DELETE`` by digest (the registry removes the tags on it too);
- listings: ``/v2/_catalog`` and ``/v2/<repo>/tags/list``, paged (``n``, ``last`` and the
  ``Link`` header);
- auth: the registry's challenge (``WWW-Authenticate``) answered with Basic credentials, or
  with a Bearer token fetched from its realm (Docker's token protocol) using them. Credentials
  come from the environment variables the remote's options name (``username_env``,
  ``password_env``) or from the Docker config (``$DOCKER_CONFIG/config.json``, else
  ``~/.docker/config.json``: ``auths`` and the ``credHelpers``/``credsStore`` helpers that
  `docker login` sets up), read when a registry asks and never written anywhere;
- plain HTTP only where asked (option ``insecure``) or on the loopback host; HTTPS otherwise.

Errors are zoo's: no answer is SourceUnreachable, 401/403 once credentials were tried is
AccessDenied with a hint naming `docker login`, anything else unexpected a StorageError.
"""

from __future__ import annotations

import base64
import json
import os
import re
from pathlib import Path
from typing import Callable, Iterator

from zoo.errors import AccessDenied, InvalidInput, SourceUnreachable, StorageError

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
MAX_JSON_BYTES = 4 << 20  # a manifest, config or zoo manifest read from a registry: bounded
CHUNK = 8 << 20
CHUNKED_ABOVE = 512 << 20  # a blob bigger than this goes up in PATCHes (`OciClient.put_file`)
UPLOAD_CHUNK = 64 << 20
PAGE = 1000  # entries per page of the catalog and tag listings
READ_RETRIES = 3  # a GET or HEAD answered 5xx is asked again this many times (`OciClient.request`)
LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")
# the distribution spec's grammar for a repository name and a tag
REPO_RE = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*)*$")
TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")
DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")


def parse_oci_url(url: str) -> tuple[str, str]:
    """``oci://HOST[:PORT]/PREFIX`` → (``HOST[:PORT]``, ``PREFIX``); InvalidInput naming the form."""
    rest = url[len("oci://"):] if url.lower().startswith("oci://") else ""
    host, _, prefix = rest.partition("/")
    prefix = prefix.strip("/")
    if not host or (prefix and not REPO_RE.fullmatch(prefix)):
        raise InvalidInput(f"{url!r} is not an OCI registry location",
                           hint="write oci://HOST[:PORT]/PREFIX, e.g. oci://ghcr.io/my-org/zoo; the prefix in "
                                "lower-case letters, digits and . _ - separated by /")
    return host, prefix


def credentials_hint(host: str, options: dict) -> str:
    """Where an OCI registry's credentials come from (zoo never stores them)."""
    env = ""
    if options.get("username_env") or options.get("password_env"):
        env = (f" (this remote reads ${options.get('username_env', '?')} and ${options.get('password_env', '?')} "
               "first)")
    return (f"log in with `docker login {host}` (or `oras login {host}`): zoo reads the Docker config, "
            f"$DOCKER_CONFIG/config.json or ~/.docker/config.json{env}; or name environment variables with "
            "`zoo remote add NAME URL --replace -o username_env=VAR -o password_env=VAR`; --offline uses only the local zoo")


def docker_config_path() -> Path:
    folder = os.environ.get("DOCKER_CONFIG")
    return Path(folder).expanduser() / "config.json" if folder else Path.home() / ".docker" / "config.json"


def docker_credentials(host: str) -> tuple[str, str] | None:
    """(user, secret) for `host` from the Docker config: an ``auths`` entry, else a credential
    helper (``credHelpers[host]``, else ``credsStore``) run as ``docker-credential-NAME get``."""
    path = docker_config_path()
    try:
        cfg = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise AccessDenied(f"cannot read the Docker config {path}: {e}", hint="fix the file, or `docker login` again") from e
    if not isinstance(cfg, dict):
        return None
    names = [host, f"https://{host}", f"http://{host}", f"https://{host}/v1/", f"https://{host}/v2/"]
    if host in ("docker.io", "registry-1.docker.io", "index.docker.io"):
        names.append("https://index.docker.io/v1/")  # where `docker login` files Docker Hub
    auths = cfg.get("auths") if isinstance(cfg.get("auths"), dict) else {}
    for name in names:
        entry = auths.get(name)
        if isinstance(entry, dict):
            if entry.get("username") and entry.get("password"):
                return str(entry["username"]), str(entry["password"])
            if entry.get("auth"):
                try:
                    user, _, secret = base64.b64decode(str(entry["auth"])).decode().partition(":")
                except ValueError as e:
                    raise AccessDenied(f"{path}: the `auth` of {name} is not base64 user:password",
                                       hint=f"`docker login {host}` again") from e
                return user, secret
    helpers = cfg.get("credHelpers") if isinstance(cfg.get("credHelpers"), dict) else {}
    helper = helpers.get(host) or cfg.get("credsStore")
    if isinstance(helper, str) and re.fullmatch(r"[A-Za-z0-9_.-]+", helper):
        return _from_helper(helper, host)
    return None


def _from_helper(helper: str, host: str) -> tuple[str, str] | None:
    """The Docker credential-helper protocol: the host on stdin, ``{"Username", "Secret"}`` out."""
    import subprocess

    try:
        out = subprocess.run([f"docker-credential-{helper}", "get"], input=host.encode(), capture_output=True,
                             timeout=30, check=True).stdout
        got = json.loads(out[:65536])
        return str(got["Username"]), str(got["Secret"])
    except (OSError, subprocess.SubprocessError, ValueError, KeyError, TypeError):
        return None  # no helper, or it knows no credentials for the host: go on without


def _challenge(header: str) -> tuple[str, dict[str, str]]:
    scheme, _, rest = header.strip().partition(" ")
    return scheme.lower(), dict(re.findall(r'(\w+)="([^"]*)"', rest))


class OciClient:
    """One registry (``HOST[:PORT]``) and how to authenticate to it."""

    def __init__(self, host: str, options: dict | None = None):
        try:
            import requests
        except ImportError:
            from zoo.errors import MissingExtra

            raise MissingExtra("OCI registry remotes need requests, which is not installed",
                               hint="pip install 'zoo-onnx[oci]'") from None
        from zoo.download import HTTP_TIMEOUT

        self.host = host
        self.options = dict(options or {})
        bare = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        self.loopback = bare in LOOPBACK
        plain = bool(self.options.get("insecure")) or self.loopback
        self.base = f"{'http' if plain else 'https'}://{host}"
        self.timeout = (HTTP_TIMEOUT, HTTP_TIMEOUT)
        self.session = requests.Session()
        # the environment's proxies and CA bundle apply, but never ~/.netrc's credentials (requests reads
        # them only for a session without auth): only those the module docstring names are sent
        self.session.auth = lambda request: request
        self.session.headers["User-Agent"] = "zoo"
        self._auth: dict[str, str] = {}  # scope -> Authorization header value
        self._basic: str | None = None

    # ---- requests -------------------------------------------------------------------------
    def _credentials(self) -> tuple[str, str] | None:
        user_env, pass_env = self.options.get("username_env"), self.options.get("password_env")
        if user_env or pass_env:
            user, secret = os.environ.get(str(user_env or "")), os.environ.get(str(pass_env or ""))
            if user and secret:
                return user, secret
        return docker_credentials(self.host)

    def request(self, method: str, path: str, *, what: str, ok: tuple[int, ...] = (200,), stream: bool = False,
                headers: dict | None = None, params: dict | None = None, data=None, url: str | None = None):
        """One request, authenticated when the registry challenges; the response when its status is
        in `ok` (or 404, which the caller reads as "not there"), else a zoo error."""
        import requests

        import time

        url = url or f"{self.base}{path}"
        scope = path.split("/blobs/")[0].split("/manifests/")[0].split("/tags/")[0]
        answered = False
        for attempt in range(READ_RETRIES + 2):
            hdrs = dict(headers or {})
            if scope in self._auth:
                hdrs["Authorization"] = self._auth[scope]
            try:
                r = self.session.request(method, url, headers=hdrs, params=params, data=data, stream=stream,
                                         timeout=self.timeout, allow_redirects=True)
            except requests.RequestException as e:
                raise SourceUnreachable(f"cannot reach the OCI registry {self.host} ({what}): {type(e).__name__}",
                                        hint="check the address and the network; run again to resume") from e
            if r.status_code == 401 and not answered and self._answer(r, scope, what):
                answered = True
                r.close()
                if hasattr(data, "seek"):
                    data.seek(0)
                continue
            # a read may meet a tag another client is rewriting: distribution's filesystem storage
            # answers 500 ("invalid checksum digest format") until the write is over. Reads only:
            # a write is not repeated behind the caller's back
            if r.status_code >= 500 and method in ("GET", "HEAD") and attempt < READ_RETRIES:
                r.close()
                time.sleep(0.1 * 3 ** attempt)
                continue
            break
        if r.status_code in ok or r.status_code == 404:
            return r
        r.close()
        if r.status_code in (401, 403):
            raise AccessDenied(f"the OCI registry {self.host} refused access: HTTP {r.status_code} ({what})",
                               hint=credentials_hint(self.host, self.options))
        if r.status_code == 405 and method == "DELETE":
            raise StorageError(f"the OCI registry {self.host} does not allow deleting ({what}): HTTP 405",
                               hint="the registry must run with deletes enabled (distribution: storage.delete.enabled: true)")
        if r.status_code >= 500 or r.status_code == 429:
            raise SourceUnreachable(f"the OCI registry {self.host} failed ({what}): HTTP {r.status_code}",
                                    hint="run again later; the registry may be overloaded")
        raise StorageError(f"the OCI registry {self.host}: {what} failed: HTTP {r.status_code} {_errors(r)}")

    def _answer(self, r, scope: str, what: str) -> bool:
        """Set the Authorization for `scope` from the registry's challenge; False when there is none to give."""
        kind, params = _challenge(r.headers.get("WWW-Authenticate", ""))
        creds = self._credentials()
        if creds is not None:
            self._refuse_plain_http(params.get("realm", "") if kind == "bearer" else self.base)
        if kind == "basic":
            if creds is None:
                return False
            self._auth[scope] = "Basic " + base64.b64encode(f"{creds[0]}:{creds[1]}".encode()).decode()
            return True
        if kind != "bearer" or not params.get("realm"):
            return False
        import requests

        query = {k: params[k] for k in ("service", "scope") if params.get(k)}
        try:
            t = self.session.get(params["realm"], params=query, timeout=self.timeout, auth=creds)
        except requests.RequestException as e:
            raise SourceUnreachable(f"cannot reach the token service of the OCI registry {self.host} ({what})") from e
        if t.status_code != 200:
            return False
        try:
            body = json.loads(t.content[:MAX_JSON_BYTES])
            token = body.get("token") or body.get("access_token")
        except (ValueError, AttributeError):
            token = None
        if not isinstance(token, str) or not token:
            return False
        self._auth[scope] = f"Bearer {token}"
        return True

    def _refuse_plain_http(self, url: str) -> None:
        """Credentials over plain HTTP are readable on the way: only to this machine."""
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        if parts.scheme == "http" and (parts.hostname or "") not in LOOPBACK:
            raise InvalidInput(f"the OCI registry {self.host} asks for credentials over plain HTTP ({parts.netloc}); "
                               "zoo would send them readable on the way; refused",
                               hint="reach the registry over https (drop `-o insecure=true`); plain HTTP with "
                                    "credentials only to 127.0.0.1 or localhost")

    # ---- blobs ----------------------------------------------------------------------------
    def blob_size(self, repo: str, digest: str) -> int | None:
        r = self.request("HEAD", f"/v2/{repo}/blobs/{digest}", what=f"look up blob {digest[:19]}")
        if r.status_code == 404:
            return None
        try:
            return int(r.headers.get("Content-Length", ""))
        except ValueError:
            return None

    def put_file(self, local: Path, rpath: str, progress: Callable[[int], None] | None = None) -> None:
        """Upload `local` as the blob `rpath` (``REPO@sha256:…``, the reference syntax): POST opens
        an upload; a file up to `CHUNKED_ABOVE` bytes goes in one streamed PUT naming its digest,
        a bigger one in PATCHes of `UPLOAD_CHUNK` bytes and a closing PUT (registries and their
        proxies cap a request's body). The registry checks the digest before it keeps the blob."""
        from urllib.parse import urljoin

        repo, digest = rpath.rsplit("@", 1)
        r = self.request("POST", f"/v2/{repo}/blobs/uploads/", what=f"start upload of {digest[:19]}", ok=(202,))
        location = r.headers.get("Location")
        if r.status_code == 404 or not location:
            raise StorageError(f"the OCI registry {self.host} did not open an upload to {repo}",
                               hint="check the repository name and that the registry accepts pushes")
        url = urljoin(f"{self.base}/", location)
        size = Path(local).stat().st_size
        path = f"/v2/{repo}/blobs/uploads/"  # names the auth scope; the upload's own URL is `url`
        what = f"upload blob {digest[:19]}"
        with open(local, "rb") as f:
            if size <= CHUNKED_ABOVE:
                self.request("PUT", path, url=url, params={"digest": digest}, data=_Metered(f, progress),
                             headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)},
                             what=what, ok=(201,))
                return
            start = 0
            while start < size:
                chunk = f.read(UPLOAD_CHUNK)
                end = start + len(chunk) - 1
                r = self.request("PATCH", path, url=url, data=chunk, what=f"{what} (bytes {start}-{end})", ok=(202,),
                                 headers={"Content-Type": "application/octet-stream", "Content-Range": f"{start}-{end}",
                                          "Content-Length": str(len(chunk))})
                if r.status_code == 404 or not r.headers.get("Location"):
                    raise StorageError(f"the OCI registry {self.host} lost the upload of {digest[:19]} at byte {start}",
                                       hint="run the push again: it starts that file again")
                url = urljoin(f"{self.base}/", r.headers["Location"])
                if progress is not None:
                    progress(len(chunk))
                start = end + 1
            self.request("PUT", path, url=url, params={"digest": digest}, data=b"", what=what, ok=(201,),
                         headers={"Content-Length": "0"})

    def put_bytes(self, repo: str, digest: str, data: bytes) -> None:
        import tempfile

        with tempfile.NamedTemporaryFile(prefix="zoo-oci-") as f:
            f.write(data)
            f.flush()
            self.put_file(Path(f.name), f"{repo}@{digest}")

    def iter_from(self, rpath: str, offset: int = 0, size: int | None = None) -> Iterator[bytes]:
        """The bytes of blob `rpath` (``REPO@sha256:…``) from `offset` on (``Range``);
        FileNotFoundError when it is not there. A registry that ignores Range sends the whole
        blob: the bytes before `offset` are skipped. (`size`: unused, the download checks it.)"""
        repo, digest = rpath.rsplit("@", 1)
        return self._stream(repo, digest, offset)

    def _stream(self, repo: str, digest: str, offset: int) -> Iterator[bytes]:
        import requests

        headers = {"Accept-Encoding": "identity", **({"Range": f"bytes={offset}-"} if offset else {})}
        r = self.request("GET", f"/v2/{repo}/blobs/{digest}", what=f"download blob {digest[:19]}", stream=True,
                         headers=headers, ok=(200, 206, 416))
        try:
            if r.status_code == 404:
                raise FileNotFoundError(digest)
            if r.status_code == 416:
                return  # nothing past the offset: the digest decides
            skip = offset if offset and r.status_code != 206 else 0
            try:
                for chunk in r.iter_content(CHUNK):
                    if skip:
                        cut = min(skip, len(chunk))
                        chunk, skip = chunk[cut:], skip - cut
                    if chunk:
                        yield chunk
            except requests.RequestException as e:
                raise SourceUnreachable(f"the download of {digest[:19]} from {self.host} broke off",
                                        hint="run again to resume") from e
        finally:
            r.close()

    def read_blob(self, repo: str, digest: str, limit: int = MAX_JSON_BYTES) -> bytes | None:
        """A small blob (a config, a zoo manifest) whole, at most `limit` bytes; None when absent."""
        out = bytearray()
        try:
            for chunk in self._stream(repo, digest, 0):
                out += chunk
                if len(out) > limit:
                    raise StorageError(f"the OCI registry {self.host}: blob {digest[:19]} of {repo} is over "
                                       f"{limit >> 20} MiB, more than zoo reads of such a file")
        except FileNotFoundError:
            return None
        return bytes(out)

    # ---- manifests and tags ---------------------------------------------------------------
    def get_manifest(self, repo: str, reference: str) -> tuple[bytes, str, str] | None:
        """(bytes, digest, media type) of the manifest at `reference` (a tag or digest); None when absent."""
        import hashlib

        r = self.request("GET", f"/v2/{repo}/manifests/{reference}", what=f"read {repo}:{reference}", stream=True,
                         headers={"Accept": f"{OCI_MANIFEST}, {OCI_INDEX}, {DOCKER_MANIFEST}"})
        try:
            if r.status_code == 404:
                return None
            data = bytearray()
            for chunk in r.iter_content(65536):
                data += chunk
                if len(data) > MAX_JSON_BYTES:
                    raise StorageError(f"the OCI registry {self.host}: the manifest {repo}:{reference} is over "
                                       f"{MAX_JSON_BYTES >> 20} MiB", hint="zoo reads manifests of at most that size")
        finally:
            r.close()
        digest = "sha256:" + hashlib.sha256(data).hexdigest()  # what we hold, whatever a header says
        return bytes(data), digest, r.headers.get("Content-Type", "").split(";")[0].strip()

    def manifest_digest(self, repo: str, reference: str) -> str | None:
        r = self.request("HEAD", f"/v2/{repo}/manifests/{reference}", what=f"look up {repo}:{reference}",
                         headers={"Accept": f"{OCI_MANIFEST}, {OCI_INDEX}, {DOCKER_MANIFEST}"})
        if r.status_code == 404:
            return None
        digest = r.headers.get("Docker-Content-Digest", "")
        if DIGEST_RE.fullmatch(digest):
            return digest
        got = self.get_manifest(repo, reference)
        return None if got is None else got[1]

    def put_manifest(self, repo: str, reference: str, data: bytes, media_type: str = OCI_MANIFEST) -> None:
        self.request("PUT", f"/v2/{repo}/manifests/{reference}", data=data, headers={"Content-Type": media_type},
                     what=f"write {repo}:{reference}", ok=(200, 201))

    def delete_manifest(self, repo: str, digest: str) -> bool:
        r = self.request("DELETE", f"/v2/{repo}/manifests/{digest}", what=f"delete {repo}@{digest[:19]}", ok=(202, 200))
        return r.status_code != 404

    def tags(self, repo: str) -> list[str]:
        return self._paged(f"/v2/{repo}/tags/list", "tags", f"list the tags of {repo}")

    def catalog(self) -> list[str]:
        return self._paged("/v2/_catalog", "repositories", "list the repositories")

    def _paged(self, path: str, key: str, what: str) -> list[str]:
        from urllib.parse import parse_qs, urlparse

        out: list[str] = []
        params: dict = {"n": PAGE}
        for _ in range(100_000):  # bounded: a registry that pages forever is refused, not followed forever
            r = self.request("GET", path, params=params, what=what)
            if r.status_code == 404:
                return out
            try:
                body = json.loads(r.content[:MAX_JSON_BYTES])
                page = body.get(key) or []
            except (ValueError, AttributeError):
                raise StorageError(f"the OCI registry {self.host}: {what}: not a JSON listing") from None
            if not isinstance(page, list) or not all(isinstance(x, str) for x in page):
                raise StorageError(f"the OCI registry {self.host}: {what}: `{key}` is not a list of names")
            out += page
            link = re.match(r'\s*<([^>]+)>\s*;\s*rel="?next"?', r.headers.get("Link", ""))
            if not link or not page:
                return out
            last = parse_qs(urlparse(link.group(1)).query).get("last")
            if not last:
                return out
            params = {"n": PAGE, "last": last[0]}
        raise StorageError(f"the OCI registry {self.host}: {what}: too many pages")


def _errors(r) -> str:
    try:
        errs = json.loads(r.content[:65536]).get("errors") or []
        return "; ".join(f"{e.get('code')}: {e.get('message')}" for e in errs if isinstance(e, dict))[:300]
    except (ValueError, AttributeError):
        return ""


class _Metered:
    """A file object that reports what requests reads of it (the upload's progress)."""

    def __init__(self, f, progress: Callable[[int], None] | None):
        self._f = f
        self._progress = progress

    def read(self, n: int = -1) -> bytes:
        data = self._f.read(CHUNK if n is None or n < 0 else n)
        if data and self._progress is not None:
            self._progress(len(data))
        return data

    def seek(self, *args):
        return self._f.seek(*args)

    def tell(self):
        return self._f.tell()

    def __len__(self) -> int:
        return os.fstat(self._f.fileno()).st_size - self._f.tell()
