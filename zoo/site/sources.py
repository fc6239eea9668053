"""Where a site's data comes from: the local zoo, or a remote zoo read through `RemoteZoo`.

Both answer the same four questions: which versions exist (with their tags), the manifest of a
version, the bytes of one of its small files, checked against the manifest's sha256 before
they are returned (a remote's files are fetched into a private temporary blob store), and the
bytes of one of its attachments (`zoo.registry.attachments`: the bill of materials), which no
manifest pins: shown, never trusted.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from zoo.registry.index import VersionInfo
    from zoo.registry.manifest import FileRef, Manifest
    from zoo.registry.store import LocalZoo


class ZooSource:
    """The local zoo (``remote`` is None) or the remote of that name, as seen from `zoo`."""

    def __init__(self, zoo: "LocalZoo", remote: str | None = None):
        self.zoo = zoo
        self.remote = remote
        self._remote_zoo = None
        self._scratch: tempfile.TemporaryDirectory | None = None
        if remote:
            from zoo.registry.config import RemotesConfig
            from zoo.registry.remote_factory import open_remote

            self._remote_zoo = open_remote(RemotesConfig(zoo.root).get(remote))

    @property
    def label(self) -> str:
        return f"remote {self.remote}" if self.remote else "local"

    def versions(self) -> list["VersionInfo"]:
        """Every version of every model, newest first per model, with its tags."""
        return self._remote_zoo.list() if self._remote_zoo else self.zoo.list()

    def manifest(self, name: str, version: str) -> "Manifest":
        from zoo.registry.refs import parse_pinned

        ref = parse_pinned(f"{name}@{version}")
        return self._remote_zoo.resolve(ref) if self._remote_zoo else self.zoo.resolve(ref)

    def read(self, manifest: "Manifest", ref: "FileRef") -> bytes | None:
        """The verified bytes of `ref`, a file of `manifest`; None when the zoo does not hold them
        (a local version whose blob is gone, a remote that lacks the file)."""
        if self._remote_zoo is None:
            if not self.zoo.blobs.has(ref.sha256, ref.size):
                return None
            return self.zoo.blobs.path(ref.sha256).read_bytes()
        from zoo.errors import NotFound
        from zoo.registry.blobs import BlobStore

        if self._scratch is None:
            self._scratch = tempfile.TemporaryDirectory(prefix="zoo-site-", dir=self.zoo.tmp_dir())
        blobs = BlobStore(Path(self._scratch.name))
        try:
            self._remote_zoo.fetch(manifest, ref, blobs)
        except NotFound:
            return None
        return blobs.path(ref.sha256).read_bytes()

    def attachment(self, manifest: "Manifest", name: str) -> bytes | None:
        """The bytes of attachment `name` of `manifest`'s version (None when it carries none, or a remote
        offers one that `zoo.registry.attachments.check` refuses: the site is built without it)."""
        from zoo.errors import AccessDenied, SourceUnreachable, StorageError

        if self._remote_zoo is None:
            return self.zoo.attachments(manifest.name, manifest.version).get(name)
        try:
            return self._remote_zoo.read_attachments(manifest.name, manifest.version).get(name)
        except StorageError as e:
            if isinstance(e, (SourceUnreachable, AccessDenied)):  # the remote's trouble, not the attachment's
                raise
            return None

    def close(self) -> None:
        if self._scratch is not None:
            self._scratch.cleanup()
            self._scratch = None

    def __enter__(self) -> "ZooSource":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
