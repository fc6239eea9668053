"""The provenance a release carries: each build's metadata_props (release identity, its source's
digest, license and attribution), ``zoo.lock`` and the in-toto statement whose subjects are the
build files (zoo_stages.lib.release.provenance makes them)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from zoo.files import atomic_write
from zoo.manifest import Build, FileRef, Lineage, file_ref
from zoo_stages.deploy.config import SIDE_EFFECT_OPTIONS, BuildSpec
from zoo_stages.lib.release.provenance import LOCK_FILE, STATEMENT_FILE

if TYPE_CHECKING:
    from zoo_stages.deploy.release import Release


def props(job: Release, name: str, spec: BuildSpec, source: Path) -> dict[str, str]:
    """The metadata_props of build `name`: release identity, its source's digest, license
    (its sources' attribution is kept in `job.attribution`)."""
    from zoo.engine.hashing import ALGORITHM, hash_file_uncached
    from zoo_stages.lib.release import provenance

    job.attribution[name] = provenance.model_attribution(source)
    sources = {f"{spec.source}.model": f"{ALGORITHM}:{hash_file_uncached(source)}"}
    return provenance.release_props(job.ctx.recipe, job.ctx.record, name, sources, job.attribution[name])


def all_attribution(job: Release) -> list[dict[str, str]]:
    """The attribution of every build's sources, merged."""
    from zoo_stages.lib.release.provenance import merge_attribution

    return merge_attribution(*job.attribution.values())


def write(job: Release, builds: dict[str, Build], lineage: Lineage) -> tuple[list[FileRef], dict[str, Any]]:
    """Write zoo.lock and the in-toto statement into the release; their FileRefs and the statement."""
    from zoo_stages.lib.release import provenance

    recipe, lineage_records = job.ctx.recipe, dict(job.ctx.lineage)
    lock_path = job.release / LOCK_FILE
    atomic_write(lock_path, provenance.lock_yaml(recipe, lineage_records).encode("utf-8"), fsync=False)
    lock_ref = file_ref(job.release, lock_path)
    # direct inputs the engine did not describe (a deploy run outside the engine, as in tests)
    unrecorded = provenance.input_digests(up for up in job.inputs if up.stage_id not in lineage_records)
    data = None
    if "data" in lineage.sources:
        data = {"digest": lineage.sources["data"], "source": str((job.data_spec or {}).get("source", ""))}
    subjects = [(ref.path, ref.sha256) for b in builds.values() for ref in b.all_files()]
    kind, kind_version = job.publisher
    stmt = provenance.statement(subjects=subjects, recipe=recipe, record=job.ctx.record,
                                config=job.config.model_dump(mode="json", by_alias=True,
                                                             exclude=SIDE_EFFECT_OPTIONS),
                                lineage=lineage_records, tools=lineage.tools, inputs=unrecorded, data=data,
                                attribution=all_attribution(job), lock_sha256=lock_ref.sha256,
                                publisher={"stage": job.ctx.stage_id, "kind": kind,
                                           "kind_version": kind_version, "record": job.ctx.record,
                                           "inputs": sorted({up.stage_id for up in job.inputs})})
    stmt_path = job.release / STATEMENT_FILE
    atomic_write(stmt_path, provenance.statement_bytes(stmt), fsync=False)
    return [lock_ref, file_ref(job.release, stmt_path)], stmt
