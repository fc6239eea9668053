"""docs/tasks/*.md, run for real: every file and command a task page shows works as shown.

The pages' convention (what DEVELOPERS.md tells a docs writer):

- A fenced block with a title, ```yaml title="NAME"``` (any language), is a file: it is written to
  NAME in the page's folder when the page reaches it. A title outside the page's folder
  (`$ZOO_HOME/config.yaml`, `~/…`, `/…`) names where such a file lives: shown, not written.
- A ```console block is run. Each line starting with `$ ` is a command (a line ending in `\\`
  continues it); the lines after it, up to the next `$ `, are what it prints (stdout and stderr
  together). Each non-blank shown line must match a line of the real output, in order, with other
  lines allowed between them (a page may abridge); `…` stands for any text, runs of spaces count as
  one, and a line's leading and trailing spaces do not count. Every command must exit 0: a page
  shows a failure as `$ CMD; echo "exit $?"`. The commands of one block run in one bash shell, in
  the page's folder: `cd` and `export` carry on to the block's later commands (each block starts
  from the page's environment again), and background jobs (`CMD &`) run on until the page ends.
  Each block's transcript is left beside it as `.console-LINE.log` in the page's folder.
- A block preceded by `<!-- excerpt: PATH -->` is not run: it must be lines of the repository's
  file PATH (a shipped recipe the suite runs elsewhere), its non-blank lines in order, verbatim.
- Other blocks (```bash, ```text, untitled ```yaml…) are illustrations and are not checked.

Where a page runs: a temp folder of its own with `zoo` (this checkout's), `python` and `dask` (this
interpreter) first on PATH, ZOO_HOME in that folder, and the module's one run cache (content-
addressed, so the pages share built stages). train-your-own and bring-a-model start empty; every
other page starts where train-your-own ended (its folder's files and a copy of its zoo), as a
reader who followed that page does. train-your-own runs once per module.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = pytest.mark.slow

TASKS = REPO / "docs" / "tasks"
PAGES = ("bring-a-model", "train-your-own", "quantize", "publish-and-share", "pull-and-run",
         "release-and-reproduce", "scale-out")
FRESH = {"bring-a-model", "train-your-own"}  # the pages that start from an empty zoo
FENCE = re.compile(r"^(?P<indent> *)```(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S)
TITLE = re.compile(r'\btitle="([^"]+)"')
EXCERPT = re.compile(r"<!--\s*excerpt:\s*(\S+)\s*-->\s*$")


@dataclass
class Block:
    line: int  # where the block starts in its page (1-based), for failure messages
    kind: str  # "file", "console", "excerpt" or "other"
    body: str
    name: str = ""  # the file's name (file) or the repository path (excerpt)


def blocks(page: str) -> list[Block]:
    text = (TASKS / f"{page}.md").read_text()
    found = []
    for m in FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        info, body = m.group("info").strip(), m.group("body")
        before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        title = TITLE.search(info)
        if title and not title.group(1).startswith(("$", "~", "/")):
            found.append(Block(line, "file", body, title.group(1)))
        elif info.split(" ", 1)[0] == "console":
            found.append(Block(line, "console", body))
        elif excerpt := EXCERPT.search(before):
            found.append(Block(line, "excerpt", body, excerpt.group(1)))
        else:
            found.append(Block(line, "other", body))
    return found


@dataclass
class Command:
    line: int
    text: str
    shown: list[str] = field(default_factory=list)


def commands(block: Block) -> list[Command]:
    """The `$ ` commands of a console block, each with the output the page shows for it."""
    found: list[Command] = []
    lines = block.body.split("\n")
    i = 0
    while i < len(lines):
        if lines[i].startswith("$ "):
            start, text = i, lines[i][2:]
            while text.endswith("\\") and i + 1 < len(lines):
                i += 1
                text += "\n" + lines[i]  # bash joins the lines itself
            found.append(Command(block.line + 1 + start, text))
        elif lines[i].strip():
            assert found, f"line {block.line + 1 + i}: output before any `$ ` command"
            found[-1].shown.append(lines[i])
        i += 1
    return found


def _pattern(shown: str) -> re.Pattern:
    parts = [re.escape(p) for p in " ".join(shown.split()).split("…")]
    return re.compile("^" + ".*".join(parts) + "$")


def unmatched(shown: list[str], output: str) -> str | None:
    """The first shown line that no later line of `output` matches, or None when all match in order."""
    actual = [" ".join(line.split()) for line in output.splitlines()]
    at = 0
    for want in shown:
        pattern = _pattern(want)
        while at < len(actual) and not pattern.match(actual[at]):
            at += 1
        if at == len(actual):
            return want
        at += 1
    return None


MARK = "\x1eZOO-DOCS-CMD"


def run_console(block: Block, page: str, folder: Path, env: dict[str, str], groups: list[int]) -> None:
    """Run a console block's commands in one bash shell and check each one's exit code and output.
    The shell's process group goes into `groups`: its background jobs live until the page ends."""
    cmds = commands(block)
    script = ["exec 2>&1"]
    for n, cmd in enumerate(cmds):
        script += [f"printf '%s {n} start\\n' '{MARK}'", cmd.text, f"printf '\\n%s {n} rc %s\\n' '{MARK}' \"$?\""]
    proc = subprocess.Popen(["bash", "-c", "\n".join(script)], cwd=folder, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    groups.append(proc.pid)
    # a block stuck for 5 minutes is ended (its commands then show as not finished)
    watchdog = threading.Timer(300, os.killpg, (proc.pid, signal.SIGKILL))
    watchdog.start()
    # a background job keeps the pipe open: read up to the last command's marker, not to the end
    out = ""
    last = f"{MARK} {len(cmds) - 1} rc "
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            out += line
            if line.startswith(last):
                break
        proc.wait(timeout=60)
    finally:
        watchdog.cancel()
    (folder / f".console-{block.line}.log").write_text(out)  # the whole transcript, for a failure's reader
    pieces = re.split(rf"^{MARK} (\d+) (start|rc \d+)$", out, flags=re.M)
    outputs: dict[int, str] = {}
    codes: dict[int, int] = {}
    for i in range(1, len(pieces), 3):
        n, what, text = int(pieces[i]), pieces[i + 1], pieces[i + 2]
        if what == "start":
            outputs[n] = text
        else:
            codes[n] = int(what.split()[1])
    for n, cmd in enumerate(cmds):
        where = f"docs/tasks/{page}.md:{cmd.line}: `{cmd.text}`"
        assert n in codes, f"{where} did not finish; the shell printed:\n{out[-4000:]}"
        assert codes[n] == 0, f"{where} exited {codes[n]}:\n{outputs[n][-4000:]}"
        missing = unmatched(cmd.shown, outputs[n])
        assert missing is None, f"{where} did not print the line the page shows:\n  {missing}\nit printed:\n{outputs[n][-4000:]}"


def check_excerpt(block: Block, page: str) -> None:
    source = (REPO / block.name).read_text().splitlines()
    at = 0
    for line in (ln for ln in block.body.splitlines() if ln.strip()):
        while at < len(source) and source[at] != line:
            at += 1
        assert at < len(source), f"docs/tasks/{page}.md:{block.line}: not a line of {block.name} (in order): {line!r}"
        at += 1


def run_page(page: str, folder: Path, env: dict[str, str]) -> None:
    groups: list[int] = []
    try:
        for block in blocks(page):
            if block.kind == "file":
                path = folder / block.name
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(block.body)
            elif block.kind == "console":
                run_console(block, page, folder, env, groups)
            elif block.kind == "excerpt":
                check_excerpt(block, page)
    finally:  # the page's background jobs (a dask scheduler, workers) end with it
        for group in groups:
            try:
                os.killpg(group, signal.SIGTERM)
            except ProcessLookupError:
                pass


def page_env(folder: Path, cache: Path, bin_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", "ZOO_HOME": str(folder / ".zoo-home"),
                "ZOO_CACHE_DIR": str(cache), "ZOO_CODE_MEMO": str(cache.parent / "code.sqlite"),
                "HOME": str(folder / ".home"), "HF_HUB_OFFLINE": "1", "COLUMNS": "200"})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.pop("ZOO_DEBUG", None)
    return env


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The shared run cache, `zoo`/`python` on PATH, and train-your-own run once: the state other pages start from."""
    base = tmp_path_factory.mktemp("docs-tasks")
    bin_dir = base / "bin"
    bin_dir.mkdir()
    (bin_dir / "zoo").write_text(f"#!/bin/sh\nexec '{sys.executable}' -m zoo \"$@\"\n")
    (bin_dir / "python").write_text(f"#!/bin/sh\nexec '{sys.executable}' \"$@\"\n")
    for tool in ("zoo", "python"):
        (bin_dir / tool).chmod(0o755)
    (bin_dir / "dask").write_text(f"#!/bin/sh\nexec '{sys.executable}' -m dask \"$@\"\n")
    (bin_dir / "dask").chmod(0o755)
    cache = base / "cache"
    start = base / "train-your-own"
    start.mkdir()
    run_page("train-your-own", start, page_env(start, cache, bin_dir))
    return base, cache, bin_dir, start


@pytest.mark.parametrize("page", PAGES)
def test_page_runs_as_shown(page, world, tmp_path):
    base, cache, bin_dir, start = world
    if page == "train-your-own":
        return  # the fixture ran it (and failed the module if it did not run as shown)
    folder = tmp_path / page
    if page in FRESH:
        folder.mkdir()
    else:
        shutil.copytree(start, folder, symlinks=True)
    run_page(page, folder, page_env(folder, cache, bin_dir))


def test_every_page_has_something_to_run():
    for page in PAGES:
        kinds = {b.kind for b in blocks(page)}
        assert "console" in kinds, f"docs/tasks/{page}.md runs no command"


def test_output_matching_is_strict():
    """The checker itself: a shown line the output lacks, or lines out of order, fail."""
    out = "alpha 1\nbeta   2\ngamma 3\n"
    assert unmatched(["alpha 1", "gamma …"], out) is None
    assert unmatched(["beta 2"], out) is None  # spaces count as one
    assert unmatched(["gamma 3", "alpha 1"], out) == "alpha 1"  # order matters
    assert unmatched(["delta"], out) == "delta"
    assert unmatched(["alpha"], out) == "alpha"  # a whole line, not a prefix


def test_commands_and_excerpts_are_read_as_the_convention_says():
    block = Block(10, "console", "$ zoo run a.yaml \\\n    --force\nran\n\n$ zoo list\n")
    first, second = commands(block)
    assert (first.line, first.text, first.shown) == (11, "zoo run a.yaml \\\n    --force", ["ran"])
    assert (second.line, second.text, second.shown) == (15, "zoo list", [])
    shipped = "recipes/lightgbm-breast-cancer.yaml"
    check_excerpt(Block(1, "excerpt", "model:\n  framework: lightgbm\n", shipped), "x")
    with pytest.raises(AssertionError, match="not a line of"):
        check_excerpt(Block(1, "excerpt", "model:\n  framework: sklearn\n", shipped), "x")
    with pytest.raises(AssertionError, match="not a line of"):  # out of order
        check_excerpt(Block(1, "excerpt", "  framework: lightgbm\nmodel:\n", shipped), "x")
