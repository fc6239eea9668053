"""Every YAML zoo reads that is not a recipe (lockfiles, configs, DVC files, model cards), read
within the recipe parser's limits; and the YAML zoo writes.

Every `zoo run` reads its recipe's lockfile and writes out what it would hold (to compare it with
the file): on a lockfile with two platforms' records the C parser and emitter take about 8 ms
each against 60 ms each for the pure-Python ones. Both write the same text from the same data (a
test checks it on every shipped lockfile), so which one a machine has never changes a lockfile.

Any of these files may come from a stranger (a cloned project's config, a DVC repo's files, a
lockfile in a pull request), so reading is bounded as `zoo.engine.yamlpos` bounds a recipe:
`safe_load` first walks libyaml's event stream (produced without recursion, in C) and refuses,
before anything is composed or built,

- `MAX_BYTES`: a text larger than the recipe limit;
- `MAX_DEPTH`: nesting of sequences and mappings, aliases included (an alias counts as deep as
  the node it names): libyaml's composer recurses in C, and a document nested a few hundred
  thousand levels deep crashes the process (a segmentation fault, no Python error);
- `MAX_NODES`: values once every alias is expanded (what a caller that walks or prints the data
  sees), which stops "billion laughs" files;
- numbers longer than Python reads (`MAX_DIGITS`; YAML 1.1's base-60 integers cost quadratic time).

Each refusal is a `LimitExceeded` (a YAMLError, as any other unreadable YAML) carrying its line;
`load_text` turns any unreadable document into one InvalidInput line naming the file, line and
limit; `read_bounded` reads no more of a file than the limit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from zoo.errors import InvalidInput

SafeLoader: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
SafeDumper: type = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
MAX_BYTES = 4 * 1024 * 1024  # the recipe limit; a lockfile with every platform's records is tens of KB
MAX_DEPTH = 64  # what zoo writes nests about 6 levels deep, recipes about as deep
MAX_NODES = 1_000_000  # values after alias expansion, as for a recipe
MAX_DIGITS = 4300  # Python's own limit for str -> int
YAMLError = yaml.YAMLError  # what any unreadable YAML raises, for callers that need nothing else of PyYAML

_OPEN = (yaml.SequenceStartEvent, yaml.MappingStartEvent)
_CLOSE = (yaml.SequenceEndEvent, yaml.MappingEndEvent)
_NUMBER_TAGS = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")


class LimitExceeded(yaml.YAMLError):
    """A document past one of the reader's limits; `line` is 1-based (None: the whole text)."""

    def __init__(self, message: str, line: int | None = None):
        super().__init__(message if line is None else f"{message} (line {line})")
        self.reason, self.line = message, line


class TooDeep(LimitExceeded):
    """A document nested deeper than the reader allows."""


class TooLarge(LimitExceeded):
    """A document larger than `MAX_BYTES`, or one that expands to more than `MAX_NODES` values."""


