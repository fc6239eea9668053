"""Reading Markdown the way the docs tests need it: fenced blocks with their info string and line,
headings' anchors (GitHub's and MkDocs' slugs), and relative links. No Markdown library: the
rules below are the few the docs use, and a test that reads them must not depend on a renderer."""

from __future__ import annotations

import csv
import re
import shlex
import unicodedata
from dataclasses import dataclass
from pathlib import Path

FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
LINK = re.compile(r"(?<!!)\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")


@dataclass
class Block:
    lang: str        # the first word of the info string (`yaml`, `bash`, `text`…)
    info: str        # the whole info string (`yaml title=".zoo/config.yaml"`)
    line: int        # 1-based line of the first line of the body
    body: str

    @property
    def title(self) -> str | None:
        m = re.search(r'title="([^"]*)"', self.info)
        return m.group(1) if m else None


def blocks(text: str) -> list[Block]:
    """Every fenced code block of a Markdown text, in order."""
    found, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, indent, info, body, start = m.group("fence"), len(m.group("indent")), m.group("info").strip(), [], i + 1
        i += 1
        while i < len(lines) and not (lines[i].strip().startswith(fence) and lines[i].strip().strip(fence[0]) == ""):
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
            i += 1
        found.append(Block(info.split()[0] if info else "", info, start + 1, "\n".join(body) + "\n"))
        i += 1
    return found


def prose(text: str) -> str:
    """The text with its fenced blocks and inline code blanked (links inside code are not links)."""
    out, fence = [], None
    for line in text.splitlines():
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group("fence")
            out.append("")
        elif fence is not None:
            if line.strip().startswith(fence) and line.strip().strip(fence[0]) == "":
                fence = None
            out.append("")
        else:
            out.append(re.sub(r"`[^`]*`", "``", line))
    return "\n".join(out)


def headings(text: str) -> list[str]:
    """The text of every ATX heading outside code blocks."""
    return [m.group(2).strip() for m in (re.match(r"^(#{1,6}) +(.*?) *#*$", line) for line in prose_keep_code_spans(text))
            if m]


def prose_keep_code_spans(text: str) -> list[str]:
    out, fence = [], None
    for line in text.splitlines():
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group("fence")
        elif fence is not None:
            if line.strip().startswith(fence) and line.strip().strip(fence[0]) == "":
                fence = None
        else:
            out.append(line)
    return out


def github_anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"<[^>]+>", "", heading).strip().lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_" or unicodedata.category(c).startswith("M"))
    return text.replace(" ", "-")


def mkdocs_anchor(heading: str) -> str:
    """Python-Markdown's `toc` slug (MkDocs' default): accents folded, punctuation dropped, runs of
    spaces and hyphens made one hyphen."""
    text = re.sub(r"<[^>]+>", "", heading).replace("`", "")
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(text: str, slug=github_anchor) -> set[str]:
    """Every heading's anchor (GitHub numbers repeats: `x`, `x-1`…) and every explicit `id="…"`."""
    seen: dict[str, int] = {}
    out = set()
    for heading in headings(text):
        base = slug(heading)
        n = seen.get(base, 0)
        out.add(base if n == 0 else f"{base}-{n}")
        seen[base] = n + 1
    out.update(re.findall(r'id="([^"]+)"', text))
    return out


def relative_links(text: str) -> list[tuple[int, str]]:
    """(line, target) of every link that is not a URL (http(s), mailto) outside code."""
    found = []
    for n, line in enumerate(prose(text).splitlines(), 1):
        for m in LINK.finditer(line):
            target = m.group("target")
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target):
                found.append((n, target))
    return found


def broken_links(md: Path, root: Path, slug=github_anchor) -> list[str]:
    """Links of `md` to a file under `root` that does not exist, or to an anchor its target lacks."""
    problems = []
    for line, target in relative_links(md.read_text(encoding="utf-8")):
        path, _, anchor = target.partition("#")
        dest = (md.parent / path).resolve() if path else md
        if not dest.exists():
            problems.append(f"{md.name}:{line}: {target}: no such file")
            continue
        try:
            dest.relative_to(root.resolve())
        except ValueError:
            problems.append(f"{md.name}:{line}: {target}: outside the repository")
            continue
        if anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text(encoding="utf-8"), slug):
            problems.append(f"{md.name}:{line}: {target}: {dest.name} has no heading #{anchor}")
    return problems


def command_lines(block: Block) -> list[list[str]]:
    """The `zoo …` commands of a shell block, as argument lists: a line that starts with `zoo`,
    `$ zoo`, `./dev zoo` or `.venv/bin/zoo` (comments dropped, `\\` continuations joined)."""
    joined = re.sub(r"\\\n\s*", " ", block.body)
    commands = []
    for raw in joined.splitlines():
        line = raw.strip()
        line = re.sub(r"^\$ ", "", line)
        line = re.sub(r"^(\./dev |\.venv/bin/)", "", line)
        if not re.match(r"^zoo(\s|$)", line):
            continue
        # Only the zoo command itself: a page may go on with `; echo "exit $?"`, `| head` or `> file`.
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        words = []
        for word in lexer:
            if word and set(word) <= set(";&|<>()"):
                break
            words.append(word)
        commands.append(words[1:])
    return commands


def iris_csv(path: Path) -> None:
    """scikit-learn's iris as a user's CSV: a header row, four measurements, the species by name."""
    from sklearn.datasets import load_iris

    iris = load_iris()
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow([*iris.feature_names, "species"])
        for row, target in zip(iris.data, iris.target):
            out.writerow([*(f"{v:g}" for v in row), iris.target_names[target]])
