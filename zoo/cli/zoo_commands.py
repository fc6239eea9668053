"""`zoo list/show/search/pull/push/tag/rm/fsck` and `zoo remote …`: the model zoo commands.

Only parses arguments, calls `zoo.registry.api`, and prints (rich tables, or JSON with
--json). Everything heavier than typer is imported inside the commands so `zoo --help` stays
fast. Errors are `zoo.errors` exceptions; the main CLI turns them into messages and exit codes.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import List, Optional

import typer

from zoo.cli.completion import complete_models, complete_refs, complete_remotes

JsonOpt = typer.Option(False, "--json", help="Print JSON instead of a table (docs/cli-json.md).")
REMOTE_FORMS = "a `zoo remote` name, a folder (/abs, ./rel, ~/…) or a URL (s3://…, https://…, hf://…)"
RemoteOpt = typer.Option(None, "--remote", "-r", metavar="REMOTE", autocompletion=complete_remotes,
                         help=f"Ask this remote instead of the local zoo: {REMOTE_FORMS}.")
RefArg = typer.Argument(..., help="NAME, NAME@VERSION or NAME@TAG.", show_default=False, autocompletion=complete_refs)
PinnedArg = typer.Argument(..., help="NAME@VERSION.", show_default=False, autocompletion=complete_refs)


def register(app: typer.Typer) -> None:
    """Add the zoo commands and the `remote` sub-app to the main `zoo` app."""
    app.command("list")(list_cmd)
    app.command("show")(show_cmd)
    app.command("search")(search_cmd)
    app.command("pull")(pull_cmd)
    app.command("push")(push_cmd)
    app.command("tag")(tag_cmd)
    app.command("rm")(rm_cmd)
    app.command("fsck")(fsck_cmd)
    app.command("verify")(verify_cmd)
    remote_app = typer.Typer(help="Manage remote zoos (S3, WebDAV, HTTP(S), folders, Hugging Face).",
                             no_args_is_help=True)
    remote_app.command("add")(remote_add_cmd)
    remote_app.command("list")(remote_list_cmd)
    remote_app.command("remove")(remote_remove_cmd)
    remote_app.command("gc")(remote_gc_cmd)
    app.add_typer(remote_app, name="remote")


def _print_json(obj) -> None:
    """`obj` as --json output (docs/cli-json.md): schema_version in every object."""
    from zoo.cli.jsonout import emit
    from zoo.registry.api import to_json

    emit(to_json(obj))  # the Python API's data (zoo.api returns the same), schema_version added


def _table(title: str | None, columns: list, rows: list[list], key: int | None = None) -> None:
    """A registry table in the compact style; columns marked `drop` give way on narrow outputs."""
    from zoo.cli.tables import print_table

    if title:
        print(f"{title}:", flush=True)
    print_table(columns, rows, compact=True, key=key)


def _note(text: str) -> None:
    print(f"note: {text}", file=sys.stderr, flush=True)


def list_cmd(
    name: Optional[str] = typer.Argument(None, help="Only this model (shows every version).", show_default=False,
                                         autocompletion=complete_models),
    versions: bool = typer.Option(False, "--versions", help="One row per version instead of one per model."),
    remote: Optional[str] = RemoteOpt,
    as_json: bool = JsonOpt,
) -> None:
    """List the models (or versions) in the local zoo or on a remote. An unknown NAME is exit 2."""
    from zoo.formatting import timestamp
    from zoo.cli.tables import Col
    from zoo.registry import api

    if name or versions:
        rows = api.list_versions(name, remote=remote)
        if as_json:
            return _print_json(rows)
        if not rows:
            _note("no versions" + (f" on remote {remote}" if remote else " in the local zoo"))
            return
        _table(None, [Col("name", wrap=False), Col("version", wrap=False), Col("tags"), Col("builds"),
                      Col("created (UTC)", wrap=False, drop=2), Col("task", drop=1)],
               [[v.name, v.version, ", ".join(v.tags), ", ".join(v.builds), timestamp(v.created), v.task] for v in rows])
        return
    models = api.list_models(remote=remote)
    if as_json:
        return _print_json(models)
    if not models:
        _note("no models" + (f" on remote {remote}" if remote else " in the local zoo"))
        return
    _table(None, [Col("name", wrap=False), Col("latest", wrap=False), Col("versions", align="right", wrap=False),
                  Col("tags"), Col("task", drop=1), Col("description", drop=2)],
           [[m.name, m.latest, m.versions, ", ".join(f"{t}→{v}" for t, v in sorted(m.tags.items())), m.task,
             m.description] for m in models])


def _yes_no(value: bool | None, *, no: str = "no") -> str:
    return "yes" if value else no if value is False else "-"


def _print_wrapped(lines: list[str]) -> None:
    """Lines under a heading, wrapped to the output's width (the table's, zoo/cli/tables.py)."""
    import textwrap

    from zoo.cli.tables import width

    for line in lines:
        print("\n".join(textwrap.wrap(line, width=width(), subsequent_indent="    ", break_on_hyphens=False)))


def _print_field(key: str, value) -> None:
    """`  key: value`, the value on a line of its own when both do not fit the width (never split:
    a digest or URL must stay whole to be copied)."""
    from zoo.cli.tables import width

    line = f"  {key}: {value}"
    print(line if len(line) <= width() else f"  {key}:\n    {value}")


def show_cmd(
    ref: str = RefArg,
    remote: Optional[str] = RemoteOpt,
    bom: bool = typer.Option(False, "--bom", help="Print the version's bill of materials (CycloneDX 1.6 JSON) as "
                                                  "it is stored; with --json: {schema_version, ref, source, sha256, bom}."),
    as_json: bool = JsonOpt,
) -> None:
    """Show a version: its builds, metrics, lineage, tags and bill of materials."""
    from zoo.formatting import metric, ms, short_sha, size
    from zoo.registry.manifest import describe_measured_on
    from zoo.cli.tables import Col
    from zoo.registry import api

    if bom:
        return _print_bom(api.bom(ref, remote=remote), as_json)
    data = api.show(ref, remote=remote)
    if as_json:
        return _print_json(data)
    print(f"{data['name']}@{data['version']}  ({data['source']})")
    if data.get("description"):
        _print_wrapped([f"  description: {data['description']}"])
    for key in ("task", "license"):
        if data.get(key):
            _print_field(key, data[key])
    from zoo.formatting import timestamp

    if data.get("created"):  # as the catalog and `list --versions` show it (the JSON keeps the record)
        _print_field("created", f"{timestamp(data['created'], seconds=True)} UTC")
    if data["tags"]:
        print(f"  tags: {', '.join(data['tags'])}")
    sig = data.get("signature")
    if sig:  # who the signature names; `zoo verify` checks it
        who = sig.get("problem") or (f"key {sig['fingerprint']}" if sig["method"] == "key"
                                     else f"certificate {sig['identity']} ({sig['fingerprint']})")
        _print_field("signed", f"{who} (not checked here: `zoo verify {data['name']}@{data['version']}`)")
    rows, unverified, measured, options = [], [], {}, []
    for b in data["builds"].values():
        m = b["metrics"]
        model_size = b["file"]["size"] + sum(f["size"] for f in b.get("extra_files") or ())  # with its external data
        rows.append([b["name"], b.get("format") or "onnx", b["precision"], size(model_size),
                     ms(m.get("latency_p50_ms")), metric(m.get("accuracy")), _yes_no(b.get("verified"), no="NO"),
                     short_sha(b["file"]["sha256"]), b.get("runtime") or "-", ", ".join(b["execution_providers"]),
                     _yes_no(b.get("portable")), "yes" if data["downloaded"].get(b["name"]) else "no"])
        if b.get("measured_on"):
            measured.setdefault(describe_measured_on(b["measured_on"]), []).append(b["name"])
        for provider, values in sorted((b.get("provider_options") or {}).items()):
            options.append(f"  {b['name']}: {provider} " + ", ".join(f"{k}={v}" for k, v in sorted(values.items())))
        if b.get("verified") is False:
            unverified.append(f"  {b['name']}: {b.get('unverified_reason') or 'no reason recorded'}")
    # what a build is judged by stays at any width; how and where it runs gives way first (listed below then)
    _table("builds", [Col("build", wrap=False), Col("format", wrap=False, drop=4), Col("precision", wrap=False),
                      Col("size", "right", wrap=False), Col("p50 ms", "right", wrap=False),
                      Col("accuracy", "right", wrap=False), Col("verified", wrap=False), Col("sha256", wrap=False),
                      Col("runtime", wrap=False, drop=3), Col("providers", drop=5), Col("portable", wrap=False, drop=2),
                      Col("downloaded", wrap=False, drop=1)], rows, key=0)
    _generation_table(data["builds"])
    if measured:  # long (runtime, CPU, threads): under the table, one line per distinct setting
        print("latency measured on:")
        _print_wrapped([f"  {', '.join(builds)}: {where}" for where, builds in measured.items()])
    if options:  # what a session on the build must be created with (zoo.load passes them)
        print("provider options:")
        _print_wrapped(options)
    if unverified:  # a label is a claim: say which ones were never run where they are meant to run
        print("not verified (zoo pull picks them only with --build):")
        _print_wrapped(unverified)
    lineage = data.get("lineage") or {}
    if any(lineage.values()):
        print("lineage:")
        for section, values in lineage.items():
            for k, v in sorted(values.items()):
                _print_field(f"{section}.{k}", v)
    if data.get("files"):  # version-level files: lockfile, provenance, an import's recipe...
        _table("files", [Col("file"), Col("size", "right", wrap=False), Col("sha256", wrap=False)],
               [[f["path"], size(f["size"]), short_sha(f["sha256"])] for f in data["files"]])
    imported = (data.get("extra") or {}).get("import")
    if isinstance(imported, dict):  # `zoo import`'s provenance: what the source states, nothing more
        print("imported from:")
        for k, v in imported.items():
            _print_field(k, v)
    _print_bom_summary(data)


def _print_bom(found: dict, as_json: bool) -> None:
    """`zoo show --bom`: the attachment's bytes as stored (JSON already: what tools read), or wrapped for --json."""
    import json

    if as_json:
        return _print_json({k: v for k, v in found.items() if k != "document"} | {"bom": json.loads(found["document"])})
    text = found["document"].decode("utf-8", "replace")
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    sys.stdout.flush()


