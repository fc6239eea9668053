"""Following a running stage's log: the lines it has written since the last look.

The worker writes a stage's log (its logger, and fd 1 and 2: a custom `entry`'s prints, C
libraries) to its workspace while it runs; the runner reads the new complete lines from it
between waits (`Runner._follow`), so progress can show epochs and `zoo run -v` can stream them.
No thread: the runner's loop polls. A line still being written (no newline yet) waits for the
next look; the last one is taken when the stage ends (`read(final=True)`).
"""

from __future__ import annotations

from pathlib import Path

MAX_READ = 1 << 20  # bytes read per look: a stage that floods its log is shown in part, never blocks the run


class LogFollower:
    """New complete lines of one growing text file, from where the last `read` stopped."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.offset = 0
        self._partial = b""

    def read(self, *, final: bool = False) -> list[str]:
        """The lines added since the last call ([] when none, or the file is not there yet); with
        `final`, also an unterminated last line (the stage has ended: nothing more will come)."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read(MAX_READ)
        except OSError:  # not created yet, or already moved into the cache's logs/
            data = b""
        self.offset += len(data)
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()
        if final and self._partial:
            lines.append(self._partial)
            self._partial = b""
        return [line.decode("utf-8", errors="replace").rstrip("\r") for line in lines]
