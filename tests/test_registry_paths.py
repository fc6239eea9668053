"""Manifest and path safety state their invariants directly (issue #18, mutation area
registry-paths): a manifest path is a plain relative POSIX path inside its version, whatever
spelling tries to leave it; safe_join also refuses symbolic links out; ONNX external data stays
inside the version and must be a listed file; an escaping path in a manifest is UnsafePath
(exit 4) while any other bad field is InvalidInput (exit 2); the manifest's fields keep their
formats and defaults; the canonical encoding and the "same content" key are stable. In-process
and fast: every mutant of manifest.py, zoo/pathsafety.py and codec.py runs these first."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from zoo.errors import InvalidInput, StorageError, UnsafePath
from zoo.registry.codec import content_key, dump_manifest, load_manifest, read_manifest_file, same_content, utc_now
from zoo.pathsafety import EscapingPath, check_external_data, check_relative_path, external_data_locations, safe_join
from zoo.registry.manifest import MANIFEST_FILE, MANIFEST_SCHEMA_VERSION, Build, FileRef, Manifest
from registry_servers import tiny_onnx

SHA = "a" * 64

ESCAPING = ["../x", "a/../../x", "a/..", "..", "/etc/passwd", "/", "C:/x", "c:x", "x:y", "a\\b", "..\\x", "a\x00b", "",
            "./..", "a/./../.."]
SAFE = ["x", "a/b/c.onnx", "builds/cpu-fp32/model.onnx", "a..b", "..a", "a/..b/c", ".hidden", "a/.b", "1:2", "a/c:x"]


# ---- check_relative_path -----------------------------------------------------------------
@pytest.mark.parametrize("path", ESCAPING)
def test_paths_that_leave_their_folder_are_refused(path):
    with pytest.raises(EscapingPath):
        check_relative_path(path)
    assert issubclass(EscapingPath, ValueError)  # pydantic reports it as a field error


@pytest.mark.parametrize("path", SAFE)
def test_plain_relative_paths_are_kept(path):
    assert check_relative_path(path) == path


def test_a_relative_path_is_normalised_to_posix():
    assert check_relative_path("a/./b") == "a/b"
    assert check_relative_path("a/b/") == "a/b"
    assert check_relative_path("./a") == "a"
    assert check_relative_path("a//b") == "a/b"


def test_the_refusal_says_which_path_and_why():
    with pytest.raises(EscapingPath, match=re.escape("path '../x' escapes its folder")):
        check_relative_path("../x")
    with pytest.raises(EscapingPath, match=re.escape("invalid path 'a\\\\b'")):
        check_relative_path("a\\b")


# ---- the manifest's fields -----------------------------------------------------------------
def _ref(path="m.onnx", **kw) -> dict:
    return {"path": path, "sha256": SHA, "size": 1, **kw}


def _manifest(**kw) -> dict:
    return {"name": "tiny", "version": "1.0.0", "builds": {"cpu": {"name": "cpu", "file": _ref()}}, **kw}


@pytest.mark.parametrize("path", ESCAPING)
def test_a_file_ref_refuses_an_escaping_path(path):
    with pytest.raises(ValidationError):
        FileRef(**_ref(path))


@pytest.mark.parametrize("field,value,ok", [
    ("sha256", "a" * 64, True), ("sha256", "0123456789abcdef" * 4, True), ("sha256", "a" * 63, False),
    ("sha256", "a" * 65, False), ("sha256", "A" * 64, False), ("sha256", "g" * 64, False),
    ("size", 0, True), ("size", -1, False), ("size", 10**12, True),
])
def test_a_file_ref_checks_its_digest_and_size(field, value, ok):
    kw = {**_ref(), field: value}
    if ok:
        assert getattr(FileRef(**kw), field) == value
    else:
        with pytest.raises(ValidationError):
            FileRef(**kw)


@pytest.mark.parametrize("name,ok", [("tiny", True), ("a", True), ("0net", True), ("res-net_50.v2", True),
                                     ("Tiny", False), ("-x", False), (".x", False), ("_x", False), ("", False),
                                     ("a b", False), ("a/b", False), ("tiny\n", False)])
def test_model_and_build_names_are_lowercase_slugs(name, ok):
    for make in (lambda: Manifest(**_manifest(name=name)),
                 lambda: Build(name=name, file=FileRef(**_ref()))):
        if ok:
            make()
        else:
            with pytest.raises(ValidationError):
                make()


@pytest.mark.parametrize("version,ok", [("1.0.0", True), ("0.0.0", True), ("10.20.30", True), ("1.0.0-rc.1", True),
                                        ("1.0.0+build.5", True), ("1.0.0-a-b", True), ("1.0", False), ("1", False),
                                        ("v1.0.0", False), ("1.0.0.0", False), ("1.0.0-", False), ("1.0.0 ", False),
                                        ("1.0.0\n", False), ("1.0.0-r c", False), ("a.b.c", False)])
def test_versions_are_semver(version, ok):
    if ok:
        assert Manifest(**_manifest(version=version)).version == version
    else:
        with pytest.raises(ValidationError):
            Manifest(**_manifest(version=version))


def test_unknown_fields_are_refused_everywhere():
    with pytest.raises(ValidationError):
        Manifest(**_manifest(surprise=1))
    with pytest.raises(ValidationError):
        FileRef(**_ref(), surprise=1)
    with pytest.raises(ValidationError):
        Manifest(**_manifest(builds={"cpu": {"name": "cpu", "file": _ref(), "surprise": 1}}))
    with pytest.raises(ValidationError):
        Manifest(**_manifest(lineage={"surprise": {}}))
    with pytest.raises(ValidationError):
        Manifest(**_manifest(schema_version=5))


def test_a_manifest_of_a_newer_schema_is_refused_with_an_upgrade_hint_and_an_older_one_reads():
    import json

    from zoo.errors import InvalidInput
    from zoo.registry.codec import load_manifest

    with pytest.raises(InvalidInput) as e:
        load_manifest(json.dumps(_manifest(schema_version=5)), "m.json")
    assert "schema_version 5" in e.value.message and "upgrade zoo" in e.value.hint
    old = load_manifest(json.dumps(_manifest(schema_version=1)), "m.json")
    b = old.builds["cpu"]
    assert (old.schema_version, b.runtime, b.portable, b.verified, b.measured_on) == (1, "", None, None, {})
    two = load_manifest(json.dumps(_manifest(schema_version=2)), "m.json")
    assert (two.schema_version, two.builds["cpu"].provider_options) == (2, {})  # before schema 3: none recorded
    three = load_manifest(json.dumps(_manifest(schema_version=3)), "m.json")
    assert three.builds["cpu"].quantization is None  # before schema 4: not recorded


def test_a_build_with_its_quantization_is_schema_4_and_one_without_keeps_schema_3_bytes():
    """Schema 4 adds a build's `quantization`; a manifest is written at the lowest version that holds
    what it says, so a release without a weight-only build keeps its version-3 bytes."""
    from zoo.registry.codec import dump_manifest, load_manifest

    plain = Manifest(**_manifest())
    assert plain.schema_version == 3 and b'"quantization"' not in dump_manifest(plain)
    record = {"method": "weight_only", "algorithm": "rtn", "bits": 4, "block_size": 32, "symmetric": False,
              "accuracy_level": "int8"}
    q = Manifest(**_manifest(builds={"cpu-int4-rtn-b32": {"name": "cpu-int4-rtn-b32", "file": _ref(),
                                                          "precision": "int4", "quantization": record}}))
    assert q.schema_version == 4
    back = load_manifest(dump_manifest(q), "m.json")
    assert back.builds["cpu-int4-rtn-b32"].quantization == record and back.schema_version == 4
    with pytest.raises(ValidationError, match="schema_version 3 does not have"):
        Manifest(**_manifest(schema_version=3, builds={"cpu": {"name": "cpu", "file": _ref(), "quantization": record}}))
    with pytest.raises(ValidationError):  # a stranger's figure out of bounds
        Manifest(**_manifest(builds={"cpu": {"name": "cpu", "file": _ref(), "quantization": {"bits": 10**30}}}))


def test_manifest_and_build_defaults():
    m = Manifest(**_manifest())
    assert (m.schema_version, MANIFEST_SCHEMA_VERSION, MANIFEST_FILE) == (3, 4, "zoo-manifest.json")
    assert (m.description, m.task, m.license, m.created, m.card, m.files, m.extra) == ("", "", "unspecified", None, None, [], {})
    assert m.lineage.model_dump() == {"recipe": {}, "stages": {}, "sources": {}, "tools": {}}
    b = m.builds["cpu"]
    assert (b.format, b.precision, b.opset, b.inputs, b.outputs) == ("onnx", "fp32", None, [], [])
    assert b.execution_providers == ["CPUExecutionProvider"]
    assert (b.requires, b.metrics, b.test_vectors, b.extra_files, b.provider_options) == ({}, {}, [], [], {})
    assert Manifest(**_manifest(builds={"m": {"name": "m", "file": _ref(), "format": "ort"}})).builds["m"].format == "ort"
    with pytest.raises(ValidationError):
        Manifest(**_manifest(builds={"m": {"name": "m", "file": _ref(), "format": "tflite"}}))
    assert m.ref == "tiny@1.0.0"


def test_all_files_lists_builds_first_then_card_then_version_files_without_duplicates():
    m = Manifest(**_manifest(
        builds={"a": {"name": "a", "file": _ref("a/m.onnx"), "test_vectors": [_ref("a/t.npz")],
                      "extra_files": [_ref("shared.bin")]},
                "b": {"name": "b", "file": _ref("b/m.onnx"), "extra_files": [_ref("shared.bin", size=2)]}},
        card=_ref("README.md"), files=[_ref("zoo.lock"), _ref("a/m.onnx", size=3)]))
    assert m.builds["a"].all_files() == [FileRef(**_ref("a/m.onnx")), FileRef(**_ref("a/t.npz")), FileRef(**_ref("shared.bin"))]
    assert [(f.path, f.size) for f in m.all_files()] == [
        ("a/m.onnx", 1), ("a/t.npz", 1), ("shared.bin", 1), ("b/m.onnx", 1), ("README.md", 1), ("zoo.lock", 1)]
    assert [f.path for f in Manifest(**_manifest()).all_files()] == ["m.onnx"]  # no card: nothing else


# ---- load_manifest: exit 4 for an escaping path, exit 2 for the rest -----------------------------
@pytest.mark.parametrize("where", ["builds.cpu.file.path", "card.path", "files.0.path", "builds.cpu.extra_files.0.path",
                                   "builds.cpu.test_vectors.0.path"])
def test_an_escaping_path_anywhere_in_a_manifest_is_unsafe_path(where):
    raw = _manifest(card=_ref("README.md"), files=[_ref("f")])
    raw["builds"]["cpu"].update(extra_files=[_ref("e")], test_vectors=[_ref("t")])
    node = raw
    *parents, last = where.split(".")
    for p in parents:
        node = node[int(p)] if p.isdigit() else node[p]
    node[last] = "../../etc/passwd"
    raw["license"] = 5  # another bad field too: the escape still decides the error class
    with pytest.raises(UnsafePath) as e:
        load_manifest(json.dumps(raw), "remote:tiny")
    assert e.value.message.startswith(f"remote:tiny: manifest field {where}: ")
    assert "../../etc/passwd" in e.value.message and "leave their version" in e.value.hint
    assert UnsafePath.exit_code == 4


def test_a_manifest_with_other_bad_fields_is_invalid_input_naming_the_first():
    raw = _manifest(version="one")
    with pytest.raises(InvalidInput) as e:
        load_manifest(json.dumps(raw).encode(), "m.json")
    assert not isinstance(e.value, UnsafePath) and InvalidInput.exit_code == 2
    assert e.value.message.startswith("m.json: invalid manifest field version: ")
    assert "zoo.registry.manifest.Manifest" in e.value.hint
    with pytest.raises(InvalidInput, match="m.json: invalid manifest field manifest: "):
        load_manifest("[]", "m.json")  # not an object: no field to name
    with pytest.raises(InvalidInput, match="m.json: invalid manifest field name: "):
        load_manifest(json.dumps(_manifest(name="Bad", version="one", license=5)), "m.json")  # the first of three


@pytest.mark.parametrize("data", [b"{", b"\xff\xfe", "not json"])
def test_a_manifest_that_is_not_json_is_invalid_input(data):
    with pytest.raises(InvalidInput, match="m.json: not valid JSON") as e:
        load_manifest(data, "m.json")
    assert not isinstance(e.value, UnsafePath) and "republish" in e.value.hint


def test_read_manifest_file(tmp_path):
    m = Manifest(**_manifest())
    p = tmp_path / MANIFEST_FILE
    p.write_bytes(dump_manifest(m))
    assert read_manifest_file(p) == m
    with pytest.raises(FileNotFoundError):
        read_manifest_file(tmp_path / "missing.json")
    with pytest.raises(StorageError, match="cannot read manifest"):
        read_manifest_file(tmp_path)  # a folder: an OSError other than not-found
    p.write_text("{")
    with pytest.raises(InvalidInput, match=re.escape(str(p))):
        read_manifest_file(p)


# ---- the canonical encoding and "same content" -----------------------------------------------------
def test_dump_manifest_is_canonical_and_round_trips():
    m = Manifest(**_manifest(description="modèle", extra={"b": 1, "a": [1, 2]}))
    data = dump_manifest(m)
    assert data == (json.dumps(m.model_dump(mode="json"), sort_keys=True, indent=2, ensure_ascii=False) + "\n").encode()
    assert "modèle".encode() in data and data.endswith(b"}\n") and b'\n  "builds": {' in data
    assert load_manifest(data, "x") == m and dump_manifest(load_manifest(data, "x")) == data


def _timed(**changes) -> Manifest:
    raw = _manifest(created="2026-01-01T00:00:00.000000Z", card=_ref("README.md"),
                    extra={"deploy": {"measured": {"t": 1}, "verification": {"g": 1}, "gates": ["acc"]}, "other": 1,
                           "shipper": {"measured": {"t": 1}, "notice": "x"}})
    raw["builds"]["cpu"]["metrics"] = {"latency_p50_ms": 1.0, "throughput_ips": 5.0, "speedup_vs_fp32": 1.1, "accuracy": 0.9}
    for path, value in changes.items():
        node = raw
        *parents, last = path.split("__")
        for p in parents:
            node = node[p]
        node[last] = value
    return Manifest(**raw)


@pytest.mark.parametrize("path,value", [
    ("created", "2030-01-01T00:00:00.000000Z"), ("created", None), ("card", None), ("card", _ref("README.md", size=9)),
    ("builds__cpu__metrics__latency_p50_ms", 9.0), ("builds__cpu__metrics__throughput_ips", 1.0),
    ("builds__cpu__metrics__speedup_vs_fp32", 2.0), ("extra__deploy__measured", {"t": 2}),
    ("extra__deploy__verification", {}),
    ("extra__shipper__measured", {"t": 3}),  # any publishing kind's section, not only deploy's
])
def test_a_republish_that_differs_only_in_measurements_has_the_same_content(path, value):
    assert same_content(_timed(), _timed(**{path: value}))


@pytest.mark.parametrize("path,value", [
    ("builds__cpu__metrics__accuracy", 0.8), ("builds__cpu__metrics__p_latency", 1.0), ("license", "mit"),
    ("description", "other"), ("extra__deploy__gates", []), ("extra__other", 2), ("builds__cpu__file", _ref(size=2)),
    ("extra__shipper__notice", "y"),
    ("builds__cpu__opset", 17), ("lineage", {"recipe": {"digest": "b" * 64}}), ("files", [_ref("zoo.lock")]),
])
def test_any_other_difference_is_different_content(path, value):
    assert not same_content(_timed(), _timed(**{path: value}))


def test_content_key_is_compact_sorted_json_and_leaves_the_manifest_alone():
    m = _timed()
    before = m.model_dump(mode="json")
    key = content_key(m)
    obj = json.loads(key)
    assert key == json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()
    assert "created" not in obj and "card" not in obj
    assert obj["builds"]["cpu"]["metrics"] == {"accuracy": 0.9}
    assert obj["extra"] == {"deploy": {"gates": ["acc"]}, "other": 1, "shipper": {"notice": "x"}}
    assert m.model_dump(mode="json") == before
    assert json.loads(content_key(Manifest(**_manifest(extra={"deploy": "text"}))))["extra"] == {"deploy": "text"}


def test_utc_now_is_iso_8601_utc_with_microseconds():
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", utc_now())


# ---- safe_join ---------------------------------------------------------------------------
@pytest.mark.parametrize("path", ESCAPING)
def test_safe_join_refuses_escaping_paths(tmp_path, path):
    with pytest.raises(UnsafePath) as e:
        safe_join(tmp_path, path, what="manifest file")
    assert e.value.message == f"manifest file {path!r} escapes its folder" and "relative" in e.value.hint


def test_safe_join_joins_paths_inside(tmp_path):
    assert safe_join(tmp_path, "a/b.onnx") == tmp_path / "a/b.onnx"  # need not exist
    (tmp_path / "a").mkdir()
    (tmp_path / "a/real").write_text("x")
    os.symlink("real", tmp_path / "a/inside")  # a link that stays inside is fine
    assert safe_join(tmp_path, "a/inside") == tmp_path / "a/inside"
    os.symlink(".", tmp_path / "self")
    assert safe_join(tmp_path, "self") == tmp_path / "self"  # resolves to the root itself


def test_safe_join_refuses_symbolic_links_out(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (tmp_path / "root-sibling").mkdir()  # shares the root's name as a prefix: still outside
    os.symlink(tmp_path / "root-sibling", root / "sib")
    os.symlink(tmp_path, root / "up")
    os.symlink("/etc/passwd", root / "passwd")
    for rel in ("sib", "sib/x", "up", "up/root-sibling", "passwd"):
        with pytest.raises(UnsafePath, match="resolves outside") as e:
            safe_join(root, rel, what="file")
        assert e.value.message.startswith(f"file {rel!r} resolves outside {root}")


# ---- external data -------------------------------------------------------------------------
def test_external_data_inside_the_version_is_returned_relative_to_the_version(tmp_path):
    model = tiny_onnx(tmp_path / "m.onnx", external="weights.bin")
    assert external_data_locations(model) == ["weights.bin"]
    assert check_external_data(model, "builds/cpu/model.onnx", {"builds/cpu/weights.bin"}) == ["builds/cpu/weights.bin"]
    assert check_external_data(model, "model.onnx", {"weights.bin"}) == ["weights.bin"]
    model = tiny_onnx(tmp_path / "d.onnx", external="sub/w.bin")
    assert check_external_data(model, "b/model.onnx", {"b/sub/w.bin", "b/model.onnx"}) == ["b/sub/w.bin"]
    assert check_external_data(tiny_onnx(tmp_path / "plain.onnx"), "m.onnx", set()) == []


def test_external_data_that_is_not_a_listed_file_is_unsafe(tmp_path):
    model = tiny_onnx(tmp_path / "m.onnx", external="weights.bin")
    for listed in (set(), {"weights.bin"}, {"builds/cpu/other.bin"}):  # not relative to the model's folder
        with pytest.raises(UnsafePath) as e:
            check_external_data(model, "builds/cpu/model.onnx", listed)
        assert e.value.message == "builds/cpu/model.onnx: external data 'weights.bin' is not a file of this version"
        assert "extra_files" in e.value.hint


def test_a_file_that_is_not_onnx_is_invalid_input_not_unsafe(tmp_path):
    bad = tmp_path / "m.onnx"
    bad.write_bytes(b"\xff" * 10)
    with pytest.raises(InvalidInput) as e:
        external_data_locations(bad)
    assert not isinstance(e.value, UnsafePath)
    assert e.value.message.startswith("m.onnx is not a valid ONNX file (") and "format" in e.value.hint
    with pytest.raises(InvalidInput):
        check_external_data(bad, "m.onnx", set())


def test_safe_join_takes_a_string_root_and_named_arguments(tmp_path):
    assert safe_join(str(tmp_path), "x") == Path(tmp_path) / "x"
    assert safe_join(root=tmp_path, relative="a/b", what="file") == tmp_path / "a/b"


def test_measured_on_in_one_line():
    from zoo.registry.manifest import describe_measured_on

    assert describe_measured_on({}) == "" and describe_measured_on(None) == ""
    full = {"runtime": "onnxruntime", "runtime_version": "1.32.0", "execution_provider": "CPUExecutionProvider",
            "device": "AMD EPYC", "platform": "x86-64-avx512-vnni", "threads": 1}
    assert describe_measured_on(full) == "onnxruntime 1.32.0 CPUExecutionProvider, AMD EPYC (x86-64-avx512-vnni), 1 thread"
    assert describe_measured_on({**full, "threads": 2}).endswith(", 2 threads")
    assert describe_measured_on({**full, "threads": None}).endswith("(x86-64-avx512-vnni)")
    assert describe_measured_on({"platform": "x86-64-avx2"}) == "x86-64-avx2"
    assert describe_measured_on({"device": "GPU"}) == "GPU"


def test_model_size_is_the_file_and_its_sidecars_not_the_test_vectors():
    def ref(path, size):
        return FileRef(path=path, sha256=SHA, size=size)

    build = Build(file=ref("builds/b/model.onnx", 100), extra_files=[ref("builds/b/w.bin", 30), ref("builds/b/x.bin", 7)],
                  test_vectors=[ref("builds/b/tv.npz", 1000)], name="b")
    assert build.model_size() == 137
    assert Build(file=ref("builds/b/model.onnx", 100), name="b").model_size() == 100


def test_a_manifest_of_an_unknown_older_schema_says_republish_not_upgrade():
    with pytest.raises(InvalidInput) as e:
        load_manifest(json.dumps(_manifest(schema_version=0)), "m.json")
    assert "schema_version 0" in e.value.message and e.value.hint == "republish the version"
