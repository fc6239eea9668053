"""Executors: where stages run. The runner only submits `StageTask`s and waits on futures.

- `ProcessExecutor` (default): a pool of spawned local processes, so heavy kinds that hold the
  GIL run in parallel with ``-j N``;
- `DaskExecutor`: a dask.distributed cluster (``--executor dask://HOST:PORT``); the cache dir must
  be on a filesystem shared with the workers.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Protocol

from zoo.errors import InvalidInput
from zoo.worker import StageTask, execute


class Executor(Protocol):
    """Submit a stage with its inputs and resource needs; get a future of its result dict."""

    def submit(self, task: StageTask) -> Future: ...

    def shutdown(self) -> None: ...


class ProcessExecutor:
    """Local process pool (spawn: safe beside threads, and each stage sees a clean interpreter)."""

    def __init__(self, jobs: int = 1):
        self.jobs = max(1, jobs)
        self._pool = None

    def submit(self, task: StageTask) -> Future:
        if self._pool is None:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            self._pool = ProcessPoolExecutor(max_workers=self.jobs, mp_context=multiprocessing.get_context("spawn"))
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
