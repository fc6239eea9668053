"""Air-gapped bundles: versions of the local zoo in one tar file, verified byte for byte on import.

    zoo bundle export lenet-digits@1.0.0 alexnet@1.0.0 -o models.tar     # on a connected host
    zoo bundle import models.tar                                          # on the air-gapped one

Layout (an uncompressed tar; members in this order, no directories, no links)::

    zoo-bundle.json                       {"schema_version": 1 or 2, "versions": [{"name", "version",
                                           "manifest": "manifests/<name>/<version>.json",
                                           "manifest_sha256", "attachments": {file: sha256}}],
                                           "blobs": {sha256: size}}
    manifests/<name>/<version>.json       each version's manifest (the zoo's canonical bytes)
    attachments/<name>/<version>/<file>   its signature and bill of materials (zoo.registry.attachments)
    blobs/sha256/<sha256>                 every file of those versions, once, named by its sha256

Schema 2 adds the attachments; a bundle whose versions carry none is written as schema 1, byte
for byte what an older zoo wrote and reads.

The tar is deterministic for the same versions (sorted members, zero mtimes and owners) and
written to a temporary file renamed into place, so a reader never sees half a bundle.

Import refuses, before anything is installed: member names that are absolute, contain '..' or
are not in the layout above; links, devices, FIFOs, sparse members; manifests that do not match the index;
blobs whose sha256 or size differ from what the index and manifests say (IntegrityError,
exit 4); ONNX builds whose external data points outside their version (UnsafePath); a version
already in the zoo with other bytes (Conflict). Only then are the verified blobs moved into the
store and each manifest recorded (a version already present with the same bytes is a no-op).
A member is never written past its declared size, and no byte is written that is neither
backed by the tar file (uncompressed) nor hashed first (gzip/bzip2/xz, where a small file can
claim gigabytes): a bomb fails with exit 4 having written next to nothing.
Nothing in a bundle is imported or executed.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from zoo.errors import Conflict, IntegrityError, InvalidInput, NotFound, UnsafePath
from zoo.registry.codec import dump_manifest, load_manifest, same_content
from zoo.registry.manifest import Manifest
from zoo.registry.refs import parse_ref
from zoo.registry.store import LocalZoo

BUNDLE_SCHEMA_VERSION = 2
READ_SCHEMA_VERSIONS = (1, 2)
INDEX = "zoo-bundle.json"
_SHA = re.compile(r"^[0-9a-f]{64}$")
_BLOB = re.compile(r"^blobs/sha256/([0-9a-f]{64})$")
_MANIFEST = re.compile(r"^manifests/([a-z0-9][a-z0-9._-]*)/([0-9A-Za-z.+-]+)\.json$")
_ATTACHMENT = re.compile(r"^attachments/([a-z0-9][a-z0-9._-]*)/([0-9A-Za-z.+-]+)/([a-z0-9._-]+)$")
_MAX_INDEX_BYTES = 64 << 20


@dataclass
class BundleResult:
    """What an export wrote or an import installed."""

    path: str
    versions: list[str] = field(default_factory=list)  # name@version, in bundle order
    installed: list[str] = field(default_factory=list)  # import: versions new to this zoo
    present: list[str] = field(default_factory=list)  # import: versions already here with the same bytes
    blobs: int = 0
    bytes: int = 0
    signatures: dict[str, dict] = field(default_factory=dict)  # import: ref -> its signature check (zoo.registry.signing)
    notes: list[str] = field(default_factory=list)


def _zoo(zoo: LocalZoo | None) -> LocalZoo:
    return zoo or LocalZoo()


# ---------------------------------------------------------------------------------------------
# export


Progress = Callable[[int, int], None]  # progress(n, total): n more bytes of the blobs' `total` went through


def export_bundle(refs: Iterable[str], out: str | Path, zoo: LocalZoo | None = None,
                  progress: Progress | None = None) -> BundleResult:
    """Write the versions `refs` (``name@version`` or ``name@tag``) with all their files to the tar `out`.

    Every file of every build must be in the local zoo (NotFound otherwise: pull each build
    first); each blob is re-hashed while it is written, so a damaged local blob is never shipped.
    `progress(n, total)` is called as the blobs' bytes are written.
    """
    zoo = _zoo(zoo)
    manifests: dict[str, Manifest] = {}
    for text in refs:
        m = zoo.resolve(parse_ref(text))
        manifests.setdefault(m.ref, m)
    if not manifests:
        raise InvalidInput("no versions to bundle", hint="zoo bundle export NAME@VERSION... -o FILE.tar")
    blobs: dict[str, int] = {}
    for m in manifests.values():
        missing = zoo.missing(m.all_files())
        if missing:
            raise NotFound(f"{m.ref}: {len(missing)} file(s) are not in the local zoo (e.g. {missing[0].path})",
                           hint=f"pull every build first: `zoo pull {m.ref} --build …` for each of "
                                f"{', '.join(sorted(m.builds))}")
        for f in m.all_files():
            blobs[f.sha256] = f.size
    ordered = sorted(manifests.values(), key=lambda m: (m.name, m.version))
    entries, manifest_bytes = [], {}
    for m in ordered:
        data = dump_manifest(m)
        path = f"manifests/{m.name}/{m.version}.json"
        manifest_bytes[path] = data
        entry = {"name": m.name, "version": m.version, "manifest": path,
                 "manifest_sha256": hashlib.sha256(data).hexdigest()}
        attached = zoo.attachments(m.name, m.version)
        if attached:
            entry["attachments"] = {n: hashlib.sha256(b).hexdigest() for n, b in sorted(attached.items())}
            for n, b in sorted(attached.items()):
                manifest_bytes[f"attachments/{m.name}/{m.version}/{n}"] = b
        entries.append(entry)
    schema = BUNDLE_SCHEMA_VERSION if any("attachments" in e for e in entries) else 1
    index = {"schema_version": schema, "versions": entries, "blobs": dict(sorted(blobs.items()))}

    from zoo.files import atomic_output

    out = Path(out).expanduser()
    total = 0
    blob_bytes = sum(blobs.values())
    counted = (lambda n: progress(n, blob_bytes)) if progress is not None else None
    with atomic_output(out) as tmp:
        with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
            _add_bytes(tar, INDEX, (json.dumps(index, indent=2, sort_keys=True) + "\n").encode())
            for path, data in manifest_bytes.items():
                _add_bytes(tar, path, data)
            for sha, size in sorted(blobs.items()):
                with open(zoo.blobs.path(sha), "rb") as f:
                    reader = _HashingReader(f, counted)
                    tar.addfile(_member(f"blobs/sha256/{sha}", size), reader)
                if reader.hexdigest() != sha or reader.count != size:
                    raise IntegrityError(f"local blob {sha[:12]}… is corrupt; refusing to bundle it",
                                         hint="`zoo rm` the version that uses it and pull it again")
                total += size
    return BundleResult(path=str(out), versions=[m.ref for m in ordered], blobs=len(blobs), bytes=total)


def _member(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, 0o644, 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    tar.addfile(_member(name, len(data)), io.BytesIO(data))


class _HashingReader:
    """A file wrapper that hashes what tarfile reads from it (and reports each read's size to `progress`)."""

    def __init__(self, f, progress: Callable[[int], None] | None = None):
        self.f, self.h, self.count = f, hashlib.sha256(), 0
        self.progress = progress

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.h.update(data)
        self.count += len(data)
        if self.progress is not None and data:
            self.progress(len(data))
        return data

    def hexdigest(self) -> str:
        return self.h.hexdigest()


class _CountingReader:
    """A file wrapper that reports the size of each read to `progress` (copy_verified hashes)."""

    def __init__(self, f, progress: Callable[[int], None]):
        self.f, self.progress = f, progress

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        if data:
            self.progress(len(data))
        return data


# ---------------------------------------------------------------------------------------------
# import


def import_bundle(path: str | Path, zoo: LocalZoo | None = None, progress: Progress | None = None, *,
                  require_signature: bool = False) -> BundleResult:
    """Verify every byte of the bundle at `path`, then install its versions into the local zoo.

    All checks run before anything is installed (see the module docstring); on any failure
    the zoo is left as it was. Versions already present with the same content are no-ops.
    `progress(n, total)` is called as the blobs' bytes are copied out and verified. Each version's
    signature is checked as a pull checks one (zoo.registry.trust: the keys the user trusts
    anywhere; `require_signature` refuses unsigned versions) before any blob is copied out.
    """
    zoo = _zoo(zoo)
    path = Path(path).expanduser()
    if not path.is_file():
        raise NotFound(f"bundle {path} does not exist", hint="give the .tar written by `zoo bundle export`")
    try:
        tar = tarfile.open(path, "r:*")
    except (tarfile.TarError, OSError) as e:
        raise InvalidInput(f"{path} is not a readable tar file ({e})", hint="give the .tar written by `zoo bundle export`") from None
    with tar, tempfile.TemporaryDirectory(dir=zoo.tmp_dir(), prefix="bundle-") as scratch:
        members = _checked_members(tar, path)
        index = _read_index(tar, members, path)
        manifests = _read_manifests(tar, members, index, path)
        attachments = _read_attachments(tar, members, index, path)
        signatures, notes = _check_signatures(zoo, manifests, attachments, path, require_signature)
        blobs = _verify_blobs(tar, members, index, manifests, Path(scratch), path, _compressed(path), progress)
        _check_versions(zoo, manifests, blobs)
        result = _install(zoo, manifests, blobs, index, path, attachments)
        result.signatures, result.notes = signatures, notes
        return result


def _check_signatures(zoo: LocalZoo, manifests: list[Manifest], attachments: dict[str, dict[str, bytes]], path: Path,
                      require: bool) -> tuple[dict[str, dict], list[str]]:
    """Every version's signature checked against what the user trusts (SignatureError, exit 4, before
    anything is installed); the checks made by ref, and notes."""
    from zoo.registry import trust

    policy = trust.policy(trust.all_remotes(zoo.root), require=require)
    notes = list(policy.notes)
    if not policy.active:
        return {}, notes
    from zoo.registry.signing import verify

    out = {}
    for m in manifests:
        verdict = verify(m, attachments.get(m.ref, {}), policy, where=f"bundle {path.name}: ")
        out[m.ref] = verdict.to_json()
        notes.extend(verdict.notes)
    return out, notes


def _checked_members(tar: tarfile.TarFile, path: Path) -> dict[str, tarfile.TarInfo]:
    """Every member by name, refusing unsafe names, unexpected names, duplicates and non-files."""
    members: dict[str, tarfile.TarInfo] = {}
    for m in tar.getmembers():
        name = m.name
        if name.startswith("/") or "\\" in name or "\x00" in name or any(p in ("..", "") for p in name.split("/")):
            raise UnsafePath(f"{path.name}: member {name!r} escapes the bundle", hint="refusing to import this bundle")
        if m.isdir():
            continue  # re-packed bundles may hold folder entries; they carry no content
        if not m.isfile():
            what = "a link" if (m.issym() or m.islnk()) else "not a regular file"
            raise UnsafePath(f"{path.name}: member {name!r} is {what}", hint="bundles hold regular files only")
        if m.issparse():  # a few KB of tar that claims gigabytes of zeros; export never writes one
            raise IntegrityError(f"{path.name}: member {name!r} is a sparse file ({m.size} bytes claimed)",
                                 hint="bundles hold plain regular files only; export the bundle again")
        if name != INDEX and not _BLOB.fullmatch(name) and not _MANIFEST.fullmatch(name) and not _ATTACHMENT.fullmatch(name):
            raise IntegrityError(f"{path.name}: unexpected member {name!r}",
                                 hint="a bundle holds zoo-bundle.json, manifests/, attachments/ and blobs/sha256/ only")
        if name in members:
            raise IntegrityError(f"{path.name}: member {name!r} appears twice", hint="refusing an ambiguous bundle")
        members[name] = m
    if INDEX not in members:
        raise InvalidInput(f"{path.name} has no {INDEX}: not a zoo bundle", hint="write bundles with `zoo bundle export`")
    return members


def _read_member(tar: tarfile.TarFile, member: tarfile.TarInfo, limit: int) -> bytes:
    if member.size > limit:
        raise IntegrityError(f"bundle member {member.name} is implausibly large ({member.size} bytes)")
    f = tar.extractfile(member)
    assert f is not None  # regular files only (checked)
    return f.read()


def _read_index(tar: tarfile.TarFile, members: dict[str, tarfile.TarInfo], path: Path) -> dict:
    try:
        index = json.loads(_read_member(tar, members[INDEX], _MAX_INDEX_BYTES))
    except ValueError as e:
        raise InvalidInput(f"{path.name}: {INDEX} is not valid JSON ({e})") from None
    if not isinstance(index, dict) or index.get("schema_version") not in READ_SCHEMA_VERSIONS:
        raise InvalidInput(f"{path.name}: unsupported bundle schema_version {index.get('schema_version') if isinstance(index, dict) else None!r}",
                           hint=f"this zoo reads schema_version {' and '.join(map(str, READ_SCHEMA_VERSIONS))}")
    versions, blobs = index.get("versions"), index.get("blobs")
    if not isinstance(versions, list) or not isinstance(blobs, dict):
        raise InvalidInput(f"{path.name}: {INDEX} needs `versions` (a list) and `blobs` (a mapping)")
    for sha, size in blobs.items():
        if not _SHA.fullmatch(str(sha)) or not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise InvalidInput(f"{path.name}: {INDEX} lists an invalid blob {sha!r}: {size!r}")
    return index


def _read_manifests(tar: tarfile.TarFile, members: dict[str, tarfile.TarInfo], index: dict,
                    path: Path) -> list[Manifest]:
    manifests = []
    listed = set()
    for entry in index["versions"]:
        if not isinstance(entry, dict) or not all(isinstance(entry.get(k), str) for k in
                                                  ("name", "version", "manifest", "manifest_sha256")):
            raise InvalidInput(f"{path.name}: {INDEX} has an invalid version entry {entry!r}")
        mpath = entry["manifest"]
        if mpath not in members or not _MANIFEST.fullmatch(mpath):
            raise IntegrityError(f"{path.name}: the manifest of {entry['name']}@{entry['version']} ({mpath}) is missing")
        data = _read_member(tar, members[mpath], _MAX_INDEX_BYTES)
        if hashlib.sha256(data).hexdigest() != entry["manifest_sha256"]:
            raise IntegrityError(f"{path.name}: {mpath} does not match its sha256 in {INDEX}",
                                 hint="the bundle was modified or damaged; export it again")
        m = load_manifest(data, f"{path.name}:{mpath}")
        if (m.name, m.version) != (entry["name"], entry["version"]):
            raise IntegrityError(f"{path.name}: {mpath} describes {m.ref}, not {entry['name']}@{entry['version']}")
        for f in m.all_files():
            if index["blobs"].get(f.sha256) != f.size:
                raise IntegrityError(f"{path.name}: {m.ref}: {f.path} is not in the bundle's blob list",
                                     hint="the bundle is incomplete; export it again")
        manifests.append(m)
        listed.add(mpath)
    extra = sorted(n for n in members if _MANIFEST.fullmatch(n) and n not in listed)
    if extra:
        raise IntegrityError(f"{path.name}: manifest {extra[0]} is not in {INDEX}")
    if not manifests:
        raise InvalidInput(f"{path.name} holds no versions")
    return manifests


def _read_attachments(tar: tarfile.TarFile, members: dict[str, tarfile.TarInfo], index: dict,
                      path: Path) -> dict[str, dict[str, bytes]]:
    """Each version's attachments (ref -> file -> bytes), every one listed in the index with its
    sha256, of a known name and bounded size; an attachment member the index does not list is refused."""
    from zoo.registry.attachments import MAX_BYTES, check

    out: dict[str, dict[str, bytes]] = {}
    listed = set()
    for entry in index["versions"]:
        ref = f"{entry['name']}@{entry['version']}"
        attached = entry.get("attachments", {})
        if not isinstance(attached, dict) or (attached and index["schema_version"] < 2):
            raise InvalidInput(f"{path.name}: {INDEX} has invalid attachments for {ref}")
        for n, sha in attached.items():
            member = f"attachments/{entry['name']}/{entry['version']}/{n}"
            if not isinstance(sha, str) or not _SHA.fullmatch(sha) or member not in members:
                raise IntegrityError(f"{path.name}: attachment {n} of {ref} is missing or badly listed",
                                     hint="the bundle is incomplete or was modified; export it again")
            data = _read_member(tar, members[member], MAX_BYTES)
            check(n, data, f"{path.name}: {ref}")
            if hashlib.sha256(data).hexdigest() != sha:
                raise IntegrityError(f"{path.name}: attachment {n} of {ref} does not match its sha256 in {INDEX}",
                                     hint="the bundle was modified or damaged; nothing was installed")
            out.setdefault(ref, {})[n] = data
            listed.add(member)
    extra = sorted(n for n in members if _ATTACHMENT.fullmatch(n) and n not in listed)
    if extra:
        raise IntegrityError(f"{path.name}: attachment {extra[0]} is not in {INDEX}")
    return out


def _compressed(path: Path) -> bool:
    """Whether the bundle is gzip, bzip2 or xz compressed (tarfile's "r:*" opens all three)."""
    with open(path, "rb") as f:
        head = f.read(6)
    return head.startswith((b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00"))


def _hash_member(tar: tarfile.TarFile, member: tarfile.TarInfo, size: int) -> tuple[str, int]:
    """(sha256, length) of a member's bytes, reading at most `size` + 1 of them, writing none."""
    f = tar.extractfile(member)
    assert f is not None
    h, n = hashlib.sha256(), 0
    while n <= size and (chunk := f.read(min(8 << 20, size + 1 - n))):
        h.update(chunk)
        n += len(chunk)
    return h.hexdigest(), n


def _verify_blobs(tar: tarfile.TarFile, members: dict[str, tarfile.TarInfo], index: dict, manifests: list[Manifest],
                  scratch: Path, path: Path, compressed: bool = False,
                  progress: Progress | None = None) -> dict[str, Path]:
    """Copy every listed blob to `scratch`, checking sha256 and size; sha256 -> verified file.

    Never writes a byte that is not backed by the bundle or proven: in an uncompressed tar
    each member's bytes must lie inside the file (a header claiming more is refused before
    anything is written); in a compressed one, where a megabyte can claim gigabytes, each
    member is hashed first without writing and copied only if it matches.
    """
    from zoo.files import copy_verified

    file_size = path.stat().st_size

    needed = {f.sha256: f.size for m in manifests for f in m.all_files()}
    present = {_BLOB.fullmatch(n).group(1): m for n, m in members.items() if _BLOB.fullmatch(n)}
    unlisted = sorted(set(present) - set(index["blobs"]))
    if unlisted:
        raise IntegrityError(f"{path.name}: blob {unlisted[0][:12]}… is not in {INDEX}")
    out: dict[str, Path] = {}
    total = sum(needed.values())
    for sha, size in sorted(needed.items()):
        member = present.get(sha)
        if member is None:
            raise IntegrityError(f"{path.name}: blob {sha[:12]}… is missing from the bundle",
                                 hint="the bundle is incomplete; export it again")
        if member.size != size:
            raise IntegrityError(f"{path.name}: blob {sha[:12]}… is {member.size} bytes, the manifests say {size}",
                                 hint="the bundle was modified or damaged; nothing was installed")
        what = f"{path.name}: blob {sha[:12]}…"
        if not compressed and member.offset_data + size > file_size:
            raise IntegrityError(f"{what} claims {size} bytes but the bundle ends before them",
                                 hint="the bundle is truncated or was tampered with; nothing was installed")
        if compressed:
            got, n = _hash_member(tar, member, size)
            if (got, n) != (sha, size):
                raise IntegrityError(f"{what}: content does not match the manifest (expected sha256 {sha[:12]}… and "
                                     f"{size} bytes, got {got[:12]}… and {n}{'+' if n > size else ''} bytes)",
                                     hint="the bundle was modified or damaged; nothing was installed")
        f = tar.extractfile(member)
        assert f is not None
        dest = scratch / sha
        counted = (lambda n: progress(n, total)) if progress is not None else None
        copy_verified(_CountingReader(f, counted) if counted else f, dest, sha, size, what)
        out[sha] = dest
    return out


def _check_versions(zoo: LocalZoo, manifests: list[Manifest], blobs: dict[str, Path]) -> None:
    """Refuse conflicting versions and unsafe ONNX external data before anything is installed."""
    from zoo.pathsafety import check_external_data

    for m in manifests:
        existing = zoo.get(m.name, m.version)
        if existing is not None and not same_content(existing, m):
            raise Conflict(f"{m.ref} is already in the local zoo with different content; nothing was imported",
                           hint="versions are immutable: `zoo rm` the local one first if it must be replaced")
        version_files = {f.path for f in m.all_files()}
        for build in m.builds.values():
            if build.format == "onnx":
                check_external_data(blobs[build.file.sha256], build.file.path, version_files)


def _install(zoo: LocalZoo, manifests: list[Manifest], blobs: dict[str, Path], index: dict,
             path: Path, attachments: dict[str, dict[str, bytes]]) -> BundleResult:
    result = BundleResult(path=str(path), versions=[m.ref for m in manifests])
    with zoo.blobs.adding():  # no blob freed between being stored (or found stored) and named
        result = _install_locked(zoo, manifests, blobs, index, result)
    for m in manifests:
        for n, data in sorted(attachments.get(m.ref, {}).items()):
            try:
                zoo.add_attachment(m.name, m.version, n, data)
            except Conflict:  # the local zoo's own copy stays: it is the one that was checked
                pass
    return result


def _install_locked(zoo: LocalZoo, manifests: list[Manifest], blobs: dict[str, Path], index: dict,
                    result: BundleResult) -> BundleResult:
    from zoo.files import hardlink_or_copy

    for sha, src in blobs.items():
        if not zoo.blobs.has(sha, index["blobs"][sha]):
            dest = zoo.blobs.path(sha)
            dest.parent.mkdir(parents=True, exist_ok=True)
            hardlink_or_copy(src, dest)  # verified in _verify_blobs: a present blob is a verified blob
            zoo.blobs.mark_verified(sha)
            result.blobs += 1
            result.bytes += index["blobs"][sha]
    for m in manifests:
        if zoo.get(m.name, m.version) is not None:
            result.present.append(m.ref)
            continue
        zoo.adopt(m)
        result.installed.append(m.ref)
    return result

