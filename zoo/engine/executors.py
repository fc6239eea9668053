"""Executors: where stages run. The runner only submits `StageTask`s and waits on futures.

- `ProcessExecutor` (default): a pool of spawned local processes, so heavy kinds that hold the
  GIL run in parallel with ``-j N``;
- `DaskExecutor`: a dask.distributed cluster (``--executor dask://HOST:PORT``). Its workers may be
  on other machines (``remote_workers``): with a remote run cache they use their own caches and
  move a stage's inputs and outputs through it (zoo/engine/remote_stage.py); without one, they
  need the caller's cache dir at the same path (``sees`` checks it when the run starts). A stage's
  recipe ``resources:`` go with it (``client.submit(..., resources=...)``), so it runs only on a
  worker that declares them; one that no worker of the cluster offers fails at submission.
"""

from __future__ import annotations

import os
import sys
import threading
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Mapping, Protocol
from urllib.parse import parse_qs, urlsplit

from zoo.errors import InvalidInput, SourceUnreachable
from zoo.engine.worker import StageResult, StageTask, WorkerError, execute


class Executor(Protocol):
    """Submit a stage with its inputs and resource needs; get a future of its `StageResult`.

    An executor whose workers may be on other machines (their own disks, their own zoo) also has
    ``remote_workers = True`` and ``sees(folder) -> bool`` (whether every worker reads the
    caller's `folder` at the same path); the runner then keeps effects at the caller and, with a
    remote run cache, ships stages through it (zoo/engine/remote_stage.py). An executor may also
    have ``abort()``: stop its running stages now (Ctrl-C), which the runner calls instead of
    waiting for them (`ProcessExecutor` ends its worker processes)."""

    def submit(self, task: StageTask) -> Future: ...

    def shutdown(self) -> None: ...


# glibc malloc settings for worker processes. Stages move whole models (hundreds of MB) through
# protobuf, numpy, torch and onnxruntime buffers. By default glibc serves each such buffer with a
# fresh mmap and unmaps it on free, so every copy faults its pages in again; on virtual machines a
# page fault costs microseconds (measured here: 3 load+serialise cycles of a 233 MB model, 2.8 s of
# which 2.4 s kernel time; 0.46 s with these settings). Keeping freed memory in the heap (no mmap,
# no trim) and backing it with transparent huge pages removes almost all of those faults; one arena
# makes threads (stages overlap checks, saves and parity runs) reuse that same heap instead of
# faulting in their own. The cost: a worker's resident memory stays at its peak until it exits
# (workers exit with the run).
WORKER_MALLOC_TUNABLES = (
    "glibc.malloc.hugetlb=1:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=4294967295:glibc.malloc.arena_max=1")
_spawn_lock = threading.Lock()


