"""``data: {source: dvc, repo, rev, path}``: data tracked in a real git+DVC repo, read from its DVC
remote at a pinned commit, through the same loaders as local files; DVC's digest in the keys.

The repo (tests/dvc_repos.py) is made with the real git and dvc commands, pushed to a local DVC
remote, and its workspace copies and DVC cache are deleted, so every byte read comes from the remote.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from cli_helpers import write_recipe, zoo
from dvc_repos import git, make_dvc_repo
from zoo import dvcrepo
from zoo.errors import IntegrityError, InvalidInput, MissingExtra
from zoo_stages.lib.data import datasets
from zoo_stages.lib.data import dvc as dvc_data


def _table(n: int, shift: float) -> str:
    rng = np.random.default_rng(int(shift))
    rows = ["a,b,kind"] + [f"{rng.normal(shift, 1):.6f},{rng.normal(-shift, 2):.6f},{'cat' if i % 3 else 'ant'}"
                           for i in range(n)]
    return "\n".join(rows) + "\n"


def _pgm(pixels: np.ndarray) -> bytes:
    return b"P5\n%d %d\n255\n" % (pixels.shape[1], pixels.shape[0]) + pixels.astype(np.uint8).tobytes()


def _write_v1(folder):
    data = folder / "data"
    (data / "images").mkdir(parents=True, exist_ok=True)
    (data / "table.csv").write_text(_table(30, 1.0))
    rng = np.random.default_rng(7)
    np.savez(data / "arrays.npz", x=rng.random((12, 1, 6, 6)).astype(np.float32), y=np.arange(12) % 3)
    for label in ("circle", "square"):
        (data / "images" / label).mkdir(exist_ok=True)
        for i in range(4):
            (data / "images" / label / f"{i}.pgm").write_bytes(_pgm(rng.integers(0, 256, (5, 7))))
    return ["data/table.csv", "data/arrays.npz", "data/images"]


def _write_v2(folder):
    (folder / "data" / "table.csv").write_text(_table(40, 3.0))
    return ["data/table.csv"]


@pytest.fixture(scope="module")
def dvc_repo(tmp_path_factory):
    """Two data versions: v1 (a table, an npz archive, an image folder), v2 (another table); plus a
    plain copy of v1's files outside the repo, to compare against."""
    root = tmp_path_factory.mktemp("dvc")
    expected = root / "expected"
    _write_v1(expected)
    return make_dvc_repo(root, [_write_v1, _write_v2]), expected


@pytest.fixture(autouse=True)
def fresh_datasets():
    datasets.clear_cache()
    dvc_data.fetch.cache_clear()
    yield
    datasets.clear_cache()
    dvc_data.fetch.cache_clear()


def _spec(repo, commit, path, **more):
    return {"source": "dvc", "repo": str(repo.path), "rev": commit, "path": path, **more}


@pytest.mark.parametrize("path,local,more", [
    ("data/table.csv", {"source": "csv", "path": "data/table.csv"}, {"label": "kind", "normalize": "standard"}),
    ("data/arrays.npz", {"source": "npz", "path": "data/arrays.npz"}, {}),
    ("data/images", {"source": "folder", "path": "data/images"}, {"image": {"size": [4, 4]}}),
])
def test_each_format_is_read_from_the_dvc_remote_like_the_same_local_file(dvc_repo, path, local, more, tmp_path):
    repo, expected = dvc_repo
    spec = _spec(repo, repo.commits[0], path, **more)
    assert not (repo.path / path).exists() and not (repo.path / ".dvc" / "cache").exists()
    for split in ("train", "val"):
        got = datasets.load_split(spec, tmp_path, split)
        want = datasets.load_split({**local, **more}, expected, split)
        assert list(got.features) == list(want.features) and len(got) == len(want) > 0
        for name in got.features:
            assert np.array_equal(got.features[name], want.features[name]), name
        assert np.array_equal(got.labels, want.labels)
    assert datasets.class_names(spec, tmp_path) == datasets.class_names({**local, **more}, expected)
    preprocessing = datasets.preprocessing(spec, tmp_path)
    assert preprocessing["source"] == "dvc"
    assert {k: v for k, v in preprocessing.items() if k != "source"} == \
        {k: v for k, v in datasets.preprocessing({**local, **more}, expected).items() if k != "source"}


