"""The `zoo` command line. It only parses arguments, calls `zoo.api`, and prints.

Every `ZooError` becomes one message, a hint, and its exit code (see zoo/errors.py); any other
exception is a bug: one line saying so and "(set ZOO_DEBUG=1 to see the traceback)", exit 1.
ZOO_DEBUG=1 raises both with their tracebacks. With --json the error is the JSON error object on
stdout and nothing on stderr (docs/cli-json.md). Heavy modules are imported inside commands so `zoo --help` is fast.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import List, Optional

import typer

from zoo.cli.jsonout import emit

app = typer.Typer(
    name="zoo",
    help="Declarative pipelines and a model zoo for ONNX: train → export → optimize → quantize → verify → deploy.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)

RecipeArg = typer.Argument(..., help="Path to a recipe YAML file.", show_default=False)
CacheDirOpt = typer.Option(None, "--cache-dir", help="Run cache folder [default: $ZOO_CACHE_DIR or ./cache].")
JsonOpt = typer.Option(False, "--json", help="Print a machine-readable JSON summary instead of tables.")
CacheRemoteOpt = typer.Option(
    None, "--cache-remote", metavar="URL",
    help="Remote run cache (a folder, s3://…, webdav+https://…, or a `zoo remote` name; 'none' for none) "
         "[default: cache.remote of .zoo/config.yaml, else $ZOO_HOME/config.yaml].")


def _echo(text: str = "", err: bool = False) -> None:
    print(text, file=sys.stderr if err else sys.stdout, flush=True)


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        _echo(f"zoo {version('zoo-onnx')}")
        raise typer.Exit()


@app.callback()
def _root(_version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                        help="Print zoo's version and exit.")) -> None:
    """Declarative pipelines and a model zoo for ONNX: train → export → optimize → quantize → verify → deploy."""


@app.command()
def run(
    recipe: Path = RecipeArg,
    stages: Optional[List[str]] = typer.Argument(None, help="With --force: only these stages (default: all).",
                                                 show_default=False),
    force: bool = typer.Option(False, "--force", "-f", help="Rerun stages even if cached (all, or the STAGES named)."),
    jobs: int = typer.Option(1, "--jobs", "-j", min=1, help="Run up to N independent stages in parallel processes."),
    frozen: bool = typer.Option(False, "--frozen", help="Fail, with a diff, if the lockfile would change (for CI)."),
    cache_dir: Optional[Path] = CacheDirOpt,
    executor: Optional[str] = typer.Option(
        None, "--executor",
        help="'local' (default) or 'dask://HOST:PORT' (with a remote run cache the workers need no shared disk; "
             "?resource_wait=SECONDS: how long a stage waits for a worker offering its resources)."),
    cache_remote: Optional[str] = CacheRemoteOpt,
    verbose: bool = typer.Option(False, "--verbose", "-v",
                                 help="Print each stage's log file when it starts and stream its lines (a custom "
                                      "entry's prints too)."),
    as_json: bool = JsonOpt,
) -> None:
    """Run a recipe. Stages whose inputs did not change are taken from the cache (local, then remote)."""
    from zoo import api
    from zoo.cli.interrupt import RunWatch
    from zoo.errors import InvalidInput

    if stages and not force:
        raise InvalidInput(f"stage names given without --force: {' '.join(stages)}",
                           hint=f"to rerun them: zoo run {recipe} {' '.join(stages)} --force")
    dag = api.load(recipe)
    announce_remote_cache(cache_remote, dag.recipe.path, as_json=as_json)
    progress = _progress(dag, as_json, verbose)
    watch = RunWatch(f"zoo run {recipe}", progress.update)  # what a Ctrl-C stopped
    with watch.interruptible(), progress:
        result = api.run(dag, cache_dir=cache_dir, jobs=jobs, force=(stages or True) if force else (),
                         frozen=frozen, executor=executor, on_update=watch.update, cache_remote=cache_remote,
                         on_log=None if as_json else progress.log,
                         on_transfer=None if as_json else progress.transfer)
    if as_json:  # its notes are in the document
        emit(result.to_json())
    else:
        for note in result.notes:
            _echo(f"note: {note}", err=True)
        _print_run_summary(result, recipe)
    raise typer.Exit(result.exit_code())


def announce_remote_cache(flag: str | None, recipe: Path | None, flag_name: str = "--cache-remote",
                          as_json: bool = False) -> None:
    """One line on stderr naming the remote run cache a command talks to and the file (or flag)
    that chose it, before it talks to it: a project's config may choose it (zoo/engine/cache_config.py).
    With --json nothing: the document names the remote (docs/cli-json.md), stderr stays empty."""
    from zoo.engine import cache_config

    setting = cache_config.resolve(flag, recipe, flag_name)
    if setting is not None and not as_json:
        _echo(f"remote run cache: {setting.describe()}", err=True)


@app.command()
def plan(recipe: Path = RecipeArg, cache_dir: Optional[Path] = CacheDirOpt,
         cache_remote: Optional[str] = CacheRemoteOpt, as_json: bool = JsonOpt) -> None:
    """Show the DAG and, per stage, whether it will run and why (runs nothing; a stage the remote
    run cache holds is cached there: its entry is read, nothing downloaded)."""
    from zoo import api

    announce_remote_cache(cache_remote, recipe, as_json=as_json)
    result = api.plan(recipe, cache_dir=cache_dir, cache_remote=cache_remote)
    if as_json:  # its notes are in the document
        emit(result.to_json())
        return
    for note in result.notes:
        _echo(f"note: {note}", err=True)
    _print_plan(result, show_needs=True)


@app.command()
def status(recipe: Path = RecipeArg, why: bool = typer.Option(False, "--why", help="Say why each stage would run."),
           cache_dir: Optional[Path] = CacheDirOpt, cache_remote: Optional[str] = CacheRemoteOpt,
           as_json: bool = JsonOpt) -> None:
    """Which stages are up to date (here or on the remote run cache) and which would run (runs
    nothing). Exit 0 either way."""
    from zoo import api

    from zoo.engine.runner import StageState

    announce_remote_cache(cache_remote, recipe, as_json=as_json)
    result = api.status(recipe, cache_dir=cache_dir, cache_remote=cache_remote)
    if as_json:  # its notes are in the document
        emit(result.to_json())
        return
    for note in result.notes:
        _echo(f"note: {note}", err=True)
    from zoo.cli.tables import print_table

    stale = [s for s in result.stages if s.state != StageState.CACHED]
    rows = [[s.id, "up to date" if s.state == StageState.CACHED else "will run"]
            + (["; ".join(str(r) for r in s.reasons) if s.state != StageState.CACHED else ""] if why else [])
            for s in result.stages]
    print_table(["stage", "state"] + (["why"] if why else []), rows)
    _echo(f"\n{len(stale)} of {len(result.stages)} stages would run." if stale else "\nEverything is up to date.")


@app.command()
def validate(recipe: Path = RecipeArg, as_json: bool = JsonOpt) -> None:
    """Check a recipe (schema, stage configs, DAG) without running anything."""
    from zoo import api

    dag = api.load(recipe)
    if as_json:
        return emit({"ok": True, "recipe": str(recipe), "name": dag.recipe.name, "version": dag.recipe.version,
                     "stages": [{"id": nid, "kind": dag.nodes[nid].kind, "needs": list(dag.nodes[nid].needs)}
                                for nid in dag.order()]})
    _echo(f"{recipe}: ok — {dag.recipe.name}@{dag.recipe.version}, {len(dag.nodes)} stages: {', '.join(dag.order())}")


@app.command()
def schema(output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write to this file instead of stdout."),
           as_json: bool = typer.Option(False, "--json", help="Print {schema_version, output, schema} (the JSON "
                                                                "Schema itself is JSON: without --json it is printed as is).")) -> None:
    """Print the recipe JSON Schema (for yaml-language-server and editors)."""
    from zoo.files import atomic_write
    from zoo.engine.recipe import json_schema

    document = json_schema()
    text = json.dumps(document, indent=2, sort_keys=True) + "\n"
    if output:
        atomic_write(output, text.encode())
    if as_json:
        return emit({"output": str(output) if output else None, "schema": None if output else document})
    if output:
        _echo(f"wrote {output}")
    else:
        sys.stdout.write(text)


@app.command()
def gc(
    cache_dir: Optional[Path] = CacheDirOpt,
    keep: Optional[List[Path]] = typer.Option(None, "--keep", help="Keep only entries used by these recipes' lockfiles."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Only say what would be freed."),
    as_json: bool = JsonOpt,
) -> None:
    """Remove cache objects that no entry references, and leftovers of interrupted runs and pulls."""
    from zoo import api
    from zoo.formatting import size

    result = api.gc(cache_dir=cache_dir, keep_recipes=keep or (), dry_run=dry_run)
    if as_json:
        return emit({"dry_run": dry_run, **result, "cache_dir": str(result["cache_dir"])})
    verb = "would free" if dry_run else "freed"
    _echo(f"{verb} {size(result['bytes_freed'])}: {result['objects_removed']} objects, "
          f"{result['entries_removed']} entries ({result['cache_dir']})")
    local = result["zoo"]
    if local["blobs"] or local["partials"]:
        _echo(f"{verb} {size(local['bytes'])} in the local zoo: {local['blobs']} unreferenced blobs, "
              f"{local['partials']} abandoned partial downloads ({local['root']})")
    skipped = result.get("skipped") or {}
    labels = {"entries": "entries", "workspaces": "stage workspaces (tmp/)", "materialised": "output folders (out/)",
              "objects": "objects not yet in an entry"}
    what = ", ".join(f"{skipped[k]} {label}" for k, label in labels.items() if skipped.get(k))
    if skipped.get("runs"):
        pids = ", ".join(str(p) for p in skipped["runs"])
        _echo(f"skipped what a running `zoo run` holds (pid {pids}): {what or 'nothing yet'}; "
              "gc again after it ends to free what it no longer needs")


@app.command("kinds")
def kinds_cmd(as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")) -> None:
    """List the stage kinds (built in and from the `zoo.stages` entry points)."""
    from zoo.engine import kind_loader

    kinds = [{"kind": name, "origin": "built-in" if entry.builtin else "plugin", "target": entry.target}
             for name, entry in sorted(kind_loader.entries().items())]
    if as_json:
        return emit(kinds)
    from zoo.cli.tables import print_table

    print_table(["kind", "origin", "target"], [[k["kind"], k["origin"], k["target"]] for k in kinds])


# --- output helpers -------------------------------------------------------------------------

def _progress(dag, as_json: bool, verbose: bool = False):
    from zoo.cli.progress import NullProgress, PlainProgress, RichProgress

    if as_json:
        return NullProgress()
    if sys.stdout.isatty() and os.environ.get("TERM") != "dumb":
        return RichProgress(dag.order(), {nid: n.kind for nid, n in dag.nodes.items()}, verbose=verbose)
    return PlainProgress(verbose=verbose)


def _print_plan(result, show_needs: bool) -> None:
    from zoo.engine.runner import StageState

    _echo(f"{result.recipe}@{result.version} ({result.path})")
    for s in result.stages:
        needs = f" ← {', '.join(s.needs)}" if show_needs and s.needs else ""
        verdict = "cached" if s.state == StageState.CACHED else "run"
        why = "" if s.state == StageState.CACHED else "  (" + "; ".join(str(r) for r in s.reasons) + ")"
        _echo(f"  {s.id} [{s.kind}]{needs}: {verdict}{why}")


def _print_run_summary(result, recipe: Path) -> None:
    from zoo import api
    from zoo.engine.failures import retry_helps
    from zoo.engine.runner import log_tail

    ran = [s for s in result.stages if s.state == "done"]
    cached = [s for s in result.stages if s.state == "cached"]
    total = sum(s.duration_s for s in ran)
    for s in result.failed:
        err = s.error
        _echo(f"\nstage {s.id} failed: {err.message if err else ''}", err=True)
        if err and err.table:
            _echo(err.table, err=True)
        if err and err.hint:
            _echo(f"hint: {err.hint}", err=True)
        if s.log_path:  # a stage that failed before it started (a remote's bad bytes) has none
            _echo(f"log: {s.log_path}", err=True)
        tail = log_tail(s.log_path) if not (err and err.field) else ""  # a recipe field's error says it all
        if tail:
            _echo(f"--- last lines of the log ---\n{tail}\n---", err=True)
        if retry_helps(err):  # never for a failed gate or a version conflict: they would fail again
            _echo(f"retry with: zoo run {recipe} {s.id.split('[')[0]} --force", err=True)
    _echo(f"{result.recipe}@{result.version}: {len(ran)} ran, {len(cached)} cached"
          + (f", {len(result.failed)} failed" if result.failed else "") + f" ({total:.1f}s of stage time)")
    for s in result.stages:
        for table in api.report_tables(s):
            _print_table(table)
        for effect in s.effects:
            _echo(str(effect))
    if result.lock_changed:
        _echo(f"updated {result.lock_path}")


def _print_table(table) -> None:
    """A kind's `zoo.stage.ReportTable`: its title, then its rows laid out by rich, indented."""
    from rich.console import Console
    from rich.measure import Measurement
    from rich.padding import Padding
    from rich.table import Table
    from rich.text import Text

    _echo(f"{table.title}:" if table.columns and table.rows else table.title)
    if not table.columns or not table.rows:
        return
    grid = Table(box=None, show_header=table.show_header, header_style="bold", pad_edge=False, padding=(0, 1))
    for column in table.columns:
        grid.add_column(Text(column.header), justify=column.align, no_wrap=True)
    for row in table.rows:
        grid.add_row(*(Text(_cell(value, column)) for value, column in zip(row, table.columns)))
    indented = Padding(grid, (0, 0, 0, 2), expand=False)
    console = Console(file=sys.stdout, highlight=False)
    # as wide as the table needs: a narrow (or no) terminal must not cut or fold a cell
    needed = Measurement.get(console, console.options.update_width(1 << 20), indented).maximum
    if needed > console.width:
        console = Console(file=sys.stdout, highlight=False, width=needed)
    with console.capture() as captured:
        console.print(indented)
    _echo("\n".join(line.rstrip() for line in captured.get().splitlines()))  # no padding after the last column