def _print_bom_summary(data: dict) -> None:
    """The bill of materials in a few lines: what it lists by type, the datasets, sources and parents
    with their digests and licenses, the tools and their versions (`zoo show --bom` prints it whole)."""
    from zoo.formatting import short_sha, size

    bom = data.get("bom")
    if not bom:
        where = "" if data["source"] == "local" else f" on {data['source']}"
        _print_wrapped([f"bill of materials: none{where} (published before zoo made them"
                        + ("; `zoo release` of its recipe adds one)" if data["source"] == "local"
                           else ", or by an older zoo)")])
        return
    _print_wrapped([f"bill of materials: CycloneDX {bom.get('spec_version') or '?'}, {size(bom['size'])}, "
                    f"sha256 {short_sha(bom['sha256'])} (`zoo show {data['name']}@{data['version']} --bom` "
                    "prints it)"])
    if bom["components"]:
        _print_wrapped(["  components: " + ", ".join(f"{n} {t}" for t, n in bom["components"].items())])

    def described(e: dict) -> str:
        digest = f"sha256 {short_sha(e['sha256'])}" if e.get("sha256") else \
            f"blake3 {short_sha(e['blake3'])}" if e.get("blake3") else "no digest"
        name = f"{e['name']}@{e['version']}" if e.get("version") else e["name"]
        return f"{name} ({digest}, license {e.get('license') or 'not recorded'})"

    for key, label in (("datasets", "datasets"), ("sources", "upstream"), ("parents", "parents")):
        if bom[key]:
            _print_wrapped([f"  {label}: " + "; ".join(described(e) for e in bom[key])])
    if bom.get("files_read"):  # data files, an imported model, the recipe's code: by the digest the lock pins
        _print_wrapped(["  files read: " + ", ".join(f"{e['name']} (blake3 {short_sha(e['blake3'])})"
                                                     for e in bom["files_read"])])
    if bom["tools"]:
        _print_wrapped(["  tools: " + ", ".join(f"{t['name']} {t.get('version') or '?'}" for t in bom["tools"])])


