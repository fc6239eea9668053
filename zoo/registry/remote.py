"""The remote zoo interface (`RemoteZoo`) every backend implements.

Backends: `zoo.registry.fsremote.FsRemoteZoo` (a folder, S3, WebDAV or read-only HTTP(S)
location in the zoo's folder layout, reached through fsspec), `zoo.registry.hf.HfRemoteZoo`
(a Hugging Face Hub namespace) and `zoo.registry.oci.OciRemoteZoo` (an OCI registry); they import
this module and never each other, and
`zoo.registry.remote_factory.open_remote` picks one for a configured remote.

Every backend keeps the same promises, checked by ``tests/test_registry_remote_contract.py``
against a real server for each:

- a version becomes visible in one atomic, create-exclusive step taken after all its files are
  stored, so a reader never sees a version whose files are missing, and of two publishers of
  the same version exactly one wins (where `exclusive_create` is False — an OCI registry, whose
  API has no such write — the step is check, write, read back: at least one wins, and the remote
  serves one publisher's whole version);
- published versions are immutable: the same version with other content is a `Conflict`;
- nothing is placed in the local blob store before its sha256 and size match the manifest;
- a backend that cannot do something (write to plain HTTP, free blobs on the Hub) raises
  `InvalidInput` saying so; expected failures are `zoo.errors` classes (`NotFound`,
  `SourceUnreachable`, `AccessDenied`, `IntegrityError`, `StorageError`).
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from zoo.download import Source
    from zoo.errors import StorageError
    from zoo.registry.blobs import BlobStore
    from zoo.registry.config import RemoteConfig
    from zoo.registry.index import VersionInfo
    from zoo.registry.manifest import FileRef, Manifest
    from zoo.registry.refs import Ref
    from zoo.registry.store import LocalZoo


OFFLINE_NOTE = "; --offline uses only the local zoo"  # credentials hints end with it: a pull's way out, not a push's


def push_cut_off(e: "StorageError", ref: str, remote: str, visible: bool | None) -> "StorageError":
    """The error for a push that failed part-way (an outage, a refusal, a full disk on the remote):
    the same class (exit code), saying whether `ref` is already visible on `remote` (its manifest
    was written; None: cut off during that very step, so the remote may have made it or not) and
    that repeating the push finishes it (every step of a push is idempotent)."""
    if visible:
        state = (f"{ref} is already visible on remote {remote} (its manifest is there); its `latest`, tags and "
                 "index may not be updated yet")
    elif visible is None:
        state = (f"{ref} may or may not be visible on remote {remote}: the push was cut off while the remote "
                 f"was writing its manifest (`zoo show {ref} --remote {remote}` tells)")
    else:
        state = f"{ref} is not visible on remote {remote} yet (its manifest was not written; files already sent are kept)"
    before = (e.hint or "").removesuffix(OFFLINE_NOTE) if type(e).__name__ == "AccessDenied" else ""
    hint = (f"{before}; " if before else "") + (
        f"{state}. Run `zoo push {ref} --to {remote}` again once the remote can be reached: it sends only what is "
        "missing and finishes the push")
    return type(e)(f"push of {ref} to remote {remote} was cut off: {e.message}", hint=hint)


class RemoteZoo(abc.ABC):
    """What a remote zoo can do. `name` is the configured remote name; `read_only` is True where
    every write raises `InvalidInput`."""

    name: str
    read_only: bool = False
    exclusive_create: bool = True  # the version appears by a create-exclusive write (module docstring)
    # the configuration it was opened from: its `trust` anchors count for the versions it serves
    # (zoo.registry.trust; a pull reads it through getattr, so a backend without one trusts only the user's)
    config: "RemoteConfig | None" = None

    # ---- reads --------------------------------------------------------------------------
    @abc.abstractmethod
    def resolve(self, ref: "Ref") -> "Manifest":
        """The manifest `ref` (``name@version`` or ``name@tag``) names on this remote.

        NotFound (its hint names what the model has, or close model names) when it is not
        there; SourceUnreachable when no location (primary or mirror) answers; AccessDenied
        when one refused and none answered. The manifest's name and version are checked
        against what was asked (a mismatch is a StorageError: the remote is corrupt).
        """

    @abc.abstractmethod
    def list(self, name: str | None = None) -> list["VersionInfo"]:
        """Every version of model `name` (or of every model), newest first per model, with its tags."""

    @abc.abstractmethod
    def tags(self, name: str) -> dict[str, str]:
        """Tag -> version for model `name` ({} when it has none)."""

    @abc.abstractmethod
    def fetch(self, manifest: "Manifest", ref: "FileRef", blobs: "BlobStore") -> None:
        """Make the blob of `ref` (a file of `manifest`) present and verified in `blobs`.

        Bytes are hashed while they arrive and placed (an atomic rename) only when sha256 and
        size match, so a failed or tampered download installs nothing; an interrupted one may
        leave a temporary file that the next download of the same blob resumes from. Sources
        (the primary, then mirrors) are tried in order: IntegrityError when a source served
        wrong bytes and none served the right ones, NotFound when none has the file.
        """

    @abc.abstractmethod
    def read_attachments(self, name: str, version: str) -> dict[str, bytes]:
        """The attachments (`zoo.registry.attachments`: signature, bill of materials) of
        `name@version` on this remote, each checked by `attachments.check` (a known name, at most
        `MAX_BYTES`: StorageError otherwise); {} when it carries none. Read from the first
        location that has the version, like `resolve`."""

    # ---- writes -------------------------------------------------------------------------
    @abc.abstractmethod
    def push(self, zoo: "LocalZoo", manifest: "Manifest", tags: list[str] | None = None) -> dict:
        """Publish a version of the local `zoo`: its files first, then the version itself in one
        create-exclusive step, then `latest` (when this version is the newest release) and `tags`.

        The version's attachments in the local zoo (`LocalZoo.attachments`) go up after its
        files and before the version becomes visible, so a signed version never shows unsigned;
        to a version already there with the same content, the attachments it lacks are added
        (one it holds with other bytes is a Conflict; a backend that cannot add them to a
        published version says so with InvalidInput).

        Idempotent and resumable: a retry after a push cut off at any point finishes it, and
        uploads only what is missing. Returns ``{"remote", "ref", "uploaded", "skipped",
        "bytes", "created", "attachments"}``; ``created`` is False when the same content was
        already there; ``attachments`` names those this push stored.
        Conflict when the version exists with other content (also when a concurrent publisher
        won the create-exclusive step with other bytes); NotFound when the local zoo lacks a
        file of the version; InvalidInput on a read-only remote.
        """

    @abc.abstractmethod
    def set_tag(self, name: str, tag: str, version: str) -> None:
        """Point `tag` of model `name` at `version` (a reader sees the old or the new target,
        never neither); NotFound when the version is not on the remote."""

    @abc.abstractmethod
    def remove(self, name: str, version: str, *, grace_s: float | None = None) -> dict:
        """Delete a version and the tags on it; then, where the backend holds loose blobs, free
        those no remaining manifest references and that are older than the grace period.

        Returns at least ``{"remote", "blobs_freed", "bytes_freed", "kept_young"}``; NotFound
        when the version is not there.
        """

    @abc.abstractmethod
    def gc(self, *, grace_s: float | None = None, dry_run: bool = False) -> dict:
        """Free the blobs that no manifest on the remote references and that are older than the
        grace period (a push uploads its blobs before its manifest, so a younger unreferenced
        blob may belong to a push in progress). Never deletes a manifest or a tag, nor a blob a
        manifest references (read from the manifests themselves, not from derived indexes);
        `dry_run` only reports. Returns ``{"remote", "blobs_freed", "bytes_freed",
        "kept_young", "grace_s", "dry_run"}``. Backends without loose blobs raise InvalidInput.
        """


def no_gc(remote: RemoteZoo):
    """The error a backend without loose blobs raises from `gc`."""
    from zoo.errors import InvalidInput

    return InvalidInput(f"remote {remote.name} does not support gc", hint="only folder, S3 and WebDAV remotes hold loose blobs")


def fetch_blob(blobs: "BlobStore", ref: "FileRef", sources: Sequence["Source"], what: str) -> None:
    """Download the blob of `ref` into `blobs` from the first of `sources` that delivers the right
    bytes (see `zoo.download.download`); nothing happens when it is already there."""
    from zoo.download import download

    if blobs.has(ref.sha256, ref.size):
        return
    download(sources, blobs.path(ref.sha256), sha256=ref.sha256, size=ref.size, what=what,
             tmp_dir=blobs.partial_dir)
    blobs.mark_verified(ref.sha256)  # hashed while downloaded: no second hash on first use
