"""`OciRemoteZoo`: an OCI registry (distribution, Harbor, GHCR, ECR, Artifactory…) as a remote zoo.

URL ``oci://HOST[:PORT]/PREFIX``; bytes through `zoo.storage.oci_client` (the distribution API).
Mapping, following the CNCF ModelPack model-spec (``artifactType``
``application/vnd.cncf.model.manifest.v1+json``) where it fits:

- one repository per model, ``PREFIX/NAME``;
- one OCI image manifest per version, tagged with the version (``1.2.0``; a semver build
  suffix's ``+``, which OCI tags cannot hold, is written ``_``, as Helm does: ``1.2.0+cu12`` is
  the tag ``1.2.0_cu12``); zoo tags (``latest``, ``prod``) are OCI tags on the same manifest;
- its ``config``: a ModelPack model config (``application/vnd.cncf.model.config.v1+json``:
  name, version, createdAt, licenses, description; ``config.format: onnx``; ``modelfs.diffIds``
  the layers' digests);
- its ``layers``: every file of the version, raw (one file, not a tar), its path in the
  ``org.cncf.model.filepath`` and ``org.opencontainers.image.title`` annotations; a build's
  ONNX file and external data are ``weight.v1.raw``, its other sidecars (genai_config.json,
  tokenizer files) ``weight.config.v1.raw``, test vectors ``dataset.v1.raw``, the card and the
  version-level files (lockfile, provenance) ``doc.v1.raw``; then the version's attachments
  (`zoo.registry.attachments`: ``bom.cdx.json`` as ``application/vnd.cyclonedx+json``,
  ``signature.sigstore.json`` as ``application/vnd.dev.sigstore.bundle.v0.3+json``), so they
  appear with the version and never after it (an attachment cannot be added to a version
  already published: its manifest's digest would change); then one layer
  ``application/vnd.zoo.manifest.v1+json``: zoo's own manifest, which is what zoo reads back
  (ModelPack has no place for ports, metrics, requirements or lineage); `_layers` builds the
  list, in one place;
- annotations: ``org.opencontainers.image.{title,version,created,description,licenses}`` and
  ``dev.zoo.{name,version,schema_version}`` (schema_version 1 of this mapping).

An OCI digest is the sha256 of the blob, the same as the manifest's FileRef.sha256, so every
file is fetched by its digest and verified against zoo's manifest (`zoo.download`, resumable
with Range requests). A version pushed by another client in ModelPack form (raw layers with
file paths, no zoo manifest layer) is read too: each ``.onnx`` weight layer becomes a build
(``cpu-fp32`` when it is the only one, else named after its file), the other weight files of
its folder its extra files, a README its card, the rest version-level files; what cannot map
(a tar layer, a layer without a path, an unsafe path, no ONNX weight) is refused naming the
repository, tag and problem. Everything read from a registry is bounded and validated.

Where it is weaker than the other remotes: the distribution API has no create-exclusive tag
write, so a push checks that the version tag is absent, writes the manifest, and reads the tag
back: of two publishers racing on one version with different bytes, the later write wins the
tag and the earlier writer gets a Conflict if it reads back after that write, but may report
success if it read back before (``exclusive_create = False``; what the registry serves is
always one complete version, and every pull verifies it). Removing a version deletes its
manifest by digest (the registry drops the tags on it; it must allow deletes:
``storage.delete.enabled``); its blobs are freed by the registry's own garbage collection,
so `gc` is refused. The remote run cache does not use OCI registries: its entries are created
create-exclusive and its objects would need a manifest each to survive the registry's garbage
collection (docs/zoo.md says what it would take).
"""

from __future__ import annotations

import json
import posixpath
import re
from typing import TYPE_CHECKING

from zoo.errors import AccessDenied, Conflict, InvalidInput, NotFound, SourceUnreachable, StorageError
from zoo.registry.codec import dump_manifest, load_manifest, same_content, utc_now
from zoo.registry.index import VersionInfo
from zoo.registry.manifest import MANIFEST_FILE, FileRef, Manifest
from zoo.registry.refs import LATEST, Ref, check_name, check_tag, is_version, latest_of, moves_latest, version_key
from zoo.registry.remote import RemoteZoo, fetch_blob

if TYPE_CHECKING:
    from zoo.registry.blobs import BlobStore
    from zoo.registry.config import RemoteConfig
    from zoo.registry.store import LocalZoo
    from zoo.storage.oci_client import OciClient

