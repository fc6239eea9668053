"""`zoo site serve`: a site folder over HTTP on 127.0.0.1 (the standard library's threaded server),
until Ctrl-C (or SIGTERM) stops it cleanly."""

from __future__ import annotations

import functools
import signal
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable


class _Handler(SimpleHTTPRequestHandler):
    """Files of the site folder, told apart by their extension only (no sniffing), never cached stale."""

    extensions_map = {**SimpleHTTPRequestHandler.extensions_map, ".js": "text/javascript", ".json": "application/json",
                      ".md": "text/markdown; charset=utf-8", ".lock": "text/plain; charset=utf-8",
                      ".pb": "application/octet-stream"}

    def end_headers(self) -> None:
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Cache-Control", "no-cache")
        super().end_headers()

    def log_message(self, format: str, *args) -> None:  # noqa: A002 (the base class's name)
        pass  # a request log per file would bury the one line that matters: where the site is


def open_server(folder: Path, port: int = 8000, host: str = "127.0.0.1") -> ThreadingHTTPServer:
    """A threaded HTTP server for `folder` (bound, not yet serving); port 0 picks a free one.

    NotFound when `folder` holds no site; InvalidInput when the port cannot be had."""
    from zoo.errors import InvalidInput, NotFound

    folder = Path(folder)
    if not (folder / "index.html").is_file():
        raise NotFound(f"{folder} holds no site (no index.html)", hint=f"build one: zoo site build -o {folder}")
    handler = functools.partial(_Handler, directory=str(folder.resolve()))
    try:
        return ThreadingHTTPServer((host, port), handler)
    except OSError as e:
        raise InvalidInput(f"cannot listen on {host}:{port}: {e.strerror or e}",
                           hint="choose another --port (0 picks a free one)") from e


def serve(folder: Path, port: int = 8000, *, host: str = "127.0.0.1",
          ready: Callable[[str], None] | None = None) -> None:
    """Serve `folder` on http://host:port/ until interrupted; `ready(url)` is called once it listens."""
    server = open_server(folder, port, host)
    url = f"http://{host}:{server.server_address[1]}/"
    previous = {}
    if threading.current_thread() is threading.main_thread():
        # Ctrl-C stops it even where the launcher left SIGINT ignored (a background job), and
        # SIGTERM (a service manager, a test) as cleanly as Ctrl-C
        previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        if ready:
            ready(url)
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt
