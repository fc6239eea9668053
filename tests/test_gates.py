"""verify's quality gates (zoo_stages.lib.quality.gates): parsing, every operator at its threshold, missing
and non-finite values, evaluation against a build table, and the printed table and summary.

Pure functions on strings, numbers and small dicts: no torch, onnx or onnxruntime. These are the
tests `mutation/stages.toml` runs against every mutant of the module."""

from __future__ import annotations

import math

import pytest

from zoo_stages.lib.quality import gates as gatelib
from zoo_stages.lib.quality.gates import Gate, GateResult, GateSyntaxError, evaluate, failed_summary, format_table, parse_gate


def above(x: float) -> float:
    """The next float after `x`: the smallest value that is more than it."""
    return math.nextafter(x, math.inf)


def below(x: float) -> float:
    return math.nextafter(x, -math.inf)


# -- every operator at, just above and just below its threshold --------------------------------

# (op, passes at the threshold, passes just above, passes just below)
TRUTH = [
    (">=", True, True, False),
    ("<=", True, False, True),
    (">", False, True, False),
    ("<", False, False, True),
    ("==", True, False, False),
]


def test_the_supported_operators_are_exactly_these():
    assert sorted(gatelib.OPERATORS) == sorted(op for op, *_ in TRUTH)


@pytest.mark.parametrize("threshold", [0.01, 1.0, 0.0, -2.0, 1e-3, 250.0])
@pytest.mark.parametrize("op,at,over,under", TRUTH, ids=[t[0] for t in TRUTH])
def test_each_operator_at_its_threshold_and_one_step_either_side(op, at, over, under, threshold):
    gate = parse_gate(f"cpu-int8.accuracy_drop {op} {threshold!r}")
    assert gate.threshold == threshold
    assert gate.check(threshold) is at
    assert gate.check(above(threshold)) is over
    assert gate.check(below(threshold)) is under
    # and well away from it, so a constant-true or constant-false operator cannot pass
    assert gate.check(threshold + 1) is over
    assert gate.check(threshold - 1) is under


@pytest.mark.parametrize("op,at,over,under", TRUTH, ids=[t[0] for t in TRUTH])
def test_the_operator_table_itself_at_the_boundary(op, at, over, under):
    fn = gatelib.OPERATORS[op]
    assert (fn(0.5, 0.5), fn(0.75, 0.5), fn(0.25, 0.5)) == (at, over, under)


def test_the_issue_example_a_drop_equal_to_the_limit_passes_and_above_fails():
    gate = parse_gate("cpu-int8.accuracy_drop <= 0.01")
    assert gate.check(0.01) and gate.check(0.0) and gate.check(-0.02)  # a better int8 model passes too
    assert not gate.check(0.015) and not gate.check(above(0.01)) and not gate.check(0.02)


def test_ints_and_bools_are_checked_as_numbers():
    assert parse_gate("b.checker == 1").check(True)
    assert not parse_gate("b.checker == 1").check(False)
    assert parse_gate("b.size_ratio <= 2").check(2)
    assert parse_gate("b.m >= 0.5").check("0.75")  # anything float() reads as a finite number


@pytest.mark.parametrize("value", [None, float("nan"), math.inf, -math.inf, "high", "", object(), [1.0]],
                         ids=["none", "nan", "inf", "-inf", "word", "empty", "object", "list"])
@pytest.mark.parametrize("op", [op for op, *_ in TRUTH])
def test_a_missing_or_non_finite_value_fails_every_operator(op, value):
    # thresholds chosen so that inf / -inf would pass the comparison itself
    for threshold in ("0", "1e300", "-1e300"):
        assert parse_gate(f"b.m {op} {threshold}").check(value) is False


def test_condition_is_the_operator_and_the_threshold():
    assert parse_gate("b.m >= 0.95").condition == ">= 0.95"
    assert parse_gate("b.m < 1e-3").condition == "< 0.001"
    assert parse_gate("b.m == -2").condition == "== -2"
    assert parse_gate("b.m <= 1e7").condition == "<= 1e+07"


# -- parsing -----------------------------------------------------------------------------------