def _cell(value, column) -> str:
    """One table cell as text, following its column's format (zoo.stage.Column)."""
    if value is None:
        return column.missing
    if not column.format:
        return str(value)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return column.missing
    if column.format == "size":
        from zoo.formatting import size

        return size(value)
    return format(value, column.format)


def _register_subcommands() -> None:
    """Commands that live in their own modules (registry; releases; import; exporters; remote run cache; web catalog;
    project config approval)."""
    import importlib

    for module_name in ("zoo.cli.zoo_commands", "zoo.cli.release_commands", "zoo.cli.import_command",
                        "zoo.cli.exporter_commands", "zoo.cli.cache_commands", "zoo.cli.site_commands",
                        "zoo.cli.config_commands", "zoo.cli.generate_command"):
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name != module_name:
                raise
            continue
        module.register(app)


_register_subcommands()


def main() -> None:
    """Entry point: run the app, mapping ZooError to its message, hint and exit code."""
    from zoo.errors import ExitCode, ZooError

    from zoo.cli.interrupt import Interrupted

    try:
        _app_with_json_usage_errors()
    except Interrupted as e:  # Ctrl-C: what it stopped, and that nothing was half-published
        _fail("KeyboardInterrupt", str(e), None, ExitCode.INTERRUPTED, prefix="")
    except ZooError as e:  # what the user (or their environment) must change: no traceback, no note about one
        if os.environ.get("ZOO_DEBUG"):
            raise
        _fail(type(e).__name__, e.message, e.hint, e.exit_code, getattr(e, "table", ""))
    except KeyboardInterrupt:
        _fail("KeyboardInterrupt", "interrupted", None, ExitCode.INTERRUPTED)
    except BrokenPipeError:
        raise  # a closed stdout: zoo.entry ends it quietly
    except Exception as e:  # noqa: BLE001 (anything else is a bug in zoo)
        from zoo.errors import NO_SPACE_HINT, is_no_space

        if os.environ.get("ZOO_DEBUG"):
            raise
        if isinstance(e, OSError) and is_no_space(e):
            # a full disk can surface anywhere (cache, local zoo, --to folder): one message, exit 3
            where = e.filename or _written_path(e) or "the device"
            _fail("NoSpace", f"no space left on {where}", NO_SPACE_HINT, ExitCode.STORAGE)
        if isinstance(e, OSError):  # the system refused (permissions, a vanished file): exit 3, as storage errors
            where = f" ({e.filename})" if e.filename else ""
            _fail("StorageError", f"{e.strerror or e}{where}", "check the path and its permissions; if they are "
                  "right, this is a bug in zoo: please report it", ExitCode.STORAGE, traceback_note=True)
        _fail("InternalError", f"unexpected {type(e).__name__}: {e}",
              "this is a bug in zoo: please report it with the command and the traceback", ExitCode.FAILED,
              traceback_note=True)


