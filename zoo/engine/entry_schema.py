"""The shape of a run-cache entry, checked before anything reads it (pydantic, strict types).

Two documents: the local cache's entry (`EntryDoc`, zoo/engine/cache.py writes it) and the remote
run cache's entry document (`RemoteEntryDoc`, zoo/engine/remote_cache.py), which wraps one. Both
come from disks or servers that others may write to (a shared cache folder, a remote bucket), so
every field's type is checked before a value is used: a list where a dict belongs is a refusal
here, not a traceback in whatever reads it later. Strict: no coercion ("1" is not 1, true is not
1). Unknown fields are ignored, so a newer zoo may add optional ones within a schema version.

Only the shape is checked here; what the values must agree with (the key the entry is filed
under, the digests of its files and outputs, paths inside the stage's folder) is
`remote_cache.parse_entry`'s job.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue

ENTRY_MAX_BYTES = 64 << 20  # an entry names each output file in ~200 bytes: a stage of 300,000 files fits
HEX64 = r"^[0-9a-f]{64}$"  # pydantic matches with Rust regex: `$` is the end of the text, never before a newline
Hex64 = Annotated[str, Field(pattern=HEX64)]


def bound() -> str:
    """`ENTRY_MAX_BYTES` for a message ("64 MiB")."""
    n = ENTRY_MAX_BYTES
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


class OutputRef(_Strict):
    path: str
    digest: str


class FileMeta(_Strict):
    digest: str
    size: int = Field(ge=0)
    mode: Literal["", "x"] = ""


class HostInfo(_Strict):
    """Where a stage ran (zoo.host.describe); `zoo.host.platform_class` reads these fields."""

    model_config = ConfigDict(strict=True, extra="allow", frozen=True)
    machine: str | None = None
    cpu: str | None = None
    features: list[str] | None = None


# names a message may print: no control characters (a terminal escape, a line break), bounded
Printable = Annotated[str, Field(pattern=r"^[^\x00-\x1f\x7f]*$", max_length=256)]


class EntryDoc(_Strict):
    """A local cache entry (schema_version 1), as `Entry.to_json` writes it."""

    schema_version: Literal[1]
    key: Printable
    stage: Printable
    kind: Printable
    outputs: dict[str, OutputRef]
    files: dict[str, FileMeta]
    metrics: dict[str, JsonValue] = {}
    parts: dict[str, JsonValue] = {}
    duration_s: float = 0.0
    created: float = 0.0
    host: HostInfo | None = None


class LogRef(_Strict):
    sha256: Hex64
    size: int = Field(ge=0)


class RemoteEntryDoc(_Strict):
    """A remote run cache's entry document (schema_version 1); `entry` is checked as an `EntryDoc`."""

    schema_version: Literal[1]
    key: Hex64
    entry: dict[str, Any]
    sha256: dict[Hex64, Hex64]
    log: LogRef | None = None


def first_problem(error: Exception) -> str:
    """One line from a pydantic ValidationError: where in the document, and what is wrong there."""
    errors = getattr(error, "errors", None)
    if not callable(errors):
        return str(error).splitlines()[0]
    first = errors()[0]
    where = ".".join(str(p) for p in first.get("loc", ())) or "top level"
    return f"{where}: {first.get('msg', 'invalid')}"
