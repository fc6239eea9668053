"""`zoo config allow | deny`: approve (or stop approving) a project's `.zoo/config.yaml`, by the
digest of its bytes (zoo/engine/config_trust.py), the way `direnv allow` approves an `.envrc`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from zoo.cli.jsonout import emit

PathArg = typer.Argument(None, help="The project config [default: the nearest .zoo/config.yaml from here].",
                         show_default=False)
JsonOpt = typer.Option(False, "--json", help="Print JSON instead of a line.")


def register(app: typer.Typer) -> None:
    """Add the `config` sub-app to the main `zoo` app."""
    config_app = typer.Typer(help="Approve a project's .zoo/config.yaml: its credentials options and pushes.",
                             no_args_is_help=True)
    config_app.command("allow")(allow_cmd)
    config_app.command("deny")(deny_cmd)
    app.add_typer(config_app, name="config")


def allow_cmd(path: Optional[Path] = PathArg, as_json: bool = JsonOpt) -> None:
    """Approve the project config as it is now (read it first): it may then set credential options
    and push; a changed file needs approving again."""
    from zoo.engine import cache_config, config_trust

    config = _config(path)
    sets = cache_config.summary(config)  # a config zoo cannot read is refused, not approved
    record = config_trust.approve(config)
    if as_json:
        emit({"schema_version": 1, **record, "approved": True, "sets": sets})
        return
    print(f"approved {record['path']} (sha256 {record['sha256'][:16]}…): {sets}; a change to it needs "
          "`zoo config allow` again", flush=True)


def deny_cmd(path: Optional[Path] = PathArg, as_json: bool = JsonOpt) -> None:
    """Withdraw an approval: the project config may again only name a remote to read from."""
    from zoo.engine import config_trust

    config = _config(path, must_exist=False)
    was = config_trust.revoke(config)
    if as_json:
        emit({"schema_version": 1, "path": str(config.resolve()), "approved": False, "was_approved": was})
        return
    print(f"{config.resolve()}: {'approval withdrawn' if was else 'was not approved'}", flush=True)


def _config(path: Path | None, must_exist: bool = True) -> Path:
    from zoo.engine import cache_config
    from zoo.errors import InvalidInput

    if path is None:
        found = cache_config.project_config(Path.cwd().resolve())
        if found is None:
            raise InvalidInput("no .zoo/config.yaml in this folder or a folder above it",
                               hint="name the config: zoo config allow PATH")
        return found
    if path.is_dir():
        path = path / cache_config.PROJECT_CONFIG
    if must_exist and not path.is_file():
        raise InvalidInput(f"{path}: no such config file", hint="name a project's .zoo/config.yaml")
    return path