MAPPING_SCHEMA_VERSION = 1
ARTIFACT_TYPE = "application/vnd.cncf.model.manifest.v1+json"
MODEL_CONFIG = "application/vnd.cncf.model.config.v1+json"
WEIGHT = "application/vnd.cncf.model.weight.v1.raw"
WEIGHT_CONFIG = "application/vnd.cncf.model.weight.config.v1.raw"
DOC = "application/vnd.cncf.model.doc.v1.raw"
CODE = "application/vnd.cncf.model.code.v1.raw"
DATASET = "application/vnd.cncf.model.dataset.v1.raw"
ZOO_MANIFEST = "application/vnd.zoo.manifest.v1+json"
# the version's attachments (zoo.registry.attachments), layers under their own names
ATTACHMENT_TYPES = {"bom.cdx.json": "application/vnd.cyclonedx+json",
                    "signature.sigstore.json": "application/vnd.dev.sigstore.bundle.v0.3+json"}
RAW_TYPES = (WEIGHT, WEIGHT_CONFIG, DOC, CODE, DATASET)
FILEPATH = "org.cncf.model.filepath"
TITLE = "org.opencontainers.image.title"
ZOO_NAME, ZOO_VERSION, ZOO_SCHEMA = "dev.zoo.name", "dev.zoo.version", "dev.zoo.schema_version"
WEIGHT_SUFFIXES = (".onnx", ".ort", ".data", ".onnx_data", ".bin", ".pb", ".xml", ".safetensors")
MAX_LAYERS = 10_000
MAX_TEXT = 10_000  # characters of a description or name read from a stranger's config


def oci_tag(version: str) -> str:
    """The OCI tag of a version (``+`` → ``_``: OCI tags hold no ``+``)."""
    return version.replace("+", "_")


def version_of_tag(tag: str) -> str | None:
    """The version an OCI tag names, or None for any other tag (versions never hold ``_``)."""
    v = tag.replace("_", "+")
    return v if is_version(v) else None


class _Layer:
    """One layer to push: its descriptor, and where its bytes are (a local blob, or bytes)."""

    def __init__(self, media_type: str, sha256: str, size: int, path: str | None = None, *, local=None,
                 data: bytes | None = None, counted: bool = True):
        self.media_type, self.sha256, self.size, self.path = media_type, sha256, size, path
        self.local, self.data, self.counted = local, data, counted

    def descriptor(self) -> dict:
        d: dict = {"mediaType": self.media_type, "digest": f"sha256:{self.sha256}", "size": self.size}
        if self.path is not None:
            d["annotations"] = {FILEPATH: self.path, TITLE: self.path}
        return d


def _blob(media_type: str, data: bytes, path: str | None = None) -> _Layer:
    import hashlib

    return _Layer(media_type, hashlib.sha256(data).hexdigest(), len(data), path, data=data, counted=False)


def media_type_of(manifest: Manifest, ref: FileRef) -> str:
    """The ModelPack media type of a file of the version (module docstring)."""
    for build in manifest.builds.values():
        if ref.path == build.file.path:
            return WEIGHT
        if any(ref.path == f.path for f in build.test_vectors):
            return DATASET
        if any(ref.path == f.path for f in build.extra_files):
            return WEIGHT if ref.path.lower().endswith(WEIGHT_SUFFIXES) else WEIGHT_CONFIG
    return DOC