# the generation table's headers, short enough for 80 columns, and which give way first on a narrower one
_GENERATION_COLUMNS = {"perplexity": ("perplexity", 0), "perplexity_increase": ("ppl increase", 2),
                       "greedy_matched_tokens": ("matched", 4), "greedy_agreement": ("agreement", 0),
                       "greedy_exact_match": ("exact match", 3), "latency_prefill_ms": ("prefill ms", 1),
                       "throughput_tokens_per_s": ("tokens/s", 0)}


def _generation_table(builds: dict) -> None:
    """A text-generation version's figures (verify's: perplexity, greedy agreement, prefill ms,
    decode tokens/s), one row per build that has any; nothing for other versions."""
    from zoo.cli.tables import Col
    from zoo.formatting import metric, ms
    from zoo.registry.manifest import GENERATION_METRICS, generation_figures

    figures = {name: generation_figures(b["metrics"]) for name, b in builds.items()}
    shown = [key for key, _, _ in GENERATION_METRICS if any(key in f for f in figures.values())]
    if not shown:
        return
    # ms() for the timings and the rate (2 decimals below 10, 3 significant digits above); metric() for the rest
    text = {"latency_prefill_ms": ms, "throughput_tokens_per_s": ms}
    columns = [Col(_GENERATION_COLUMNS[k][0], "right", wrap=False, drop=_GENERATION_COLUMNS[k][1]) for k in shown]
    _table("generation", [Col("build", wrap=False)] + columns,
           [[name] + [text.get(key, metric)(f.get(key)) for key in shown] for name, f in figures.items() if f], key=0)


