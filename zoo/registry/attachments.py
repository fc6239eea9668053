"""Attachments: the files a version carries beside its manifest, about the version rather than in it.

A manifest cannot list a file that describes the manifest itself: the release's signature (it
signs the manifest's content and every file's digest) and its bill of materials (derived from
the manifest, the lockfile and the provenance statement). They travel with the version — push,
pull, bundles — under fixed names, each at most `MAX_BYTES`, and are immutable like the files:
a second write of other bytes under the same name is a Conflict.

Where they live::

    $ZOO_HOME/models/<name>/attachments/<version>/<file>      the local zoo
    <root>/models/<name>/attachments/<version>/<file>         a folder/S3/GCS/Azure/WebDAV/SSH remote
    .zoo/attachments/<file> in the version's commit           a Hugging Face Hub remote
    extra layers of the version's OCI manifest                an OCI registry remote

Everything read back from a remote or a bundle is a stranger's bytes: `check` refuses names
outside `NAMES` and oversized data before anything is stored; what the bytes say is checked by
their readers (the signature by `zoo.registry.signing`, the BOM shown, never run).
"""

from __future__ import annotations

from zoo.errors import StorageError

BOM = "bom.cdx.json"  # CycloneDX ML-BOM of the version (zoo.registry.bom)
SIGNATURE = "signature.sigstore.json"  # the release's signature: a sigstore bundle (model_signing)
NAMES = (BOM, SIGNATURE)
_WHAT = {BOM: f"bill of materials ({BOM})", SIGNATURE: f"signature ({SIGNATURE})"}
MAX_BYTES = 16 * 1024 * 1024  # a BOM of a version with thousands of files is well under this


def check(name: str, data: bytes, where: str) -> None:
    """Refuse an attachment zoo does not know or that is too large (StorageError naming `where`)."""
    if name not in NAMES:
        raise StorageError(f"{where}: unknown attachment {name!r}",
                           hint=f"a version carries only {', '.join(NAMES)}; the source is damaged or written by another tool")
    if not isinstance(data, bytes) or len(data) > MAX_BYTES:
        raise StorageError(f"{where}: attachment {name} is larger than {MAX_BYTES} bytes",
                           hint="the source is damaged or hostile; nothing was stored")


def differs(name: str, ref: str, where: str):
    """The Conflict for an attachment that is already there with other bytes."""
    from zoo.errors import Conflict

    return Conflict(f"{ref} already carries a different {_WHAT.get(name, name)} on {where}",
                    hint="a version's signature and bill of materials are immutable like its files: bump the version "
                         "(or `zoo rm` it there first)")


def reconcile(ref: str, where: str, local: dict[str, bytes], there: dict[str, bytes], *,
              can_add: bool, cannot_add: str) -> tuple[list[str], list[str]]:
    """What a push of `ref` does with its local attachments against those `where` already holds:
    (names to store, notes). The same bytes: nothing. A signature, and anything it signed, must be
    there as it is here: other bytes are a Conflict, a missing one is stored where the backend
    `can_add`, else InvalidInput (`cannot_add`: why, for the message). An unsigned version's BOM
    is derived data (made again from the version's content by whoever publishes it): one that
    differs or cannot be added leaves the remote's as it is, with a note, so a newer zoo's BOM of
    the same content never blocks a push."""
    from zoo.errors import InvalidInput

    signed = SIGNATURE in local
    store, notes = [], []
    for n, data in sorted(local.items()):
        if there.get(n) == data:
            continue
        derived = n == BOM and not signed
        if n in there:
            if not derived:
                raise differs(n, ref, where)
            notes.append(f"{ref}: {where} keeps its own {_WHAT[n]}, made from the same content by another zoo")
        elif can_add:
            store.append(n)
        elif derived:
            notes.append(f"{ref}: {where} holds the version without a {_WHAT[n]} and {cannot_add}; pushed without it")
        else:
            raise InvalidInput(f"{ref} is on {where} without its {_WHAT[n]}, and {cannot_add}",
                               hint=f"publish a new version to ship it, or `zoo rm {ref} --remote …` there and push again")
    return store, notes
