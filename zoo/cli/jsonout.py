"""`--json` output: one JSON document on stdout per command, in the shapes docs/cli-json.md lists.

Every object a command prints carries `schema_version` (a list prints an array whose every object
carries it); `show` prints a manifest, whose own `schema_version` is the manifest schema's. A
command that fails with `--json` prints one error object (and nothing on stderr), the shape `zoo run --json` gives a
failed stage's error (zoo.engine.worker.WorkerError.to_json), and its exit code:

    {"schema_version": 1, "ok": false,
     "error": {"type": "NotFound", "message": "...", "hint": "..." | null, "exit_code": 2, "table": ""}}

Standard library only: `zoo --help` must stay fast.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any

SCHEMA_VERSION = 1  # of the CLI's own --json shapes (docs/cli-json.md); bumped when one changes incompatibly

_emitted = False  # whether this process printed its document (a usage error prints one only if not)


def emit(obj: Any) -> None:
    """Print `obj` (a dict, a list of dicts, a dataclass or pydantic model) as indented JSON on stdout."""
    global _emitted
    print(json.dumps(versioned(plain(obj)), indent=2, default=str), flush=True)
    _emitted = True


def emitted() -> bool:
    """Whether a document was printed already."""
    return _emitted


def click_error(e: Any) -> dict:
    """The error object for a command line the framework refused (a click UsageError: a missing
    argument, an unknown option or command), with the message it would have printed."""
    ctx = getattr(e, "ctx", None)
    command = ctx.command_path if ctx is not None else "zoo"
    usage = any(cls.__name__ == "UsageError" for cls in type(e).__mro__)  # click not imported here
    return error_object("UsageError" if usage else "ClickException", e.format_message(),
                        hint=f"see `{command} --help`", exit_code=e.exit_code)


def versioned(obj: Any) -> Any:
    """`obj` with `schema_version` in it (first) or in each of its objects, unless it has its own."""
    if isinstance(obj, list):
        return [versioned(x) for x in obj]
    if isinstance(obj, dict) and "schema_version" not in obj:
        return {"schema_version": SCHEMA_VERSION, **obj}
    return obj


def plain(obj: Any) -> Any:
    """JSON-ready data: dataclasses and pydantic models become dicts (lists element-wise)."""
    if isinstance(obj, list):
        return [plain(x) for x in obj]
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json")
    if hasattr(obj, "as_dict"):
        return obj.as_dict()
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    return obj


def error_object(error_type: str, message: str, *, hint: str | None, exit_code: int, table: str = "") -> dict:
    """The object a failed command prints with --json."""
    return {"schema_version": SCHEMA_VERSION, "ok": False,
            "error": {"type": error_type, "message": message, "hint": hint, "exit_code": int(exit_code),
                      "table": table}}


def requested(argv: list[str] | None = None) -> bool:
    """Whether the command line asks for --json (before a `--` that ends the options)."""
    args = sys.argv[1:] if argv is None else argv
    if "--" in args:
        args = args[:args.index("--")]
    return "--json" in args
