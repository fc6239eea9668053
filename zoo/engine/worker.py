"""What runs inside an executor process: one stage, its output captured to its log.

`StageTask` (what to run) and `StageResult` (what happened, a `WorkerError` if it failed) are
plain picklable dataclasses, so any executor (a local process pool, a dask cluster) can run
`execute` without knowing about recipes, planners or caches.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zoo.errors import ExitCode
from zoo.stage import Effect, RecipeInfo, Upstream


@dataclass
class StageTask:
    """Everything needed to run one stage, and nothing that cannot be pickled."""

    stage_id: str
    kind: str
    key: str
    config: dict[str, Any]
    matrix: dict[str, str]
    shared: dict[str, Any]
    recipe: RecipeInfo
    upstream: list[Upstream]
    out_dir: str
    work_dir: str
    log_path: str
    threads: int = 1
    publish: bool = True
    lineage: dict[str, Any] = field(default_factory=dict)
    record: str = ""  # the digest of the stage's lock record (StageContext.record)
    tools: tuple[str, ...] = ()  # the distributions whose versions are in its key (key_environment)
    locked_outputs: dict[str, str] | None = None  # --frozen: the lock's output digests for this key here
    resources: dict[str, Any] = field(default_factory=dict)  # what a Dask worker must offer (recipe `resources:`)
    storage_root: str = ""  # the cache dir, named when its disk fills ("no space left on <cache>")
    # a zoo.engine.remote_stage.Transfer when the worker shares no disk with the caller: the remote
    # run cache and the upstream entries it fetches the inputs from (the paths above are then its own)
    transfer: Any = None


@dataclass(frozen=True)
class WorkerError:
    """A stage's failure as it crosses from the worker to the runner (and into `StageReport.error`).

    `exit_code`, `hint` and `table` come from a `ZooError`; any other exception is a bug of
    the kind and exits 1. The traceback goes to the stage's log, never into `--json` output.
    """

    type: str
    message: str
    hint: str | None = None
    exit_code: ExitCode = ExitCode.FAILED
    table: str = ""  # a GateFailed's table of gates
    traceback: str = ""
    # a FieldError's recipe field (("data", "label")): zoo/engine/failures.py places it in the recipe
    field: tuple[str | int, ...] = ()

    @classmethod
    def from_exception(cls, e: BaseException) -> "WorkerError":
        """The error for `e`; its traceback includes the exceptions it was raised from."""
        from zoo.errors import ZooError

        message, tb = str(e) or type(e).__name__, "".join(traceback.format_exception(e))
        if not isinstance(e, ZooError):
            return cls(type=type(e).__name__, message=message, traceback=tb)
        # a plugin's error class may carry a status zoo does not document: it exits 1
        code = ExitCode(e.exit_code) if e.exit_code in ExitCode._value2member_map_ else ExitCode.FAILED
        return cls(type=type(e).__name__, message=message, hint=e.hint, exit_code=code,
                   table=getattr(e, "table", ""), traceback=tb, field=tuple(getattr(e, "field", ()) or ()))

    def to_json(self) -> dict[str, Any]:
        """What `--json` shows (no traceback: it is in the stage's log)."""
        return {"type": self.type, "message": self.message, "hint": self.hint, "exit_code": int(self.exit_code),
                "table": self.table}


@dataclass
class StageResult:
    """What `execute` returns: outputs and metrics of a stage that ran, or the error it failed with."""

    duration_s: float = 0.0
    outputs: dict[str, str] = field(default_factory=dict)  # output name -> path relative to out_dir
    metrics: dict[str, Any] = field(default_factory=dict)
    host: dict[str, Any] | None = None
    environment: dict[str, dict[str, str]] | None = None  # see key_environment
    error: WorkerError | None = None
    effects: list[Effect] = field(default_factory=list)  # what the stage did outside the cache
    shipped: Any = None  # a zoo.engine.remote_stage.Shipped: the entry a worker pushed, and its log

    @property
    def ok(self) -> bool:
        return self.error is None


def init_worker(parent_pid: int | None = None, pdeathsig: bool = True) -> None:
    """Set up a pool worker process: die with its parent; skip interpreter teardown when it exits.

    A worker must not outlive the `zoo run` that started it (kill -9 of the run left workers of
    hundreds of MB, and through them multiprocessing's resource tracker, alive for good). On
    Linux the kernel kills it when its parent dies (PR_SET_PDEATHSIG); everywhere, a watchdog
    thread ends it when the pipe from its parent closes or it is re-parented.

    A worker that ran torch/onnxruntime stages spent 0.4-0.5 s in Python's finalisation
    (module teardown, freeing the heap object by object) after the last stage, and the run
    waits for its workers to exit. Results are sent and logs closed per stage, so nothing
    is lost: at exit the worker flushes its standard streams and ends at once.
    """
    import atexit

    def _exit_now() -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # a closed or broken stream: nothing left to save
                pass
        os._exit(0)

    atexit.register(_exit_now)
    if parent_pid is None:
        return
    if pdeathsig:
        _set_parent_death_signal()
    if os.getppid() != parent_pid:  # the parent died before the signal was armed
        os._exit(1)
    _start_parent_watchdog(parent_pid)


def _set_parent_death_signal() -> bool:
    """Ask Linux to SIGKILL this process when its parent dies; False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        return libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _start_parent_watchdog(parent_pid: int, interval_s: float = 1.0) -> None:
    """A daemon thread that ends this process once its parent is gone (portable fallback)."""
    import multiprocessing
    import threading
    from multiprocessing.connection import wait

    parent = multiprocessing.parent_process()
    sentinel = getattr(parent, "sentinel", None)

    def _watch() -> None:
        while True:
            if sentinel is not None:
                try:
                    if wait([sentinel], timeout=interval_s):  # EOF: the parent's end of the pipe closed
                        os._exit(1)
                except OSError:
                    os._exit(1)
            else:
                import time as _time

                _time.sleep(interval_s)
            if os.getppid() != parent_pid:
                os._exit(1)

    threading.Thread(target=_watch, name="zoo-parent-watchdog", daemon=True).start()


def execute(task: StageTask) -> StageResult:
    """Run the stage; its result holds the outputs, metrics and effects, or the error it failed with."""
    from zoo import host
    from zoo.engine import kind_loader, parents
    from zoo.stage import Inputs, StageContext

    started = time.perf_counter()
    out_dir, work_dir = Path(task.out_dir), Path(task.work_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    work_dir.mkdir(parents=True, exist_ok=True)
    context = None
    with _captured(Path(task.log_path)) as logger:
        try:
            cls = kind_loader.get(task.kind)
            kind = cls()
            config = _validated_config(cls, task.config)
            inputs = Inputs(task.upstream)
            context = StageContext(stage_id=task.stage_id, out_dir=out_dir, work_dir=work_dir, recipe=task.recipe,
                                   shared=task.shared, matrix=task.matrix, threads=task.threads, key=task.key,
                                   record=task.record, publish=task.publish, lineage=task.lineage,
                                   locked_outputs=task.locked_outputs, log=logger,
                                   references=parents.StageReferences(task.shared, task.recipe.dir))
            logger.info("stage %s (%s) starting with %d thread(s)", task.stage_id, task.kind, task.threads)
            returned = kind.run(inputs, config, context) or {}
            outputs = _relative_outputs(returned, out_dir, cls)
            metrics = _jsonable(context.metrics)
            logger.info("stage %s done in %.2fs", task.stage_id, time.perf_counter() - started)
            return StageResult(duration_s=time.perf_counter() - started, outputs=outputs, metrics=metrics,
                               host=host.describe(), environment=key_environment(task.kind, task.tools),
                               effects=list(context.effects))
        except BaseException as e:  # everything is reported back; the parent decides what it means
            logger.error("stage %s failed:\n%s", task.stage_id, traceback.format_exc())
            full = disk_full_error(e, task)
            if full is not None:
                full.__cause__ = e
            # what the stage measured before it failed (a gate's value) tells the user what to fix
            metrics = _jsonable(context.metrics) if context is not None else {}
            return StageResult(duration_s=time.perf_counter() - started, metrics=metrics,
                               error=WorkerError.from_exception(e if full is None else full))


# A stage that failed while the disk under its workspace has less than this left is reported as a
# full disk: native code (protobuf, onnxruntime) often ignores a failed write and the stage then
# fails reading back a truncated file ("INVALID_PROTOBUF", "Wire format was corrupt").
FULL_BELOW_BYTES = 1 << 20


def disk_full_error(e: BaseException, task: StageTask):
    """A NoSpace error for a stage failure caused by a full disk, or None."""
    from zoo.errors import NoSpace, is_no_space, no_space

    seen: set[int] = set()
    cause: BaseException | None = e
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, NoSpace):  # already says which disk and what frees it (the local zoo's, say)
            return NoSpace(cause.message, hint=cause.hint)
        if is_no_space(cause):
            return no_space(_storage_name(getattr(cause, "filename", None) or task.out_dir, task))
        cause = cause.__cause__ or cause.__context__
    for folder in (task.out_dir, task.work_dir):
        try:
            st = os.statvfs(folder)
        except (OSError, AttributeError):  # gone, or no statvfs (Windows)
            continue
        if st.f_bavail * st.f_frsize < FULL_BELOW_BYTES:
            return no_space(_storage_name(folder, task),
                            detail="the stage failed once the disk was full; its log has what failed")
    return None


def _storage_name(path: str, task: StageTask) -> str:
    """The cache dir when `path` is inside it (its tmp/ names mean nothing to users), else `path`."""
    if task.storage_root:
        root = Path(task.storage_root)
        try:
            if Path(path).resolve().is_relative_to(root.resolve()):
                return str(root)
        except OSError:
            pass
    return str(path)


def _validated_config(cls: type, raw: dict[str, Any]) -> Any:
    from pydantic import ValidationError

    from zoo.errors import InvalidInput

    try:
        return cls.Config.model_validate(raw)
    except ValidationError as e:  # the recipe was validated at load time: this is a kind's bug
        raise InvalidInput(f"kind {cls.name!r} rejected its config on the worker: {e}") from None


def _relative_outputs(returned: Any, out_dir: Path, cls: type) -> dict[str, str]:
    from zoo.errors import InvalidInput, UnsafePath

    if not hasattr(returned, "items"):
        raise InvalidInput(f"kind {cls.name!r} returned {type(returned).__name__}, expected a mapping name -> path")
    result = {}
    base = out_dir.resolve()
    for name, path in returned.items():
        p = Path(path)
        p = (out_dir / p) if not p.is_absolute() else p
        p = p.resolve()
        if not p.is_relative_to(base):
            raise UnsafePath(f"kind {cls.name!r}: output {name!r} ({p}) is outside the stage's out_dir")
        if not p.exists():
            raise InvalidInput(f"kind {cls.name!r}: output {name!r} was declared but {p} was not written")
        declared = tuple(cls.outputs)
        if declared and name not in declared:
            raise InvalidInput(f"kind {cls.name!r} returned undeclared output {name!r} (declares {', '.join(declared)})")
        result[name] = p.relative_to(base).as_posix() or "."
    return result


def _jsonable(metrics: dict[str, Any]) -> dict[str, Any]:
    import json

    return json.loads(json.dumps(metrics, default=_fallback, allow_nan=True))


def _fallback(obj: Any) -> Any:
    if hasattr(obj, "item"):  # numpy scalars
        return obj.item()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    return repr(obj)


def key_environment(kind: str, tools: tuple[str, ...]) -> dict[str, dict[str, str]]:
    """The versions of the tools the stage uses (`tools`, as its key names them) and the digests of
    the kind's code, as this process has them.

    The runner computes a stage's key where the recipe is planned; a worker on another machine
    (dask) may have other versions, and its outputs must not be cached under that key.
    """
    from zoo.engine.hashing import hash_file_uncached
    from zoo.engine.keys import module_files, tool_versions

    return {"tools": tool_versions(tuple(tools)),
            "code": {f"kind:{name}": hash_file_uncached(path) for name, path in module_files(kind).items()}}


def environment_mismatch(parts: dict[str, Any], seen: dict[str, Any] | None) -> str:
    """How the worker's tool versions and kind code differ from the key's ('' if they agree).

    Workers that report nothing (older ones) are trusted, as before."""
    if not seen:
        return ""
    diffs = []
    for dist, want in sorted(parts.get("tools", {}).items()):
        got = seen.get("tools", {}).get(dist)
        if got is not None and got != want:
            diffs.append(f"{dist} is {got} (here: {want})")
    for name, want in sorted(parts.get("code", {}).items()):
        got = seen.get("code", {}).get(name)
        if name.startswith("kind:") and got is not None and got != want:
            diffs.append(f"the code of {name[5:]} differs")
    return "; ".join(diffs)


class _captured:
    """Send fd 1 and 2 (C libraries included) and the stage logger to the stage's log file."""

    def __init__(self, log_path: Path):
        self.log_path = log_path

    def __enter__(self) -> logging.Logger:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        sys.stdout.flush()
        sys.stderr.flush()
        self.file = open(self.log_path, "ab", buffering=0)
        self.saved = (os.dup(1), os.dup(2))
        os.dup2(self.file.fileno(), 1)
        os.dup2(self.file.fileno(), 2)
        self.logger = logging.getLogger(f"zoo.stage.{os.getpid()}")
        self.logger.setLevel(logging.INFO)
        self.logger.propagate = False
        self.handler = logging.StreamHandler(open(self.log_path, "a", buffering=1, encoding="utf-8"))
        self.handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        self.logger.addHandler(self.handler)
        return self.logger

    def __exit__(self, *exc) -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except OSError:  # the log's disk is full: the result still goes back to the runner
                pass
        self.logger.removeHandler(self.handler)
        try:
            self.handler.stream.close()
        except OSError:
            pass
        os.dup2(self.saved[0], 1)
        os.dup2(self.saved[1], 2)
        os.close(self.saved[0])
        os.close(self.saved[1])
        self.file.close()
