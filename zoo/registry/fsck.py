"""`zoo fsck`: check a local zoo against itself, and optionally repair what can be repaired.

Checked, for the whole zoo or one model (or one version):

- every manifest parses and sits at the path its name and version say;
- every file it lists whose blob is stored hashes to its sha256 (re-hashed, the memo is not
  trusted); a blob not stored is fine (builds are downloaded one at a time);
- every file placed in a version's snapshot folder matches its blob;
- every tag file names a version that exists;
- the index agrees with the manifests and tags (versions, manifest digests, blob references).

`repair` removes corrupt blobs and snapshot files (a later pull fetches them again), removes
tags that point nowhere, re-points a `latest` that is not the newest release (`refs.latest_of`:
a publish killed before it moved `latest` leaves it behind), and rebuilds the index.
A manifest that does not parse is reported, never deleted: it may be the only record of a
version.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from zoo.errors import ZooError
from zoo.registry.codec import load_manifest
from zoo.files import sha256_and_size
from zoo.registry.manifest import MANIFEST_FILE, FileRef, Manifest
from zoo.registry.refs import LATEST, is_version, latest_of, parse_ref
from zoo.registry.store import LocalZoo, _rmtree


@dataclass
class Problem:
    """One thing wrong: `kind` is manifest | blob | snapshot | tag | index."""

    kind: str
    where: str
    detail: str
    repaired: bool = False


@dataclass
class FsckReport:
    """What `zoo fsck` found (and, with repair, fixed)."""

    versions: int = 0
    blobs_checked: int = 0
    blobs_missing: int = 0
    problems: list[Problem] = field(default_factory=list)

    @property
    def unrepaired(self) -> list[Problem]:
        return [p for p in self.problems if not p.repaired]

    @property
    def ok(self) -> bool:
        return not self.unrepaired

    def as_dict(self) -> dict:
        return asdict(self) | {"ok": self.ok}


def fsck(zoo: LocalZoo, ref: str | None = None, *, repair: bool = False) -> FsckReport:
    """Check `zoo` (or the model / version `ref` names); with `repair`, fix what can be fixed."""
    report = FsckReport()
    name = version = None
    if ref:
        r = parse_ref(ref)
        name, version = r.name, r.version
        if r.tag:  # a bare name means the whole model; a tag means the version it points at
            version = zoo.read_tag(r.name, r.tag) if "@" in ref else None
            if "@" in ref and version is None:
                zoo.resolve(r)  # NotFound with suggestions
    names = [name] if name else zoo._model_names()
    blob_state: dict[str, str] = {}
    index_dirty = False
    for n in names:
        manifests = _check_manifests(zoo, n, version, report)
        for m in manifests:
            report.versions += 1
            _check_files(zoo, m, blob_state, report, repair)
        if version is None:
            index_dirty |= _check_tags(zoo, n, report, repair)
    if version is None:
        index_dirty |= _check_index(zoo, name, report)
    if repair and (index_dirty or any(p.kind in ("blob", "tag") and p.repaired for p in report.problems)):
        zoo.reindex()
        for p in report.problems:
            if p.kind == "index":
                p.repaired = True
    return report


def _check_manifests(zoo: LocalZoo, name: str, version: str | None, report: FsckReport) -> list[Manifest]:
    out = []
    vdir = zoo.root / "models" / name / "versions"
    for d in sorted(vdir.iterdir()) if vdir.is_dir() else []:
        if version is not None and d.name != version:
            continue
        mpath = d / MANIFEST_FILE
        if not mpath.exists():
            continue  # a removed version's leftovers, or one being published: not a version
        try:
            m = load_manifest(mpath.read_bytes(), str(mpath))
        except (OSError, ZooError) as e:
            report.problems.append(Problem("manifest", str(mpath), f"does not parse: {e}"))
            continue
        if (m.name, m.version) != (name, d.name):
            report.problems.append(Problem("manifest", str(mpath), f"names {m.ref}, but lies at {name}@{d.name}"))
            continue
        out.append(m)
    return out


def _check_files(zoo: LocalZoo, m: Manifest, blob_state: dict[str, str], report: FsckReport, repair: bool) -> None:
    snapshot = zoo.version_dir(m.name, m.version)
    seen: set[str] = set()
    for f in m.all_files():
        if f.path in seen:
            continue
        seen.add(f.path)
        state = blob_state.get(f.sha256)
        if state is None:
            state = blob_state[f.sha256] = zoo.blobs.check(f.sha256, f.size, rehash=True)
            if state == "missing":
                report.blobs_missing += 1
            else:
                report.blobs_checked += 1
            if state == "corrupt":
                p = Problem("blob", str(zoo.blobs.path(f.sha256)),
                            f"{m.ref}: {f.path} does not match its sha256 {f.sha256[:12]}…")
                if repair:
                    zoo.blobs.remove(f.sha256)
                    p.repaired = True
                report.problems.append(p)
        _check_snapshot_file(zoo, m, snapshot, f, state, report, repair)


def _check_snapshot_file(zoo: LocalZoo, m: Manifest, snapshot: Path, f: FileRef, state: str, report: FsckReport,
                         repair: bool) -> None:
    target = snapshot / f.path
    try:
        st = os.lstat(target)
    except OSError:
        return  # not placed: nothing to check
    blob = zoo.blobs.path(f.sha256)
    try:
        bst = os.stat(blob)
        linked = (st.st_dev, st.st_ino) == (bst.st_dev, bst.st_ino)
    except OSError:
        linked = False
    if linked and state == "ok":
        return
    if linked or state == "corrupt":
        good = False  # a link to a corrupt blob (which repair may just have removed) has its bad bytes
    else:
        try:
            good = target.is_file() and not target.is_symlink() and sha256_and_size(target) == (f.sha256, f.size)
        except OSError:
            good = False
    if good:
        return
    p = Problem("snapshot", str(target), f"{m.ref}: {f.path} does not match its sha256 {f.sha256[:12]}…")
    if repair:
        if target.is_dir() and not target.is_symlink():
            _rmtree(target)
        else:
            target.unlink(missing_ok=True)
        p.repaired = True
    report.problems.append(p)


def _check_tags(zoo: LocalZoo, name: str, report: FsckReport, repair: bool) -> bool:
    d = zoo.root / "models" / name / "tags"
    changed = latest_reported = False
    for tag_file in sorted(d.iterdir()) if d.is_dir() else []:
        if tag_file.name.startswith("."):
            continue
        try:
            target = tag_file.read_text().strip()
        except OSError as e:
            target, why = None, f"cannot be read ({e.strerror})"
        else:
            why = None if is_version(target) and (zoo.root / "models" / name / "versions" / target / MANIFEST_FILE).is_file() \
                else f"points at {target!r}, which is not a version of {name}"
        if why is None:
            continue
        p = Problem("tag", str(tag_file), f"{name}@{tag_file.name} {why}")
        latest_reported |= tag_file.name == LATEST
        if repair:
            tag_file.unlink(missing_ok=True)
            changed = p.repaired = True
        report.problems.append(p)
    # `latest` follows a rule (the newest release): a publish killed before it moved `latest`, or a
    # tag removed above, leaves it pointing at another version or nowhere
    versions = [m.version for m, _ in zoo._model_entries(name)]
    want = latest_of(versions)
    latest_file = d / LATEST
    try:
        current = latest_file.read_text().strip()
    except OSError:
        current = None
    if want is not None and current != want:
        where = f"points at {current}" if current else "is missing"
        p = Problem("tag", str(latest_file), f"{name}@{LATEST} {where}; the newest release is {want}")
        if repair:
            zoo._repair_latest(name, versions)
            changed = p.repaired = True
        if not latest_reported:  # a dangling `latest` is one problem, already reported above
            report.problems.append(p)
    return changed


def _check_index(zoo: LocalZoo, name: str | None, report: FsckReport) -> bool:
    disk = {}
    files = {}
    names = [name] if name else zoo._model_names()
    tags_disk = {}
    for n in names:
        for m, digest in zoo._model_entries(n):
            disk[(n, m.version)] = digest
            files[(n, m.version)] = {f.sha256 for f in m.all_files()}
        tags_disk[n] = zoo._tag_files(n)
    indexed = zoo.index.manifest_digests(name)
    bad = False
    for key in sorted(set(disk) | set(indexed)):
        ref = f"{key[0]}@{key[1]}"
        if key not in indexed:
            report.problems.append(Problem("index", str(zoo.index.path), f"{ref} is missing from the index"))
        elif key not in disk:
            report.problems.append(Problem("index", str(zoo.index.path), f"{ref} is in the index but has no manifest"))
        elif indexed[key] != disk[key] or set(zoo.index.files_of(*key)) != files[key]:
            report.problems.append(Problem("index", str(zoo.index.path), f"{ref}: the index differs from its manifest"))
        else:
            continue
        bad = True
    for n in names:
        if zoo.index.tags(n) != tags_disk[n]:
            report.problems.append(Problem("index", str(zoo.index.path), f"{n}: the index's tags differ from the tag files"))
            bad = True
    return bad
