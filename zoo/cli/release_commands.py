"""Commands for reproducible releases: `zoo repro`, `zoo release`, `zoo bundle export|import`.

They only parse arguments, call `zoo.release.repro`, `zoo.release.ship` and `zoo.registry.bundle`, and print.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import List, Optional

import typer

from zoo.cli.jsonout import emit


def register(app: typer.Typer) -> None:
    app.command("repro")(repro)
    app.command("release")(release)
    bundle_app = typer.Typer(help="Air-gapped transfer: versions of the local zoo in one verified tar file.",
                             no_args_is_help=True)
    bundle_app.command("export")(bundle_export)
    bundle_app.command("import")(bundle_import)
    app.add_typer(bundle_app, name="bundle")


def repro(
    recipe: Path = typer.Argument(..., help="Path to a recipe YAML file (with its lockfile beside it).",
                                  show_default=False),
    check: bool = typer.Option(False, "--check", help="Rebuild without the cache and compare with the lockfile."),
    stage: Optional[List[str]] = typer.Option(None, "--stage", "-s", help="Only rebuild these stages."),
    jobs: int = typer.Option(1, "--jobs", "-j", min=1),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir"),
    quality_tolerance: float = typer.Option(
        0.01, "--quality-tolerance", min=0.0,
        help="On a platform class without records: how far a held-out quality metric may move (0.01: one "
             "point of accuracy; relative for error metrics such as mae)."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Rebuild a recipe's stages bit for bit and say, per stage, whether the outputs are identical
    (or, on a platform class the lockfile has no records for, numerically equivalent)."""
    from zoo.release import repro as repro_mod
    from zoo.errors import InvalidInput

    if not check:
        raise InvalidInput("zoo repro needs --check", hint=f"zoo repro {recipe} --check")
    with _stage_progress(recipe, as_json) as progress:
        report = repro_mod.check(recipe, stages=stage or None, cache_dir=cache_dir, jobs=jobs,
                                 quality_tolerance=quality_tolerance, on_update=progress.update)
    if as_json:
        emit(report.to_json())
    else:
        from zoo.cli.tables import print_table

        print_table(["stage", "status", "details"], [[s.id, s.status, "\n".join(s.details)] for s in report.stages])
        if report.bit_identical:
            verdict = "every rebuilt stage is bit-identical to the lockfile"
        elif report.ok:
            verdict = ("every rebuilt stage matches the lockfile: bit-identical, or equivalent (same outputs within "
                       "tolerance, or held-out quality) where this platform class has no record (see `equivalent`)")
        else:
            verdict = "rebuild DIFFERS from the lockfile"
        print(f"\n{report.recipe}: {verdict}")
    sys.stdout.flush()
    raise typer.Exit(0 if report.ok else 1)


def _stage_progress(recipe: Path, as_json: bool):
    """What the stages a command rebuilds are doing, on stderr (stdout keeps the command's table
    or document): a live table in a terminal, else a plain line per state change, nothing with --json."""
    from zoo.cli.progress import NullProgress, PlainProgress, RichProgress

    if as_json:
        return NullProgress()
    if sys.stderr.isatty() and os.environ.get("TERM") != "dumb":
        from rich.console import Console

        from zoo import api

        dag = api.load(recipe)
        return RichProgress(dag.order(), {nid: n.kind for nid, n in dag.nodes.items()}, console=Console(stderr=True))
    return PlainProgress(sys.stderr)


