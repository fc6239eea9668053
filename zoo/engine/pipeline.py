"""A recipe planned and run end to end: `load`, `plan` (= `status`), `run` and their `Result`.

`zoo.api` exposes these as the public `run`/`plan`/`status`; they live in the engine so that the
engine's and release's own callers (`zoo.engine.cache_sync`, `zoo.release.ship`, `repro`,
`importer`) use them without importing the API above them. A run: the plan, `--frozen`'s
preflight and `Guard` (`zoo.engine.frozen`), the remote run cache this run uses
(`zoo.engine.cache_config`), the runner, the failed stages' hints (`zoo.engine.failures`), the
lockfile and the fast path's stamp (`zoo.engine.fastpath`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from zoo import paths
from zoo.engine import failures, frozen as frozen_mod, keys, lockfile, planner, preflight, recipe as recipe_mod
from zoo.engine.cache import Cache
from zoo.engine.executors import Executor, make_executor
from zoo.engine.explain import Reason, ReasonCode
from zoo.engine.runner import Runner, StageReport, StageState, decide
from zoo.errors import ExitCode, StorageError


@dataclass
class Result:
    """What `run`, `plan` and `status` return: one StageReport per stage instance, in DAG order."""

    recipe: str
    version: str
    path: Path
    stages: list[StageReport]
    cache_dir: Path
    lock_path: Path | None = None
    lock_changed: bool = False
    executed: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # e.g. a remote run cache that could not be reached
    cache_remote: str | None = None  # the remote run cache this run used (zoo/engine/remote_cache.py)
    cache_remote_origin: str | None = None  # the file (or flag) that chose it (zoo/engine/cache_config.py)
    cache_remote_push: bool | None = None  # whether this run pushes to it

    @property
    def ok(self) -> bool:
        return not any(s.state == StageState.FAILED for s in self.stages)

    @property
    def failed(self) -> list[StageReport]:
        return [s for s in self.stages if s.state == StageState.FAILED]

    def exit_code(self) -> ExitCode:
        """OK; else the first failed stage's error class (FAILED stage/gate, STORAGE, INTEGRITY...)."""
        if self.ok:
            return ExitCode.OK
        error = self.failed[0].error
        return error.exit_code if error else ExitCode.FAILED

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": 1, "recipe": self.recipe, "version": self.version, "path": str(self.path),
                "ok": self.ok, "exit_code": self.exit_code(),
                "error": None if self.ok or self.failed[0].error is None else self.failed[0].error.to_json(),
                "cache_dir": str(self.cache_dir),
                "lock": str(self.lock_path) if self.lock_path else None, "lock_changed": self.lock_changed,
                "cache_remote": self.cache_remote, "cache_remote_origin": self.cache_remote_origin,
                "cache_remote_push": self.cache_remote_push, "notes": list(self.notes),
                "stages": [s.to_json() for s in self.stages]}


def load(path: str | Path | planner.Dag) -> planner.Dag:
    """Parse, validate and plan a recipe (RecipeError/PlanError point at the YAML); `zoo validate`'s
    whole check, which every plan and run makes too (the stages a config names must be needed:
    zoo/engine/preflight.py)."""
    if isinstance(path, planner.Dag):
        return path
    dag = planner.build(recipe_mod.load(path))
    preflight.check(dag)
    return dag


def plan(path: str | Path | planner.Dag, *, cache_dir: str | Path | None = None, force: Iterable[str] | bool = (),
         cache_remote: str | None = None) -> Result:
    """Which stages would run and why, without running anything or writing to the cache.

    With a remote run cache (`cache_remote`, or the configured one: zoo/engine/cache_config.py), a
    stage missing here that the remote holds is reported cached, "on the remote cache" (its entry
    is read, nothing is downloaded); an unreachable remote is a note."""
    dag = load(path)
    cache = Cache(paths.cache_dir(cache_dir))
    remote = _remote_cache(cache, cache_remote, dag)
    result = _plan(dag, cache_dir, force, remote, cache)[0]
    result.notes = list(cache.notes)  # local entries found invalid (each a miss)
    if remote is not None:
        result.cache_remote = remote.url
        result.notes += remote.notes
        result.cache_remote_origin, result.cache_remote_push = remote.setting.origin, remote.setting.push
    return result


