"""Which remote run cache a command uses: the `--cache-remote` flag, else the project's config,
else the user's.

Config files (YAML, schema-versioned; both optional)::

    # <project>/.zoo/config.yaml — the nearest one in the recipe's folder or a folder above it
    # $ZOO_HOME/config.yaml       — the user's
    schema_version: 1                    # or 2, which may also hold `signing:` (zoo.registry.zoo_config)
    cache:
      remote: s3://team-bucket/zoo-cache   # a URL, or the name of a `zoo remote add` remote
      options: {endpoint_url: "http://minio:9000", profile: ci}   # as `zoo remote add -o`
      push: true                           # false: only read from the remote

The first of flag, project, user that names a remote wins (whole setting: the options come
from the same place as the URL). `remote: none` in a project config switches off a user's
remote for that project. A URL is any fsspec location zoo's remote backends reach (a folder,
``s3://``, ``webdav+https://``); a bare name is one of the user's `zoo remote add` remotes
(zoo.registry.config: the user's config folder, then ``$ZOO_HOME/remotes.json``), whose
URL and options are reused (its run cache lives in the ``run-cache/`` folder under that URL, apart
from the versions). Credentials are never in these files: they come from the environment exactly
as for remote zoos (`zoo.storage.fsbackend.credentials_hint`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from zoo.errors import InvalidInput
from zoo.registry import zoo_config

CONFIG_SCHEMA_VERSION = zoo_config.CONFIG_SCHEMA_VERSION  # the file's; 1 (before `signing:`) still reads
# the options an unapproved project config may set: none names a credential or where one is sent
UNAPPROVED_OPTIONS = frozenset({"anon", "region", "gc_grace", "connect_timeout"})
PROJECT_CONFIG = zoo_config.PROJECT_CONFIG
USER_CONFIG = zoo_config.USER_CONFIG
NAMED_REMOTE_FOLDER = "run-cache"  # under a `zoo remote add` remote's URL, beside its versions
_OFF = ("none", "off", "")


@dataclass(frozen=True)
class RemoteCacheSetting:
    """Where the remote run cache is and how to reach it; `origin` says where the setting came from."""

    url: str
    options: dict = field(default_factory=dict)
    push: bool = True
    origin: str = "--cache-remote"
    notes: tuple[str, ...] = ()  # e.g. a project config not approved, so nothing is pushed
    unapproved: bool = False  # from a project config the user has not approved (`zoo config allow`)

    def describe(self) -> str:
        """"URL (from ORIGIN[, read only])": what a command prints about the remote it uses."""
        return f"{self.url} (from {self.origin}{'' if self.push else ', read only'})"


def resolve(flag: str | None, recipe_path: Path | None, flag_name: str = "--cache-remote") -> RemoteCacheSetting | None:
    """The remote cache for a command: `flag` (a URL or remote name; "none" for no remote), else
    the project config nearest `recipe_path` (or the working folder), else the user config."""
    if flag is not None:
        return None if flag.strip().lower() in _OFF else _setting(flag, {}, True, flag_name)
    start = Path(recipe_path).resolve().parent if recipe_path is not None else Path.cwd()
    project = project_config(start)
    for path in [project, user_config()]:
        if path is None or not path.is_file():
            continue
        data = _bytes(path)
        section = _read(path, data)
        if "remote" not in section:
            continue
        url = section["remote"]
        if url is None or str(url).strip().lower() in _OFF:
            return None
        setting = _setting(str(url), section.get("options") or {}, section.get("push", True), str(path))
        push, notes, unapproved = setting.push, (), False
        if path == project:
            from zoo.engine import config_trust

            unapproved = not config_trust.is_approved(path, data)
            if unapproved:
                _refuse_unapproved_options(path, data, section)
                if push:
                    push = False
                    notes = (f"{path} is a project config you have not approved: zoo reads from its remote run "
                             f"cache and pushes nothing to it (to push: read it, then `zoo config allow {path}`)",)
        return RemoteCacheSetting(setting.url, setting.options, push, setting.origin, notes, unapproved)
    return None


def _refuse_unapproved_options(path: Path, data: bytes, section: dict) -> None:
    """InvalidInput naming the first option an unapproved project config may not set."""
    for key in section.get("options") or {}:
        if str(key) not in UNAPPROVED_OPTIONS:
            from zoo import yamlio

            line = yamlio.line_of(data, ("cache", "options", key))
            raise InvalidInput(f"{path}:{line}: cache.options.{key}: a project's config may not set {key} until you "
                               "approve the file (it decides which of your credentials zoo sends, or where)",
                               hint=f"read {path}, then `zoo config allow {path}`; or set the remote in "
                                    "$ZOO_HOME/config.yaml (yours). Without approval a project config may set "
                                    f"only {', '.join(sorted(UNAPPROVED_OPTIONS))}")


def summary(path: Path) -> str:
    """What the config at `path` sets, in one line ("remote URL, options k=v, pushes"), checked as a
    run reads it: what `zoo config allow` shows before recording an approval."""
    section = _read(path, _bytes(path))
    if "remote" not in section:
        return "no remote run cache"
    remote = section["remote"]
    if remote is None or str(remote).strip().lower() in _OFF:
        return "no remote run cache (switched off)"
    options = ", ".join(f"{k}={v}" for k, v in (section.get("options") or {}).items())
    push = "pushes" if section.get("push", True) else "never pushes"
    return f"remote run cache {remote}" + (f", options {options}" if options else "") + f", {push}"


def project_config(start: Path) -> Path | None:
    """The nearest ``.zoo/config.yaml`` in `start` or a folder above it."""
    return zoo_config.project_config(start)


def user_config() -> Path:
    """``$ZOO_HOME/config.yaml``."""
    return zoo_config.user_config()


def _bytes(path: Path) -> bytes:
    return zoo_config.read_bytes(path)


def _read(path: Path, data: bytes) -> dict:
    """The `cache:` section of a config file (InvalidInput for a file zoo cannot use; the file's
    shape and its other sections are `zoo.registry.zoo_config`'s)."""
    section = zoo_config.parse(path, data).get("cache") or {}
    if not isinstance(section, dict):
        raise InvalidInput(f"{path}: unknown setting cache",
                           hint="a zoo config holds `schema_version` and `cache: {remote, options, push}`")
    bad = sorted(set(section) - {"remote", "options", "push"})
    if bad:
        raise InvalidInput(f"{path}: unknown cache setting {', '.join(bad)}", hint="cache: {remote, options, push}")
    if not isinstance(section.get("options") or {}, dict) or not isinstance(section.get("push", True), bool):
        raise InvalidInput(f"{path}: cache.options must be a mapping and cache.push true or false")
    return section


def _setting(value: str, options: dict, push: bool, origin: str) -> RemoteCacheSetting:
    """A URL with its options checked (no secrets), or a configured remote's URL and options: the
    one reading of a remote option (zoo.registry.config: a name, a folder or a URL)."""
    from zoo.registry.config import is_location, parse_options

    value = value.strip()
    if is_location(value):
        from zoo.registry.config import normalise_url
        from zoo.storage.urls import scheme_of

        scheme = scheme_of(value)
        if scheme in ("hf", "oci"):
            what = "a Hugging Face" if scheme == "hf" else "an OCI registry"
            raise InvalidInput(f"{value}: {what} remote cannot hold a run cache",
                               hint="use a folder, s3:// or webdav+https:// location (docs/zoo.md: OCI registries)")
        opts = parse_options(scheme, {str(k): v if isinstance(v, (bool, int)) else str(v) for k, v in options.items()})
        return RemoteCacheSetting(normalise_url(value), opts, push, origin)
    from zoo.paths import zoo_home
    from zoo.registry.config import RemotesConfig

    remote = RemotesConfig(zoo_home()).get(value)  # NotFound lists the configured remotes
    if remote.scheme in ("hf", "oci"):
        what = "a Hugging Face" if remote.scheme == "hf" else "an OCI registry"
        raise InvalidInput(f"remote {value} is {what} remote; it cannot hold a run cache",
                           hint="name a folder, S3 or WebDAV remote, or give a URL")
    if options:
        raise InvalidInput(f"{origin}: cache.options cannot be combined with the remote name {value!r}",
                           hint=f"its options are those of `zoo remote add {value} …`")
    return RemoteCacheSetting(f"{remote.url.rstrip('/')}/{NAMED_REMOTE_FOLDER}", dict(remote.options), push, origin)
