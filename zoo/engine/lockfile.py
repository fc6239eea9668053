"""The lockfile next to a recipe (``recipes/alexnet.lock``): every stage's record and outputs, one
set of records per platform class.

What a record holds is what a reviewer needs to trust the bytes and what decides them: the
kind and its version, the config, the recipe-wide values the kind reads, the matrix, the digests
of its inputs and of the files it reads, the versions of the tools it uses, and the digests of
its outputs (plus the scalar metrics of the run that first built them, and where that ran). It
does not hold the stage's cache key or the digests of zoo's or the kind's code: code that changes
no byte must leave the lockfile as it is, so that an upgrade of zoo is not a diff in every
project. A key that moved while the record and the rebuilt bytes stayed equal is a note, not a
difference (zoo/engine/frozen.py); `record_identity` is the digest the lock, the cache entries
and the stamps in the outputs share.

It is YAML with a schema version and sorted keys, so it diffs cleanly. `zoo run` updates it,
`zoo run --frozen` refuses to change it, `zoo plan`/`status --why` compare against it to say
*why* a stage reruns, and `zoo repro --check` compares rebuilt outputs with it.

Platforms: output bytes depend on the CPU's kernels (zoo.host.platform_class), so the lock holds
``platforms: {class: {stage: record}}``, as conda-lock holds one resolution per platform. A
record filed under class P describes bytes that a machine of class P produced: the run files
each record under the class of the machine that built its cache entry (the entry's ``host``),
not the class of the machine that wrote the lock, so a cache shared between platforms (a
folder, a remote) never makes a lock lie, and the keys stay what was asked for (a hit built
elsewhere is still used: its record goes under its builder's class). Files of schema 1 and 2
hold one flat ``stages:`` map: each record is filed under the class of the ``host`` it records,
and records without one under `zoo.host.UNKNOWN_PLATFORM`, which no machine takes for its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


from zoo import yamlio
from zoo.errors import RecipeError
from zoo.engine.hashing import digest_json

# 2: each stage records the recipe-wide values its kind declares (`shared`), not only their
# digest, so `zoo plan` can name the field that changed; version 1 files are still read
# 3: records grouped by platform class (`platforms:`); versions 1 and 2 are still read
# 4: records without the key and the code digests (`files`: the files the stage reads; tools as
# the stage uses them); records of versions 1-3 are read, and match no record of this zoo's runs
LOCK_SCHEMA_VERSION = 4
READABLE_SCHEMA_VERSIONS = (1, 2, 3, 4)
# the fields of a record that say what built it (`record_identity`); outputs, metrics and host
# are what came out of it
IDENTITY_FIELDS = ("kind", "kind_version", "config", "shared", "matrix", "inputs", "files", "tools", "recipe", "lineage")
OPTIONAL_FIELDS = ("recipe", "lineage")  # only kinds that declare them have them


def record_identity(fields: dict[str, Any]) -> str:
    """The digest of what built a record: its `IDENTITY_FIELDS`, from key parts or from a lock
    record's fields alike. A mapping field that is absent or None counts as empty (a record's
    `to_json` leaves empty ones out), and an empty optional field as absent."""
    ident: dict[str, Any] = {}
    for f in IDENTITY_FIELDS:
        value = fields.get(f)
        if f in OPTIONAL_FIELDS and not value:
            continue
        ident[f] = _plain(value) if f in ("kind", "kind_version") else _plain(value or {})
    return digest_json(ident)


def lock_path(recipe_path: Path) -> Path:
    return recipe_path.with_suffix(".lock")


@dataclass
class StageLock:
    """What one stage was run (or found cached) with, and what it produced."""

    kind: str
    kind_version: str
    config: dict[str, Any]
    config_digest: str
    matrix: dict[str, str]
    inputs: dict[str, dict[str, str]]
    tools: dict[str, str]
    outputs: dict[str, str]
    # the digests of the files the stage reads (user code, data; keys.file_digests), by their key labels
    files: dict[str, str] = field(default_factory=dict)
    # the recipe-wide values the kind declares ({section: {field: value}}, see zoo.engine.keys.shared_values);
    # None in a record written by a version 1 lockfile, which holds only their digest (`shared_digest`)
    shared: dict[str, Any] | None = None
    shared_digest: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    recipe: dict[str, str] = field(default_factory=dict)
    lineage: dict[str, str] = field(default_factory=dict)  # ancestor id -> the digest of its record
    # Where the outputs were built (zoo.host.describe): its platform class is the one the record is
    # filed under (the lock's `platforms:` key); `--frozen` compares no other field of it. Kept out
    # of lineage, so a build's provenance does not change with the machine.
    host: dict[str, Any] = field(default_factory=dict)
    # read from a lockfile of schema 1-3 only: the key and code digests those recorded (never written)
    key: str = ""
    code: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_parts(cls, parts: dict[str, Any], outputs: dict[str, str], metrics: dict[str, Any],
                   host: dict[str, Any] | None = None) -> "StageLock":
        return cls(kind=parts["kind"], kind_version=parts["kind_version"], config=parts["config"],
                   config_digest=digest_json(parts["config"]), shared=_plain(parts["shared"]),
                   matrix=parts["matrix"], inputs=parts["inputs"], files=dict(parts.get("files", {})),
                   tools=parts["tools"], outputs=outputs, metrics=_scalar_metrics(metrics),
                   recipe=parts.get("recipe", {}), lineage=parts.get("lineage", {}), host=dict(host or {}))

    @classmethod
    def read(cls, data: dict[str, Any]) -> "StageLock":
        """A record as a lockfile of any readable schema holds it (1-3: `code` held the files too)."""
        data = dict(data)
        if "code" in data and "files" not in data:
            data["files"] = {k: v for k, v in (data.get("code") or {}).items() if not str(k).startswith("kind:")}
        return cls(**data)

    def identity(self) -> str:
        """`record_identity` of this record."""
        return record_identity(self.__dict__)

    def to_json(self) -> dict[str, Any]:
        data = dict(self.__dict__)
        for optional in ("recipe", "lineage", "host", "files"):  # only kinds that declare them have them
            if not data[optional]:
                del data[optional]
        if not data["shared_digest"]:  # only records read from a version 1 lockfile have it
            del data["shared_digest"]
        if data["shared"] is None:
            del data["shared"]
        del data["key"], data["code"]
        return data


@dataclass
class Lock:
    """A recipe's identity and its stage records by platform class ({class: {stage id: record}})."""

    recipe: dict[str, str]
    platforms: dict[str, dict[str, StageLock]] = field(default_factory=dict)

    def records(self, platform: str) -> dict[str, StageLock]:
        """The records of one platform class ({} when the lock has none)."""
        return self.platforms.get(platform, {})

    def record(self, stage_id: str, platform: str) -> StageLock | None:
        return self.platforms.get(platform, {}).get(stage_id)

    def stage_ids(self) -> set[str]:
        """Every stage some platform has a record of."""
        return {sid for records in self.platforms.values() for sid in records}

    def of_stage(self, stage_id: str) -> dict[str, StageLock]:
        """{platform class: record} of one stage, classes sorted."""
        return {p: self.platforms[p][stage_id] for p in sorted(self.platforms) if stage_id in self.platforms[p]}

    def reference(self, stage_id: str, platform: str) -> StageLock | None:
        """The record a run on `platform` is explained against: its own, else another class's.

        The key's parts other than upstream outputs (config, code, tools...) are the same on every
        platform, so another class's record still says why a stage reruns."""
        own = self.record(stage_id, platform)
        return own if own is not None else next(iter(self.of_stage(stage_id).values()), None)

    def identities(self) -> set[str]:
        """The `record_identity` of every record of every platform (what `zoo gc --keep` keeps the
        cache entries of)."""
        return {r.identity() for records in self.platforms.values() for r in records.values()}

    def to_yaml(self) -> str:
        platforms = {p: {sid: s.to_json() for sid, s in sorted(records.items())}
                     for p, records in sorted(self.platforms.items()) if records}
        data = {"schema_version": LOCK_SCHEMA_VERSION, "recipe": self.recipe, "platforms": platforms}
        header = ("# Written by `zoo run`; do not edit. `zoo run --frozen` fails if this would change.\n"
                  "# One set of stage records per platform class (CPU kernels decide float bytes; see zoo/host.py).\n")
        return header + yamlio.safe_dump(data, sort_keys=True, default_flow_style=False, width=120, allow_unicode=True)


