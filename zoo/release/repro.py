"""`zoo repro RECIPE --check`: rebuild stages without the cache and compare with the lockfile.

The rebuild runs in a fresh temporary cache, so nothing is a hit, and with publishing off. With
`stages`, only those are rebuilt: their upstream results are taken from the real cache (linked
into the temporary one), or rebuilt too when the real cache no longer has them. Each rebuilt
output's digest is compared with the lockfile's; for a differing ONNX file the first differing
tensor, attribute or node is named.

A differing stage whose lockfile record was built on a CPU with other SIMD features (`host:` in
the lockfile) says so: that alone changes float results.

Nothing is normalised away: a stage is identical only if every output byte is. Measurements
that cannot be bit-identical (latencies, throughput) are metrics, never output files, and are
not compared.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zoo import api, host, paths
from zoo.engine import lockfile
from zoo.engine.cache import Cache, Entry
from zoo.files import hardlink_or_copy
from zoo.errors import InvalidInput
from zoo.engine.runner import StageState

IDENTICAL, DIFFERS, REUSED, FAILED, UNLOCKED = "identical", "differs", "reused", "failed", "not in lockfile"


@dataclass
class StageCheck:
    id: str
    status: str
    details: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "status": self.status, "details": self.details}


@dataclass
class ReproReport:
    recipe: str
    stages: list[StageCheck]

    @property
    def ok(self) -> bool:
        return all(s.status in (IDENTICAL, REUSED) for s in self.stages)

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": 1, "recipe": self.recipe, "ok": self.ok, "stages": [s.to_json() for s in self.stages]}


def check(path: str | Path, *, stages: list[str] | None = None, cache_dir: str | Path | None = None,
          jobs: int = 1, on_update=None) -> ReproReport:
    """Rebuild (all or `stages`) in a temporary cache and compare output digests with the lockfile."""
    dag = api.load(path)
    lock = lockfile.read(lockfile.lock_path(dag.recipe.path))
    if lock is None:
        raise InvalidInput(f"{dag.recipe.path.name} has no lockfile to check against",
                           hint=f"run `zoo run {path}` first and commit {lockfile.lock_path(dag.recipe.path).name}")
    real = Cache(paths.cache_dir(cache_dir))
    selected = dag.select(stages) if stages else set(dag.nodes)
    real.ensure()
    # under a lease on the real cache: `zoo gc` leaves the scratch cache (in its tmp/) alone
    with real.leased(), tempfile.TemporaryDirectory(dir=real.lease.tmp, prefix="repro-") as tmp:  # same fs: hardlinks
        scratch = Cache(Path(tmp)).ensure()
        reused = _seed_upstream(dag, lock, real, scratch, selected)
        result = api.run(dag, cache_dir=scratch.root, jobs=jobs, record=False, on_update=on_update)
        checks = []
        for report in result.stages:
            locked = lock.stages.get(report.id)
            if report.id in reused:
                checks.append(StageCheck(report.id, REUSED, ["taken from the cache (not selected)"]))
            elif report.state == StageState.FAILED:
                checks.append(StageCheck(report.id, FAILED, [report.error.message if report.error else ""]))
            elif report.state not in (StageState.RAN, StageState.CACHED):
                checks.append(StageCheck(report.id, FAILED, [f"not rebuilt ({report.state})"]))
            elif locked is None:
                checks.append(StageCheck(report.id, UNLOCKED, ["run `zoo run` to record it"]))
            elif report.outputs == locked.outputs:
                checks.append(StageCheck(report.id, IDENTICAL))
            else:
                new_entry = scratch.lookup(report.key) or scratch.read_entry(report.key)
                old_entry = real.read_entry(locked.key)
                details = _explain(locked.outputs, report.outputs, old_entry, new_entry, real, scratch)
                rebuilt_on = (new_entry.host if new_entry else {}) or host.describe()
                if locked.host and not host.same_kernels(locked.host, rebuilt_on):
                    details.append(_other_host(locked.host, rebuilt_on))
                checks.append(StageCheck(report.id, DIFFERS, details))
    return ReproReport(recipe=f"{dag.recipe.name}@{dag.recipe.version}", stages=checks)


def _seed_upstream(dag, lock, real: Cache, scratch: Cache, selected: set[str]) -> set[str]:
    """Link the real cache's entries for every stage not selected, so only `selected` rebuild."""
    reused: set[str] = set()
    for nid in dag.order():
        if nid in selected:
            continue
        locked = lock.stages.get(nid)
        if locked:
            real.hold(keys=[locked.key])  # its objects stay while they are linked into the scratch cache
        entry = real.lookup(locked.key) if locked else None
        if entry is None:
            continue  # not in the real cache: it will be rebuilt too
        for meta in entry.files.values():
            dest = scratch.object_path(meta["digest"])
            if not dest.exists():
                dest.parent.mkdir(parents=True, exist_ok=True)
                hardlink_or_copy(real.object_path(meta["digest"]), dest)
        target = scratch.entry_path(entry.key)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(real.entry_path(entry.key), target)
        reused.add(nid)
    return reused


