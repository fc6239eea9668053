"""`zoo site publish DIR --to REMOTE`: upload a built site next to a remote zoo, under its ``site/``
prefix, through the remote's byte-level backend (`zoo.storage.fsbackend.open_backend`, the one
`zoo push` writes through): each file appears whole or not at all (the backend's `put_file`).

Pages go up first, then ``site.json``, then ``index.html``, so a reader who reaches the new
index finds every page it links to; files of an earlier site that the new one lacks are removed
last. A Hugging Face remote holds model repositories, not files at a path: it is refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from zoo.site.data import SITE_FILE, SITE_SCHEMA_VERSION

if TYPE_CHECKING:
    from zoo.registry.store import LocalZoo

PREFIX = "site"
LAST = (SITE_FILE, "index.html")


def site_files(folder: Path) -> list[str]:
    """The site's files (POSIX paths relative to `folder`) in upload order; InvalidInput when
    `folder` holds no site zoo can read, or a symbolic link (the site must be what it shows)."""
    from zoo.errors import InvalidInput

    folder = Path(folder)
    try:
        doc = json.loads((folder / SITE_FILE).read_text())
    except (OSError, ValueError) as e:
        raise InvalidInput(f"{folder} holds no site ({SITE_FILE} missing or unreadable)",
                           hint=f"build one first: zoo site build -o {folder}") from e
    if doc.get("schema_version") != SITE_SCHEMA_VERSION:
        raise InvalidInput(f"{folder}/{SITE_FILE} has schema_version {doc.get('schema_version')!r}; this zoo writes "
                           f"{SITE_SCHEMA_VERSION}", hint=f"rebuild it: zoo site build -o {folder}")
    found = []
    for path in sorted(folder.rglob("*")):
        if path.is_symlink():
            raise InvalidInput(f"{path} is a symbolic link", hint="a site folder holds plain files; rebuild it")
        if path.is_file():
            found.append(path.relative_to(folder).as_posix())
    return sorted(found, key=lambda rel: (LAST.index(rel) + 1 if rel in LAST else 0, rel))


def publish_site(folder: Path, to: str, *, zoo: "LocalZoo | None" = None) -> dict:
    """Upload the site in `folder` to remote `to` (a `zoo remote` name) under ``site/``.

    Returns {"remote", "url", "uploaded", "bytes", "removed"}; InvalidInput for a Hub or read-only remote."""
    from zoo.errors import InvalidInput
    from zoo.registry.config import RemotesConfig
    from zoo.storage.fsbackend import open_backend
    from zoo.registry.store import LocalZoo

    folder = Path(folder)
    files = site_files(folder)
    config = RemotesConfig((zoo or LocalZoo()).root).get(to)
    if config.scheme == "hf":
        raise InvalidInput(f"remote {to} is a Hugging Face Hub namespace: it holds model repositories, not a site",
                           hint="publish the site to a folder, S3, GCS, Azure, WebDAV or SSH remote")
    if config.scheme == "oci":
        raise InvalidInput(f"remote {to} is an OCI registry: it holds model repositories, not a site",
                           hint="publish the site to a folder, S3, GCS, Azure, WebDAV or SSH remote")
    backend = open_backend(config.url, config.options)
    total = 0
    for rel in files:
        local = folder / rel
        backend.put_file(local, backend.path(PREFIX, *rel.split("/")))
        total += local.stat().st_size
    removed = _remove_stale(backend, set(files))
    return {"remote": to, "url": f"{config.url.rstrip('/')}/{PREFIX}/index.html", "uploaded": len(files),
            "bytes": total, "removed": removed}


def _remove_stale(backend, keep: set[str]) -> int:
    """Delete what an earlier publication left under the prefix that this site does not hold."""
    base = backend.path(PREFIX).strip("/")
    removed = 0
    for path, _size, _mtime in backend.walk(backend.path(PREFIX)):
        full = str(path).strip("/")
        if not full.startswith(base + "/"):
            continue
        rel = full[len(base) + 1:]
        if rel not in keep and "/." not in f"/{rel}":  # another writer's temporary file is not ours to delete
            backend.delete(backend.path(PREFIX, *rel.split("/")))
            removed += 1
    return removed
