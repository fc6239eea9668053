"""A stage on a worker that shares no disk with the caller: inputs and outputs go through the
remote run cache (zoo/engine/remote_cache.py).

The caller (`Shipper`, on the runner's side) makes sure the objects of the stage's upstream
entries, and the files the stage reads from the recipe's folder and zoo's folders (its keyed
dependencies: zoo/engine/stage_files.py), are on the remote, and sends the worker a `Transfer`:
the remote's URL and options, those entries, the sha256 of each of their objects, the manifest of
those files, and the stage's key parts. The worker (`execute_shipped`, in a Dask worker process)
fetches the objects its own cache lacks (blake3 checked while they stream: a tampered object
is an IntegrityError, exit 4), puts the files in a private project folder (and its own ZOO_HOME /
cache), checks their digests against the key (else nothing runs: IntegrityError), runs the stage
in a workspace of its own cache with the recipe in that project folder, checks that its tool
versions and kind code are those of the key (else nothing is pushed), commits the outputs to its cache, pushes the objects and then (cache
policy `default`) the entry, and returns the entry with its log (`Shipped`). The caller downloads
the objects it lacks from the remote (verified the same way) and records the entry: its cache
ends as a local run leaves it, so the lockfile, the no-op fast path, `zoo release` and the stage's
effects (on_cached, at the caller) work as after a local run.

Credentials for the remote come from each worker's own environment, never from the caller. A
worker needs zoo (and the kinds' packages) installed, those credentials, and the remote: no
shared disk, and no copy of the project.

Thread counts stay the caller's (`StageTask.threads`): train's checkpoint bytes depend on them
(GEMM splits) and they are not in the key, so a worker choosing its own would put other bytes
under the key a local run fills.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zoo.engine.cache import Cache, Entry, misdeclared_outputs
from zoo.engine.cache_config import RemoteCacheSetting
from zoo.engine.stage_files import FileManifest, FileShipper, check_digests, dependency_codes, materialise, shipped_task
from zoo.engine.worker import StageResult, StageTask, WorkerError, environment_mismatch, execute
from zoo.errors import IntegrityError, InvalidInput, ZooError

if TYPE_CHECKING:
    from zoo.engine.remote_cache import RemoteCache


@dataclass(frozen=True)
class Transfer:
    """What a worker needs besides its `StageTask` to run a stage through the remote run cache."""

    setting: RemoteCacheSetting
    upstream: dict[str, dict[str, Any]]  # upstream stage id -> its cache entry (Entry.to_json)
    sha256: dict[str, str]  # blake3 -> sha256 of every upstream object (the remote names objects by sha256)
    parts: dict[str, Any]  # the stage's key parts (the entry records them; the worker checks its versions against them)
    cache_policy: str = "default"  # default: the entry is pushed too; disable: not recorded anywhere
    files: FileManifest = field(default_factory=FileManifest)  # what the stage reads outside the cache (stage_files.py)


@dataclass(frozen=True)
class Shipped:
    """What a worker sends back beside the `StageResult`: the entry it pushed (None if the stage
    failed), the sha256 of its objects, and the stage's log (the worker's disk is not the caller's)."""

    entry: dict[str, Any] | None = None
    sha256: dict[str, str] = field(default_factory=dict)
    log: str = ""


def workers_need_shipping(executor: Any, cache: Cache, remote: "RemoteCache | None") -> "Shipper | None":
    """A `Shipper` when the executor's workers take stages through the remote run cache; None when
    they run where the caller's cache is (local processes, or a cluster that mounts it at the same
    path). InvalidInput for a cluster that has neither a writable remote nor the caller's cache."""
    if not getattr(executor, "remote_workers", False):
        return None
    if remote is not None and remote.setting.push and not remote.store.read_only:
        return Shipper(remote)
    if executor.sees(cache.tmp if cache.tmp.is_dir() else cache.root):
        return None
    why = ("its remote run cache is read-only" if remote is not None else "no remote run cache is set")
    raise InvalidInput(f"the workers of {getattr(executor, 'address', 'the cluster')} cannot read the run cache "
                       f"{cache.root}, and {why}",
                       hint="give the run a remote run cache the workers can reach and write (--cache-remote URL, "
                            "or cache.remote in .zoo/config.yaml; credentials from each worker's environment), or "
                            "mount the cache at the same path on every worker")


