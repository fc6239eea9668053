"""Run leases: what a live `zoo run` holds in the cache, so `zoo gc` leaves it alone.

Every run takes a lease for its lifetime::

    runs/<id>.lock    an exclusive OS lock (flock) the run holds until it ends or dies
    runs/<id>.json    what it holds: cache keys (their entries, objects and out/ folders) and
                      the digests of objects it stores before their entry is written
    tmp/<id>/         its workspaces (stage out/work dirs, materialisation staging)

A lease is live while its lock is held: the kernel releases it when the process dies, however
it dies, so a killed run's lease reads as dead at the next gc and its leftovers are freed.

Ordering: gc holds the cache's gc mutex (locks/gc.lock) while it reads the leases and deletes;
a run takes the same mutex only for the instant it opens its lease or registers a holding. So a
holding is registered either before gc looks (gc skips it) or after gc has finished deleting
(nothing of it was touched), and a run registers before it uses what it registers. gc never
waits on a run's lease, only on the brief mutex.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:
    from zoo.engine.cache import Cache

LEASE_SCHEMA_VERSION = 1


def gc_mutex(cache: "Cache"):
    """The lock gc holds while it works, and runs hold while they register (blocking, brief)."""
    from filelock import FileLock

    cache.locks.mkdir(parents=True, exist_ok=True)
    return FileLock(str(cache.locks / "gc.lock"))


class RunLease:
    """One live run's claim on parts of the cache (see the module docstring)."""

    def __init__(self, cache: "Cache"):
        self.cache = cache
        self.id = f"run-{os.getpid()}-{secrets.token_hex(4)}"
        self.keys: set[str] = set()
        self.digests: set[str] = set()
        self._lock = None

    @property
    def tmp(self) -> Path:
        """This run's workspace folder under tmp/ (removed when the run ends)."""
        return self.cache.tmp / self.id

    @property
    def _json(self) -> Path:
        return self.cache.runs / f"{self.id}.json"

    def open(self) -> "RunLease":
        from filelock import FileLock

        self.cache.runs.mkdir(parents=True, exist_ok=True)
        with gc_mutex(self.cache):
            self._lock = FileLock(str(self.cache.runs / f"{self.id}.lock"))
            self._lock.acquire(timeout=0)
            self._write()
            self.tmp.mkdir(parents=True, exist_ok=True)
        return self

    def hold(self, *, keys: Iterable[str] = (), digests: Iterable[str] = ()) -> None:
        """Register keys/digests before using them; gc skips them until this run ends."""
        new_keys, new_digests = set(keys) - self.keys, set(digests) - self.digests
        if not new_keys and not new_digests:
            return
        with gc_mutex(self.cache):
            self.keys |= new_keys
            self.digests |= new_digests
            self._write()

    def close(self) -> None:
        """Drop the lease and this run's workspaces."""
        if self._lock is None:
            return
        shutil.rmtree(self.tmp, ignore_errors=True)
        self._json.unlink(missing_ok=True)
        lock_file = Path(self._lock.lock_file)
        self._lock.release()
        lock_file.unlink(missing_ok=True)
        self._lock = None

    def _write(self) -> None:
        from zoo.files import atomic_write

        data = {"schema_version": LEASE_SCHEMA_VERSION, "id": self.id, "pid": os.getpid(), "started": time.time(),
                "keys": sorted(self.keys), "digests": sorted(self.digests)}
        atomic_write(self._json, json.dumps(data).encode(), fsync=False)  # only live processes read it

    def __enter__(self) -> "RunLease":
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass
class Held:
    """What the live runs hold, as gc sees it."""

    ids: set[str] = field(default_factory=set)
    pids: set[int] = field(default_factory=set)
    keys: set[str] = field(default_factory=set)
    digests: set[str] = field(default_factory=set)


def live_holdings(cache: "Cache", *, clean: bool = True) -> Held:
    """Read every live lease; with `clean`, delete the leases of runs that died. Call under gc_mutex."""
    from filelock import FileLock, Timeout

    held = Held()
    if not cache.runs.exists():
        return held
    for lock_file in sorted(cache.runs.glob("*.lock")):
        lease_id = lock_file.stem
        lock = FileLock(str(lock_file))
        try:
            lock.acquire(timeout=0)
        except Timeout:  # held: the run is alive
            held.ids.add(lease_id)
            try:
                data = json.loads((cache.runs / f"{lease_id}.json").read_bytes())
            except (OSError, ValueError):
                continue  # opened under the mutex, so it is written; unreadable means damaged: skip its files
            held.pids.add(int(data.get("pid", 0)))
            held.keys.update(data.get("keys", []))
            held.digests.update(data.get("digests", []))
            continue
        lock.release()
        if clean:
            (cache.runs / f"{lease_id}.json").unlink(missing_ok=True)
            lock_file.unlink(missing_ok=True)
    if clean:  # a lease json whose lock file is gone belongs to nobody
        for orphan in cache.runs.glob("*.json"):
            if orphan.stem not in held.ids and not (cache.runs / f"{orphan.stem}.lock").exists():
                orphan.unlink(missing_ok=True)
    return held
