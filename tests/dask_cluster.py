"""A real dask.distributed cluster whose workers are machines of their own: a LocalCluster's
scheduler on 127.0.0.1, and one `dask worker` process per `WorkerSpec`, each started with its own
environment (ZOO_CACHE_DIR, ZOO_HOME, HOME) and declared resources (LocalCluster gives every
worker the same environment, so the workers are started here). A worker with `hide` runs in a
mount namespace of its own where that folder is an empty tmpfs: a machine that does not see the
caller's disk (`unshare -m`, root only: `can_hide()` says whether it works here)."""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator


@dataclass
class WorkerSpec:
    name: str
    base: Path  # its "machine": cache/ and home/ below it
    resources: str = ""  # as `dask worker --resources`, e.g. "GPU=1"
    env: dict[str, str] = field(default_factory=dict)
    hide: Path | None = None  # a folder of the caller's this worker must not see
    pid: int = 0

    @property
    def cache(self) -> Path:
        return self.base / "cache"

    @property
    def home(self) -> Path:
        return self.base / "home"


def can_hide() -> bool:
    """Whether this machine lets a process mount a tmpfs in a mount namespace of its own."""
    try:
        return subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs tmpfs /mnt"],
                              capture_output=True).returncode == 0
    except OSError:
        return False


@contextmanager
def cluster(workers: list[WorkerSpec], timeout: float = 120) -> Iterator[str]:
    """Yield the scheduler's address once every worker has joined; stop them all afterwards."""
    import distributed

    local = distributed.LocalCluster(n_workers=0, processes=True, host="127.0.0.1", dashboard_address=None)
    procs: list[subprocess.Popen] = []
    try:
        for w in workers:
            w.base.mkdir(parents=True, exist_ok=True)
            env = {**os.environ, "ZOO_CACHE_DIR": str(w.cache), "ZOO_HOME": str(w.home), "HOME": str(w.base),
                   **w.env}
            args = [sys.executable, "-m", "distributed.cli.dask_worker", local.scheduler_address, "--name", w.name,
                    "--nthreads", "1", "--no-nanny", "--no-dashboard"]
            if w.resources:
                args += ["--resources", w.resources]
            if w.hide is not None:
                args = ["unshare", "-m", "sh", "-c", 'mount -t tmpfs tmpfs "$0" && exec "$@"', str(w.hide), *args]
            proc = subprocess.Popen(args, cwd=w.base, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            procs.append(proc)
            w.pid = proc.pid
        with distributed.Client(local.scheduler_address, set_as_default=False) as client:
            client.wait_for_workers(len(workers), timeout=timeout)
        yield local.scheduler_address
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        local.close()
