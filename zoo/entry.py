"""The `zoo` executable: the no-op fast path first, then the full CLI.

Kept tiny on purpose: nothing here imports the CLI framework unless it is needed.
"""

from __future__ import annotations

import os
import sys


def main() -> None:
    """Run `zoo`; a closed stdout (`zoo list | head -1`) ends it quietly with exit 1, no traceback."""
    from zoo.errors import ExitCode

    try:
        try:
            _dispatch(sys.argv[1:])
        finally:
            if sys.stdout is not None:
                sys.stdout.flush()  # here a closed pipe can still be caught; at interpreter exit it prints
            _skip_exit_collection()
    except BrokenPipeError:
        if not _stdout_reader_gone():
            raise  # some other pipe (a worker's, a socket): a real error
        # the exit-time flush of what is still buffered must not fail again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(ExitCode.FAILED)  # what click and rich exit with when they meet a closed pipe


def _skip_exit_collection() -> None:
    """Spare the interpreter's exit its last garbage collection, now that the command is over.

    That collection walks every object the run made (botocore's service models, pydantic's
    schemas, the parsed recipe...): about 0.1 s of a 1.8 s run that takes its stages from a remote
    cache. Frozen objects are not walked; the process frees them when it ends. Nothing zoo writes
    waits on a collection: files are closed by `with` blocks, SQLite commits are durable before a
    connection closes, and temporary folders, thread and process pools are cleaned up by their
    `atexit` hooks, which still run."""
    import gc

    gc.freeze()


def _dispatch(args: list[str]) -> None:
    from zoo.engine.fastpath import try_noop

    code = try_noop(args)
    if code is not None:
        sys.exit(code)
    from zoo.cli.main import main as cli_main

    cli_main()


def _stdout_reader_gone() -> bool:
    """True when stdout is a pipe whose reading end is closed (poll reports an error on it)."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll (Windows), stdout replaced or closed
        return True