@pytest.mark.parametrize("text,build,metric,op,threshold", [
    ("cpu-fp32.accuracy >= 0.95", "cpu-fp32", "accuracy", ">=", 0.95),
    ("cpu-int8.accuracy_drop <= 0.01", "cpu-int8", "accuracy_drop", "<=", 0.01),
    ("cpu-int8.speedup > 1", "cpu-int8", "speedup", ">", 1.0),
    ("cpu-int8.latency_p50_ms < 12.5", "cpu-int8", "latency_p50_ms", "<", 12.5),
    ("b.checker == 1", "b", "checker", "==", 1.0),
    ("b.m>=1e-3", "b", "m", ">=", 0.001),
    ("b.m >= 1E+2", "b", "m", ">=", 100.0),
    ("b.m >= -2", "b", "m", ">=", -2.0),
    ("b.m >= +3", "b", "m", ">=", 3.0),
    ("b.m >= .5", "b", "m", ">=", 0.5),
    ("b.m >= 5.", "b", "m", ">=", 5.0),
    ("v1.2.speedup > -1", "v1.2", "speedup", ">", -1.0),  # the metric is the word after the last dot
    ("quantize-cpu_int8.top1_agreement >= 0.99", "quantize-cpu_int8", "top1_agreement", ">=", 0.99),
    ("b._private9 <= 0", "b", "_private9", "<=", 0.0),
])
def test_parse_gate_reads_every_part(text, build, metric, op, threshold):
    g = parse_gate(text)
    assert (g.build, g.metric, g.op, g.threshold) == (build, metric, op, threshold)
    assert g.text == text


def test_the_text_is_normalised_but_keeps_its_spelling():
    assert parse_gate("  cpu-int8.accuracy_drop   <=\t1e-2 ").text == "cpu-int8.accuracy_drop <= 1e-2"
    assert parse_gate("cpu-int8.accuracy_drop<=1e-2").text == "cpu-int8.accuracy_drop<=1e-2"


@pytest.mark.parametrize("text", [
    "accuracy >= 0.9",              # no build
    ".accuracy >= 0.9",             # empty build
    "-b.accuracy >= 0.9",           # a build starts with a letter or digit
    "b.9lives >= 1",                # a metric starts with a letter or underscore
    "b.acc-uracy >= 1",             # a metric is one word
    "b.m => 0.9", "b.m =< 0.9", "b.m = 0.9", "b.m != 0.9", "b.m <> 0.9", "b.m >> 1", "b.m ≥ 1",
    "b.m >= high", "b.m >= inf", "b.m >= nan", "b.m >= 0x10", "b.m >= 1e", "b.m >= 1_000", "b.m >= .",
    "b.m >= 0.9 and b.n >= 1",      # one gate per string
    "b.m >= 0.9 # comment",
    "b.m 0.9", "b.m >=", ">= 0.9", "", "   ",
    "b.m >= 0.9\nb.n >= 1",
])
def test_a_gate_that_does_not_parse_is_a_clear_error(text):
    with pytest.raises(GateSyntaxError) as err:
        parse_gate(text)
    message = str(err.value)
    assert repr(text) in message and "does not parse" in message
    assert "<build>.<metric> <op> <number>" in message and ">=, <=, >, <, ==" in message


@pytest.mark.parametrize("text", [None, 0.9, ["b.m >= 1"], {"b.m": ">= 1"}])
def test_a_gate_that_is_not_a_string_is_a_clear_error(text):
    with pytest.raises(GateSyntaxError, match="must be a string of the form <build>.<metric> <op> <number>"):
        parse_gate(text)


def test_gate_syntax_errors_are_value_errors_for_pydantic():
    assert issubclass(GateSyntaxError, ValueError)


METRICS = ("accuracy", "accuracy_drop", "speedup", "latency_p50_ms")


def test_known_metric_and_build_names_are_accepted():
    g = parse_gate("cpu-int8.speedup >= 1", metrics=iter(METRICS), builds=iter(["cpu-fp32", "cpu-int8"]))
    assert (g.build, g.metric) == ("cpu-int8", "speedup")
    # either check alone
    assert parse_gate("anything.speedup >= 1", metrics=METRICS).build == "anything"
    assert parse_gate("cpu-int8.anything >= 1", builds=["cpu-int8"]).metric == "anything"