def _explain(old: dict[str, str], new: dict[str, str], old_entry: Entry | None, new_entry: Entry | None,
             real: Cache, scratch: Cache) -> list[str]:
    """Which outputs differ, which files inside them, and for ONNX files the first difference."""
    from zoo.release.onnxdiff import first_difference

    details = []
    for name in sorted(set(old) | set(new)):
        if old.get(name) == new.get(name):
            continue
        details.append(f"output {name!r}: {str(old.get(name))[:12]} → {str(new.get(name))[:12]}")
    if old_entry is None or new_entry is None:
        details.append("the locked outputs are no longer in the cache, so the differing files cannot be named")
        return details
    for rel in sorted(set(old_entry.files) | set(new_entry.files)):
        a, b = old_entry.files.get(rel), new_entry.files.get(rel)
        if a and b and a["digest"] == b["digest"]:
            continue
        if a is None or b is None:
            details.append(f"  {rel}: only in the {'rebuilt' if a is None else 'locked'} outputs")
            continue
        line = f"  {rel} differs"
        if rel.endswith(".onnx"):
            why = first_difference(real.object_path(a["digest"]), scratch.object_path(b["digest"]))
            line += f": {why}" if why else ""
        elif rel.endswith(".json"):
            line += ": " + _json_difference(real.object_path(a["digest"]), scratch.object_path(b["digest"]))
        details.append(line)
    return details


def _other_host(locked: dict[str, Any], rebuilt_on: dict[str, Any]) -> str:
    """Why a difference may be the machine's, not the recipe's: torch and onnxruntime pick their
    kernels by CPU features, and different kernels round floats differently."""
    return (f"note: the locked outputs were built on another kind of CPU ({locked.get('cpu') or locked.get('machine')}; "
            f"this rebuild ran {host.kernel_difference(locked, rebuilt_on)}); torch and onnxruntime choose kernels "
            f"by CPU features, so float results can differ: check bit for bit on a host with the same features")


def _json_difference(a: Path, b: Path) -> str:
    try:
        x, y = json.loads(a.read_text()), json.loads(b.read_text())
    except ValueError:
        return "not valid JSON"
    return _first_json_path(x, y, "") or "same data, different formatting"


def _first_json_path(x: Any, y: Any, where: str) -> str:
    if isinstance(x, dict) and isinstance(y, dict):
        for k in sorted(set(x) | set(y)):
            found = _first_json_path(x.get(k), y.get(k), f"{where}.{k}" if where else k)
            if found:
                return found
        return ""
    if isinstance(x, list) and isinstance(y, list) and len(x) == len(y):
        for i, (p, q) in enumerate(zip(x, y)):
            found = _first_json_path(p, q, f"{where}[{i}]")
            if found:
                return found
        return ""
    return "" if x == y else f"{where}: {str(x)[:40]} → {str(y)[:40]}"
