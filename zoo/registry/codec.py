"""Reading, writing and comparing manifests as bytes (one canonical encoding everywhere)."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

from zoo.errors import InvalidInput, StorageError
from zoo.registry.manifest import Manifest


def dump_manifest(manifest: Manifest) -> bytes:
    """The stored form: sorted keys, 2-space indent, trailing newline (stable across runs)."""
    return (json.dumps(manifest.model_dump(mode="json"), sort_keys=True, indent=2, ensure_ascii=False) + "\n").encode()


def load_manifest(data: bytes | str, where: str) -> Manifest:
    """Parse and validate manifest bytes; InvalidInput naming `where` and the bad field."""
    from pydantic import ValidationError

    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise InvalidInput(f"{where}: not valid JSON ({e})", hint="the manifest is corrupt; republish the version") from e
    try:
        return Manifest.model_validate(obj)
    except ValidationError as e:
        first = e.errors()[0]
        loc = ".".join(str(p) for p in first.get("loc", ())) or "manifest"
        raise InvalidInput(f"{where}: invalid manifest field {loc}: {first.get('msg')}",
                           hint="check the manifest against zoo.registry.manifest.Manifest") from e


def read_manifest_file(path: Path) -> Manifest:
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise
    except OSError as e:
        raise StorageError(f"cannot read manifest {path}: {e}") from e
    return load_manifest(data, str(path))


def content_key(manifest: Manifest) -> bytes:
    """What 'the same version' means: every field except the publish time."""
    obj = manifest.model_dump(mode="json")
    obj.pop("created", None)
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def same_content(a: Manifest, b: Manifest) -> bool:
    return content_key(a) == content_key(b)


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