def search_cmd(
    text: str = typer.Argument("", help="Words to find in names, descriptions and tasks.", show_default=False),
    task: Optional[str] = typer.Option(None, "--task", help="Only this task."),
    tag: Optional[str] = typer.Option(None, "--tag", help="Only versions carrying this tag (e.g. prod)."),
    max_latency: Optional[float] = typer.Option(None, "--max-latency", help="Builds with latency_p50_ms ≤ this."),
    min_accuracy: Optional[float] = typer.Option(None, "--min-accuracy", help="Builds with accuracy ≥ this."),
    all_versions: bool = typer.Option(False, "--all-versions", help="Search every version, not only the newest."),
    remote: Optional[str] = typer.Option(None, "--remote", "-r", metavar="REMOTE", autocompletion=complete_remotes,
                                         help=f"Search this remote instead of the local zoo: {REMOTE_FORMS}."),
    as_json: bool = JsonOpt,
) -> None:
    """Search the local zoo (or a remote) by text, task, tag and build metrics."""
    from zoo.formatting import metric, ms, short_sha, size
    from zoo.cli.tables import Col
    from zoo.registry import api

    rows = api.search(text, task=task, tag=tag, max_latency=max_latency, min_accuracy=min_accuracy,
                      all_versions=all_versions, remote=remote)
    if as_json:
        return _print_json(rows)
    if not rows:
        _note("no build matches" + (f" on remote {remote}" if remote else ""))
        return
    _table(None, [Col("name", wrap=False), Col("version", wrap=False), Col("build", wrap=False),
                  Col("size", "right", wrap=False, drop=2), Col("p50 ms", "right", wrap=False),
                  Col("accuracy", "right", wrap=False), Col("sha256", wrap=False, drop=1), Col("task", drop=3),
                  Col("description", drop=4)],
           [[r["name"], r["version"], r["build"], size(r.get("size")), ms(r["latency_p50_ms"]), metric(r["accuracy"]),
             short_sha(r.get("sha256")), r["task"], r["description"]] for r in rows])