class OciRemoteZoo(RemoteZoo):
    """Models as repositories under one prefix of an OCI registry, with optional mirrors (other
    ``oci://`` locations holding the same repositories)."""

    exclusive_create = False  # module docstring: check, write, read back

    def __init__(self, config: "RemoteConfig"):
        from zoo.storage.oci_client import OciClient, parse_oci_url

        self.name = config.name
        self.config = config
        host, self.prefix = parse_oci_url(config.url)
        self.primary = OciClient(host, config.options)
        self.mirrors: list[tuple["OciClient", str]] = []
        for url in config.mirrors:
            mhost, mprefix = parse_oci_url(url)
            self.mirrors.append((OciClient(mhost, config.options), mprefix))
        self._dead: set[str] = set()

    # ---- where ----------------------------------------------------------------------------
    def repo(self, name: str, prefix: str | None = None) -> str:
        from zoo.storage.oci_client import REPO_RE

        prefix = self.prefix if prefix is None else prefix
        repo = f"{prefix}/{check_name(name)}" if prefix else check_name(name)
        if not REPO_RE.fullmatch(repo) or len(repo) > 255:
            raise InvalidInput(f"model name {name!r} cannot be a repository name in an OCI registry",
                               hint="OCI repository names hold lower-case letters and digits separated by one "
                                    "'.', '_', '__' or dashes; rename the model")
        return repo

    def _locations(self) -> list[tuple["OciClient", str]]:
        every = [(self.primary, self.prefix), *self.mirrors]
        return [loc for loc in every if loc[0].host not in self._dead] or every

    def _first(self, fn):
        """fn(client, prefix) on the primary, then mirrors while one is unreachable or refuses."""
        failed: SourceUnreachable | AccessDenied | None = None
        for client, prefix in self._locations():
            try:
                return fn(client, prefix)
            except (SourceUnreachable, AccessDenied) as e:
                self._dead.add(client.host)
                failed = e if failed is None or isinstance(e, AccessDenied) else failed
        assert failed is not None
        raise failed

    # ---- reading a version ----------------------------------------------------------------
    def _oci_manifest(self, client: "OciClient", repo: str, reference: str) -> tuple[dict, bytes, str] | None:
        """(parsed, bytes, media type) of the image manifest at `reference`, validated; None when absent."""
        got = client.get_manifest(repo, reference)
        if got is None:
            return None
        data, _, media_type = got
        where = f"remote {self.name}: {client.host}/{repo}:{reference}"
        try:
            obj = json.loads(data)
        except (ValueError, RecursionError) as e:
            from zoo.registry.codec import json_problem

            raise StorageError(f"{where}: the manifest is not valid JSON ({json_problem(e)})") from None
        if not isinstance(obj, dict):
            raise StorageError(f"{where}: the manifest is not a JSON object")
        kind = obj.get("mediaType") or media_type
        if kind in ("application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json"):
            raise InvalidInput(f"{where} is an image index (several manifests), not one model version",
                               hint="zoo reads a version as one OCI image manifest")
        layers = obj.get("layers")
        if obj.get("schemaVersion") != 2 or not isinstance(layers, list) or len(layers) > MAX_LAYERS:
            raise StorageError(f"{where}: not an OCI image manifest (schemaVersion 2 with at most {MAX_LAYERS} layers)")
        for d in [obj.get("config"), *layers]:
            _check_descriptor(d, where)
        return obj, data, media_type or kind or ""

    def _read_version(self, client: "OciClient", prefix: str, name: str, reference: str) -> Manifest | None:
        """The zoo manifest of `name` at OCI tag `reference`; None when the tag is not there."""
        repo = self.repo(name, prefix)
        found = self._oci_manifest(client, repo, reference)
        if found is None:
            return None
        obj = found[0]
        where = f"remote {self.name}: {repo}:{reference}"
        zoo_layers = [d for d in obj["layers"] if d["mediaType"] == ZOO_MANIFEST]
        if len(zoo_layers) > 1:
            raise StorageError(f"{where}: more than one zoo manifest layer")
        if zoo_layers:
            data = _verified_blob(client, repo, zoo_layers[0], where)
            m = load_manifest(data, where)
        else:
            m = self._from_modelpack(client, repo, reference, obj, name, where)
        wanted = version_of_tag(reference)
        if m.name != name or (wanted is not None and m.version != wanted):
            raise StorageError(f"{where}: the version stored there describes {m.ref}",
                               hint="the registry is corrupt or was written by hand; ask its maintainer to retag it")
        return m

    def _from_modelpack(self, client: "OciClient", repo: str, reference: str, obj: dict, name: str, where: str) -> Manifest:
        """A zoo manifest for a ModelPack artifact pushed by another client (module docstring)."""
        version = version_of_tag(reference)
        if version is None:  # read by a zoo tag: the version tag on the same manifest
            digest = client.manifest_digest(repo, reference)
            version = next((v for v, d in self._version_digests(client, repo).items() if d == digest), None)
            if version is None:
                raise NotFound(f"{where}: the tag points at no version tag",
                               hint="tag the artifact with its version (MAJOR.MINOR.PATCH) too")
        desc: dict = {}
        if obj["config"]["mediaType"] == MODEL_CONFIG:
            try:
                cfg = json.loads(_verified_blob(client, repo, obj["config"], where))
            except (ValueError, RecursionError):
                raise StorageError(f"{where}: the model config is not valid JSON") from None
            desc = cfg.get("descriptor") if isinstance(cfg, dict) and isinstance(cfg.get("descriptor"), dict) else {}
        files: list[dict] = []
        for d in obj["layers"]:
            path = (d.get("annotations") or {}).get(FILEPATH) or (d.get("annotations") or {}).get(TITLE)
            if d["mediaType"] in ATTACHMENT_TYPES.values():
                continue  # read by read_attachments
            if d["mediaType"] not in RAW_TYPES:
                raise InvalidInput(f"{where}: layer {d['digest'][:19]} has media type {d['mediaType']!r}; zoo maps "
                                   "raw ModelPack layers only (one file each, not a tar archive)",
                                   hint="push each file as its own raw layer (…weight.v1.raw, …doc.v1.raw)")
            if not isinstance(path, str) or not path:
                raise InvalidInput(f"{where}: layer {d['digest'][:19]} has no file path ({FILEPATH})",
                                   hint=f"annotate every layer with {FILEPATH}")
            if path == MANIFEST_FILE or any(f["path"] == path for f in files):
                raise InvalidInput(f"{where}: the file path {path!r} comes twice or is zoo's own manifest's",
                                   hint="every layer a file path of its own")
            files.append({"path": path, "sha256": d["digest"][len("sha256:"):], "size": d["size"], "type": d["mediaType"]})
        onnx = [f for f in files if f["type"] == WEIGHT and f["path"].lower().endswith(".onnx")]
        if not onnx:
            raise InvalidInput(f"{where}: no ONNX weight layer (a {WEIGHT} layer whose path ends in .onnx)",
                               hint="zoo serves ONNX models; push the .onnx file as a weight layer")
        builds: dict[str, dict] = {}
        claimed: set[str] = set()
        for f in onnx:
            bname = "cpu-fp32" if len(onnx) == 1 else _build_name(f["path"], builds)
            folder = posixpath.dirname(f["path"])
            extra = [g for g in files if g is not f and g["type"] in (WEIGHT, WEIGHT_CONFIG)
                     and not g["path"].lower().endswith(".onnx") and posixpath.dirname(g["path"]) == folder]
            claimed.update(g["path"] for g in [f, *extra])
            builds[bname] = {"name": bname, "file": _ref(f), "extra_files": [_ref(g) for g in extra]}
        rest = [f for f in files if f["path"] not in claimed]
        card = next((f for f in rest if f["type"] == DOC and posixpath.basename(f["path"]).lower() == "readme.md"), None)
        licenses = desc.get("licenses")
        raw = {"name": name, "version": version, "builds": builds,
               "description": _text(desc.get("description")) or _text(desc.get("title")),
               "license": " AND ".join(_text(x) for x in licenses if isinstance(x, str)) if isinstance(licenses, list) and licenses else "unspecified",
               "created": _text(desc.get("createdAt")) or None,
               "card": _ref(card) if card else None,
               "files": [_ref(f) for f in rest if f is not card],
               "extra": {"oci": {"form": "modelpack"}}}
        return load_manifest(json.dumps(raw), f"{where} (a ModelPack artifact)")

    def _version_digests(self, client: "OciClient", repo: str) -> dict[str, str]:
        """version -> manifest digest, from the repository's version tags."""
        out = {}
        for t in client.tags(repo):
            v = version_of_tag(t)
            if v is not None:
                d = client.manifest_digest(repo, t)
                if d is not None:
                    out[v] = d
        return out

    def _tag_map(self, client: "OciClient", repo: str) -> tuple[list[str], dict[str, str]]:
        """(versions, zoo tag -> version) of a repository: a zoo tag is an OCI tag on the same
        manifest as a version tag (other OCI tags are not zoo's and are left out)."""
        from zoo.registry.refs import TAG_RE

        all_tags = client.tags(repo)
        digests: dict[str, str] = {}
        for t in all_tags:
            v = version_of_tag(t)
            if v is not None:
                d = client.manifest_digest(repo, t)
                if d is not None:
                    digests[v] = d
        by_digest = {d: v for v, d in sorted(digests.items(), key=lambda kv: version_key(kv[0]))}
        tags = {}
        for t in all_tags:
            if version_of_tag(t) is None and re.fullmatch(TAG_RE, t):
                d = client.manifest_digest(repo, t)
                if d in by_digest:
                    tags[t] = by_digest[d]
        return sorted(digests, key=version_key, reverse=True), tags

    # ---- reads ----------------------------------------------------------------------------
    def resolve(self, ref: Ref) -> Manifest:
        reference = oci_tag(ref.version) if ref.version is not None else ref.tag
        try:
            repo = self.repo(ref.name)
        except InvalidInput:
            raise NotFound(f"no model called {ref.name!r} on remote {self.name}") from None
        m = self._first(lambda c, p: self._read_version(c, p, ref.name, reference))
        if m is None and ref.tag == LATEST:
            # another client pushed version tags only (ModelPack, KitOps): `latest` is where zoo's would be
            versions = self._first(lambda c, p: self._tag_map(c, self.repo(ref.name, p))[0])
            top = latest_of(versions)
            if top is not None:
                m = self._first(lambda c, p: self._read_version(c, p, ref.name, oci_tag(top)))
        if m is None:
            raise self._not_found(ref, repo)
        return m

    def _not_found(self, ref: Ref, repo: str) -> NotFound:
        versions, tags = self._first(lambda c, p: self._tag_map(c, self.repo(ref.name, p)))
        if versions:
            have = versions[:5] + sorted(tags)
            return NotFound(f"{ref} is not on remote {self.name}", hint=f"{ref.name} has: {', '.join(have)}")
        import difflib

        try:
            names = self._model_names()
        except (StorageError, InvalidInput):
            names = []  # a registry that does not list its catalog (GHCR): no suggestion
        close = difflib.get_close_matches(ref.name, names, n=3)
        return NotFound(f"no model called {ref.name!r} on remote {self.name} (no repository {repo})",
                        hint=f"did you mean {', '.join(close)}?" if close else f"run `zoo list --remote {self.name}`")

    def _model_names(self) -> list[str]:
        def get(client, prefix):
            start = f"{prefix}/" if prefix else ""
            out = []
            for repo in client.catalog():
                rest = repo[len(start):] if repo.startswith(start) else None
                if rest and "/" not in rest:
                    try:
                        out.append(check_name(rest))
                    except InvalidInput:
                        continue  # not a zoo model's repository
            return sorted(out)

        try:
            return self._first(get)
        except AccessDenied as e:  # GHCR and others refuse /v2/_catalog whatever the credentials
            raise AccessDenied(e.message, hint=f"{e.hint}; some registries never list their repositories (the "
                                               "catalog API): list one model with `zoo list NAME --remote …`, or pull "
                                               "it by name") from e

    def list(self, name: str | None = None) -> list[VersionInfo]:
        out = []
        for model in [check_name(name)] if name else self._model_names():
            def get(client, prefix, model=model):
                repo = self.repo(model, prefix)
                versions, tags = self._tag_map(client, repo)
                rows = []
                for v in versions:
                    m = self._read_version(client, prefix, model, oci_tag(v))
                    if m is not None:
                        rows.append(VersionInfo(model, v, m.created, m.task, m.description, m.license, sorted(m.builds),
                                                sorted(t for t, tv in tags.items() if tv == v)))
                return rows
            out += self._first(get)
        return out

    def tags(self, name: str) -> dict[str, str]:
        versions, tags = self._first(lambda c, p: self._tag_map(c, self.repo(name, p)))
        if versions and LATEST not in tags:
            tags[LATEST] = latest_of(versions)  # as `resolve` reads it (version tags only, pushed by another client)
        return tags

    def fetch(self, manifest: Manifest, ref: FileRef, blobs: "BlobStore") -> None:
        from zoo.download import Source

        def source(client: "OciClient", prefix: str) -> Source:
            repo = self.repo(manifest.name, prefix)

            def open_from(offset: int):
                try:
                    yield from client.iter_from(f"{repo}@sha256:{ref.sha256}", offset, ref.size)
                except SourceUnreachable:
                    self._dead.add(client.host)
                    raise
            return Source(f"{client.host}/{repo}", open_from)

        fetch_blob(blobs, ref, [source(c, p) for c, p in self._locations()], f"{manifest.ref}: {ref.path}")

    def read_attachments(self, name: str, version: str) -> dict[str, bytes]:
        from zoo.registry.refs import check_version

        check_version(version)
        try:
            self.repo(name)
        except InvalidInput:  # no such repository can exist
            return {}
        return self._first(lambda c, p: self._attachments_at(c, self.repo(name, p), oci_tag(version)))

    def _attachments_at(self, client: "OciClient", repo: str, reference: str) -> dict[str, bytes]:
        """The attachment layers of the manifest at `reference`, verified and checked; {} when absent."""
        from zoo.registry.attachments import MAX_BYTES, check

        found = self._oci_manifest(client, repo, reference)
        if found is None:
            return {}
        where = f"remote {self.name}: {repo}:{reference}"
        out = {}
        for d in found[0]["layers"]:
            if d["mediaType"] in ATTACHMENT_TYPES.values():
                n = (d.get("annotations") or {}).get(FILEPATH, "")
                check(n, b"", where)  # a known name, before any byte is read
                if ATTACHMENT_TYPES[n] != d["mediaType"] or n in out:
                    raise StorageError(f"{where}: attachment layer {n} has media type {d['mediaType']} or comes twice")
                data = _verified_blob(client, repo, d, where, limit=MAX_BYTES)
                check(n, data, where)
                out[n] = data
        return out

    # ---- writes (primary only) --------------------------------------------------------------
    def push(self, zoo: "LocalZoo", manifest: Manifest, tags: list[str] | None = None) -> dict:
        from zoo.registry.remote import push_cut_off

        self._visible = False
        try:
            return self._push(zoo, manifest, tags or [])
        except StorageError as e:
            raise push_cut_off(e, manifest.ref, self.name, self._visible) from e

    def _push(self, zoo: "LocalZoo", manifest: Manifest, tags: list[str]) -> dict:
        repo = self.repo(manifest.name)
        vtag = oci_tag(manifest.version)
        from zoo.storage.oci_client import TAG_RE

        if not TAG_RE.fullmatch(vtag):
            raise InvalidInput(f"version {manifest.version} cannot be an OCI tag (at most 128 characters)")
        for t in tags:
            self._check_zoo_tag(t)
        missing = zoo.missing(manifest.all_files())
        if missing:
            raise NotFound(f"{manifest.ref}: {len(missing)} file(s) are not in the local zoo (e.g. {missing[0].path})",
                           hint=f"pull every build first: `zoo pull {manifest.ref} --build …` for each build")
        c = self.primary
        existing = self._read_version(c, self.prefix, manifest.name, vtag)
        self._visible = existing is not None
        if existing is not None and not same_content(existing, manifest):
            raise Conflict(f"{manifest.ref} is already on remote {self.name} with different content",
                           hint="versions are immutable: bump the version")
        uploaded = nbytes = 0
        created = False
        attachments = zoo.attachments(manifest.name, manifest.version)
        if existing is None:
            if manifest.created is None:
                manifest = manifest.model_copy(update={"created": utc_now()})
            extra = [(n, data, ATTACHMENT_TYPES[n]) for n, data in sorted(attachments.items())]
            layers = self._layers(zoo, manifest, extra)
            uploaded, nbytes = self._upload_missing(zoo, manifest, repo, layers)
            body = self._image_manifest(manifest, layers)
            self._visible = None  # cut off during the write, the registry may or may not have it
            try:
                c.put_manifest(repo, vtag, body)
            except StorageError as e:
                # a registry with immutable tags (Harbor's, ECR's tag immutability) refuses to move a
                # tag a concurrent publisher wrote first: what is there decides, as below
                if type(e) is not StorageError or c.manifest_digest(repo, vtag) is None:
                    raise
            self._visible = True
            import hashlib

            ours = "sha256:" + hashlib.sha256(body).hexdigest()
            if c.manifest_digest(repo, vtag) == ours:  # read back: no create-exclusive write (module docstring)
                created = True
            else:
                theirs = self._read_version(c, self.prefix, manifest.name, vtag)
                if theirs is None or not same_content(theirs, manifest):
                    raise Conflict(f"{manifest.ref} was published to remote {self.name} concurrently with different content",
                                   hint="versions are immutable: bump the version")
                manifest = theirs
        else:
            manifest = existing
        notes = [] if created else self._same_attachments(repo, vtag, manifest, attachments)
        self._finish_publish(manifest, tags)
        n = len({f.sha256 for f in manifest.all_files()})
        return {"remote": self.name, "ref": manifest.ref, "uploaded": uploaded, "skipped": n - min(uploaded, n),
                "bytes": nbytes, "created": created, "attachments": sorted(attachments) if created else [],
                "notes": notes}

    def _same_attachments(self, repo: str, vtag: str, manifest: Manifest, local: dict[str, bytes]) -> list[str]:
        """A version already on the registry (theirs, or there before): nothing can be added to it,
        by `attachments.reconcile`'s rule (a signature must be there as it is here; an unsigned
        version's BOM may differ or be missing, noted); the notes."""
        from zoo.registry.attachments import reconcile

        if not local:
            return []
        _, notes = reconcile(manifest.ref, f"remote {self.name}", local, self._attachments_at(self.primary, repo, vtag),
                             can_add=False, cannot_add="an OCI version's attachments are layers of its manifest, "
                                                       "which cannot change once it is published")
        return notes

    def _layers(self, zoo: "LocalZoo", manifest: Manifest, extra: list[tuple[str, bytes, str]] | None = None) -> list[_Layer]:
        """Every layer of the version's OCI manifest, in order: its files, then `extra` items
        (path, bytes, media type: files carried beside the manifest), then zoo's manifest."""
        layers = [_Layer(media_type_of(manifest, f), f.sha256, f.size, f.path, local=zoo.blobs.path(f.sha256))
                  for f in manifest.all_files()]
        layers += [_blob(media_type, data, path) for path, data, media_type in extra or []]
        layers.append(_blob(ZOO_MANIFEST, dump_manifest(manifest), MANIFEST_FILE))
        return layers

    def _image_manifest(self, manifest: Manifest, layers: list[_Layer]) -> bytes:
        """The version's OCI image manifest (its config blob was uploaded with the layers)."""
        config = self._model_config(manifest, layers)
        notes = {TITLE: manifest.name, "org.opencontainers.image.version": manifest.version,
                 "org.opencontainers.image.created": manifest.created or "",
                 "org.opencontainers.image.description": manifest.description[:1000],
                 ZOO_NAME: manifest.name, ZOO_VERSION: manifest.version, ZOO_SCHEMA: str(MAPPING_SCHEMA_VERSION)}
        if manifest.license and manifest.license != "unspecified":
            notes["org.opencontainers.image.licenses"] = manifest.license
        obj = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
               "artifactType": ARTIFACT_TYPE, "config": config.descriptor() | {"mediaType": MODEL_CONFIG},
               "layers": [layer.descriptor() for layer in layers], "annotations": notes}
        return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()

    def _model_config(self, manifest: Manifest, layers: list[_Layer]) -> _Layer:
        desc = {"name": manifest.name, "version": manifest.version, "description": manifest.description}
        if manifest.created:
            desc["createdAt"] = manifest.created
        if manifest.license and manifest.license != "unspecified":
            desc["licenses"] = [manifest.license]
        precisions = sorted({b.precision for b in manifest.builds.values()})
        cfg = {"descriptor": desc, "config": {"format": "onnx", **({"precision": precisions[0]} if len(precisions) == 1 else {})},
               "modelfs": {"type": "layers", "diffIds": [f"sha256:{layer.sha256}" for layer in layers]}}
        layer = _blob(MODEL_CONFIG, json.dumps(cfg, sort_keys=True, separators=(",", ":")).encode())
        layer.path = None
        return layer

    def _upload_missing(self, zoo: "LocalZoo", manifest: Manifest, repo: str, layers: list[_Layer]) -> tuple[int, int]:
        """Upload the blobs the repository lacks (the version's files first, then zoo's own and
        the config); (files, bytes) of the version's files sent."""
        from zoo.errors import IntegrityError
        from zoo.files import sha256_and_size

        c = self.primary
        uploaded = nbytes = 0
        done: set[str] = set()
        for layer in [*layers, self._model_config(manifest, layers)]:
            if layer.sha256 in done:
                continue
            done.add(layer.sha256)
            digest = f"sha256:{layer.sha256}"
            if c.blob_size(repo, digest) == layer.size:  # resumes an interrupted push: only what is missing goes up
                continue
            if layer.data is not None:
                c.put_bytes(repo, digest, layer.data)
                continue
            if sha256_and_size(layer.local) != (layer.sha256, layer.size):
                raise IntegrityError(f"local blob of {manifest.ref}: {layer.path} is corrupt; refusing to upload it",
                                     hint=f"`zoo rm {manifest.ref}` and pull or publish it again")
            c.put_file(layer.local, f"{repo}@{digest}")
            if layer.counted:
                uploaded += 1
                nbytes += layer.size
        return uploaded, nbytes

    def _finish_publish(self, manifest: Manifest, tags: list[str]) -> None:
        """Move `latest` if this version is the newest (a retry after a cut-off push does it too), set `tags`."""
        repo = self.repo(manifest.name)
        versions, current = self._tag_map(self.primary, repo)
        if moves_latest(current.get(LATEST), manifest.version):
            self._point(repo, LATEST, manifest.version)
        for tag in tags:
            if tag != LATEST:
                self._point(repo, tag, manifest.version)

    def _point(self, repo: str, tag: str, version: str) -> None:
        """Tag the manifest of `version` with `tag` too (the same bytes under another tag: one digest)."""
        got = self.primary.get_manifest(repo, oci_tag(version))
        if got is None:
            raise NotFound(f"{repo}:{oci_tag(version)} is not on remote {self.name}")
        self.primary.put_manifest(repo, tag, got[0], got[2] or "application/vnd.oci.image.manifest.v1+json")

    def _check_zoo_tag(self, tag: str) -> str:
        check_tag(tag)
        if version_of_tag(tag) is not None:
            raise InvalidInput(f"tag {tag!r} reads as version {version_of_tag(tag)} on an OCI remote ('_' stands for '+')",
                               hint="choose a tag name that is not a version with '_'")
        return tag

    def set_tag(self, name: str, tag: str, version: str) -> None:
        self._check_zoo_tag(tag)
        repo = self.repo(name)
        if self.primary.manifest_digest(repo, oci_tag(version)) is None:
            raise NotFound(f"{name}@{version} is not on remote {self.name}", hint=f"push it first: zoo push {name}@{version} --to {self.name}")
        self._point(repo, tag, version)

    def remove(self, name: str, version: str, *, grace_s: float | None = None) -> dict:
        """Delete the version's manifest by digest (the registry drops every tag on it), then point
        `latest` at the newest remaining version if it was on this one."""
        c = self.primary
        repo = self.repo(name)
        digest = c.manifest_digest(repo, oci_tag(version))
        if digest is None:
            raise NotFound(f"{name}@{version} is not on remote {self.name}")
        c.delete_manifest(repo, digest)
        versions, tags = self._tag_map(c, repo)
        if versions and LATEST not in tags:
            self._point(repo, LATEST, latest_of(versions))
        return {"remote": self.name, "blobs_freed": 0, "bytes_freed": 0, "kept_young": 0,
                "note": "the registry frees the blobs by its own garbage collection"}

    def gc(self, *, grace_s: float | None = None, dry_run: bool = False) -> dict:
        """Refused: an OCI registry frees unreferenced blobs by its own garbage collection."""
        raise InvalidInput(f"remote {self.name} is an OCI registry: its blobs are freed by the registry's own "
                           "garbage collection, not by zoo",
                           hint="run the registry's garbage collection once versions are removed "
                                "(distribution: `registry garbage-collect CONFIG.yml`; hosted registries: their "
                                "retention policies)")


