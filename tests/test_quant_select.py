"""quantize's `mode: auto` selection (zoo_stages.lib.quantization.quant_select): which candidate rows pass, at
the exact limits of the accuracy drop, the minimum speedup and "never slower than fp32", which
passing row is kept (fastest, ties to the earlier), and the candidates table.

Pure functions on small dicts: no torch, onnx or onnxruntime. These are the tests
`mutation/stages.toml` runs against every mutant of the module."""

from __future__ import annotations

import math

import pytest

from zoo_stages.lib.quantization.quant_select import candidates_table, select_candidate


def above(x: float) -> float:
    """The next float after `x`."""
    return math.nextafter(x, math.inf)


def below(x: float) -> float:
    return math.nextafter(x, -math.inf)


def row(name="c", p50=1.0, speedup=2.0, drop=0.0, error=None, **extra):
    return {"name": name, "latency_p50_ms": p50, "speedup": speedup, "accuracy_drop": drop, "error": error, **extra}


def judge(r: dict, *, max_accuracy_drop=0.01, min_speedup=1.0) -> dict:
    """Run the selection on one row; return the row (updated in place) with `chosen` added."""
    chosen = select_candidate([r], max_accuracy_drop=max_accuracy_drop, min_speedup=min_speedup)
    assert chosen == (r["name"] if r["passed"] else None)
    return r


# -- the accuracy-drop limit -------------------------------------------------------------------


@pytest.mark.parametrize("limit", [0.01, 0.0, 0.05, 1e-4])
def test_a_drop_equal_to_the_limit_passes_and_one_step_above_fails(limit):
    assert judge(row(drop=limit), max_accuracy_drop=limit)["passed"] is True
    assert judge(row(drop=below(limit)), max_accuracy_drop=limit)["passed"] is True
    over = judge(row(drop=above(limit)), max_accuracy_drop=limit)
    assert over["passed"] is False and over["reasons"] == [f"accuracy drop {above(limit):.4f} > {limit:g}"]


def test_the_issue_example_a_0015_drop_fails_a_001_gate():
    r = judge(row(drop=0.015), max_accuracy_drop=0.01)
    assert r["passed"] is False and r["reasons"] == ["accuracy drop 0.0150 > 0.01"]
    assert judge(row(drop=0.02), max_accuracy_drop=0.01)["passed"] is False  # twice the limit
    assert judge(row(drop=0.0101), max_accuracy_drop=0.01)["passed"] is False


def test_a_negative_drop_an_int8_model_better_than_fp32_passes():
    assert judge(row(drop=-0.02), max_accuracy_drop=0.0)["passed"] is True


def test_an_unmeasured_accuracy_fails():
    r = judge(row(drop=None), max_accuracy_drop=1.0)
    assert r["passed"] is False and r["reasons"] == ["accuracy not measured"]


# -- the minimum speedup and "never slower than fp32" ------------------------------------------


@pytest.mark.parametrize("minimum", [above(1.0), 1.5, 2.0, 3.7])
def test_a_speedup_equal_to_the_minimum_passes_and_one_step_below_fails(minimum):
    assert judge(row(speedup=minimum), min_speedup=minimum)["passed"] is True
    assert judge(row(speedup=above(minimum)), min_speedup=minimum)["passed"] is True
    under = judge(row(speedup=below(minimum)), min_speedup=minimum)
    assert under["passed"] is False
    assert under["reasons"] == [f"speedup {below(minimum):.2f}x < {minimum:g}x"]
    assert under["slower_than_fp32"] is False  # below the minimum, but still faster than fp32


def test_exactly_as_fast_as_fp32_is_not_slower():
    r = judge(row(speedup=1.0), min_speedup=0.0)
    assert r["passed"] is True and r["slower_than_fp32"] is False and r["reasons"] == []


