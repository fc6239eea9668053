"""What push and bundle export/import show while bytes move: plain lines with MB/s when not a
terminal (one about every 10 s and one at the end), a rich bar on one, nothing with --json."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

from cli_helpers import zoo
from zoo.cli.transfer import PlainTransfer, RichTransfer
from zoo.registry.store import LocalZoo
from registry_servers import make_staging

MB = 1 << 20


class Clock:
    """A stand-in clock the test moves by hand."""

    def __init__(self, t: float = 0.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_plain_lines_about_every_ten_seconds_and_at_the_end():
    out, clock = io.StringIO(), Clock()
    meter = PlainTransfer("push m@1 to team", 40 * MB, out, clock=clock)
    for t in (2.0, 5.0, 9.0):  # within the first 10 s: nothing
        clock.t = t
        meter.advance(2 * MB)
    assert out.getvalue() == ""
    clock.t = 10.0
    meter.advance(4 * MB)
    clock.t = 20.0
    meter.advance(20 * MB)
    clock.t = 25.0
    meter.advance(10 * MB)
    meter.finish()
    assert out.getvalue().splitlines() == [
        "[zoo] push m@1 to team: 10.0 MB of 40.0 MB (25%), 1.0 MB/s",
        "[zoo] push m@1 to team: 30.0 MB of 40.0 MB (75%), 1.5 MB/s",
        "[zoo] push m@1 to team: 40.0 MB in 25.0s (1.6 MB/s)",
    ]


def test_a_total_learnt_on_the_way_is_shown():
    out, clock = io.StringIO(), Clock()
    meter = PlainTransfer("bundle", None, out, clock=clock)
    clock.t = 10.0
    meter.advance(MB, 4 * MB)
    assert out.getvalue() == "[zoo] bundle: 1.0 MB of 4.0 MB (25%), 0.1 MB/s\n"


def test_the_bar_shows_bytes_of_total_and_rate():
    from rich.console import Console

    buffer, clock = io.StringIO(), Clock(0.0)
    bar = RichTransfer("push m@1 to team", None, clock=clock,
                       console=Console(file=buffer, force_terminal=True, width=120, color_system=None))
    bar.start()
    clock.t = 1.0
    bar.advance(MB, 12 * MB)
    clock.t = 2.0
    bar.advance(2 * MB)
    bar.finish()
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", buffer.getvalue())  # the cursor codes around the live bar
    line = [line for line in text.splitlines() if line.strip()][-1]
    # rich's units (decimal MB): 3 MiB of 12 MiB, 2 MiB in the last second, 9 MiB left at that pace
    assert re.search(r"push m@1 to team .*3\.1/12\.6 MB 2\.1 MB/s 0:00:05", line), line


def _published(tmp_path: Path) -> LocalZoo:
    z = LocalZoo()  # ZOO_HOME from conftest: the same one the subprocess sees
    z.publish(make_staging(tmp_path / "staging", builds={"cpu-fp32": {}, "cpu-int8": {}}, big_bytes=2 * MB))
    return z


def test_push_prints_its_bytes_and_rate(tmp_path):
    _published(tmp_path)
    assert zoo("remote", "add", "team", str(tmp_path / "remote")).code == 0
    r = zoo("push", "tiny@1.0.0", "--to", "team")
    assert r.code == 0, r.text
    lines = r.out.splitlines()
    uploaded = re.search(r"uploaded \((\d+\.\d MB)\)", lines[-1]).group(1)  # a size, as the bar says it
    assert float(uploaded.split()[0]) >= 4.0  # the 4 MB model and its card
    assert re.fullmatch(rf"\[zoo\] push tiny@1\.0\.0 to team: {re.escape(uploaded)} in \d+\.\ds "
                        r"\(\d+\.\d MB/s\)", lines[-2]), lines


def test_pull_from_a_remote_prints_its_bytes_and_rate_on_stderr_and_only_the_path_on_stdout(tmp_path):
    _published(tmp_path)
    assert zoo("remote", "add", "team", str(tmp_path / "remote")).code == 0
    assert zoo("push", "tiny@1.0.0", "--to", "team").code == 0
    fresh = {"ZOO_HOME": str(tmp_path / "fresh-home")}  # another machine: nothing stored yet
    assert zoo("remote", "add", "team", str(tmp_path / "remote"), env=fresh).code == 0
    r = zoo("pull", "tiny@1.0.0", "--build", "cpu-fp32", "--remote", "team", env=fresh)
    assert r.code == 0, r.text
    assert len(r.out.splitlines()) == 1 and Path(r.out.strip()).is_file()  # what a script reads
    moved = re.findall(r"^\[zoo\] pull tiny@1\.0\.0: (\S+ \S+) in \d+\.\ds \(\d+\.\d MB/s\)$", r.err, re.M)
    assert moved and moved[-1].endswith("MB"), r.err  # the build's 2 MB arrived, counted chunk by chunk
    again = zoo("pull", "tiny@1.0.0", "--build", "cpu-fp32", "--remote", "team", env=fresh)
    assert again.code == 0 and "MB/s" not in again.err  # stored already: nothing moved, nothing said


def test_push_with_json_prints_only_its_document(tmp_path):
    _published(tmp_path)
    assert zoo("remote", "add", "team", str(tmp_path / "remote")).code == 0
    r = zoo("push", "tiny@1.0.0", "--to", "team", "--json")
    assert r.code == 0, r.text
    assert json.loads(r.out)["bytes"] > 4 * MB  # the whole of stdout is the document


def test_bundle_export_and_import_print_bytes_and_rate(tmp_path):
    _published(tmp_path)
    tar = tmp_path / "m.tar"
    r = zoo("bundle", "export", "tiny@1.0.0", "-o", tar)
    assert r.code == 0, r.text
    total = re.search(r"files, (\d+\.\d MB)\)", r.out).group(1)
    assert re.search(rf"^\[zoo\] bundle tiny@1\.0\.0 to {re.escape(str(tar))}: {re.escape(total)} in "
                     r"\d+\.\ds \(\d+\.\d MB/s\)$", r.out, re.M), r.out
    other = {"ZOO_HOME": str(tmp_path / "other-home")}
    r = zoo("bundle", "import", tar, env=other)
    assert r.code == 0, r.text
    assert re.search(rf"^\[zoo\] import {re.escape(str(tar))}: {re.escape(total)} in \d+\.\ds "
                     r"\(\d+\.\d MB/s\)$", r.out, re.M), r.out


def _two_machines(tmp_path: Path) -> tuple[Path, str, dict, dict]:
    """A recipe whose one stage writes 3 MB, a folder remote, and the environments of machines A
    and B (each its own cache and zoo)."""
    recipe = tmp_path / "blob.yaml"
    recipe.write_text("schema_version: 1\nname: blob\nversion: 0.1.0\nstages:\n  big:\n    kind: blob\n"
                      "    config: {size_mb: 3}\n")
    a = {"ZOO_CACHE_DIR": str(tmp_path / "a-cache"), "ZOO_HOME": str(tmp_path / "a-home")}
    b = {"ZOO_CACHE_DIR": str(tmp_path / "b-cache"), "ZOO_HOME": str(tmp_path / "b-home")}
    return recipe, str(tmp_path / "remote"), a, b


def test_cache_push_and_pull_print_bytes_and_rate(tmp_path):
    recipe, remote, a, b = _two_machines(tmp_path)
    assert zoo("run", recipe, "--cache-remote", "none", env=a).code == 0
    r = zoo("cache", "push", recipe, "--remote", remote, env=a)
    assert r.code == 0, r.text
    assert re.search(rf"^\[zoo\] cache push to {re.escape(remote)}: 3\.0 MB in \d+\.\ds \(\d+\.\d MB/s\)$",
                     r.out, re.M), r.out
    r = zoo("cache", "pull", recipe, "--remote", remote, env=b)
    assert r.code == 0, r.text
    assert re.search(rf"^\[zoo\] cache pull from {re.escape(remote)}: 3\.0 MB in \d+\.\ds \(\d+\.\d MB/s\)$",
                     r.out, re.M), r.out


def test_a_run_shows_what_the_remote_run_cache_moved(tmp_path):
    """`zoo run` with a remote run cache: machine A's run pushes its stage's 3 MB, machine B's run
    fetches it instead of running; each says how many bytes went which way, and how fast."""
    recipe, remote, a, b = _two_machines(tmp_path)
    r = zoo("run", recipe, "--cache-remote", remote, env=a)
    assert r.code == 0, r.text
    assert re.search(r"^\[zoo\] remote cache: pushed 3\.0 MB in \d+\.\ds \(\d+\.\d MB/s\)$", r.out, re.M), r.out
    r = zoo("run", recipe, "--cache-remote", remote, env=b)
    assert r.code == 0, r.text
    assert "[zoo] big: cached" in r.out
    assert re.search(r"^\[zoo\] remote cache: fetched 3\.0 MB in \d+\.\ds \(\d+\.\d MB/s\)$", r.out, re.M), r.out
    r = zoo("run", recipe, "--cache-remote", remote, "--json", env=b)
    assert r.code == 0 and json.loads(r.out)["ok"]  # --json: the document alone
    r = zoo("run", recipe, "--cache-remote", remote, env=b)
    assert "remote cache:" not in r.out  # a local hit moves nothing and says nothing


def test_the_live_table_counts_the_remote_cache_bytes():
    from rich.console import Console

    from zoo.cli.progress import RichProgress

    clock = Clock(0.0)
    progress = RichProgress(["big"], {"big": "blob"}, clock=clock,
                            console=Console(file=io.StringIO(), force_terminal=True, width=100, color_system=None))
    clock.t = 2.0
    progress.transfer("fetched", 3 * MB, 1.0)  # 3 MB in the second before now
    clock.t = 3.0
    progress.transfer("fetched", MB, 0.5)
    progress.transfer("pushed", 2 * MB, 2.0)
    buffer = io.StringIO()
    Console(file=buffer, width=100, color_system=None).print(progress._render())
    assert "remote cache: fetched 4.0 MB (2.0 MB/s) · pushed 2.0 MB (1.0 MB/s)" in buffer.getvalue()
