"""Shell completion of model names, references and remote names (typer's `autocompletion=`).

Completion runs on every <TAB>: it reads the local zoo's index and the remotes config only, never
a remote, and a zoo it cannot read completes nothing rather than printing into the shell.
`zoo --install-completion` / `zoo --show-completion SHELL` install or print the shell's script
(typer's own); the script calls `zoo` back with `_ZOO_COMPLETE=complete_<shell>`.
"""

from __future__ import annotations


def complete_models(incomplete: str) -> list[str]:
    """Model names of the local zoo that start with `incomplete`."""
    return [n for n in _local_names() if n.startswith(incomplete)]


def complete_refs(incomplete: str) -> list[str]:
    """`NAME`, or after `NAME@`, that model's versions and tags as `NAME@VERSION` / `NAME@TAG`."""
    name, at, rest = incomplete.partition("@")
    if not at:
        return complete_models(incomplete)
    try:
        from zoo.registry.store import LocalZoo

        zoo = LocalZoo()
        choices = zoo.index.version_names(name) + sorted(zoo.tags(name))
    except Exception:  # noqa: BLE001 (a <TAB> must never print a traceback into the shell)
        return []
    return [f"{name}@{c}" for c in choices if c.startswith(rest)]


def complete_remotes(incomplete: str) -> list[str]:
    """Configured remote names that start with `incomplete`."""
    try:
        from zoo.registry.config import RemotesConfig
        from zoo.registry.store import LocalZoo

        names = [r.name for r in RemotesConfig(LocalZoo().root).list()]
    except Exception:  # noqa: BLE001 (a <TAB> must never print a traceback into the shell)
        return []
    return [n for n in names if n.startswith(incomplete)]


def _local_names() -> list[str]:
    try:
        from zoo.registry.store import LocalZoo

        return LocalZoo().index.model_names()
    except Exception:  # noqa: BLE001 (a <TAB> must never print a traceback into the shell)
        return []
