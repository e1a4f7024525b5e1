"""Lists, records and weighted counts: syntax, type errors, both engine forms, input validation,
the analyses (paths, witnesses, synthesis), JSON Schemas, prompt text and `sop fmt`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import sopgraph
from sopgraph.cli import main as cli
from sopgraph.language import ir
from sopgraph.language.fmt import format_text
from sopgraph.language.schema import agent_output_schema, type_schema, validate
from sopgraph.logic import engine as engine_mod
from sopgraph.logic.checker import check_file
from sopgraph.logic.engine import DecideError, Engine, interpret
from sopgraph.logic.lower import analysis_form
from sopgraph.logic.paths import count_paths, iter_paths
from sopgraph.simulation.prompts import agent_system_prompt, describe_domain

ROOT_DATA = Path(__file__).resolve().parent / "data"

PROGRAM = """\
type Cabin = Economy | Business
type Segment = record { flown: bool, cabin: Cabin, price: float[0..) }
system Segments: list[..4] of Segment "The flight segments, in order."
system Metrics: record { latency: int[0..1000], ok: bool } "Service metrics."
system Tags: list[1..3] of Red | Blue "Tags on the account."
field Mood: Calm | Angry "The caller's mood."
let Flown = count(s in Segments where s.flown)
let Score = count(2: Metrics.latency > 500, 1: Mood == Angry, 3: not Metrics.ok)
action Go "Go ahead."
action Stop "Stop."
action Ask "Ask."
stage s1 {
    when any(s in Segments where s.flown and s.cabin == Business) -> do Stop
    when len(Segments) > 2 and Score >= 3 -> do Stop
    when Red in Tags and all(s in Segments where s.price > 100) -> do Go
    when Flown >= 1 -> do Ask
    otherwise -> do Go
}
"""

SEG = {"flown": False, "cabin": "Economy", "price": 150.0}


def _load(text: str = PROGRAM) -> ir.Scenario:
    return sopgraph.load(text=text)


def _both(scenario: ir.Scenario, values: dict[str, Any]) -> Any:
    """The decision (or error message) of the interpreter, after checking both generated forms agree."""
    try:
        expected: Any = interpret(scenario, values)
    except DecideError as exc:
        expected = exc.message
    tree = Engine(scenario)
    saved = engine_mod._expanded_size
    engine_mod._expanded_size = lambda s: None
    try:
        loop = Engine(scenario)
    finally:
        engine_mod._expanded_size = saved
    assert (tree.mode, loop.mode) == ("tree", "loop")
    for eng in (tree, loop):
        try:
            got: Any = eng.decide(values)
        except DecideError as exc:
            got = exc.message
        assert got == expected
    return expected


# ---- syntax and IR -------------------------------------------------------------------------


def test_types_and_expressions_parse_into_their_nodes_with_spans() -> None:
    s = _load()
    segs = s.variables["Segments"].type
    assert isinstance(segs, ir.ListType) and segs.max_len == 4 and segs.min_len == 0
    assert isinstance(segs.item, ir.RecordType) and segs.item.alias == "Segment"
    assert [f.name for f in segs.item.fields] == ["flown", "cabin", "price"]
    assert segs.item.fields[1].type.values == ["Economy", "Business"]  # the enum alias inside the record
    tags = s.variables["Tags"].type
    assert isinstance(tags, ir.ListType) and (tags.min_len, tags.max_len) == (1, 3)
    score = s.variables["Score"].expr
    assert isinstance(score, ir.Weighted) and score.weights == [2, 1, 3]
    get = score.args[0].left
    assert isinstance(get, ir.Get) and get.field == "latency" and isinstance(get.base, ir.Var)
    assert (get.span.line, get.span.col, get.span.end_col) == (8, 22, 37)
    assert (get.base.span.col, get.base.span.end_col) == (22, 29)
    guard = s.stages["s1"].branches[0].guard
    assert isinstance(guard, ir.Quant) and guard.func == "any" and guard.var == "s"
    assert isinstance(guard.cond.operands[0], ir.Get) and isinstance(guard.cond.operands[0].base, ir.Item)
    member = s.stages["s1"].branches[2].guard.operands[0]
    assert isinstance(member, ir.Member) and member.operand.value == "Red"
    assert ir.show(guard) == "any(s in Segments where s.flown and s.cabin == Business)"
    assert ir.show(score) == "count(2: Metrics.latency > 500, 1: Mood == Angry, 3: not Metrics.ok)"


def test_default_list_bound_and_fmt_round_trip() -> None:
    text = 'system L: list of int[0..5] "l"\naction Go "g"\naction No "n"\n' \
           "stage s { when count(x in L where x > 2) >= 2 -> do Go otherwise -> do No }\n"
    s = _load(text)
    assert s.variables["L"].type.max_len == ir.LIST_MAX_DEFAULT
    formatted = format_text(PROGRAM)
    assert "type Segment = record { flown: bool, cabin: Cabin, price: float[0..) }" in formatted
    assert "system Tags: list[1..3] of Red | Blue" in formatted
    again = _load(formatted)
    rows = [{"Segments": [SEG], "Metrics": {"latency": 600, "ok": False}, "Tags": ["Red"], "Mood": "Calm"}]
    assert [interpret(again, r) for r in rows] == [interpret(_load(), r) for r in rows]


# ---- checker -------------------------------------------------------------------------------

BAD = """\
type Segment = record { flown: bool, price: float[0..) }
system Segments: list[..40] of Segment "s"
system M: record { a: bool, a: int } "m"
field Mood: Calm | Angry "m"
let X = Segments
action Go "g"
output O: list of bool = none
stage s1 {
  when any(s in Segments where s.flwn) -> do Go
  when Segments -> do Go
  when Mood.x -> do Go
  when count(s in Mood where s) > 1 -> do Go
  when Calm in Segments -> do Go
  when M.a -> do Go
  otherwise -> do Go
}
"""


def _diags(text: str, tmp_path) -> list[tuple[str, int, int, str, str]]:
    path = tmp_path / "bad.sop"
    path.write_text(text)
    return [(d.code, d.span.line, d.span.col, d.message, d.hint or "") for d in check_file(path).diagnostics]


def test_type_errors_name_the_place_and_give_a_hint(tmp_path) -> None:
    found = _diags(BAD, tmp_path)
    by_line = {(code, line): (col, msg, hint) for code, line, col, msg, hint in found}
    assert by_line[("E203", 2)][1] == "the list `Segments` may hold 40 items; lists hold at most 32"
    assert by_line[("E102", 3)][1] == "field `a` of `M` is declared twice"
    assert by_line[("E201", 5)][1] == "derived variable `X` is a list: a `let` gives one value"
    assert "outputs and action parameters hold one value" in by_line[("E201", 7)][1]
    col, msg, hint = by_line[("E101", 9)]
    assert (col, msg, hint) == (32, "`s` has no field `flwn`", "did you mean `flown`?")
    assert "test its items: `any(x in Segments where ...)`" in by_line[("E201", 10)][2]
    assert by_line[("E201", 11)][1].startswith("`Mood` is an enum (Calm | Angry), not a record")
    col, msg, _ = by_line[("E201", 12)]
    assert col == 19 and msg.startswith("`count(... where ...)` needs a list, but `Mood`")
    assert "the items of `Segments` are records" in by_line[("E201", 13)][1]
    assert ("E201", 14) not in by_line  # a bool field of a record is a condition


def test_diagnostic_output_has_file_line_col_caret_and_hint(tmp_path) -> None:
    path = tmp_path / "bad.sop"
    path.write_text(BAD)
    result = CliRunner().invoke(cli, ["check", str(path)])
    assert result.exit_code == 1
    assert f"{path}:9:32: error[E101]: `s` has no field `flwn`" in result.output
    lines = result.output.splitlines()
    at = next(i for i, line in enumerate(lines) if "has no field `flwn`" in line)
    assert lines[at + 2].index("^") == lines[at + 1].index("s.flwn")
    assert "= hint: did you mean `flown`?" in lines[at + 3]


def test_item_syntax_needs_a_name_and_a_list(tmp_path) -> None:
    found = _diags('system L: list of bool "l"\naction Go "g"\nstage s { when any(3 in L where true) -> do Go '
                   "otherwise -> do Go }\n", tmp_path)
    assert found[0][:3] == ("E001", 3, 20)
    assert "write `any(x in List where condition)`" in found[0][4]


def test_clean_program_checks_clean(tmp_path) -> None:
    found = _diags(PROGRAM, tmp_path)
    assert [d for d in found if d[0].startswith("E")] == []


# ---- engine --------------------------------------------------------------------------------


@pytest.mark.parametrize("values, action", [
    ({"Segments": [{**SEG, "flown": True, "cabin": "Business"}]}, "Stop"),
    ({"Segments": [SEG] * 3, "Metrics": {"latency": 501, "ok": True}, "Mood": "Angry"}, "Stop"),
    ({"Segments": [SEG] * 3, "Metrics": {"latency": 500, "ok": True}, "Mood": "Angry", "Tags": ["Blue", "Red"]},
     "Go"),
    ({"Segments": [SEG, {**SEG, "flown": True}], "Metrics": {"latency": 0, "ok": True}, "Mood": "Calm",
      "Tags": ["Blue"]}, "Ask"),
    ({"Segments": [], "Metrics": {"latency": 0, "ok": True}, "Mood": "Calm", "Tags": ["Red"]}, "Go"),
])
def test_both_engine_forms_decide_lists_records_and_weighted_counts(values: dict, action: str) -> None:
    decision = _both(_load(), values)
    assert decision.finals["Action"] == action


def test_weighted_count_sums_the_weights_of_true_conditions() -> None:
    s = _load('field A: bool "a"\nfield B: bool "b"\noutput W: float = 0 "w"\naction Go "g"\n'
              "stage s { -> do Go { W = count(2: A, 0.5: B, 3: not A) } }\n")
    assert [_both(s, {"A": a, "B": b}).finals["W"] for a, b in [(True, True), (True, False), (False, True)]] \
        == [2.5, 2, 3.5]


@pytest.mark.parametrize("values, message", [
    ({"Segments": [{**SEG, "prise": 3}]}, "`Segments[0]` has no field `prise` (did you mean `price`?) (needed at s1)"),
    ({"Segments": [{"flown": True, "cabin": "Economy"}]}, "missing value for `Segments[0].price` (needed at s1)"),
    ({"Segments": [{**SEG, "cabin": "First"}]},
     'value "First" is not in the domain of `Segments[0].cabin` (Economy | Business) (needed at s1)'),
    ({"Segments": [SEG] * 5}, "`Segments` has 5 items; it holds at most 4 (needed at s1)"),
    ({"Segments": SEG}, 'value {"flown": false, "cabin": "Economy", "price": 150.0} of `Segments` is not a list '
                        "(needed at s1)"),
    ({"Segments": [SEG] * 3, "Metrics": {"latency": 1001, "ok": True}},
     "value 1001 of `Metrics.latency` is outside int[0..1000] (needed at s1)"),
    ({"Segments": [], "Metrics": {"latency": 1, "ok": True}, "Mood": "Calm", "Tags": []},
     "`Tags` has 0 items; it holds at least 1 (needed at s1)"),
])
def test_bad_structured_inputs_fail_with_one_clear_message(values: dict, message: str) -> None:
    assert _both(_load(), values) == message


def test_decide_cli_reports_a_wrong_record_field_in_one_line(tmp_path) -> None:
    path = tmp_path / "p.sop"
    path.write_text(PROGRAM)
    values = json.dumps({"Segments": [{**SEG, "prise": 3}], "Metrics": {"latency": 0, "ok": True},
                         "Mood": "Calm", "Tags": ["Red"]})
    result = CliRunner().invoke(cli, ["decide", str(path), "--values", values])
    assert result.exit_code != 0
    assert "`Segments[0]` has no field `prise` (did you mean `price`?)" in result.output
    assert "Traceback" not in result.output


# ---- analyses ------------------------------------------------------------------------------


def test_path_witnesses_are_lists_and_records_that_decide_along_their_path() -> None:
    s = _load()
    paths = list(iter_paths(s))
    assert count_paths(s).feasible == len(paths) == 5
    for info in paths:
        for w in (info.witness, info.boundary_witness):
            assert w is not None
            assert isinstance(w["Segments"], list) and isinstance(w["Metrics"], dict)
            assert 1 <= len(w["Tags"]) <= 3
            decision = interpret(s, w)
            assert decision.path == info.stages and decision.finals == info.finals


def test_analysis_form_flattens_and_lifts_values() -> None:
    form = analysis_form(_load())
    values = {"Segments": [SEG], "Metrics": {"latency": 3, "ok": True}, "Tags": ["Red"], "Mood": "Calm"}
    flat = form.flatten(values)
    assert flat["len(Segments)"] == 1 and flat["Segments[0].cabin"] == "Economy" and flat["Metrics.ok"] is True
    assert form.lift(flat) == values
    assert "len(Segments)" in form.scenario.variables and "Segments[3].price" in form.scenario.variables


def test_synth_cases_carry_lists_and_decide_their_expected_path(tmp_path) -> None:
    path = tmp_path / "p.sop"
    path.write_text(PROGRAM)
    result = CliRunner().invoke(cli, ["synth", str(path), "-n", "10", "--seed", "3"])
    assert result.exit_code == 0, result.output
    s = _load()
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == 10
    for row in rows:
        values = {**row.get("labels", {}), **row.get("truth", {}), **row["system"]}
        assert isinstance(row["system"]["Segments"], list)
        assert interpret(s, values).path == row["expected_path"]


def test_flow_checks_run_on_lowered_lists(tmp_path) -> None:
    text = ('system L: list[..2] of bool "l"\naction Go "g"\naction No "n"\n'
            "stage s { when len(L) > 2 -> do Go otherwise -> do No }\n")
    found = _diags(text, tmp_path)
    assert any(code == "W304" and line == 4 for code, line, *_ in found), found


# ---- schema and prompt ---------------------------------------------------------------------


def test_json_schemas_of_lists_and_records() -> None:
    seg = _load().variables["Segments"].type
    schema = type_schema(seg)
    assert schema["type"] == "array" and schema["maxItems"] == 4
    assert schema["items"]["required"] == ["flown", "cabin", "price"]
    assert schema["items"]["additionalProperties"] is False
    assert validate(schema, [SEG]) == []
    assert validate(schema, [SEG] * 5) == ["reply: holds at most 4 item(s)"]
    assert validate(schema, [{**SEG, "x": 1}]) == ["reply[0].x: unexpected key"]
    s = _load(PROGRAM.replace('field Mood: Calm | Angry "The caller\'s mood."',
                              'field Mood: Calm | Angry "m"\nfield Issues: list[..2] of Late | Lost "issues"'))
    fields = agent_output_schema(s)["properties"]["classification_output"]["properties"]
    assert fields["Issues"]["type"] == "array" and fields["Issues"]["items"]["enum"] == ["Late", "Lost"]


def test_prompt_describes_lists_and_records_in_words() -> None:
    seg = _load().variables["Segments"].type
    assert describe_domain(seg) == ("a list of at most 4 items, each a record Segment with: flown (true or false); "
                                    "cabin (one of: Economy, Business); price (a number, at least 0)")
    text = agent_system_prompt(_load(), {})
    assert "- Segments — a list of at most 4 items, each a record Segment with: flown" in text
    assert "if at least one item s of Segments has: s.flown is true and s.cabin is Business → final action Stop" in text


SUM_PROGRAM = '''scenario owed "Owed"
type Invoice = record { paid: bool, amount: float[0..500] }
system Invoices: list[0..4] of Invoice "The last invoices."
let Unpaid = sum(i.amount for i in Invoices where not i.paid) "What the customer still owes."
let Billed = sum(i.amount for i in Invoices) "Everything billed."
action Collect(amount: float[0..2000]) "Take the payment." [moves_money, ends_dialogue]
action Close "Close." [ends_dialogue]
action Human "Human." [escalation, ends_dialogue]
stage s "Balance" {
    when Unpaid > 1000 -> do Human
    when Unpaid > 0 -> do Collect(amount = Unpaid)
    otherwise -> do Close
}
'''


@pytest.mark.parametrize(("invoices", "action", "args"), [
    ([], "Close", {}),
    ([{"paid": True, "amount": 90.0}], "Close", {}),
    ([{"paid": False, "amount": 60.0}, {"paid": True, "amount": 500.0}, {"paid": False, "amount": 50.5}],
     "Collect", {"amount": 110.5}),
    ([{"paid": False, "amount": 500.0}, {"paid": False, "amount": 500.0}, {"paid": False, "amount": 0.5}],
     "Human", {}),
])
def test_sum_adds_a_value_over_the_items_a_condition_keeps(invoices: list, action: str, args: dict) -> None:
    """`sum(V for x in L where C)`: a total the backend would otherwise have to send beside the list (and
    that synthesis would then draw independently of the items). The generated engine and the interpreter
    agree."""
    sc = sopgraph.load(text=SUM_PROGRAM)
    values = {"Invoices": invoices}
    compiled, interpreted = sopgraph.decide(sc, values), interpret(sc, values)
    assert compiled.finals == interpreted.finals and compiled.finals["Action"] == action
    assert compiled.actions[-1] == {"name": action, "args": args}


def test_sum_is_analysed_synthesized_described_and_formatted() -> None:
    from sopgraph.cases.profiles import default_profile
    from sopgraph.cases.synth import synthesize

    sc = sopgraph.load(text=SUM_PROGRAM)
    assert [p.action for p in iter_paths(sc)] == ["Human", "Collect", "Close"]
    for case in synthesize(sc, default_profile(sc), 9, seed=1, min_per_path=1).cases:
        owed = sum(i["amount"] for i in case.system["Invoices"] if not i["paid"])
        assert case.expected_finals["Action"] == ("Human" if owed > 1000 else "Collect" if owed > 0 else "Close")
    prompt = agent_system_prompt(sc, {})
    assert "Unpaid = the total of i.amount over the items i of Invoices for which i.paid is false" in prompt
    assert "Billed = the total of i.amount over the items i of Invoices." in prompt
    text = format_text(SUM_PROGRAM)
    assert "sum(i.amount for i in Invoices where not i.paid)" in text and "sum(i.amount for i in Invoices)" in text
    assert format_text(text) == text


@pytest.mark.parametrize(("expr", "fragment"), [
    ("sum(i.paid for i in Invoices)", "is not a number"),
    ("sum(i.amount for i in Nope)", "Nope"),
    ("sum(i.amount for Invoices)", "names an item and a list after `for`"),
])
def test_sum_mistakes_are_located_errors(expr: str, fragment: str) -> None:
    text = SUM_PROGRAM.replace("sum(i.amount for i in Invoices)", expr)
    errors = [d for d in check_file("t.sop", text=text).diagnostics if d.is_error]
    assert errors and any(fragment in d.message for d in errors), [d.message for d in errors]


# ---- optional record fields (`note: string?`) ---------------------------------------------------

OPTIONAL_FIELDS = ROOT_DATA / "lang_optional_fields.sop"


def test_an_optional_record_field_may_be_absent_or_null_and_missing_tests_it() -> None:
    sc = sopgraph.load(OPTIONAL_FIELDS)
    contact = {"phone": "1"}
    bills = [{"amount": 5.0}, {"amount": 5.0, "note": None, "due": None}, {"amount": 5.0, "note": "urgent"}]
    assert _both(sc, {"Contact": contact, "Bills": bills}).finals == {"Action": "Call"}
    assert _both(sc, {"Contact": {**contact, "email": "a@example.com"}, "Bills": []}).finals == {"Action": "Mail"}
    assert _both(sc, {"Contact": {**contact, "email": None}, "Bills": bills[:2]}).finals == {"Action": "Mail"}
    # a declared field that is not optional is still required, and the optional one still typed
    assert "missing value for `Contact.phone`" in _both(sc, {"Contact": {"email": "a@example.com"}})
    assert "Bills[0].note" in _both(sc, {"Contact": contact, "Bills": [{"amount": 5.0, "note": 3}]})


def test_reading_an_absent_optional_field_is_refused_in_both_engine_forms() -> None:
    sc = sopgraph.load(text=str(OPTIONAL_FIELDS.read_text()).replace("not missing(b.note) and ", ""), check=False)
    got = _both(sc, {"Contact": {"phone": "1"}, "Bills": [{"amount": 5.0}]})
    assert got == ("`b.note` (`Bills[0].note`) is missing: it is optional, so test `missing(b.note)` before reading "
                   "it (needed at bills)")


def test_optional_fields_are_checked_analysed_and_described() -> None:
    text = OPTIONAL_FIELDS.read_text()
    unguarded = text.replace("not missing(b.note) and ", "")
    warned = [d for d in check_file("t.sop", text=unguarded).diagnostics if d.code == "W306"]
    assert len(warned) == 1  # an unguarded read of an optional field, reported once for all the items
    assert warned[0].message.startswith("`b.note` (`Bills[0].note`) is optional and may be read while it is missing")
    assert "`not missing(b.note) and …`" in (warned[0].hint or "") and warned[0].witness is not None
    not_optional = text.replace("when missing(Contact.email)", "when missing(Contact.phone)")
    errors = [d for d in check_file("t.sop", text=not_optional).diagnostics if d.is_error]
    assert [d.code for d in errors] == ["E212"] and "`phone` is not optional" in errors[0].message
    sc = sopgraph.load(OPTIONAL_FIELDS)
    paths = list(iter_paths(sc))
    assert [p.action for p in paths] == ["Call", "Ask", "Mail", "Mail", "Call", "Ask", "Mail"]
    for p in paths:  # every witness, optional fields left out (null) included, decides down its own path
        assert p.witness is not None and sopgraph.decide(sc, p.witness).path == p.stages
    assert any(w["Contact"]["email"] is None for w in (p.witness for p in paths) if w)
    assert "email (text, may be absent)" in describe_domain(sc.variables["Contact"].type)
    rec = type_schema(sc.variables["Contact"].type)
    assert rec["required"] == ["phone"] and rec["properties"]["email"]["type"] == ["string", "null"]
    assert validate(rec, {"phone": "1"}) == [] and validate(rec, {"phone": "1", "email": None}) == []
    assert validate(rec, {"email": "x"}) != []
    assert "note: string?" in format_text(text)


# ---- open records (`record open { … }`) ---------------------------------------------------------

OPEN_RECORDS = ROOT_DATA / "lang_open_records.sop"
DB_SEGMENT = {"flown": False, "fare": 120.0, "cabin": "Economy", "price": 99, "carrier": "LH", "seat": None}


def test_an_open_record_ignores_undeclared_fields_and_keeps_declared_ones_strict() -> None:
    sc = sopgraph.load(OPEN_RECORDS)
    account = {"vip": False}
    assert _both(sc, {"Segments": [DB_SEGMENT], "Account": account}).finals == {"Action": "Refund"}
    assert _both(sc, {"Segments": [{**DB_SEGMENT, "flown": True}], "Account": account}).finals == {"Action": "Decline"}
    # declared fields: still required and typed
    assert "missing value for `Segments[0].fare`" in _both(
        sc, {"Segments": [{k: v for k, v in DB_SEGMENT.items() if k != "fare"}], "Account": account})
    assert "`Segments[0].cabin`" in _both(sc, {"Segments": [{**DB_SEGMENT, "cabin": "First"}], "Account": account})
    # a record not declared open stays closed, and says how to open it
    got = _both(sc, {"Segments": [DB_SEGMENT], "Account": {"vip": False, "tier": "gold"}})
    assert got == ("`Account` has no field `tier` (write `record open { … }` to ignore fields the record does not "
                   "declare) (needed at check)")


def test_open_records_are_described_formatted_and_in_the_schema() -> None:
    sc = sopgraph.load(OPEN_RECORDS)
    seg = sc.variables["Segments"].type.item
    assert seg.open and not sc.variables["Account"].type.open
    assert type_schema(seg)["additionalProperties"] is True
    assert type_schema(sc.variables["Account"].type)["additionalProperties"] is False
    assert validate(type_schema(sc.variables["Segments"].type), [DB_SEGMENT]) == []
    assert "other fields may appear too" in describe_domain(sc.variables["Segments"].type)
    text = OPEN_RECORDS.read_text()
    assert "record open { flown: bool" in format_text(text)
    assert ir.describe_type(seg.model_copy(update={"alias": None})).startswith("record open { flown: bool")
    for p in iter_paths(sc):  # witnesses hold the declared fields and decide down their own path
        assert p.witness is not None and set(p.witness["Segments"][0]) == {"flown", "fare", "cabin"}
        assert sopgraph.decide(sc, p.witness).path == p.stages


def test_open_is_a_keyword_only_after_record() -> None:
    sc = sopgraph.load(text='field open: bool "o"\ntype R = record open { open: bool }\nsystem X: R "x"\n'
                            'action Go "g"\nstage s { when open and X.open -> do Go otherwise -> do Go }\n')
    assert sc.variables["X"].type.open and sc.variables["X"].type.fields[0].name == "open"


# ---- list outputs over lists and records ------------------------------------------------------------

FLAGS = """\
type Seg = record { flown: bool, cabin: Eco | Biz }
system Segs: list[1..3] of Seg "The segments."
field Angry: bool "The caller is angry."
output Flags: list[..2] of Flown | Business | Upset "What the case involves."
action Log "Log the case."
stage s1 {
    when Angry -> do Log { Flags = [Upset, Flown when any(s in Segs where s.flown), Business when any(s in Segs where s.cabin == Biz)] }
    otherwise -> do Log { Flags = case { when all(s in Segs where s.flown) -> [Flown] otherwise -> [] } }
}
"""


def test_a_list_output_built_from_conditions_over_lists_is_checked_and_analysed() -> None:
    diags = check_file("t.sop", text=FLAGS).diagnostics
    errors = [d for d in diags if d.is_error]
    assert [d.code for d in errors] == ["E204"] and "can hold 3 values, outside the 0 to 2" in errors[0].message
    witness = errors[0].witness
    assert witness is not None  # verified by the engine: three flags for a list of at most two
    sc = sopgraph.load(text=FLAGS, check=False)
    with pytest.raises(DecideError, match="has 3 values; it holds at most 2"):
        interpret(sc, witness)
    fixed = FLAGS.replace("list[..2] of", "list[..3] of")
    assert [d for d in check_file("t.sop", text=fixed).diagnostics if d.is_error] == []
    sc = sopgraph.load(text=fixed)
    seg = {"flown": True, "cabin": "Biz"}
    assert _both(sc, {"Angry": True, "Segs": [seg]}).finals == {"Action": "Log", "Flags": ["Flown", "Business", "Upset"]}
    assert _both(sc, {"Angry": False, "Segs": [seg]}).finals == {"Action": "Log", "Flags": ["Flown"]}
    assert _both(sc, {"Angry": False, "Segs": [seg, {**seg, "flown": False}]}).finals == {"Action": "Log", "Flags": []}
    for p in iter_paths(sc):
        assert p.witness is not None and sopgraph.decide(sc, p.witness).finals == p.witness_finals
