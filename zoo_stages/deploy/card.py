"""The model card of a release, and the copy of a finished release the engine publishes: its
manifest and card with the timings measured upstream (verify's) and by deploy itself."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Mapping

from zoo.files import atomic_write
from zoo.manifest import MANIFEST_FILE, Manifest, file_ref
from zoo_stages.deploy.config import DeployConfig
from zoo_stages.lib.release.provenance import STATEMENT_FILE
from zoo_stages.lib.quality.verify_report import VerifyOutputs

CARD_FILE = "README.md"


def card_provenance(release: Path) -> str:
    """The model card's Provenance section of a finished release, from its statement."""
    import json

    from zoo_stages.lib.release.provenance import card_section

    statement = release / STATEMENT_FILE
    return card_section(json.loads(statement.read_text(encoding="utf-8"))) if statement.is_file() else ""


def publication(release: Path, manifest: Manifest, verify: VerifyOutputs, config: DeployConfig,
                data_spec: Mapping[str, Any] | None, provenance_section: str, work: Path,
                measured: Mapping[str, Any] | None = None) -> Path:
    """The folder to publish: `release` itself, or a copy whose manifest and card add the timings.

    The copy hardlinks every build file, so it costs no space; only the manifest and the model
    card are rewritten (read-only, as the release's files are), with the latency/throughput/speedup
    metrics verify measured (the metrics of its stage entry: they travel with it from the host
    that measured them) and those deploy measured itself (`measured`: OpenVINO builds, a CUDA
    build on a GPU host), each build with what its figures were measured on (``measured_on``).
    """
    verified_as = (manifest.extra.get("deploy") or {}).get("verified_as") or {}
    timings: dict[str, dict[str, Any]] = {}
    where: dict[str, dict[str, Any]] = {}
    for name in manifest.builds:
        spec, vname = config.builds.get(name), verified_as.get(name)
        own = (measured or {}).get(name)
        if isinstance(own, Mapping) and own.get("metrics"):
            timings[name] = dict(own["metrics"])
            where[name] = dict(own.get("measured_on") or {})
        elif spec is not None and spec.convert is None and vname and vname in verify.measured:
            timings[name] = verify.timings(vname)
            where[name] = verify.measured_on()
    if not config.measurements or not any(timings.values()):
        return release
    pub = work / "publish"
    if pub.exists():
        shutil.rmtree(pub)
    work.mkdir(parents=True, exist_ok=True)
    shutil.copytree(release, pub, copy_function=os.link)
    data = Manifest.model_validate(manifest.model_dump())
    for name, extra in timings.items():
        data.builds[name].metrics.update(extra)
        if extra:
            data.builds[name].measured_on = where.get(name) or {}
    verification = verify.summary(measured=True)
    deploy_extra = dict(data.extra.get("deploy") or {})
    if verification:
        deploy_extra["verification"] = verification
    deploy_extra["measured"] = {"threads": verify.threads, "builds": sorted(timings)}
    data.extra["deploy"] = deploy_extra
    from zoo_stages.lib.release.modelcard import render_card

    card = render_card(data, dataset=data_spec, intended_use=config.intended_use, limitations=config.limitations,
                       verification=verification, conversions=deploy_extra.get("conversions"),
                       appendix=provenance_section)
    # new files (the hardlinks to the release's card and manifest are replaced), read-only: a cached
    # release's folder is published by hard links
    atomic_write(pub / CARD_FILE, card.encode("utf-8"), fsync=False, mode=0o444)
    data.card = file_ref(pub, pub / CARD_FILE)
    data = Manifest.model_validate(data.model_dump())
    atomic_write(pub / MANIFEST_FILE, data.model_dump_json(indent=2).encode("utf-8"), fsync=False, mode=0o444)
    return pub