def pull_cmd(
    ref: str = RefArg,
    build: Optional[str] = typer.Option(None, "--build", "-b", help="Build to pull [default: the best for this host]."),
    to: Optional[Path] = typer.Option(None, "--to", help="Place the files in this folder [default: the local zoo]."),
    remote: Optional[str] = RemoteOpt,
    offline: bool = typer.Option(False, "--offline", help="Use only the local cache; never touch the network."),
    require_signature: bool = typer.Option(False, "--require-signature",
                                           help="Refuse a version not signed by a key you trust (exit 4, nothing "
                                                "installed); docs/releases.md."),
    as_format: Optional[str] = typer.Option(
        None, "--as", help="torch: write the build as a torch.export program (.pt2: torch.export.load(path).module() "
                           "is a trainable torch.nn.Module; default build: the float32 one) in --to, else in the "
                           "current folder; prints its path.", show_default=False),
    as_json: bool = JsonOpt,
) -> None:
    """Download (verified) and place a build; prints the path of its model file."""
    from zoo.registry import api

    from zoo.cli.interrupt import PULL_LEFT, interruptible

    with interruptible(f"pull {ref}", PULL_LEFT):
        if as_format is not None:
            return _pull_as(as_format, ref, build, to, remote, offline, as_json)
        from zoo.cli.transfer import transfer_display
        from zoo.download import observe_bytes

        with transfer_display(f"pull {ref}", None, as_json, stderr=True) as advance:
            with observe_bytes(advance) if advance is not None else contextlib.nullcontext():
                result = api.pull(ref, build=build, to=to, remote=remote, offline=offline,
                                  require_signature=require_signature)
    if as_json:
        return _print_json(result)
    for n in result.notes:
        _note(n)
    if result.signature and result.signature.get("verified"):
        from zoo.registry.signing import Verdict

        _note(f"{result.ref}: {Verdict(**result.signature).describe()}")
    if result.downloaded_files:
        from zoo.formatting import size

        where = ", ".join(result.fetched_from) or result.source
        _note(f"{result.ref} [{result.build}] from {where}: {result.downloaded_files} file(s), "
              f"{size(result.downloaded_bytes)} verified")
    print(result.path, flush=True)


def _pull_as(as_format: str, ref: str, build: str | None, to: Path | None, remote: str | None, offline: bool,
             as_json: bool) -> None:
    """`zoo pull --as torch`: the build as a torch.export program (zoo.api.save_torch)."""
    from zoo.errors import InvalidInput

    if as_format != "torch":
        raise InvalidInput(f"--as {as_format!r}: the formats a build can be pulled as are: torch",
                           hint="`zoo pull NAME@VERSION --as torch` writes a torch.export program (.pt2)")
    from zoo.api import save_torch

    path = save_torch(ref, build, to=to, remote=remote, offline=offline)
    if as_json:
        return _print_json({"ref": ref, "format": "torch", "path": str(path)})
    print(path, flush=True)


