"""Every error zoo raises on purpose, and the exit code each class maps to.

The CLI turns a `ZooError` into one message, an optional hint, and its exit code. An `OSError`
nothing caught is a storage error (exit 3, its path named); any other exception is a bug: one line
``error: unexpected …`` and the note to set ``ZOO_DEBUG=1``, which raises every error with its
traceback.

`ExitCode` lists every status the `zoo` command exits with; the README's exit-code table is
checked against it (tests/test_errors.py). Classes also subclass the builtin exception they
resemble (huggingface_hub does the same), so ``except ConnectionError`` / ``except LookupError``
in a caller's code catches them: `SourceUnreachable` is a `ConnectionError`, `NotFound` a
`LookupError`. `IntegrityError`/`UnsafePath` are not `ValueError`s and `NoSpace` is not an
`OSError`: zoo's own ``except ValueError`` (JSON, pydantic validators) and ``except OSError``
(file writes turned into StorageError) would then swallow them.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """The exit status of the `zoo` command (README, "Exit codes")."""

    OK = 0
    FAILED = 1  # a stage or gate failed, --frozen found the lockfile out of date, or stdout was closed
    INVALID = 2  # invalid input: recipe, arguments, unknown model/version
    STORAGE = 3  # storage or I/O error: cache, zoo, remote, unreachable or refusing source
    INTEGRITY = 4  # integrity error: checksum mismatch, path escaping its folder
    INTERRUPTED = 130  # Ctrl-C (128 + SIGINT)


class ZooError(Exception):
    """Base of all expected errors. `hint` tells the user what to do next."""

    exit_code: ExitCode = ExitCode.FAILED

    def __init__(self, message: str, *, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class InvalidInput(ZooError):
    """Bad recipe, bad argument, bad config: the user must change what they passed."""

    exit_code = ExitCode.INVALID


class RecipeError(InvalidInput):
    """A recipe that does not parse or validate; the message names file:line:col."""


class UnknownKind(InvalidInput):
    """A stage kind that is neither built in nor registered through an entry point."""


class MissingExtra(InvalidInput):
    """A recipe needs an optional framework (an exporter's extra) that is not installed; the hint
    names the ``pip install 'zoo-onnx[EXTRA]'`` to run."""


class FieldError(InvalidInput):
    """Invalid input about one recipe field, found while a stage runs (a data file without the
    label column `data.label` names). `field` is the field's path as the recipe writes it
    (``("data", "label")``): the engine turns it into the recipe's file:line:col
    (zoo/engine/failures.py), and the message is the whole story, so no log is shown."""

    def __init__(self, message: str, *, field: tuple[str | int, ...], hint: str | None = None):
        super().__init__(message, hint=hint)
        self.field = tuple(field)


class PlanError(InvalidInput):
    """A DAG that cannot be built: cycles, unknown needs, duplicate ids."""


class StageFailed(ZooError):
    """A stage raised; dependents were not scheduled."""

    exit_code = ExitCode.FAILED

    def __init__(self, message: str, *, stage_id: str | None = None, log_tail: str = "", hint: str | None = None):
        super().__init__(message, hint=hint)
        self.stage_id = stage_id
        self.log_tail = log_tail


class WorkerMismatch(StageFailed):
    """A worker ran a stage with other tool versions or kind code than its cache key was computed with."""


class GateFailed(ZooError):
    """A quality gate (accuracy, parity, latency...) was not met. `table` is printable text."""

    exit_code = ExitCode.FAILED

    def __init__(self, message: str, *, table: str = "", hint: str | None = None):
        super().__init__(message, hint=hint)
        self.table = table


class LockOutOfDate(ZooError):
    """`zoo run --frozen` and the lockfile would change (zoo/engine/frozen.py lists how)."""

    exit_code = ExitCode.FAILED


class StorageError(ZooError):
    """A cache, zoo or remote could not be read or written."""

    exit_code = ExitCode.STORAGE


class SourceUnreachable(StorageError, ConnectionError):
    """A remote source (URL, hub, remote zoo) could not be reached."""


class AccessDenied(StorageError):
    """A remote refused: no credentials, wrong ones, or not allowed (HTTP 401/403, S3 AccessDenied).

    Like an unreachable remote, a pull falls back to the local copy with a note; without one it
    is this error, whose hint names where the credentials come from (environment, `-o` options).
    """


class NotFound(ZooError, LookupError):
    """A model, version, build or tag that does not exist."""

    exit_code = ExitCode.INVALID


class IntegrityError(ZooError):
    """Bytes whose digest does not match what was recorded. Nothing was installed."""

    exit_code = ExitCode.INTEGRITY


class MalformedEntry(IntegrityError):
    """A cache entry that is not a valid document of its schema (damaged, too large, not a regular
    file, or written by an incompatible zoo). A remote one is a miss with a note, a local one a
    miss that `zoo gc` removes: never installed, never a traceback."""


class SignatureError(IntegrityError):
    """A version whose signature does not hold: unsigned where a signature is required, signed by a
    key or certificate the user does not trust, or content changed after signing (zoo.registry.signing).
    Nothing was installed."""


class UnsafePath(IntegrityError):
    """A name or path (including ONNX external data) that would escape its folder."""


class Conflict(ZooError):
    """A publish that would overwrite different bytes under the same version."""

    exit_code = ExitCode.STORAGE


class Unhashable(InvalidInput):
    """A stage input or config value that cannot be hashed, so cannot be cached."""


class NoSpace(StorageError):
    """A disk (cache, zoo, output folder) is full or over quota."""


NO_SPACE_HINT = ("free space on that disk (`zoo gc` frees run-cache space) or point ZOO_CACHE_DIR / ZOO_HOME "
                 "at a bigger one, then run the command again")


def zoo_no_space_hint(zoo_root: object) -> str:
    """What frees space for the local zoo (not the run cache: `zoo gc` alone frees little there)."""
    return (f"free space on that disk: `zoo rm NAME@VERSION` removes versions of the local zoo {zoo_root} you no longer "
            "need (`zoo list` shows them) and `zoo gc` deletes the files no version uses; or set ZOO_HOME to a folder on "
            "a bigger disk; then run the command again")


def is_no_space(e: BaseException) -> bool:
    """True for an OSError that says the disk is full or the quota is exhausted (ENOSPC, EDQUOT)."""
    import errno

    codes = {errno.ENOSPC} | ({errno.EDQUOT} if hasattr(errno, "EDQUOT") else set())
    return isinstance(e, OSError) and e.errno in codes


def no_space(path: object, *, detail: str = "", hint: str | None = None) -> NoSpace:
    """The one message zoo gives for a full disk: "no space left on <path>" (exit 3)."""
    return NoSpace(f"no space left on {path}" + (f" ({detail})" if detail else ""), hint=hint or NO_SPACE_HINT)
