"""Model references (``name``, ``name@1.2.0``, ``name@prod``), tag names and version ordering."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from zoo.errors import InvalidInput
from zoo.registry.manifest import BUILD_RE, NAME_RE, VERSION_RE

if TYPE_CHECKING:
    import semver

TAG_RE = r"^[a-z0-9][a-z0-9._-]*$"
LATEST = "latest"

_NAME = re.compile(NAME_RE)
_VERSION = re.compile(VERSION_RE)
_TAG = re.compile(TAG_RE)
_BUILD = re.compile(BUILD_RE)


@dataclass(frozen=True)
class Ref:
    """A parsed reference: exactly one of `version` / `tag` is set (a bare name means tag `latest`)."""

    name: str
    version: str | None = None
    tag: str | None = None

    @property
    def pinned(self) -> bool:
        """True when the reference names an immutable version."""
        return self.version is not None

    def __str__(self) -> str:
        return f"{self.name}@{self.version or self.tag}"


def is_version(text: str) -> bool:
    return bool(_VERSION.fullmatch(text))


def check_name(name: str, what: str = "model name") -> str:
    """A model name safe to use as a folder name; InvalidInput otherwise."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or len(name) > 200:
        raise InvalidInput(f"invalid {what} {name!r}",
                           hint="use lower-case letters, digits, '.', '_' and '-', starting with a letter or digit")
    return name


def check_version(version: str) -> str:
    if not isinstance(version, str) or not _VERSION.fullmatch(version):
        raise InvalidInput(f"invalid version {version!r}", hint="use semantic versioning, e.g. 1.2.0")
    return version


def check_tag(tag: str) -> str:
    """A movable tag name: like a model name, and never shaped like a version (that would be ambiguous)."""
    if not isinstance(tag, str) or not _TAG.fullmatch(tag) or len(tag) > 100:
        raise InvalidInput(f"invalid tag {tag!r}", hint="use lower-case letters, digits, '.', '_' and '-'")
    if _VERSION.fullmatch(tag):
        raise InvalidInput(f"tag {tag!r} looks like a version", hint="tags are names such as 'prod' or 'stable'")
    if re.fullmatch(r"v?\d+(\.\d+)*([-+].*)?", tag, re.DOTALL):
        raise InvalidInput(f"{tag!r} is neither a full version nor a tag name",
                           hint="versions are MAJOR.MINOR.PATCH (e.g. 1.2.0); tags are names such as 'prod'")
    return tag


def check_build(build: str) -> str:
    if not isinstance(build, str) or not _BUILD.fullmatch(build):
        raise InvalidInput(f"invalid build name {build!r}", hint="e.g. cpu-fp32, cpu-int8, cuda-fp16")
    return build