def read(path: Path) -> Lock | None:
    """The lock at `path`, or None if there is none; RecipeError if it is unreadable."""
    try:
        text = yamlio.read_bounded(path)  # past the size limit: refused by safe_load, never read whole
    except FileNotFoundError:
        return None
    try:
        data = yamlio.safe_load(text) or {}
        version = data.get("schema_version")
        if version not in READABLE_SCHEMA_VERSIONS:
            raise ValueError(f"unsupported schema_version {version!r} (this zoo reads "
                             f"{', '.join(map(str, READABLE_SCHEMA_VERSIONS))})")
        if version >= 3:
            platforms = {str(p): {sid: StageLock.read(s) for sid, s in (records or {}).items()}
                         for p, records in (data.get("platforms") or {}).items()}
        else:
            platforms = _by_builder({sid: StageLock.read(s) for sid, s in (data.get("stages") or {}).items()})
        return Lock(recipe=data.get("recipe", {}), platforms=platforms)
    except (yamlio.YAMLError, ValueError, TypeError, AttributeError, RecursionError) as e:
        # RecursionError: a hand-made lockfile nested thousands of levels deep (zoo writes about 6)
        raise RecipeError(f"{path}: unreadable lockfile: {str(e)[:300]}",
                          hint=f"delete {path.name} and run `zoo run` to write a new one") from None


def _by_builder(stages: dict[str, StageLock]) -> dict[str, dict[str, StageLock]]:
    """Flat records (schema 1 and 2) grouped by the platform class of the host each records.

    Those records were written with the host of the cache entry they came from (the machine
    that built those bytes), so that host's class is where they belong; a record without one
    (older zoo) is `UNKNOWN_PLATFORM`'s, never taken for this machine's."""
    from zoo import host

    platforms: dict[str, dict[str, StageLock]] = {}
    for sid, record in stages.items():
        platforms.setdefault(host.platform_class(record.host) if record.host else host.UNKNOWN_PLATFORM, {})[sid] = record
    return platforms


def write(path: Path, lock: Lock) -> bool:
    """Write the lock atomically; False (and nothing written) when it is unchanged."""
    from zoo.files import atomic_write

    text = lock.to_yaml()
    try:
        if path.read_text(encoding="utf-8") == text:
            return False
    except FileNotFoundError:
        pass
    atomic_write(path, text.encode("utf-8"))
    return True


def _plain(value: Any) -> Any:
    """Nested plain dicts (the key's shared values may be dict subclasses, which YAML refuses)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _scalar_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """Keep the lock readable: scalar metrics only (tables live in the cache entry)."""
    return {k: v for k, v in sorted(metrics.items()) if isinstance(v, (int, float, str, bool)) or v is None}
