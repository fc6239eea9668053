"""A backend whose uploads report every byte: what `zoo push` draws its progress bar from."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable


class MeteredBackend:
    """A remote's byte-level backend (`zoo.storage.fsbackend.FsBackend`) whose `put_file` reports bytes
    as the driver sends them, and whatever the driver did not report once the file is up (so the
    total is the file's size even where a driver reports nothing); everything else is the
    backend's own."""

    def __init__(self, backend: Any, progress: Callable[[int], None]):
        self._backend = backend
        self._progress = progress

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def put_file(self, local: Path, rpath: str) -> None:
        sent = 0

        def report(n: int) -> None:
            nonlocal sent
            sent += n
            self._progress(n)

        self._backend.put_file(local, rpath, progress=report)
        rest = Path(local).stat().st_size - sent
        if rest > 0:
            self._progress(rest)
