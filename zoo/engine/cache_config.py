"""Which remote run cache a command uses: the `--cache-remote` flag, else the project's config,
else the user's.

Config files (YAML, schema-versioned; both optional)::

    # <project>/.zoo/config.yaml — the nearest one in the recipe's folder or a folder above it
    # $ZOO_HOME/config.yaml       — the user's
    schema_version: 1
    cache:
      remote: s3://team-bucket/zoo-cache   # a URL, or the name of a `zoo remote add` remote
      options: {endpoint_url: "http://minio:9000", profile: ci}   # as `zoo remote add -o`
      push: true                           # false: only read from the remote

The first of flag, project, user that names a remote wins (whole setting: the options come
from the same place as the URL). `remote: none` in a project config switches off a user's
remote for that project. A URL is any fsspec location zoo's remote backends reach (a folder,
``s3://``, ``webdav+https://``); a bare name is a remote of ``$ZOO_HOME/remotes.json``, whose
URL and options are reused (its run cache lives in the ``run-cache/`` folder under that URL, apart
from the versions). Credentials are never in these files: they come from the environment exactly
as for remote zoos (`zoo.registry.fsbackend.credentials_hint`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from zoo.errors import InvalidInput

CONFIG_SCHEMA_VERSION = 1
PROJECT_CONFIG = Path(".zoo") / "config.yaml"
USER_CONFIG = "config.yaml"
NAMED_REMOTE_FOLDER = "run-cache"  # under a `zoo remote add` remote's URL, beside its versions
_OFF = ("none", "off", "")


@dataclass(frozen=True)
class RemoteCacheSetting:
    """Where the remote run cache is and how to reach it; `origin` says where the setting came from."""

    url: str
    options: dict = field(default_factory=dict)
    push: bool = True
    origin: str = "--cache-remote"


def resolve(flag: str | None, recipe_path: Path | None) -> RemoteCacheSetting | None:
    """The remote cache for a command: `flag` (a URL or remote name; "none" for no remote), else
    the project config nearest `recipe_path` (or the working folder), else the user config."""
    if flag is not None:
        return None if flag.strip().lower() in _OFF else _setting(flag, {}, True, "--cache-remote")
    start = Path(recipe_path).resolve().parent if recipe_path is not None else Path.cwd()
    for path in [project_config(start), user_config()]:
        if path is None or not path.is_file():
            continue
        section = _read(path)
        if "remote" not in section:
            continue
        url = section["remote"]
        if url is None or str(url).strip().lower() in _OFF:
            return None
        return _setting(str(url), section.get("options") or {}, section.get("push", True), str(path))
    return None


def project_config(start: Path) -> Path | None:
    """The nearest ``.zoo/config.yaml`` in `start` or a folder above it."""
    for folder in [start, *start.parents]:
        candidate = folder / PROJECT_CONFIG
        if candidate.is_file():
            return candidate
    return None


def user_config() -> Path:
    """``$ZOO_HOME/config.yaml``."""
    from zoo.paths import zoo_home

    return zoo_home() / USER_CONFIG


def _read(path: Path) -> dict:
    """The `cache:` section of a config file (InvalidInput for a file zoo cannot use)."""
    import yaml

    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as e:
        raise InvalidInput(f"{path}: cannot read the zoo config ({e})", hint="fix or delete the file") from e
    if not isinstance(raw, dict):
        raise InvalidInput(f"{path}: a zoo config is a mapping", hint="see the README, 'Remote run cache'")
    if raw.get("schema_version") != CONFIG_SCHEMA_VERSION:
        raise InvalidInput(f"{path}: schema_version {raw.get('schema_version')!r} is not supported",
                           hint=f"this zoo reads schema_version: {CONFIG_SCHEMA_VERSION}")
    unknown = sorted(set(raw) - {"schema_version", "cache"})
    section = raw.get("cache") or {}
    if unknown or not isinstance(section, dict):
        raise InvalidInput(f"{path}: unknown setting {', '.join(unknown) or 'cache'}",
                           hint="a zoo config holds `schema_version` and `cache: {remote, options, push}`")
    bad = sorted(set(section) - {"remote", "options", "push"})
    if bad:
        raise InvalidInput(f"{path}: unknown cache setting {', '.join(bad)}", hint="cache: {remote, options, push}")
    if not isinstance(section.get("options") or {}, dict) or not isinstance(section.get("push", True), bool):
        raise InvalidInput(f"{path}: cache.options must be a mapping and cache.push true or false")
    return section


def _setting(value: str, options: dict, push: bool, origin: str) -> RemoteCacheSetting:
    """A URL with its options checked (no secrets), or a configured remote's URL and options."""
    from zoo.registry.config import parse_options, scheme_of

    value = value.strip()
    if _is_url(value):
        scheme = scheme_of(value)
        if scheme == "hf":
            raise InvalidInput(f"{value}: a Hugging Face remote cannot hold a run cache",
                               hint="use a folder, s3:// or webdav+https:// location")
        if scheme == "file":
            value = str(Path(value.removeprefix("file://")).expanduser().resolve())
        opts = parse_options(scheme, {str(k): v if isinstance(v, (bool, int)) else str(v) for k, v in options.items()})
        return RemoteCacheSetting(value, opts, push, origin)
    from zoo.paths import zoo_home
    from zoo.registry.config import RemotesConfig

    remote = RemotesConfig(zoo_home()).get(value)  # NotFound lists the configured remotes
    if remote.scheme == "hf":
        raise InvalidInput(f"remote {value} is a Hugging Face remote; it cannot hold a run cache",
                           hint="name a folder, S3 or WebDAV remote, or give a URL")
    if options:
        raise InvalidInput(f"{origin}: cache.options cannot be combined with the remote name {value!r}",
                           hint=f"its options are those of `zoo remote add {value} …`")
    return RemoteCacheSetting(f"{remote.url.rstrip('/')}/{NAMED_REMOTE_FOLDER}", dict(remote.options), push, origin)


def _is_url(value: str) -> bool:
    return "://" in value or value.startswith(("/", "~", "."))
