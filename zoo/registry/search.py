"""`zoo search` as rows of builds: the local zoo's (its SQLite index, with each build's file added
from its manifest) and a remote zoo's (its model indexes and manifests, read through `RemoteZoo`).

Both give the same rows for the same versions, filtered by the same rules as `Index.search`:
text in the name, description or task (case-insensitive), task equal, a tag on the version,
`latency_p50_ms` ≤ max_latency and `accuracy` ≥ min_accuracy (a build without the metric does
not match a filter on it); only each model's newest version unless `all_versions`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from zoo.registry.index import build_passed
from zoo.registry.refs import Ref, version_key

if TYPE_CHECKING:
    from zoo.registry.index import VersionInfo
    from zoo.registry.manifest import Build, Manifest
    from zoo.registry.remote import RemoteZoo


def build_fields(build: "Build") -> dict:
    """What a search row says about a build's file and where it runs (beyond the index's metrics)."""
    return {"format": build.format, "precision": build.precision, "runtime": build.runtime,
            "verified": build.verified, "size": build.model_size(), "sha256": build.file.sha256}


def with_build_fields(rows: list[dict], manifest_of: Callable[[str, str], "Manifest | None"]) -> list[dict]:
    """The index's rows with `build_fields` added from each version's manifest (read once per version)."""
    manifests: dict[tuple[str, str], Manifest | None] = {}
    out = []
    for row in rows:
        key = (row["name"], row["version"])
        if key not in manifests:
            manifests[key] = manifest_of(*key)
        manifest = manifests[key]
        build = manifest.builds.get(row["build"]) if manifest is not None else None
        out.append(row | (build_fields(build) if build is not None else {}))
    return out


def search_remote(remote: "RemoteZoo", text: str = "", *, task: str | None = None, tag: str | None = None,
                  max_latency: float | None = None, min_accuracy: float | None = None,
                  all_versions: bool = False) -> list[dict]:
    """Builds on `remote` matching every filter, in the local search's order (name, newest version, build)."""
    versions = remote.list()
    if not all_versions:  # the newest version of each model (list() gives them newest first)
        newest: dict[str, VersionInfo] = {}
        for v in versions:
            if v.name not in newest or version_key(v.version) > version_key(newest[v.name].version):
                newest[v.name] = v
        versions = list(newest.values())
    versions = [v for v in versions if _version_matches(v, text, task, tag)]
    versions.sort(key=lambda v: version_key(v.version), reverse=True)  # newest first within a model...
    versions.sort(key=lambda v: v.name)  # ...models by name (a stable sort keeps the first order)
    rows = []
    for v in versions:
        manifest = remote.resolve(Ref(v.name, version=v.version))
        for name in sorted(manifest.builds):
            row = _row(manifest, manifest.builds[name])
            if _metrics_match(row, max_latency, min_accuracy):
                rows.append(row)
    return rows


def _version_matches(v: "VersionInfo", text: str, task: str | None, tag: str | None) -> bool:
    if text and not any(text.lower() in (field or "").lower() for field in (v.name, v.description, v.task)):
        return False
    if task and (v.task or "").lower() != task.lower():
        return False
    return not tag or tag in v.tags


def _row(manifest: "Manifest", build: "Build") -> dict:
    return {"name": manifest.name, "version": manifest.version, "task": manifest.task or "",
            "description": manifest.description or "", "build": build.name,
            "latency_p50_ms": _number(build.metrics.get("latency_p50_ms")),
            "accuracy": _number(build.metrics.get("accuracy")), "passed": build_passed(build.metrics),
            **build_fields(build)}


def _metrics_match(row: dict, max_latency: float | None, min_accuracy: float | None) -> bool:
    if max_latency is not None and (row["latency_p50_ms"] is None or row["latency_p50_ms"] > max_latency):
        return False
    return min_accuracy is None or (row["accuracy"] is not None and row["accuracy"] >= min_accuracy)


def _number(value) -> float | None:
    """A metric as the index stores it: a float, or None for a missing or non-numeric value."""
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an int past a float (a manifest bounds them)
        return None