@pytest.mark.parametrize("minimum", [0.0, 0.5, below(1.0), -1.0])
def test_slower_than_fp32_is_never_picked_whatever_the_minimum(minimum):
    for speedup in (below(1.0), 0.99, 0.42, 0.0):
        r = judge(row(speedup=speedup), min_speedup=minimum, max_accuracy_drop=1.0)
        assert r["passed"] is False and r["slower_than_fp32"] is True
        assert r["reasons"][0] == f"slower than fp32 parent (speedup {speedup:.2f}x)"
        # with a minimum above 1 it is both slower than fp32 and below the minimum
    r = judge(row(speedup=0.42), min_speedup=1.5)
    assert r["reasons"] == ["slower than fp32 parent (speedup 0.42x)", "speedup 0.42x < 1.5x"]


def test_a_fast_candidate_is_not_flagged_slower():
    for speedup in (above(1.0), 1.01, 4.2):
        assert judge(row(speedup=speedup))["slower_than_fp32"] is False


def test_an_unmeasured_latency_fails_and_is_not_flagged_slower():
    r = judge(row(speedup=None), min_speedup=0.0)
    assert r["passed"] is False and r["reasons"] == ["latency not measured"] and r["slower_than_fp32"] is False


# -- failures together -------------------------------------------------------------------------


def test_every_reason_is_listed_in_order():
    r = judge(row(drop=0.5, speedup=0.5), max_accuracy_drop=0.01, min_speedup=2.0)
    assert r["reasons"] == ["accuracy drop 0.5000 > 0.01", "slower than fp32 parent (speedup 0.50x)",
                            "speedup 0.50x < 2x"]
    r = judge(row(drop=None, speedup=None))
    assert r["reasons"] == ["accuracy not measured", "latency not measured"]


def test_a_candidate_that_failed_to_build_fails_with_only_that_reason():
    r = judge(row(p50=None, speedup=None, drop=None, error="ValueError: boom"))
    assert r["passed"] is False and r["reasons"] == ["failed to build: ValueError: boom"]
    # even when it carries figures that would pass
    r = judge(row(p50=0.1, speedup=9.0, drop=0.0, error="RuntimeError: late"))
    assert r["passed"] is False and r["reasons"] == ["failed to build: RuntimeError: late"]


def test_a_row_with_no_error_key_or_an_empty_error_built():
    r = row()
    del r["error"]
    assert judge(r)["passed"] is True
    assert judge(row(error=""))["passed"] is True


def test_the_slower_flag_is_set_even_on_a_row_that_failed_to_build():
    r = judge(row(speedup=0.5, error="boom"))
    assert r["slower_than_fp32"] is True and r["reasons"] == ["failed to build: boom"]


def test_every_row_gets_passed_reasons_and_the_slower_flag():
    rows = [row("a", speedup=2.0), row("b", drop=0.5), row("c", speedup=0.5, drop=None, error="x")]
    select_candidate(rows, max_accuracy_drop=0.01, min_speedup=1.0)
    assert [(r["passed"], r["slower_than_fp32"]) for r in rows] == [(True, False), (False, False), (False, True)]
    assert rows[0]["reasons"] == [] and rows[1]["reasons"] and rows[2]["reasons"]


# -- which passing row is kept -----------------------------------------------------------------


def test_the_fastest_passing_candidate_is_kept_not_the_fastest_overall():
    rows = [row("qdq", p50=4.0, speedup=3.7, drop=0.004), row("per-channel", p50=3.5, speedup=4.2, drop=0.002),
            row("qoperator", p50=3.0, speedup=4.9, drop=0.05), row("dynamic", p50=35.0, speedup=0.42, drop=0.0),
            row("broken", p50=None, speedup=None, drop=None, error="ValueError: boom")]
    assert select_candidate(rows, max_accuracy_drop=0.01, min_speedup=1.0) == "per-channel"
    assert [r["passed"] for r in rows] == [True, True, False, False, False]


@pytest.mark.parametrize("order", [[0, 1, 2], [2, 1, 0], [1, 2, 0]])
def test_the_fastest_wins_wherever_it_is_in_the_order(order):
    rows = [row("slow", p50=3.0), row("fast", p50=1.0), row("mid", p50=2.0)]
    assert select_candidate([rows[i] for i in order], max_accuracy_drop=0.01, min_speedup=1.0) == "fast"


