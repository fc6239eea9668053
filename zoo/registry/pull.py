"""`zoo pull`: resolve a reference, pick a build, fetch its blobs (verified), place the files.

Resolution order:

- ``--offline``: the local zoo only.
- a pinned version (``name@1.2.0``) already in the local zoo: no network at all (versions are
  immutable), so a second pull costs a manifest read and a few stats;
- otherwise the remotes in order (``--remote NAME`` alone, else every configured remote in
  config order; each remote tries its mirrors in order). If none can be reached and the local
  zoo has the reference, it is used and a note says so.

Nothing pulled is ever imported or executed: files are verified, their ONNX external-data
locations checked, and only then is the version adopted and the files placed (hard links in
the zoo's own snapshot folder; independent copies or reflinks for ``--to``).

Signatures (zoo.registry.signing, zoo.registry.trust): when a signature is demanded
(``--require-signature``; ``signing.require`` for a version coming from a remote) or any key is
trusted for the source, the version's signature is checked right after its manifest is resolved,
before a byte of it is fetched: a refused version leaves nothing behind. Every fetched file is then held to its
sha256 in the manifest the signature covers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from zoo.errors import AccessDenied, Conflict, IntegrityError, NotFound, SourceUnreachable, StorageError, ZooError, is_no_space
from zoo.files import storage_error
from zoo.registry.manifest import FileRef, Manifest
from zoo.registry.refs import LATEST, Ref, parse_ref
from zoo.registry.remote import RemoteZoo
from zoo.registry.remote_factory import open_remote
from zoo.registry.store import LocalZoo


@dataclass
class PullResult:
    """What a pull did: which version and build, where the model file is, what was downloaded."""

    name: str
    version: str
    build: str
    path: str
    source: str  # where the manifest came from: remote name, or "local"
    downloaded_files: int = 0
    downloaded_bytes: int = 0
    notes: list[str] = field(default_factory=list)
    fetched_from: list[str] = field(default_factory=list)  # the remotes the downloaded bytes came from
    signature: dict | None = None  # the signature check (zoo.registry.signing.Verdict), None when none was made

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}"


def candidate_remotes(zoo: LocalZoo, remote: str | None) -> list[RemoteZoo]:
    """The remotes a pull may use, in order."""
    from zoo.registry.config import RemotesConfig

    cfg = RemotesConfig(zoo.root)
    configs = [cfg.get(remote)] if remote else cfg.list()
    return [open_remote(c) for c in configs]


def resolve_manifest(zoo: LocalZoo, r: Ref, remotes: list[RemoteZoo], offline: bool,
                     notes: list[str]) -> tuple[Manifest, RemoteZoo | None]:
    """(manifest, remote it came from or None for the local zoo) following the module's order.

    A remote that cannot be reached or that refuses (no or wrong credentials, HTTP 401/403)
    does not stop a pull of what the local zoo has: a note says which and why. Without a local
    copy, a refusing remote is one AccessDenied whose hint says where credentials come from.
    """
    local = _local(zoo, r)
    if offline or (r.pinned and local is not None):
        if local is None:
            raise NotFound(f"{r} is not in the local zoo (offline)", hint="pull it once while online")
        return local, None
    unreachable: list[str] = []
    refused: list[tuple[str, AccessDenied]] = []
    not_found: list[ZooError] = []
    for rz in remotes:
        try:
            return rz.resolve(r), rz
        except AccessDenied as e:
            refused.append((rz.name, e))
        except SourceUnreachable as e:
            unreachable.append(f"{rz.name} ({e.message})")
        except NotFound as e:
            not_found.append(e)
    if local is not None:
        if unreachable:
            notes.append(f"remote {', '.join(unreachable)} unreachable: using {local.ref} from the local cache")
        for name, e in refused:
            notes.append(f"remote {name} refused: {e.message}; using {local.ref} from the local zoo"
                         + (f"; to use the remote: {e.hint}" if e.hint else ""))
        return local, None
    if refused and not not_found:
        name, first = refused[0]
        raise AccessDenied(f"cannot resolve {r}: remote {name} refused: {first.message}", hint=first.hint)
    if unreachable and not not_found:
        raise SourceUnreachable(f"cannot resolve {r}: no remote could be reached ({'; '.join(unreachable)})",
                                hint="check the network; --offline pulls only what is cached")
    if not_found and len(remotes) == 1:
        raise not_found[0]
    if not remotes:
        zoo.resolve(r)  # raises NotFound with local suggestions
    raise NotFound(f"{r} was found neither in the local zoo nor on remote(s) {', '.join(x.name for x in remotes)}",
                   hint=not_found[0].hint if not_found else None)


def _local(zoo: LocalZoo, r: Ref) -> Manifest | None:
    try:
        return zoo.resolve(r)
    except NotFound:
        return None


def pull(ref: str, *, build: str | None = None, to: Path | None = None, remote: str | None = None,
         offline: bool = False, zoo: LocalZoo | None = None, providers: list[str] | None = None,
         require_signature: bool = False) -> PullResult:
    """Pull `ref` (``name[@version|@tag]``) and return where its build's model file is.

    Everything is checked before anything is adopted: each of the build's files (fetched or
    already stored) must hash to its sha256, and every ONNX file of the version held locally
    must keep its external data inside the version. Only then are the manifest and tags
    recorded and the files placed, so a refused pull leaves no version and no tag behind.
    """
    from zoo.registry.select import best_build

    zoo = zoo or LocalZoo()
    r = parse_ref(ref)
    notes: list[str] = []
    remotes = [] if offline else candidate_remotes(zoo, remote)
    manifest, source = resolve_manifest(zoo, r, remotes, offline, notes)
    b = zoo.get_build(manifest, build) if build else best_build(manifest, providers)
    dest = Path(to).expanduser().resolve() if to else None
    # the version's signature and bill of materials come from the remote whose manifest we adopt:
    # read once, so the bytes checked are the bytes kept
    attachments = source.read_attachments(manifest.name, manifest.version) if source is not None else {}
    verdict = check_signature(zoo, manifest, source, attachments, require_signature, notes)
    signature = verdict.to_json() if verdict is not None else None

    if source is None and dest is None:
        done = zoo.is_materialized(manifest, b)
        if done is not None:
            return PullResult(manifest.name, manifest.version, b.name, str(done), "local", notes=notes,
                              signature=signature)

    fetched: list[FileRef] = []
    used: list[str] = []
    try:
        with zoo.storing(only_inside=dest is not None), zoo.blobs.adding():
            # what is fetched (or found stored) is not freed before the manifest names it
            path = _fetch_and_place(zoo, r, manifest, b, source, attachments, remotes, dest, offline, fetched, used,
                                    notes)
    except OSError as e:  # a failed download removed its temporary file: the space is given back
        if not is_no_space(e):
            raise
        raise storage_error(Path(e.filename) if e.filename else zoo.root, e) from e
    return PullResult(manifest.name, manifest.version, b.name, str(path), source.name if source else "local",
                      len(fetched), sum(f.size for f in fetched), notes, fetched_from=used, signature=signature)


def check_signature(zoo: LocalZoo, manifest: Manifest, source: RemoteZoo | None, attachments: dict[str, bytes],
                    require: bool, notes: list[str]):
    """The signature check of a version about to be pulled (module docstring): a `Verdict`, None
    when signatures are not checked; SignatureError (exit 4) when it does not hold. The anchors
    are the user's and, for a version from a remote, that remote's; for one the local zoo holds,
    those of every remote the user configured (it remembers no source)."""
    from zoo.registry import trust

    config = getattr(source, "config", None) if source is not None else None
    policy = trust.policy([config] if config is not None else trust.all_remotes(zoo.root), require=require,
                          entering=source is not None)
    notes.extend(policy.notes)
    if not policy.active:
        return None
    from zoo.registry.signing import verify

    if source is None:
        verdict = verify(manifest, zoo.attachments(manifest.name, manifest.version), policy)
    else:
        verdict = verify(manifest, attachments, policy, where=f"remote {source.name}: ")
    notes.extend(verdict.notes)
    return verdict


def _fetch_and_place(zoo: LocalZoo, r: Ref, manifest: Manifest, b, source: RemoteZoo | None,
                     attachments: dict[str, bytes], remotes: list[RemoteZoo], dest: Path | None, offline: bool,
                     fetched: list[FileRef], used: list[str], notes: list[str]) -> Path:
    """Fetch what the build lacks, check the version's ONNX files, adopt the manifest (with the
    `attachments` read from `source`), place the files."""
    files = zoo.build_files(manifest, b)
    order = ([source] if source else []) + [x for x in remotes if x is not source]
    _fetch_needed(zoo, manifest, b.name, files, order, offline, fetched, used, notes)
    if b.format == "onnx":
        # external data the model names but the build does not list (checked for safety just below)
        listed = {f.path for f in files}
        version_files = {f.path: f for f in manifest.all_files()}
        extra = [version_files[rel] for rel in zoo.check_onnx_files(manifest, [b.name]) if rel not in listed]
        _fetch_needed(zoo, manifest, b.name, extra, order, offline, fetched, used, notes)
    zoo.check_onnx_files(manifest)  # every ONNX file of this version held locally, before adopting anything
    if source is not None:
        zoo.adopt(manifest)
        _keep_attachments(zoo, manifest, attachments, source.name, notes)
        if r.tag and r.tag != LATEST:
            zoo.tag(manifest.name, manifest.version, r.tag)  # so the same tag resolves offline later
    return zoo.materialize(manifest, b, dest)


def _keep_attachments(zoo: LocalZoo, manifest: Manifest, attachments: dict[str, bytes], remote: str,
                      notes: list[str]) -> None:
    """Store a pulled version's attachments; one the local zoo already holds with other bytes stays
    (the local copy is the one that was checked, or the user's own), with a note."""
    for n, data in sorted(attachments.items()):
        try:
            zoo.add_attachment(manifest.name, manifest.version, n, data)
        except Conflict:
            notes.append(f"{manifest.ref}: kept the local {n}; remote {remote} holds another one")


def _fetch_needed(zoo: LocalZoo, manifest: Manifest, build: str, files: list[FileRef], order: list[RemoteZoo],
                  offline: bool, fetched: list[FileRef], used: list[str], notes: list[str]) -> None:
    """Make every file of `files` present with the right content, fetching what is missing or corrupt."""
    states = {f.path: zoo.blobs.check(f.sha256, f.size) for f in files}
    corrupt = [f for f in files if states[f.path] == "corrupt"]
    if corrupt and (offline or not order):
        raise IntegrityError(f"{manifest.ref}: the stored copy of {', '.join(f.path for f in corrupt)} does not match "
                             f"its sha256 (corrupted on disk); refusing to serve it",
                             hint=f"`zoo fsck --repair` removes the bad copy; then `zoo pull {manifest.ref} --build {build}` "
                                  "from a remote fetches it again, or rerunning the recipe that built it republishes it")
    missing = [f for f in files if states[f.path] != "ok"]
    if missing and offline:
        raise NotFound(f"{manifest.ref} build {build} is not in the local cache (offline)",
                       hint="pull it once while online")
    for f in missing:
        if states[f.path] == "corrupt":
            zoo.blobs.remove(f.sha256)  # never served, never resumed from
        fetched.append(f)
        name = _fetch_any(order, manifest, f, zoo)
        if name not in used:
            used.append(name)
        if states[f.path] == "corrupt":
            notes.append(f"{manifest.ref}: the stored copy of {f.path} was corrupt; fetched it again from {name}")
    for f in missing:
        if not zoo.blobs.has(f.sha256, f.size):
            raise IntegrityError(f"{manifest.ref}: {f.path} does not match its sha256 after the download",
                                 hint="retry the pull; if it persists the remote copy is corrupt")


def _fetch_any(order: list[RemoteZoo], manifest: Manifest, f, zoo: LocalZoo) -> str:
    """Fetch one file from the first remote that has it; returns that remote's name."""
    errors: list[ZooError] = []
    for rz in order:
        try:
            rz.fetch(manifest, f, zoo.blobs)
            return rz.name
        except (StorageError, NotFound) as e:
            errors.append(e)
        except IntegrityError as e:
            errors.append(e)
    if not errors:
        raise NotFound(f"{manifest.ref}: {f.path} is not cached and no remote is configured",
                       hint="add one with `zoo remote add`, or rerun the recipe that built it (`zoo run RECIPE` republishes it)")
    for kind in (IntegrityError, SourceUnreachable):
        hit = [e for e in errors if isinstance(e, kind)]
        if hit:
            raise hit[0]
    raise errors[0]
