"""A Hugging Face Hub (or any Hub-compatible endpoint, such as an olah mirror) as a remote zoo.

Mapping, through huggingface_hub's public API only:

- one model repo per zoo model: ``<namespace>/<name>`` (URL ``hf://<namespace>``);
- one commit per published version, whose tree is exactly that version: its files at their
  manifest paths, ``zoo-manifest.json``, and the model card as ``README.md``;
- versions are git tags named after the version (``1.2.0``); zoo tags (``latest``, ``prod``)
  are git tags too, moved by delete + create; names shaped like versions are never zoo tags;
- the version's attachments (signature, bill of materials: `zoo.registry.attachments`) are
  files of the same commit under ``.zoo/attachments/``, so they come with the first push of a
  version only: its tag pins that commit, and zoo never moves a version tag;
- publishing commits to ``main`` and then creates the version tag: tag creation fails when the
  tag exists (HTTP 409), which is the create-exclusive step that lets one publisher win;
  a commit without its tag is not a version, so an interrupted publish leaves none visible.

Files are downloaded by `zoo.download` from each file's ``resolve`` URL (``hf_hub_url``) at the
version's tag, with huggingface_hub's headers (the token), resumably and verified against the
manifest's sha256 before they enter the blob store. Mirrors of an ``hf://`` remote are other
endpoints serving the same repositories, tried in order.

Listing every model of a namespace (``zoo list --remote``) needs the Hub's
``/api/models?author=`` search; Hub mirrors such as olah do not serve it for local repos, so
there ``zoo list NAME --remote R`` (one model) and pulls by name are what work.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

from zoo.errors import AccessDenied, Conflict, InvalidInput, NotFound, SourceUnreachable, StorageError
from zoo.registry.codec import dump_manifest, load_manifest, same_content, utc_now
from zoo.registry.index import VersionInfo
from zoo.registry.manifest import MANIFEST_FILE, FileRef, Manifest
from zoo.registry.refs import LATEST, Ref, check_name, check_tag, is_version, moves_latest, version_key
from zoo.registry.remote import RemoteZoo, fetch_blob, no_gc

if TYPE_CHECKING:
    from zoo.registry.blobs import BlobStore
    from zoo.registry.config import RemoteConfig
    from zoo.registry.store import LocalZoo


ATTACHMENTS_DIR = ".zoo/attachments"  # a version's signature and bill of materials, in its commit
_TOKEN_HINT = ("set HF_TOKEN (or log in with `hf auth login`), or name another variable with "
               "`zoo remote add NAME URL --replace -o token_env=VAR`; --offline uses only the local zoo")


@contextlib.contextmanager
def _hf_errors(where: str, what: str):
    """Sort huggingface_hub / httpx exceptions into zoo errors."""
    from huggingface_hub import errors as hfe

    try:
        yield
    except hfe.GatedRepoError as e:  # a subclass of RepositoryNotFoundError: it exists, we may not read it
        raise AccessDenied(f"{where} refused access: gated repository ({what})", hint=_TOKEN_HINT) from e
    except (hfe.RepositoryNotFoundError, hfe.RevisionNotFoundError, hfe.RemoteEntryNotFoundError) as e:
        raise NotFound(f"{what}: not found on {where}") from e
    except (hfe.OfflineModeIsEnabled, hfe.LocalEntryNotFoundError) as e:
        raise SourceUnreachable(f"{where} is unreachable ({what}): {e}",
                                hint="check the network (and HF_HUB_OFFLINE), or use --offline") from e
    except hfe.HfHubHTTPError as e:
        status = getattr(getattr(e, "response", None), "status_code", None)
        if status == 404:
            raise NotFound(f"{what}: not found on {where}") from e
        if status in (401, 403):
            raise AccessDenied(f"{where} refused access: HTTP {status} ({what})", hint=_TOKEN_HINT) from e
        raise StorageError(f"{where}: {what} failed: HTTP {status}: {e}") from e
    except (ConnectionError, TimeoutError) as e:
        raise SourceUnreachable(f"{where} is unreachable ({what}): {e}") from e
    except Exception as e:
        from zoo.download import is_connection_error

        # huggingface_hub's HTTP client (httpx or its httpx2 fork) raises ConnectError & co.
        if is_connection_error(e):
            raise SourceUnreachable(f"{where} is unreachable ({what}): {type(e).__name__}: {e}",
                                    hint="check the network, or use --offline to pull from the local cache") from e
        raise


class HfRemoteZoo(RemoteZoo):
    """A namespace on a Hub endpoint, holding one repo per model."""

    def __init__(self, config: "RemoteConfig"):
        self.name = config.name
        self.config = config
        self.namespace = config.url[len("hf://"):].strip("/")
        if not self.namespace or "/" in self.namespace:
            raise InvalidInput(f"remote {config.name}: {config.url!r} must be hf://<namespace>", hint="e.g. hf://my-org")
        opts = config.options
        self.endpoints = [opts.get("endpoint") or None, *config.mirrors]
        token_env = opts.get("token_env")
        self.token = os.environ.get(token_env) if token_env else None
        self.private = bool(opts.get("private", False))

    # ---- helpers ------------------------------------------------------------------------
    def repo_id(self, name: str) -> str:
        return f"{self.namespace}/{check_name(name)}"

    def _api(self, endpoint: str | None):
        from huggingface_hub import HfApi

        return HfApi(endpoint=endpoint, token=self.token)

    def _where(self, endpoint: str | None) -> str:
        return f"remote {self.name} ({endpoint or 'huggingface.co'})"

    def _first(self, fn, what: str):
        """Call fn(endpoint) on the main endpoint, then mirrors while unreachable."""
        last: SourceUnreachable | None = None
        for ep in self.endpoints:
            try:
                with _hf_errors(self._where(ep), what):
                    return fn(ep)
            except SourceUnreachable as e:
                last = e
        assert last is not None
        raise last

    def _refs(self, name: str, endpoint: str | None = None) -> tuple[dict[str, str], dict[str, str]]:
        """(version -> commit, zoo tag -> commit) from the repo's git tags."""
        def get(ep):
            return self._api(ep).list_repo_refs(self.repo_id(name))

        refs = get(endpoint) if endpoint is not None else self._first(get, f"tags of {self.repo_id(name)}")
        versions, tags = {}, {}
        for t in refs.tags:
            (versions if is_version(t.name) else tags)[t.name] = t.target_commit
        return versions, tags

    def _download(self, name: str, filename: str, revision: str, cache_dir: Path, endpoint: str | None) -> Path:
        from huggingface_hub import hf_hub_download

        return Path(hf_hub_download(self.repo_id(name), filename, revision=revision, cache_dir=str(cache_dir),
                                    endpoint=endpoint, token=self.token))

    def _manifest_at(self, name: str, version: str, endpoint: str | None = None) -> Manifest:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="zoo-hf-") as tmp:
            def get(ep):
                return self._download(name, MANIFEST_FILE, version, Path(tmp), ep).read_bytes()

            data = get(endpoint) if endpoint is not None else self._first(get, f"{name}@{version} manifest")
        m = load_manifest(data, f"remote {self.name}: {name}@{version}")
        if (m.name, m.version) != (name, version):
            raise StorageError(f"remote {self.name}: tag {version} of {self.repo_id(name)} holds {m.ref}",
                               hint="the repository is corrupt; retag it")
        return m

    # ---- reads --------------------------------------------------------------------------
    def resolve(self, ref: Ref) -> Manifest:
        try:
            versions, tags = self._refs(ref.name)
        except NotFound:
            raise NotFound(f"no model called {ref.name!r} on remote {self.name} (no repo {self.repo_id(ref.name)})",
                           hint="check the name, or the remote's namespace") from None
        version = ref.version
        if version is None:
            commit = tags.get(ref.tag)
            version = next((v for v, c in sorted(versions.items(), key=lambda kv: version_key(kv[0]), reverse=True)
                            if c == commit), None)
        if version is None or version not in versions:
            have = sorted(versions, key=version_key, reverse=True)[:5] + sorted(tags)
            raise NotFound(f"{ref} is not on remote {self.name}",
                           hint=f"{ref.name} has: {', '.join(have)}" if have else None)
        return self._manifest_at(ref.name, version)

    def tags(self, name: str) -> dict[str, str]:
        versions, tags = self._refs(name)
        by_commit = {}
        for v in sorted(versions, key=version_key):
            by_commit[versions[v]] = v
        return {t: by_commit[c] for t, c in tags.items() if c in by_commit}

    def list(self, name: str | None = None) -> list[VersionInfo]:
        names = [name] if name else self._model_names()
        out = []
        for n in names:
            versions, _ = self._refs(n)
            tags = self.tags(n)
            for v in sorted(versions, key=version_key, reverse=True):
                m = self._manifest_at(n, v)
                out.append(VersionInfo(n, v, m.created, m.task, m.description, m.license, sorted(m.builds),
                                       sorted(t for t, tv in tags.items() if tv == v)))
        return out

    def _model_names(self) -> list[str]:
        def get(ep):
            return [m.id.split("/", 1)[1] for m in self._api(ep).list_models(author=self.namespace)]

        try:
            return sorted(self._first(get, f"models of {self.namespace}"))
        except SourceUnreachable:
            raise
        except Exception as e:  # mirrors such as olah do not implement the listing API
            raise StorageError(f"remote {self.name}: this endpoint cannot list the models of {self.namespace} "
                               f"({type(e).__name__}: {e})",
                               hint="list one model with `zoo list NAME --remote …`, or pull by name") from e

    def fetch(self, manifest: Manifest, ref: FileRef, blobs: "BlobStore") -> None:
        from zoo.download import hf_source

        sources = [hf_source(self.repo_id(manifest.name), ref.path, revision=manifest.version, endpoint=ep,
                             token=self.token, label=self._where(ep), refused_hint=_TOKEN_HINT)
                   for ep in self.endpoints]
        fetch_blob(blobs, ref, sources, f"{manifest.ref}: {ref.path}")

    def read_attachments(self, name: str, version: str) -> dict[str, bytes]:
        import tempfile

        from zoo.registry.attachments import MAX_BYTES, NAMES, check

        where = f"remote {self.name}: {name}@{version}"

        def get(ep):
            from huggingface_hub import get_hf_file_metadata, hf_hub_url

            out = {}
            with tempfile.TemporaryDirectory(prefix="zoo-hf-") as tmp:
                for n in NAMES:
                    path = f"{ATTACHMENTS_DIR}/{n}"
                    try:
                        # the size first: a stranger's file is never downloaded whole to learn it is too large
                        meta = get_hf_file_metadata(hf_hub_url(self.repo_id(name), path, revision=version, endpoint=ep),
                                                    token=self.token)
                    except Exception as e:
                        from huggingface_hub import errors as hfe

                        # a missing file; Hub mirrors (olah) answer a missing file as a missing repo
                        if isinstance(e, (hfe.RemoteEntryNotFoundError, hfe.EntryNotFoundError,
                                          hfe.RepositoryNotFoundError)) and not isinstance(e, hfe.GatedRepoError):
                            continue
                        raise
                    if meta.size is None or meta.size > MAX_BYTES:
                        raise StorageError(f"{where}: attachment {n} is larger than {MAX_BYTES} bytes (or of no stated "
                                           "size)", hint="the source is damaged or hostile; nothing was stored")
                    data = self._download(name, path, version, Path(tmp), ep).read_bytes()
                    check(n, data, where)
                    out[n] = data
            return out

        return self._first(get, f"{name}@{version} attachments")

    # ---- writes (main endpoint only) ------------------------------------------------------
    def push(self, zoo: "LocalZoo", manifest: Manifest, tags: list[str] | None = None) -> dict:
        from zoo.registry.remote import push_cut_off

        self._visible = False
        try:
            return self._push(zoo, manifest, tags)
        except StorageError as e:
            raise push_cut_off(e, manifest.ref, self.name, self._visible) from e

    def _push(self, zoo: "LocalZoo", manifest: Manifest, tags: list[str] | None) -> dict:
        from huggingface_hub import CommitOperationAdd, CommitOperationDelete

        ep = self.endpoints[0]
        where = self._where(ep)
        api = self._api(ep)
        repo = self.repo_id(manifest.name)
        missing = zoo.missing(manifest.all_files())
        if missing:
            raise NotFound(f"{manifest.ref}: {len(missing)} file(s) are not in the local zoo (e.g. {missing[0].path})",
                           hint="pull every build before pushing")
        with _hf_errors(where, f"create {repo}"):
            api.create_repo(repo, exist_ok=True, private=self.private)
        versions, _ = self._refs(manifest.name, ep)
        if manifest.version in versions:
            self._visible = True
            self._same_or_conflict(manifest, self._manifest_at(manifest.name, manifest.version, ep))
            # a push cut off after its version tag did not move `latest`: the retry does
            if moves_latest(self.tags(manifest.name).get(LATEST), manifest.version):
                self._move_tag(api, repo, LATEST, versions[manifest.version])
            notes = self._check_attachments(zoo, manifest)
            for tag in tags or []:
                self.set_tag(manifest.name, tag, manifest.version)
            return {"remote": self.name, "ref": manifest.ref, "uploaded": 0, "skipped": len(manifest.all_files()),
                    "bytes": 0, "created": False, "attachments": [], "notes": notes}
        if manifest.created is None:
            manifest = manifest.model_copy(update={"created": utc_now()})
        attachments = zoo.attachments(manifest.name, manifest.version)
        att_paths = {f"{ATTACHMENTS_DIR}/{n}": data for n, data in sorted(attachments.items())}
        paths = {f.path for f in manifest.all_files()} | {MANIFEST_FILE, "README.md"} | set(att_paths)
        ops = [CommitOperationAdd(path_in_repo=f.path, path_or_fileobj=str(zoo.blobs.path(f.sha256)))
               for f in manifest.all_files()]
        ops += [CommitOperationAdd(path_in_repo=p, path_or_fileobj=data) for p, data in att_paths.items()]
        ops.append(CommitOperationAdd(path_in_repo=MANIFEST_FILE, path_or_fileobj=dump_manifest(manifest)))
        if not manifest.card or manifest.card.path != "README.md":
            ops.append(CommitOperationAdd(path_in_repo="README.md", path_or_fileobj=_card(manifest, zoo).encode()))
        with _hf_errors(where, f"list files of {repo}"):
            try:
                current = api.list_repo_files(repo)
            except Exception as e:  # an empty repo has no tree yet
                from huggingface_hub import errors as hfe

                if not isinstance(e, (hfe.RevisionNotFoundError, hfe.RemoteEntryNotFoundError, hfe.HfHubHTTPError)):
                    raise
                current = []
        ops += [CommitOperationDelete(path_in_repo=p) for p in current if p not in paths and p != ".gitattributes"]
        with _hf_errors(where, f"commit {manifest.ref}"):
            commit = api.create_commit(repo, ops, commit_message=f"zoo: publish {manifest.ref}")
        created, notes = True, []
        try:
            self._visible = None  # cut off during the tag, the Hub may or may not have made it
            with _hf_errors(where, f"tag {manifest.ref}"):
                api.create_tag(repo, tag=manifest.version, revision=commit.oid)
            self._visible = True
        except StorageError as e:
            if "409" not in e.message:
                raise
            self._visible = True
            # another publisher created the version first: fine only if it is the same content
            self._same_or_conflict(manifest, self._manifest_at(manifest.name, manifest.version, ep))
            notes = self._check_attachments(zoo, manifest)
            created = False
        current_latest = self.tags(manifest.name).get(LATEST) if created else None
        if created and moves_latest(current_latest, manifest.version):
            self._move_tag(api, repo, LATEST, commit.oid)
        for tag in tags or []:
            if tag != LATEST:
                self.set_tag(manifest.name, tag, manifest.version)
        n = len(manifest.all_files())
        return {"remote": self.name, "ref": manifest.ref, "uploaded": n if created else 0, "skipped": 0 if created else n,
                "bytes": sum(f.size for f in manifest.all_files()) if created else 0, "created": created,
                "attachments": sorted(attachments) if created else [], "notes": notes}

    def _check_attachments(self, zoo: "LocalZoo", manifest: Manifest) -> list[str]:
        """A version already on the Hub: its tag pins its commit, so nothing can be added to it
        (`attachments.reconcile`'s rule: a signature must be there as it is here; an unsigned
        version's BOM may differ or be missing, noted); the notes."""
        from zoo.registry.attachments import reconcile

        mine = zoo.attachments(manifest.name, manifest.version)
        if not mine:
            return []
        _, notes = reconcile(manifest.ref, f"remote {self.name}", mine,
                             self.read_attachments(manifest.name, manifest.version), can_add=False,
                             cannot_add="a Hub version's tag pins its commit, so attachments come only with its first push")
        return notes

    def _same_or_conflict(self, mine: Manifest, theirs: Manifest) -> None:
        if not same_content(mine, theirs):
            raise Conflict(f"{mine.ref} is already on remote {self.name} with different content",
                           hint="versions are immutable: bump the version")

    def _move_tag(self, api, repo: str, tag: str, commit: str) -> None:
        from huggingface_hub import errors as hfe

        where = self._where(self.endpoints[0])
        with contextlib.suppress(hfe.HfHubHTTPError, hfe.RevisionNotFoundError):
            api.delete_tag(repo, tag=tag)
        with _hf_errors(where, f"tag {repo} {tag}"):
            api.create_tag(repo, tag=tag, revision=commit)

    def set_tag(self, name: str, tag: str, version: str) -> None:
        check_tag(tag)
        ep = self.endpoints[0]
        versions, _ = self._refs(name, ep)
        if version not in versions:
            raise NotFound(f"{name}@{version} is not on remote {self.name}", hint=f"push it first: zoo push {name}@{version} --to {self.name}")
        self._move_tag(self._api(ep), self.repo_id(name), tag, versions[version])

    def remove(self, name: str, version: str, *, grace_s: float | None = None) -> dict:
        """Delete the version tag and the zoo tags on the same commit; git history keeps the files."""
        ep = self.endpoints[0]
        api = self._api(ep)
        versions, tags = self._refs(name, ep)
        if version not in versions:
            raise NotFound(f"{name}@{version} is not on remote {self.name}")
        with _hf_errors(self._where(ep), f"untag {name}@{version}"):
            api.delete_tag(self.repo_id(name), tag=version)
            for t, c in tags.items():
                if c == versions[version]:
                    api.delete_tag(self.repo_id(name), tag=t)
        return {"remote": self.name, "blobs_freed": 0, "bytes_freed": 0, "kept_young": 0,
                "note": "the Hub keeps every file in the repository's git history"}

    def gc(self, *, grace_s: float | None = None, dry_run: bool = False) -> dict:
        """Refused: the Hub keeps files in git history, there are no loose blobs to free."""
        raise no_gc(self)


def _card(manifest: Manifest, zoo: "LocalZoo") -> str:
    """README.md for the repo: YAML front matter the Hub reads, then the zoo card (or a summary)."""
    body = ""
    if manifest.card is not None:
        body = zoo.blobs.path(manifest.card.sha256).read_text(encoding="utf-8", errors="replace")
        if body.lstrip().startswith("---"):
            return body
    import yaml

    # emitted, never formatted: a license or task holding a newline must not add a key to the metadata
    meta = {"license": manifest.license if manifest.license != "unspecified" else "other", "library_name": "onnx",
            "tags": ["onnx", "zoo", *([manifest.task] if manifest.task else [])]}
    lines = ["---", *yaml.safe_dump(meta, sort_keys=False, allow_unicode=True, width=100).splitlines(), "---", ""]
    if not body:
        lines += [f"# {manifest.name} {manifest.version}", "", manifest.description, "", "| build | file | size |",
                  "| --- | --- | --- |"]
        lines += [f"| {b.name} | {b.file.path} | {b.file.size} |" for b in manifest.builds.values()]
    return "\n".join(lines) + "\n" + body