def test_nothing_is_kept_when_nothing_passes():
    rows = [row("a", drop=0.02), row("b", speedup=0.9), row("c", error="boom")]
    assert select_candidate(rows, max_accuracy_drop=0.01, min_speedup=1.0) is None
    assert select_candidate([], max_accuracy_drop=0.01, min_speedup=1.0) is None


def test_without_a_tie_tolerance_the_strictly_fastest_wins():
    rows = [row("first", p50=above(2.0)), row("second", p50=2.0)]
    assert select_candidate(rows, max_accuracy_drop=0.01, min_speedup=1.0) == "second"  # the default is 0
    assert select_candidate(rows, max_accuracy_drop=0.01, min_speedup=1.0, tie_tolerance=0.0) == "second"


def test_equal_latencies_go_to_the_earlier_row():
    rows = [row("first", p50=2.0), row("second", p50=2.0)]
    assert select_candidate(rows, max_accuracy_drop=0.01, min_speedup=1.0) == "first"


@pytest.mark.parametrize("tolerance,edge", [(0.5, 3.0), (0.25, 2.5), (1.0, 4.0)])
def test_a_row_exactly_at_the_tie_tolerance_is_tied_and_one_step_beyond_is_not(tolerance, edge):
    fastest = row("fastest", p50=2.0)
    assert select_candidate([row("first", p50=edge), fastest], max_accuracy_drop=0.01, min_speedup=1.0,
                            tie_tolerance=tolerance) == "first"
    assert select_candidate([row("first", p50=above(edge)), fastest], max_accuracy_drop=0.01, min_speedup=1.0,
                            tie_tolerance=tolerance) == "fastest"


def test_a_tie_is_only_among_passing_rows():
    rows = [row("fails", p50=2.0, drop=0.5), row("passes", p50=2.5), row("fastest", p50=0.5, speedup=0.5)]
    assert select_candidate(rows, max_accuracy_drop=0.01, min_speedup=1.0, tie_tolerance=0.5) == "passes"


# -- the table ---------------------------------------------------------------------------------


def test_candidates_table_shows_every_figure_and_verdict():
    rows = [row("static-qdq", p50=4.0, speedup=3.7, drop=0.004, accuracy=0.956, size_bytes=2048),
            row("qoperator", p50=3.0, speedup=4.9, drop=0.05, accuracy=0.91, size_bytes=1536),
            row("dynamic", p50=35.0, speedup=0.42, drop=-0.001, accuracy=0.961, size_bytes=10485760),
            row("broken", p50=None, speedup=None, drop=None, error="ValueError: boom")]
    chosen = select_candidate(rows, max_accuracy_drop=0.01, min_speedup=1.0)
    assert candidates_table(rows, chosen) == "\n".join([
        "candidate   accuracy  drop     p50_ms  speedup  size_kb  result  notes",
        "----------  --------  -------  ------  -------  -------  ------  " + "-" * 59,
        "static-qdq  0.9560    +0.0040  4.000   3.70     2.0      CHOSEN",
        "qoperator   0.9100    +0.0500  3.000   4.90     1.5      FAIL    accuracy drop 0.0500 > 0.01",
        "dynamic     0.9610    -0.0010  35.000  0.42     10240.0  FAIL    slower than fp32 parent (speedup 0.42x); speedup 0.42x < 1x",
        "broken      n/a       n/a      n/a     n/a      n/a      FAIL    failed to build: ValueError: boom",
    ])


def test_a_passing_row_not_chosen_says_pass():
    rows = [row("a", p50=1.0), row("b", p50=2.0)]
    select_candidate(rows, max_accuracy_drop=0.01, min_speedup=1.0)
    verdicts = [line.split()[-1] for line in candidates_table(rows, "a").splitlines()[2:]]
    assert verdicts == ["CHOSEN", "pass"]
    verdicts = [line.split()[-1] for line in candidates_table(rows).splitlines()[2:]]
    assert verdicts == ["pass", "pass"]


