"""YAML loading that remembers where every value came from, for errors that point at it.

`load_with_positions` returns plain Python data plus the YAML node tree, so an error can name the
line and column of any key path (``("stages", "train", "config", "epochs")``). `snippet` renders
the offending lines with a caret, the way DVC's strictyaml errors do.

A recipe is untrusted input, so loading is bounded and never recurses on the input's shape:
the node tree is composed here from libyaml's event stream (libyaml's own composer recurses in C
and overflows the stack on deep nesting), and every limit below is checked while composing,
before any value is built. Each breach is a RecipeError naming file:line:col:

- `MAX_BYTES`: the size of the file;
- `MAX_DEPTH`: nesting of sequences and mappings, aliases included (an alias counts as deep as
  the node it names);
- `MAX_NODES`: values in the document once every alias is expanded (what validation, matrix
  interpolation and hashing walk), which stops "billion laughs" files;
- tags: only the plain YAML types (str, int, float, bool, null, timestamp, seq, map);
- numbers: integers Python can read (4,300 digits at most) and finite floats only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from zoo import yamlio
from zoo.errors import RecipeError

_Loader = yamlio.SafeLoader  # libyaml's parser where PyYAML has it (several times faster)

Path_ = tuple[Any, ...]

MAX_BYTES = 4 * 1024 * 1024  # real recipes are a few KB; a 1,000-stage recipe that needs every earlier stage is 3 MB
MAX_DEPTH = yamlio.MAX_DEPTH  # the same bound for recipes as for lockfiles
MAX_NODES = 1_000_000  # values after alias expansion (the 1,000-stage recipe above has 500,000)

_MAX_DIGITS = 4300  # Python's own limit for str -> int
_T = "tag:yaml.org,2002:"
_SCALAR_TAGS = {f"{_T}{t}" for t in ("str", "int", "float", "bool", "null", "timestamp", "merge")}
_SEQ, _MAP = f"{_T}seq", f"{_T}map"
_PLAIN_HINT = "recipes hold plain YAML values: strings, numbers, booleans, null, lists and mappings"


@dataclass(frozen=True)
class Position:
    line: int  # 1-based
    col: int  # 1-based


class Node:
    """A YAML node: its resolved tag, its value and where it starts (slots: a recipe may hold 10^6 of them)."""

    __slots__ = ("tag", "value", "line", "col")

    def __init__(self, tag: str, value: Any, mark):
        self.tag, self.value, self.line, self.col = tag, value, mark.line + 1, mark.column + 1

    @property
    def pos(self) -> Position:
        return Position(self.line, self.col)


class Scalar(Node):
    __slots__ = ()


class Sequence(Node):
    __slots__ = ()


class Mapping(Node):
    """`value` is a list of (key node, value node) pairs."""

    __slots__ = ()


@dataclass
class Located:
    """Parsed YAML data and the node tree it came from, to place errors on a key path."""

    data: Any
    text: str
    file: Path
    root: Node | None = None
    # id(mapping node) -> {constructed key: (key node, value node)}, filled while building
    _keys: dict[int, dict[Any, tuple[Node, Node]]] | None = None

    def where(self, path: Path_, *, key: bool = False) -> Position:
        """The position of `path` (of its key with `key=True`), or of its nearest ancestor that has one."""
        node = self.root
        if node is None:
            return Position(1, 1)
        pos = node.pos
        key_pos: Position | None = None
        for part in path:
            if isinstance(node, Mapping):
                pair = (self._keys or {}).get(id(node), {}).get(part)
                if pair is None:
                    return pos
                key_pos = pair[0].pos
                node = pair[1]
                pos = node.pos
            elif isinstance(node, Sequence) and isinstance(part, int) and 0 <= part < len(node.value):
                key_pos = None
                node = node.value[part]
                pos = node.pos
            else:
                return pos
        if key and path and key_pos is not None:
            return key_pos
        return pos

    def error(self, path: Path_, message: str, *, hint: str | None = None, key: bool = False) -> RecipeError:
        """A RecipeError naming file:line:col with a snippet of the offending lines."""
        pos = self.where(path, key=key)
        return _error(self.file, self.text, pos, f"{message}\n  in {dotted(path)}", hint)


def dotted(path: Path_, limit: int = 200) -> str:
    """A key path for messages, ``stages.train.config.epochs`` (cut when a key is huge)."""
    text = ".".join(str(p) for p in path) if path else "(top level)"
    return text if len(text) <= limit else text[:limit] + "…"


def snippet(text: str, pos: Position, context: int = 2, width: int = 120) -> str:
    """The lines around `pos` with line numbers and a caret under the column (long lines are cut around it)."""
    lines = text.splitlines()
    lo = max(1, pos.line - context)
    hi = min(len(lines), pos.line + context)
    digits = len(str(hi))
    start = max(0, pos.col - 1 - width // 2)  # one window for all lines, so the caret stays under its column
    out = []
    for n in range(lo, hi + 1):
        marker = ">" if n == pos.line else " "
        line = lines[n - 1]
        cut = start if n == pos.line or len(line) > start else 0
        shown = ("…" if cut else "") + line[cut:cut + width] + ("…" if len(line) > cut + width else "")
        out.append(f"  {marker} {n:>{digits}} | {shown}")
        if n == pos.line:
            out.append(f"    {' ' * digits} | {' ' * (pos.col - 1 - start + (1 if start else 0))}^")
    return "\n".join(out)


def _error(file: Path, text: str, pos: Position, message: str, hint: str | None) -> RecipeError:
    return RecipeError(f"{file}:{pos.line}:{pos.col}: {message}\n{snippet(text, pos)}", hint=hint)


def _pos(mark) -> Position:
    return Position(mark.line + 1, mark.column + 1)


def _position_of(text: str, index: int) -> Position:
    """Line and column of the character at `index`."""
    line_start = text.rfind("\n", 0, index) + 1
    return Position(text.count("\n", 0, index) + 1, index - line_start + 1)


def load_with_positions(file: Path) -> Located:
    """Parse a YAML file within the limits above, refusing duplicate keys, and keep its node tree."""
    try:
        with open(file, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise RecipeError(f"{file}: no such file", hint="check the path to the recipe") from None
    except OSError as e:
        raise RecipeError(f"{file}: cannot read: {e.strerror}") from None
    if len(raw) > MAX_BYTES:
        raise RecipeError(f"{file}:1:1: the file is larger than {MAX_BYTES // (1024 * 1024)} MiB, the limit for a recipe",
                          hint="is this the right file? A recipe is a few KB of YAML")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        text = raw[:e.start].decode("utf-8")
        raise _error(file, text, _position_of(text, len(text)), f"invalid UTF-8: byte 0x{raw[e.start]:02x} cannot start "
                     f"or continue a character{_field_at(file, text)}", "save the recipe as UTF-8") from None
    root = _Composer(file, text).compose()
    located = Located(None, text, file, root, {})
    if root is not None:
        located.data = _Builder(located).build(root)
    return located


class _Composer:
    """libyaml events -> a Node tree, iteratively, checking every limit on the way."""

    def __init__(self, file: Path, text: str, stop_at: int | None = None):
        self.file, self.text = file, text
        self.stop_at = stop_at  # stop before the event that reaches this character (to name its field)
        self.resolver = yaml.SafeLoader("")
        # one frame per open collection: [node, children, expanded size, height, anchor]
        self.stack: list[list[Any]] = []

    def fail(self, mark, message: str, hint: str | None = None) -> RecipeError:
        if self.stack:
            message += f"\n  in {self.where()}"
        return _error(self.file, self.text, _pos(mark) if mark else Position(1, 1), message, hint)

    def where(self, shown: int = 8) -> str:
        """The key path of the value being composed, e.g. ``stages.train.config.0`` (long paths are cut)."""
        parts: list[str] = []
        for node, children, *_ in self.stack:
            if isinstance(node, Mapping):
                if len(children) % 2:  # a key was read, its value is being composed
                    key = children[-1]
                    parts.append(key.value if isinstance(key, Scalar) else "?")
            else:
                parts.append(str(len(children)))
        if len(parts) > shown:
            parts = parts[:shown] + [f"… ({len(parts) - shown} more levels)"]
        return dotted(tuple(parts))

    def compose(self) -> Node | None:
        try:
            return self._compose()
        except yaml.MarkedYAMLError as e:
            mark = e.problem_mark or e.context_mark
            problem = e.problem or e.context or "invalid YAML"
            raise self.fail(mark, f"invalid YAML: {problem}",
                            "fix the YAML syntax (indentation, quotes, colons)") from None
        except yaml.reader.ReaderError as e:
            index = e.position
            if _Loader is not yaml.SafeLoader:  # libyaml counts UTF-8 bytes, the Python reader characters
                index = len(self.text.encode("utf-8")[:index].decode("utf-8", "ignore"))
            pos = _position_of(self.text, min(index, len(self.text)))
            char = chr(e.character) if isinstance(e.character, int) else e.character
            where = _field_at(self.file, self.text[:index])
            raise _error(self.file, self.text, pos, f"invalid YAML: character {char!r}: {e.reason}{where}",
                         "remove the character, or write it as an escape in a double-quoted string (\"\\x01\")") from None

    def _compose(self) -> Node | None:
        stack = self.stack
        anchors: dict[str, tuple[Node, int, int]] = {}  # anchor -> (node, expanded size, height)
        open_anchors: set[str] = set()
        root: Node | None = None
        documents = 0

        def add(node: Node, size: int, height: int, mark) -> None:
            nonlocal root
            if len(stack) + height > MAX_DEPTH:
                raise self.fail(mark, f"the document nests deeper than {MAX_DEPTH} levels (through this alias)",
                                "a recipe nests a few levels deep; is an alias pointing at the wrong anchor?")
            if not stack:
                root = node
                return
            frame = stack[-1]
            frame[1].append(node)
            frame[2] += size
            frame[3] = max(frame[3], height + 1)
            if frame[2] > MAX_NODES:
                raise too_many(mark)

        def too_many(mark) -> RecipeError:
            return self.fail(mark, f"the document expands to more than {MAX_NODES:,} values "
                             "(aliases repeat the node they name)",
                             "a recipe holds a few hundred values; remove the aliases that repeat large nodes")

        def anchor(name: str | None, node: Node, size: int, height: int, mark) -> None:
            if name is None:
                return
            if name in anchors:
                raise self.fail(mark, f"duplicate anchor &{name}", "give each anchor its own name")
            anchors[name] = (node, size, height)

        resolve, resolved = self.resolver.resolve, {}
        stop_at = self.stop_at
        for event in yaml.parse(self.text, Loader=_Loader):
            mark = event.start_mark
            if stop_at is not None and event.end_mark.index >= stop_at:
                return root
            if isinstance(event, yaml.ScalarEvent):  # the most frequent event: kept inline and short
                tag = event.tag
                if tag is None or tag == "!":
                    implicit = event.implicit
                    tag = resolved.get((event.value, implicit))
                    if tag is None:  # the resolver runs regexes; recipes repeat values (stage ids in needs)
                        tag = resolved[(event.value, implicit)] = resolve(yaml.ScalarNode, event.value, implicit)
                if tag not in _SCALAR_TAGS:
                    raise self.fail(mark, f"unsupported tag {_shown_tag(event.tag)} on a scalar", _PLAIN_HINT + "; remove the tag")
                node = Scalar(tag, event.value, mark)
                if event.anchor is not None:
                    anchor(event.anchor, node, 1, 0, mark)
                if stack:
                    frame = stack[-1]
                    frame[1].append(node)
                    frame[2] += 1
                    if frame[2] > MAX_NODES:
                        raise too_many(mark)
                else:
                    root = node
            elif isinstance(event, yaml.DocumentStartEvent):
                documents += 1
                if documents > 1:
                    raise self.fail(mark, "a recipe is one YAML document; this file holds several",
                                    "remove the `---` that starts a second document")
            elif isinstance(event, yaml.AliasEvent):
                if event.anchor in open_anchors:
                    raise self.fail(mark, f"alias *{event.anchor} is inside the node it names (a recursive alias)",
                                    "an alias may only repeat a node defined before it, outside it")
                if event.anchor not in anchors:
                    raise self.fail(mark, f"alias *{event.anchor} names no anchor defined before it",
                                    f"define `&{event.anchor}` on a value above this line")
                node, size, height = anchors[event.anchor]
                add(node, size, height, mark)
            elif isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
                is_seq = isinstance(event, yaml.SequenceStartEvent)
                tag = event.tag
                if tag is None or tag == "!":
                    tag = _SEQ if is_seq else _MAP
                if tag != (_SEQ if is_seq else _MAP):
                    raise self.fail(mark, f"unsupported tag {_shown_tag(event.tag)} on a {'sequence' if is_seq else 'mapping'}",
                                    _PLAIN_HINT + "; remove the tag")
                if len(stack) >= MAX_DEPTH:
                    raise self.fail(mark, f"the document nests deeper than {MAX_DEPTH} levels",
                                    "a recipe nests a few levels deep; look for unclosed `[` or `{`")
                node = (Sequence if is_seq else Mapping)(tag, [], mark)
                stack.append([node, node.value, 1, 1, event.anchor])
                if event.anchor is not None:
                    open_anchors.add(event.anchor)
            elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
                node, children, size, height, name = stack.pop()
                if isinstance(node, Mapping):
                    node.value = list(zip(children[0::2], children[1::2]))
                if name is not None:
                    open_anchors.discard(name)
                anchor(name, node, size, height, mark)
                add(node, size, height, mark)
        return root


def _field_at(file: Path, prefix: str) -> str:
    """"\n  in FIELD" for the value holding the character after `prefix`, a bad one that libyaml
    refuses before parsing: the prefix and a stand-in character are parsed up to that value."""
    composer = _Composer(file, prefix + "\ufffd", stop_at=len(prefix))
    try:
        composer._compose()
    except (yaml.YAMLError, RecipeError):
        pass  # the prefix may end inside a value: the stack says which
    return f"\n  in {composer.where()}" if composer.stack else ""


class _Builder:
    """A Node tree (bounded by _Composer) -> plain Python data, refusing duplicate keys and bad scalars."""

    def __init__(self, located: Located):
        self.located = located
        self.constructor = yaml.SafeLoader("")
        self.built: dict[int, Any] = {}  # an aliased node is built once and shared, as PyYAML does

    def build(self, node: Node, path: Path_ = ()) -> Any:
        # recursion is bounded: the composer refused trees deeper than MAX_DEPTH
        done = self.built.get(id(node), _MISSING)
        if done is not _MISSING:
            return done
        if isinstance(node, Mapping):
            out: dict[Any, Any] = {}
            pairs: dict[Any, tuple[Node, Node]] = {}
            self.located._keys[id(node)] = pairs
            for key_node, value_node in node.value:
                if not isinstance(key_node, Scalar):
                    raise self._fail(key_node, path, "mapping keys must be plain scalars",
                                     "write the key as a string, number or boolean")
                key = self.scalar(key_node, path)
                if key in out:
                    raise self._fail(key_node, path + (key,), f"duplicate key {_short(repr(key))}",
                                     "each key (and each stage id) may appear once; rename or merge them")
                pairs[key] = (key_node, value_node)
                out[key] = self.build(value_node, path + (key,))
        elif isinstance(node, Sequence):
            out = [self.build(item, path + (i,)) for i, item in enumerate(node.value)]
        else:
            out = self.scalar(node, path)
        self.built[id(node)] = out
        return out

    def scalar(self, node: Scalar, path: Path_) -> Any:
        tag = node.tag
        if tag in (f"{_T}str", f"{_T}merge"):
            return node.value
        kind = tag.rsplit(":", 1)[-1]
        if kind in ("int", "float") and len(node.value) > _MAX_DIGITS:
            # checked before converting: "1:0:0:…" (base 60) costs quadratic time in its length
            raise self._fail(node, path, f"a number of {len(node.value):,} characters is too long",
                             f"numbers may have at most {_MAX_DIGITS:,} digits; quote the value to keep it a string")
        if not self._reads_as(node.value, tag):
            # an explicit tag on a value of another type (`!!int abc`, `!!bool maybe`, `!!int ''`)
            raise self._fail(node, path, f"{_short(node.value)!r} is not a valid {kind}",
                             f"write a plain {kind}, or drop the `!!{kind}` tag")
        try:
            value = self.constructor.construct_object(yaml.ScalarNode(tag, node.value), deep=True)
        except (ValueError, OverflowError, yaml.YAMLError) as e:
            reason = getattr(e, "problem", None) or str(e)
            shown = _short(node.value)
            hint = ("integers may have at most 4,300 digits" if kind == "int" else
                    "write dates as YYYY-MM-DD with a real day, or quote the value to keep it a string"
                    if kind == "timestamp" else "quote the value to keep it a string")
            raise self._fail(node, path, f"cannot read {shown!r} as {kind}: {reason}", hint) from None
        if isinstance(value, float) and not math.isfinite(value):
            raise self._fail(node, path, f"{node.value!r} is not a finite number",
                             "numbers must be finite (YAML reads .inf, .nan and floats beyond 1.8e308 as infinite)")
        return value

    def _reads_as(self, value: str, tag: str) -> bool:
        """Whether plain `value` is read as `tag` (an int is also a valid `!!float`)."""
        plain = self.constructor.resolve(yaml.ScalarNode, value, (True, False))
        return plain == tag or (tag == f"{_T}float" and plain == f"{_T}int")

    def _fail(self, node: Node, path: Path_, message: str, hint: str) -> RecipeError:
        return _error(self.located.file, self.located.text, node.pos, f"{message}\n  in {dotted(path)}", hint)


_MISSING = object()


def _short(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def _shown_tag(tag: str) -> str:
    """`!!binary` rather than `tag:yaml.org,2002:binary`, as the user wrote it."""
    return "!!" + tag[len(_T):] if tag.startswith(_T) else tag