def _plan(dag: planner.Dag, cache_dir: str | Path | None, force: Iterable[str] | bool,
          remote: Any = None, cache: Cache | None = None) -> tuple[Result, dict[str, dict]]:
    """The plan, and the key parts of every stage whose key it could compute (for `--frozen`)."""
    from zoo import host

    cache = cache or Cache(paths.cache_dir(cache_dir))
    forced = _forced(dag, force)
    previous = lockfile.read(lockfile.lock_path(dag.recipe.path))
    here = host.platform_class()
    reports: list[StageReport] = []
    by_id: dict[str, StageReport] = {}
    entries = {}
    all_parts: dict[str, dict] = {}
    for nid, node in dag.nodes.items():
        report = StageReport(id=nid, kind=node.kind, needs=list(node.needs))
        pending = [up for up in node.needs if by_id[up].state == StageState.WILL_RUN]
        parts = key = None
        if not pending:
            parts, key = keys.stage_key(dag, node, entries, {a: r.record for a, r in by_id.items() if r.record},
                                        cache.hashes)
            all_parts[nid] = parts
            report.record = keys.record_digest(parts)
        prev = previous.reference(nid, here) if previous else None
        state, reasons, entry = decide(node, parts, key, cache, prev, nid in forced, pending)
        if remote is not None and state == StageState.WILL_RUN and key is not None and nid not in forced \
                and node.cache_policy == "default":
            entry = remote.peek(key)
            if entry is not None:  # a run takes it from the remote instead of computing it
                state, reasons = StageState.CACHED, [Reason(ReasonCode.CACHED, f"on the remote cache {remote.url}")]
        if state == StageState.CACHED:
            entries[nid] = entry
            report.outputs = entry.output_digests()  # what `--frozen` compares with the lock
            report.built_on = host.platform_class(entry.host)
        report.state, report.reasons, report.key = state, reasons, key
        reports.append(report)
        by_id[nid] = report
    return Result(recipe=dag.recipe.name, version=dag.recipe.version, path=dag.recipe.path, stages=reports,
                  cache_dir=cache.root, lock_path=lockfile.lock_path(dag.recipe.path)), all_parts


status = plan


def run(path: str | Path | planner.Dag, *, cache_dir: str | Path | None = None, jobs: int = 1, force: Iterable[str] | bool = (),
        frozen: bool = False, executor: Executor | str | None = None,
        on_update: Callable[[StageReport], None] | None = None, record: bool = True,
        cache_remote: str | None = None, on_log: Callable[[StageReport, list[str]], None] | None = None,
        on_transfer: Callable[[str, int, float], None] | None = None) -> Result:
    """Run the recipe; cached stages are not run. Updates the lockfile next to the recipe.

    `force`: True for every stage, or stage ids (all instances of a matrix stage) to rerun.
    `frozen`: fail with LockOutOfDate if the lockfile would change (zoo/engine/frozen.py): before
    anything runs when the plan shows it, else at the first stage whose result differs (the run
    stops there); the lockfile is never written.
    `executor`: an Executor, or 'local' / 'dask://HOST:PORT'.
    `record=False` (used by `zoo repro`): no lockfile update, no stamp, stages publish nothing, and
    no remote run cache is read or written (a rebuild must build).
    `cache_remote`: the remote run cache (a URL or a `zoo remote add` name; "none" for none); None
    takes it from the project's `.zoo/config.yaml`, else `$ZOO_HOME/config.yaml` (zoo/engine/cache_config.py).
    `on_update(report)`: each stage's state changes. `on_log(report, lines)`: while a stage runs, about
    twice a second, the lines its log gained (often []), and its last lines when it ends.
    `on_transfer(direction, nbytes, seconds)`: each object the remote run cache moved here
    ("fetched": a stage taken from it; "pushed": a stage shared), from background threads too.
    """
    dag = load(path)
    cache = Cache(paths.cache_dir(cache_dir)).ensure()
    lock_file = lockfile.lock_path(dag.recipe.path)
    previous = lockfile.read(lock_file)
    forced = _forced(dag, force)
    guard = None
    if frozen:
        runs_on = _local_platform(executor)
        planned, parts = _plan(dag, cache_dir, sorted(forced), cache=cache)
        frozen_mod.raise_if(frozen_mod.preflight(dag, planned, parts, previous, runs_on), dag, [])
        guard = frozen_mod.Guard(previous, runs_on)
    if executor is None or isinstance(executor, str):
        executor = make_executor(executor, jobs)
    executed: list[str] = []

    def update(report: StageReport) -> None:
        if report.state == StageState.RUNNING:
            executed.append(report.id)
        if on_update:
            on_update(report)

    remote = _remote_cache(cache, cache_remote, dag) if record else None
    if remote is not None:
        remote.on_transfer = on_transfer
    runner = Runner(dag, cache, executor, force=forced, previous=previous, jobs=jobs, publish=record,
                    on_update=update, guard=guard, remote=remote, on_log=on_log)
    reports = runner.run()
    for report in reports.values():  # hints that name the recipe line to change (a failed gate, a version conflict)
        if report.state == StageState.FAILED:
            report.error = failures.explain(report, dag)
    if guard is not None:
        frozen_mod.raise_if(guard.problems, dag, executed)
    new_lock = frozen_mod.merged_lock(dag, previous, runner.lock_records())
    # a first run in which nothing completed has nothing to pin: leave no empty lockfile behind
    worth_writing = bool(new_lock.platforms) or previous is not None
    changed = lockfile.write(lock_file, new_lock) if record and not frozen and worth_writing else False
    result = Result(recipe=dag.recipe.name, version=dag.recipe.version, path=dag.recipe.path,
                    stages=[reports[nid] for nid in dag.order()], cache_dir=cache.root, lock_path=lock_file,
                    lock_changed=changed, executed=executed,
                    notes=cache.notes + (remote.notes if remote else []) + (guard.notes if guard else []),
                    cache_remote=remote.url if remote else None,
                    cache_remote_origin=remote.setting.origin if remote else None,
                    cache_remote_push=remote.setting.push if remote else None)
    if record and result.ok and all(n.cache_policy == "default" for n in dag.nodes.values()):
        _write_stamp(dag, cache, runner, result)
    return result


