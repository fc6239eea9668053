"""The DAG runner: decide what runs and why, schedule ready stages, commit results to the cache.

A stage runs when its key is not in the cache (or it is forced / its cache policy says so). Its
key needs its inputs' digests, so it is computed when all its needs are done. Independent stages
run in parallel on the executor; a failure stops new scheduling, keeps completed results, and
leaves dependents unscheduled. With a remote run cache (zoo/engine/remote_cache.py), a stage
missing locally is looked up there before it runs (`_remote_hit`), and what a stage computes is
pushed there (`_share`); while a stage's objects download, the stages below it whose keys its
entry already settles begin their own fetches (`_prefetch_downstream`), so a chain of remote hits
downloads side by side. On an executor whose workers may be on other machines (Dask), effects
happen here, never on a worker (`_effects_here`), and with a remote run cache the workers take
inputs from it and push outputs to it (`_submit`, `_take`: zoo/engine/remote_stage.py). A release
a stage declares is published here once the stage completed, whichever way (`_effects`:
zoo/engine/publish.py).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from zoo import host
from zoo.engine import explain, keys, kind_loader
from zoo.engine.cache import Cache, Entry
from zoo.errors import ExitCode, WorkerMismatch, ZooError
from zoo.engine.executors import Executor
from zoo.engine.explain import Reason, ReasonCode
from zoo.engine.hashing import StatCache
from zoo.engine.lockfile import Lock, StageLock
from zoo.engine.log_follow import LogFollower
from zoo.engine.planner import Dag, Node
from zoo.stage import Effect, Upstream
from zoo.engine.worker import StageResult, StageTask, WorkerError, environment_mismatch

if TYPE_CHECKING:
    from zoo.engine.remote_cache import PendingFetch, RemoteCache
    from zoo.engine.remote_stage import Shipper


class StageState(StrEnum):
    """Where a stage is (`zoo run`), or will be (`zoo plan`/`status`). A StrEnum: `--json` shows the text."""

    WAITING = "waiting"  # its needs are not done yet
    RUNNING = "running"
    CACHED = "cached"  # taken from the run cache (or, in a plan: would be)
    RAN = "done"
    FAILED = "failed"
    SKIPPED = "skipped"  # not run: an upstream failed or the run stopped
    WILL_RUN = "will run"  # in a plan: not in the cache, or an upstream will run first


@dataclass
class StageReport:
    """The outcome (or, for plans, the expected outcome) of one stage."""

    id: str
    kind: str
    needs: list[str]
    state: StageState = StageState.WAITING
    reasons: list[Reason] = field(default_factory=list)
    key: str | None = None
    record: str | None = None  # the digest of its lock record (keys.record_digest): what lineage names
    duration_s: float = 0.0
    started: float | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    error: WorkerError | None = None
    log_path: str | None = None  # where the stage's log is kept once it ends (the cache's logs/<key>.log)
    live_log: str | None = None  # where it is written while the stage runs (its workspace; not in --json)
    outputs: dict[str, str] = field(default_factory=dict)
    effects: list[Effect] = field(default_factory=list)  # what it did outside the cache in this run
    # the platform class (zoo.host.platform_class) of the machine that built the outputs: the worker
    # that ran it, or whoever built the cache entry it was found in; "" until then
    built_on: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "needs": self.needs, "state": self.state,
                "reasons": [str(r) for r in self.reasons], "key": self.key, "duration_s": round(self.duration_s, 3),
                "metrics": self.metrics, "error": self.error.to_json() if self.error else None,
                "log": self.log_path, "outputs": self.outputs, "built_on": self.built_on,
                "effects": [{"kind": e.kind, "ref": e.ref} for e in self.effects]}


def decide(node: Node, parts: dict | None, key: str | None, cache: Cache, previous: StageLock | None,
           forced: bool, upstream_runs: list[str]) -> tuple[StageState, list[Reason], Entry | None]:
    """(WILL_RUN or CACHED, reasons, entry) for one stage. `parts`/`key` are None if an upstream must run first."""
    if parts is None:
        return StageState.WILL_RUN, [Reason(ReasonCode.UPSTREAM, ", ".join(upstream_runs))], None
    reasons: list[Reason] = []
    if forced:
        reasons.append(Reason(ReasonCode.FORCED))
    if node.cache_policy != "default":
        reasons.append(Reason(ReasonCode.POLICY, node.cache_policy))
    entry = cache.lookup(key) if not reasons else None
    if entry is not None:
        return StageState.CACHED, [Reason(ReasonCode.CACHED)], entry
    if not reasons:
        reasons = explain.compare(parts, previous)
        if upstream_runs and any(r.code == ReasonCode.INPUT for r in reasons):
            reasons.append(Reason(ReasonCode.UPSTREAM, ", ".join(upstream_runs)))
        if not reasons:  # the record is the lock's: the code changed, or the outputs are not here
            before = cache.entry_of_record(keys.record_digest(parts), other_than=key)
            reasons = explain.code_changes(parts, before.parts) if before is not None else []
        if not reasons:
            detail = ("entry present but incomplete (objects or outputs missing)" if cache.read_entry(key)
                      else "not in this cache")
            reasons = [Reason(ReasonCode.MISSING, detail)]
    return StageState.WILL_RUN, reasons, None


class Runner:
    """Runs a Dag against a Cache on an Executor, reporting progress through `on_update`.

    `on_log(report, lines)`: called for each running stage about every `follow_s` seconds with
    the lines its log gained since ([] when none: a tick), and once more with the last ones when
    it ends, before `on_update` says so; without it, logs are not followed (no polling at all).
    `guard` (zoo.engine.frozen.Guard, for `--frozen`): asked before a stage runs and after each
    completes whether the lockfile still holds; its first "no" stops the run like a failure."""

    def __init__(self, dag: Dag, cache: Cache, executor: Executor, *, force: set[str] = frozenset(),
                 previous: Lock | None = None, jobs: int = 1, publish: bool = True,
                 on_update: Callable[[StageReport], None] = lambda r: None, guard: Any = None,
                 remote: "RemoteCache | None" = None,
                 on_log: Callable[[StageReport, list[str]], None] | None = None, follow_s: float = 0.5):
        self.dag = dag
        self.cache = cache
        self.executor = executor
        self.force = set(force)
        self.previous = previous
        self.jobs = max(1, jobs)
        self.publish = publish
        self.on_update = on_update
        self.guard = guard
        self.on_log = on_log
        self.follow_s = follow_s
        self._followers: dict[str, LogFollower] = {}  # running stages' logs, when on_log listens
        self.here = host.platform_class()  # whose records explain why a stage reruns
        self.remote = remote
        self._remote_asked: set[str] = set()  # stages the remote lacked (asked once per run)
        self._prefetched: dict[str, "PendingFetch"] = {}  # remote fetches begun before their stage's turn
        self._remote_lacks: set[str] = set()  # keys a prefetch found missing on the remote
        self._provisional_records: dict[str, str] = {}  # record digests of the stages fetched ahead
        # workers on other machines: they publish nothing (effects happen here), and with a remote
        # run cache they move inputs and outputs through it (`_shipper`, set when the run starts)
        self._effects_here = bool(getattr(executor, "remote_workers", False))
        self._shipper: "Shipper | None" = None
        self.hashes: StatCache = cache.hashes
        self.reports = {nid: StageReport(id=nid, kind=n.kind, needs=list(n.needs)) for nid, n in dag.nodes.items()}
        self.entries: dict[str, Entry] = {}
        self.parts: dict[str, dict] = {}
        self._running: dict[Future, tuple[str, Any, Path]] = {}
        self._locked_out: set[str] = set()
        self.failed = False
        self._sigint: Any = None  # SIGINT's handler while an interrupted run cleans up

    # --- public ---------------------------------------------------------------------------
    def run(self) -> dict[str, StageReport]:
        # the lease keeps `zoo gc` off what this run holds (workspaces, keys, objects) until it ends
        try:
            with self.cache.leased():
                self._run()
        finally:
            if self._sigint is not None:  # interrupted: the workspaces are gone now
                signal.signal(signal.SIGINT, self._sigint)
        for report in self.reports.values():
            if report.state == StageState.WAITING:
                report.state = StageState.SKIPPED
                failed_up = [n for n in report.needs if self.reports[n].state in (StageState.FAILED, StageState.SKIPPED)]
                report.reasons = [Reason(ReasonCode.NOT_RUN,
                                         f"upstream failed: {', '.join(failed_up)}" if failed_up else "run stopped")]
                self.on_update(report)
        return self.reports

    def _run(self) -> None:
        from zoo.engine.remote_stage import workers_need_shipping

        try:
            self._shipper = workers_need_shipping(self.executor, self.cache, self.remote)
            while True:
                started = self._start_ready()
                if not self._running:
                    if self._locked_out:
                        time.sleep(0.1)
                        continue
                    if not started:
                        break
                    continue
                timeout = 0.1 if self._locked_out else self.follow_s if self.on_log is not None else None
                done, _ = wait(list(self._running), timeout=timeout, return_when=FIRST_COMPLETED)
                self._follow()
                for future in done:
                    self._finish(future)
        except BaseException:
            # Ctrl-C (or a bug here): stop the running stages now instead of waiting for them, so
            # the lease's workspaces (tmp/<run>/) are removed with nothing still writing into them;
            # a second Ctrl-C must not cut that short (`run` restores the handler afterwards)
            self._sigint = _ignore_sigint()
            abort = getattr(self.executor, "abort", None)
            if abort is not None:
                abort()
            raise
        finally:
            for future, (nid, lock, tmp) in list(self._running.items()):
                future.cancel()
                lock.release()
            self.executor.shutdown()
            if self.remote is not None:
                self.remote.close()  # fetches begun for stages the run did not reach finish or are dropped

    def _records(self) -> dict[str, str]:
        """The record digest of every stage whose key is known (what lineage kinds' keys hold)."""
        return {nid: r.record for nid, r in self.reports.items() if r.record}

    def lock_records(self) -> dict[str, dict[str, StageLock]]:
        """Lock records of every stage that completed (ran or cached) in this run, by the platform
        class of the machine that built each one's outputs ({platform: {stage: record}}).

        Filed by builder, not by this host: a hit on an entry another class built describes that
        class's bytes (zoo/engine/lockfile.py)."""
        records: dict[str, dict[str, StageLock]] = {}
        for nid in self.dag.order():
            if nid in self.entries:
                records.setdefault(self.reports[nid].built_on, {})[nid] = self._record(nid)
        return records

    def _record(self, nid: str) -> StageLock:
        entry = self.entries[nid]
        return StageLock.from_parts(self.parts[nid], entry.output_digests(), entry.metrics, host=entry.host)

    def _locked_still(self, nid: str) -> bool:
        """Whether the completed stage `nid` matches the lockfile (always, unless `--frozen`); a
        difference stops the run."""
        if self.guard is None or self.guard.after(nid, self.reports[nid].built_on, self._record(nid)):
            return True
        self.failed = True
        return False

    # --- scheduling -----------------------------------------------------------------------
    def _start_ready(self) -> bool:
        progressed = False
        for nid, node in self.dag.nodes.items():
            report = self.reports[nid]
            if report.state != StageState.WAITING or self.failed:
                continue
            if not all(self.reports[n].state in (StageState.CACHED, StageState.RAN) for n in node.needs):
                continue
            if self._try_start(node, report):
                progressed = True
        return progressed

    def _try_start(self, node: Node, report: StageReport) -> bool:
        nid = node.id
        if nid not in self.parts:
            self.parts[nid], report.key = keys.stage_key(self.dag, node, self.entries, self._records(), self.hashes)
            report.record = keys.record_digest(self.parts[nid])
        key = report.key
        self.cache.hold(keys=[key])  # before the lookup: a hit's entry and objects stay until the run ends
        pending = self._prefetched.get(nid)
        if pending is not None and pending.key == key and self._remote_hit(node, report, key):
            return True  # fetched ahead of its turn (maybe installed already): from the remote, say so
        upstream_runs = [up for up in node.needs if self.reports[up].state == StageState.RAN]
        previous = self.previous.reference(nid, self.here) if self.previous else None
        action, reasons, entry = decide(node, self.parts[nid], key, self.cache, previous, nid in self.force,
                                        upstream_runs)
        if action == StageState.CACHED:
            if nid in self._locked_out:
                reasons = [Reason(ReasonCode.CACHED, "computed by a concurrent run")]
            self._mark_cached(report, entry, reasons)
            return True
        if self._remote_hit(node, report, key):
            return True
        if self.guard is not None and not self.guard.before_run(nid, self.parts[nid], reasons):
            self.failed = True
            report.state = StageState.SKIPPED
            report.reasons = [Reason(ReasonCode.NOT_RUN, "--frozen: no record in the lockfile to build it for")]
            self.on_update(report)
            return False
        if len(self._running) >= self.jobs:
            return False  # no free slot; stays waiting until a running stage finishes
        lock = self.cache.lock(key)
        try:
            lock.acquire(timeout=0)
        except Exception:  # filelock.Timeout: another zoo run is computing this key right now
            if nid not in self._locked_out:
                self._locked_out.add(nid)
                report.reasons = [Reason(ReasonCode.WAITING, "another run is computing this stage")]
                self.on_update(report)
            return False
        self._locked_out.discard(nid)
        if node.cache_policy == "default" and nid not in self.force:
            entry = self.cache.lookup(key)
            if entry is not None:  # a concurrent run finished it while we waited
                lock.release()
                self._mark_cached(report, entry, [Reason(ReasonCode.CACHED, "computed by a concurrent run")])
                return True
        try:
            task, tmp = self._task(node, key)
        except BaseException:
            lock.release()
            raise
        report.state, report.reasons, report.started = StageState.RUNNING, reasons, time.time()
        report.log_path = str(self.cache.log_path(key))
        report.live_log = task.log_path
        if self.on_log is not None:
            self._followers[nid] = LogFollower(Path(task.log_path))
        self.on_update(report)
        self._running[self._submit(node, task)] = (nid, lock, tmp)
        return True

    def _follow(self, nid: str | None = None, *, final: bool = False) -> None:
        """Hand `on_log` what the running stages' logs (or only `nid`'s) gained since the last look."""
        for sid in [nid] if nid is not None else list(self._followers):
            follower = self._followers.get(sid)
            if follower is None:
                continue
            lines = follower.read(final=final)
            if final:
                del self._followers[sid]
            self.on_log(self.reports[sid], lines)

    def _submit(self, node: Node, task: StageTask) -> Future:
        """Hand `task` to the executor with its resource needs; for workers elsewhere, without
        publishing, and with a shipper, with the Transfer that brings its inputs from the remote
        (a failure to upload them fails the stage, through a finished future)."""
        task.resources = dict(node.resources)
        if self._effects_here:
            task.publish = False  # the caller redoes the effects once it holds the outputs (`_finish`)
        if self._shipper is not None:
            try:
                task.transfer = self._shipper.transfer(task, {up: self.entries[up] for up in node.needs},
                                                       self.parts[node.id], node.cache_policy)
            except ZooError as e:
                failed: Future = Future()
                failed.set_result(StageResult(error=WorkerError.from_exception(e)))
                return failed
        return self.executor.submit(task)

    def _remote_hit(self, node: Node, report: StageReport, key: str) -> bool:
        """True when the stage was settled from the remote run cache: taken from it (cached), or
        failed because the remote served bytes that are not what its entry names (IntegrityError,
        exit 4: nothing installed, and the stage is not run either). Asked once per stage and run,
        only for stages the cache may answer (not forced, policy `default`)."""
        if self.remote is None or node.id in self.force or node.cache_policy != "default" \
                or node.id in self._remote_asked:
            return False
        self._remote_asked.add(node.id)
        if key in self._remote_lacks:
            return False
        try:
            pending = self._prefetched.pop(node.id, None)
            if pending is None or pending.key != key:  # another key: the upstream came out otherwise
                pending = self.remote.begin(key)
            if pending is None:
                return False
            self._prefetch_downstream(node.id, pending)
            entry = self.remote.finish(pending)
        except ZooError as e:
            report.state, report.error = StageState.FAILED, WorkerError.from_exception(e)
            self.failed = True
            self.on_update(report)
            return True
        if entry is None:
            return False
        self._mark_cached(report, entry, [Reason(ReasonCode.CACHED, f"from the remote cache {self.remote.url}")])
        return True

    def _prefetch_downstream(self, nid: str, pending: "PendingFetch") -> None:
        """Begin the remote fetches of the stages below `nid` whose keys are known now: every stage
        they need is done or being fetched (a fetch's entry gives its output digests before its
        objects arrive). Each is used only if its stage's key, when its turn comes, is the same;
        any trouble here just leaves the stage to the usual path."""
        provisional = {up: p for up, p in self._prefetched.items()}
        provisional[nid] = pending
        # the records of the stages fetched ahead, from the parts computed for their keys here
        provisional_records: dict[str, str] = {up: self._provisional_records[up]
                                               for up in provisional if up in self._provisional_records}
        for down in self.dag.order():
            node = self.dag.nodes[down]
            report = self.reports[down]
            if down in provisional or down in self._remote_asked or report.state != StageState.WAITING \
                    or down in self.force or node.cache_policy != "default":
                continue
            if not all(up in provisional or self.reports[up].state in (StageState.CACHED, StageState.RAN)
                       for up in node.needs):
                continue
            entries = {**self.entries, **{up: p.entry for up, p in provisional.items()}}
            records = {a: self.reports[a].record or provisional_records.get(a) for a in self.dag.ancestors(down)}
            if None in records.values():
                continue
            try:
                parts, key = keys.stage_key(self.dag, node, entries, records, self.hashes)
                provisional_records[down] = keys.record_digest(parts)
                if self.cache.lookup(key) is not None or key in self._remote_lacks:
                    continue
                fetch = self.remote.begin(key)
            except ZooError:
                return  # the stage's own turn says what is wrong
            if fetch is None:
                self._remote_lacks.add(key)
                if self.remote.offline:
                    return
                continue
            self._prefetched[down] = provisional[down] = fetch
            self._provisional_records[down] = provisional_records[down]

    def _share(self, node: Node, entry: Entry) -> None:
        """Push a stage this run computed to the remote run cache (policy `default` only)."""
        if self.remote is not None and node.cache_policy == "default":
            self.remote.share(entry)

    def _mark_cached(self, report: StageReport, entry: Entry, reasons: list[Reason]) -> None:
        self._locked_out.discard(report.id)
        self.entries[report.id] = entry
        report.state, report.reasons, report.metrics = StageState.CACHED, reasons, entry.metrics
        report.duration_s = 0.0
        report.log_path = str(self.cache.log_path(entry.key))
        report.outputs = {n: o["digest"] for n, o in entry.outputs.items()}
        report.built_on = host.platform_class(entry.host)
        # effects only for what the lock still pins: a frozen run does not publish other bytes
        if self._locked_still(report.id) and self.publish:
            self._effects(report, entry, kind_did_its_own=False)
        self.on_update(report)

    def _effects(self, report: StageReport, entry: Entry, *, kind_did_its_own: bool) -> None:
        """What a completed stage does outside the cache, here: the kind's own effects where `run`
        did not do them (a cache hit skips run(), a worker elsewhere does none: `on_cached`), then
        the release the kind declares, published to this machine's zoo (zoo/engine/publish.py)."""
        from zoo.engine.publish import publish_release
        from zoo.stage import Inputs, StageContext, StageKind

        node = self.dag.nodes[report.id]
        cls = kind_loader.get(node.kind)
        kind, config = cls(), node.instance.config
        redo = not kind_did_its_own and cls.on_cached is not StageKind.on_cached
        if not redo and kind.release_output(config) is None:
            return
        tmp = self.cache.tmp_dir(re.sub(r"[^A-Za-z0-9_-]+", "_", node.id) + "-effects-")
        context = StageContext(stage_id=node.id, out_dir=tmp / "out", work_dir=tmp / "work",
                               recipe=keys.recipe_info(self.dag.recipe),
                               shared=keys.shared_sections(self.dag.recipe, node), matrix=dict(node.instance.matrix),
                               key=entry.key, record=report.record or "", publish=True,
                               log=logging.getLogger(f"zoo.stage.{node.id}"),
                               inputs=Inputs(self._upstream(node)), entry_metrics=dict(entry.metrics),
                               references=keys.key_context(self.dag.recipe, node).references)
        outputs = self.cache.output_paths(entry)
        try:
            if redo:
                kind.on_cached(outputs, config, context)
            publish_release(kind, config, outputs, context)
        except Exception as e:  # reported like a failure of the stage: the run did not do what it says
            report.state, report.error = StageState.FAILED, WorkerError.from_exception(e)
            self.failed = True
            return
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        report.metrics = {**entry.metrics, **context.metrics}
        report.effects = [*report.effects, *context.effects]

    def _upstream(self, node: Node) -> list[Upstream]:
        """The results of `node`'s needs: their outputs in this cache, the metrics of their entries."""
        upstream = []
        for up in node.needs:
            entry = self.entries[up]
            paths = self.cache.output_paths(entry)
            up_node = self.dag.nodes[up]
            upstream.append(Upstream(stage_id=up, kind=up_node.kind, outputs=dict(paths), metrics=entry.metrics,
                                     matrix=dict(up_node.instance.matrix), key=entry.key,
                                     record=self.reports[up].record or ""))
        return upstream

    def _task(self, node: Node, key: str) -> tuple[StageTask, Path]:
        upstream = self._upstream(node)
        lineage = {}
        if kind_loader.get(node.kind).lineage:
            for a in self.dag.ancestors(node.id):
                record = StageLock.from_parts(self.parts[a], self.entries[a].output_digests(), {})
                lineage[a] = record.to_json()
        tmp = self.cache.tmp_dir(re.sub(r"[^A-Za-z0-9_-]+", "_", node.id) + "-")
        threads = max(1, (os.cpu_count() or 1) // self.jobs)
        task = StageTask(stage_id=node.id, kind=node.kind, key=key, record=self.reports[node.id].record or "",
                         tools=tuple(self.parts[node.id]["tools"]),
                         # only what the recipe set: the worker re-validates it, and validators that
                         # check which options were given must see the recipe, not filled-in defaults
                         config=node.instance.config.model_dump(mode="json", by_alias=True, exclude_unset=True),
                         matrix=dict(node.instance.matrix), shared=keys.shared_sections(self.dag.recipe, node),
                         recipe=keys.recipe_info(self.dag.recipe), upstream=upstream,
                         out_dir=str(tmp / "out"), work_dir=str(tmp / "work"), log_path=str(tmp / "stage.log"),
                         threads=threads, publish=self.publish, lineage=lineage, storage_root=str(self.cache.root),
                         locked_outputs=self.guard.locked_outputs(node.id, self.parts[node.id], self.here) if self.guard else None)
        return task, tmp

    def _finish(self, future: Future) -> None:
        nid, lock, tmp = self._running.pop(future)
        node, report = self.dag.nodes[nid], self.reports[nid]
        try:
            try:
                result: StageResult = future.result()
            except BaseException as e:  # the worker process died (killed, out of memory...)
                result = StageResult(duration_s=time.time() - (report.started or time.time()),
                                     error=WorkerError(type=type(e).__name__, message=f"the stage's process died: {e}"))
            report.duration_s = result.duration_s
            if result.shipped is not None:  # the log comes back from a worker with its own disk
                (tmp / "stage.log").write_text(result.shipped.log, encoding="utf-8")
            self._follow(nid, final=True)  # the lines written since the last look, before the log moves
            self._keep_log(tmp / "stage.log", report.key)
            if result.ok and (mismatch := environment_mismatch(self.parts[nid], result.environment)):
                result = StageResult(error=WorkerError(
                    type=WorkerMismatch.__name__, exit_code=ExitCode(WorkerMismatch.exit_code),
                    message=f"stage {nid} ran where {mismatch}, so its outputs do not belong under the key "
                            "computed here; nothing was cached",
                    hint="install the same versions on every worker as on the machine running `zoo run` "
                         "(pip install -c constraints.txt)"))
            if result.ok:
                try:
                    entry = self._take(node, report, result, tmp)
                except ZooError as e:  # outputs missing, disk full: the stage failed and nothing was recorded
                    result = StageResult(error=WorkerError.from_exception(e))
            if result.ok:
                self.entries[nid] = entry
                if result.shipped is None:  # a worker that shipped it pushed it already
                    self._share(node, entry)
                report.state, report.metrics = StageState.RAN, result.metrics
                report.effects = list(result.effects)
                report.outputs = {n: o["digest"] for n, o in entry.outputs.items()}
                report.built_on = host.platform_class(entry.host)
                if self._locked_still(nid) and self.publish:
                    self._effects(report, entry, kind_did_its_own=not self._effects_here)
            else:
                report.state, report.error = StageState.FAILED, result.error
                report.metrics = result.metrics  # what it measured before failing (a failed gate's value)
                self.failed = True
        finally:
            lock.release()
            shutil.rmtree(tmp, ignore_errors=True)
        self.on_update(report)

    def _take(self, node: Node, report: StageReport, result: StageResult, tmp: Path) -> Entry:
        """The entry of a stage that ran: its outputs committed from the workspace, or (a worker
        that shipped them) downloaded from the remote run cache."""
        if result.shipped is not None and self._shipper is not None:
            return self._shipper.receive(report.key, result.shipped, node.cache_policy)
        return self.cache.commit(key=report.key, stage=node.id, kind=node.kind, out_dir=tmp / "out",
                                 outputs=result.outputs, metrics=result.metrics, parts=self.parts[node.id],
                                 duration_s=report.duration_s, record=node.cache_policy != "disable",
                                 host=result.host)

    def _keep_log(self, src: Path, key: str) -> None:
        if src.exists():
            dest = self.cache.log_path(key)
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(src, dest)


def _ignore_sigint() -> Any:
    """Ignore SIGINT (in the main thread only: elsewhere Python cannot); the previous handler, or None."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGINT, signal.SIG_IGN)




def log_tail(path: str | None, lines: int = 20) -> str:
    """The last lines of a stage log, for failure messages."""
    if not path:
        return ""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])