def parse_ref(text: str) -> Ref:
    """Parse ``name``, ``name@version`` or ``name@tag``; InvalidInput on anything else."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidInput("empty model reference", hint="use NAME, NAME@VERSION or NAME@TAG")
    if looks_like_source(text.strip()):
        raise InvalidInput(f"{text.strip()!r} is a source to import, not the name of a model in the zoo",
                           hint=f"make a zoo version from it first: zoo import {text.strip()}")
    name, sep, rest = text.strip().partition("@")
    check_name(name)
    if not sep:
        return Ref(name, tag=LATEST)
    if not rest:
        raise InvalidInput(f"reference {text!r} has nothing after '@'", hint="use NAME@1.2.0 or NAME@prod")
    if _VERSION.fullmatch(rest):
        return Ref(name, version=rest)
    return Ref(name, tag=check_tag(rest))


def looks_like_source(text: str) -> bool:
    """Whether `text` is something `zoo import` takes (a URL, hf://, a catalog name such as
    torchvision:resnet18, an .onnx file) rather than a model reference, so a command given one can say so."""
    from zoo import catalog

    # each of these is an invalid name, so no model of the zoo is mistaken for a source
    return "://" in text or catalog.is_catalog_name(text) or ("/" in text and text.lower().endswith(".onnx"))


def import_hint(name: str) -> str:
    """The hint for a model name the zoo does not have: how `zoo import` could make it."""
    from zoo import catalog

    found = catalog.names_for(name)
    pretrained = (f"`zoo import {found[0]}` (pretrained weights the catalog pins)" if found else
                  "`zoo import CATALOG:MODEL` (e.g. torchvision:resnet18)")
    return (f"`zoo list` shows the local zoo (`zoo pull --remote R` looks on a remote); to make {name!r} from a "
            f"pretrained model: {pretrained} or `zoo import hf://ORG/REPO` (a Hugging Face repo with an .onnx file)")


def parse_pinned(text: str) -> Ref:
    """A reference that must name an exact version (push, rm, tag)."""
    ref = parse_ref(text)
    if not ref.pinned:
        raise InvalidInput(f"{text!r} does not name a version", hint=f"use {ref.name}@1.2.0")
    return ref


# VERSION_RE split into its parts: MAJOR.MINOR.PATCH, then either -PRERELEASE or +BUILD
_VERSION_PARTS = re.compile(r"^(\d+)\.(\d+)\.(\d+)(?:-([0-9A-Za-z.-]+)|\+([0-9A-Za-z.-]+))?$")


def precedence(version: str) -> "semver.Version | None":
    """`version` as a `semver.Version`, whose comparisons are semantic-version precedence; None if
    it is not a version. Built from the parts rather than parsed strictly, so the few strings the
    manifest schema accepts beyond strict semver (``1.0.0-01``, ``01.2.3``) still order (numerically)."""
    import semver

    m = _VERSION_PARTS.fullmatch(version)
    if not m:
        return None
    major, minor, patch, pre, build = m.groups()
    return semver.Version(int(major), int(minor), int(patch), prerelease=pre, build=build)


def version_key(version: str) -> str:
    """A string whose plain (byte) order is `precedence` order, for sorting here and in the SQLite index.

    semver.Version decides the order; this only writes it as text SQL can sort (tests/
    test_registry_select.py checks the two agree). Numbers carry their length (``"03" + "120"``),
    identifiers are joined by "!", which sorts before every character an identifier may hold, and
    a release ("~") sorts after its pre-releases ("-"). Build metadata, which semver ignores, comes
    last, so equal versions still sort the same way every time. Not a version: sorts first, as itself.
    """
    v = precedence(version)
    if v is None:
        return f" {version}"

    def number(n: int) -> str:
        return f"{len(str(n)):02d}{n}"

    head = ".".join(number(n) for n in (v.major, v.minor, v.patch))
    if v.prerelease is None:
        tail = "~"
    else:
        tail = "-" + "!".join("0" + number(int(p)) if p.isdigit() else "1" + p for p in v.prerelease.split("."))
    return head + tail + (f" {v.build}" if v.build else "")


def newest(versions: list[str]) -> str | None:
    """The highest version by semantic-version precedence, or None."""
    return max(versions, key=version_key) if versions else None


def latest_of(versions: list[str]) -> str | None:
    """Where `latest` points among `versions`: the highest release, or the highest pre-release when
    there is no release (what `moves_latest` leads to whatever the order of publication)."""
    releases = [v for v in versions if not is_prerelease(v)]
    return newest(releases or list(versions))


def is_prerelease(version: str) -> bool:
    v = precedence(version)
    return v is not None and v.prerelease is not None


def moves_latest(current: str | None, new: str) -> bool:
    """Whether publishing `new` moves `latest` from `current`: to the highest version, where a
    pre-release never displaces a release (1.1.0-rc.1 does not replace 1.0.0 as latest)."""
    if current is None:
        return True
    if is_prerelease(new) and not is_prerelease(current):
        return False
    if is_prerelease(current) and not is_prerelease(new):
        return True
    return version_key(new) >= version_key(current)
