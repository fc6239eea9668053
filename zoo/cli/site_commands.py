"""`zoo site build | serve | publish`: the web catalog of a zoo (parse, call `zoo.site`, print)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from zoo.cli.jsonout import emit, versioned

JsonOpt = typer.Option(False, "--json", help="Print a machine-readable JSON summary.")


def register(app: typer.Typer) -> None:
    """Add the `site` sub-app to the main `zoo` app."""
    site_app = typer.Typer(help="A static web catalog of a zoo: plots, lineage, model cards, pull commands.",
                           no_args_is_help=True)
    site_app.command("build")(build_cmd)
    site_app.command("serve")(serve_cmd)
    site_app.command("publish")(publish_cmd)
    app.add_typer(site_app, name="site")


def build_cmd(
    out: Path = typer.Option(..., "--out", "-o", help="Folder to write the site into (new, empty, or an earlier site)."),
    remote: Optional[str] = typer.Option(None, "--remote", "-r", metavar="REMOTE",
                                          help="Build the site of this remote zoo instead (a `zoo remote` name, a folder or a URL)."),
    as_json: bool = JsonOpt,
) -> None:
    """Write a static site of the local zoo (or of a remote one) into OUT: works offline, from any file server or bucket."""
    from zoo.site.build import build_site

    result = build_site(out, remote=remote)
    if as_json:
        return emit(result)
    from zoo.formatting import size

    print(f"wrote {result['out']}: {result['models']} models, {result['versions']} versions, {result['builds']} builds "
          f"({result['files']} files, {size(result['bytes'])}) from the {result['source']} zoo", flush=True)
    print(f"open {Path(result['out']) / 'index.html'}, or: zoo site serve {result['out']}", flush=True)


def serve_cmd(
    folder: Path = typer.Argument(..., help="A folder written by `zoo site build`.", show_default=False),
    port: int = typer.Option(8000, "--port", "-p", min=0, max=65535, help="Port on 127.0.0.1 (0: any free one)."),
    as_json: bool = JsonOpt,
) -> None:
    """Serve a built site on http://127.0.0.1:PORT/ until Ctrl-C."""
    from zoo.site.serve import serve

    def ready(url: str) -> None:
        if as_json:  # one line a script can read before the server blocks
            print(json.dumps(versioned({"folder": str(folder), "url": url})), flush=True)
        else:
            print(f"serving {folder} at {url} (Ctrl-C stops)", flush=True)

    serve(folder, port, ready=ready)
    if not as_json:
        print("stopped", flush=True)


def publish_cmd(
    folder: Path = typer.Argument(..., help="A folder written by `zoo site build`.", show_default=False),
    to: str = typer.Option(..., "--to", metavar="REMOTE",
                    help="Remote to upload the site to, under site/: a `zoo remote` name, a folder or a URL."),
    as_json: bool = JsonOpt,
) -> None:
    """Upload a built site next to a remote zoo (under its site/ prefix)."""
    from zoo.site.publish import publish_site

    result = publish_site(folder, to)
    if as_json:
        return emit(result)
    from zoo.formatting import size

    print(f"published {result['uploaded']} files ({size(result['bytes'])}) to {result['url']}"
          + (f"; removed {result['removed']} left from an earlier site" if result["removed"] else ""), flush=True)
