"""Every `zoo` command, read from the Typer app: its path (`("cache", "push")`), its options and
its `--help` text. The docs site's command-help page (scripts/mkdocs_hooks.py) is made from it,
and tests/test_docs.py checks the commands the docs name against it."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass
class Command:
    path: tuple[str, ...]
    options: frozenset[str]       # every spelling: --force, -f, --no-x
    help: str                     # `zoo PATH --help`, as the program prints it
    hidden: bool


def _root():
    import typer

    from zoo.cli.main import app

    return typer.main.get_command(app)


def commands(width: int = 100) -> list[Command]:
    """The root and every command and group under it, depth first, in the order `--help` lists them."""
    os.environ.setdefault("COLUMNS", str(width))   # rich (Typer's help) fits the text to it
    os.environ.setdefault("NO_COLOR", "1")
    found: list[Command] = []

    def walk(cmd, path: tuple[str, ...], parent) -> None:
        ctx = cmd.context_class(cmd, info_name=path[-1] if path else "zoo", parent=parent,
                            terminal_width=width, max_content_width=width)
        options = frozenset(o for p in cmd.params if p.param_type_name == "option" for o in (*p.opts, *p.secondary_opts))
        found.append(Command(path, options | set(cmd.get_help_option_names(ctx)), _help(cmd, ctx), getattr(cmd, "hidden", False)))
        if hasattr(cmd, "list_commands"):  # a group (Typer may bring its own click)
            for name in cmd.list_commands(ctx):
                walk(cmd.get_command(ctx, name), path + (name,), ctx)

    walk(_root(), (), None)
    return found


def _help(cmd, ctx) -> str:
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        text = cmd.get_help(ctx)   # click returns it; Typer's rich formatter prints it
    return (text or buf.getvalue()).rstrip() + "\n"


if __name__ == "__main__":
    for c in commands():
        print(" ".join(("zoo",) + c.path), sorted(c.options))