def safe_load(text: str | bytes, *, max_depth: int = MAX_DEPTH, max_nodes: int = MAX_NODES,
              max_bytes: int = MAX_BYTES) -> Any:
    """`yaml.safe_load(text)` within the limits above, with libyaml's parser where available."""
    size = len(text) if isinstance(text, bytes) else len(text.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise TooLarge(f"the document is larger than {max_bytes // (1024 * 1024)} MiB")
    check_limits(text, max_depth=max_depth, max_nodes=max_nodes)
    try:
        return yaml.load(text, Loader=SafeLoader)  # noqa: S506 (a safe loader, C or Python)
    except (ValueError, OverflowError) as e:  # a value PyYAML's constructors refuse (a date past year 9999)
        raise yaml.YAMLError(f"unreadable value: {e}") from None


def check_limits(text: str | bytes, *, max_depth: int = MAX_DEPTH, max_nodes: int = MAX_NODES) -> None:
    """LimitExceeded unless the document stays within `max_depth` and `max_nodes` (aliases expanded)
    and its numbers within `MAX_DIGITS`; other YAML errors as the parser raises them."""
    anchors: dict[str, tuple[int, int]] = {}  # anchor -> (expanded size, height)
    stack: list[list[Any]] = []  # one frame per open collection: [expanded size, height, anchor]
    total = 0
    resolver = None
    for event in yaml.parse(text, Loader=SafeLoader):
        if isinstance(event, yaml.ScalarEvent):
            size, height = 1, 0
            if not event.style and len(event.value) > MAX_DIGITS and event.implicit[0]:
                resolver = resolver or yaml.SafeLoader("")
                if resolver.resolve(yaml.ScalarNode, event.value, (True, False)) in _NUMBER_TAGS:
                    raise LimitExceeded(f"a number of {len(event.value):,} characters is longer than "
                                        f"{MAX_DIGITS:,} digits", event.start_mark.line + 1)
        elif isinstance(event, yaml.AliasEvent):
            size, height = anchors.get(event.anchor, (1, 0))  # an unknown anchor: the composer refuses it
        elif isinstance(event, _OPEN):
            if len(stack) >= max_depth:
                raise TooDeep(f"the document nests deeper than {max_depth} levels", event.start_mark.line + 1)
            stack.append([1, 1, event.anchor])
            continue
        elif isinstance(event, _CLOSE):
            size, height, name = stack.pop()
            if name is not None:
                anchors[name] = (size, height)
        else:
            continue
        if isinstance(event, yaml.ScalarEvent) and event.anchor is not None:
            anchors[event.anchor] = (size, height)
        if len(stack) + height > max_depth:
            raise TooDeep(f"the document nests deeper than {max_depth} levels (through an alias)",
                          event.start_mark.line + 1)
        if stack:
            frame = stack[-1]
            frame[0] += size
            frame[1] = max(frame[1], height + 1)
            total = frame[0]
        else:
            total = size
        if total > max_nodes:
            raise TooLarge(f"the document expands to more than {max_nodes:,} values (aliases repeat the node "
                           "they name)", event.start_mark.line + 1)


def read_bounded(path: Path) -> bytes:
    """The first `MAX_BYTES` + 1 bytes of `path`: enough for `safe_load` to refuse a larger file
    without reading all of it."""
    with open(path, "rb") as f:
        return f.read(MAX_BYTES + 1)


def load_text(text: str | bytes, where: str, what: str, *, hint: str, max_nodes: int = MAX_NODES) -> Any:
    """The YAML document `text` (from `read_bounded`, or read elsewhere); InvalidInput naming `where`
    (the file), the line and the limit or the syntax error for a document that is too large, too
    deep, too big once expanded, or not YAML. `what` names the document in messages ("the zoo config")."""
    try:
        return safe_load(text, max_nodes=max_nodes)
    except LimitExceeded as e:
        at = f"{where}:{e.line}" if e.line else where
        raise InvalidInput(f"{at}: {what} is refused: {e.reason}",
                           hint=f"zoo reads at most {MAX_DEPTH} levels of nesting, {max_nodes:,} values and "
                                f"{MAX_BYTES // (1024 * 1024)} MiB in {what}; {hint}") from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        at = f"{where}:{mark.line + 1}" if mark else where
        raise InvalidInput(f"{at}: {what} is not valid YAML: {e.problem or e.context}", hint=hint) from None
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise InvalidInput(f"{where}: {what} is not valid YAML: {str(e).splitlines()[0][:200]}", hint=hint) from None


def line_of(text: str | bytes, keys: tuple) -> int | None:
    """The 1-based line of the value at `keys` (mapping keys and list indexes) in a document that
    `safe_load` read, or None where the path is not there (for messages that point at a field)."""
    node = yaml.compose(text, Loader=SafeLoader)  # bounded: the caller's safe_load checked the limits
    line = None
    for key in keys:
        if isinstance(node, yaml.MappingNode):
            match = [v for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == str(key)]
            if not match:
                return line
            node = match[-1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and 0 <= key < len(node.value):
            node = node.value[key]
        else:
            return line
        line = node.start_mark.line + 1
    return line


def safe_dump(data: Any, **options: Any) -> str:
    """`yaml.safe_dump(data, **options)` to a string, with libyaml's emitter where available."""
    return yaml.dump(data, Dumper=SafeDumper, **options)
