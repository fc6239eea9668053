"""YAML read and written through libyaml where PyYAML has it, the pure-Python classes elsewhere.

Every `zoo run` reads its recipe's lockfile and writes out what it would hold (to compare it with
the file): on a lockfile with two platforms' records the C parser and emitter take about 8 ms
each against 60 ms each for the pure-Python ones. Both write the same text from the same data (a
test checks it on every shipped lockfile), so which one a machine has never changes a lockfile.

libyaml's composer recurses in C: a document nested a few hundred thousand levels deep crashes
the process (a segmentation fault, no Python error). `safe_load` first walks the parser's events,
which libyaml produces without recursion, and refuses a document nested deeper than `max_depth`
before anything is composed.
"""

from __future__ import annotations

from typing import Any

import yaml

SafeLoader: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
SafeDumper: type = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
MAX_DEPTH = 64  # what zoo writes nests about 6 levels deep, recipes about as deep
YAMLError = yaml.YAMLError  # what any unreadable YAML raises, for callers that need nothing else of PyYAML

_OPEN = (yaml.SequenceStartEvent, yaml.MappingStartEvent)
_CLOSE = (yaml.SequenceEndEvent, yaml.MappingEndEvent)


class TooDeep(yaml.YAMLError):
    """A document nested deeper than the reader allows (a YAMLError, as any other unreadable YAML)."""


def safe_load(text: str | bytes, *, max_depth: int = MAX_DEPTH) -> Any:
    """`yaml.safe_load(text)`, with libyaml's parser where available; TooDeep for a document nested
    deeper than `max_depth` sequences and mappings."""
    depth = 0
    for event in yaml.parse(text, Loader=SafeLoader):
        if isinstance(event, _OPEN):
            depth += 1
            if depth > max_depth:
                raise TooDeep(f"the document nests deeper than {max_depth} levels (line {event.start_mark.line + 1})")
        elif isinstance(event, _CLOSE):
            depth -= 1
    return yaml.load(text, Loader=SafeLoader)  # noqa: S506 (a safe loader, C or Python)


def safe_dump(data: Any, **options: Any) -> str:
    """`yaml.safe_dump(data, **options)` to a string, with libyaml's emitter where available."""
    return yaml.dump(data, Dumper=SafeDumper, **options)
