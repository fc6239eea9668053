"""The zoo config files, read whole: the user's ``$ZOO_HOME/config.yaml`` and a project's ``.zoo/config.yaml``.

Both are YAML, schema-versioned, read within `zoo.yamlio`'s limits (10,000 values)::

    schema_version: 2
    cache: {remote: …, options: {…}, push: true}      # the remote run cache (zoo.engine.cache_config)
    signing:                                           # signed releases (zoo.registry.trust); schema 2
      key: ~/keys/release.pem                          # `zoo release` signs with it (user's config only)
      certificate: ~/keys/release.crt                  # with its chain: a certificate signature
      certificate_chain: [~/keys/intermediate.crt]
      require: true                                    # nothing unsigned enters from a remote or bundle
      trust: [~/keys/team.pub, ~/keys/team-root.crt]   # public keys and root certificates trusted

Schema 1 is the file before ``signing:`` (still read; a ``signing:`` section needs 2, so a zoo
that predates it refuses the file by its version rather than by an unknown key). The sections
are each read by their owner: this module reads the file and checks its shape and the
``signing:`` section's; which settings a project's file may set is the owners' rule (docs/trust.md).
The engine reads the ``cache:`` section through here, so the registry (which may not import the
engine) and the engine agree on one file.
"""

from __future__ import annotations

from pathlib import Path

from zoo.errors import InvalidInput

CONFIG_SCHEMA_VERSION = 2
READABLE_SCHEMA_VERSIONS = (1, 2)
PROJECT_CONFIG = Path(".zoo") / "config.yaml"
USER_CONFIG = "config.yaml"
SECTIONS = {1: {"cache"}, 2: {"cache", "signing"}}
SIGNING_KEYS = {"key": str, "certificate": str, "certificate_chain": list, "require": bool, "trust": list}


def user_config() -> Path:
    """``$ZOO_HOME/config.yaml``."""
    from zoo.paths import zoo_home

    return zoo_home() / USER_CONFIG


def project_config(start: Path) -> Path | None:
    """The nearest ``.zoo/config.yaml`` in `start` or a folder above it."""
    for folder in [start, *start.parents]:
        candidate = folder / PROJECT_CONFIG
        if candidate.is_file():
            return candidate
    return None


def read_bytes(path: Path) -> bytes:
    from zoo import yamlio

    try:
        return yamlio.read_bounded(path)
    except OSError as e:
        raise InvalidInput(f"{path}: cannot read the zoo config ({e.strerror})", hint="fix or delete the file") from None


def parse(path: Path, data: bytes) -> dict:
    """The config at `path` (bytes `data`) as a mapping of its sections; InvalidInput for a file zoo
    cannot use (not a mapping, a schema_version it does not read, an unknown section)."""
    from zoo import yamlio

    raw = yamlio.load_text(data, str(path), "the zoo config", hint="fix or delete the file", max_nodes=10_000) or {}
    if not isinstance(raw, dict):
        raise InvalidInput(f"{path}: a zoo config is a mapping", hint="see docs/cache.md and docs/releases.md")
    version = raw.get("schema_version")
    if version not in READABLE_SCHEMA_VERSIONS or isinstance(version, bool):
        raise InvalidInput(f"{path}: schema_version {version!r} is not supported",
                           hint=f"this zoo reads schema_version: {', '.join(map(str, READABLE_SCHEMA_VERSIONS))}")
    unknown = sorted(set(raw) - {"schema_version"} - SECTIONS[version])
    if unknown:
        newer = [k for k in unknown if k in SECTIONS[CONFIG_SCHEMA_VERSION]]
        raise InvalidInput(f"{path}: unknown setting {', '.join(map(str, unknown))}",
                           hint=f"`{newer[0]}:` needs schema_version: {CONFIG_SCHEMA_VERSION}" if newer else
                           "a zoo config holds `schema_version`, `cache: {remote, options, push}` and "
                           "`signing: {key, certificate, certificate_chain, require, trust}`")
    if "signing" in raw:
        raw["signing"] = _signing_section(path, data, raw["signing"])
    return raw


def _signing_section(path: Path, data: bytes, section) -> dict:
    """The ``signing:`` section checked: known keys, each of its type, lists of paths as strings."""
    from zoo import yamlio

    if section is None:
        return {}
    if not isinstance(section, dict):
        raise InvalidInput(f"{path}: signing must be a mapping", hint="signing: {key, certificate, require, trust}")
    for key, value in section.items():
        line = yamlio.line_of(data, ("signing", key))
        where = f"{path}:{line}" if line else str(path)
        want = SIGNING_KEYS.get(str(key))
        if want is None:
            raise InvalidInput(f"{where}: unknown signing setting {key}",
                               hint=f"signing: {{{', '.join(SIGNING_KEYS)}}}")
        if not isinstance(value, want) or (want is list and not all(isinstance(v, str) and v for v in value)) \
                or (want is str and not value.strip()):
            what = {str: "a path", list: "a list of paths", bool: "true or false"}[want]
            raise InvalidInput(f"{where}: signing.{key} must be {what}", hint="see docs/releases.md, 'Settings'")
    return dict(section)


def resolve_path(value: str, config: Path) -> Path:
    """A path a config names: ``~`` expanded, relative to the config's folder."""
    p = Path(value).expanduser()
    return (p if p.is_absolute() else Path(config).parent / p).resolve()