def _check_descriptor(d, where: str) -> None:
    """A stranger's OCI descriptor: the fields zoo uses, of the right types and bounds."""
    from zoo.manifest import MAX_INT
    from zoo.storage.oci_client import DIGEST_RE

    if not isinstance(d, dict):
        raise StorageError(f"{where}: a descriptor is not a JSON object")
    ok = (isinstance(d.get("mediaType"), str) and len(d["mediaType"]) <= 255 and isinstance(d.get("digest"), str)
          and DIGEST_RE.fullmatch(d["digest"]) is not None and isinstance(d.get("size"), int)
          and not isinstance(d.get("size"), bool) and 0 <= d["size"] <= MAX_INT)
    notes = d.get("annotations")
    if notes is not None and not (isinstance(notes, dict) and all(isinstance(k, str) and isinstance(v, str)
                                                                  for k, v in notes.items())):
        ok = False
    if not ok:
        raise StorageError(f"{where}: a descriptor is malformed (mediaType, a sha256 digest, a size, string annotations)",
                           hint="zoo reads sha256 digests only")


def _verified_blob(client: "OciClient", repo: str, d: dict, where: str, limit: int | None = None) -> bytes:
    import hashlib

    from zoo.errors import IntegrityError
    from zoo.storage.oci_client import MAX_JSON_BYTES

    limit = MAX_JSON_BYTES if limit is None else limit
    if d["size"] > limit:
        raise StorageError(f"{where}: {d['mediaType']} of {d['size']} bytes is more than zoo reads of it ({limit >> 20} MiB)")
    data = client.read_blob(repo, d["digest"], limit)
    if data is None:
        raise StorageError(f"{where}: blob {d['digest'][:19]} ({d['mediaType']}) is missing from the registry")
    if "sha256:" + hashlib.sha256(data).hexdigest() != d["digest"] or len(data) != d["size"]:
        raise IntegrityError(f"{where}: checksum mismatch for {d['mediaType']} blob {d['digest'][:19]}",
                             hint="the registry served other bytes than the manifest names; nothing was installed")
    return data


def _ref(f: dict) -> dict:
    return {"path": f["path"], "sha256": f["sha256"], "size": f["size"]}


def _text(value) -> str:
    return value[:MAX_TEXT] if isinstance(value, str) else ""


def _build_name(path: str, taken: dict) -> str:
    stem = posixpath.splitext(posixpath.basename(path))[0].lower()
    base = re.sub(r"[^a-z0-9._-]+", "-", stem).strip("-._") or "build"
    if not base[0].isalnum():
        base = f"b{base}"
    name, i = base, 2
    while name in taken:
        name, i = f"{base}-{i}", i + 1
    return name