def _remote_cache(cache: Cache, flag: str | None, dag: planner.Dag):
    """The RemoteCache for this run, or None (zoo/engine/cache_config.py decides which)."""
    from zoo.engine import cache_config
    from zoo.engine.remote_cache import RemoteCache

    setting = cache_config.resolve(flag, dag.recipe.path)
    if setting is None:
        return None
    remote = RemoteCache(cache, setting)
    remote.notes.extend(setting.notes)  # e.g. an unapproved project config: nothing is pushed
    return remote


def _write_stamp(dag: planner.Dag, cache: Cache, runner: Runner, result: Result) -> None:
    """Let the next identical `zoo run` answer from a few stats (zoo/engine/fastpath.py)."""
    from zoo.engine import fastpath

    files = {dag.recipe.path}
    for node in dag.nodes.values():
        files.update(keys.watched_files(dag.recipe, node))
    entries = [cache.entry_path(e.key) for e in runner.entries.values()]
    objects = [cache.object_path(m["digest"]) for e in runner.entries.values() for m in e.files.values()]
    # an effect (a version published to the local zoo) must still hold for a fast answer to claim it:
    # its evidence (that version's manifest and blobs) must still be there, or the next run takes
    # the full path and the kind's on_cached redoes it (after `zoo rm`, or `zoo fsck --repair`
    # removed a bad blob)
    effects = [e for s in result.stages for e in s.effects]
    objects += [Path(p) for e in effects for p in e.evidence]
    try:
        fastpath.write_stamp(recipe_path=dag.recipe.path, cache_dir=cache.root, lock_path=result.lock_path,
                             files=files, entries=entries, objects=objects,
                             summary={"name": dag.recipe.name, "version": dag.recipe.version,
                                      "stages": dag.order(), "notes": [str(e) for e in effects]})
    except StorageError:  # only a shortcut for the next run (e.g. the disk is full): the run itself succeeded
        pass


def _forced(dag: planner.Dag, force: Iterable[str] | bool) -> set[str]:
    if force is True:
        return set(dag.nodes)
    if not force:
        return set()
    return dag.select(list(force))


def _local_platform(executor: Executor | str | None) -> str | None:
    """The platform class stages will be built on: this host's for local workers, None for a
    cluster (its workers may be of any class; their outputs are checked when they finish)."""
    from zoo import host
    from zoo.engine.executors import ProcessExecutor

    if not executor or executor == "local" or isinstance(executor, ProcessExecutor):
        return host.platform_class()
    return None
