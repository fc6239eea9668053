"""Where zoo keeps things: the run cache and the local zoo. One place, so tests can redirect all.

- run cache: ``--cache-dir`` flag, else ``$ZOO_CACHE_DIR``, else ``./cache``;
- local zoo: ``$ZOO_HOME``, else the user's data directory (``~/.local/share/zoo`` on Linux).
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir(explicit: str | Path | None = None) -> Path:
    """The run cache directory (not created here)."""
    if explicit:
        return Path(explicit).expanduser().resolve()
    env = os.environ.get("ZOO_CACHE_DIR")
    if env:
        return Path(env).expanduser().resolve()
    return (Path.cwd() / "cache").resolve()


def zoo_home() -> Path:
    """Root of the local zoo (blobs, manifests, tags, remotes config)."""
    env = os.environ.get("ZOO_HOME")
    if env:
        return Path(env).expanduser().resolve()
    from platformdirs import user_data_dir

    return Path(user_data_dir("zoo", appauthor=False)).resolve()
