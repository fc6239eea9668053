"""Which project configs (``.zoo/config.yaml``) the user has approved, by the digest of their bytes.

A project's config comes with the project: whoever wrote the repository wrote it. Like direnv's
``.envrc`` (`direnv allow`) or git's repository config (`safe.directory`), it may only do what
cannot reach the user's secrets or send anything anywhere until the user has read and approved
that exact file: `zoo config allow PATH` records the sha256 of its bytes here, and a changed file
is a new, unapproved one. What an unapproved project config may and may not set is decided in
`zoo.engine.cache_config`.

The record is the user's (``$ZOO_HOME/approved-configs.json``, schema-versioned), never the
project's: nothing in a project can approve itself.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone
from pathlib import Path

from zoo.errors import InvalidInput

APPROVALS_FILE = "approved-configs.json"
SCHEMA_VERSION = 1


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def approvals_path() -> Path:
    from zoo.paths import zoo_home

    return zoo_home() / APPROVALS_FILE


def is_approved(path: Path, data: bytes) -> bool:
    """Whether the user approved the config at `path` (resolved) with exactly these bytes."""
    entry = _load().get(str(Path(path).resolve()))
    return isinstance(entry, dict) and entry.get("sha256") == digest(data)


def approve(path: Path) -> dict:
    """Record the config at `path` as approved with the bytes it holds now; returns the record."""
    from zoo.files import atomic_write_json

    path = Path(path).resolve()
    try:
        data = path.read_bytes()
    except OSError as e:
        raise InvalidInput(f"{path}: cannot read the config to approve ({e.strerror})",
                           hint="name a project's .zoo/config.yaml") from None
    approvals = _load()
    record = {"sha256": digest(data), "approved_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
    approvals[str(path)] = record
    atomic_write_json(approvals_path(), {"schema_version": SCHEMA_VERSION, "configs": approvals})
    return {"path": str(path), **record}


def revoke(path: Path) -> bool:
    """Forget an approval; whether there was one."""
    from zoo.files import atomic_write_json

    approvals = _load()
    if approvals.pop(str(Path(path).resolve()), None) is None:
        return False
    atomic_write_json(approvals_path(), {"schema_version": SCHEMA_VERSION, "configs": approvals})
    return True


def _load() -> dict:
    path = approvals_path()
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise InvalidInput(f"{path}: cannot read the approved project configs ({e})",
                           hint="delete the file and approve the configs you trust again with `zoo config allow`") from None
    if not isinstance(raw, dict) or raw.get("schema_version") != SCHEMA_VERSION or not isinstance(raw.get("configs"), dict):
        raise InvalidInput(f"{path}: not an approvals file of schema_version {SCHEMA_VERSION}",
                           hint="delete the file and approve the configs you trust again with `zoo config allow`")
    return dict(raw["configs"])