def test_an_unjudged_row_flagged_slower_says_so_once():
    # rows straight from a measurement, before select_candidate added reasons
    rows = [{"name": "dyn", "speedup": 0.5, "slower_than_fp32": True},
            {"name": "dyn2", "speedup": 0.5, "slower_than_fp32": True, "reasons": ["odd"]},
            {"name": "dyn3", "speedup": 0.5, "slower_than_fp32": True, "reasons": ["slower than fp32 parent (0.5x)"]},
            {"name": "fast", "speedup": 2.0, "slower_than_fp32": False, "reasons": []}]
    lines = candidates_table(rows).splitlines()[2:]
    assert lines[0].endswith("FAIL    slower than fp32 parent")
    assert lines[1].endswith("FAIL    odd; slower than fp32 parent")
    assert lines[2].endswith("FAIL    slower than fp32 parent (0.5x)")
    assert lines[3].endswith("FAIL")


def test_candidates_table_with_no_rows_is_the_header():
    assert candidates_table([]) == ("candidate  accuracy  drop  p50_ms  speedup  size_kb  result  notes\n"
                                    "---------  --------  ----  ------  -------  -------  ------  -----")


@pytest.mark.parametrize("fn", [select_candidate, candidates_table], ids=lambda f: f.__name__)
def test_the_type_hints_resolve(fn):
    """The hints are strings here (``from __future__ import annotations``); tools that read them
    (pydantic's validate_call, typer, IDEs, docs) evaluate them, so each must be a valid type."""
    import typing

    hints = typing.get_type_hints(fn)
    assert hints and all(h is not None for h in hints.values())


def test_the_chosen_row_is_found_by_its_name_not_by_identity():
    # the name may come from elsewhere (a report, a lockfile): an equal string, not the same object
    rows = [row("static-qdq", p50=1.0), row("per-channel", p50=2.0)]
    select_candidate(rows, max_accuracy_drop=0.01, min_speedup=1.0)
    chosen = "".join(["per-", "channel"])
    assert chosen is not rows[1]["name"]
    verdicts = [line.split()[-1] for line in candidates_table(rows, chosen).splitlines()[2:]]
    assert verdicts == ["pass", "CHOSEN"]


def test_the_limits_must_be_named():
    # max_accuracy_drop and min_speedup are both floats: passed by position they could be swapped
    rows = [row()]
    with pytest.raises(TypeError):
        select_candidate(rows, 0.01, 1.0)  # type: ignore[misc]
    with pytest.raises(TypeError):
        select_candidate(rows, 0.01, 1.0, 0.0)  # type: ignore[misc]
    assert select_candidate(rows=rows, max_accuracy_drop=0.01, min_speedup=1.0) == "c"


# -- where accuracy does not apply: the outputs' cosine to fp32 -----------------------------------


@pytest.mark.parametrize("limit", [0.99, 0.5, 1.0])
def test_a_cosine_equal_to_the_minimum_passes_and_one_step_below_fails(limit):
    def judged(cosine):
        r = row(drop=None, cosine=cosine)
        select_candidate([r], max_accuracy_drop=0.01, min_speedup=1.0, min_cosine=limit)
        return r

    assert judged(limit)["passed"] is True
    under = judged(below(limit))
    assert under["passed"] is False and under["reasons"] == [f"cosine to fp32 {below(limit):.4f} < {limit:g}"]


def test_the_cosine_is_only_read_where_accuracy_does_not_apply():
    # a measured accuracy drop decides, whatever the cosine
    r = row(drop=0.0, cosine=0.1)
    assert select_candidate([r], max_accuracy_drop=0.01, min_speedup=1.0, min_cosine=0.99) == "c"
    # without a minimum, or without a cosine, an unmeasured accuracy still fails
    for r in (row(drop=None, cosine=1.0), row(drop=None)):
        assert select_candidate([r], max_accuracy_drop=0.01, min_speedup=1.0,
                                min_cosine=None if "cosine" in r else 0.9) is None
        assert r["reasons"] == ["accuracy not measured"]