def push_cmd(
    ref: str = PinnedArg,
    to: str = typer.Option(..., "--to", metavar="REMOTE", help=f"Remote to publish to: {REMOTE_FORMS}.",
                           show_default=False, autocompletion=complete_remotes),
    tag: Optional[List[str]] = typer.Option(None, "--tag", "-t", help="Also point these tags at the version there."),
    as_json: bool = JsonOpt,
) -> None:
    """Publish a local version to a remote (blobs first, manifest last; refuses to overwrite)."""
    from zoo.cli.interrupt import PUSH_LEFT, interruptible
    from zoo.cli.transfer import transfer_display
    from zoo.registry import api

    label = f"push {ref} to {to}"
    with interruptible(label, PUSH_LEFT), transfer_display(label, None, as_json) as advance:
        result = api.push(ref, to, tags=tag or [], progress=advance)
    if as_json:
        return _print_json(result)
    from zoo.formatting import size

    sent = f"{result['uploaded']} file(s) uploaded ({size(result['bytes'])})"
    if result["created"]:
        what = "published; " + sent + (f", {result['skipped']} already there" if result["skipped"] else "")
    else:  # a rerun finishing a cut-off push may still send what was missing
        what = "already there (same content); " + (sent if result["uploaded"] else "nothing to upload")
    print(f"{result['ref']} → {result['remote']}: {what}", flush=True)
    for note in result.get("notes") or []:
        print(f"note: {note}", file=sys.stderr)