def test_the_dvc_digest_is_what_enters_keys_and_a_new_rev_changes_it(dvc_repo, tmp_path):
    repo, _ = dvc_repo
    v1, v2 = (_spec(repo, c, "data/table.csv", label="kind") for c in repo.commits)
    [pin1], [pin2] = datasets.data_dependencies(v1, tmp_path), datasets.data_dependencies(v2, tmp_path)
    recorded = {c: git(repo.path, "show", f"{c}:data/table.csv.dvc") for c in repo.commits}
    record1, record2 = json.loads(pin1.read_text()), json.loads(pin2.read_text())
    assert record1["md5"] in recorded[repo.commits[0]] and record2["md5"] in recorded[repo.commits[1]]
    assert record1["md5"] != record2["md5"] and pin1 != pin2 and pin1.name == "table.csv.json"
    assert datasets.data_dependencies(dict(v1), tmp_path) == [pin1]  # the same rev: the same pin
    # the pin names the bytes, not where the repo is: a clone elsewhere gives the same pin
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(repo.path), str(clone)], check=True)
    assert datasets.data_dependencies({**v1, "repo": str(clone)}, tmp_path) == [pin1]
    # the v2 table is the one read at v2, and the split's record names the bytes
    assert len(datasets.load_split(v2, tmp_path, "train")) + len(datasets.load_split(v2, tmp_path, "val")) == 40
    assert datasets.split_info(v2, tmp_path)["dvc"] == {"rev": repo.commits[1], "md5": record2["md5"], "format": "csv"}


def test_a_git_url_repo_is_mirrored_once_and_read_at_its_commit(dvc_repo, tmp_path, monkeypatch):
    repo, expected = dvc_repo
    url = repo.path.as_uri()  # file://…: git's own transport, as for any remote git URL
    spec = {**_spec(repo, repo.commits[0], "data/arrays.npz"), "repo": url}
    got = datasets.load_split(spec, tmp_path, "train")
    want = datasets.load_split({"source": "npz", "path": "data/arrays.npz"}, expected, "train")
    assert np.array_equal(got.features["image"], want.features["image"])
    pins = datasets.data_dependencies(spec, tmp_path)
    assert pins == datasets.data_dependencies(_spec(repo, repo.commits[0], "data/arrays.npz"), tmp_path)
    # a pinned commit already known needs no git at all: the out is memoised
    monkeypatch.setenv("PATH", str(tmp_path / "no-git-here"))
    datasets.clear_cache()
    assert datasets.data_dependencies(spec, tmp_path) == pins
    with pytest.raises(InvalidInput, match="needs git"):  # while an unknown one does
        datasets.data_dependencies({**spec, "rev": repo.commits[1]}, tmp_path)


def test_a_moving_or_short_rev_is_refused_with_the_commit_it_names_now(dvc_repo):
    repo, _ = dvc_repo
    git(repo.path, "tag", "-f", "data-v1", repo.commits[0])
    for rev, what, commit in (("main", "branch", repo.commits[1]), ("data-v1", "tag", repo.commits[0]),
                              (repo.commits[0][:10], "short commit sha", repo.commits[0])):
        with pytest.raises(InvalidInput) as e:
            dvcrepo.resolve_commit(str(repo.path), rev, repo.path.parent / "cache")
        assert f"is a {what}" in e.value.message and e.value.hint.startswith(f"rev: {commit}"), e.value.message
    with pytest.raises(InvalidInput, match="is not a commit"):
        dvcrepo.resolve_commit(str(repo.path), "0" * 40, repo.path.parent / "cache")


def _recipe(tmp_path, data: str) -> str:
    return write_recipe(tmp_path, f"""\
schema_version: 1
name: dvc-data
version: 1.0.0
task: tabular-classification
model:
  framework: sklearn
  estimator: LogisticRegression
  params: {{max_iter: 200}}
  num_classes: 2
data:
{data}
stages:
  train:
    config: {{seed: 0, threads: 1}}
""")


def test_validate_points_at_the_dvc_field_with_did_you_mean(dvc_repo, tmp_path):
    repo, _ = dvc_repo
    c1 = repo.commits[0]
    base = f"  source: dvc\n  repo: {repo.path}\n"
    cases = [
        (f"{base}  rev: {c1}\n  path: data/tabel.csv\n  label: kind\n", 14, "did you mean 'data/table.csv'?"),
        (f"{base}  rev: main\n  path: data/table.csv\n  label: kind\n", 13, "is a branch"),
        (f"{base}  ref: {c1}\n  path: data/table.csv\n", 13, "did you mean 'rev'?"),
        (f"{base}  rev: {c1}\n  path: data/images/circle\n", 14, "inside the DVC output 'data/images'"),
        (f"{base}  rev: {c1}\n  path: data/images\n  format: csv\n", 14, "is a folder in the DVC repo"),
        (f"{base}  rev: {c1}\n  path: data/arrays.npz\n  columns: [a]\n", 15, "does not apply to source dvc (format npz)"),
        (f"{base}  path: data/table.csv\n", 11, "data.rev is required"),
        (f"  source: dvc\n  repo: {tmp_path}\n  rev: {c1}\n  path: data/table.csv\n", 12, "is not a git repository"),
    ]
    for data, line, message in cases:
        recipe = _recipe(tmp_path, data)
        done = zoo("validate", recipe)
        assert done.code == 2 and message in done.err and f"{recipe}:{line}:" in done.err, (data, done.err)
    ok = zoo("validate", _recipe(tmp_path, f"{base}  rev: {c1}\n  path: data/table.csv\n  label: kind\n"))
    assert ok.code == 0, ok.text


