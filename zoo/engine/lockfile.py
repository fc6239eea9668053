"""The lockfile next to a recipe (``recipes/alexnet.lock``): every stage's key, inputs and outputs.

It is YAML with a schema version and sorted keys, so it diffs cleanly. `zoo run` updates it,
`zoo run --frozen` refuses to change it, `zoo plan`/`status --why` compare against it to say
*why* a stage reruns, and `zoo repro --check` compares rebuilt outputs with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from zoo.errors import RecipeError
from zoo.engine.hashing import digest_json

# 2: each stage records the recipe-wide values its kind declares (`shared`), not only their
# digest, so `zoo plan` can name the field that changed; version 1 files are still read
LOCK_SCHEMA_VERSION = 2
READABLE_SCHEMA_VERSIONS = (1, 2)


def lock_path(recipe_path: Path) -> Path:
    return recipe_path.with_suffix(".lock")


@dataclass
class StageLock:
    """What one stage was run (or found cached) with, and what it produced."""

    kind: str
    key: str
    kind_version: str
    config: dict[str, Any]
    config_digest: str
    matrix: dict[str, str]
    inputs: dict[str, dict[str, str]]
    code: dict[str, str]
    tools: dict[str, str]
    outputs: dict[str, str]
    # the recipe-wide values the kind declares ({section: {field: value}}, see zoo.engine.keys.shared_values);
    # None in a record written by a version 1 lockfile, which holds only their digest (`shared_digest`)
    shared: dict[str, Any] | None = None
    shared_digest: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    recipe: dict[str, str] = field(default_factory=dict)
    lineage: dict[str, str] = field(default_factory=dict)
    # Where the outputs were built (zoo.host.describe): informational, so `--frozen` ignores it,
    # and kept out of lineage, so a build's provenance does not change with the machine.
    host: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_parts(cls, key: str, parts: dict[str, Any], outputs: dict[str, str], metrics: dict[str, Any],
                   host: dict[str, Any] | None = None) -> "StageLock":
        return cls(kind=parts["kind"], key=key, kind_version=parts["kind_version"], config=parts["config"],
                   config_digest=digest_json(parts["config"]), shared=_plain(parts["shared"]),
                   matrix=parts["matrix"], inputs=parts["inputs"], code=parts["code"], tools=parts["tools"],
                   outputs=outputs, metrics=_scalar_metrics(metrics), recipe=parts.get("recipe", {}),
                   lineage=parts.get("lineage", {}), host=dict(host or {}))

    def to_json(self) -> dict[str, Any]:
        data = dict(self.__dict__)
        for optional in ("recipe", "lineage", "host"):  # only kinds that declare them have them; old entries lack host
            if not data[optional]:
                del data[optional]
        if not data["shared_digest"]:  # only records read from a version 1 lockfile have it
            del data["shared_digest"]
        if data["shared"] is None:
            del data["shared"]
        return data


@dataclass
class Lock:
    recipe: dict[str, str]
    stages: dict[str, StageLock]

    def to_yaml(self) -> str:
        data = {"schema_version": LOCK_SCHEMA_VERSION, "recipe": self.recipe,
                "stages": {sid: s.to_json() for sid, s in sorted(self.stages.items())}}
        header = "# Written by `zoo run`; do not edit. `zoo run --frozen` fails if this would change.\n"
        return header + yaml.safe_dump(data, sort_keys=True, default_flow_style=False, width=120, allow_unicode=True)


def read(path: Path) -> Lock | None:
    """The lock at `path`, or None if there is none; RecipeError if it is unreadable."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        data = yaml.safe_load(text) or {}
        version = data.get("schema_version")
        if version not in READABLE_SCHEMA_VERSIONS:
            raise ValueError(f"unsupported schema_version {version!r} (this zoo reads "
                             f"{', '.join(map(str, READABLE_SCHEMA_VERSIONS))})")
        stages = {sid: StageLock(**s) for sid, s in (data.get("stages") or {}).items()}
        return Lock(recipe=data.get("recipe", {}), stages=stages)
    except (yaml.YAMLError, ValueError, TypeError, AttributeError, RecursionError) as e:
        # RecursionError: a hand-made lockfile nested thousands of levels deep (zoo writes about 6)
        raise RecipeError(f"{path}: unreadable lockfile: {str(e)[:300]}",
                          hint=f"delete {path.name} and run `zoo run` to write a new one") from None


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
