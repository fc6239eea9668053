"""`zoo verify NAME@VERSION`: check a version the local zoo holds, without the network.

Three checks, each refusing with exit 4 and naming what failed: the signature (if the version
has one, or if `--require-signature` demands one: the config's ``signing.require`` is about
versions entering the zoo) against the keys the user trusts (`zoo.registry.trust`: the
global ones and every configured remote's, since a local version remembers no source), which
covers the manifest, every file's sha256 and every attachment (`zoo.registry.signing`); then
every file of the version held here hashed again (not from the memo of an earlier check) against
its sha256. Files of builds never pulled are reported as missing, not refused. A signed version
is checked even when no key is trusted (it is then refused as signed by an untrusted key):
asking to verify it is asking who signed it.

`export_signed` writes the folder the model_signing library's own ``model_signing verify`` checks:
every file of the version, its canonical ``zoo-manifest.json`` (`signing.canonical_manifest`) and
its attachments, the signature among them (which that check leaves out of what it hashes).
"""

from __future__ import annotations

from pathlib import Path

from zoo.errors import IntegrityError, InvalidInput, NotFound, SignatureError
from zoo.registry.refs import parse_ref
from zoo.registry.store import LocalZoo

VERIFY_SCHEMA_VERSION = 1


def verify_local(zoo: LocalZoo, ref: str, *, require_signature: bool = False) -> dict:
    """The checks of the module docstring on local `ref`; the report (``ok`` True) or SignatureError /
    IntegrityError."""
    from zoo.registry import trust
    from zoo.registry.attachments import SIGNATURE
    from zoo.registry.signing import verify

    manifest = zoo.resolve(parse_ref(ref))
    notes: list[str] = []
    policy = trust.policy(trust.all_remotes(zoo.root), require=require_signature, entering=False)
    notes.extend(policy.notes)
    attachments = zoo.attachments(manifest.name, manifest.version)
    verdict = None
    if SIGNATURE in attachments or policy.require:
        verdict = verify(manifest, attachments, policy, always=True, installing=False)
    files = {}
    for f in sorted(manifest.all_files(), key=lambda f: f.path):
        files[f.path] = zoo.blobs.check(f.sha256, f.size, rehash=True)
    corrupt = [p for p, state in files.items() if state == "corrupt"]
    if corrupt:
        what = f"{', '.join(corrupt[:5])}{' …' if len(corrupt) > 5 else ''}"
        if verdict is not None and verdict.signed:
            raise SignatureError(f"{manifest.ref}: the stored bytes of {what} no longer match the sha256 the signature "
                                 "covers (changed after signing)",
                                 hint=f"`zoo fsck --repair` removes the bad copy; `zoo pull {manifest.ref} --build …` "
                                      "fetches it again")
        raise IntegrityError(f"{manifest.ref}: the stored bytes of {what} do not match their sha256 (corrupted on disk)",
                             hint=f"`zoo fsck --repair` removes the bad copy; `zoo pull {manifest.ref} --build …` "
                                  "fetches it again")
    return {"schema_version": VERIFY_SCHEMA_VERSION, "ref": manifest.ref, "ok": True,
            "signature": verdict.to_json() if verdict is not None else None,
            "attachments": sorted(attachments), "files": files, "notes": notes + (verdict.notes if verdict else [])}


def export_signed(zoo: LocalZoo, ref: str, dest: Path) -> list[str]:
    """Write `ref`'s files, canonical manifest and attachments into the new or empty folder `dest`
    (module docstring); the relative paths written. NotFound when a build was never pulled."""
    from zoo.files import hardlink_or_copy
    from zoo.pathsafety import safe_join
    from zoo.registry.manifest import MANIFEST_FILE
    from zoo.registry.signing import canonical_manifest

    manifest = zoo.resolve(parse_ref(ref))
    missing = zoo.missing(manifest.all_files())
    if missing:
        raise NotFound(f"{manifest.ref}: {len(missing)} file(s) are not in the local zoo (e.g. {missing[0].path})",
                       hint=f"pull every build first: `zoo pull {manifest.ref} --build …` for each of "
                            f"{', '.join(sorted(manifest.builds))}")
    dest = Path(dest).expanduser()
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise InvalidInput(f"{dest} is not an empty folder", hint="name a new folder")
    written = []
    for f in manifest.all_files():
        target = safe_join(dest, f.path, what="manifest file")
        target.parent.mkdir(parents=True, exist_ok=True)
        hardlink_or_copy(zoo.blobs.path(f.sha256), target)
        written.append(f.path)
    extra = {MANIFEST_FILE: canonical_manifest(manifest), **zoo.attachments(manifest.name, manifest.version)}
    for name, data in extra.items():
        (dest / name).write_bytes(data)
        written.append(name)
    return sorted(written)