def test_a_tampered_remote_object_is_refused_and_nothing_is_kept(dvc_repo, tmp_path):
    repo, _ = dvc_repo
    spec = _spec(repo, repo.commits[0], "data/table.csv", label="kind")
    out = dvc_data.pin(spec, tmp_path)
    stored = repo.remote_object(out.md5)
    original = stored.read_bytes()
    stored.chmod(0o644)
    try:
        stored.write_bytes(original.replace(b"cat", b"cow", 1))
        with pytest.raises(IntegrityError, match="but DVC recorded"):
            datasets.load_split(spec, tmp_path, "train")
    finally:
        stored.write_bytes(original)
    assert not any((dvc_data._cache_dir() / "dvc" / "data").iterdir())
    datasets.clear_cache()
    dvc_data.fetch.cache_clear()
    assert len(datasets.load_split(spec, tmp_path, "train")) > 0  # the remote's own bytes are read


def test_without_the_dvc_extra_reading_names_the_pip_install_dvc_hidden_stand_in(dvc_repo, tmp_path, monkeypatch):
    """dvc hidden from the import system (a stand-in for an environment without the extra): keys
    and validation still work (git alone); reading the bytes is MissingExtra naming the install."""
    repo, _ = dvc_repo
    for name in [m for m in sys.modules if m == "dvc" or m.startswith("dvc.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "dvc", None)
    spec = _spec(repo, repo.commits[0], "data/table.csv", label="kind")
    assert datasets.data_dependencies(spec, tmp_path)
    with pytest.raises(MissingExtra) as e:
        datasets.load_split(spec, tmp_path, "train")
    assert "pip install 'zoo-onnx[dvc]'" in e.value.hint


PROBE = ("import sys, runpy\nsys.argv = ['zoo'] + sys.argv[1:]\nstatus = 0\n"
         "try:\n    runpy.run_module('zoo', run_name='__main__')\n"
         "except SystemExit as e:\n    status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)\n"
         "print('HEAVY', [m for m in ('dvc', 'torch', 'onnx', 'onnxruntime') if m in sys.modules], file=sys.stderr)\n"
         "sys.exit(status)\n")


@pytest.mark.slow
def test_a_run_reads_the_remote_once_a_cached_run_needs_neither_dvc_nor_the_remote_and_a_new_rev_reruns(
        dvc_repo, tmp_path):
    repo, _ = dvc_repo
    c1, c2 = repo.commits
    data = f"  source: dvc\n  repo: {repo.path}\n  rev: {c1}\n  path: data/table.csv\n  label: kind\n"
    recipe = _recipe(tmp_path, data)
    first = zoo("run", recipe, "--json")
    assert first.code == 0, first.text
    assert [s["state"] for s in json.loads(first.out)["stages"]] == ["done"]

    # the remote and zoo's copy of the data are gone: a cached run must not need them, nor dvc
    moved = tmp_path / "remote-away"
    shutil.move(repo.remote, moved)
    shutil.rmtree(dvc_data._cache_dir() / "dvc" / "data")
    try:
        for args, expected in ((["validate", str(recipe)], "ok"), (["plan", str(recipe)], "train [train]: cached"),
                               (["run", str(recipe)], "0 ran, 1 cached")):
            proc = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True)
            assert proc.returncode == 0 and expected in proc.stdout, (args, proc.stdout, proc.stderr)
            assert "HEAVY []" in proc.stderr, (args, proc.stderr)
    finally:
        shutil.move(moved, repo.remote)

    # another data version: the stage reruns, on the v2 table (40 rows)
    write_recipe(tmp_path, recipe.read_text().replace(c1, c2))
    plan = zoo("plan", recipe)
    assert plan.code == 0 and "train [train]: run" in plan.out and "table.csv.json" in plan.out, plan.text
    second = zoo("run", recipe, "--json")
    assert second.code == 0, second.text
    [stage] = json.loads(second.out)["stages"]
    assert stage["state"] == "done" and stage["key"] != json.loads(first.out)["stages"][0]["key"]


BOMB = "".join(f"b{i}: &b{i} [" + ", ".join([f"*b{i - 1}" if i else '"x"'] * 10) + "]\n" for i in range(9))


@pytest.fixture(scope="module")
def hostile_dvc_repo(tmp_path_factory):
    """A real git+DVC repo whose `data/table.csv.dvc` a stranger then rewrote, one commit per rewrite:
    {name: commit}. The bytes DVC pushed stay on its remote."""
    root = tmp_path_factory.mktemp("dvc-hostile")

    def table(folder):
        (folder / "data").mkdir(exist_ok=True)
        (folder / "data" / "table.csv").write_text(_table(20, 2.0))
        return ["data/table.csv"]

    repo = make_dvc_repo(root, [table])
    dvc_file = repo.path / "data" / "table.csv.dvc"
    honest = dvc_file.read_text()
    md5 = next(line.split(":", 1)[1].strip() for line in honest.splitlines() if line.strip().startswith("- md5:"))
    rewrites = {
        "parent": honest.replace(md5, "../../../outside/secret"),
        "absolute": honest.replace(md5, "/../../../..{escaped}"),
        "upper": honest.replace(md5, md5.upper()),
        "deep": "outs:\n- md5: " + "[" * 5000 + "]" * 5000 + "\n  path: table.csv\n",
        "bomb": BOMB + "outs:\n- {md5: " + md5 + ", path: table.csv, extra: *b8}\n",
    }
    commits = {}
    for name, text in rewrites.items():
        dvc_file.write_text(text.replace("{escaped}", str(root / "escaped")))
        git(repo.path, "commit", "-q", "-am", f"hostile {name}")
        commits[name] = git(repo.path, "rev-parse", "HEAD")
    dvc_file.write_text(honest)
    return repo, commits, root


def test_a_dvc_md5_that_is_a_path_is_refused_naming_the_dvc_file_line_and_field(hostile_dvc_repo, tmp_path):
    """`md5: ../../../outside/secret` made a run read (and train on) a file outside zoo's cache;
    `md5: /../…/X` made one create a folder outside it. Only DVC's hex digests are digests."""
    repo, commits, root = hostile_dvc_repo
    box = tmp_path / "box"
    cache = box / "cache"
    secret = box / "outside" / "secret" / "table.csv"  # where ../../../outside/secret leads from zoo's DVC store
    secret.parent.mkdir(parents=True)
    secret.write_text(_table(30, 9.0))
    (cache / "dvc" / "data").mkdir(parents=True)  # zoo's DVC store, as any earlier DVC dataset leaves it
    assert (cache / "dvc" / "data" / "../../../outside/secret" / "table.csv").is_file()
    env = {"ZOO_CACHE_DIR": str(cache)}
    for name, shown in (("parent", "'../../../outside/secret'"), ("absolute", f"'/../../../..{root / 'escaped'}'"),
                        ("upper", "'")):
        data = f"  source: dvc\n  repo: {repo.path}\n  rev: {commits[name]}\n  path: data/table.csv\n  label: kind\n"
        recipe = _recipe(tmp_path, data)
        done = zoo("run", recipe, env=env)
        assert done.code == 2, (name, done.text)
        assert f"data/table.csv.dvc:2: outs.0.md5 {shown}" in done.err and "is not a DVC digest" in done.err, done.err
        assert "Traceback" not in done.err and f"{recipe}:14:" in done.err  # the recipe's data.path line too
    assert not (root / "escaped").exists()
    assert {p.name for p in box.iterdir()} <= {"cache", "outside"}


@pytest.mark.parametrize("name,limit", [("deep", "nests deeper than 64 levels"),
                                        ("bomb", "expands to more than 1,000,000 values")])
def test_a_dvc_file_past_the_yaml_limits_is_one_error_naming_it(hostile_dvc_repo, tmp_path, name, limit):
    repo, commits, _ = hostile_dvc_repo
    data = f"  source: dvc\n  repo: {repo.path}\n  rev: {commits[name]}\n  path: data/table.csv\n  label: kind\n"
    recipe = _recipe(tmp_path, data)
    done = zoo("validate", recipe, timeout=20)  # a guard: refused at once, not after a minute of parsing
    assert done.code == 2, done.text
    assert "the DVC file data/table.csv.dvc:" in done.err and limit in done.err, done.err
    assert "Traceback" not in done.err and "RecursionError" not in done.err
