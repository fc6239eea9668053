"""The examples of the docs (docs/**/*.md, README.md, DEVELOPERS.md) against the program.

The marking convention (DEVELOPERS.md, "Docs"):
- a ```yaml block without a title is a recipe or a piece of one, and must pass `zoo validate`
  (a piece is merged into a small base recipe, as scripts/gen_kinds_doc.py does for docs/kinds.md,
  which that script checks); a ```yaml block with `title="…"` is another file (a lockfile, a
  config) and is not a recipe;
- every `zoo …` line of a ```bash block names a command the program has, with options it takes;
- every command of the program is documented on docs/cli.md.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from cli_helpers import zoo
from conftest import REPO
from docs_helpers import Block, blocks, broken_links, command_lines, iris_csv

sys.path.insert(0, str(REPO / "scripts"))
import cli_commands  # noqa: E402
import gen_kinds_doc  # noqa: E402

DOCS = sorted(p for p in (REPO / "docs").rglob("*.md") if not p.name.startswith("_"))
PAGES = [REPO / "README.md", REPO / "DEVELOPERS.md", *DOCS]
COMMANDS = {c.path: c for c in cli_commands.commands()}


def _name(path: Path) -> str:
    return str(path.relative_to(REPO))


def _recipe_blocks() -> list[tuple[str, Block]]:
    return [(f"{_name(p)}:{b.line}", b) for p in PAGES if p.name != "kinds.md"
            for b in blocks(p.read_text(encoding="utf-8")) if b.lang in ("yaml", "yml") and b.title is None]


def _shell_blocks() -> list[tuple[Path, Block]]:
    return [(p, b) for p in PAGES for b in blocks(p.read_text(encoding="utf-8"))
            if b.lang in ("bash", "sh", "shell", "console")]


def command_problems(args: list[str]) -> list[str]:
    """What is wrong with `zoo ARGS` as the docs write it: an unknown command or option."""
    path: tuple[str, ...] = ()
    for word in args:
        if word.startswith("-") or path + (word,) not in COMMANDS:
            break
        path += (word,)
    rest = args[len(path):]
    is_group = any(len(p) > len(path) and p[:len(path)] == path for p in COMMANDS)
    if is_group and rest and not rest[0].startswith("-"):
        return [f"zoo {' '.join(path)} has no command {rest[0]!r}".replace("zoo  ", "zoo ")]
    options = COMMANDS[path].options
    return [f"zoo {' '.join(path)} has no option {word.split('=', 1)[0]}" for word in rest
            if word.startswith("-") and word not in ("-", "--") and word.split("=", 1)[0] not in options]


def test_the_command_checker_knows_the_program():
    assert command_problems(["cache", "push", "--remote", "x"]) == []
    assert command_problems(["run", "r.yaml", "--frozen", "-j", "2"]) == []
    assert command_problems(["runn", "r.yaml"]) == ["zoo has no command 'runn'"]
    assert command_problems(["cache", "pusj"]) == ["zoo cache has no command 'pusj'"]
    assert command_problems(["pull", "m", "--bulid", "x"]) == ["zoo pull has no option --bulid"]


@pytest.mark.parametrize("page,block", _shell_blocks(), ids=lambda v: _name(v) if isinstance(v, Path) else str(v.line))
def test_every_zoo_command_in_a_shell_example_exists(page, block):
    problems = [f"{_name(page)}:{block.line}: {p}" for args in command_lines(block) for p in command_problems(args)]
    assert problems == []


def test_every_command_is_on_the_cli_page():
    text = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    named = {tuple(m.split()) for m in re.findall(r"`zoo ((?:[a-z][a-z-]*)(?: [a-z][a-z-]*)*)", text)}
    missing = [" ".join(p) for p, c in COMMANDS.items() if p and not c.hidden
               and not any(n[:len(p)] == p for n in named)]
    assert missing == [], f"docs/cli.md does not document: {missing}"


def test_developers_md_links_resolve():
    assert broken_links(REPO / "DEVELOPERS.md", REPO) == []


@pytest.fixture(scope="module")
def example_folder(tmp_path_factory) -> Path:
    """What the examples may name beside them: the shipped recipes' data, models and entries, and README's CSV."""
    folder = tmp_path_factory.mktemp("doc-examples")
    for sub in ("data", "models", "entries"):
        shutil.copytree(REPO / "recipes" / sub, folder / sub)
    iris_csv(folder / "iris.csv")  # README's recipe for your own CSV names it
    return folder


@pytest.mark.parametrize("where,block", _recipe_blocks(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_recipe_example_validates(where, block, example_folder):
    recipe = gen_kinds_doc.as_recipe(block.body)
    path = example_folder / f"example-{re.sub(r'[^A-Za-z0-9]+', '-', where)}.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    r = zoo("validate", path.name, cwd=example_folder, env={"ZOO_CACHE_DIR": str(example_folder / "cache")})
    assert r.code == 0, f"{where}: {r.text}"


def test_a_recipe_example_that_is_wrong_fails(example_folder):
    path = example_folder / "wrong.yaml"
    path.write_text(yaml.safe_dump(gen_kinds_doc.as_recipe("train:\n  config: {epochz: 3}\n"), sort_keys=False))
    r = zoo("validate", path.name, cwd=example_folder)
    assert r.code == 2 and "epochz" in r.text


def test_the_docs_have_examples_to_check():
    assert len(_recipe_blocks()) >= 3 and sum(len(command_lines(b)) for _, b in _shell_blocks()) >= 10
    assert os.path.exists(REPO / "mkdocs.yml")


def _inline_commands(text: str) -> list[tuple[int, str]]:
    """(line, span) of every inline code span that is a `zoo …` command line."""
    from docs_helpers import prose_keep_code_spans

    return [(n, span) for n, line in enumerate(prose_keep_code_spans(text), 1)
            for span in re.findall(r"`(zoo [^`]+)`", line)]


def _span_args(span: str) -> list[str]:
    """`zoo pull NAME[@VERSION] [--build B] [--to DIR]` → ['pull', 'NAME', '--build', 'B', '--to', 'DIR']."""
    span = re.split(r"\s\\?\|\s", span)[0]   # `zoo list | head -1`: the zoo part
    words = re.sub(r"[\[\]{}()|…]", " ", span).split()[1:]
    return [w.split("=", 1)[0] if w.startswith("-") else w for w in words if w not in ("/", "or")]


def test_every_zoo_command_in_the_text_exists():
    """Inline commands too (the command tables of docs/cli.md, the prose): their commands and options."""
    problems = []
    for page in PAGES:
        for line, span in _inline_commands(page.read_text(encoding="utf-8")):
            args = _span_args(span)
            if not args or not re.match(r"^[a-z-]+$", args[0]):
                continue
            problems += [f"{_name(page)}:{line}: `{span}`: {p}" for p in command_problems(args)]
    assert problems == []


def test_the_inline_command_check_reads_the_tables():
    spans = [span for page in PAGES for _, span in _inline_commands(page.read_text(encoding="utf-8"))]
    assert len(spans) > 50 and any(s.startswith("zoo cache push [RECIPE…]") for s in spans)
    assert _span_args("zoo pull NAME[@VERSION|@TAG] [--build B] [--to DIR]") == \
        ["pull", "NAME", "@VERSION", "@TAG", "--build", "B", "--to", "DIR"]
    assert command_problems(_span_args("zoo pull NAME [--bulid B]")) == ["zoo pull has no option --bulid"]