def _app_with_json_usage_errors() -> None:
    """Run the app; with --json, a usage error (exit 2 from the framework: a missing argument, an
    unknown option or command) is the JSON error object on stdout instead of the usage text on
    stderr, so a script always gets one document and nothing else."""
    from zoo.cli import jsonout

    if not jsonout.requested():
        app(prog_name="zoo")  # also under `python -m zoo`: completion's variable is _ZOO_COMPLETE
        return
    from typer import core

    # the framework shows a refused command line (ClickException.show) and exits 2; with --json it
    # is kept instead. Typer ≥ 0.20 carries its own copy of click (typer._click), older ones use click.
    framework = getattr(core, "_click", None) or core.click  # type: ignore[attr-defined]
    refused: list = []
    for shown in (framework.exceptions.ClickException, framework.exceptions.UsageError):  # each has its show()
        shown.show = lambda self, file=None: refused.append(self)  # type: ignore[method-assign]
    try:
        app(prog_name="zoo")
    except SystemExit:
        if refused and not jsonout.emitted():
            emit(jsonout.click_error(refused[-1]))
        raise


def _fail(error_type: str, message: str, hint: str | None, exit_code: int, table: str = "", *,
          traceback_note: bool = False, prefix: str = "error: ") -> None:
    """Exit with `exit_code` after the error's message, table and hint on stderr (and, for a bug,
    how to see its traceback); with --json, only the error object (zoo/cli/jsonout.py) on stdout."""
    from zoo.cli import jsonout

    if jsonout.requested():
        if not jsonout.emitted():  # a command that printed its document already gives no second one
            emit(jsonout.error_object(error_type, message, hint=hint, exit_code=exit_code, table=table))
        sys.exit(exit_code)
    _echo(f"{prefix}{message}", err=True)
    if table:
        _echo(table, err=True)
    if hint:
        _echo(f"hint: {hint}", err=True)
    if traceback_note:
        _echo("(set ZOO_DEBUG=1 to see the traceback)", err=True)
    sys.exit(exit_code)


def _written_path(e: BaseException) -> str | None:
    """The file a failed write() was writing, from the innermost frame's open file (write errors carry no filename)."""
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return None
    for value in tb.tb_frame.f_locals.values():
        name = getattr(value, "name", None)
        if isinstance(name, str) and hasattr(value, "write"):
            return name
    return None


if __name__ == "__main__":
    main()