class Shipper:
    """The caller's side: the `Transfer` a task carries, and taking back what a worker pushed."""

    def __init__(self, remote: "RemoteCache"):
        self.remote = remote
        self.sha: dict[str, str] = {}  # blake3 -> sha256 of objects known to be on the remote
        self.files = FileShipper(remote.store)

    def transfer(self, task: StageTask, upstream: dict[str, Entry], parts: dict[str, Any],
                 cache_policy: str) -> Transfer:
        """The task's Transfer, after uploading the upstream objects the remote may lack (an
        upstream taken from the caller's own cache may never have been pushed) and the files the
        stage reads from the recipe's folder and zoo's folders (InvalidInput for one elsewhere)."""
        files = self.files.manifest(task, dependency_codes(parts))
        for entry in upstream.values():
            if any(m["digest"] not in self.sha for m in entry.files.values()):
                self.sha.update(self.remote.push_objects(entry))
        digests = {m["digest"] for e in upstream.values() for m in e.files.values()}
        return Transfer(setting=self.remote.setting, upstream={sid: e.to_json() for sid, e in upstream.items()},
                        sha256={d: self.sha[d] for d in sorted(digests)}, parts=parts, cache_policy=cache_policy,
                        files=files)

    def receive(self, key: str, shipped: Shipped, cache_policy: str) -> Entry:
        """The entry a worker pushed for `key`, its objects downloaded into the caller's cache (verified)."""
        try:
            entry = Entry.from_json(shipped.entry or {})
        except ValueError as e:
            raise IntegrityError(f"a worker returned an invalid cache entry for key {key[:16]}…: {e}".splitlines()[0],
                                 hint="the workers run another zoo version; install the same one everywhere") from None
        if entry.key != key:
            raise IntegrityError(f"a worker returned an entry for key {entry.key[:16]}… where {key[:16]}… was asked",
                                 hint="the workers run another zoo version; install the same one everywhere")
        lies = misdeclared_outputs(entry)
        if lies:
            raise IntegrityError(f"a worker returned an entry for key {key[:16]}… that declares output {lies[0]}; "
                                 "nothing was installed", hint="the workers run another zoo version; install the "
                                                               "same one everywhere")
        self.remote.install(entry, shipped.sha256, record=cache_policy != "disable")
        self.sha.update(shipped.sha256)
        return entry


def execute_shipped(task: StageTask) -> StageResult:
    """In a worker: fetch the inputs into this worker's cache, run the stage, push its outputs."""
    from zoo import paths
    from zoo.engine.remote_cache import RemoteCache

    transfer: Transfer = task.transfer
    cache = Cache(paths.cache_dir()).ensure()
    remote = RemoteCache(cache, transfer.setting)
    with cache.leased():
        tmp = cache.tmp_dir(re.sub(r"[^A-Za-z0-9_-]+", "_", task.stage_id) + "-")
        log = tmp / "stage.log"
        try:
            try:
                upstream = _fetch_upstream(task, transfer, remote)
                materialise(transfer.files, remote.store, tmp / "project", url=remote.url)
                local = replace(shipped_task(task, transfer.files, tmp / "project"), upstream=upstream,
                                out_dir=str(tmp / "out"), work_dir=str(tmp / "work"), log_path=str(log),
                                storage_root=str(cache.root), transfer=None)
                check_digests(local, dependency_codes(transfer.parts), private=not transfer.files.recipe_dir)
            except Exception as e:  # nothing was run: the inputs are not those of the key, or cannot be had
                return StageResult(error=WorkerError.from_exception(e), shipped=Shipped())
            result = execute(local)
            if result.ok:
                result = _push(local, transfer, result, cache, remote, tmp / "out")
            text = log.read_text(encoding="utf-8", errors="replace") if log.exists() else ""
            return replace(result, shipped=replace(result.shipped or Shipped(), log=text))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def _fetch_upstream(task: StageTask, transfer: Transfer, remote: "RemoteCache") -> list:
    """The task's upstream results with their outputs in this worker's cache (downloaded as needed)."""
    upstream = []
    for up in task.upstream:
        entry = Entry.from_json(transfer.upstream[up.stage_id])
        remote.install(entry, transfer.sha256, record=False)
        upstream.append(replace(up, outputs=dict(remote.cache.output_paths(entry))))
    return upstream


def _push(task: StageTask, transfer: Transfer, result: StageResult, cache: Cache, remote: "RemoteCache",
          out_dir: Path) -> StageResult:
    """Commit the outputs to this worker's cache and push them (then the entry) to the remote."""
    if environment_mismatch(transfer.parts, result.environment):
        return result  # the caller reports the mismatch; nothing goes under a key these bytes do not belong to
    try:
        entry = cache.commit(key=task.key, stage=task.stage_id, kind=task.kind, out_dir=out_dir,
                             outputs=result.outputs, metrics=result.metrics, parts=transfer.parts,
                             duration_s=result.duration_s, record=transfer.cache_policy != "disable",
                             host=result.host)
        sha = remote.push_objects(entry)
        if transfer.cache_policy == "default":
            # False: another run pushed this key first, with its own bytes
            remote.create_entry(entry, sha, log=Path(task.log_path))
    except ZooError as e:
        return replace(result, error=WorkerError.from_exception(e))
    return replace(result, shipped=Shipped(entry=entry.to_json(), sha256=sha))