def worker_env_overrides(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """Environment variables to set for spawned workers: the malloc tunables, on Linux only.

    Nothing is set when the user already chose GLIBC_TUNABLES or set ``ZOO_MALLOC_TUNING=0``.
    """
    if not sys.platform.startswith("linux") or environ.get("ZOO_MALLOC_TUNING", "1") == "0":
        return {}
    if "GLIBC_TUNABLES" in environ:
        return {}
    return {"GLIBC_TUNABLES": WORKER_MALLOC_TUNABLES}


@contextmanager
def _child_env(overrides: dict[str, str]) -> Iterator[None]:
    """Set `overrides` in os.environ while workers are spawned (a spawned child copies the
    environment at exec, and glibc reads its tunables only then), restoring it afterwards."""
    if not overrides:
        yield
        return
    with _spawn_lock:
        saved = {k: os.environ.get(k) for k in overrides}
        os.environ.update(overrides)
        try:
            yield
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


class ProcessExecutor:
    """Local process pool (spawn: safe beside threads, and each stage sees a clean interpreter).

    Workers are spawned on the first submit and reused for later stages, so heavy imports
    (torch, onnxruntime) are paid once per worker, not once per stage.
    """

    def __init__(self, jobs: int = 1):
        self.jobs = max(1, jobs)
        self._pool = None

    def submit(self, task: StageTask) -> Future:
        if self._pool is None:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            from zoo.engine.worker import init_worker

            # workers die with this process (see init_worker): a killed run leaves no worker behind
            self._pool = ProcessPoolExecutor(max_workers=self.jobs, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=init_worker, initargs=(os.getpid(),))
        # the pool spawns its workers inside submit (on demand, for the spawn start method)
        with _child_env(worker_env_overrides()):
            return self._pool.submit(execute, task)

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def abort(self) -> None:
        """Stop now (Ctrl-C): end the workers, whatever they are running, and wait until they are
        gone, so nothing writes into the run's workspaces after the runner removes them."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        workers = list((getattr(pool, "_processes", None) or {}).values())  # no public handle before 3.14
        pool.shutdown(wait=False, cancel_futures=True)
        for process in workers:
            process.terminate()
        for process in workers:
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
                process.join(timeout=5)


class DaskExecutor:
    """Runs stages on a dask.distributed scheduler through its concurrent.futures interface.

    `resource_wait_s`: how long a stage whose resources no worker offers waits for such a worker
    to join before it fails (a busy worker that offers them is waited for by Dask, unbounded)."""

    remote_workers = True

    def __init__(self, address: str, *, resource_wait_s: float = 30.0):
        try:
            from distributed import Client
        except ImportError:
            raise InvalidInput("the dask executor needs dask.distributed",
                               hint="pip install 'zoo-onnx[dask]'") from None
        self.address = address
        self.resource_wait_s = resource_wait_s
        try:
            # dask raises a bare OSError (its TimeoutError) after its connect timeout: say which
            # scheduler and what to check rather than show dask's traceback
            self._client = Client(address, set_as_default=False)
        except OSError as e:
            raise SourceUnreachable(
                f"no Dask scheduler answered at {address}: {e}",
                hint="start one (`dask scheduler`) or check the address of --executor dask://HOST:PORT") from None
        self._executor = self._client.get_executor(pure=False)

    def submit(self, task: StageTask) -> Future:
        if task.resources and (missing := self._unoffered(task.resources)):
            return _failed(task, missing, self.address)
        if task.transfer is not None:
            from zoo.engine.remote_stage import execute_shipped

            return self._executor.submit(execute_shipped, task, resources=task.resources or None)
        return self._executor.submit(execute, task, resources=task.resources or None)

    def sees(self, folder: Path) -> bool:
        """True when every worker reads a file written in `folder` here (a shared filesystem at the same path)."""
        import secrets

        token = secrets.token_hex(16)
        probe = Path(folder) / f".zoo-probe-{token}"
        probe.write_text(token, encoding="utf-8")
        try:
            answers = self._client.run(_holds, str(probe), token)
        finally:
            probe.unlink(missing_ok=True)
        return all(answers.values())

    def _unoffered(self, wanted: Mapping[str, float]) -> str:
        """'' when a worker of the cluster offers `wanted`, else what none offers (after waiting
        up to `resource_wait_s` for one to join)."""
        import time

        deadline = time.monotonic() + self.resource_wait_s
        while True:
            offered = [w.get("resources") or {} for w in self._client.scheduler_info(n_workers=-1)["workers"].values()]
            if any(all(res.get(k, 0) >= v for k, v in wanted.items()) for res in offered):
                return ""
            if time.monotonic() >= deadline:
                have = sorted({f"{k}={v:g}" for res in offered for k, v in res.items()})
                return (f"{_resource_text(wanted)} (the {len(offered)} worker(s) offer "
                        f"{', '.join(have) or 'no resources'})")
            time.sleep(0.5)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=True)
        self._client.close()


def _holds(path: str, token: str) -> bool:
    """On a worker: whether `path` exists there with `token` in it."""
    try:
        return Path(path).read_text(encoding="utf-8") == token
    except OSError:
        return False


def _resource_text(resources: Mapping[str, float]) -> str:
    return " ".join(f"{k}={v:g}" for k, v in resources.items())


def _failed(task: StageTask, missing: str, address: str) -> Future:
    """A finished future: the stage failed because no worker of the cluster offers its resources."""
    error = InvalidInput(f"stage {task.stage_id} needs {missing}; no worker of the Dask cluster at {address} can run it",
                         hint=f"start a worker that declares them (`dask worker {address} --resources "
                              f"\"{_resource_text(task.resources)}\"`), or change the stage's `resources:`")
    future: Future = Future()
    future.set_result(StageResult(error=WorkerError.from_exception(error)))
    return future


def make_executor(spec: str | None, jobs: int) -> Executor:
    """`None`/'local' → ProcessExecutor(jobs); 'dask://host:port' or 'tcp://…' → DaskExecutor
    (``?resource_wait=SECONDS``: how long a stage waits for a worker offering its resources)."""
    if not spec or spec == "local":
        return ProcessExecutor(jobs)
    if spec.startswith(("dask://", "tcp://")):
        parts = urlsplit(spec)
        query = parse_qs(parts.query)
        unknown = sorted(set(query) - {"resource_wait"})
        if unknown:
            raise InvalidInput(f"unknown executor option {', '.join(unknown)} in {spec!r}",
                               hint="dask://HOST:PORT?resource_wait=SECONDS")
        try:
            wait_s = float(query.get("resource_wait", ["30"])[-1])
        except ValueError:
            raise InvalidInput(f"resource_wait in {spec!r} is not a number of seconds") from None
        return DaskExecutor(f"tcp://{parts.netloc}", resource_wait_s=wait_s)
    raise InvalidInput(f"unknown executor {spec!r}", hint="use 'local' or 'dask://HOST:PORT'")
