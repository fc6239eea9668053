"""What runs inside an executor process: one stage, its output captured to its log.

`StageTask` is a plain picklable description, so any executor (a local process pool, a dask
cluster) can run `execute` without knowing about recipes, planners or caches.
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

from zoo.stage import RecipeInfo


@dataclass
class UpstreamRef:
    stage_id: str
    kind: str
    outputs: dict[str, str]
    metrics: dict[str, Any]
    matrix: dict[str, str]
    key: str


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
    upstream: list[UpstreamRef]
    out_dir: str
    work_dir: str
    log_path: str
    threads: int = 1
    publish: bool = True
    lineage: dict[str, Any] = field(default_factory=dict)
    resources: dict[str, Any] = field(default_factory=dict)
    storage_root: str = ""  # the cache dir, named when its disk fills ("no space left on <cache>")


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


def execute(task: StageTask) -> dict[str, Any]:
    """Run the stage; returns {"ok", "outputs", "metrics", "duration_s", "host"} or {"ok": False, "error": ...}."""
    from zoo import host, kind_loader
    from zoo.stage import Inputs, StageContext, Upstream

    started = time.perf_counter()
    out_dir, work_dir = Path(task.out_dir), Path(task.work_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    work_dir.mkdir(parents=True, exist_ok=True)
    with _captured(Path(task.log_path)) as logger:
        try:
            cls = kind_loader.get(task.kind)
            kind = cls()
            config = _validated_config(cls, task.config)
            inputs = Inputs([Upstream(stage_id=u.stage_id, kind=u.kind,
                                      outputs={k: Path(v) for k, v in u.outputs.items()},
                                      metrics=u.metrics, matrix=u.matrix, key=u.key) for u in task.upstream])
            context = StageContext(stage_id=task.stage_id, out_dir=out_dir, work_dir=work_dir, recipe=task.recipe,
                                   shared=task.shared, matrix=task.matrix, threads=task.threads, key=task.key,
                                   publish=task.publish, lineage=task.lineage, log=logger)
            logger.info("stage %s (%s) starting with %d thread(s)", task.stage_id, task.kind, task.threads)
            returned = kind.run(inputs, config, context) or {}
            outputs = _relative_outputs(returned, out_dir, cls)
            metrics = _jsonable(context.metrics)
            logger.info("stage %s done in %.2fs", task.stage_id, time.perf_counter() - started)
            return {"ok": True, "outputs": outputs, "metrics": metrics, "duration_s": time.perf_counter() - started,
                    "host": host.describe(), "environment": key_environment(task.kind)}
        except BaseException as e:  # everything is reported back; the parent decides what it means
            logger.error("stage %s failed:\n%s", task.stage_id, traceback.format_exc())
            full = disk_full_error(e, task)
            return {"ok": False, "duration_s": time.perf_counter() - started,
                    "error": describe_error(full) if full is not None else describe_error(e)}


# A stage that failed while the disk under its workspace has less than this left is reported as a
# full disk: native code (protobuf, onnxruntime) often ignores a failed write and the stage then
# fails reading back a truncated file ("INVALID_PROTOBUF", "Wire format was corrupt").
FULL_BELOW_BYTES = 1 << 20


def disk_full_error(e: BaseException, task: StageTask):
    """A NoSpace error for a stage failure caused by a full disk, or None."""
    from zoo.errors import is_no_space, no_space

    seen: set[int] = set()
    cause: BaseException | None = e
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
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


def key_environment(kind: str) -> dict[str, dict[str, str]]:
    """The tool versions and kind code digests this process has, as they enter a cache key.

    The runner computes a stage's key where the recipe is planned; a worker on another machine
    (dask) may have other versions, and its outputs must not be cached under that key.
    """
    from zoo import kind_loader
    from zoo.hashing import hash_file_uncached
    from zoo.keys import module_files, tool_versions

    return {"tools": tool_versions(tuple(kind_loader.get(kind).tools)),
            "code": {f"kind:{name}": hash_file_uncached(path) for name, path in module_files(kind).items()}}


def describe_error(e: BaseException) -> dict[str, Any]:
    """A failure as the runner reports it: type, message, traceback; exit code and hint of a ZooError."""
    from zoo.errors import ZooError

    info: dict[str, Any] = {"type": type(e).__name__, "message": str(e) or type(e).__name__,
                            "traceback": traceback.format_exc()}
    if isinstance(e, ZooError):
        info.update(exit_code=e.exit_code, hint=e.hint, table=getattr(e, "table", ""))
    return info


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
