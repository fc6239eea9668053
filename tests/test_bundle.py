"""Air-gapped bundles: export versions to one tar, import them into a fresh zoo, every byte verified."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from cli_helpers import zoo as zoo_cli
from zoo.errors import Conflict, IntegrityError, NotFound, UnsafePath
from zoo.registry.bundle import INDEX, export_bundle, import_bundle
from zoo.registry.codec import same_content
from zoo.registry.manifest import MANIFEST_FILE, Manifest
from zoo.registry.staging import file_ref, write_manifest
from zoo.registry.store import LocalZoo
from registry_servers import make_staging


def _staging(root: Path, version: str, scale: float) -> Path:
    """A two-build version with a version-level file (like a release's zoo.lock)."""
    make_staging(root, version=version, scale=scale,
                 builds={"cpu-fp32": {"metrics": {"accuracy": 0.9}}, "cpu-int8": {"precision": "int8"}})
    (root / "zoo.lock").write_text(f"schema_version: 1\nversion: {version}\n")
    m = Manifest.model_validate_json((root / MANIFEST_FILE).read_text())
    write_manifest(root, m.model_copy(update={"files": [file_ref(root, "zoo.lock")]}))
    return root


@pytest.fixture
def source(tmp_path) -> LocalZoo:
    zoo = LocalZoo(tmp_path / "connected")
    zoo.publish(_staging(tmp_path / "s1", "1.0.0", 2.0))
    zoo.publish(_staging(tmp_path / "s2", "1.1.0", 5.0))
    zoo.tag("tiny", "1.0.0", "prod")
    return zoo


def _files(zoo: LocalZoo, ref: str) -> dict[str, bytes]:
    m = zoo.resolve(ref)
    return {f.path: zoo.blobs.path(f.sha256).read_bytes() for f in m.all_files()}


def _rewrite(src: Path, dst: Path, *, change=None, add=()) -> Path:
    """Copy a tar member by member, replacing some members' bytes and appending others."""
    change = change or {}
    with tarfile.open(src) as tin, tarfile.open(dst, "w") as tout:
        for m in tin.getmembers():
            data = tin.extractfile(m).read()
            data = change[m.name](data) if m.name in change else data
            m.size = len(data)
            tout.addfile(m, io.BytesIO(data))
        for info, data in add:
            tout.addfile(info, io.BytesIO(data) if data is not None else None)
    return dst


def _nothing_installed(zoo: LocalZoo) -> None:
    assert zoo.list() == []
    blobs = zoo.root / "blobs" / "sha256"
    assert not blobs.exists() or not any(p.is_file() for p in blobs.rglob("*"))


def test_round_trip_into_a_fresh_zoo(source, tmp_path):
    out = export_bundle(["tiny@1.1.0", "tiny@prod"], tmp_path / "b" / "models.tar", zoo=source)
    assert out.versions == ["tiny@1.0.0", "tiny@1.1.0"] and Path(out.path).is_file()
    with tarfile.open(out.path) as tar:
        names = tar.getnames()
        assert names[0] == INDEX and all(tar.getmember(n).isfile() for n in names)
        index = json.loads(tar.extractfile(INDEX).read())
    # schema 2: each version carries the bill of materials publishing made (tests/test_attachments.py: without, 1)
    assert index["schema_version"] == 2 and [v["version"] for v in index["versions"]] == ["1.0.0", "1.1.0"]
    assert len(index["blobs"]) == out.blobs

    fresh = LocalZoo(tmp_path / "airgapped")
    got = import_bundle(out.path, zoo=fresh)
    assert got.installed == ["tiny@1.0.0", "tiny@1.1.0"] and got.present == [] and got.blobs == out.blobs
    for ref in ("tiny@1.0.0", "tiny@1.1.0"):
        assert same_content(fresh.resolve(ref), source.resolve(ref))
        assert fresh.attachments("tiny", ref[5:]) == source.attachments("tiny", ref[5:]) != {}
        assert _files(fresh, ref) == _files(source, ref)  # every build, card and zoo.lock, byte for byte
    assert fresh.resolve("tiny").version == "1.1.0"  # `latest` follows the highest version
    model = fresh.materialize(fresh.resolve("tiny@1.0.0"), "cpu-int8", tmp_path / "use")
    assert model.read_bytes() == _files(source, "tiny@1.0.0")["builds/cpu-int8/model.onnx"]
    assert (tmp_path / "use" / "zoo.lock").read_text().endswith("version: 1.0.0\n")  # version files come along

    again = import_bundle(out.path, zoo=fresh)  # importing twice is a no-op
    assert again.installed == [] and again.present == ["tiny@1.0.0", "tiny@1.1.0"] and again.blobs == 0


def test_export_is_deterministic_and_atomic(source, tmp_path):
    a = export_bundle(["tiny@1.0.0"], tmp_path / "a.tar", zoo=source)
    b = export_bundle(["tiny@1.0.0"], tmp_path / "b.tar", zoo=source)
    assert Path(a.path).read_bytes() == Path(b.path).read_bytes()
    assert not list(tmp_path.glob(".*.tmp"))  # written to a temp file, then renamed: no leftovers


def test_export_refuses_versions_whose_files_are_not_local(source, tmp_path):
    partial = LocalZoo(tmp_path / "partial")
    partial.adopt(source.resolve("tiny@1.0.0"))  # manifest only, as after `zoo pull --build` of nothing
    with pytest.raises(NotFound, match="not in the local zoo"):
        export_bundle(["tiny@1.0.0"], tmp_path / "x.tar", zoo=partial)
    assert not (tmp_path / "x.tar").exists()


def test_tampered_blob_is_refused_and_nothing_is_installed(source, tmp_path):
    good = Path(export_bundle(["tiny@1.0.0", "tiny@1.1.0"], tmp_path / "good.tar", zoo=source).path)
    sha = source.resolve("tiny@1.1.0").builds["cpu-int8"].file.sha256
    flip = lambda data: data[:-1] + bytes([data[-1] ^ 0xFF])  # noqa: E731
    bad = _rewrite(good, tmp_path / "bad.tar", change={f"blobs/sha256/{sha}": flip})
    fresh = LocalZoo(tmp_path / "airgapped")
    with pytest.raises(IntegrityError, match="does not match"):
        import_bundle(bad, zoo=fresh)
    _nothing_installed(fresh)  # not even tiny@1.0.0, whose blobs were fine
    truncated = _rewrite(good, tmp_path / "short.tar", change={f"blobs/sha256/{sha}": lambda d: d[:-4]})
    with pytest.raises(IntegrityError, match="bytes"):
        import_bundle(truncated, zoo=fresh)
    _nothing_installed(fresh)
    edited = _rewrite(good, tmp_path / "edited.tar",
                      change={"manifests/tiny/1.0.0.json": lambda d: d.replace(b'"mit"', b'"gpl"')})
    with pytest.raises(IntegrityError, match="does not match its sha256"):
        import_bundle(edited, zoo=fresh)
    _nothing_installed(fresh)


@pytest.mark.parametrize("name,kind", [("../evil", tarfile.REGTYPE), ("/etc/evil", tarfile.REGTYPE),
                                       ("blobs/../../evil", tarfile.REGTYPE), ("blobs/sha256/link", tarfile.SYMTYPE),
                                       ("dev", tarfile.CHRTYPE), ("notes.txt", tarfile.REGTYPE)])
def test_hostile_members_are_refused(source, tmp_path, name, kind):
    good = Path(export_bundle(["tiny@1.0.0"], tmp_path / "good.tar", zoo=source).path)
    info = tarfile.TarInfo(name)
    info.type = kind
    data = None
    if kind == tarfile.REGTYPE:
        data = b"pwned\n"
        info.size = len(data)
    elif kind == tarfile.SYMTYPE:
        info.linkname = "/etc/passwd"
    bad = _rewrite(good, tmp_path / "bad.tar", add=[(info, data)])
    fresh = LocalZoo(tmp_path / "airgapped")
    expected = IntegrityError if name == "notes.txt" else UnsafePath
    with pytest.raises(expected):
        import_bundle(bad, zoo=fresh)
    _nothing_installed(fresh)
    assert not (tmp_path / "evil").exists()


def test_a_different_version_already_installed_is_a_conflict(source, tmp_path):
    bundle = export_bundle(["tiny@1.0.0", "tiny@1.1.0"], tmp_path / "b.tar", zoo=source).path
    target = LocalZoo(tmp_path / "target")
    target.publish(_staging(tmp_path / "other", "1.1.0", 9.0))  # same version, other bytes
    with pytest.raises(Conflict, match="tiny@1.1.0"):
        import_bundle(bundle, zoo=target)
    assert target.get("tiny", "1.0.0") is None  # all or nothing


def test_cli_round_trip_and_exit_codes(source, tmp_path):
    out = tmp_path / "cli.tar"
    cli = zoo_cli("bundle", "export", "tiny@1.0.0", "tiny@1.1.0", "-o", out, env={"ZOO_HOME": str(source.root)})
    assert cli.code == 0, cli.text
    assert "tiny@1.0.0, tiny@1.1.0" in cli.out
    home = tmp_path / "cli-home"
    cli = zoo_cli("bundle", "import", out, "--json", env={"ZOO_HOME": str(home)})
    assert cli.code == 0, cli.text
    assert json.loads(cli.out)["installed"] == ["tiny@1.0.0", "tiny@1.1.0"]
    shown = zoo_cli("show", "tiny@1.1.0", "--json", env={"ZOO_HOME": str(home)})
    assert shown.code == 0 and json.loads(shown.out)["downloaded"] == {"cpu-fp32": True, "cpu-int8": True}
    sha = source.resolve("tiny@1.0.0").builds["cpu-fp32"].file.sha256
    bad = _rewrite(out, tmp_path / "bad.tar", change={f"blobs/sha256/{sha}": lambda d: d[:-1] + b"\x00"})
    cli = zoo_cli("bundle", "import", bad, env={"ZOO_HOME": str(tmp_path / "cli-home-2")})
    assert cli.code == 4 and "does not match" in cli.err, cli.text
    cli = zoo_cli("bundle", "export", "nope@1.0.0", "-o", tmp_path / "n.tar", env={"ZOO_HOME": str(home)})
    assert cli.code == 2 and "nope" in cli.err


# ---- bombs: a small bundle that claims a big member (issue #11) ---------------------------------
CLAIM = 64 << 20  # what the hostile bundle claims for one member; it writes none of it


def _claiming_bundle(source: LocalZoo, tmp_path: Path, how: str) -> Path:
    """A bundle whose index and manifest consistently claim a CLAIM-byte model file whose bytes
    (zeros) do not match its sha256: stored sparse by GNU tar (KBs on disk), or gzip-compressed."""
    import hashlib
    import subprocess

    from zoo.registry.codec import dump_manifest
    from zoo.registry.manifest import FileRef

    m = source.resolve("tiny@1.0.0")
    fake = hashlib.sha256(b"not these bytes").hexdigest()
    hostile = m.model_copy(deep=True)
    hostile.builds["cpu-fp32"].file = FileRef(path=m.builds["cpu-fp32"].file.path, sha256=fake, size=CLAIM)
    data = dump_manifest(hostile)
    index = {"schema_version": 1, "blobs": {f.sha256: f.size for f in hostile.all_files()},
             "versions": [{"name": "tiny", "version": "1.0.0", "manifest": "manifests/tiny/1.0.0.json",
                           "manifest_sha256": hashlib.sha256(data).hexdigest()}]}
    tree = tmp_path / f"tree-{how}"
    (tree / "manifests" / "tiny").mkdir(parents=True)
    (tree / "blobs" / "sha256").mkdir(parents=True)
    (tree / INDEX).write_text(json.dumps(index))
    (tree / "manifests" / "tiny" / "1.0.0.json").write_bytes(data)
    for f in hostile.all_files():
        if f.sha256 != fake:
            (tree / "blobs" / "sha256" / f.sha256).write_bytes(source.blobs.path(f.sha256).read_bytes())
    with open(tree / "blobs" / "sha256" / fake, "wb") as z:
        z.truncate(CLAIM)  # a hole: no block written
    names = [INDEX, "manifests/tiny/1.0.0.json", *sorted(f"blobs/sha256/{p.name}" for p in (tree / "blobs" / "sha256").iterdir())]
    out = tmp_path / f"bomb-{how}.tar"
    if how == "sparse":
        subprocess.run(["tar", "--sparse", "--format=gnu", "-cf", str(out), "-C", str(tree), *names], check=True)
    else:
        out = out.with_suffix(".tar.gz")
        with tarfile.open(out, "w:gz", compresslevel=1) as tar:
            for n in names:
                tar.add(tree / n, arcname=n)
    assert out.stat().st_size < 2 << 20
    return out


@pytest.mark.parametrize("how", ["sparse", "gzip"])
def test_a_bundle_claiming_a_huge_member_is_refused_before_writing_it(source, tmp_path, how):
    import subprocess
    import sys

    bomb = _claiming_bundle(source, tmp_path, how)
    home = tmp_path / "airgapped"
    # the real CLI in a process of its own, which reports how many bytes it wrote (Linux /proc)
    script = ("import atexit, runpy, sys\n"
              "atexit.register(lambda: sys.stderr.write('\\nWCHAR=' + next(l.split()[1] for l in open('/proc/self/io')"
              " if l.startswith('wchar')) + '\\n'))\n"
              f"sys.argv = ['zoo', 'bundle', 'import', {str(bomb)!r}]\n"
              "runpy.run_module('zoo', run_name='__main__')\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={**__import__("os").environ, "ZOO_HOME": str(home)}, timeout=300)
    assert proc.returncode == 4, proc.stderr
    written = int(proc.stderr.rsplit("WCHAR=", 1)[1].split()[0])
    assert written < 4 << 20, f"{written} bytes written for a bundle that claims {CLAIM}"
    _nothing_installed(LocalZoo(home))


def test_a_bundle_manifest_with_an_escaping_path_exits_4(source, tmp_path):
    import hashlib

    good = Path(export_bundle(["tiny@1.0.0"], tmp_path / "good.tar", zoo=source).path)
    with tarfile.open(good) as t:
        manifest = json.loads(t.extractfile("manifests/tiny/1.0.0.json").read())
        index = json.loads(t.extractfile(INDEX).read())
    manifest["card"]["path"] = "../../outside.md"
    data = json.dumps(manifest).encode()
    index["versions"][0]["manifest_sha256"] = hashlib.sha256(data).hexdigest()
    bad = _rewrite(good, tmp_path / "bad.tar", change={"manifests/tiny/1.0.0.json": lambda _: data,
                                                      INDEX: lambda _: json.dumps(index).encode()})
    cli = zoo_cli("bundle", "import", bad, env={"ZOO_HOME": str(tmp_path / "home")})
    assert cli.code == 4 and "escapes its folder" in cli.err, cli.text
    _nothing_installed(LocalZoo(tmp_path / "home"))
