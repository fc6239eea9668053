"""Version ordering (zoo/registry/refs.py): semver precedence as the `semver` library decides it,
pre-releases included, and `version_key`, its text form the SQLite index sorts by, in agreement with
it; `latest` never moving to a pre-release; an index written with an older sort key rebuilt."""

from __future__ import annotations

import re
import sqlite3

import semver
from hypothesis import given, settings, strategies as st

from zoo.registry.manifest import VERSION_RE
from zoo.registry.refs import is_prerelease, moves_latest, newest, precedence, version_key

# semver.org §11's example, plus what a hand-written order got wrong or could: an identifier that
# extends another with "-" (alpha < alpha-x, and alpha.1 < alpha-x), numbers past 9 digits, and a
# numeric pre-release (1.0.0-1 is a pre-release of 1.0.0; PEP 440 would read it as a post-release)
ORDERED = ["0.9.0", "1.0.0-1", "1.0.0-2", "1.0.0-10", "1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-alpha.beta",
           "1.0.0-alpha-x", "1.0.0-beta", "1.0.0-beta.2", "1.0.0-beta.11", "1.0.0-rc.1", "1.0.0", "1.0.1",
           "1.2.0", "1.10.0", "2.0.0-rc.1", "2.0.0", "10.0.0", "9999999999.0.0"]


def test_the_order_is_semver_precedence_including_pre_releases():
    assert sorted(reversed(ORDERED), key=version_key) == ORDERED
    assert sorted(reversed(ORDERED), key=precedence) == ORDERED
    # the library agrees on every strict semver string of the list
    assert sorted(reversed(ORDERED), key=semver.Version.parse) == ORDERED
    assert newest(["1.0.0-rc.1", "0.9.0", "1.0.0-beta"]) == "1.0.0-rc.1" and newest([]) is None


def test_build_metadata_does_not_change_precedence_but_sorts_the_same_way_every_time():
    assert precedence("1.0.0+b2") == precedence("1.0.0+b1") == precedence("1.0.0")
    assert sorted(["1.0.0+b2", "1.0.0", "1.0.0+b1", "0.1.0"], key=version_key) == ["0.1.0", "1.0.0", "1.0.0+b1",
                                                                                   "1.0.0+b2"]
    assert precedence("1.0.0+build-1") < precedence("1.0.1-rc.1")


def test_pre_releases_and_latest():
    assert [is_prerelease(v) for v in ("1.0.0-rc.1", "1.0.0", "1.0.0+build-1", "1.0.0-1")] == [True, False, False, True]
    assert moves_latest(None, "1.0.0-rc.1")
    assert not moves_latest("1.0.0", "1.1.0-rc.1")  # a pre-release never displaces a release
    assert moves_latest("1.1.0-rc.1", "1.0.0")  # a release displaces a pre-release
    assert moves_latest("1.0.0-rc.1", "1.0.0-rc.2") and not moves_latest("1.0.0-rc.2", "1.0.0-rc.1")
    assert moves_latest("1.0.0", "1.0.1") and not moves_latest("1.0.1", "1.0.0")


def test_what_is_not_a_version_has_no_precedence_and_sorts_first():
    assert precedence("prod") is None and not is_prerelease("prod")
    assert sorted(["1.0.0", "prod"], key=version_key) == ["prod", "1.0.0"]


_ident = st.one_of(st.integers(0, 10**12).map(str), st.from_regex(r"[0-9A-Za-z-]{1,6}", fullmatch=True))
_strict_ident = st.one_of(st.integers(0, 10**12).map(str), st.from_regex(r"[A-Za-z-][0-9A-Za-z-]{0,5}", fullmatch=True))
_core = st.tuples(*[st.integers(0, 10**11)] * 3).map(lambda t: ".".join(map(str, t)))


def _versions(ident):
    pre = st.lists(ident, min_size=1, max_size=4).map(lambda ids: "-" + ".".join(ids))
    build = st.lists(ident, min_size=1, max_size=3).map(lambda ids: "+" + ".".join(ids))
    return st.tuples(_core, st.one_of(st.just(""), pre, build)).map("".join)


@settings(max_examples=400, derandomize=True, deadline=None)
@given(st.lists(_versions(_strict_ident), min_size=2, max_size=6))
def test_version_key_sorts_as_the_semver_library_does(versions):
    """For strict semver strings, `version_key`'s text order is semver.Version's order."""
    for a in versions:
        assert re.match(VERSION_RE, a), a  # what the manifest accepts
        for b in versions:
            by_library = semver.Version.parse(a).compare(semver.Version.parse(b))
            by_key = (version_key(a) > version_key(b)) - (version_key(a) < version_key(b))
            if by_library:
                assert by_key == by_library, (a, b, version_key(a), version_key(b))
            else:  # equal precedence: only build metadata differs, which only breaks the tie
                assert (by_key == 0) == (a == b)


@settings(max_examples=200, derandomize=True, deadline=None)
@given(st.lists(_versions(_ident), min_size=2, max_size=6))
def test_version_key_agrees_with_precedence_for_everything_the_manifest_accepts(versions):
    """Also for non-strict strings the schema lets through (``1.0.0-01``): numbers compare as numbers."""
    for a in versions:
        for b in versions:
            pa, pb = precedence(a), precedence(b)
            by_precedence = (pa > pb) - (pa < pb)
            if by_precedence:
                assert ((version_key(a) > version_key(b)) - (version_key(a) < version_key(b))) == by_precedence, (a, b)


def test_an_index_of_an_older_schema_is_rebuilt_when_opened(tmp_path):
    from zoo.registry.index import INDEX_SCHEMA_VERSION
    from zoo.registry.store import LocalZoo
    from registry_servers import make_staging

    zoo = LocalZoo(tmp_path / "home")
    for v in ("1.0.0-alpha.1", "1.0.0-alpha-x", "1.0.0"):
        zoo.publish(make_staging(tmp_path / v, version=v))
    zoo.index.close()
    # an older zoo's index: its own schema_version and sort keys of another form
    with sqlite3.connect(zoo.index.path) as db:
        db.execute("UPDATE meta SET value='1' WHERE key='schema_version'")
        db.execute("UPDATE versions SET sort_key = version")
    assert INDEX_SCHEMA_VERSION == 2
    again = LocalZoo(tmp_path / "home")
    assert [v.version for v in again.list("tiny")] == ["1.0.0", "1.0.0-alpha-x", "1.0.0-alpha.1"]
    with sqlite3.connect(again.index.path) as db:
        assert db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() == ("2",)
