"""The README's excerpt of the main job: what `zoo run recipes/alexnet.yaml` prints on a fresh
clone (empty cache and zoo), a second run, and a pull, with what differs between machines and runs
replaced by `…`.

    .venv/bin/python scripts/readme_excerpt.py            # run the main job (minutes) and rewrite the block
    .venv/bin/python scripts/readme_excerpt.py --check    # run it and exit 1 if the README's block differs
    .venv/bin/python scripts/readme_excerpt.py --from FILE [--check]   # use a transcript saved before

The run happens in a scratch folder (a copy of the recipe and what it reads, its own ZOO_CACHE_DIR
and ZOO_HOME), so it neither uses nor fills your cache and zoo. tests/test_readme_excerpt.py runs
the main job the same way and checks the README against it.

What is replaced (`normalise`): times and the ETA, the figures of progress lines, the gates'
values, the build table's sizes, figures and digests, the thread count, the reason a stage runs
(it depends on whether the lockfile has records for this CPU's class), and the zoo's folder (shown
as the default, `~/.local/share/zoo`); the `updated alexnet.lock` line of a CPU class the lockfile
has no records for is not compared. Lines that show what a running stage is doing come at most
every 10 s (the first step of a loop at once), so which of them a run prints depends on the
machine's speed: the block keeps the first step of each loop (`epoch 1/4 · train_loss …`,
`calibration 1/32`, `latency cpu-fp32 1/50`), and the check compares every other line exactly.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
BEGIN, END = "<!-- BEGIN readme-excerpt -->", "<!-- END readme-excerpt -->"
RECIPE = "alexnet"
# (what the README shows after `$ zoo`, the arguments run in the scratch folder)
COMMANDS = [
    (f"run recipes/{RECIPE}.yaml", ["run", f"{RECIPE}.yaml"]),
    (f"run recipes/{RECIPE}.yaml", ["run", f"{RECIPE}.yaml"]),
    (f"pull {RECIPE} --build cpu-int8", ["pull", RECIPE, "--build", "cpu-int8"]),
]
DEFAULT_HOME = "~/.local/share/zoo"
STAGE_LINE = re.compile(r"^\[zoo\] (?!remote cache:)(?P<stage>[\w\[\]-]+): (?P<text>.*)$")
# a stage's state changes: every run prints them, whatever the machine's speed
STATE = re.compile(r"^(running \(|done in |cached$|FAILED after |not run \(|waiting)")
# the first step of a stage's loop, printed at once (`epoch 1/4 · train_loss 2.22`); kept in the block
STEP = re.compile(r"^(?P<label>epoch|calibration|latency)\b[^·]*? \d+/\d+")
NUMBER = r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?"


def transcript(workdir: Path, python: str = sys.executable, timeout: float = 3600) -> str:
    """Run the main job, again, and a pull in `workdir` as a user would on a fresh clone; what they print."""
    for sub in ("data", "models", "entries"):
        if (REPO / "recipes" / sub).is_dir():
            shutil.copytree(REPO / "recipes" / sub, workdir / sub, dirs_exist_ok=True)
    for suffix in (".yaml", ".lock"):
        shutil.copy(REPO / "recipes" / f"{RECIPE}{suffix}", workdir / f"{RECIPE}{suffix}")
    home = workdir / "home"
    env = {**os.environ, "ZOO_CACHE_DIR": str(workdir / "cache"), "ZOO_HOME": str(home),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    env.pop("COLUMNS", None)
    out = []
    for shown, args in COMMANDS:
        proc = subprocess.run([python, "-m", "zoo", *args], cwd=workdir, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"zoo {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}")
        out.append(f"$ zoo {shown}\n{proc.stdout}")
    return "\n".join(out).replace(str(home), DEFAULT_HOME).replace(str(workdir) + os.sep, "")


def _progress(line: str) -> str:
    """A progress line with its figures as `…` and without its ETA: `epoch 1/4 · train_loss …`."""
    head, *rest = line.split(" · ")
    kept = [re.sub(rf"^(\S+) {NUMBER}$", r"\1 …", part) for part in rest if not part.startswith("ETA ")]
    return " · ".join([head, *kept])


def _table(rows: list[str]) -> list[str]:
    """The build table with sizes, figures and digests as `…`, its columns aligned again."""
    cells = [re.split(r"\s{2,}", row.strip()) for row in rows]
    head, body = cells[0], cells[1:]
    for row in body:
        for i, cell in enumerate(row):
            if i == 0:
                continue
            cell = re.sub(rf"^{NUMBER} ([kKMGT]?B)$", r"… \1", cell)
            cell = re.sub(rf"^{NUMBER}$", "…", cell)
            row[i] = re.sub(r"^[0-9a-f]{12}$", "…", cell)
    widths = [max(len(r[i]) for r in cells if i < len(r)) for i in range(len(head))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [head, *body]]


def activity(line: str) -> tuple[str, str] | None:
    """(stage, step label or '') of a line that shows what a running stage is doing; None for other lines.
    Which of those a run prints depends on its speed (a line every 10 s at most, the first step at once)."""
    m = STAGE_LINE.match(line)
    if not m or STATE.match(m.group("text")):
        return None
    step = STEP.match(m.group("text"))
    return m.group("stage"), step.group("label") if step else ""


def normalise(text: str) -> list[str]:
    """The lines of a transcript (or of the README's block) with what varies replaced by `…`; of the
    lines that show a running stage's activity, only the first step of each loop (`epoch 1/4 …`)."""
    lines, out, seen = text.splitlines(), [], set()
    i = 0
    while i < len(lines):
        line = lines[i].rstrip()
        i += 1
        shows = activity(line)
        if shows is not None:
            if shows[1] and shows not in seen:
                seen.add(shows)
                out.append(_progress(line))
            continue
        if re.match(r"^builds of \S+:$", line):
            out.append(line)
            rows = []
            while i < len(lines) and lines[i].startswith("  "):
                rows.append(lines[i])
                i += 1
            out.extend(_table(rows) if rows else [])
            continue
        line = re.sub(r": running \(.*\)$", ": running (…)", line)
        line = re.sub(r"starting with \d+ thread\(s\)", "starting with … thread(s)", line)
        line = re.sub(rf"\bin {NUMBER}s\b", "in …s", line)
        line = re.sub(rf"\({NUMBER}s of stage time\)", "(…s of stage time)", line)
        line = re.sub(rf"^(\s+\S+ (?:>=|<=|>|<|==|!=) {NUMBER})\s+{NUMBER}\s+(PASS|FAIL)$", r"\1  …  \2", line)
        out.append(line)
    return out


# `updated alexnet.lock`: printed on a CPU of a class the lockfile has no records for (the README
# says so under the block); on a class it has records for, the run leaves it as it is
LOCK_ADDED = re.compile(r"^updated \S+\.lock$")


def _comparable(lines: list[str]) -> list[str]:
    return [re.sub(r"\s+", " ", line).strip() for line in lines
            if activity(line) is None and not LOCK_ADDED.match(line.strip())]


def differences(block: str, run: str) -> list[str]:
    """How the README's block and a run's transcript differ, beyond what `normalise` replaces."""
    want, got = normalise(block), normalise(run)
    problems = []
    a, b = _comparable(want), _comparable(got)
    if a != b:
        import difflib

        problems += list(difflib.unified_diff(a, b, "README.md", "the run", lineterm="", n=1))
    shapes = {activity(line): line for line in got if activity(line)}
    for line in want:
        real = shapes.get(activity(line) or ("", ""))
        if real is not None and re.sub(r" \d+/\d+", "", line) != re.sub(r" \d+/\d+", "", real):
            problems.append(f"progress line {line!r} has another shape in the run: {real!r}")
    return problems


def readme_block(text: str | None = None) -> str:
    text = README.read_text(encoding="utf-8") if text is None else text
    body = text[text.index(BEGIN) + len(BEGIN):text.index(END)]
    m = re.search(r"```text\n(.*?)```", body, re.S)
    if not m:
        raise ValueError(f"README.md: no ```text block between {BEGIN} and {END}")
    return m.group(1)


def with_block(text: str, lines: list[str]) -> str:
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[:start] + "\n```text\n" + "\n".join(lines).strip("\n") + "\n```\n" + text[end:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if the README's block differs")
    parser.add_argument("--from", dest="source", type=Path, help="a transcript saved before, instead of a run")
    parser.add_argument("--save", type=Path, help="also write the raw transcript here")
    args = parser.parse_args()
    if args.source:
        run = args.source.read_text()
    else:
        with tempfile.TemporaryDirectory(prefix="readme-excerpt-") as tmp:
            run = transcript(Path(tmp))
    if args.save:
        args.save.write_text(run)
    if args.check:
        problems = differences(readme_block(), run)
        for p in problems:
            print(p, file=sys.stderr)
        sys.exit(1 if problems else 0)
    README.write_text(with_block(README.read_text(encoding="utf-8"), normalise(run)), encoding="utf-8")
    print(f"updated the excerpt in {README}")


if __name__ == "__main__":
    main()
