"""The zoo's Python API; `zoo list/show/search/pull/push/tag/rm/remote` only call these.

Every function returns plain structured data (dataclasses or dicts) and raises `zoo.errors`
classes; none of them prints. `to_json` is what `--json` prints of any of their results (the CLI
and `zoo.api` both call it, so the two cannot drift).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from zoo.errors import NotFound
from zoo.registry.index import VersionInfo
from zoo.registry.manifest import Manifest
from zoo.registry.pull import PullResult
from zoo.registry.refs import parse_pinned, parse_ref, version_key
from zoo.registry.store import LocalZoo
from zoo.storage.metered import MeteredBackend

__all__ = ["ModelSummary", "list_models", "list_versions", "show", "bom", "search", "pull", "verify", "push", "tag", "rm", "fsck",
           "remote_add", "remote_list", "remote_remove", "remote_gc", "PullResult", "VersionInfo", "to_json"]


@dataclass
class ModelSummary:
    """One model in `zoo list`: its newest version, how many versions, its tags."""

    name: str
    latest: str
    versions: int
    task: str
    description: str
    tags: dict[str, str] = field(default_factory=dict)


def _zoo(zoo: LocalZoo | None) -> LocalZoo:
    return zoo or LocalZoo()


def _remote(name: str, zoo: LocalZoo):
    from zoo.registry.config import RemotesConfig
    from zoo.registry.remote_factory import open_remote

    return open_remote(RemotesConfig(zoo.root).get(name))


def list_versions(name: str | None = None, *, remote: str | None = None, zoo: LocalZoo | None = None) -> list[VersionInfo]:
    """Every version (of one model or all), newest first per model, locally or on `remote`.

    NotFound (exit 2) when model `name` has no version there; its hint names close model names.
    """
    zoo = _zoo(zoo)
    where = _remote(remote, zoo) if remote else zoo
    versions = where.list(name)
    if name and not versions:
        names = sorted({v.name for v in where.list()}) if remote else zoo.index.model_names()
        raise unknown_model(name, names, where=f"on remote {remote}" if remote else "in the local zoo",
                            listing=f"zoo list --remote {remote}" if remote else "zoo list")
    return versions


def unknown_model(name: str, names: list[str], *, where: str, listing: str) -> NotFound:
    """The error for a model name that is not among `names`: close names as a did-you-mean."""
    import difflib

    close = difflib.get_close_matches(name, names, n=3)
    hint = f"did you mean {', '.join(close)}?" if close else f"`{listing}` shows the models there"
    return NotFound(f"no model called {name!r} {where}", hint=hint)


def list_models(*, remote: str | None = None, zoo: LocalZoo | None = None) -> list[ModelSummary]:
    """One summary per model, locally or on `remote`."""
    if not remote:
        return [ModelSummary(**row) for row in _zoo(zoo).index.models()]
    out: dict[str, ModelSummary] = {}
    for v in list_versions(remote=remote, zoo=zoo):
        s = out.get(v.name)
        if s is None:
            s = out[v.name] = ModelSummary(v.name, v.version, 0, v.task, v.description)
        s.versions += 1
        if version_key(v.version) > version_key(s.latest) and "latest" not in s.tags:
            s.latest, s.task, s.description = v.version, v.task, v.description
        for t in v.tags:
            s.tags[t] = v.version
        if "latest" in v.tags:
            s.latest, s.task, s.description = v.version, v.task, v.description
    return [out[k] for k in sorted(out)]


def show(ref: str, *, remote: str | None = None, zoo: LocalZoo | None = None) -> dict:
    """The manifest of `ref` plus its tags, who signed it (``signature``: who the signature names, not
    checked — `zoo verify` checks it; None when unsigned), for each build whether it is downloaded
    locally, and `bom`: what its bill of materials lists (`zoo.registry.bom.summary`, with the
    attachment's sha256), None when the version carries none."""
    from zoo.registry.attachments import BOM
    from zoo.registry.bom import summary
    from zoo.registry.signing import signature_summary

    zoo = _zoo(zoo)
    manifest, tags, attachments = _version(ref, remote, zoo)
    attached = attachments.get(BOM)
    data = manifest.model_dump(mode="json")
    data["signature"] = signature_summary(attachments, manifest.ref)
    data["tags"] = sorted(t for t, v in tags.items() if v == manifest.version)
    data["source"] = remote or "local"
    data["downloaded"] = {b: not zoo.missing(zoo.build_files(manifest, b)) for b in manifest.builds}
    data["bom"] = summary(attached) if attached is not None else None
    return data


def _version(ref: str, remote: str | None, zoo: LocalZoo, *, strict: bool = False
             ) -> tuple[Manifest, dict[str, str], dict[str, bytes]]:
    """(manifest, tags of its model, its attachments) of `ref`, locally or on `remote`. A remote's
    attachments it refuses (`attachments.check`: an unknown name, too large) are {} unless `strict`,
    which raises: `zoo show` still shows the version."""
    from zoo.errors import AccessDenied, SourceUnreachable, StorageError

    r = parse_ref(ref)
    if remote:
        rz = _remote(remote, zoo)
        manifest = rz.resolve(r)
        try:
            attached = rz.read_attachments(manifest.name, manifest.version)
        except StorageError as e:
            if strict or isinstance(e, (SourceUnreachable, AccessDenied)):  # not the attachment's fault
                raise
            attached = {}
        return manifest, rz.tags(r.name), attached
    manifest = zoo.resolve(r)
    return manifest, zoo.tags(r.name), zoo.attachments(manifest.name, manifest.version)


def bom(ref: str, *, remote: str | None = None, zoo: LocalZoo | None = None) -> dict:
    """The bill of materials of `ref` (locally or on `remote`): ``{ref, source, sha256, document}``,
    `document` the attachment's CycloneDX JSON as bytes. NotFound when the version carries none;
    InvalidInput when its bytes are not JSON (a stranger's attachment is shown, never trusted)."""
    import hashlib
    import json

    from zoo.errors import InvalidInput
    from zoo.registry.attachments import BOM
    from zoo.registry.codec import json_problem


    manifest, _, attached = _version(ref, remote, _zoo(zoo), strict=True)
    data = attached.get(BOM)
    where = f"remote {remote}" if remote else "the local zoo"
    if data is None:
        hint = ("it was published before zoo made bills of materials; `zoo release` of its recipe adds one"
                if not remote else f"it was pushed to {remote} before zoo made bills of materials (or by an older zoo)")
        raise NotFound(f"{manifest.ref} in {where} carries no bill of materials ({BOM})", hint=hint)
    try:
        json.loads(data)  # valid JSON holds no raw control character: safe to print to a terminal as it is
    except (ValueError, RecursionError) as e:
        raise InvalidInput(f"{manifest.ref}: the {BOM} in {where} is not valid JSON ({json_problem(e)})",
                           hint="the attachment is damaged or was not written by zoo") from None
    return {"ref": manifest.ref, "source": remote or "local", "sha256": hashlib.sha256(data).hexdigest(),
            "document": data}


def search(text: str = "", *, task: str | None = None, tag: str | None = None, max_latency: float | None = None,
           min_accuracy: float | None = None, all_versions: bool = False, remote: str | None = None,
           zoo: LocalZoo | None = None) -> list[dict]:
    """Builds in the local zoo (or on `remote`) matching `text` (name/description/task) and every filter given.

    `max_latency` is compared with the build metric ``latency_p50_ms`` and `min_accuracy` with
    ``accuracy`` (both recorded by the verify stage); builds without the metric do not match.
    Only each model's newest version is searched unless `all_versions`. Each row: name, version,
    task, description, build, latency_p50_ms, accuracy, passed, format, precision, runtime,
    verified, size (the model file with its external data) and sha256 (of the model file).
    """
    from zoo.registry import search as _search

    zoo = _zoo(zoo)
    if remote:
        return _search.search_remote(_remote(remote, zoo), text, task=task, tag=tag, max_latency=max_latency,
                                     min_accuracy=min_accuracy, all_versions=all_versions)
    rows = zoo.index.search(text, task=task, tag=tag, max_latency=max_latency, min_accuracy=min_accuracy,
                            latest_only=not all_versions)
    return _search.with_build_fields(rows, zoo.get)



def pull(ref: str, *, build: str | None = None, to: str | Path | None = None, remote: str | None = None,
         offline: bool = False, zoo: LocalZoo | None = None, require_signature: bool = False) -> PullResult:
    """Pull `ref`; see `zoo.registry.pull` for the resolution order, the signature check and
    `zoo.registry.select` for the build rule."""
    from zoo.registry import pull as _pull

    return _pull.pull(ref, build=build, to=Path(to) if to else None, remote=remote, offline=offline, zoo=_zoo(zoo),
                      require_signature=require_signature)


def verify(ref: str, *, require_signature: bool = False, zoo: LocalZoo | None = None) -> dict:
    """`zoo verify NAME@VERSION`: a local version's signature, attachments and stored files (zoo.registry.verify)."""
    from zoo.registry.verify import verify_local

    return verify_local(_zoo(zoo), ref, require_signature=require_signature)


def push(ref: str, to: str, *, tags: list[str] | None = None, zoo: LocalZoo | None = None,
         progress: Callable[[int], None] | None = None) -> dict:
    """Publish local `name@version` to remote `to` (blobs first, manifest last, create-exclusive).

    `progress(n)`: n more bytes went up, as the remote's driver reports them (a folder, S3, GCS,
    Azure, WebDAV or SSH remote; a Hugging Face remote uploads in one commit and reports nothing)."""
    from zoo.registry.refs import LATEST, check_tag
    from zoo.registry.store import latest_is_automatic

    zoo = _zoo(zoo)
    r = parse_pinned(ref)
    if LATEST in (tags or []):
        raise latest_is_automatic(r.name)
    for t in tags or []:
        check_tag(t)  # before anything goes up
    manifest = zoo.resolve(r)
    remote = _remote(to, zoo)
    if progress is not None and hasattr(remote, "primary"):
        remote.primary = MeteredBackend(remote.primary, progress)
    return remote.push(zoo, manifest, list(tags or []))


def tag(ref: str, tag_name: str, *, remote: str | None = None, zoo: LocalZoo | None = None) -> dict:
    """Point `tag_name` at `name@version`, locally or on `remote`; `latest` is never set by hand
    (it follows the newest release), so asking for it is InvalidInput."""
    from zoo.registry.refs import LATEST, check_tag
    from zoo.registry.store import latest_is_automatic

    zoo = _zoo(zoo)
    r = parse_pinned(ref)
    if check_tag(tag_name) == LATEST:
        raise latest_is_automatic(r.name)
    if remote:
        _remote(remote, zoo).set_tag(r.name, tag_name, r.version)
    else:
        zoo.tag(r.name, r.version, tag_name)
    return {"ref": str(r), "tag": tag_name, "remote": remote or "local"}


def rm(ref: str, *, remote: str | None = None, zoo: LocalZoo | None = None) -> dict:
    """Remove `name@version` with the blobs nothing else uses (locally, or on `remote`: its manifest,
    its tags, and its blobs no other manifest there references, older than the remote's gc grace).

    Locally the result also says which tags pointed at it (`tags_dropped`) and where `latest`
    points now (`latest`, None when no version is left).
    """
    zoo = _zoo(zoo)
    r = parse_pinned(ref)
    if remote:
        return {"ref": str(r), **_remote(remote, zoo).remove(r.name, r.version), "remote": remote}
    return {"ref": str(r), "remote": "local"} | zoo.remove_version(r.name, r.version)


def fsck(ref: str | None = None, *, repair: bool = False, zoo: LocalZoo | None = None):
    """Check the local zoo (or one model / version); see `zoo.registry.fsck`. Returns an FsckReport."""
    from zoo.registry.fsck import fsck as _fsck

    return _fsck(_zoo(zoo), ref, repair=repair)


def remote_gc(name: str, *, dry_run: bool = False, grace_s: float | None = None, zoo: LocalZoo | None = None) -> dict:
    """Free the blobs on remote `name` that no manifest there references and that are older than
    the grace period (`grace_s`, else the remote's `gc_grace` option, else one hour)."""
    return _remote(name, _zoo(zoo)).gc(grace_s=grace_s, dry_run=dry_run)


def remote_add(name: str, url: str, *, options: dict[str, str] | None = None, mirrors: list[str] | None = None,
               replace: bool = False, trust: list[str] | None = None, zoo: LocalZoo | None = None) -> dict:
    """Add (or with `replace`, change) a remote. Options are validated; credentials are refused.
    `trust`: PEM public keys or root certificates whose signatures are accepted for versions
    pulled from it (zoo.registry.trust), kept by absolute path."""
    from zoo.registry.config import RemotesConfig

    return RemotesConfig(_zoo(zoo).root).add(name, url, options, mirrors, replace=replace, trust=trust).model_dump()


def remote_add_from_dvc(name: str, dvc_remote: str, *, dvc_repo: Path | str = ".", options: dict[str, str] | None = None,
                        mirrors: list[str] | None = None, replace: bool = False, trust: list[str] | None = None,
                        zoo: LocalZoo | None = None) -> dict:
    """Add a remote at the URL of DVC remote `dvc_remote` of the repo at `dvc_repo`, with the options
    zoo has a name for (`options` added on top); credentials are never copied. The result adds
    ``notes``: what was not carried over and why (zoo.registry.dvc_remote)."""
    from zoo.registry import dvc_remote as dvc_remotes

    found = dvc_remotes.read(dvc_remote, Path(dvc_repo))
    added = remote_add(name, found.url, options={**found.options, **(options or {})}, mirrors=mirrors,
                       replace=replace, trust=trust, zoo=zoo)
    return added | {"from_dvc": {"remote": found.name, "config": found.config}, "notes": found.notes}


def remote_list(*, zoo: LocalZoo | None = None) -> list[dict]:
    from zoo.registry.config import RemotesConfig

    return [r.model_dump() | {"kind": r.scheme, "read_only": r.read_only} for r in RemotesConfig(_zoo(zoo).root).list()]


def remote_remove(name: str, *, zoo: LocalZoo | None = None) -> dict:
    from zoo.registry.config import RemotesConfig

    RemotesConfig(_zoo(zoo).root).remove(name)
    return {"removed": name}


def as_dict(obj) -> dict:
    """JSON-ready form of any result above."""
    if isinstance(obj, Manifest):
        return obj.model_dump(mode="json")
    if hasattr(obj, "as_dict"):
        return obj.as_dict()
    if hasattr(obj, "__dataclass_fields__"):
        d = asdict(obj)
        if isinstance(obj, PullResult):
            d["ref"] = obj.ref
        return d
    return obj


def to_json(obj):
    """What `--json` prints of a result above (a list of them too): plain JSON data."""
    if isinstance(obj, list):
        return [to_json(x) for x in obj]
    return as_dict(obj)
