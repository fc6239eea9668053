"""The parts of a release's manifest that describe the whole version: its lineage (recipe, the
ancestors' lock records, the tools, the sources' digests) and the preprocessing a user applies
(with a text model's tokenizer, written beside the card)."""

from __future__ import annotations

import contextlib
from importlib import metadata
from typing import TYPE_CHECKING, Any

from zoo.errors import ZooError
from zoo.files import atomic_write
from zoo.manifest import FileRef, Lineage, file_ref
from zoo_stages.deploy.provenance_files import all_attribution

if TYPE_CHECKING:
    from zoo_stages.deploy.release import Release

TOKENIZER_FILE = "tokenizer.json"  # a text model's tokenizer (Hugging Face `tokenizers` JSON), beside the card


def lineage(job: Release) -> Lineage:
    """What the release came from: the recipe, its direct inputs' lock records, every tool in
    deploy's key (the ancestors' and its own) and the digests of its data and third-party sources."""
    recipe = job.ctx.recipe
    stages = {up.stage_id: up.record for up in sorted(job.inputs, key=lambda u: u.stage_id) if up.record}
    # the tools every ancestor used (their lock records) and deploy's own: all in deploy's key
    tools = {dist: version for record in job.ctx.lineage.values()
             for dist, version in (record.get("tools") or {}).items()}
    for dist in job.config.tools():
        with contextlib.suppress(metadata.PackageNotFoundError):
            tools[dist] = metadata.version(dist)
    tools = dict(sorted(tools.items()))
    sources: dict[str, str] = {}
    if job.data_spec:
        try:
            from zoo.engine.hashing import digest_json
            from zoo_stages.lib.data.datasets import split_info

            sources["data"] = digest_json(split_info(job.data_spec, recipe.dir))
        except ZooError as e:  # the card and manifest still say which data section was used
            job.ctx.log.warning("deploy: could not fingerprint the dataset: %s", e)
    for record in all_attribution(job):  # third-party files (pretrained weights...) the builds derive from
        if record.get("sha256"):
            sources[record.get("source", "source")] = f"sha256:{record['sha256']}"
    return Lineage(recipe={"name": recipe.name, "version": recipe.version, "digest": recipe.digest},
                   stages=stages, sources=sources, tools=tools)


def preprocessing(job: Release) -> tuple[dict[str, Any], list[FileRef]]:
    """The data transforms a user must apply (the manifest's `preprocessing:`), and the files they
    need: the tokenizer of a text model, written into the release as tokenizer.json."""
    if not job.data_spec:
        return {}, []
    from zoo_stages.lib.data import datasets

    record = datasets.preprocessing(job.data_spec, job.ctx.recipe.dir)
    if not datasets.has_tokenizer(job.data_spec):  # only text data (a column, a corpus) has a tokenizer
        return record, []
    tokenizer = datasets.tokenizer_json(job.data_spec, job.ctx.recipe.dir)
    path = job.release / TOKENIZER_FILE
    atomic_write(path, tokenizer.encode("utf-8"), fsync=False)
    return record, [file_ref(job.release, path)]