def release(
    recipe: Path = typer.Argument(..., help="Path to a recipe YAML file (with its lockfile beside it).",
                                  show_default=False),
    version: str = typer.Option(..., "--version", help="The version to release; must equal the recipe's `version:`.",
                                show_default=False),
    to: str = typer.Option(..., "--to", metavar="REMOTE",
                           help="Remote zoo to publish to: a `zoo remote` name, a folder or a URL.",
                           show_default=False),
    tag: Optional[List[str]] = typer.Option(None, "--tag", "-t", help="Tag to point at the version (repeatable), "
                                                                      "on the remote and locally."),
    allow_stale_lock: bool = typer.Option(False, "--allow-stale-lock",
                                          help="Release even if the lockfile is out of date (it is updated)."),
    jobs: int = typer.Option(1, "--jobs", "-j", min=1),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir"),
    sign: Optional[Path] = typer.Option(None, "--sign", metavar="KEY",
                                        help="Sign the version with this PEM EC private key [default: signing.key "
                                             "in $ZOO_HOME/config.yaml, else unsigned].", show_default=False),
    certificate: Optional[Path] = typer.Option(None, "--certificate", metavar="CERT",
                                               help="With --sign: the key's signing certificate (PEM), carried in "
                                                    "the signature.", show_default=False),
    certificate_chain: Optional[List[Path]] = typer.Option(None, "--certificate-chain", metavar="CERT",
                                                           help="With --certificate: intermediate certificates up "
                                                                "to the root (repeatable).", show_default=False),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Run a recipe under its lockfile, check its gates, sign the version if asked, publish it to a remote
    zoo, and tag it."""
    from zoo.cli.main import announce_remote_cache
    from zoo.errors import InvalidInput
    from zoo.release.ship import release as do_release

    signer = None
    if sign is not None:
        from zoo.registry.signing import Signer

        signer = Signer(sign.expanduser().resolve(), certificate.expanduser().resolve() if certificate else None,
                        tuple(c.expanduser().resolve() for c in certificate_chain or []))
    elif certificate is not None or certificate_chain:
        raise InvalidInput("--certificate and --certificate-chain need --sign KEY (the certificate's private key)")
    announce_remote_cache(None, recipe, as_json=as_json)  # the run under the lockfile may take stages from it
    with _stage_progress(recipe, as_json) as progress:
        result = do_release(recipe, version=version, to=to, tags=tag or [], allow_stale_lock=allow_stale_lock,
                            cache_dir=cache_dir, jobs=jobs, on_update=progress.update, sign=signer)
    if as_json:
        emit(result.to_json())
        return
    ran = f"{len(result.executed)} stage(s) ran ({', '.join(result.executed)})" if result.executed else "every stage cached"
    print(f"{result.ref}: {ran}; lockfile {'updated' if result.lock_changed else 'unchanged'}")
    for g in result.gates:
        if not g.get("implicit"):
            print(f"  gate {g.get('gate')}: {'pass' if g.get('passed', True) else 'FAIL'}")
    if result.builds or result.files:
        from zoo.formatting import short_sha
        from zoo.cli.tables import Col, print_table

        # short digests keep the table within 80 columns; --json and `zoo show --json` have them whole
        print_table(["", "name", Col("sha256", wrap=False)],
                    [["build", name, short_sha(sha)] for name, sha in result.builds.items()]
                    + [["file", path, short_sha(sha)] for path, sha in result.files.items()])
    for note in result.notes:
        print(f"note: {note}")
    if result.signature:
        from zoo.registry.signing import Verdict

        print(f"{result.ref}: {Verdict(**result.signature).describe().removesuffix(', verified')}")
    if result.created:
        from zoo.formatting import size

        print(f"published {result.ref} to {result.remote}: {result.uploaded} file(s) uploaded ({size(result.bytes)})"
              + (f", {result.skipped} already there" if result.skipped else ""))
    elif result.attachments:  # the version was there: what it lacked beside it (its signature) went up
        print(f"{result.ref} is already on {result.remote} with the same bytes: added {', '.join(result.attachments)}")
    else:
        print(f"{result.ref} is already on {result.remote} with the same bytes: nothing to upload")
    if result.tags:
        print(f"tagged {result.ref} as {', '.join(result.tags)} on {result.remote} and locally")
    sys.stdout.flush()


def bundle_export(
    refs: List[str] = typer.Argument(..., help="Versions to bundle: NAME@VERSION (or NAME@TAG).", show_default=False),
    output: Path = typer.Option(..., "--output", "-o", help="The tar file to write.", show_default=False),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Write versions of the local zoo (every build, card, lockfile, provenance) to one tar file."""
    from dataclasses import asdict

    from zoo.cli.interrupt import BUNDLE_LEFT, interruptible
    from zoo.cli.transfer import transfer_display
    from zoo.registry.bundle import export_bundle

    label = f"bundle {' '.join(refs)} to {output}"
    with interruptible(label, BUNDLE_LEFT), transfer_display(label, None, as_json) as advance:
        result = export_bundle(refs, output, progress=advance)
    if as_json:
        emit(asdict(result))
        return
    from zoo.formatting import size

    print(f"wrote {result.path}: {', '.join(result.versions)} ({result.blobs} files, {size(result.bytes)})", flush=True)


def bundle_import(
    path: Path = typer.Argument(..., help="A tar file written by `zoo bundle export`.", show_default=False),
    require_signature: bool = typer.Option(False, "--require-signature",
                                           help="Refuse the bundle if a version in it is not signed by a key you "
                                                "trust (exit 4, nothing installed)."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Verify every byte of a bundle, then install its versions into the local zoo (all or nothing)."""
    from dataclasses import asdict

    from zoo.cli.interrupt import BUNDLE_IMPORT_LEFT, interruptible
    from zoo.cli.transfer import transfer_display
    from zoo.registry.bundle import import_bundle

    label = f"import {path}"
    with interruptible(label, BUNDLE_IMPORT_LEFT), transfer_display(label, None, as_json) as advance:
        result = import_bundle(path, progress=advance, require_signature=require_signature)
    if as_json:
        emit(asdict(result))
        return
    for note in result.notes:
        print(f"note: {note}", file=sys.stderr)
    from zoo.registry.signing import Verdict

    for ref, sig in result.signatures.items():
        print(f"{ref}: {Verdict(**sig).describe()}")
    for ref in result.installed:
        print(f"imported {ref}")
    for ref in result.present:
        print(f"{ref} was already in the local zoo with the same bytes")
    from zoo.formatting import size

    print(f"{result.blobs} new file(s), {size(result.bytes)}, every sha256 verified", flush=True)
