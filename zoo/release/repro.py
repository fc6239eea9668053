"""`zoo repro RECIPE --check`: rebuild stages without the cache and compare with the lockfile.

The rebuild runs in a fresh temporary cache, so nothing is a hit, and with publishing off. With
`stages`, only those are rebuilt: their upstream results are taken from the real cache (linked
into the temporary one), or rebuilt too when the real cache no longer has them. Each rebuilt
output's digest is compared with the lockfile's; for a differing ONNX file the first differing
tensor, attribute or node is named.

Platforms (zoo/host.py, zoo/engine/lockfile.py): each rebuilt stage is compared with the lock's
record of the platform class it was rebuilt on, bit for bit. Where the lock has no record of
that class, bytes identical to another class's record still pass ("identical"); otherwise the
outputs are compared with that record's (taken from the cache, which must hold them: a shared
or remote cache does) for numerical equivalence, by the stage's kind (`StageKind.equivalence`;
the built-in kinds use their parity rules): "equivalent" passes and says so, with the figures,
since other CPU kernels round floats differently and no byte check can pass there. A kind that
cannot judge equivalence, or locked outputs no longer in the cache, leave "differs".

A differing stage whose own-class record was built on a CPU with other SIMD features (`host:`
in the lockfile) says so.

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
from zoo.engine import kind_loader, lockfile
from zoo.engine.cache import Cache, Entry
from zoo.files import hardlink_or_copy
from zoo.errors import InvalidInput
from zoo.engine.runner import StageState

IDENTICAL, DIFFERS, REUSED, FAILED, UNLOCKED = "identical", "differs", "reused", "failed", "not in lockfile"
EQUIVALENT = "equivalent"  # rebuilt on another platform class than any record's: numerically equivalent


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
        return all(s.status in (IDENTICAL, EQUIVALENT, REUSED) for s in self.stages)

    @property
    def bit_identical(self) -> bool:
        """Every rebuilt stage matched its lock record byte for byte (none only equivalent)."""
        return self.ok and not any(s.status == EQUIVALENT for s in self.stages)

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": 1, "recipe": self.recipe, "ok": self.ok, "stages": [s.to_json() for s in self.stages]}


def check(path: str | Path, *, stages: list[str] | None = None, cache_dir: str | Path | None = None,
          jobs: int = 1, on_update=None) -> ReproReport:
    """Rebuild (all or `stages`) in a temporary cache and compare output digests with the lockfile
    (with the records of the platform class each stage was rebuilt on; see the module docstring)."""
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
            if report.id in reused:
                checks.append(StageCheck(report.id, REUSED, ["taken from the cache (not selected)"]))
            elif report.state == StageState.FAILED:
                checks.append(StageCheck(report.id, FAILED, [report.error.message if report.error else ""]))
            elif report.state not in (StageState.RAN, StageState.CACHED):
                checks.append(StageCheck(report.id, FAILED, [f"not rebuilt ({report.state})"]))
            elif not lock.of_stage(report.id):
                checks.append(StageCheck(report.id, UNLOCKED, ["run `zoo run` to record it"]))
            else:
                checks.append(_compare(dag, report, lock, real, scratch))
    return ReproReport(recipe=f"{dag.recipe.name}@{dag.recipe.version}", stages=checks)


def _compare(dag, report, lock: lockfile.Lock, real: Cache, scratch: Cache) -> StageCheck:
    """One rebuilt stage against the record of its platform class, or else against another's."""
    sid, built_on = report.id, report.built_on
    new_entry = scratch.lookup(report.key) or scratch.read_entry(report.key)
    own = lock.record(sid, built_on)
    if own is not None:
        if report.outputs == own.outputs:
            return StageCheck(sid, IDENTICAL)
        details = _explain(own.outputs, report.outputs, _locked_entry(real, own), new_entry, real, scratch)
        rebuilt_on = (new_entry.host if new_entry else {}) or host.describe()
        if own.host and not host.same_kernels(own.host, rebuilt_on):
            details.append(_other_host(own.host, rebuilt_on))
        return StageCheck(sid, DIFFERS, details)
    others = lock.of_stage(sid)
    same = [p for p, r in others.items() if r.outputs == report.outputs]
    if same:
        return StageCheck(sid, IDENTICAL, [f"no {built_on} record; bit-identical to the {same[0]} record"])
    # prefer a record of the same key (the same inputs), else the first class's
    platform, locked = next(((p, r) for p, r in others.items() if r.key == report.key), next(iter(others.items())))
    details = [f"rebuilt on {built_on}, which has no record: compared numerically with the {platform} record "
               "(other CPU kernels round floats differently, so bytes cannot match)"]
    old_entry = _locked_entry(real, locked)
    if old_entry is None or new_entry is None:
        details.append(f"the {platform} record's outputs are not in this cache, so equivalence cannot be checked "
                       "(a cache shared with a machine of that class holds them)")
        return StageCheck(sid, DIFFERS, details + _digest_lines(locked.outputs, report.outputs))
    node = dag.nodes[sid]
    real.hold(keys=[locked.key])
    verdict = kind_loader.get(node.kind)().equivalence(real.output_paths(old_entry), scratch.output_paths(new_entry),
                                                       node.instance.config)
    if verdict is None:
        details.append(f"kind {node.kind} cannot judge numerical equivalence, so only identical bytes would pass")
        return StageCheck(sid, DIFFERS, details + _digest_lines(locked.outputs, report.outputs))
    return StageCheck(sid, EQUIVALENT if verdict.equivalent else DIFFERS, details + list(verdict.details))


def _locked_entry(real: Cache, locked: lockfile.StageLock) -> Entry | None:
    """The real cache's entry holding exactly the locked outputs (a shared cache may hold another
    class's bytes under the same key), or None."""
    entry = real.lookup(locked.key)
    return entry if entry is not None and entry.output_digests() == locked.outputs else None


def _digest_lines(old: dict[str, str], new: dict[str, str]) -> list[str]:
    return [f"output {name!r}: {str(old.get(name))[:12]} → {str(new.get(name))[:12]}"
            for name in sorted(set(old) | set(new)) if old.get(name) != new.get(name)]


def _seed_upstream(dag, lock, real: Cache, scratch: Cache, selected: set[str]) -> set[str]:
    """Link the real cache's entries for every stage not selected, so only `selected` rebuild."""
    reused: set[str] = set()
    for nid in dag.order():
        if nid in selected:
            continue
        locked = lock.reference(nid, host.platform_class())
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

    details = _digest_lines(old, new)
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
