"""`zoo repro RECIPE --check`: rebuild stages without the cache and compare with the lockfile.

The rebuild runs in a fresh temporary cache, so nothing is a hit, and with publishing off. With
`stages`, only those are rebuilt: their upstream results are taken from the real cache (linked
into the temporary one), or rebuilt too when the real cache no longer has them. Each rebuilt
output's digest is compared with the lockfile's; for a differing ONNX file the first differing
tensor, attribute or node is named.

Platforms (zoo/host.py, zoo/engine/lockfile.py): a stage the lock has a record of for this host's
platform class is rebuilt in one chain with the others and compared with that record bit for bit.
A stage only other classes have records of is rebuilt on its own, from the outputs its upstream
stages had in the other class's records (taken from the cache, which must hold them: a shared
or remote cache does), so that it differs only by its own kernels: rebuilt from this host's own
upstream, an export would differ merely because training did. Where the cache lacks those
upstream outputs they are rebuilt here too, and the check says so. The rebuilt outputs then pass
if their bytes are identical to that class's record ("identical"), else if the stage's kind
judges them equivalent (`StageKind.equivalence`; "equivalent", with the kind of equivalence and
its figures: the built-in kinds judge ONNX models by their outputs and structure, training by
held-out quality within `quality_tolerance`; zoo_stages/lib/quality/equivalence.py), since other CPU
kernels round floats differently and no byte check can pass there. A kind that cannot judge, or
locked outputs no longer in the cache, leave "differs".

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

from zoo import host, paths
from zoo.engine import keys, kind_loader, lockfile, pipeline
from zoo.engine.cache import Cache, Entry
from zoo.files import hardlink_or_copy
from zoo.errors import InvalidInput
from zoo.engine.runner import StageState
from zoo.stage import EquivalenceContext

IDENTICAL, DIFFERS, REUSED, FAILED, UNLOCKED = "identical", "differs", "reused", "failed", "not in lockfile"
EQUIVALENT = "equivalent"  # rebuilt on another platform class than any record's: equivalent, not identical
QUALITY_TOLERANCE = 0.01  # one point of held-out accuracy (EquivalenceContext.quality_tolerance)


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
          jobs: int = 1, on_update=None, quality_tolerance: float = QUALITY_TOLERANCE) -> ReproReport:
    """Rebuild (all or `stages`) in a temporary cache and compare output digests with the lockfile
    (with the records of the platform class each stage was rebuilt on; see the module docstring).
    `quality_tolerance`: how far a quality metric may move where equivalence is judged by quality
    (0.01: one point of accuracy; `EquivalenceContext`)."""
    dag = pipeline.load(path)
    lock = lockfile.read(lockfile.lock_path(dag.recipe.path))
    if lock is None:
        raise InvalidInput(f"{dag.recipe.path.name} has no lockfile to check against",
                           hint=f"run `zoo run {path}` first and commit {lockfile.lock_path(dag.recipe.path).name}")
    real = Cache(paths.cache_dir(cache_dir))
    selected = dag.select(stages) if stages else set(dag.nodes)
    here = host.platform_class()
    # stages locked only by other classes: each rebuilt on its own, from that class's upstream outputs
    foreign = {nid for nid in selected if lock.of_stage(nid) and lock.record(nid, here) is None}
    real.ensure()
    # under a lease on the real cache: `zoo gc` leaves the scratch caches (in its tmp/) alone
    with real.leased(), tempfile.TemporaryDirectory(dir=real.lease.tmp, prefix="repro-") as tmp:  # same fs: hardlinks
        checker = _Checker(dag, lock, real, Path(tmp), jobs, on_update, quality_tolerance)
        checks: dict[str, StageCheck] = {}
        if selected - foreign:
            checks.update(checker.rebuild_chain(selected, skip=foreign))
        for nid in dag.order():
            if nid in foreign:
                checks[nid] = checker.rebuild_alone(nid)
    return ReproReport(recipe=f"{dag.recipe.name}@{dag.recipe.version}",
                       stages=[checks[nid] for nid in dag.order() if nid in checks])


@dataclass
class _Checker:
    """Rebuilds stages in scratch caches under `tmp` and checks them against the lock."""

    dag: Any
    lock: lockfile.Lock
    real: Cache
    tmp: Path
    jobs: int
    on_update: Any
    quality_tolerance: float

    def rebuild_chain(self, selected: set[str], skip: set[str]) -> dict[str, StageCheck]:
        """Rebuild every selected stage in one scratch cache, each from the rebuilt upstream (stages
        not selected are taken from the real cache); check all but `skip`."""
        scratch = Cache(self.tmp / "rebuild").ensure()
        here = host.platform_class()
        reused = _seed_upstream(self.dag, self.real, scratch, selected, lambda nid: self.lock.reference(nid, here))
        result = pipeline.run(self.dag, cache_dir=scratch.root, jobs=self.jobs, record=False, on_update=self.on_update)
        checks = {}
        for report in result.stages:
            if report.id in reused:
                checks[report.id] = StageCheck(report.id, REUSED, ["taken from the cache (not selected)"])
            elif report.id not in skip:
                checks[report.id] = self.checked(report, scratch, [])
        return checks

    def rebuild_alone(self, nid: str) -> StageCheck:
        """Rebuild one stage that only other platform classes have records of, from the outputs its
        upstream stages had when the chosen class built it (the real cache's entries of that class's
        records), so that what is compared differs only by this stage's own kernels: rebuilt from
        this host's upstream, an export would differ merely because training did. Where the cache
        lacks those upstream outputs, the upstream is rebuilt here too, and the check says so."""
        from zoo.engine.planner import Dag

        platform = self.reference_class(nid)
        records = self.lock.records(platform)
        ancestors = self.dag.ancestors(nid)
        scratch = Cache(self.tmp / f"alone-{self.dag.order().index(nid)}").ensure()
        seeded = _seed_upstream(self.dag, self.real, scratch, {nid}, lambda up: self.exact(records.get(up)),
                                only=ancestors)
        missing = [up for up in ancestors if up not in seeded]
        note = []
        if missing:
            note = [f"the {platform} record's outputs of {', '.join(missing)} are not in this cache, so they were "
                    "rebuilt here too: differences may come from upstream"]
        elif ancestors:
            note = [f"rebuilt from the {platform} record's upstream outputs ({', '.join(ancestors)}), from the cache"]
        sub = Dag(recipe=self.dag.recipe,
                  nodes={up: self.dag.nodes[up] for up in self.dag.order() if up in ancestors or up == nid})
        result = pipeline.run(sub, cache_dir=scratch.root, jobs=self.jobs, record=False, on_update=self.on_update)
        return self.checked(next(r for r in result.stages if r.id == nid), scratch, note)

    def reference_class(self, nid: str) -> str:
        """The other class a stage is compared with: the first (by name) whose records of it and of
        its upstream stages the cache holds, else the first whose record of it is held, else the first."""
        classes = list(self.lock.of_stage(nid))
        held = [p for p in classes if self.exact(self.lock.record(nid, p)) is not None]
        complete = [p for p in held
                    if all(self.exact(self.lock.record(up, p)) is not None for up in self.dag.ancestors(nid))]
        return (complete or held or classes)[0]

    def exact(self, record: lockfile.StageLock | None) -> lockfile.StageLock | None:
        """`record` when the real cache holds exactly its outputs, else None."""
        return record if record is not None and _locked_entry(self.real, record) is not None else None

    def checked(self, report, scratch: Cache, upstream_note: list[str]) -> StageCheck:
        """The check of one stage's rebuild, from its run report."""
        if report.state == StageState.FAILED:
            return StageCheck(report.id, FAILED, [report.error.message if report.error else "", *upstream_note])
        if report.state not in (StageState.RAN, StageState.CACHED):
            return StageCheck(report.id, FAILED, [f"not rebuilt ({report.state})"])
        if not self.lock.of_stage(report.id):
            return StageCheck(report.id, UNLOCKED, ["run `zoo run` to record it"])
        return self.compare(report, scratch, upstream_note)

    def compare(self, report, scratch: Cache, upstream_note: list[str]) -> StageCheck:
        """One rebuilt stage against the record of its platform class, or else against another's."""
        sid, built_on, lock, real = report.id, report.built_on, self.lock, self.real
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
            return StageCheck(sid, IDENTICAL, [f"no {built_on} record; bit-identical to the {same[0]} record",
                                               *upstream_note])
        # prefer a record of the same identity (the same inputs), else the first class's
        identity = lockfile.record_identity(new_entry.parts) if new_entry is not None and new_entry.parts else ""
        platform, locked = next(((p, r) for p, r in others.items() if r.identity() == identity),
                                next(iter(others.items())))
        details = [f"rebuilt on {built_on}, which has no record: compared with the {platform} record for "
                   "equivalence (other CPU kernels round floats differently, so bytes cannot match)", *upstream_note]
        old_entry = _locked_entry(real, locked)
        if old_entry is None or new_entry is None:
            details.append(f"the {platform} record's outputs are not in this cache, so equivalence cannot be checked "
                           "(a cache shared with a machine of that class holds them)")
            return StageCheck(sid, DIFFERS, details + _digest_lines(locked.outputs, report.outputs))
        node = self.dag.nodes[sid]
        real.hold(keys=[old_entry.key])
        known = keys.key_context(self.dag.recipe, node)
        context = EquivalenceContext(recipe=known.recipe, shared=known.shared, matrix=known.matrix,
                                     references=known.references, quality_tolerance=self.quality_tolerance)
        verdict = _equivalence(kind_loader.get(node.kind)(), real.output_paths(old_entry),
                               scratch.output_paths(new_entry), node.instance.config, context)
        if verdict is None:
            details.append(f"kind {node.kind} cannot judge equivalence, so only identical bytes would pass")
            return StageCheck(sid, DIFFERS, details + _digest_lines(locked.outputs, report.outputs))
        return StageCheck(sid, EQUIVALENT if verdict.equivalent else DIFFERS, details + list(verdict.details))


