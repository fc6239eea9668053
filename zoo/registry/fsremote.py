"""`FsRemoteZoo`: a remote zoo in a folder reached through fsspec (local folder, S3 prefix,
WebDAV folder, read-only HTTP(S)), with optional mirrors in the same layout.

Layout::

    <root>/zoo-remote.json                        {"schema_version": 1}
    <root>/blobs/sha256/<aa>/<sha256>             every file, addressed by content
    <root>/models/<name>/versions/<version>.json  the manifest: written last, create-exclusive
    <root>/models/<name>/tags/<tag>.json          {"version": "1.2.0"}
    <root>/models/<name>/attachments/<version>/<file>
                                                  signature, bill of materials (zoo.registry.attachments):
                                                  written create-exclusive before the manifest
    <root>/models/<name>/index.json               versions + tags (derived; lets HTTP list)
    <root>/index.json                             model names (derived; lets HTTP list)

The index files are rebuilt from listings after every change, so concurrent publishers of
different versions converge; plain HTTP remotes read them instead of listing. Byte-level access
(and each scheme's atomic write and create-exclusive primitives) is `zoo.storage.fsbackend`.

Freeing space (`remove`, `gc`): a blob is deleted only when no manifest under ``models/``
references it (read from the manifests, never the derived index) and it is older than the
grace period (option ``gc_grace``, seconds; default one hour): a concurrent push uploads its
blobs before its manifest, and re-checks them after writing the manifest, in case a gc freed
one it had found present.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from zoo.errors import AccessDenied, Conflict, NotFound, SourceUnreachable, StorageError, ZooError
from zoo.registry.codec import dump_manifest, load_manifest, same_content, utc_now
from zoo.registry.index import VersionInfo
from zoo.registry.manifest import FileRef, Manifest
from zoo.registry.refs import LATEST, Ref, check_name, check_tag, check_version, is_prerelease, moves_latest, newest, version_key
from zoo.registry.remote import RemoteZoo, fetch_blob

if TYPE_CHECKING:
    from zoo.registry.blobs import BlobStore
    from zoo.registry.config import RemoteConfig
    from zoo.storage.fsbackend import FsBackend
    from zoo.registry.store import LocalZoo

REMOTE_SCHEMA_VERSION = 1


# A push uploads its blobs before its manifest, so for a while they are referenced by nothing:
# gc never deletes a blob younger than this (git's gc.pruneExpire plays the same role).
DEFAULT_GC_GRACE_S = 3600


def gc_grace(config: "RemoteConfig", override: float | None = None) -> float:
    """The grace period for a remote: `override`, else its `gc_grace` option (seconds), else 1 hour."""
    if override is not None:
        return float(override)
    value = config.options.get("gc_grace")
    return DEFAULT_GC_GRACE_S if value is None else float(value)


def _summary(m: Manifest) -> dict:
    return {"created": m.created, "task": m.task, "description": m.description, "license": m.license,
            "builds": sorted(m.builds)}


class FsRemoteZoo(RemoteZoo):
    """A remote zoo in a folder reachable through fsspec, with optional mirrors (same layout)."""

    def __init__(self, config: "RemoteConfig"):
        from zoo.storage.urls import scheme_of
        from zoo.storage.fsbackend import open_backend

        self.name = config.name
        self.config = config
        self.primary = open_backend(config.url, config.options)
        self.mirrors = [open_backend(u, config.options if scheme_of(u) == config.scheme else {}) for u in config.mirrors]
        self.read_only = self.primary.read_only
        self._dead: set[str] = set()  # URLs found unreachable during this object's life

    @property
    def backends(self) -> list["FsBackend"]:
        """Primary then mirrors, skipping those already found unreachable (unless all are)."""
        every = [self.primary, *self.mirrors]
        return [b for b in every if b.url not in self._dead] or every

    # ---- reads (primary, then mirrors) ---------------------------------------------------
    def _read_json(self, *parts: str) -> dict | None:
        """First backend that answers; None if reachable ones lack the file; AccessDenied if one
        refused and none answered, else SourceUnreachable if none answer."""
        unreachable: SourceUnreachable | AccessDenied | None = None
        for b in self.backends:
            try:
                data = b.read(b.path(*parts))
            except (SourceUnreachable, AccessDenied) as e:  # a mirror may still answer
                self._dead.add(b.url)
                unreachable = e if unreachable is None or isinstance(e, AccessDenied) else unreachable
                continue
            if data is not None:
                try:
                    return json.loads(data)
                except (ValueError, RecursionError) as e:  # a stranger's file: deep nesting, 5000-digit integers
                    from zoo.registry.codec import json_problem

                    raise StorageError(f"remote {self.name}: {'/'.join(parts)} is not valid JSON "
                                       f"({json_problem(e)})") from None
        if unreachable is not None:
            raise unreachable
        return None

    def _read_manifest(self, name: str, version: str) -> Manifest | None:
        raw = self._read_json("models", name, "versions", f"{version}.json")
        if raw is None:
            return None
        m = load_manifest(json.dumps(raw), f"remote {self.name}: {name}@{version}")
        if (m.name, m.version) != (name, version):
            raise StorageError(f"remote {self.name}: the manifest stored as {name}@{version} describes {m.ref}",
                               hint="the remote is corrupt; ask its maintainer to republish")
        return m

    def resolve(self, ref: Ref) -> Manifest:
        version = ref.version
        if version is None:
            raw = self._read_json("models", ref.name, "tags", f"{ref.tag}.json")
            if raw is None:
                raise self._not_found(ref)
            version = check_version(str(raw.get("version", "")))
        m = self._read_manifest(ref.name, version)
        if m is None:
            raise self._not_found(ref)
        return m

    def _not_found(self, ref: Ref) -> NotFound:
        idx = self._model_index(ref.name)
        if idx and idx.get("versions"):
            have = sorted(idx["versions"], key=version_key, reverse=True)[:5] + sorted(idx.get("tags", {}))
            return NotFound(f"{ref} is not on remote {self.name}", hint=f"{ref.name} has: {', '.join(have)}")
        import difflib

        close = difflib.get_close_matches(ref.name, self._model_names(), n=3)
        return NotFound(f"no model called {ref.name!r} on remote {self.name}",
                        hint=f"did you mean {', '.join(close)}?" if close else f"run `zoo list --remote {self.name}`")

    def _model_index(self, name: str) -> dict | None:
        return self._read_json("models", name, "index.json")

    def _model_names(self) -> list[str]:
        raw = self._read_json("index.json")
        return sorted((raw or {}).get("models", []))

    def list(self, name: str | None = None) -> list[VersionInfo]:
        out = []
        for model in [check_name(name)] if name else self._model_names():
            idx = self._model_index(model) or {}
            tags_by_version: dict[str, list[str]] = {}
            for tag, v in idx.get("tags", {}).items():
                tags_by_version.setdefault(v, []).append(tag)
            for v in sorted(idx.get("versions", {}), key=version_key, reverse=True):
                s = idx["versions"][v]
                out.append(VersionInfo(model, v, s.get("created"), s.get("task", ""), s.get("description", ""),
                                       s.get("license", ""), s.get("builds", []), sorted(tags_by_version.get(v, []))))
        return out

    def tags(self, name: str) -> dict[str, str]:
        return dict((self._model_index(name) or {}).get("tags", {}))

    def fetch(self, manifest: Manifest, ref: FileRef, blobs: "BlobStore") -> None:
        from zoo.download import Source

        def source(b: "FsBackend") -> Source:
            rpath = b.path("blobs", "sha256", ref.sha256[:2], ref.sha256)

            def open_from(offset: int):
                try:
                    yield from b.iter_from(rpath, offset, ref.size)
                except SourceUnreachable:
                    self._dead.add(b.url)
                    raise
            return Source(b.url, open_from)

        fetch_blob(blobs, ref, [source(b) for b in self.backends], f"{manifest.ref}: {ref.path}")

    def read_attachments(self, name: str, version: str) -> dict[str, bytes]:
        from zoo.registry.attachments import MAX_BYTES, NAMES, check

        check_name(name), check_version(version)
        for b in self.backends:
            try:
                if b.read(b.path("models", name, "versions", f"{version}.json"), limit=MAX_BYTES) is None:
                    continue  # a mirror that lacks the version lacks its attachments too
                out = {}
                for n in NAMES:
                    data = b.read(b.path("models", name, "attachments", version, n), limit=MAX_BYTES)
                    if data is not None:
                        check(n, data, f"remote {self.name}: {name}@{version}")
                        out[n] = data
                return out
            except (SourceUnreachable, AccessDenied):
                self._dead.add(b.url)
        return {}

    # ---- writes (primary only) ---------------------------------------------------------
    def push(self, zoo: "LocalZoo", manifest: Manifest, tags: list[str] | None = None) -> dict:
        """Publish: blobs, then the manifest (create-exclusive), then `latest`, tags and indexes.

        Every step is idempotent, so a retry finishes what a push cut off at any point started:
        a manifest already there with the same content still gets its blobs checked, its
        `latest` moved and the index files rebuilt (a push killed right after writing the
        manifest left a version that `show name@version` finds but `list` does not).
        """
        from zoo.errors import StorageError
        from zoo.registry.remote import push_cut_off

        self._visible = False
        try:
            return self._push(zoo, manifest, tags)
        except StorageError as e:
            raise push_cut_off(e, manifest.ref, self.name, self._visible) from e

    def _push(self, zoo: "LocalZoo", manifest: Manifest, tags: list[str] | None) -> dict:
        b = self.primary
        b._writable()
        missing = zoo.missing(manifest.all_files())
        if missing:
            raise NotFound(f"{manifest.ref}: {len(missing)} file(s) are not in the local zoo (e.g. {missing[0].path})",
                           hint=f"pull every build first: `zoo pull {manifest.ref} --build …` for each build")
        if b.read(b.path("zoo-remote.json")) is None:
            b.write(b.path("zoo-remote.json"), json.dumps({"schema_version": REMOTE_SCHEMA_VERSION}).encode())
        existing = self._read_primary_manifest(manifest)
        self._visible = existing is not None
        if existing is not None and not same_content(existing, manifest):
            raise Conflict(f"{manifest.ref} is already on remote {self.name} with different content",
                           hint="versions are immutable: bump the version")
        uploaded, nbytes = self._upload_missing(zoo, manifest)
        notes: list[str] = []
        attached = self._upload_attachments(zoo, manifest, notes)
        created = False
        if existing is None:
            if manifest.created is None:
                manifest = manifest.model_copy(update={"created": utc_now()})
            mpath = b.path("models", manifest.name, "versions", f"{manifest.version}.json")
            self._visible = None  # cut off during the create, the remote may or may not have made it
            created = b.create(mpath, dump_manifest(manifest))
            self._visible = True  # ours or a concurrent publisher's: the version is there from here on
            if not created:
                theirs = self._read_primary_manifest(manifest)
                if theirs is None or not same_content(theirs, manifest):
                    raise Conflict(f"{manifest.ref} was published to remote {self.name} concurrently with different content",
                                   hint="versions are immutable: bump the version")
                manifest = theirs
            # a remote gc may have freed a blob we found present (an old one, unreferenced until
            # our manifest appeared) between our check and the manifest: check again, re-upload
            again, more = self._upload_missing(zoo, manifest)
            uploaded, nbytes = uploaded + again, nbytes + more
        else:
            manifest = existing  # keeps the first publish time in the index
        self._finish_publish(manifest, tags or [])
        # counted in distinct contents: a file whose bytes another file of the version has (test
        # vectors shared by builds) is one blob, so it is neither uploaded twice nor "already there"
        n = len({f.sha256 for f in manifest.all_files()})
        return {"remote": self.name, "ref": manifest.ref, "uploaded": uploaded, "skipped": n - min(uploaded, n),
                "bytes": nbytes, "created": created, "attachments": attached, "notes": notes}

    def _upload_attachments(self, zoo: "LocalZoo", manifest: Manifest, notes: list[str]) -> list[str]:
        """Store the local attachments of `manifest` the primary lacks, create-exclusive, by
        `attachments.reconcile`'s rule (other bytes: a Conflict, except an unsigned version's BOM,
        which stays as the remote has it, noted); the names stored."""
        from zoo.registry.attachments import MAX_BYTES, NAMES, differs, reconcile

        b = self.primary
        where = f"remote {self.name}"

        def rpath(n: str) -> str:
            return b.path("models", manifest.name, "attachments", manifest.version, n)

        local = zoo.attachments(manifest.name, manifest.version)
        there = {n: data for n in NAMES if n in local and (data := b.read(rpath(n), limit=MAX_BYTES)) is not None}
        store, found = reconcile(manifest.ref, where, local, there, can_add=True, cannot_add="")
        notes.extend(found)
        stored = []
        for n in store:
            if b.create(rpath(n), local[n]):
                stored.append(n)
            elif b.read(rpath(n)) != local[n]:  # a concurrent publisher's, between our read and create
                raise differs(n, manifest.ref, where)
        return stored

    def _upload_missing(self, zoo: "LocalZoo", manifest: Manifest) -> tuple[int, int]:
        """Upload the blobs of `manifest` the primary lacks (a present blob has the right size); (files, bytes)."""
        from zoo.errors import IntegrityError
        from zoo.files import sha256_and_size

        b = self.primary
        uploaded = nbytes = 0
        for ref in manifest.all_files():
            rpath = b.path("blobs", "sha256", ref.sha256[:2], ref.sha256)
            if b.size(rpath) == ref.size:  # resumes an interrupted push: only what is missing goes up
                continue
            local = zoo.blobs.path(ref.sha256)
            if sha256_and_size(local) != (ref.sha256, ref.size):
                raise IntegrityError(f"local blob of {manifest.ref}: {ref.path} is corrupt; refusing to upload it",
                                     hint=f"`zoo rm {manifest.ref}` and pull or publish it again")
            b.put_file(local, rpath)
            uploaded += 1
            nbytes += ref.size
        return uploaded, nbytes

    def _finish_publish(self, manifest: Manifest, tags: list[str]) -> None:
        """Move `latest` if this version is the newest, set `tags`, rebuild the index files.

        Reads the tag files themselves, not the derived index: after a cut-off push the index
        is exactly what may be stale.
        """
        current = self._list_tags(manifest.name).get(LATEST)
        if current is not None and self._read_manifest_bytes(manifest.name, current) is None:
            current = None  # `latest` names a removed version
        if moves_latest(current, manifest.version):
            self._write_tag(manifest.name, LATEST, manifest.version)
        for tag in tags:
            if tag != LATEST:
                self._write_tag(manifest.name, check_tag(tag), manifest.version)
        self._reindex(manifest.name, manifest)

    def _read_manifest_bytes(self, name: str, version: str) -> bytes | None:
        b = self.primary
        return b.read(b.path("models", name, "versions", f"{version}.json"))

    def _read_primary_manifest(self, manifest: Manifest) -> Manifest | None:
        b = self.primary
        data = b.read(b.path("models", manifest.name, "versions", f"{manifest.version}.json"))
        return None if data is None else load_manifest(data, f"remote {self.name}: {manifest.ref}")

    def _write_tag(self, name: str, tag: str, version: str) -> None:
        b = self.primary
        b.write(b.path("models", name, "tags", f"{tag}.json"),
                json.dumps({"version": version, "updated": utc_now()}).encode())

    def set_tag(self, name: str, tag: str, version: str) -> None:
        check_tag(tag)
        if self._read_primary_manifest_by(name, version) is None:
            raise NotFound(f"{name}@{version} is not on remote {self.name}", hint=f"push it first: zoo push {name}@{version} --to {self.name}")
        self._write_tag(name, tag, version)
        self._reindex(name)

    def _read_primary_manifest_by(self, name: str, version: str) -> bytes | None:
        b = self.primary
        b._writable()
        return b.read(b.path("models", name, "versions", f"{version}.json"))

    def remove(self, name: str, version: str, *, grace_s: float | None = None) -> dict:
        """Delete a version's manifest and the tags on it, then free its blobs that no remaining
        manifest references (counted from the manifests themselves, never the derived index)
        and that are older than the grace period."""
        b = self.primary
        data = self._read_primary_manifest_by(name, version)
        if data is None:
            raise NotFound(f"{name}@{version} is not on remote {self.name}")
        try:
            candidates = {f.sha256 for f in load_manifest(data, f"remote {self.name}: {name}@{version}").all_files()}
        except ZooError:
            candidates = set()  # a damaged manifest: its blobs are left to `zoo remote gc`
        b.delete(b.path("models", name, "versions", f"{version}.json"))
        from zoo.registry.attachments import NAMES

        for n in NAMES:  # after the manifest: an attachment without its version is never read
            b.delete(b.path("models", name, "attachments", version, n))
        for tag, v in self._list_tags(name).items():
            if v == version:
                b.delete(b.path("models", name, "tags", f"{tag}.json"))
        self._reindex(name)
        files = []
        for sha in sorted(candidates):
            rpath = self._blob_path(sha)
            st = b.stat(rpath)
            if st is not None:
                files.append((rpath, *st))
        return self._free(files, grace_s=gc_grace(self.config, grace_s), dry_run=False)

    def gc(self, *, grace_s: float | None = None, dry_run: bool = False) -> dict:
        """Free every blob (and upload left-over) that no manifest on the remote references and
        that is older than the grace period; `dry_run` only reports."""
        b = self.primary
        b._writable()
        return self._free(b.walk(b.path("blobs")), grace_s=gc_grace(self.config, grace_s), dry_run=dry_run)

    def _blob_path(self, sha256: str) -> str:
        return self.primary.path("blobs", "sha256", sha256[:2], sha256)

    def _referenced(self) -> set[str]:
        """sha256 of every file of every version on the primary, read from the manifests (the
        truth). A manifest that cannot be read stops the gc: its blobs cannot be told apart."""
        b = self.primary
        out: set[str] = set()
        for model in b.listdir(b.path("models")):
            if model.startswith("."):
                continue
            for entry in b.listdir(b.path("models", model, "versions")):
                if not entry.endswith(".json") or entry.startswith("."):
                    continue
                data = b.read(b.path("models", model, "versions", entry))
                if data is None:
                    continue  # removed while we listed
                try:
                    m = load_manifest(data, f"remote {self.name}: models/{model}/versions/{entry}")
                except ZooError as e:
                    raise StorageError(f"remote {self.name}: cannot read {model}/versions/{entry} ({e.message}); "
                                       "no blob was freed", hint="fix or remove that version, then run gc again") from e
                out.update(f.sha256 for f in m.all_files())
        return out

    def _free(self, files: list[tuple[str, int, float | None]], *, grace_s: float, dry_run: bool) -> dict:
        """Delete those of `files` (path, size, mtime) no manifest references and older than `grace_s`."""
        import time

        result = {"remote": self.name, "blobs_freed": 0, "bytes_freed": 0, "kept_young": 0, "grace_s": grace_s,
                  "dry_run": dry_run}
        if not files:
            return result
        referenced = self._referenced()  # read after the listing: a manifest written meanwhile counts
        now = time.time()
        for rpath, size, mtime in files:
            name = rpath.rsplit("/", 1)[-1]
            if name in referenced:
                continue
            if mtime is None or now - mtime < grace_s:  # maybe a push between its blobs and its manifest
                result["kept_young"] += 1
                continue
            if not dry_run:
                self.primary.delete(rpath)
            result["blobs_freed"] += 1
            result["bytes_freed"] += size
        return result

    def _list_tags(self, name: str) -> dict[str, str]:
        b = self.primary
        out = {}
        for entry in b.listdir(b.path("models", name, "tags")):
            if entry.endswith(".json") and not entry.startswith("."):
                data = b.read(b.path("models", name, "tags", entry))
                if data:
                    out[entry[:-5]] = json.loads(data)["version"]
        return out

    def _reindex(self, name: str, new: Manifest | None = None) -> None:
        """Rewrite the derived index files from listings (reads only manifests the index lacks)."""
        b = self.primary
        old = (json.loads(b.read(b.path("models", name, "index.json")) or b"{}")).get("versions", {})
        versions = {}
        for entry in b.listdir(b.path("models", name, "versions")):
            if not entry.endswith(".json") or entry.startswith("."):
                continue
            v = entry[:-5]
            if new is not None and v == new.version:
                versions[v] = _summary(new)
            elif v in old:
                versions[v] = old[v]
            else:
                m = self._read_manifest(name, v)
                if m is not None:
                    versions[v] = _summary(m)
        tags = {t: v for t, v in self._list_tags(name).items() if v in versions}
        if versions and LATEST not in tags:
            releases = [v for v in versions if not is_prerelease(v)]
            top = newest(releases or list(versions))
            self._write_tag(name, LATEST, top)
            tags[LATEST] = top
        b.write(b.path("models", name, "index.json"),
                json.dumps({"schema_version": REMOTE_SCHEMA_VERSION, "name": name, "versions": versions, "tags": tags},
                           indent=1, sort_keys=True).encode())
        models = [m for m in b.listdir(b.path("models")) if not m.startswith(".")]
        b.write(b.path("index.json"),
                json.dumps({"schema_version": REMOTE_SCHEMA_VERSION, "models": sorted(models)}, indent=1).encode())
