"""A remote zoo where a DVC repo keeps its data: ``zoo remote add NAME --from-dvc REMOTE``.

DVC's remote named REMOTE is read from the repo's config as dvc merges it (``.dvc/config`` and
``.dvc/config.local``, plus the user's and the system's; relative folders resolved), through dvc
itself (the ``dvc`` extra). Its URL becomes the zoo remote's URL and the settings zoo has a name
for become its options. Credentials are never copied (zoo keeps none in ``remotes.json``): the
result names them and the environment variables that give them to zoo instead. Other settings
zoo has no use for are listed as skipped, so nothing is dropped silently.

The zoo's files live in their own folders under that URL (``zoo.registry.fsremote``); DVC's
objects (``files/md5/…``) are left alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from zoo.errors import InvalidInput, MissingExtra

DVC_EXTRA = "pip install 'zoo-onnx[dvc]'"

# DVC setting -> zoo option, per kind of remote (zoo.registry.config.OPTIONS)
_OPTIONS = {
    "s3": {"endpointurl": "endpoint_url", "region": "region", "profile": "profile", "allow_anonymous_login": "anon"},
    "webdav": {"user": "user", "ssl_verify": "verify_ssl"},
    "gcs": {"projectname": "project", "endpointurl": "endpoint_url"},
    "azure": {"account_name": "account_name"},
    "ssh": {"user": "username", "keyfile": "key_filename", "timeout": "connect_timeout"},
    "file": {},
    "http": {},
}
# where zoo takes each kind's credentials from instead
_CREDENTIALS_FROM = {
    "s3": "the AWS variables (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN) or -o profile=NAME",
    "webdav": "an environment variable named by -o password_env=VAR",
    "gcs": "Google's default credentials (GOOGLE_APPLICATION_CREDENTIALS names a service-account key file)",
    "azure": "AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT_KEY / AZURE_STORAGE_SAS_TOKEN, or `az login`",
    "ssh": "your ssh-agent and ~/.ssh keys (or -o key_filename=PATH); a password only from -o password_env=VAR",
    "http": "nowhere: zoo's https remotes are read-only and anonymous",
    "file": "nowhere: a folder needs none",
}
_SECRET_WORDS = ("password", "secret", "token", "key_id", "credential", "auth", "customer_key", "passphrase",
                 "account_key", "connection_string")


@dataclass
class DvcRemote:
    """A DVC remote as a zoo remote: URL, options, and what was not carried over (each with why)."""

    name: str
    url: str
    options: dict[str, str] = field(default_factory=dict)
    credentials: list[str] = field(default_factory=list)  # DVC settings holding secrets: never copied
    skipped: list[str] = field(default_factory=list)  # settings zoo has no option for
    config: str = ""  # where it was defined

    @property
    def notes(self) -> list[str]:
        out = []
        if self.credentials:
            kind = _kind(self.url)
            out.append(f"not copied (credentials): {', '.join(self.credentials)}; zoo reads them from "
                       f"{_CREDENTIALS_FROM[kind]}")
        if self.skipped:
            out.append(f"skipped (zoo has no such option): {', '.join(self.skipped)}")
        return out


def read(remote: str, repo: Path) -> DvcRemote:
    """DVC's remote `remote` of the repo at `repo`, mapped to a zoo remote (see the module docstring)."""
    repo = Path(repo).expanduser().resolve()
    dvc_dir = repo / ".dvc"
    if not dvc_dir.is_dir():
        raise InvalidInput(f"{repo} is not a DVC repo (it has no .dvc folder)",
                           hint="pass the repo with --dvc-repo PATH (default: the current folder)")
    try:
        from dvc.config import Config, ConfigError
    except ImportError:
        raise MissingExtra("--from-dvc reads the DVC repo's config with dvc, which is not installed",
                           hint=f"{DVC_EXTRA} (the 'dvc' extra)") from None
    try:
        config = Config(dvc_dir=str(dvc_dir), validate=False)
    except ConfigError as e:
        raise InvalidInput(f"{dvc_dir}: {e}", hint="fix it with `dvc remote modify`") from None
    remotes = {str(k): dict(v) for k, v in (config.get("remote") or {}).items()}
    if remote not in remotes:
        import difflib

        close = difflib.get_close_matches(remote, list(remotes), n=1)
        raise InvalidInput(f"the DVC repo {repo} has no remote {remote!r}" + (f" (did you mean {close[0]!r}?)" if close else ""),
                           hint=f"its remotes: {', '.join(sorted(remotes))}" if remotes else "add one with `dvc remote add`")
    settings = remotes[remote]
    url = _zoo_url(str(settings.get("url") or ""), remote, settings)
    kind = _kind(url)
    found = DvcRemote(name=remote, url=url, config=str(dvc_dir / "config"))
    for key, value in sorted(settings.items()):
        if key == "url" or (key == "port" and kind == "ssh"):  # the port went into the URL
            continue
        if any(word in key.lower() for word in _SECRET_WORDS) or key == "ask_password":
            found.credentials.append(key)
        elif key in _OPTIONS[kind] and not (key == "ssl_verify" and str(value).lower() not in ("true", "false")):
            found.options[_OPTIONS[kind][key]] = str(value).lower() if isinstance(value, bool) else str(value)
        else:
            found.skipped.append(key)
    return found


def _zoo_url(url: str, remote: str, settings: dict | None = None) -> str:
    """DVC's remote URL as zoo spells it: webdav[s]:// becomes webdav+http[s]://, azure:// az://,
    and an ssh remote's `port` setting joins its URL (zoo reads the port from the URL)."""
    low = url.lower()
    if low.startswith("webdavs://"):
        return "webdav+https://" + url[len("webdavs://"):]
    if low.startswith("webdav://"):
        return "webdav+http://" + url[len("webdav://"):]
    if low.startswith("azure://"):
        return "az://" + url[len("azure://"):]
    if low.startswith("ssh://"):
        port = (settings or {}).get("port")
        netloc, _, path = url[len("ssh://"):].partition("/")
        if port and ":" not in netloc.rsplit("@", 1)[-1]:
            netloc = f"{netloc}:{port}"
        return f"ssh://{netloc}/{path}"
    if low.startswith(("s3://", "gs://", "http://", "https://", "file://")) or url.startswith("/"):
        return url
    scheme = url.split("://", 1)[0] if "://" in url else "?"
    raise InvalidInput(f"DVC remote {remote!r} is {url!r}: zoo has no {scheme} remotes",
                       hint="zoo reuses DVC remotes that are folders, s3://, gs://, azure://, ssh://, webdav(s):// "
                            "or http(s)://")


def _kind(url: str) -> str:
    from zoo.storage.urls import scheme_of

    return scheme_of(url)
