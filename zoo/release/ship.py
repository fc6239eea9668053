"""`zoo release RECIPE --version X.Y.Z --to REMOTE [--tag T]`: ship a recipe's version to a remote zoo.

    from zoo.release.ship import release
    r = release("recipes/lenet-digits.yaml", version="1.0.0", to="prod-s3", tags=["prod"])
    print(r.ref, "created" if r.created else "already there", r.builds)

Steps, each refusing rather than guessing:

1. ``--version`` must equal the recipe's ``version:`` (the lockfile records it, so the recipe
   stays the truth): InvalidInput (exit 2) otherwise.
2. The recipe runs with ``frozen=True`` (zoo/engine/frozen.py): stages missing from the cache are
   built (an empty cache builds everything), and each result is compared with the lockfile's
   record of the platform class that built it; a lockfile that would change is refused with the
   diff, naming the differing output digests (LockOutOfDate, exit 1), unless ``allow_stale_lock``
   (then a normal run updates the lock). The run stops at the first difference, so no stage
   after it runs or publishes. Cached stages do not rerun. Every gate of the stages whose kind checks gates
   (`StageKind.gates`, e.g. verify) must pass; a failing gate or stage fails the release (its
   exit code) and nothing is published.
3. The one stage whose kind publishes the version (`StageKind.release_output`, e.g. deploy with
   ``publish: true``) published it to the local zoo (if that stage was cached and this zoo lacks
   the version, its cached release folder is published). The local version must hold exactly
   the files of the release folder the lockfile pins (Conflict), carry the files its kind
   requires (``release_files``: deploy's ``zoo.lock`` and ``provenance.intoto.json``), and pass
   the kind's `check_release` (deploy: the statement's subjects are the builds) (IntegrityError).
4. The version has its bill of materials (`LocalZoo.ensure_bom`: made now for a version published
   before BOMs existed), an attachment that is pushed (and signed) with it.
5. With a signing key (``sign``, else ``signing.key`` in the user's ``$ZOO_HOME/config.yaml``; never
   a project's), the local version is signed (zoo.registry.signing: its manifest, every file's
   digest, its other attachments, the BOM among them) and the signature kept as its attachment,
   which the push carries before the manifest, so the version never shows unsigned on the remote.
6. The version is pushed to the remote: blobs first, the manifest last and create-exclusive,
   so it appears atomically or not at all. The same bytes already there: a no-op; different
   bytes under the same version: Conflict (exit 3). Then the tags move, on the remote and locally.

The engine names no kind here: what it needs of the stages it asks their kinds (zoo/stage.py).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from zoo.engine import kind_loader
from zoo.errors import Conflict, GateFailed, IntegrityError, InvalidInput, LockOutOfDate, StageFailed, StorageError, ZooError


@dataclass
class ReleaseResult:
    """What `release` did. ``created`` is False when the remote already held these exact bytes."""

    name: str
    version: str
    remote: str
    tags: list[str]
    recipe: str
    executed: list[str] = field(default_factory=list)
    cached: list[str] = field(default_factory=list)
    lock_changed: bool = False
    created: bool = False
    uploaded: int = 0
    skipped: int = 0
    bytes: int = 0
    builds: dict[str, str] = field(default_factory=dict)  # build -> sha256 of its model file
    files: dict[str, str] = field(default_factory=dict)  # version-level file (zoo.lock...) -> sha256
    gates: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    signature: dict[str, Any] | None = None  # who signed it (zoo.registry.signing.Verdict), None when unsigned
    attachments: list[str] = field(default_factory=list)  # attachments this push stored (signature, BOM)

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}"

    @property
    def noop(self) -> bool:
        """Nothing ran, nothing was uploaded, the remote already had this version."""
        return not self.executed and not self.created and self.uploaded == 0

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": 1, "ref": self.ref, "noop": self.noop, **asdict(self)}


def release(recipe: str | Path, *, version: str, to: str, tags: Iterable[str] = (), allow_stale_lock: bool = False,
            cache_dir: str | Path | None = None, jobs: int = 1, zoo: Any = None,
            on_update: Callable[[Any], None] | None = None, sign: Any = None) -> ReleaseResult:
    """Run `recipe` under its lockfile, check its gates, sign the version (`sign`: a
    `zoo.registry.signing.Signer`, else the user's ``signing.key``), publish it to remote `to`, tag it."""
    from zoo.engine import pipeline
    from zoo.registry.config import RemotesConfig
    from zoo.registry.refs import LATEST, check_tag, check_version
    from zoo.registry.store import LocalZoo
    from zoo.engine.runner import StageState

    dag = pipeline.load(recipe)
    check_version(version)
    if version != dag.recipe.version:
        raise InvalidInput(f"--version {version} does not match the recipe's version {dag.recipe.version} "
                           f"({dag.recipe.path.name})",
                           hint=f"set `version: {version}` in {dag.recipe.path.name} and run `zoo run "
                                f"{dag.recipe.path.name}` so the lockfile records it, then release again")
    tags = list(dict.fromkeys(tags))
    for tag in tags:
        check_tag(tag)
        if tag == LATEST:
            raise InvalidInput("`latest` cannot be set by hand: it follows the highest version",
                               hint="use another tag name, e.g. --tag prod")
    publisher_id, release_output = _publishing_stage(dag)
    signer = sign if sign is not None else user_signer()
    if signer is not None:
        from zoo.registry.signing import check_signer

        check_signer(signer)  # a key that cannot sign fails before anything runs
    zoo = zoo or LocalZoo()
    remote = RemotesConfig(zoo.root).get(to)  # an unknown or read-only remote fails before anything runs
    if remote.read_only:
        raise InvalidInput(f"remote {to} ({remote.url}) is read-only: a release cannot be published there",
                           hint="release to a writable remote (folder, s3://, webdav+https://, hf://, oci://)")

    try:
        result = pipeline.run(dag, cache_dir=cache_dir, jobs=jobs, frozen=not allow_stale_lock, on_update=on_update)
    except LockOutOfDate as e:
        raise LockOutOfDate(e.message.replace("--frozen: ", "", 1) + "\nnothing was released",
                                hint=f"run `zoo run {dag.recipe.path.name}` and commit the updated lockfile, "
                                     "or pass --allow-stale-lock to release what the recipe builds now") from None
    if not result.ok:
        raise _stage_failure(result, to)
    out = ReleaseResult(name=dag.recipe.name, version=version, remote=to, tags=tags, recipe=str(dag.recipe.path),
                        executed=[s.id for s in result.stages if s.state == StageState.RAN],
                        cached=[s.id for s in result.stages if s.state == StageState.CACHED],
                        lock_changed=result.lock_changed)
    out.notes.extend(result.notes)  # e.g. a stage rebuilt for a code change whose bytes are the locked ones
    out.gates = _check_gates(result, out.notes)

    manifest = _local_version(zoo, result, publisher_id, release_output, dag.recipe.name, version, out.notes)
    _check_release(zoo, manifest, dag.nodes[publisher_id].kind, publisher_id, dag.recipe.path.name)
    out.builds = {name: b.file.sha256 for name, b in sorted(manifest.builds.items())}
    out.files = {f.path: f.sha256 for f in manifest.files}
    # its bill of materials goes up (and is signed) with it: a version published before BOMs existed gets one now
    zoo.ensure_bom(manifest)
    if signer is not None:  # after the BOM: the signature covers it
        from zoo.registry.signing import sign_local

        verdict = sign_local(zoo, manifest, signer)
        out.signature = verdict.to_json()
        out.notes.extend(verdict.notes)

    from zoo.registry import api as registry

    pushed = registry.push(manifest.ref, to, tags=tags, zoo=zoo)
    out.created, out.uploaded = bool(pushed.get("created")), int(pushed.get("uploaded", 0))
    out.skipped, out.bytes = int(pushed.get("skipped", 0)), int(pushed.get("bytes", 0))
    out.attachments = list(pushed.get("attachments") or [])
    out.notes.extend(pushed.get("notes") or [])
    for tag in tags:
        zoo.tag(manifest.name, manifest.version, tag)
    return out


def user_signer():
    """The signer of the user's ``signing:`` settings (``$ZOO_HOME/config.yaml``), or None."""
    from zoo.registry.trust import user_settings

    settings = user_settings()
    if settings.key is None:
        return None
    from zoo.registry.signing import Signer

    return Signer(settings.key, settings.certificate, settings.certificate_chain)


def _publishing_stage(dag) -> tuple[str, str]:
    """(id, release output) of the one stage whose kind publishes the version (`StageKind.release_output`)."""
    found = [(nid, output) for nid, node in dag.nodes.items()
             if (output := kind_loader.get(node.kind)().release_output(node.instance.config))]
    if not found:
        raise InvalidInput(f"{dag.recipe.path.name} has no stage that publishes the version to the local zoo, "
                           "so there is nothing to release",
                           hint="add a stage whose kind publishes releases (see `zoo kinds`), with publishing on")
    if len(found) > 1:
        raise InvalidInput(f"{dag.recipe.path.name} has several stages that publish the version "
                           f"({', '.join(nid for nid, _ in found)}); they would all publish the same version",
                           hint="keep one of them publishing")
    return found[0]


def _stage_failure(result, remote: str) -> ZooError:
    """The first failed stage as an error with its own exit code (gate 1, storage 3, integrity 4...)."""
    from zoo.engine.worker import WorkerError

    failed = result.failed[0]
    err = failed.error or WorkerError(type="", message="unknown error")
    message = f"stage {failed.id} failed: {err.message}; nothing was published to {remote}"
    if err.table:
        exc: ZooError = GateFailed(message, table=err.table, hint=err.hint)
    else:
        exc = StageFailed(message, stage_id=failed.id, hint=err.hint or f"see the log: {failed.log_path}")
    exc.exit_code = err.exit_code
    return exc


def _check_gates(result, notes: list[str]) -> list[dict[str, Any]]:
    """The gates every gate-checking stage checked (`StageKind.gates`); GateFailed if one did not pass.

    A stage whose gate fails normally fails itself, and the run with it: this is the release's own check.
    """
    gates: list[dict[str, Any]] = []
    checked = False
    for s in result.stages:
        outcomes = kind_loader.get(s.kind)().gates(s.metrics)
        if outcomes is None:
            continue
        checked = True
        gates += [{"stage": s.id, "gate": g.gate, "value": g.value, "passed": g.passed, "implicit": g.implicit}
                  for g in outcomes]
        failing = [g.gate for g in outcomes if not g.passed]
        if failing:
            raise GateFailed(f"stage {s.id}: gates failed: {', '.join(failing)}; nothing was released",
                             hint=f"see `zoo status {result.path}` and the stage's report")
    if not checked:
        notes.append("no stage of the recipe checks quality gates: no gate checked this release")
    return gates


def _local_version(zoo, result, stage_id: str, output: str, name: str, version: str, notes: list[str]):
    """The local zoo's manifest of the version, checked against the release folder the lockfile pins."""
    from zoo.engine.cache import Cache
    from zoo.registry.codec import load_manifest
    from zoo.registry.manifest import MANIFEST_FILE

    report = next(s for s in result.stages if s.id == stage_id)
    cache = Cache(result.cache_dir)
    entry = cache.lookup(report.key) if report.key else None
    staged = None
    release_dir = None
    if entry is not None and output in entry.outputs:
        release_dir = cache.output_paths(entry)[output]
        staged = load_manifest((release_dir / MANIFEST_FILE).read_bytes(), str(release_dir / MANIFEST_FILE))
        if (staged.name, staged.version) != (name, version):
            raise InvalidInput(f"stage {stage_id} built {staged.ref}, not {name}@{version}",
                               hint="the stage names the version after the recipe; re-run it")
    local = zoo.get(name, version)
    if local is None:
        if release_dir is None:
            raise StorageError(f"{name}@{version} is not in the local zoo and stage {stage_id}'s output is not cached",
                               hint=f"run `zoo run {result.path} {stage_id} --force` to rebuild and publish it")
        # the stage was cached but published into another zoo: publish its (timing-free) release folder
        local = zoo.publish(release_dir)
        notes.append(f"stage {stage_id} was cached: published its release folder to the local zoo "
                     "(without this host's timing measurements)")
    if staged is not None:
        problems = _differences(staged, local)
        if problems:
            raise Conflict(f"the local zoo's {local.ref} is not what the recipe builds now: {'; '.join(problems)}",
                           hint=f"versions are immutable: bump `version:` in the recipe, or `zoo rm {local.ref}` "
                                "if that local copy was never shared")
    return local


def _differences(staged, local) -> list[str]:
    """Build files and version-level files whose bytes differ between two manifests of one version."""
    problems = []
    if set(staged.builds) != set(local.builds):
        problems.append(f"builds {sorted(local.builds)} vs {sorted(staged.builds)}")
    for name in sorted(set(staged.builds) & set(local.builds)):
        a = {f.path: f.sha256 for f in staged.builds[name].all_files()}
        b = {f.path: f.sha256 for f in local.builds[name].all_files()}
        if a != b:
            problems.append(f"build {name} has other bytes")
    if {f.path: f.sha256 for f in staged.files} != {f.path: f.sha256 for f in local.files}:
        problems.append("its lockfile or provenance differ")
    return problems


def _check_release(zoo, manifest, kind: str, stage_id: str, recipe: str) -> None:
    """The version carries the files its publishing kind requires, and passes the kind's `check_release`."""
    cls = kind_loader.get(kind)
    files = {f.path: f for f in manifest.files}
    for path in cls.release_files:
        ref = files.get(path)
        if ref is None:
            raise IntegrityError(f"{manifest.ref} has no {path}, which a release of stage {stage_id} ({kind}) must carry",
                                 hint=f"`zoo rm {manifest.ref}`, then `zoo run {recipe} {stage_id} --force`")
        if not zoo.blobs.has(ref.sha256, ref.size):
            raise IntegrityError(f"{manifest.ref}: {path} is missing from the local zoo",
                                 hint=f"`zoo rm {manifest.ref}` and run the recipe again")

    def read(path: str) -> bytes:
        ref = files.get(path)
        if ref is None:
            raise IntegrityError(f"{manifest.ref} has no file {path}")
        return zoo.blobs.path(ref.sha256).read_bytes()

    problems = cls().check_release(manifest, read)
    if problems:
        raise IntegrityError(f"{manifest.ref}: the release does not match what stage {stage_id} built: "
                             + "; ".join(problems[:5]), hint="rebuild the version; do not edit released files")