def _equivalence(kind, locked, rebuilt, config, context):
    """The kind's verdict; a third-party kind written for the hook's first form (locked, rebuilt,
    config: no context) still answers rather than failing with a TypeError."""
    import inspect

    try:
        takes_context = len(inspect.signature(kind.equivalence).parameters) >= 4
    except (TypeError, ValueError):
        takes_context = True
    if takes_context:
        return kind.equivalence(locked, rebuilt, config, context)
    return kind.equivalence(locked, rebuilt, config)


def _locked_entry(real: Cache, locked: lockfile.StageLock) -> Entry | None:
    """The real cache's entry of the locked record holding exactly the locked outputs (a shared
    cache may hold another class's bytes for the same record), or None."""
    entry = real.lookup_record(locked.identity())
    return entry if entry is not None and entry.output_digests() == locked.outputs else None


def _digest_lines(old: dict[str, str], new: dict[str, str]) -> list[str]:
    return [f"output {name!r}: {str(old.get(name))[:12]} → {str(new.get(name))[:12]}"
            for name in sorted(set(old) | set(new)) if old.get(name) != new.get(name)]


def _seed_upstream(dag, real: Cache, scratch: Cache, selected: set[str], record_of,
                   only: list[str] | None = None) -> set[str]:
    """Link into `scratch` the real cache's entry of `record_of(stage)` (a lock record, or None) for
    every stage not selected (of `only`, when given), so that only the others rebuild."""
    reused: set[str] = set()
    for nid in dag.order():
        if nid in selected or (only is not None and nid not in only):
            continue
        locked = record_of(nid)
        entry = _locked_entry(real, locked) if locked else None
        if entry is None:
            continue  # not in the real cache: it will be rebuilt too
        real.hold(keys=[entry.key])  # its objects stay while they are linked into the scratch cache
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
