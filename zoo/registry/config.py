"""Remote zoos configured for this local zoo: ``$ZOO_HOME/remotes.json`` (schema-versioned).

Credentials are never stored here (nor in any manifest): S3 uses the usual AWS chain
(environment variables or a named ``profile``), WebDAV reads its password from the
environment variable named by ``password_env``, SSH uses the ssh-agent / ``~/.ssh`` keys (or
``key_filename``) and checks ``known_hosts``, GCS uses Google's default credentials (or the
service-account key file named by ``credentials_file``), Azure a connection string or key from
the environment, Hugging Face uses ``HF_TOKEN`` / the huggingface_hub login (or the variable
named by ``token_env``). Options may name where a secret is (``*_env``, ``*_file``), never hold it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from zoo.errors import InvalidInput, NotFound
from zoo.files import atomic_write
from zoo.registry.refs import check_name
from zoo.storage.urls import scheme_of

CONFIG_FILE = "remotes.json"
CONFIG_SCHEMA_VERSION = 1

# which options each kind of remote accepts (all plain settings, never secrets)
OPTIONS: dict[str, dict[str, type]] = {
    "file": {"gc_grace": int},
    "s3": {"endpoint_url": str, "profile": str, "region": str, "anon": bool, "gc_grace": int},
    "webdav": {"user": str, "password_env": str, "verify_ssl": bool, "gc_grace": int},
    "ssh": {"username": str, "key_filename": str, "known_hosts": str, "password_env": str, "connect_timeout": int,
            "gc_grace": int},
    "gcs": {"endpoint_url": str, "project": str, "anon": bool, "credentials_file": str, "gc_grace": int},
    "azure": {"account_name": str, "connection_string_env": str, "anon": bool, "gc_grace": int},
    "http": {},
    "hf": {"endpoint": str, "token_env": str, "private": bool},
}
_SECRET_WORDS = ("password", "secret", "token", "credential", "access_key", "apikey", "api_key")
# an option that names where a secret is (a variable, a file) holds no secret itself
_POINTER_SUFFIXES = ("_env", "_file", "_filename")


class RemoteConfig(BaseModel):
    """One remote: where it is, its options, and mirror URLs tried in order after it."""

    model_config = ConfigDict(extra="forbid")
    name: str
    url: str
    options: dict[str, str | bool | int] = Field(default_factory=dict)
    mirrors: list[str] = Field(default_factory=list)

    @property
    def scheme(self) -> str:
        return scheme_of(self.url)

    @property
    def read_only(self) -> bool:
        return self.scheme == "http"


class RemotesFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    schema_version: Literal[1] = CONFIG_SCHEMA_VERSION
    remotes: list[RemoteConfig] = Field(default_factory=list, description="in the order pulls try them")


def parse_options(scheme: str, pairs: dict[str, str]) -> dict[str, str | bool]:
    """Validate remote options for `scheme`; secrets are refused with a pointer to env variables."""
    allowed = OPTIONS[scheme]
    out: dict[str, str | bool] = {}
    for key, value in pairs.items():
        low = key.lower()
        if not low.endswith(_POINTER_SUFFIXES) and any(w in low for w in _SECRET_WORDS):
            raise InvalidInput(f"option {key!r} looks like a credential; zoo never stores credentials",
                               hint="put the secret in an environment variable and pass its name, e.g. password_env=ZOO_DAV_PASSWORD")
        if key not in allowed:
            raise InvalidInput(f"unknown option {key!r} for a {scheme} remote",
                               hint=f"{scheme} remotes accept: {', '.join(sorted(allowed)) or 'no options'}")
        if allowed[key] is int and isinstance(value, str):
            try:
                out[key] = int(value)
            except ValueError:
                raise InvalidInput(f"option {key} must be a whole number, not {value!r}",
                                   hint="gc_grace is in seconds, e.g. gc_grace=3600") from None
            if out[key] < 0:
                raise InvalidInput(f"option {key} must not be negative", hint="gc_grace is in seconds, e.g. gc_grace=3600")
        elif allowed[key] is bool and isinstance(value, str):
            if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise InvalidInput(f"option {key} must be true or false, not {value!r}")
            out[key] = value.lower() in ("true", "1", "yes")
        else:
            out[key] = value
    return out


class RemotesConfig:
    """Read and edit ``remotes.json`` under a zoo root."""

    def __init__(self, root: Path):
        self.path = Path(root) / CONFIG_FILE

    def load(self) -> RemotesFile:
        try:
            raw = json.loads(self.path.read_text())
        except FileNotFoundError:
            return RemotesFile()
        except (OSError, ValueError) as e:
            raise InvalidInput(f"{self.path}: cannot read remotes config ({e})", hint="fix or delete the file") from e
        if isinstance(raw, dict) and raw.get("schema_version") not in (None, CONFIG_SCHEMA_VERSION):
            raise InvalidInput(f"{self.path}: schema_version {raw.get('schema_version')} is not supported",
                               hint=f"this zoo reads schema_version {CONFIG_SCHEMA_VERSION}; upgrade zoo")
        try:
            return RemotesFile.model_validate(raw)
        except ValidationError as e:
            raise InvalidInput(f"{self.path}: invalid remotes config: {e.errors()[0]['msg']}") from e

    def save(self, data: RemotesFile) -> None:
        atomic_write(self.path, (json.dumps(data.model_dump(mode="json"), indent=2) + "\n").encode())

    def list(self) -> list[RemoteConfig]:
        return list(self.load().remotes)

    def get(self, name: str) -> RemoteConfig:
        for r in self.load().remotes:
            if r.name == name:
                return r
        names = [r.name for r in self.load().remotes]
        raise NotFound(f"no remote called {name!r}",
                       hint=f"remotes: {', '.join(names)}" if names else "add one with `zoo remote add NAME URL`")

    def add(self, name: str, url: str, options: dict[str, str] | None = None, mirrors: list[str] | None = None,
            *, replace: bool = False) -> RemoteConfig:
        check_name(name, "remote name")
        scheme = scheme_of(url)
        if scheme == "file":
            url = str(Path(url.removeprefix("file://")).expanduser().resolve())
        for m in mirrors or []:
            if scheme == "hf" and scheme_of(m) != "http":
                raise InvalidInput(f"mirror {m!r} of a Hugging Face remote must be an endpoint URL",
                                   hint="e.g. https://hf-mirror.example.com (a Hub-compatible server)")
            if scheme != "hf" and scheme_of(m) == "hf":
                raise InvalidInput(f"mirror {m!r} cannot mirror {url!r}", hint="mirrors share the remote's folder layout")
        remote = RemoteConfig(name=name, url=url, options=parse_options(scheme, options or {}), mirrors=list(mirrors or []))
        data = self.load()
        if any(r.name == name for r in data.remotes):
            if not replace:
                raise InvalidInput(f"remote {name!r} already exists", hint="remove it first or pass --replace")
            data.remotes = [remote if r.name == name else r for r in data.remotes]
        else:
            data.remotes.append(remote)
        self.save(data)
        return remote

    def remove(self, name: str) -> None:
        data = self.load()
        if not any(r.name == name for r in data.remotes):
            self.get(name)  # raises NotFound with the list of remotes
        data.remotes = [r for r in data.remotes if r.name != name]
        self.save(data)