def test_an_unknown_metric_names_the_closest_and_lists_every_valid_one():
    with pytest.raises(GateSyntaxError) as err:
        parse_gate("cpu-int8.acuracy >= 0.9", metrics=list(METRICS) + ["accuracy"])
    assert str(err.value) == ("gate 'cpu-int8.acuracy >= 0.9': unknown metric 'acuracy' — did you mean 'accuracy'?; "
                              "valid metrics: accuracy, accuracy_drop, latency_p50_ms, speedup")


def test_an_unknown_metric_with_nothing_close_has_no_hint():
    with pytest.raises(GateSyntaxError) as err:
        parse_gate("cpu-int8.zzz >= 0.9", metrics=METRICS)
    assert str(err.value) == ("gate 'cpu-int8.zzz >= 0.9': unknown metric 'zzz'; "
                              "valid metrics: accuracy, accuracy_drop, latency_p50_ms, speedup")


def test_an_unknown_build_names_the_closest_and_lists_every_build():
    with pytest.raises(GateSyntaxError) as err:
        parse_gate("gpu-int8.accuracy >= 0.9", metrics=METRICS, builds=["cpu-int8", "cpu-fp32", "cpu-int8"])
    assert str(err.value) == ("gate 'gpu-int8.accuracy >= 0.9': unknown build 'gpu-int8' — did you mean 'cpu-int8'?; "
                              "builds: cpu-fp32, cpu-int8")


def test_an_unknown_build_with_no_builds_says_none():
    with pytest.raises(GateSyntaxError) as err:
        parse_gate("cpu-int8.accuracy >= 0.9", builds=[])
    assert str(err.value) == "gate 'cpu-int8.accuracy >= 0.9': unknown build 'cpu-int8'; builds: none"


def test_an_unknown_metric_is_reported_before_an_unknown_build():
    with pytest.raises(GateSyntaxError, match="unknown metric 'acuracy'"):
        parse_gate("gpu.acuracy >= 0.9", metrics=METRICS, builds=["cpu"])


# -- evaluation --------------------------------------------------------------------------------


def test_evaluate_checks_each_gate_against_its_build_and_metric_in_order():
    gates = [parse_gate(t) for t in ("a.x >= 0.5", "a.y <= 2", "b.x >= 0", "c.x >= 0", "a.z == 1", "b.y < 1")]
    values = {"a": {"x": 0.5, "y": 2.5, "z": True}, "b": {"x": None, "y": 0}}
    results = evaluate(gates, values)
    assert [r.gate for r in results] == gates
    assert [r.value for r in results] == [0.5, 2.5, None, None, 1.0, 0.0]
    assert [r.passed for r in results] == [True, False, False, False, True, True]
    assert all(type(r.value) is float for r in results if r.value is not None)


def test_evaluate_treats_a_non_number_as_missing():
    gates = [parse_gate("a.x >= 0.5"), parse_gate("a.y >= 0.5"), parse_gate("a.z >= 0.5")]
    results = evaluate(gates, {"a": {"x": "0.9", "y": [1], "z": float("nan")}})
    assert [r.value for r in results[:2]] == [None, None]
    assert math.isnan(results[2].value)
    assert [r.passed for r in results] == [False, False, False]


def test_evaluate_with_no_gates_is_empty():
    assert evaluate([], {"a": {"x": 1}}) == []


def test_a_result_as_json_has_every_field():
    r = evaluate([parse_gate("cpu-int8.accuracy_drop <= 0.01")], {"cpu-int8": {"accuracy_drop": 0.02}})[0]
    assert r.to_json() == {"gate": "cpu-int8.accuracy_drop <= 0.01", "build": "cpu-int8", "metric": "accuracy_drop",
                           "op": "<=", "threshold": 0.01, "value": 0.02, "passed": False}


# -- the table and the summary -----------------------------------------------------------------


