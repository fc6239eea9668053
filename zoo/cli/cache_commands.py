"""`zoo cache push | pull | status`: the remote run cache outside a run (parse, call `zoo.api`, print)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from zoo.cli.jsonout import emit

RecipesArg = typer.Argument(None, help="Recipe YAML files (their stages as they are now).", show_default=False)
RemoteOpt = typer.Option(None, "--remote", "-r", metavar="URL",
                         help="Remote run cache (a `zoo remote` name, a folder or a URL) [default: the configured cache.remote].")
CacheDirOpt = typer.Option(None, "--cache-dir", help="Run cache folder [default: $ZOO_CACHE_DIR or ./cache].")
JsonOpt = typer.Option(False, "--json", help="Print JSON instead of a table.")


def register(app: typer.Typer) -> None:
    """Add the `cache` sub-app to the main `zoo` app."""
    cache_app = typer.Typer(help="Share the run cache through a remote (S3, WebDAV, a folder): push, pull, status.",
                            no_args_is_help=True)
    cache_app.command("push")(push_cmd)
    cache_app.command("pull")(pull_cmd)
    cache_app.command("status")(status_cmd)
    app.add_typer(cache_app, name="cache")


def push_cmd(recipes: Optional[List[Path]] = RecipesArg, remote: Optional[str] = RemoteOpt,
             cache_dir: Optional[Path] = CacheDirOpt, as_json: bool = JsonOpt) -> None:
    """Push local cache entries (of RECIPES' stages, or all) to the remote: objects first, each entry last."""
    from zoo import api
    from zoo.cli.interrupt import CACHE_PUSH_LEFT, interruptible
    from zoo.cli.transfer import transfer_display

    from zoo.cli.main import announce_remote_cache

    announce_remote_cache(remote, recipes[0] if recipes else None, "--remote", as_json=as_json)
    label = f"cache push to {remote or 'the remote run cache'}"
    with interruptible(label, CACHE_PUSH_LEFT), transfer_display(label, None, as_json) as advance:
        result = api.cache_push(recipes or (), remote=remote, cache_dir=cache_dir, progress=advance)
    if as_json:
        emit(result)
        return
    from zoo.formatting import size

    print(f"pushed {result['entries']} entries ({result['objects']} objects, {size(result['bytes'])}) to "
          f"{result['remote']}; {result['already']} already there", flush=True)


def pull_cmd(recipes: List[Path] = typer.Argument(..., help="Recipe YAML files.", show_default=False),
             remote: Optional[str] = RemoteOpt, cache_dir: Optional[Path] = CacheDirOpt,
             as_json: bool = JsonOpt) -> None:
    """Download the stages of RECIPES that the remote has and the local cache lacks (sha256-verified)."""
    from zoo import api
    from zoo.cli.interrupt import CACHE_PULL_LEFT, interruptible
    from zoo.cli.transfer import transfer_display

    from zoo.cli.main import announce_remote_cache

    announce_remote_cache(remote, recipes[0] if recipes else None, "--remote", as_json=as_json)
    label = f"cache pull from {remote or 'the remote run cache'}"
    with interruptible(label, CACHE_PULL_LEFT), transfer_display(label, None, as_json) as advance:
        result = api.cache_pull(recipes, remote=remote, cache_dir=cache_dir, progress=advance)
    if as_json:
        emit(result)
        return
    _stage_table(result["stages"])
    print(f"pulled {result['pulled']} stages from {result['remote']}; {result['missing']} on neither side "
          "(they would run)", flush=True)


def status_cmd(recipes: Optional[List[Path]] = RecipesArg, remote: Optional[str] = RemoteOpt,
               cache_dir: Optional[Path] = CacheDirOpt, as_json: bool = JsonOpt) -> None:
    """Local vs remote: per stage of RECIPES, or how many entries each side holds."""
    from zoo import api
    from zoo.cli.main import announce_remote_cache

    announce_remote_cache(remote, recipes[0] if recipes else None, "--remote", as_json=as_json)
    result = api.cache_status(recipes or (), remote=remote, cache_dir=cache_dir)
    if as_json:
        emit(result)
        return
    if "stages" in result:
        _stage_table(result["stages"])
        return
    from zoo.cli.tables import print_table

    print_table(["", "entries"], [["local", result["local"]], ["remote", result["remote_entries"]],
                                  ["both", result["both"]], ["only local", result["only_local"]],
                                  ["only remote", result["only_remote"]]], title=result["remote"])


def _stage_table(stages: list[dict]) -> None:
    from zoo.cli.tables import Col, print_table

    def where(value) -> str:
        return "?" if value is None else "yes" if value else "no"

    print_table(["recipe", "stage", Col("key", wrap=False), "local", "remote"],
                [[s["recipe"], s["stage"], (s["key"] or "-")[:12], where(s["local"]) + (" (pulled)" if s["pulled"] else ""),
                  where(s["remote"]) + (" (pushed)" if s["pushed"] else "")] for s in stages])

