"""The rules behind issue #32's hostile-input checks, in-process and fast: a folder remote's paths
stay inside it (`zoo.pathsafety.inside_folder`), a manifest's numbers are bounded
(`zoo.registry.manifest.check_bounded`). The CLI tests that feed hostile input through `zoo` are in
tests/test_registry_hostile.py and tests/test_manifest_numbers.py; these pin each edge of the rule
(also for the `registry-paths` mutation area)."""

from __future__ import annotations

import os

import pytest

from zoo.errors import UnsafePath
from zoo.pathsafety import inside_folder
from zoo.registry.manifest import MAX_FIGURE, MAX_INT, MAX_NESTING, check_bounded


@pytest.fixture
def remote(tmp_path):
    root = tmp_path / "remote"
    (root / "blobs" / "sha256" / "ab").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    return root


def test_a_path_inside_the_folder_is_returned_absolute(remote):
    assert inside_folder(remote, remote / "blobs/sha256/ab/x", what="remote") == remote / "blobs/sha256/ab/x"
    assert inside_folder(remote, remote, what="remote") == remote  # the folder itself
    # not there yet (a write's target): judged by the folders that exist
    assert inside_folder(remote, remote / "new/a/b", what="remote") == remote / "new/a/b"


def test_a_linked_folder_that_leads_out_is_refused_naming_the_path_and_where_it_leads(remote):
    os.symlink(remote.parent / "outside", remote / "blobs/sha256/cd")
    with pytest.raises(UnsafePath) as e:
        inside_folder(remote, remote / "blobs/sha256/cd/blob", what="the folder of remote")
    assert str(remote / "blobs/sha256/cd/blob") in e.value.message
    assert str(remote.parent / "outside" / "blob") in e.value.message
    assert "remove the link" in e.value.hint


def test_a_linked_file_that_leads_out_is_refused(remote):
    os.symlink(remote.parent / "outside" / "secret", remote / "blobs/sha256/ab/x")
    with pytest.raises(UnsafePath):
        inside_folder(remote, remote / "blobs/sha256/ab/x", what="remote")


def test_a_sibling_whose_name_starts_with_the_folders_is_outside(remote):
    """`/r/remote-evil` starts with `/r/remote` as text, but is not inside it."""
    (remote.parent / "remote-evil").mkdir()
    os.symlink(remote.parent / "remote-evil", remote / "link")
    with pytest.raises(UnsafePath):
        inside_folder(remote, remote / "link" / "x", what="remote")


def test_links_inside_the_folder_and_a_linked_folder_itself_are_fine(remote, tmp_path):
    os.symlink(remote / "blobs", remote / "alias")
    assert inside_folder(remote, remote / "alias/sha256/ab", what="remote") == remote / "alias/sha256/ab"
    # the user named the folder: it may itself be a link
    os.symlink(remote, tmp_path / "named")
    assert inside_folder(tmp_path / "named", tmp_path / "named/blobs", what="remote") == tmp_path / "named/blobs"


def test_dot_dot_out_of_the_folder_is_refused(remote):
    with pytest.raises(UnsafePath):
        inside_folder(remote, f"{remote}/blobs/../../outside/x", what="remote")


@pytest.mark.parametrize("value", [0, -1, MAX_INT, -MAX_INT, 1.5, -MAX_FIGURE, MAX_FIGURE, True, None, "1e999",
                                   {"a": [1, 2.0, {"b": "x"}]}])
def test_numbers_within_bounds_pass_unchanged(value):
    assert check_bounded(value) == value


@pytest.mark.parametrize("value, says", [
    (MAX_INT + 1, "an integer of 16 digits is out of bounds"),
    (-MAX_INT - 1, "an integer of 16 digits"),
    (10**400, "an integer of 401 digits"),
    pytest.param(10**5000, "an integer of over 3900 digits", id="5001-digits"),  # str() of it would raise
    (MAX_FIGURE * 1.01, "out of bounds (finite, at most 1e+15"),
    (-1e308, "the number -1e+308 is out of bounds"),
    (float("inf"), "the number inf is out of bounds"),
    (float("nan"), "the number nan is out of bounds"),
    ({"a": [1, {"b": 1e308}]}, "the number 1e+308"),
])
def test_numbers_out_of_bounds_are_refused_saying_which_bound(value, says):
    with pytest.raises(ValueError) as e:
        check_bounded(value)
    assert says in str(e.value)


def test_nesting_is_bounded_at_exactly_max_nesting_levels():
    def nested(levels):
        value = 1
        for i in range(levels):
            value = [value] if i % 2 else {"k": value}
        return value

    assert check_bounded(nested(MAX_NESTING)) == nested(MAX_NESTING)
    with pytest.raises(ValueError, match=f"nested more than {MAX_NESTING} levels deep"):
        check_bounded(nested(MAX_NESTING + 1))


def test_a_figure_of_exactly_1e15_passes_and_just_above_it_does_not():
    """The bound's own value, written out: a stand-in constant in the test would move with the code."""
    assert check_bounded(1e15) == 1e15 and check_bounded(-1e15) == -1e15
    with pytest.raises(ValueError):
        check_bounded(1.0000001e15)
    assert check_bounded(2**53) == 2**53
    with pytest.raises(ValueError):
        check_bounded(2**53 + 1)


def test_why_json_refused_a_strangers_bytes_is_one_short_line():
    import json
    import sys

    from zoo.registry.codec import json_problem

    try:
        json.loads("[" * (sys.getrecursionlimit() + 100))
    except RecursionError as e:
        assert json_problem(e) == "nested too deep"
    try:
        json.loads("1" * 5000)
    except ValueError as e:
        assert json_problem(e) == "an integer of more than 4300 digits"
    try:
        json.loads('{"a": ')
    except ValueError as e:
        assert json_problem(e).startswith("Expecting value: line 1")
    assert json_problem(ValueError("x" * 500 + "\nmore")) == "x" * 200


def test_the_nesting_bound_is_32_levels_and_a_string_at_the_deepest_level_passes():
    assert MAX_NESTING == 32  # what the README and docs/trust.md say
    value: object = "x"
    for _ in range(32):
        value = [value]
    assert check_bounded(value) == value  # a string leaf at depth 32, as a number leaf would be
    with pytest.raises(ValueError, match="nested more than 32 levels deep"):
        check_bounded([value])


@pytest.mark.parametrize("wrap", [lambda v: {"k": v}, lambda v: [v]], ids=["objects", "lists"])
def test_nesting_counts_every_level_of_objects_alone_or_lists_alone(wrap):
    value: object = 1
    for _ in range(32):
        value = wrap(value)
    assert check_bounded(value) == value
    with pytest.raises(ValueError, match="nested more than 32 levels deep"):
        check_bounded(wrap(value))


def test_the_bounds_edges_one_step_out():
    with pytest.raises(ValueError):
        check_bounded(1e15 + 1)  # representable: the first float past the bound
    # the largest integers whose digits are still counted (13,000 bits: about 3,914 digits, under
    # Python's 4,300-digit limit for str())
    with pytest.raises(ValueError, match="an integer of 3914 digits"):
        check_bounded(2**12999)
    with pytest.raises(ValueError, match="over 3900 digits"):
        check_bounded(2**13000)


@pytest.mark.parametrize("leaf", [None, True, "x", 1, 1.5], ids=["none", "bool", "str", "int", "float"])
def test_any_leaf_at_the_deepest_level_passes(leaf):
    value: object = leaf
    for _ in range(32):
        value = {"k": value}
    assert check_bounded(value) == value
