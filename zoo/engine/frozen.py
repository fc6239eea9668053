"""The lockfile as a run's contract: what `zoo run --frozen` checks, and the lock a run writes.

Kept apart from zoo/api.py so the invariants live in one small module (mutation/engine-*.toml
mutates it). Records are per platform class (zoo/engine/lockfile.py): a stage's outputs are
compared with the record of the class of the machine that built them (a cache hit's builder, or
the worker that ran it), never with another class's bytes.

A record holds what built the bytes (config, inputs, files, tools...) and the bytes' digests, not
the cache key: the key also holds code, and code that changes no byte must not fail `--frozen`.
So a stage whose record is the lock's but whose key is not cached (its kind's code changed, or a
fresh cache) is built, and passes when its outputs are the locked ones, with a note where the
code is known to have changed.

- `preflight`: before anything runs, `--frozen` refuses a stage in no record (added), one in the
  lockfile but not in the recipe (removed), a stage whose record is already known (its upstreams
  are cached) and matches no record it could be compared with (changed: config, inputs, files,
  tools...), and cached outputs that differ from their builder's record;
- `Guard`: while the run goes on, each stage whose record only became known (its upstreams ran) is
  checked before it runs, and each completed stage's outputs after: the first difference stops
  the run (stages already running finish; nothing new starts) and the lockfile is not written.
  So `--frozen` on an empty cache builds what it must and refuses only where the result differs;
  each difference names the output digests;
- `merged_lock`: this run's records over the previous lock, by platform, minus the stages the
  recipe dropped; other platforms' records are kept as they are.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from zoo.engine import explain, lockfile
from zoo.engine.lockfile import StageLock
from zoo.errors import LockOutOfDate
from zoo.engine.runner import StageState

if TYPE_CHECKING:
    from zoo.engine.pipeline import Result
    from zoo.engine.planner import Dag


def merged_lock(dag: "Dag", previous: lockfile.Lock | None, records: dict[str, dict[str, StageLock]]) -> lockfile.Lock:
    """This run's records ({platform: {stage: record}}) over the previous lock, dropping stages no
    longer in the recipe (on every platform).

    A stage rebuilt from the same record with the same output bytes keeps its previous record (its
    metrics and host too): the lock pins what built the bytes and the bytes, and rewriting it for
    new timings, another host's name or a code change that moved no byte would turn every
    reproduction (a fresh clone, another machine of the class, an upgrade of zoo) into a diff.
    Platforms this run built nothing for keep their records untouched.
    """
    platforms = {p: {sid: s for sid, s in recs.items() if sid in dag.nodes}
                 for p, recs in (previous.platforms.items() if previous else [])}
    for platform, recs in records.items():
        mine = platforms.setdefault(platform, {})
        for sid, record in recs.items():
            old = mine.get(sid)
            if old is None or (old.identity(), old.outputs) != (record.identity(), record.outputs):
                mine[sid] = record
            elif old.shared is None:  # kept from a version 1 lockfile: same key, so the same values
                old.shared, old.shared_digest = record.shared, ""
    r = dag.recipe
    return lockfile.Lock(recipe={"name": r.name, "version": r.version, "digest": r.digest},
                         platforms={p: recs for p, recs in platforms.items() if recs})


def preflight(dag: "Dag", planned: "Result", parts: dict[str, dict], previous: lockfile.Lock | None,
              runs_on: str | None) -> list[str]:
    """The differences from the lock that a plan already shows (see the module docstring).

    `parts`: the key parts of each stage whose key the plan computed. `runs_on`: the platform
    class stages that must run will run on (this host's, for local workers), or None when the
    executor's workers may be of any class (their outputs are checked when they finish).
    """
    lock = previous or lockfile.Lock(recipe={})
    problems = []
    differing: set[str] = set()
    for report in planned.stages:
        problem = ""
        if not lock.of_stage(report.id):
            problem = f"+ {report.id}: not in the lockfile"
        elif report.key is None:  # an upstream must run first: checked when its key is known (Guard)
            upstream = [up for up in report.needs if up in differing]
            if upstream:
                problem = f"~ {report.id}: would run (upstream differs from the lockfile: {', '.join(upstream)})"
        elif report.state == StageState.CACHED:
            problem = compare(lock, report.id, report.built_on, stage_record(report, parts[report.id]))
        else:
            problem = record_problem(lock, report.id, parts[report.id], runs_on, report.reasons)
        if problem:
            problems.append(problem)
            differing.add(report.id)
    problems += [f"- {sid}: in the lockfile but not in the recipe" for sid in sorted(lock.stage_ids())
                 if sid not in dag.nodes]
    return problems


class Guard:
    """What the runner asks while a `--frozen` run goes on; the problems it found so far."""

    def __init__(self, lock: lockfile.Lock | None, runs_on: str | None):
        self.lock = lock or lockfile.Lock(recipe={})
        self.runs_on = runs_on
        self.problems: list[str] = []
        self.notes: list[str] = []  # stages rebuilt for a code change whose bytes are the locked ones
        self._code_changed: dict[str, str] = {}

    def before_run(self, stage_id: str, parts: dict[str, Any], reasons: list) -> bool:
        """False (and a problem noted) when the stage about to run cannot produce a locked record."""
        problem = record_problem(self.lock, stage_id, parts, self.runs_on, reasons)
        if problem:
            self.problems.append(problem)
        else:
            code = [str(r) for r in reasons if r.code == explain.ReasonCode.CODE]
            if code:
                self._code_changed[stage_id] = "; ".join(code)
        return not problem

    def locked_outputs(self, stage_id: str, parts: dict[str, Any], platform: str) -> dict[str, str]:
        """The output digests the lock pins for `stage_id` built from the record `parts` make on
        `platform` ({} when it pins none: the run is refused after the stage anyway), for the
        stage's effects to check."""
        locked = self.lock.record(stage_id, platform)
        return dict(locked.outputs) if locked is not None and locked.identity() == lockfile.record_identity(parts) else {}

    def after(self, stage_id: str, platform: str, record: StageLock) -> bool:
        """False (and a problem noted) when a completed stage's record differs from its platform's."""
        problem = compare(self.lock, stage_id, platform, record)
        if problem:
            self.problems.append(problem)
        elif stage_id in self._code_changed:
            self.notes.append(f"{stage_id}: rebuilt ({self._code_changed.pop(stage_id)}); its outputs are the "
                              f"lockfile's, so the lockfile holds")
        return not problem


def compare(lock: lockfile.Lock, stage_id: str, platform: str, record: StageLock) -> str:
    """'' when `record` (built on `platform`) is the lock's record of that platform, else the difference."""
    locked = lock.record(stage_id, platform)
    if locked is None:
        return f"+ {stage_id}: not in the lockfile for platform {platform} (built on {platform}; {_has(lock, stage_id)})"
    if locked.identity() != record.identity():
        why = "; ".join(str(r) for r in explain.compare(_parts(record), locked)) or "record differs"
        return f"~ {stage_id}: differs from the lockfile's {platform} record ({why})"
    if locked.outputs != record.outputs:
        lines = [f"    output {name!r}: built {record.outputs.get(name, 'nothing')}, "
                 f"locked {locked.outputs.get(name, 'nothing')}"
                 for name in sorted(set(locked.outputs) | set(record.outputs))
                 if locked.outputs.get(name) != record.outputs.get(name)]
        return f"~ {stage_id}: outputs differ from the lockfile's {platform} record:\n" + "\n".join(lines)
    return ""


def record_problem(lock: lockfile.Lock, stage_id: str, parts: dict[str, Any], runs_on: str | None,
                   reasons: list) -> str:
    """'' when a stage that must run from the record `parts` make, on `runs_on` (None: any class),
    has a record to match (its outputs are compared when it ends)."""
    candidates = {runs_on: lock.record(stage_id, runs_on)} if runs_on else lock.of_stage(stage_id)
    identity = lockfile.record_identity(parts)
    if any(r is not None and r.identity() == identity for r in candidates.values()):
        return ""
    if runs_on and candidates[runs_on] is None:
        return (f"+ {stage_id}: not in the lockfile for platform {runs_on} (it would be built here; "
                f"{_has(lock, stage_id)})")
    reference = candidates.get(runs_on) if runs_on else next(iter(candidates.values()))
    skip = (explain.ReasonCode.CACHED, explain.ReasonCode.MISSING, explain.ReasonCode.CODE)
    why = [str(r) for r in reasons if r.code not in skip]
    why += [str(r) for r in explain.compare(parts, reference) if str(r) not in why]
    return f"~ {stage_id}: would run ({'; '.join(why) or 'record differs'})"


def raise_if(problems: list[str], dag: "Dag", ran: list[str]) -> None:
    """LockOutOfDate listing every difference, if there is one."""
    if not problems:
        return
    message = f"--frozen: {lockfile.lock_path(dag.recipe.path).name} is out of date:\n  " + "\n  ".join(problems)
    if ran:
        message += f"\n(ran before the difference was found, kept in the cache: {', '.join(ran)})"
    raise LockOutOfDate(message, hint="run `zoo run` without --frozen and commit the updated lockfile")


def stage_record(report, parts: dict[str, Any]) -> StageLock:
    """The record a planned or completed stage would add (parts, outputs; no metrics)."""
    return StageLock.from_parts(parts, dict(report.outputs), {})


def _parts(record: StageLock) -> dict[str, Any]:
    """A record's fields as key parts, for `explain.compare`."""
    return {"kind": record.kind, "kind_version": record.kind_version, "config": record.config,
            "shared": record.shared or {}, "matrix": record.matrix, "inputs": record.inputs, "files": record.files,
            "tools": record.tools, "recipe": record.recipe, "lineage": record.lineage}


def _has(lock: lockfile.Lock, stage_id: str) -> str:
    platforms = list(lock.of_stage(stage_id))
    return f"the lockfile has records for {', '.join(platforms)}" if platforms else "no platform has a record"
