"""Reading, writing and comparing manifests as bytes (one canonical encoding everywhere)."""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from pathlib import Path

from zoo.errors import InvalidInput, StorageError
from zoo.registry.manifest import MANIFEST_SCHEMA_VERSION, READABLE_SCHEMA_VERSIONS, Manifest


def dump_manifest(manifest: Manifest) -> bytes:
    """The stored form: sorted keys, 2-space indent, trailing newline (stable across runs)."""
    return (json.dumps(manifest.model_dump(mode="json"), sort_keys=True, indent=2, ensure_ascii=False) + "\n").encode()


def load_manifest(data: bytes | str, where: str) -> Manifest:
    """Parse and validate manifest bytes; InvalidInput naming `where` and the bad field."""
    from pydantic import ValidationError

    try:
        obj = json.loads(data)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise InvalidInput(f"{where}: not valid JSON ({json_problem(e)})",
                           hint="the manifest is corrupt; republish the version") from None
    version = obj.get("schema_version") if isinstance(obj, dict) else None
    if isinstance(version, int) and not isinstance(version, bool) and version not in READABLE_SCHEMA_VERSIONS:
        newer = version > MANIFEST_SCHEMA_VERSION
        raise InvalidInput(f"{where}: manifest schema_version {version}; this zoo reads "
                           f"{', '.join(map(str, READABLE_SCHEMA_VERSIONS))}",
                           hint="upgrade zoo (pip install -U zoo-onnx)" if newer else "republish the version")
    try:
        return Manifest.model_validate(obj)
    except ValidationError as e:
        from zoo.errors import UnsafePath
        from zoo.pathsafety import EscapingPath

        for err in e.errors():  # a path escaping its version is an integrity error (exit 4), whatever else is wrong
            if isinstance((err.get("ctx") or {}).get("error"), EscapingPath):
                loc = ".".join(str(p) for p in err.get("loc", ()))
                raise UnsafePath(f"{where}: manifest field {loc}: {err['ctx']['error']}",
                                 hint="refusing a manifest whose paths leave their version folder") from e
        first = e.errors()[0]
        loc = ".".join(str(p) for p in first.get("loc", ())) or "manifest"
        raise InvalidInput(f"{where}: invalid manifest field {loc}: {first.get('msg')}",
                           hint="zoo reads only manifests it would write (zoo.registry.manifest.Manifest); "
                                "republish the version (on a remote: ask its maintainer to)") from e


def json_problem(e: BaseException) -> str:
    """Why json.loads refused a stranger's bytes, in one short line (not Python's advice to raise its
    4300-digit limit for integers, nor a RecursionError's traceback)."""
    if isinstance(e, RecursionError):
        return "nested too deep"
    text = (str(e).strip().splitlines() or [type(e).__name__])[0]
    if "integer string conversion" in text:
        return "an integer of more than 4300 digits"
    return text[:200]


def read_manifest_file(path: Path) -> Manifest:
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise
    except OSError as e:
        raise StorageError(f"cannot read manifest {path}: {e}") from e
    return load_manifest(data, str(path))


# timings measured on the publishing host: they differ on every verify run
_MEASURED = re.compile(r"^(latency|throughput|speedup)")
# keys of a section of a manifest's ``extra`` (one per kind that publishes, e.g. ``extra.deploy``)
# that report measurements rather than describe the bytes: not part of a version's identity
MEASUREMENT_REPORTS = ("measured", "verification")


def content_key(manifest: Manifest) -> bytes:
    """What 'the same version' means: the same bytes and the same description of them.

    Left out: the publish time, and what only reports measurements — timing metrics, the model
    card that shows them, and the measurement reports in ``extra`` (`MEASUREMENT_REPORTS`). A republish that differs only there (verify
    ran again and timed slightly differently) is a no-op that keeps the first published figures;
    any other difference (a build's bytes, ports, accuracy, license, lineage…) is a Conflict.
    """
    obj = manifest.model_dump(mode="json")
    obj.pop("created", None)
    obj.pop("card", None)
    for build in obj.get("builds", {}).values():
        build["metrics"] = {k: v for k, v in build.get("metrics", {}).items() if not _MEASURED.match(k)}
        build.pop("measured_on", None)  # describes the timings, which are left out too
    for section in obj.get("extra", {}).values():  # each publishing kind's own section
        if isinstance(section, dict):
            for report in MEASUREMENT_REPORTS:
                section.pop(report, None)
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def same_content(a: Manifest, b: Manifest) -> bool:
    return content_key(a) == content_key(b)


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
