"""`zoo exporters`: the framework exporters (`zoo.exporters` entry points) and whether each one's
extra is installed. It reads the registrations (`zoo.engine.exporter_loader`) and asks each
exporter class; no framework is imported."""

from __future__ import annotations

import typer

from zoo.cli.jsonout import emit


def register(app: typer.Typer) -> None:
    app.command("exporters")(exporters)


def exporters(as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")) -> None:
    """List the framework exporters (`model.framework:`) and whether their extra is installed."""
    from zoo.cli.tables import print_table
    from zoo.engine import exporter_loader

    rows = []
    for name, entry in sorted(exporter_loader.entries().items()):
        cls = exporter_loader.get(name)
        rows.append({"framework": name, "origin": "built-in" if entry.builtin else "plugin",
                     "extra": cls.extra, "installed": cls.installed(), "install": cls.install_command(),
                     "summary": cls.summary, "target": entry.target})
    if as_json:
        emit(rows)
        return
    print_table(["framework", "origin", "installed", "summary"],
                [[r["framework"], r["origin"], "yes" if r["installed"] else f"no: {r['install']}", r["summary"]]
                 for r in rows])
