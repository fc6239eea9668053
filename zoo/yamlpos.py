"""YAML loading that remembers where every value came from, for errors that point at it.

`load_with_positions` returns plain Python data plus a map from a key path
(``("stages", "train", "config", "epochs")``) to its line and column. `snippet` renders the
offending lines with a caret, the way DVC's strictyaml errors do.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from zoo.errors import RecipeError

try:  # the C loader is several times faster; fall back where libyaml is missing
    _Loader = yaml.CSafeLoader
except AttributeError:  # pragma: no cover
    _Loader = yaml.SafeLoader

Path_ = tuple[Any, ...]


@dataclass(frozen=True)
class Position:
    line: int  # 1-based
    col: int  # 1-based


@dataclass
class Located:
    """Parsed YAML data and where each key path sits in the text."""

    data: Any
    text: str
    file: Path
    key_pos: dict[Path_, Position]
    value_pos: dict[Path_, Position]

    def where(self, path: Path_, *, key: bool = False) -> Position:
        """The position of `path`, or of its nearest ancestor that has one."""
        table = self.key_pos if key else self.value_pos
        p = tuple(path)
        while p:
            if p in table:
                return table[p]
            if not key and p in self.key_pos:
                return self.key_pos[p]
            p = p[:-1]
        return self.value_pos.get((), Position(1, 1))

    def error(self, path: Path_, message: str, *, hint: str | None = None, key: bool = False) -> RecipeError:
        """A RecipeError naming file:line:col with a snippet of the offending lines."""
        pos = self.where(path, key=key)
        where = ".".join(str(p) for p in path) if path else "(top level)"
        text = f"{self.file}:{pos.line}:{pos.col}: {message}\n  in {where}\n{snippet(self.text, pos)}"
        return RecipeError(text, hint=hint)


def snippet(text: str, pos: Position, context: int = 2) -> str:
    """The lines around `pos` with line numbers and a caret under the column."""
    lines = text.splitlines()
    lo = max(1, pos.line - context)
    hi = min(len(lines), pos.line + context)
    width = len(str(hi))
    out = []
    for n in range(lo, hi + 1):
        marker = ">" if n == pos.line else " "
        out.append(f"  {marker} {n:>{width}} | {lines[n - 1]}")
        if n == pos.line:
            out.append(f"    {' ' * width} | {' ' * (pos.col - 1)}^")
    return "\n".join(out)


def load_with_positions(file: Path) -> Located:
    """Parse a YAML file, refusing duplicate keys, and record positions of every node."""
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RecipeError(f"{file}: no such file", hint="check the path to the recipe") from None
    except OSError as e:
        raise RecipeError(f"{file}: cannot read: {e.strerror}") from None
    key_pos: dict[Path_, Position] = {}
    value_pos: dict[Path_, Position] = {}
    try:
        node = yaml.compose(text, Loader=_Loader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        pos = Position(mark.line + 1, mark.column + 1) if mark else Position(1, 1)
        problem = e.problem or "invalid YAML"
        raise RecipeError(f"{file}:{pos.line}:{pos.col}: invalid YAML: {problem}\n{snippet(text, pos)}",
                          hint="fix the YAML syntax (indentation, quotes, colons)") from None
    located = Located(None, text, file, key_pos, value_pos)
    located.data = _build(node, (), located) if node is not None else None
    return located


def _pos(mark) -> Position:
    return Position(mark.line + 1, mark.column + 1)


def _build(node: yaml.Node, path: Path_, located: Located) -> Any:
    located.value_pos[path] = _pos(node.start_mark)
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise located.error(path, "mapping keys must be plain scalars")
            key = yaml.constructor.SafeConstructor.construct_scalar(_CONSTRUCTOR, key_node)
            if key in out:
                located.key_pos[path + (key,)] = _pos(key_node.start_mark)
                raise located.error(path + (key,), f"duplicate key {key!r}", key=True,
                                    hint="each key (and each stage id) may appear once; rename or merge them")
            located.key_pos[path + (key,)] = _pos(key_node.start_mark)
            out[key] = _build(value_node, path + (key,), located)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_build(item, path + (i,), located) for i, item in enumerate(node.value)]
    return _CONSTRUCTOR.construct_object(node, deep=True)


_CONSTRUCTOR = yaml.SafeLoader("")