def tag_cmd(
    ref: str = PinnedArg,
    tag: str = typer.Argument(..., help="Tag to point at it (moved if it exists); not `latest`, which always "
                                        "follows the newest release.", show_default=False),
    remote: Optional[str] = RemoteOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Point a tag (prod, stable…) at a version. `latest` is automatic: it cannot be set by hand."""
    from zoo.registry import api

    result = api.tag(ref, tag, remote=remote)
    if as_json:
        return _print_json(result)
    print(f"{result['ref'].split('@')[0]}@{tag} → {result['ref']} ({result['remote']})", flush=True)


def rm_cmd(
    ref: str = PinnedArg,
    remote: Optional[str] = RemoteOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Remove a version (locally, with the blobs nothing else uses; or on a remote)."""
    from zoo.registry import api

    result = api.rm(ref, remote=remote)
    if as_json:
        return _print_json(result)
    kept = f", {result['kept_young']} kept (younger than the gc grace period)" if result.get("kept_young") else ""
    print(f"removed {result['ref']} ({result['remote']}; {result['blobs_freed']} blob(s) freed{kept})", flush=True)
    if result.get("note"):
        _note(result["note"])
    name = result["ref"].split("@")[0]
    dropped = result.get("tags_dropped") or []
    if dropped:
        _note(f"dropped tag(s) {', '.join(dropped)} (they pointed at {result['ref']})")
    if "latest" in dropped:
        _note(f"{name}@latest now points at {result['latest']}" if result.get("latest") else f"no version of {name} is left")


def fsck_cmd(
    ref: Optional[str] = typer.Argument(None, help="Only this model (NAME) or version (NAME@VERSION).", show_default=False),
    repair: bool = typer.Option(False, "--repair", help="Remove corrupt blobs and snapshot files (a later pull fetches "
                                                         "them again), drop tags that point nowhere, point `latest` at the newest release, rebuild the index."),
    as_json: bool = JsonOpt,
) -> None:
    """Check the local zoo: manifests, blob contents (sha256), snapshot files, tags and the index.

    Exits 4 when something is corrupt (and was not repaired), 0 when the zoo is clean.
    """
    from zoo.errors import ExitCode, IntegrityError
    from zoo.registry import api

    report = api.fsck(ref, repair=repair)
    if as_json:
        _print_json(report)
        if not report.ok:
            raise typer.Exit(ExitCode.INTEGRITY)
        return
    if report.problems:
        _table(None, ["what", "state", "problem", "where"],
               [[p.kind, "repaired" if p.repaired else "CORRUPT", p.detail, p.where] for p in report.problems])
    print(f"checked {report.versions} version(s), {report.blobs_checked} blob(s) by sha256"
          + (f"; {report.blobs_missing} not downloaded" if report.blobs_missing else "")
          + f"; {len(report.problems)} problem(s)" + (f", {len(report.unrepaired)} left" if repair else ""), flush=True)
    if not report.ok:
        bad = report.unrepaired
        hint = ("a manifest that does not parse is never deleted: restore it, or `zoo rm` the version"
                if all(p.kind == "manifest" for p in bad) else "`zoo fsck --repair`, then pull the affected builds again")
        raise IntegrityError(f"the local zoo has {len(bad)} problem(s)", hint=hint)


def verify_cmd(
    ref: str = RefArg,
    require_signature: bool = typer.Option(False, "--require-signature", help="Refuse the version if it is not "
                                                                              "signed (exit 4)."),
    export: Optional[Path] = typer.Option(None, "--export", metavar="DIR",
                                          help="Once verified, also write the folder model_signing's own `verify` "
                                               "checks: every file, the signed zoo-manifest.json, the signature."),
    as_json: bool = JsonOpt,
) -> None:
    """Check a version of the local zoo: its signature against the keys you trust, and every stored file
    against its sha256 (exit 0 verified, 4 refused)."""
    from zoo.registry import api

    report = api.verify(ref, require_signature=require_signature)
    if export is not None:
        from zoo.registry.store import LocalZoo
        from zoo.registry.verify import export_signed

        files = export_signed(LocalZoo(), ref, export)
        report["exported"] = {"folder": str(export.expanduser().resolve()), "files": files}
    if as_json:
        return _print_json(report)
    from zoo.registry.signing import Verdict

    for n in report["notes"]:
        _note(n)
    states = list(report["files"].values())
    sig = report["signature"]
    print(f"{report['ref']}: {Verdict(**sig).describe() if sig else 'not signed'}", flush=True)
    missing = states.count("missing")
    print(f"  {states.count('ok')} file(s) match their sha256" + (f"; {missing} not downloaded" if missing else ""),
          flush=True)
    if export is not None:
        print(f"  wrote {len(report['exported']['files'])} file(s) to {report['exported']['folder']}", flush=True)


def remote_add_cmd(
    name: str = typer.Argument(..., help="Remote name.", show_default=False),
    url: Optional[str] = typer.Argument(None, help="Folder, file://, s3://bucket/prefix, webdav+https://host/path, "
                                                   "https://… (read-only) or hf://namespace.", show_default=False),
    option: Optional[List[str]] = typer.Option(None, "--option", "-o", help="KEY=VALUE, e.g. endpoint_url=http://… "
                                               "(s3), user=… password_env=VAR (webdav), endpoint=… (hf)."),
    mirror: Optional[List[str]] = typer.Option(None, "--mirror", help="Mirror URL tried after the remote (repeatable)."),
    replace: bool = typer.Option(False, "--replace", help="Replace an existing remote of that name."),
    trust: Optional[List[Path]] = typer.Option(None, "--trust", metavar="FILE",
                                               help="A PEM public key or root certificate whose signatures are "
                                                    "trusted for versions pulled from this remote (repeatable)."),
    from_dvc: Optional[str] = typer.Option(None, "--from-dvc", metavar="REMOTE",
                                           help="Instead of URL: the URL and options of this DVC remote (credentials "
                                                "stay in the environment; needs the dvc extra)."),
    dvc_repo: Path = typer.Option(Path("."), "--dvc-repo", help="The DVC repo whose config defines --from-dvc's remote."),
    as_json: bool = JsonOpt,
) -> None:
    """Add a remote zoo under a name, kept in your user config ($ZOO_CONFIG_DIR, else ~/.config/zoo/remotes.json)
    so it works whichever $ZOO_HOME is set. Credentials come from the environment, never from this config."""
    from zoo.errors import InvalidInput
    from zoo.registry import api

    options = {}
    for item in option or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InvalidInput(f"--option {item!r} is not KEY=VALUE", hint="e.g. --option endpoint_url=http://127.0.0.1:9000")
        options[key.strip()] = value.strip()
    if (url is None) == (from_dvc is None):
        raise InvalidInput("give the remote's URL or --from-dvc REMOTE (one of them)",
                           hint="zoo remote add NAME s3://bucket/prefix, or zoo remote add NAME --from-dvc storage")
    if from_dvc is None:
        r = api.remote_add(name, url, options=options, mirrors=mirror or [], replace=replace,
                           trust=[str(t) for t in trust or []])
        if as_json:
            return _print_json(r)
        print(f"remote {r['name']} → {r['url']}  (in {_remotes_file()})", flush=True)
        for path in r["trust"]:
            from zoo.registry.anchors import load_anchor

            print(f"  trusts {load_anchor(path).describe()}", flush=True)
        return
    r = api.remote_add_from_dvc(name, from_dvc, dvc_repo=dvc_repo, options=options, mirrors=mirror or [], replace=replace,
                                trust=[str(t) for t in trust or []])
    if as_json:
        return _print_json(r)
    shown = "".join(f" {k}={v}" for k, v in r["options"].items())
    print(f"remote {r['name']} → {r['url']}{shown}  (DVC remote {from_dvc!r} in {r['from_dvc']['config']})", flush=True)
    for note in r["notes"]:
        _note(note)


def _remotes_file() -> str:
    """The file `zoo remote add` wrote to (zoo.registry.config)."""
    from zoo.registry.config import RemotesConfig
    from zoo.registry.store import LocalZoo

    return str(RemotesConfig(LocalZoo().root).path)


def remote_list_cmd(as_json: bool = JsonOpt) -> None:
    """List the remotes, in the order pulls try them."""
    from zoo.registry import api

    rows = api.remote_list()
    if as_json:
        return _print_json(rows)
    if not rows:
        _note("no remotes; add one with `zoo remote add NAME URL`")
        return
    _table(None, ["name", "kind", "url", "options", "mirrors"],
           [[r["name"], r["kind"] + (" (read-only)" if r["read_only"] else ""), r["url"],
             ", ".join(f"{k}={v}" for k, v in r["options"].items()), ", ".join(r["mirrors"])] for r in rows])
    from zoo.registry.config import RemotesConfig
    from zoo.registry.store import LocalZoo

    for path, names in RemotesConfig(LocalZoo().root).sources().items():  # the user's config, an older $ZOO_HOME file
        _note(f"{', '.join(names)} kept in {path}")
    for r in rows:  # not a column: paths are long, and the table keeps to the terminal's width
        if r.get("trust"):
            _note(f"{r['name']} trusts signatures by {', '.join(r['trust'])}")


def remote_remove_cmd(name: str = typer.Argument(..., help="Remote name.", show_default=False,
                                                autocompletion=complete_remotes),
                      as_json: bool = JsonOpt) -> None:
    """Remove a remote from the config (nothing on the remote is touched)."""
    from zoo.registry import api

    result = api.remote_remove(name)
    if as_json:
        return _print_json(result)
    print(f"removed remote {name}", flush=True)


def remote_gc_cmd(
    name: str = typer.Argument(..., metavar="REMOTE", help=f"The remote: {REMOTE_FORMS}.", show_default=False),
    dry_run: bool = typer.Option(False, "--dry-run", help="Only report what would be freed."),
    grace: Optional[float] = typer.Option(None, "--grace", help="Keep blobs younger than this many seconds "
                                          "[default: the remote's gc_grace option, else 3600].", show_default=False),
    as_json: bool = JsonOpt,
) -> None:
    """Free the blobs on a remote that no version there references (never younger than the grace period)."""
    from zoo.registry import api

    from zoo.formatting import size

    result = api.remote_gc(name, dry_run=dry_run, grace_s=grace)
    if as_json:
        return _print_json(result)
    verb = "would free" if dry_run else "freed"
    print(f"remote {result['remote']}: {verb} {result['blobs_freed']} blob(s), {size(result['bytes_freed'])}; "
          f"{result['kept_young']} unreferenced blob(s) younger than {result['grace_s']:g} s kept", flush=True)