def result(text: str, value, passed: bool | None = None) -> GateResult:
    gate = parse_gate(text)
    return GateResult(gate=gate, value=value, passed=gate.check(value) if passed is None else passed)


def test_format_table_shows_every_gate_aligned():
    rows = [result("cpu-fp32.accuracy >= 0.95", 0.9612), result("cpu-int8.accuracy_drop <= 0.01", 0.015),
            result("b.m >= 0", None)]
    assert format_table(rows) == "\n".join([
        "gate                            value   threshold  result",
        "------------------------------  ------  ---------  ------",
        "cpu-fp32.accuracy >= 0.95       0.9612  >= 0.95    PASS",
        "cpu-int8.accuracy_drop <= 0.01  0.015   <= 0.01    FAIL",
        "b.m >= 0                        n/a     >= 0       FAIL",
    ])


def test_format_table_with_no_gates_is_the_header():
    assert format_table([]) == "gate  value  threshold  result\n----  -----  ---------  ------"


def test_format_table_says_pass_or_fail_from_the_result():
    # the verdict column is the result's `passed`, not recomputed
    table = format_table([result("b.m >= 0", 1.0, passed=False), result("b.n >= 5", 1.0, passed=True)])
    assert [line.split()[-1] for line in table.splitlines()[2:]] == ["FAIL", "PASS"]


@pytest.mark.parametrize("value,shown", [
    (None, "n/a"),
    (0.0, "0"), (-0.0, "-0"),
    (0.75, "0.75"), (2.0, "2"), (-0.5, "-0.5"), (0.96125, "0.9613"), (12.5, "12.5"),
    (1e-3, "0.001"), (-1e-3, "-0.001"),            # the smallest shown in fixed notation
    (0.00099, "9.900e-04"), (-0.00099, "-9.900e-04"),
    (999999.0, "999999"), (-999999.0, "-999999"),  # the largest
    (1e6, "1.000e+06"), (-1e6, "-1.000e+06"), (123456789.0, "1.235e+08"),
    (math.inf, "inf"), (-math.inf, "-inf"), (math.nan, "nan"),
])
def test_values_are_shown_readably(value, shown):
    assert gatelib._fmt(value) == shown
    # and that is what the table and the summary print
    row = format_table([result("b.m >= 0", value, passed=False)]).splitlines()[2]
    assert row.split()[3] == shown
    assert failed_summary([result("b.m >= 0", value, passed=False)]).endswith(f"(got {shown})")


def test_failed_summary_names_only_the_failed_gates_and_counts_all():
    rows = [result("a.x >= 0.5", 0.75), result("a.y <= 2", 3.0), result("b.x >= 0", None)]
    assert failed_summary(rows) == "2 of 3 gate(s) failed: a.y <= 2 (got 3); b.x >= 0 (got n/a)"


def test_failed_summary_when_everything_passed():
    assert failed_summary([result("a.x >= 0.5", 0.75), result("a.y <= 2", 2.0)]) == "all gates passed"
    assert failed_summary([]) == "all gates passed"


def test_a_gate_and_its_result_are_immutable_values():
    g = parse_gate("b.m >= 1")
    with pytest.raises(AttributeError):
        g.threshold = 0.0  # type: ignore[misc]
    assert g == Gate(text="b.m >= 1", build="b", metric="m", op=">=", threshold=1.0)
    r = evaluate([g], {"b": {"m": 0.5}})[0]
    with pytest.raises(AttributeError):
        r.passed = True  # type: ignore[misc]
    assert r == GateResult(gate=g, value=0.5, passed=False)
    assert len({g, parse_gate("b.m >= 1")}) == 1 and len({r, GateResult(gate=g, value=0.5, passed=False)}) == 1


@pytest.mark.parametrize("fn", [Gate.check, parse_gate, gatelib._fmt], ids=lambda f: f.__qualname__)
def test_the_type_hints_resolve(fn):
    """The hints are strings here (``from __future__ import annotations``); tools that read them
    (pydantic's validate_call, typer, IDEs, docs) evaluate them, so each must be a valid type."""
    import typing

    hints = typing.get_type_hints(fn)
    assert hints and all(h is not None for h in hints.values())
