"""The lockfile as a run's contract: what `zoo run --frozen` checks, and the lock a run writes.

Kept apart from zoo/api.py so the invariants live in one small module (mutation/engine-*.toml
mutates it):
- `check`: `--frozen` refuses a stage not in the lockfile (added), one in the lockfile but not in
  the recipe (removed), one that would run or whose key differs (changed), and cached outputs
  whose digests differ from the lock's;
- `merged_lock`: this run's records over the previous lock, minus the stages the recipe dropped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zoo.engine import lockfile
from zoo.errors import LockOutOfDate
from zoo.engine.runner import StageState

if TYPE_CHECKING:
    from zoo.api import Result
    from zoo.engine.planner import Dag


def merged_lock(dag: "Dag", previous: lockfile.Lock | None, records: dict) -> lockfile.Lock:
    """This run's records over the previous lock, dropping stages no longer in the recipe.

    A stage rebuilt with the same key and the same output bytes keeps its previous record: the
    lock pins inputs and outputs, and rewriting it for new timings or another host's name would
    turn every reproduction (a fresh clone, another machine) into a lockfile diff.
    """
    stages = {sid: s for sid, s in (previous.stages.items() if previous else []) if sid in dag.nodes}
    for sid, record in records.items():
        old = stages.get(sid)
        if old is None or (old.key, old.outputs) != (record.key, record.outputs):
            stages[sid] = record
        elif old.shared is None:  # kept from a version 1 lockfile: same key, so the same values
            old.shared, old.shared_digest = record.shared, ""
    r = dag.recipe
    return lockfile.Lock(recipe={"name": r.name, "version": r.version, "digest": r.digest}, stages=stages)


def check(dag: "Dag", planned: "Result", previous: lockfile.Lock | None) -> None:
    """LockOutOfDate, listing every difference, unless `planned` (the plan of `dag`) matches the lock."""
    problems = []
    for report in planned.stages:
        locked = previous.stages.get(report.id) if previous else None
        if locked is None:
            problems.append(f"+ {report.id}: not in the lockfile")
        elif report.state != StageState.CACHED or report.key != locked.key:
            why = "; ".join(str(r) for r in report.reasons)
            problems.append(f"~ {report.id}: would run ({why})")
        elif report.outputs != locked.outputs:  # cached under the locked key, with other bytes
            problems.append(f"~ {report.id}: outputs differ from the lockfile")
    if previous:
        problems += [f"- {sid}: in the lockfile but not in the recipe" for sid in previous.stages if sid not in dag.nodes]
    if problems:
        raise LockOutOfDate(f"--frozen: {lockfile.lock_path(dag.recipe.path).name} is out of date:\n  " + "\n  ".join(problems),
                            hint="run `zoo run` without --frozen and commit the updated lockfile")
