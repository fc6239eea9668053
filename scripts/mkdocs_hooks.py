"""MkDocs hooks (mkdocs.yml `hooks:`): the pages generated from the program, so that the site
cannot say other than the code.

- `cli-help.md`: `zoo --help` and every command's `--help` (scripts/cli_commands.py);
- `recipe-schema.md`: the recipe's top-level fields and the whole JSON Schema
  (`recipes/recipe.schema.json`, which `zoo schema` writes and tests/test_schema.py keeps current);
- `exit-codes.md`: the exit-code table of README.md (tests/test_errors.py checks it against
  `zoo.errors.ExitCode`).

Nothing here downloads: the site builds offline (`mkdocs build --strict`, tests/test_docs_site.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from mkdocs.structure.files import File

REPO = Path(__file__).resolve().parents[1]


def cli_help_page() -> str:
    sys.path.insert(0, str(REPO / "scripts"))
    import cli_commands

    parts = ["# Command help\n\n",
             "Every command's `--help`, as the installed program prints it (generated when the site is\n"
             "built). What the commands do, with examples: [Command line](cli.md).\n"]
    for cmd in cli_commands.commands():
        if cmd.hidden:
            continue
        name = " ".join(("zoo",) + cmd.path)
        parts.append(f"\n## `{name}`\n\n```text\n$ {name} --help\n{cmd.help}```\n")
    return "".join(parts)


def schema_page() -> str:
    schema = json.loads((REPO / "recipes" / "recipe.schema.json").read_text())
    rows = []
    required = set(schema.get("required", []))
    for name, prop in schema.get("properties", {}).items():
        desc = " ".join(str(prop.get("description", "")).split()).replace("|", "\\|")
        rows.append(f"| `{name}` | {'yes' if name in required else ''} | {desc} |")
    return ("# Recipe schema\n\n"
            "`zoo schema` prints the JSON Schema of recipes; the repository keeps it as\n"
            "`recipes/recipe.schema.json`. Editors with yaml-language-server complete and check recipes that\n"
            "start with `# yaml-language-server: $schema=./recipe.schema.json`. The format itself:\n"
            "[Recipes](recipes.md); each kind's `config`: [Stage kinds](kinds.md).\n\n"
            "## Top-level fields\n\n| field | required | description |\n|---|---|---|\n" + "\n".join(rows) +
            "\n\n## The schema\n\n```json\n" + json.dumps(schema, indent=2) + "\n```\n")


def exit_codes_page() -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    start = text.index("### Exit codes\n")
    end = text.index("\n## ", start)
    section = text[start + len("### Exit codes\n"):end].strip().splitlines()
    table = "\n".join(line for line in section if line.startswith("|"))
    return ("# Exit codes\n\nEvery `zoo` command exits with one of these codes (`zoo.errors.ExitCode`; the table is\n"
            "README.md's). An error prints one message and a hint; `ZOO_DEBUG=1` adds the traceback;\n"
            "`--json` prints the error as a document ([`--json` shapes](cli-json.md)).\n\n" + table + "\n")


GENERATED = {"cli-help.md": cli_help_page, "recipe-schema.md": schema_page, "exit-codes.md": exit_codes_page}


def on_files(files, config):
    for name, make in GENERATED.items():
        files.append(File.generated(config, name, content=make()))
    return files
