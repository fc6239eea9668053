"""Executors: where stages run. The runner only submits `StageTask`s and waits on futures.

- `ProcessExecutor` (default): a pool of spawned local processes, so heavy kinds that hold the
  GIL run in parallel with ``-j N``;
- `DaskExecutor`: a dask.distributed cluster (``--executor dask://HOST:PORT``); the cache dir must
  be on a filesystem shared with the workers.
"""

from __future__ import annotations

import os
import sys
import threading
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Iterator, Mapping, Protocol

from zoo.errors import InvalidInput
from zoo.engine.worker import StageTask, execute


class Executor(Protocol):
    """Submit a stage with its inputs and resource needs; get a future of its `StageResult`."""

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


class DaskExecutor:
    """Runs stages on a dask.distributed scheduler through its concurrent.futures interface."""

    def __init__(self, address: str):
        try:
            from distributed import Client
        except ImportError:
            raise InvalidInput("the dask executor needs dask.distributed",
                               hint="pip install 'zoo-onnx[dask]'") from None
        self._client = Client(address, set_as_default=False)
        self._executor = self._client.get_executor(pure=False)

    def submit(self, task: StageTask) -> Future:
        return self._executor.submit(execute, task)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=True)
        self._client.close()


def make_executor(spec: str | None, jobs: int) -> Executor:
    """`None`/'local' → ProcessExecutor(jobs); 'dask://host:port' or 'tcp://…' → DaskExecutor."""
    if not spec or spec == "local":
        return ProcessExecutor(jobs)
    if spec.startswith(("dask://", "tcp://")):
        return DaskExecutor(spec.replace("dask://", "tcp://", 1))
    raise InvalidInput(f"unknown executor {spec!r}", hint="use 'local' or 'dask://HOST:PORT'")
