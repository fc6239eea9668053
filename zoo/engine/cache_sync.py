"""`zoo cache push | pull | status`: move run-cache entries between the local cache and the remote
one outside a run, and compare the two.

With recipes, each works on the stages of those recipes as they are now (their keys computed as
`zoo plan` does, stage by stage: a stage's key needs its upstream outputs, found locally or, for
`status` and `pull`, on the remote); without, `push` pushes every local entry and `status` counts
entries on each side. Transfers go through `zoo.engine.remote_cache.RemoteCache`, so they keep its
promises (objects before entries, create-exclusive entries, verified downloads).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from zoo.engine.cache import Cache, Entry
from zoo.engine.remote_cache import RemoteCache
from zoo.errors import InvalidInput


@dataclass
class StageSync:
    """One stage of a recipe: its key (None when an upstream is on neither side) and where it is."""

    recipe: str
    id: str
    key: str | None = None
    local: bool = False
    remote: bool | None = None  # None: not known (no key, or the remote could not be asked)
    pulled: bool = False
    pushed: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"recipe": self.recipe, "stage": self.id, "key": self.key, "local": self.local, "remote": self.remote,
                "pulled": self.pulled, "pushed": self.pushed}


def open_remote(cache: Cache, flag: str | None, recipe: Path | None) -> RemoteCache:
    """The remote run cache a command names (`--remote`), else the configured one; InvalidInput if none."""
    from zoo.engine import cache_config

    setting = cache_config.resolve(flag, recipe, "--remote")
    if setting is None:
        raise InvalidInput("no remote run cache is set",
                           hint="pass --remote URL, or set `cache: {remote: URL}` in .zoo/config.yaml (the project) "
                                "or $ZOO_HOME/config.yaml (you); see the README, 'Remote run cache'")
    remote = RemoteCache(cache, setting)
    remote.notes.extend(setting.notes)
    return remote


def walk(recipe: Path, remote: RemoteCache, *, pull: bool = False, ask_remote: bool = True) -> list[StageSync]:
    """Each stage of `recipe` in DAG order: its key and whether the local cache and the remote hold
    it; with `pull`, stages only the remote holds are downloaded into the local cache."""
    from zoo.engine import keys, pipeline
    from zoo.engine.runner import StageReport

    dag = pipeline.load(recipe)
    cache = remote.cache
    entries: dict[str, Entry] = {}
    reports: dict[str, StageReport] = {}
    rows = []
    for nid in dag.order():
        node = dag.nodes[nid]
        row = StageSync(recipe=dag.recipe.name, id=nid)
        reports[nid] = StageReport(id=nid, kind=node.kind, needs=list(node.needs))
        rows.append(row)
        if not all(up in entries for up in node.needs):
            continue
        parts, row.key = keys.stage_key(dag, node, entries, {a: r.record for a, r in reports.items() if r.record},
                                        cache.hashes)
        reports[nid].key, reports[nid].record = row.key, keys.record_digest(parts)
        local = cache.lookup(row.key)
        row.local = local is not None
        theirs = None
        if ask_remote and not remote.offline:
            theirs = remote.remote_entry(row.key)
            row.remote = theirs is not None
        if local is not None:
            entries[nid] = local
        elif theirs is not None and pull:
            fetched = remote.fetch(row.key)
            if fetched is not None:
                entries[nid], row.pulled, row.local = fetched, True, True
        elif theirs is not None:
            entries[nid] = theirs[0]  # its output digests give the keys downstream
    return rows


def push(remote: RemoteCache, recipes: Iterable[Path] = ()) -> dict[str, Any]:
    """Push the local entries of `recipes`' stages (every local entry when none is named)."""
    cache = remote.cache
    recipes = list(recipes)
    rows: list[StageSync] = []
    if recipes:
        todo = []
        for recipe in recipes:
            for row in walk(recipe, remote, ask_remote=False):
                rows.append(row)
                entry = cache.lookup(row.key) if row.key and row.local else None
                if entry is not None:
                    todo.append((row, entry))
    else:
        todo = [(None, e) for e in cache.iter_entries() if cache.lookup(e.key) is not None]
    totals = {"entries": 0, "already": 0, "objects": 0, "bytes": 0}
    for row, entry in todo:
        got = remote.push(entry)
        totals["entries" if got["created"] else "already"] += 1
        totals["objects"] += got["objects"]
        totals["bytes"] += got["bytes"]
        if row is not None:
            row.pushed, row.remote = bool(got["created"]), True
    return {"remote": remote.url, "remote_origin": remote.setting.origin, **totals, "stages": [r.to_json() for r in rows]}


def pull(remote: RemoteCache, recipes: Iterable[Path]) -> dict[str, Any]:
    """Download the remote entries the stages of `recipes` need that the local cache lacks."""
    rows = [row for recipe in recipes for row in walk(recipe, remote, pull=True)]
    return {"remote": remote.url, "remote_origin": remote.setting.origin,
            "pulled": sum(r.pulled for r in rows), "local": sum(r.local for r in rows),
            "missing": sum(not r.local for r in rows), "stages": [r.to_json() for r in rows]}


def status(remote: RemoteCache, recipes: Iterable[Path] = ()) -> dict[str, Any]:
    """Local vs remote: per stage of `recipes`, or counts of every entry on each side."""
    recipes = list(recipes)
    if recipes:
        rows = [row for recipe in recipes for row in walk(recipe, remote)]
        return {"remote": remote.url, "remote_origin": remote.setting.origin, "stages": [r.to_json() for r in rows]}
    local = {e.key for e in remote.cache.iter_entries()}
    theirs = set(remote.store.keys())
    return {"remote": remote.url, "remote_origin": remote.setting.origin,
            "local": len(local), "remote_entries": len(theirs), "both": len(local & theirs),
            "only_local": len(local - theirs), "only_remote": len(theirs - local)}
