"""Dates, datetimes, durations, strings with patterns, optionals, defaults and `abs` (docs/language.md §4, §7, §8):
literals and input values, checker diagnostics, both engine forms, `sop decide --now`, schemas and prompt text."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from click.testing import CliRunner

import sopgraph
from sopgraph.cli import main as cli
from sopgraph.language import ir, scalars
from sopgraph.language.diagnostics import SopError
from sopgraph.language.schema import agent_output_schema, decide_input_schema, validate
from sopgraph.logic.checker import check_file
from sopgraph.logic.engine import DecideError, Engine, interpret
from sopgraph.simulation.prompts import describe_domain, sop_flow_text

FLIGHT = '''
scenario flight "Flight change"
field Reservation: string "The reservation code the customer gives."
system Departure: date "Day the flight leaves."
system BookedAt: datetime "When the booking was made."
system Grace: duration = 24 hours "How long after booking a free change is allowed."
system Voucher: float? "Value of a travel voucher on file, if any."
system Fee: float = 50 "Change fee."
action Change(code: string, on: date) "Change the flight."
action Charge(amount: float) "Charge the change fee."
action Refuse "Refuse the change."
output Deadline: datetime "Last moment a free change is possible."
stage s1 "Check" {
    when not (Reservation matches "^[A-Z]{3}-\\d{5}$") -> do Refuse
    when BookedAt > now - Grace -> do Change(code = Reservation, on = Departure + 1 days) { Deadline = BookedAt + Grace }
    when days_between(now, Departure) < 2 -> do Refuse
    when missing(Voucher) -> do Charge(amount = Fee)
    otherwise -> do Charge(amount = abs(Fee - Voucher))
}
'''
GOOD = {"Reservation": "ABC-12345", "Departure": "2026-12-01", "BookedAt": "2026-11-23T08:00",
        "now": "2026-11-23T10:00"}


@pytest.fixture(scope="module")
def flight() -> ir.Scenario:
    return sopgraph.load(text=FLIGHT)


def _both(scenario: ir.Scenario, values: dict[str, Any]) -> Any:
    """The decision (or error message) of the interpreter, checked equal for the generated engine."""
    try:
        expected: Any = interpret(scenario, values)
    except DecideError as exc:
        expected = exc.message
    try:
        got: Any = Engine(scenario).decide(values)
    except DecideError as exc:
        got = exc.message
    assert got == expected
    return expected


# ---- values


@pytest.mark.parametrize(("kind", "text", "seconds"), [
    ("date", "1970-01-02", 86_400),
    ("datetime", "1970-01-01T01:00", 3600),
    ("datetime", "1970-01-01T01:00:00Z", 3600),
    ("datetime", "1970-01-01T02:00+01:00", 3600),
    ("datetime", "1970-01-01T00:00:01.9", 1),  # fractions of a second are dropped
    ("datetime", "1970-01-02", 86_400),  # a date is its midnight
    ("duration", "24 hours", 86_400),
    ("duration", "1 day 6 hours", 108_000),
    ("duration", "2 weeks", 1_209_600),
    ("duration", "PT1H30M", 5400),
    ("duration", "P1W2D", 777_600),
])
def test_temporal_values_are_read_as_seconds(kind: str, text: str, seconds: int) -> None:
    assert scalars.parse_temporal(kind, text) == seconds


@pytest.mark.parametrize(("kind", "text"), [
    ("date", "2026-02-30"), ("date", "23/11/2026"), ("date", 20261123), ("date", "2026-11-23T10:00"),
    ("datetime", "noon"), ("datetime", "2026-11-23T25:00"), ("duration", "soon"), ("duration", 3600),
    ("duration", "P"), ("duration", "3 fortnights"),
])
def test_bad_temporal_values_are_refused(kind: str, text: Any) -> None:
    with pytest.raises(scalars.ValueProblem):
        scalars.parse_temporal(kind, text)


def test_temporal_values_are_written_back_as_text() -> None:
    assert scalars.format_temporal("date", 86_400 * 365) == "1971-01-01"
    assert scalars.format_temporal("datetime", 3600) == "1970-01-01T01:00:00Z"
    assert [scalars.format_duration(s) for s in (172_800, 5400, 90, 1, -3600)] == \
        ["2 days", "90 minutes", "90 seconds", "1 second", "-1 hour"]
    assert scalars.days_between(0, 2 * 86_400) == 2 and scalars.days_between(0, 3600) == pytest.approx(1 / 24)


# ---- the engine


def test_a_date_window_decides_in_both_engines(flight: ir.Scenario) -> None:
    d = _both(flight, GOOD)
    assert d.finals == {"Action": "Change", "Deadline": "2026-11-24T08:00:00Z"}
    assert d.actions == [{"name": "Change", "args": {"code": "ABC-12345", "on": "2026-12-02"}}]


@pytest.mark.parametrize(("booked", "action"), [
    ("2026-11-22T10:00:01", "Change"),  # 23:59:59 before now: inside the 24 hours
    ("2026-11-22T10:00:00", "Charge"),  # exactly 24 hours: not after `now - Grace`
])
def test_the_boundary_of_a_duration_is_exact(flight: ir.Scenario, booked: str, action: str) -> None:
    assert _both(flight, {**GOOD, "BookedAt": booked}).finals["Action"] == action


def test_defaults_are_used_when_the_input_leaves_a_value_out(flight: ir.Scenario) -> None:
    d = _both(flight, {**GOOD, "BookedAt": "2026-11-20T10:00", "Grace": "4 days"})
    assert d.finals["Action"] == "Change"  # the given Grace replaces the 24-hour default
    d = _both(flight, {**GOOD, "BookedAt": "2026-11-20T10:00"})
    assert d.actions == [{"name": "Charge", "args": {"amount": 50}}]  # Fee's default, Voucher missing


def test_an_optional_is_tested_with_missing_and_abs_takes_the_distance(flight: ir.Scenario) -> None:
    d = _both(flight, {**GOOD, "BookedAt": "2026-11-20T10:00", "Voucher": 80.0, "Fee": 30})
    assert d.actions == [{"name": "Charge", "args": {"amount": 50.0}}]


def test_reading_a_missing_optional_without_a_test_is_a_located_error() -> None:
    s = sopgraph.load(text='system V: float? "v"\naction A "a"\naction B "b"\n'
                           'stage s1 "x" { when V > 2 -> do A otherwise -> do B }')
    message = _both(s, {})
    assert message == "`V` is missing: it is optional, so test `missing(V)` before reading it (needed at s1)"


def test_now_is_never_read_from_the_clock(flight: ir.Scenario) -> None:
    message = _both(flight, {k: v for k, v in GOOD.items() if k != "now"})
    assert message.startswith("missing value for `now`: the program reads the current time")
    assert message.endswith("(needed at s1)")
    assert flight.variables["now"].role == "system" and flight.variables["now"].type == ir.TimeType(kind="datetime")


@pytest.mark.parametrize(("key", "value", "fragment"), [
    ("Departure", "2026-13-01", "`Departure` is not a date of the calendar"),
    ("BookedAt", "yesterday", "`BookedAt` is not a datetime"),
    ("Grace", 86400, "`Grace` is not a duration"),
    ("Reservation", 12345, "`Reservation` is not a string"),
    ("Reservation", "A" * 1001, "longer than 1000 characters"),
])
def test_bad_inputs_fail_with_one_clear_line(flight: ir.Scenario, key: str, value: Any, fragment: str) -> None:
    message = _both(flight, {**GOOD, key: value})
    assert fragment in message and "\n" not in message


def test_strings_compare_with_each_other_and_with_literals() -> None:
    s = sopgraph.load(text='system Actual: string "a"\nsystem Intended: string "i"\naction Fix "f"\naction Ok "o"\n'
                           'stage s1 "x" { when Actual != Intended and Actual in {"W1", "W2"} -> do Fix '
                           'otherwise -> do Ok }')
    assert _both(s, {"Actual": "W1", "Intended": "W2"}).finals["Action"] == "Fix"
    assert _both(s, {"Actual": "W1", "Intended": "W1"}).finals["Action"] == "Ok"
    assert _both(s, {"Actual": "W3", "Intended": "W1"}).finals["Action"] == "Ok"


def test_a_pattern_must_match_the_whole_string(flight: ir.Scenario) -> None:
    assert _both(flight, {**GOOD, "Reservation": "xABC-12345"}).finals["Action"] == "Refuse"
    assert _both(flight, {**GOOD, "Reservation": "ABC-123456"}).finals["Action"] == "Refuse"


def test_a_pattern_may_ignore_case_with_an_inline_flag() -> None:
    """Strings compare exactly; a rule that ignores case says so in its pattern (docs/language.md §7)."""
    s = sopgraph.load(text='system Code: string "c"\naction A "a"\naction B "b"\n'
                           'stage s "x" { when Code matches "(?i)welcome10" -> do A otherwise -> do B }')
    codes = ["WELCOME10", "Welcome10", "welcome10", "welcome1", "xwelcome10"]
    assert [_both(s, {"Code": c}).finals["Action"] for c in codes] == ["A", "A", "A", "B", "B"]
    good, bad = scalars.pattern_examples("(?i)welcome10")
    assert good is not None and re.fullmatch("(?i)welcome10", good)
    assert bad is not None and not re.fullmatch("(?i)welcome10", bad)


# ---- the checker


def _diags(text: str) -> list[tuple[str, str]]:
    return [(d.code, d.message) for d in check_file("t.sop", text=text).diagnostics if d.severity == "error"]


HEAD = ('system D: date "d"\nsystem T: datetime "t"\nsystem W: duration "w"\nsystem N: int "n"\n'
        'field S: string "s"\nsystem O: float? "o"\naction A "a"\n')


@pytest.mark.parametrize(("guard", "code", "fragment"), [
    ("D > 3", "E201", "comparing a date with a number"),
    ("D + 3 > T", "E201", "`D + 3` is not defined for a date and a number"),
    ("W > 5", "E201", "comparing a duration with a number"),
    ("D + T > T", "E201", "is not defined for a date and a datetime"),
    ("S < S", "E201", "strings have no order"),
    ("S == Main", "E101", "`Main` is not a variable"),
    ("S + 1 > N", "E201", "strings have no arithmetic"),
    ('N matches "a"', "E201", "`matches` tests a string"),
    ('S matches "[a-z"', "E211", "invalid pattern"),
    ('S matches "(a+)+"', "E211", "a repeat inside a repeat"),
    ('S matches "(ab|a)*c"', "E211", "alternatives of several characters inside a repeat"),
    ('S matches "(a)\\1"', "E211", "back-references"),
    ("missing(N)", "E212", "`N` is not optional"),
    ("abs(S) > 1", "E201", "`abs` of a string"),
    ("days_between(N, D) > 1", "E201", "`days_between` takes dates"),
    ("foo(N) > 1", "E101", "unknown function `foo`"),
    ("abs(N, N) > 1", "E201", "`abs` takes 1 argument"),
])
def test_type_errors_are_located_diagnostics(guard: str, code: str, fragment: str) -> None:
    diags = _diags(HEAD + f'stage s "x" {{ when {guard} -> do A otherwise -> do A }}')
    assert any(c == code and fragment in m for c, m in diags), diags


@pytest.mark.parametrize("guard", ["days_between(D, today) > 1", "D < today - 2 days"])
def test_a_bare_word_where_a_time_goes_points_to_now(guard: str) -> None:
    found = check_file("t.sop", text=HEAD + f'stage s "x" {{ when {guard} -> do A otherwise -> do A }}').diagnostics
    (e201,) = [d for d in found if d.severity == "error"]
    assert e201.code == "E201" and "the current time is `now`" in (e201.hint or "")


def test_a_score_written_as_weights_times_conditions_is_shown_as_a_weighted_count() -> None:
    """`weighted(2 * (…), …)` and `2 * Flag`, as spreadsheets and other rule languages write a score: the
    hints spell the count with weights the language has."""
    text = HEAD + 'system V: bool "v"\nlet Score = weighted(2 * (N > 3), 1 * V)\n' \
        'stage s "x" { when Score > 1 -> do A otherwise -> do A }'
    found = [d for d in check_file("t.sop", text=text).diagnostics if d.severity == "error"]
    e101 = next(d for d in found if d.code == "E101")
    assert "`count(2: N > 3, 1: V)`" in (e101.hint or "")
    times_bool = next(d for d in found if d.code == "E201" and "`V` is not a number" in d.message)
    assert "`count(2: V)`" in (times_bool.hint or "")


@pytest.mark.parametrize(("guard", "literal"), [("D >= 2026-01-05", 'date("2026-01-05")'),
                                               ("2025-12-31 < T", 'datetime("2025-12-31T00:00")')])
def test_a_date_written_without_quotes_gets_its_literal_as_hint(guard: str, literal: str) -> None:
    """`2026-01-05` parses as 2026 - 1 - 5: the hint spells the constant the writer meant."""
    found = check_file("t.sop", text=HEAD + f'stage s "x" {{ when {guard} -> do A otherwise -> do A }}').diagnostics
    (e201,) = [d for d in found if d.severity == "error"]
    assert e201.code == "E201" and literal in (e201.hint or "")


def test_a_subtraction_that_spells_no_date_keeps_the_general_hint() -> None:
    found = check_file("t.sop", text=HEAD + 'stage s "x" { when D > 2026-13-01 -> do A otherwise -> do A }').diagnostics
    (e201,) = [d for d in found if d.severity == "error"]
    assert "compare a date with a date" in (e201.hint or "")


@pytest.mark.parametrize("guard", [
    "D > now - 24 hours", "T - D < 2 days", "days_between(D, T) >= 1", "W * 2 > 1 hours", "W / 2 < W",
    "abs(N - 3) > 1", "abs(W) > 0 seconds", 'S matches "^[A-Z]{3}-\\d{5}$"', 'S == "x"', "not missing(O) and O > 1",
    'S in {"a", "b"}', "-W < W", "D + 2 weeks > T",
])
def test_well_typed_guards_check_clean(guard: str) -> None:
    assert _diags(HEAD + f'stage s "x" {{ when {guard} -> do A otherwise -> do A }}') == []


def test_a_date_plus_whole_days_stays_a_date_else_becomes_a_datetime() -> None:
    text = HEAD.replace('action A "a"', 'action A(on: date) "a"')
    ok = _diags(text + 'stage s "x" { -> do A(on = D + 2 days) }')
    bad = _diags(text + 'stage s "x" { -> do A(on = D + 36 hours) }')
    assert ok == [] and bad and bad[0][0] == "E204" and "is a datetime" in bad[0][1]


@pytest.mark.parametrize(("decl", "fragment"), [
    ('system X: float = "x" "x"', "the default of `X` is not a number"),
    ('system X: date = "2026-02-30" "x"', "the default of `X` is not a date of the calendar"),
    ('system X: int? = 3 "x"', "`X` is optional and has a default"),
    ('system X: duration = 3 "x"', "the default of `X`"),
])
def test_bad_defaults_and_optionals_are_e212(decl: str, fragment: str) -> None:
    diags = _diags(decl + '\naction A "a"\nstage s "x" { when X == X -> do A otherwise -> do A }')
    assert any(c == "E212" and fragment in m for c, m in diags), diags


def test_an_invalid_date_literal_is_e210_with_a_caret() -> None:
    with pytest.raises(SopError) as info:
        sopgraph.load(text='system D: date "d"\naction A "a"\nstage s { when D > date("2026-02-30") -> do A '
                           'otherwise -> do A }')
    diag = info.value.diagnostics[0]
    assert diag.code == "E210" and (diag.span.line, diag.span.col) == (3, 25)


def test_type_words_stay_usable_as_names() -> None:
    s = sopgraph.load(text='system date: int "d"\nsystem days: int "d"\nsystem matches: bool "m"\naction A "a"\n'
                           'stage s "x" { when date > 1 and days < 2 and matches -> do A otherwise -> do A }')
    assert list(s.variables) == ["date", "days", "matches"]


def test_a_pattern_outside_the_example_subset_is_an_info_not_a_guess() -> None:
    diags = check_file("t.sop", text='field S: string "s"\naction A "a"\n'
                                     'stage s "x" { when S matches "(?>ab)c" -> do A otherwise -> do A }').diagnostics
    assert [d.code for d in diags if d.severity == "info" and d.code == "I210"] == ["I210"]


# ---- examples of patterns (witness strings)


@pytest.mark.parametrize("pattern", [
    r"^[A-Z]{3}-\d{5}$", r"[a-z]+@[a-z]+\.com", r"(EU|US)-\d{2,4}", r"\w+ \d?", r"[^0-9]{2}", "x*", r"A.B",
])
def test_pattern_examples_match_and_do_not_match(pattern: str) -> None:
    good, bad = scalars.pattern_examples(pattern)
    assert good is not None and re.fullmatch(pattern, good)
    assert bad is not None and not re.fullmatch(pattern, bad)


# ---- downstream: decide --now, schemas, prompt


def test_decide_takes_now_once_for_every_line(tmp_path: Any) -> None:
    path = tmp_path / "flight.sop"
    path.write_text(FLIGHT, encoding="utf-8")
    values = {k: v for k, v in GOOD.items() if k != "now"}
    lines = json.dumps(values) + "\n" + json.dumps({**values, "now": "2026-11-30T10:00"}) + "\n"
    res = CliRunner().invoke(cli, ["decide", str(path), "--now", "2026-11-23T10:00"], input=lines)
    out = [json.loads(line) for line in res.output.splitlines()]
    assert out[0]["finals"]["Action"] == "Change" and out[1]["finals"]["Action"] == "Refuse"  # the line's own now
    res = CliRunner().invoke(cli, ["decide", str(path), "--now", "2026-11-31", "--values", "{}"])
    assert res.exit_code == 2 and "is not a datetime of the calendar" in res.output


def test_schemas_give_formats_and_patterns(flight: ir.Scenario) -> None:
    inputs = decide_input_schema(flight)["properties"]
    assert inputs["Departure"]["format"] == "date" and inputs["BookedAt"]["format"] == "date-time"
    assert inputs["Grace"]["type"] == ["string", "null"] and "pattern" in inputs["Grace"]
    assert inputs["Voucher"]["type"] == ["number", "null"]
    assert validate(inputs["Departure"], "2026-12-01") == []
    assert validate(inputs["Departure"], "2026-12-41") and validate(inputs["Grace"], "soon")
    assert validate(inputs["Grace"], "2 hours") == []
    reply = agent_output_schema(flight)["properties"]["classification_output"]["properties"]
    assert reply["Reservation"] == {"description": "The reservation code the customer gives.", "type": "string",
                                    "maxLength": scalars.MAX_STRING}


def test_the_prompt_names_types_and_patterns(flight: ir.Scenario) -> None:
    assert describe_domain(ir.TimeType(kind="date")) == "a date (YYYY-MM-DD)"
    assert describe_domain(ir.StringType()) == "text"
    flow = sop_flow_text(flight)
    assert 'Reservation has the form "^[A-Z]{3}-\\d{5}$"' in flow and "Voucher is missing" in flow
    assert "if BookedAt is after now - Grace" in flow and "days_between(now, Departure) is less than 2" in flow


def test_min_max_of_durations_and_dates_and_temporal_output_defaults() -> None:
    s = sopgraph.load(text='system Wait: duration "w"\nsystem A: date "a"\nsystem B: datetime "b"\n'
                           'output Due: date = "2026-01-01" "due"\noutput Grace: duration = 2 days "grace"\n'
                           'action Go(w: duration, at: datetime) "go"\naction No "no"\n'
                           'stage s "x" { when max(0 seconds, Wait - 2 hours) > 1 hours -> '
                           'do Go(w = max(Wait, 1 hours), at = min(A, B)) { Grace = Wait } otherwise -> do No }')
    d = _both(s, {"Wait": "4 hours", "A": "2026-02-01", "B": "2026-01-20T10:00"})
    assert d.finals == {"Action": "Go", "Due": "2026-01-01", "Grace": "4 hours"}
    assert d.actions == [{"name": "Go", "args": {"w": "4 hours", "at": "2026-01-20T10:00:00Z"}}]
    assert _both(s, {"Wait": "1 hour"}).finals == {"Action": "No", "Due": "2026-01-01", "Grace": "2 days"}
    assert any(c == "E201" and "`max` mixes" in m
               for c, m in _diags(HEAD + 'stage s "x" { when max(W, N) > 1 hours -> do A otherwise -> do A }'))
