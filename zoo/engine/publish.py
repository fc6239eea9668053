"""Publishing a stage's release: the engine's effect, not the kind's code.

A kind declares the output that is a version's release folder (`StageKind.release_output`: its
files and ``zoo-manifest.json``, in the manifest format of zoo/manifest.py); once the stage
completed — ran here, ran on another machine, or was found cached — the runner publishes that
folder to this machine's local zoo (`publish_release`). The folder published is the release
itself, or, while the zoo lacks the version, what the kind's `publication` hook makes of it (deploy
adds the timings that must stay out of the cached bytes). The local zoo makes it idempotent: the
same content again is a no-op that only heals missing blobs, other bytes under a published version
are a Conflict (a failure of the stage, with the hint of zoo/engine/failures.py).

The runner asks only for stages whose bytes the lockfile still pins (`--frozen`) and never while
`zoo repro` rebuilds. The effect (`zoo.stage.PUBLISHED`) names the version, and its evidence is
the version in this zoo — its manifest first (`zoo.stage.published_manifest`), then every blob —
so the no-op fast path stops claiming it once `zoo rm` or `zoo fsck --repair` took any of them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from zoo.stage import PUBLISHED, Effect, KindConfig, StageContext, StageKind


def publish_release(kind: StageKind, config: KindConfig, outputs: Mapping[str, Path], context: StageContext, *,
                    link: bool = True) -> Effect | None:
    """Publish the release `kind` declares among the stage's `outputs` to the local zoo and record the
    effect in `context.effects`; None (nothing done) when the stage declares no release.

    `link`: the outputs are the run cache's read-only objects, stored in the zoo as hard links; a
    caller with writable files (a kind's test) passes False so they are copied."""
    from zoo.manifest import MANIFEST_FILE
    from zoo.registry.codec import read_manifest_file
    from zoo.registry.store import LocalZoo

    output = kind.release_output(config)
    if output is None:
        return None
    release = Path(outputs[output])
    manifest = read_manifest_file(release / MANIFEST_FILE)
    zoo = LocalZoo()
    folder = release
    if zoo.get(manifest.name, manifest.version) is None:
        folder = kind.publication(release, config, context)
    published = zoo.publish(folder, link=link)
    evidence = [zoo.manifest_path(published.name, published.version)]
    evidence += [zoo.blobs.path(f.sha256) for f in published.all_files()]
    effect = Effect(PUBLISHED, published.ref, tuple(str(p) for p in evidence))
    context.effects.append(effect)
    context.log.info("published %s to %s", published.ref, zoo.root)
    return effect
