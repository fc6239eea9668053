"""Remote zoos: the user's named remotes, and the folder or URL a remote option may give instead.

Where the names live (schema-versioned ``remotes.json`` files):

- the user's config folder, ``$ZOO_CONFIG_DIR``, else the platform's user config folder
  (``$XDG_CONFIG_HOME/zoo``, i.e. ``~/.config/zoo`` on Linux): where `zoo remote add` writes, so a
  name works whichever local zoo ``$ZOO_HOME`` selects;
- ``$ZOO_HOME/remotes.json``: where zoo kept them before, still read (not moved: a command that
  only reads must not rewrite the user's files, and two local zoos may define one name
  differently). On a name both define, the user's config wins: the latest `zoo remote add
  --replace` always takes effect, and whoever can write a (shared) local zoo cannot redirect a
  name the user configured. `zoo remote remove` removes the name from both.

A zoo opened by its folder from Python (``LocalZoo(path)``, not the one ``$ZOO_HOME`` selects)
sees the user's remotes too, but its own ``remotes.json`` comes first and is the one that
`remote_add(…, zoo=…)` and `remote_remove(…, zoo=…)` edit, as before. A project's ``.zoo/config.yaml``
never defines a name (docs/trust.md).

A remote option (`--remote`, `--to`, `--cache-remote`) takes a name, a folder or a URL
(`RemotesConfig.get`): a value starting with ``/``, ``~`` or ``.`` or holding ``://`` is a
location, anything else a name (names cannot start with those characters, so no value is both).
A bare word that is not a configured name is an error, even if a folder of that name exists
here: ``./NAME`` reaches the folder, so a typo never becomes a new folder remote.

Credentials are never stored here (nor in any manifest): S3 uses the usual AWS chain
(environment variables or a named ``profile``), WebDAV reads its password from the
environment variable named by ``password_env``, SSH uses the ssh-agent / ``~/.ssh`` keys (or
``key_filename``) and checks ``known_hosts``, GCS uses Google's default credentials (or the
service-account key file named by ``credentials_file``), Azure a connection string or key from
the environment, Hugging Face uses ``HF_TOKEN`` / the huggingface_hub login (or the variable
named by ``token_env``), an OCI registry the Docker config (``docker login``; ``$DOCKER_CONFIG``)
or the variables named by ``username_env``/``password_env``. Options may name where a secret is (``*_env``, ``*_file``), never hold it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from zoo.errors import InvalidInput, NotFound
from zoo.files import atomic_write
from zoo.registry.refs import check_name
from zoo.storage.urls import scheme_of

CONFIG_FILE = "remotes.json"
# 2: a remote may carry `trust` (the public keys and root certificates its signed versions are checked
#    against, zoo.registry.trust). A file is written at the lowest version that holds what it says, so one
#    without trust keeps version 1, which older zoos read; version 1 still reads.
CONFIG_SCHEMA_VERSION = 2
READABLE_SCHEMA_VERSIONS = (1, 2)
LOCATION_FORMS = ("a folder (/abs/path, ./rel/path, ~/path), file://, s3://bucket/prefix, gs://bucket/prefix, "
                  "az://container/prefix, webdav+https://host/path, ssh://[user@]host[:port]/abs/path, https://… "
                  "(read-only), hf://namespace or oci://host[:port]/prefix (an OCI registry)")

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
    # insecure: plain http (the default only for 127.0.0.1/localhost); credentials: the Docker config,
    # or the variables these name (zoo.storage.oci_client)
    "oci": {"insecure": bool, "username_env": str, "password_env": str},
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
    # absolute paths of PEM public keys / root certificates trusted for this remote's signatures (schema 2)
    trust: list[str] = Field(default_factory=list)

    @property
    def scheme(self) -> str:
        return scheme_of(self.url)

    @property
    def read_only(self) -> bool:
        return self.scheme == "http"


class RemotesFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    schema_version: Literal[1, 2] = 1
    remotes: list[RemoteConfig] = Field(default_factory=list, description="in the order pulls try them")

    def dump(self) -> dict:
        """The stored form, at the lowest schema version that holds it (`trust` needs 2)."""
        data = self.model_dump(mode="json")
        data["schema_version"] = 2 if any(r.trust for r in self.remotes) else 1
        for r in data["remotes"]:
            if not r["trust"]:
                del r["trust"]
        return data


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


def user_config_dir() -> Path:
    """The user's zoo config folder: ``$ZOO_CONFIG_DIR``, else the platform's (``~/.config/zoo``)."""
    env = os.environ.get("ZOO_CONFIG_DIR")
    if env:
        return Path(env).expanduser().resolve()
    from platformdirs import user_config_dir as platform_config_dir

    return Path(platform_config_dir("zoo", appauthor=False)).resolve()


def is_location(value: str) -> bool:
    """Whether a remote option's value is a folder or URL (else it is a remote's name)."""
    return "://" in value or value.startswith(("/", "~", "."))


def normalise_url(url: str) -> str:
    """`url` as stored: a folder (or file:// URL) made absolute; InvalidInput for an unknown scheme."""
    if scheme_of(url) == "file":
        return str(Path(url.removeprefix("file://")).expanduser().resolve())
    return url


class _RemotesFile:
    """One ``remotes.json``."""

    def __init__(self, path: Path):
        self.path = path

    def load(self) -> RemotesFile:
        try:
            raw = json.loads(self.path.read_text())
        except FileNotFoundError:
            return RemotesFile()
        except (OSError, ValueError) as e:
            raise InvalidInput(f"{self.path}: cannot read remotes config ({e})", hint="fix or delete the file") from e
        if isinstance(raw, dict) and raw.get("schema_version") not in (None, *READABLE_SCHEMA_VERSIONS):
            raise InvalidInput(f"{self.path}: schema_version {raw.get('schema_version')} is not supported",
                               hint=f"this zoo reads schema_version {', '.join(map(str, READABLE_SCHEMA_VERSIONS))}; "
                                    "upgrade zoo")
        try:
            data = RemotesFile.model_validate(raw)
        except ValidationError as e:
            raise InvalidInput(f"{self.path}: invalid remotes config: {e.errors()[0]['msg']}") from e
        if data.schema_version == 1 and any(r.trust for r in data.remotes):
            raise InvalidInput(f"{self.path}: `trust` needs schema_version 2", hint="set \"schema_version\": 2")
        return data

    def save(self, data: RemotesFile) -> None:
        atomic_write(self.path, (json.dumps(data.dump(), indent=2) + "\n").encode())


class RemotesConfig:
    """The named remotes a local zoo sees (module docstring): the user's config, then the zoo's
    own ``remotes.json``; `get` also takes a folder or URL."""

    def __init__(self, root: Path):
        from zoo.paths import zoo_home

        own = _RemotesFile(Path(root) / CONFIG_FILE)
        user = _RemotesFile(user_config_dir() / CONFIG_FILE)
        # in precedence order; the first is where `add` writes and the ones `remove` edits
        if Path(root).resolve() == zoo_home():
            self._files, self._editable = [user, own], 2
        else:  # a zoo opened by its folder: its own remotes first, and only those are edited
            self._files, self._editable = [own, user], 1
        self.path = self._files[0].path

    def load(self) -> RemotesFile:
        """Every named remote, in the order pulls try them: those of the first file, then those of
        the next that no earlier one defines."""
        merged: list[RemoteConfig] = []
        for file in self._files:
            merged += [r for r in file.load().remotes if all(r.name != m.name for m in merged)]
        return RemotesFile(remotes=merged)

    def list(self) -> list[RemoteConfig]:
        return list(self.load().remotes)

    def sources(self) -> dict[Path, list[str]]:
        """The names each file contributes (those no earlier file defines), by file, in precedence order."""
        seen: set[str] = set()
        out: dict[Path, list[str]] = {}
        for file in self._files:
            names = [r.name for r in file.load().remotes if r.name not in seen]
            seen.update(names)
            if names:
                out[file.path] = names
        return out

    def get(self, value: str) -> RemoteConfig:
        """The remote a remote option names: a configured name, else a folder or URL (unnamed, no
        options). InvalidInput/NotFound, with the forms accepted, for anything else."""
        value = value.strip()
        if not value:
            raise InvalidInput("the remote is empty", hint=f"give a remote name (`zoo remote list`) or {LOCATION_FORMS}")
        if is_location(value):
            url = normalise_url(value)  # InvalidInput names the schemes for an unknown one
            return RemoteConfig(name=url, url=url)
        remotes = self.load().remotes
        for r in remotes:
            if r.name == value:
                return r
        names = ", ".join(r.name for r in remotes)
        known = f"configured remotes: {names}" if names else "no remote is configured (`zoo remote add NAME URL`)"
        folder = f"; for the folder {value} here, write ./{value}" if Path(value).exists() else ""
        try:
            check_name(value, "remote name")
        except InvalidInput:
            raise InvalidInput(f"{value!r} is neither a remote name nor a folder or URL",
                               hint=f"{known}{folder}; or give {LOCATION_FORMS}") from None
        raise NotFound(f"no remote called {value!r}", hint=f"{known}{folder}; or give {LOCATION_FORMS}")

    def add(self, name: str, url: str, options: dict[str, str] | None = None, mirrors: list[str] | None = None,
            *, replace: bool = False, trust: list[str] | None = None) -> RemoteConfig:
        check_name(name, "remote name")
        scheme = scheme_of(url)
        url = normalise_url(url)
        for m in mirrors or []:
            if scheme == "hf" and scheme_of(m) != "http":
                raise InvalidInput(f"mirror {m!r} of a Hugging Face remote must be an endpoint URL",
                                   hint="e.g. https://hf-mirror.example.com (a Hub-compatible server)")
            if scheme != "hf" and scheme_of(m) == "hf":
                raise InvalidInput(f"mirror {m!r} cannot mirror {url!r}", hint="mirrors share the remote's folder layout")
            if (scheme == "oci") != (scheme_of(m) == "oci"):
                raise InvalidInput(f"mirror {m!r} cannot mirror {url!r}",
                                   hint="an OCI registry's mirrors are OCI registries (oci://host/prefix), and only they")
        if scheme == "oci":
            from zoo.storage.oci_client import parse_oci_url

            for u in [url, *(mirrors or [])]:
                parse_oci_url(u)  # InvalidInput naming the form
        anchors = []
        if trust:
            from zoo.registry.anchors import load_anchor

            # each checked now (a PEM public key or certificate), kept by absolute path
            anchors = list(dict.fromkeys(load_anchor(t, "--trust").path for t in trust))
        remote = RemoteConfig(name=name, url=url, options=parse_options(scheme, options or {}), mirrors=list(mirrors or []),
                              trust=anchors)
        existing = next((r for r in self.load().remotes if r.name == name), None)
        if existing == remote:
            return remote  # the same definition again (a set-up script run twice, another ZOO_HOME): nothing to do
        if existing is not None and not replace:
            raise InvalidInput(f"remote {name!r} already exists, at {existing.url}",
                               hint="remove it first or pass --replace")
        target = self._files[0]
        data = target.load()
        if any(r.name == name for r in data.remotes):
            data.remotes = [remote if r.name == name else r for r in data.remotes]
        else:
            data.remotes.append(remote)
        target.save(data)
        return remote

    def remove(self, name: str) -> None:
        """Remove `name` from every file it may edit that defines it (the user's config and
        ``$ZOO_HOME/remotes.json``: else the zoo's old entry would reappear)."""
        found = False
        for file in self._files[:self._editable]:
            data = file.load()
            if any(r.name == name for r in data.remotes):
                data.remotes = [r for r in data.remotes if r.name != name]
                file.save(data)
                found = True
        if not found:
            self.get(name)  # raises NotFound with the list of remotes
            if any(r.name == name for r in self.load().remotes):
                raise InvalidInput(f"remote {name!r} is defined in {self._files[-1].path}, not in {self.path}",
                                   hint="remove it there: `zoo remote remove NAME` (with $ZOO_HOME set to this zoo)")
            raise NotFound(f"no remote called {name!r}", hint="`zoo remote list` shows the configured remotes")
