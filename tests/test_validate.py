"""`sop validate`: typed columns, accuracy and confusion, mismatches grouped where the route parts
ways, and the nearest edits that explain them (on the shipped authoring example and small cases)."""

from __future__ import annotations

import csv
import datetime as dt
import itertools
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from sopgraph.authoring.validate import (
    ValidateError,
    _lookup,
    convert,
    decide_unknown,
    read_rows,
    render_text,
    validate,
)
from sopgraph.cli import main
from sopgraph.language import ir
from sopgraph.language.fmt import show_expr
from sopgraph.language.parse import load_source
from sopgraph.logic.engine import interpret

ROOT = Path(__file__).resolve().parent.parent
EX = ROOT / "examples" / "authoring"
COLUMNS = ["--expect", "Action=decision", "--expect", "Amount=amount", "--map", "Premium=premium_member",
           "--map", "FraudFlag=fraud_flag", "--map", "DaysLate=promised_date", "--map", "OrderValue=order_value",
           "--now", "2024-06-30"]


def _load(text: str) -> ir.Scenario:
    loaded = load_source(text=text, name="t.sop")
    assert loaded.scenario is not None, loaded.diagnostics
    return loaded.scenario


def test_draft_mismatches_are_explained_by_the_nearest_edits() -> None:
    result = CliRunner().invoke(main, ["validate", str(EX / "late_delivery_draft.sop"), "--data",
                                       str(EX / "late_delivery_decisions.csv"), *COLUMNS])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "90/120 rows agree" in out and "accuracy 75.0%" in out
    assert "18 rows expected PartialRefund, decided RefundShipping: parting at stage s3" in out
    assert ("`OrderValue >= 100` instead of `OrderValue > 100` at stage s3 explains 18/18 "
            "(breaks 3 matching rows: lines 14, 77, 105)") in out  # which rows an edit breaks, by data line
    assert "(late_delivery_decisions.csv lines 9, 11, 16," in out
    assert ("`when Premium -> do Voucher { Amount = 20 }` above `when OrderValue > 100 -> do PartialRefund "
            "{ Amount = OrderValue * 0.1 }` at stage s3 explains 12/12") in out  # as written in the file


def test_corrected_sop_agrees_with_every_row_and_gates_on_accuracy() -> None:
    runner = CliRunner()
    good = runner.invoke(main, ["validate", str(EX / "late_delivery.sop"), "--data",
                                str(EX / "late_delivery_decisions.csv"), *COLUMNS, "--min-accuracy", "1"])
    assert good.exit_code == 0 and "120/120" in good.output
    bad = runner.invoke(main, ["validate", str(EX / "late_delivery_draft.sop"), "--data",
                               str(EX / "late_delivery_decisions.csv"), *COLUMNS, "--min-accuracy", "0.9"])
    assert bad.exit_code == 1 and "below --min-accuracy" in bad.output


def test_json_report() -> None:
    result = CliRunner().invoke(main, ["validate", str(EX / "late_delivery_draft.sop"), "--data",
                                       str(EX / "late_delivery_decisions.csv"), *COLUMNS, "--format", "json"])
    report = json.loads(result.output)
    assert report["total"] == 120 and report["correct"] == 90
    assert report["confusion"]["Voucher"]["PartialRefund"] == 12
    first = report["groups"][0]
    assert first["stage"] == "s3" and first["candidates"][0]["fixes"] == first["candidates"][0]["group_size"]


@pytest.mark.parametrize("cell,vtype,unit,want", [
    ("120 CNY", ir.NumType(kind="float"), "CNY", 120.0),
    ("¥1,200.50", ir.NumType(kind="float"), "CNY", 1200.5),
    ("30 days", ir.NumType(kind="int"), "days", 30),
    ("7", ir.NumType(kind="int"), None, 7),
    ("yes", ir.BoolType(), None, True),
    ("FALSE", ir.BoolType(), None, False),
    ("calm", ir.EnumType(values=["Calm", "Angry"]), None, "Calm"),
    ("2024-06-20", ir.NumType(kind="int"), "days", 10),
    ("", ir.BoolType(), None, None),
])
def test_typed_cells(cell: str, vtype: object, unit: str | None, want: object) -> None:
    assert convert(cell, vtype, unit=unit, now=dt.date(2024, 6, 30)) == want


@pytest.mark.parametrize("cell,vtype,unit,message", [
    ("120 USD", ir.NumType(kind="float"), "CNY", "is in 'USD', the variable is in 'CNY'"),
    ("maybe", ir.BoolType(), None, "not a boolean"),
    ("Furious", ir.EnumType(values=["Calm", "Angry"]), None, "not one of Calm | Angry"),
    ("2024-06-20", ir.NumType(kind="int"), None, "give --now"),
])
def test_bad_cells_say_why(cell: str, vtype: object, unit: str | None, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("|", r"\|")):
        convert(cell, vtype, unit=unit, now=None)


def test_json_columns_and_jsonl_records(tmp_path: Path) -> None:
    assert _lookup({"order": '{"value": {"amount": 5}}'}, "order.value.amount") == 5
    scenario = _load("""
        system Amount: float
        action Small
        action Big
        stage s { when Amount < 100 -> do Small otherwise -> do Big }
    """)
    data = tmp_path / "rows.jsonl"
    rows = [{"order": {"amount": "99 EUR"}, "label": "Small"}, {"order": {"amount": 100}, "label": "Small"},
            {"order": {"amount": 150}, "label": "Big"}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    report = validate(scenario, read_rows(data), expect={"Action": "label"}, mapping={"Amount": "order.amount"})
    assert (report.total, report.correct) == (3, 2)
    (group,) = report.groups
    assert group.stage == "s" and group.rows == [2]
    assert group.candidates[0].after == "Amount <= 100" and group.candidates[0].fixes == 1


def test_match_values_and_lets_are_searched() -> None:
    scenario = _load("""
        field Tier: Gold | Silver | Bronze
        system Spent: int
        let Loyal = Spent >= 1000
        action Vip
        action Normal
        stage s1 { match Tier { Gold -> do Vip  Silver, Bronze -> s2 } }
        stage s2 { when Loyal -> do Vip otherwise -> do Normal }
    """)
    rows = [{"Tier": "Silver", "Spent": 10, "want": "Vip", "_line": 2},
            {"Tier": "Bronze", "Spent": 10, "want": "Normal", "_line": 3},
            {"Tier": "Bronze", "Spent": 800, "want": "Vip", "_line": 4},
            {"Tier": "Bronze", "Spent": 700, "want": "Normal", "_line": 5}]
    report = validate(scenario, rows, expect={"Action": "want"})
    (group,) = report.groups  # both parted at s2, the deepest stage that can still reach Vip
    assert group.stage == "s2" and group.rows == [2, 4]
    described = [c.describe() for c in group.candidates]
    assert "`Silver -> do Vip` instead of `Silver -> s2` at stage s1 explains 1/2" in described
    assert "`Spent >= 800` instead of `Spent >= 1000` at let Loyal explains 1/2" in described


def test_a_condition_the_decisions_do_not_follow_is_suggested_dropped() -> None:
    """The log hands every medium-risk report to a specialist, calm or not: the SOP's extra `and Mood ==
    Distressed` is the edit that explains the rows without breaking any (a flip of it breaks the others)."""
    scenario = _load("""
        field Mood: Calm | Distressed
        system Risk: int[0..10]
        action Specialist
        action Open
        stage s1 { when Risk >= 5 and Mood == Distressed -> do Specialist  otherwise -> do Open }
    """)
    rows = [{"Mood": "Calm", "Risk": 6, "want": "Specialist", "_line": 2},
            {"Mood": "Distressed", "Risk": 7, "want": "Specialist", "_line": 3},
            {"Mood": "Calm", "Risk": 2, "want": "Open", "_line": 4},
            {"Mood": "Distressed", "Risk": 1, "want": "Open", "_line": 5}]
    report = validate(scenario, rows, expect={"Action": "want"})
    (group,) = report.groups
    assert group.rows == [2]
    assert group.candidates[0].describe() == "`Risk >= 5` instead of `Risk >= 5 and Mood == Distressed` at stage s1 explains 1/1"


def test_budget_bounds_the_search() -> None:
    scenario = _load("""
        system N: int
        action A
        action B
        stage s { when N < 10 -> do A otherwise -> do B }
    """)
    rows = [{"N": n, "want": "A" if n < 17 else "B", "_line": n} for n in range(30)]
    report = validate(scenario, rows, expect={"Action": "want"}, budget=2)
    (group,) = report.groups
    assert group.budget_hit and group.tried == 2
    full = validate(scenario, rows, expect={"Action": "want"})
    assert full.groups[0].candidates[0].after == "N <= 16" and full.groups[0].candidates[0].fixes == 7


def test_errors_are_messages_not_tracebacks(tmp_path: Path) -> None:
    scenario = _load("system N: int\naction A\nstage s { -> do A }")
    with pytest.raises(ValidateError, match="--expect Action=COLUMN"):
        validate(scenario, [{"N": 1}], expect={})
    with pytest.raises(ValidateError, match="column `nope`"):
        validate(scenario, [{"N": 1}], expect={"Action": "nope"})
    with pytest.raises(ValidateError, match="not a field or system variable"):
        validate(scenario, [{"N": 1, "a": "A"}], expect={"Action": "a"}, mapping={"Zed": "N"})
    result = CliRunner().invoke(main, ["validate", str(EX / "late_delivery.sop"), "--data",
                                       str(tmp_path / "missing.csv"), "--expect", "Action=x"])
    assert result.exit_code == 2 and "cannot read" in result.output and "Traceback" not in result.output


def test_rows_that_cannot_be_decided_are_listed(tmp_path: Path) -> None:
    data = tmp_path / "d.csv"
    data.write_text("N,want\nabc,A\n,A\n", encoding="utf-8")
    scenario = _load("system N: int\naction A\naction B\nstage s { when N > 0 -> do A otherwise -> do B }")
    report = validate(scenario, read_rows(data), expect={"Action": "want"})
    assert report.correct == 0
    assert [e["line"] for e in report.errors] == [2, 3]
    assert "not a number" in report.errors[0]["error"] and "missing value for `N`" in report.errors[1]["error"]


def test_round_thresholds_observed_looks_and_optional_columns() -> None:
    """Past decisions made with `Waited > 90` on fractional values: the top suggestion is the round
    `> 90`, not a row's value; an observed variable's cell is its looks (a list, or one value);
    an optional variable without a column is not reported as missing."""
    scenario = _load("""
        system Waited: float[0..400]
        system Answer: Yes | No
        system Note: string?
        action Late
        action Ask
        action Done
        stage s1 { when Waited > 120 -> do Late otherwise -> do Ask -> s2 }
        stage s2 { observe Answer
          when Answer == Yes -> do Done
          when Answer == No -> do Ask -> s2 up to 1 times
          otherwise -> do Late }
    """)
    waits = [10.4, 60.2, 89.6, 93.3, 97.8, 104.1, 111.9, 130.5, 150.25, 199.0]
    rows = [{"Waited": w, "Answer": json.dumps(["No", "Yes"]) if i % 2 else "Yes",
             "want": "Late" if w > 90 else "Done", "_line": i + 2} for i, w in enumerate(waits)]
    report = validate(scenario, rows, expect={"Action": "want"})
    assert report.errors == [] and report.unmapped == []
    assert report.correct == len(rows) - 4  # 93.3 .. 111.9 were decided late under 90 days
    (group,) = report.groups
    assert group.candidates[0].describe() == "`Waited > 90` instead of `Waited > 120` at stage s1 explains 4/4"


SAGE_VECTORS = ROOT / "tests" / "data" / "sage_vectors"


@pytest.mark.parametrize("name", ["telecom_package", "airline_refund", "property_service"])
def test_sage_vector_files_validate_without_options(name: str) -> None:
    """A SAGE-style vectors file (a JSON array; values under `classification` and `system`, the answer in
    `finals`, the stage path in `expected_path`) is read as it is: columns found by name, paths compared."""
    result = CliRunner().invoke(main, ["validate", str(ROOT / "scenarios" / f"{name}.sop"), "--data",
                                       str(SAGE_VECTORS / f"{name}.vectors.json"), "--format", "json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    count = len(json.loads((SAGE_VECTORS / f"{name}.vectors.json").read_text(encoding="utf-8")))
    assert report["total"] == report["correct"] == count
    assert report["expect"]["Action"] == "finals.Action" and "Action" in report["found"]
    assert (report["path_column"], report["paths_compared"], report["paths_agree"]) == ("expected_path", count, count)


def test_json_array_rows_keep_their_lines_and_errors_name_them(tmp_path: Path) -> None:
    data = tmp_path / "v.json"
    data.write_text('[\n  {"N": 1},\n\n  {"N": 2,\n   "M": 3}\n]\n', encoding="utf-8")
    assert [(r["N"], r["_line"]) for r in read_rows(data)] == [(1, 2), (2, 4)]
    data.write_text("[]", encoding="utf-8")
    assert read_rows(data) == []
    for text, message in [('[\n{"N": 1},\n{"N": }\n]', "v.json:3: invalid JSON"),
                          ('[\n{"N": 1}\n{"N": 2}]', "v.json:3: expected `,` or `]`"),
                          ('[{"N": 1}] x', "unexpected text after"),
                          ('[\n1]', "v.json:2: expected a JSON object"),
                          ('[{"N": 1},', "not closed"),
                          ("[" + "[" * 100_000 + "]" * 100_000 + "]", "nested too deeply")]:
        data.write_text(text, encoding="utf-8")
        with pytest.raises(ValidateError, match=message):
            read_rows(data)


def test_nested_columns_not_applicable_cells_and_stage_paths(tmp_path: Path) -> None:
    scenario = _load("""
        field Mood: Calm | Angry | None
        system Vip: bool
        action A
        action B
        stage s1 { when Mood == Angry -> s2 otherwise -> do A }
        stage s2 { when Vip -> do A otherwise -> do B }
    """)
    rows = [{"c": {"Mood": "Calm"}, "sys": {"Vip": "N/A"}, "out": {"action": "A"}, "path": "s1"},
            {"c": {"Mood": "None"}, "sys": {"Vip": None}, "out": {"action": "A"}, "path": ["s1", "done"]},
            {"c": {"Mood": "Angry"}, "sys": {"Vip": "no"}, "out": {"action": "B"}, "path": "s1 -> s2"},
            {"c": {"Mood": "Angry"}, "sys": {"Vip": "-"}, "out": {"action": "B"}, "path": "s1, s2"}]
    report = validate(scenario, [{**r, "_line": i + 1} for i, r in enumerate(rows)], expect={})
    assert report.expect == {"Action": "out.action"} and report.found == ["Action"]
    assert report.correct == 3  # "N/A" and "-" are blanks; the enum value None stays a value
    assert report.errors == [{"line": 4, "error": report.errors[0]["error"]}]
    assert "missing value for `Vip`" in report.errors[0]["error"]
    assert (report.paths_compared, report.paths_agree) == (3, 2)
    assert report.path_mismatches == [{"line": 2, "expected": ["s1", "done"], "decided": ["s1"]}]
    from sopgraph.authoring.validate import render_text
    text = render_text(report)
    assert "expected finals read from `out.action` (Action)" in text
    assert "line 2: expected s1 → done, decided s1 (`done` not a stage)" in text
    with pytest.raises(ValidateError, match="no column is named Action"):
        validate(scenario, [{"Mood": "Calm", "want": "A"}], expect={})


def test_outputs_found_by_name_are_compared_only_where_given() -> None:
    scenario = _load("""
        system N: int
        output Fee: int
        action A
        stage s { when N > 0 -> do A { Fee = N } otherwise -> do A { Fee = 0 } }
    """)
    rows = [{"N": 5, "Action": "A", "Fee": 5, "_line": 1}, {"N": 2, "Action": "A", "_line": 2},
            {"N": 3, "Action": "A", "Fee": 4, "_line": 3}]
    report = validate(scenario, rows, expect={})
    assert report.found == ["Action", "Fee"] and report.correct == 2
    assert [g.rows for g in report.groups] == [[3]]


def test_a_log_written_as_a_business_keeps_one(tmp_path: Path) -> None:
    """Column names with spaces (`Account frozen` for `AccountFrozen`), values and actions in words
    (`not received`, `open dispute`), and `--now` feeding the program's own `now`."""
    scenario = _load("""
        field Status: Received | NotReceived "s"
        system AccountFrozen: bool "f"
        system TxDate: date "t"
        action OpenDispute "o"
        action Refuse "r"
        stage s {
            when AccountFrozen -> do Refuse
            when Status == NotReceived and days_between(TxDate, now) <= 120 -> do OpenDispute
            otherwise -> do Refuse
        }
    """)
    data = tmp_path / "log.csv"
    data.write_text("status,Account frozen,tx date,decision\nnot received,no,2026-01-10,open dispute\n"
                    "Not-Received,no,2025-06-01,refuse\nreceived,yes,2026-01-10,REFUSE\n", encoding="utf-8")
    report = validate(scenario, read_rows(data), expect={"Action": "decision"}, now=dt.date(2026, 3, 1))
    assert (report.correct, report.total, report.unmapped, report.errors) == (3, 3, [], [])


def test_a_csv_log_with_an_action_taken_column_and_blank_outputs(tmp_path: Path) -> None:
    """A business log names its decision column `Action taken` and leaves an output blank where it does
    not apply: the column is found, a blank (or N/A) output cell is not compared, and a row whose action
    agrees but whose output differs says which output (it read "expected A, decided A")."""
    scenario = _load("""
        system N: int
        output Fee: int = 0
        action A
        action B
        stage s { when N > 5 -> do A { Fee = N } otherwise -> do B }
    """)
    data = tmp_path / "log.csv"
    data.write_text("n,Action taken,fee\n7,A,7\n2,B,\n1,b,N/A\n9,A,8\n", encoding="utf-8")
    report = validate(scenario, read_rows(data), expect={})
    assert report.found == ["Fee", "Action"] or report.found == ["Action", "Fee"]
    assert (report.correct, report.total, report.errors) == (3, 4, [])
    assert [(g.expected, g.decided, g.rows) for g in report.groups] == [("A (Fee 8)", "A (Fee 9)", [5])]
    two = tmp_path / "two.csv"
    two.write_text("n,action taken,final action\n7,A,A\n", encoding="utf-8")
    with pytest.raises(ValidateError, match="no one column is named like it"):
        validate(scenario, read_rows(two), expect={})


# --------------------------------------------------------------------------------------------- bad data files


@pytest.mark.timeout(60)  # the old reader blocked for ever on a FIFO
def test_data_that_is_not_a_regular_file_is_refused_in_one_line(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.csv"
    os.mkfifo(fifo)
    for target in (fifo, Path("/dev/zero")):
        with pytest.raises(ValidateError, match="not a regular file"):
            read_rows(target)
    result = CliRunner().invoke(main, ["validate", str(EX / "late_delivery.sop"), "--data", str(fifo), *COLUMNS])
    assert result.exit_code == 2 and "not a regular file" in result.output and "Traceback" not in result.output


def test_a_data_file_over_the_size_bound_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sopgraph.authoring import validate as module

    data = tmp_path / "d.csv"
    data.write_text("N,want\n" + "1,A\n" * 100, encoding="utf-8")
    monkeypatch.setattr(module, "MAX_DATA_BYTES", 100)
    with pytest.raises(ValidateError, match=r"too large \(407 bytes; at most 100\)"):
        read_rows(data)


@pytest.mark.parametrize("body,where", [
    ("1,A\n2," + "x" * 200_000 + "\n", "d.csv:3: column 2: a cell longer than 131,072"),
    ('1,A\n2,"A\n3,B\n' + "x" * 200_000 + "\n", "d.csv:3: column 2: a cell longer than 131,072"),
    ("x" * 200_000 + ",A\n", "d.csv:2: column 1: a cell longer"),
])
def test_an_overlong_csv_cell_names_its_line_and_column(tmp_path: Path, body: str, where: str) -> None:
    data = tmp_path / "d.csv"
    data.write_text("N,want\n" + body, encoding="utf-8")
    with pytest.raises(ValidateError, match=where) as info:
        read_rows(data)
    assert "never closed" in str(info.value)
    assert csv.field_size_limit() == 131_072  # the process-wide limit is left alone


def test_data_that_is_not_utf8_names_its_line(tmp_path: Path) -> None:
    data = tmp_path / "d.csv"
    data.write_bytes(b"N,want\n1,A\n2,\xff\n")
    with pytest.raises(ValidateError, match=r"d.csv:3: not UTF-8 text"):
        read_rows(data)


def test_an_empty_expected_output_matches_none_and_an_empty_label_is_missing(tmp_path: Path) -> None:
    """`output Plan: ... | none = none` decided `none` agrees with an empty `plan` cell (it read 2/4 with an
    all-diagonal confusion matrix); an output without a default agrees with an empty cell too; a row
    whose expected action is empty is reported as missing, not counted as a blank action of its own."""
    scenario = _load("""
        system N: int
        output Plan: Basic | Gold | none = none
        output Note: Short | Long
        action Sell
        action Skip
        stage s { when N > 5 -> do Sell { Plan = Gold, Note = Long } otherwise -> do Skip }
    """)
    data = tmp_path / "log.csv"
    data.write_text("n,decision,plan,note\n7,Sell,Gold,Long\n2,Skip,,\n1,skip,,\n3,,,\n9,Sell,,Long\n",
                    encoding="utf-8")
    report = validate(scenario, read_rows(data), expect={"Action": "decision", "Plan": "plan", "Note": "note"})
    assert (report.correct, report.total) == (3, 5)
    assert report.errors == [{"line": 5, "error": "column `decision`: no expected action (the cell is empty)"}]
    assert "" not in report.labels and report.confusion["(missing)"] == {"(error)": 1}
    assert [(g.expected, g.decided, g.rows) for g in report.groups] == [("Sell (Plan none)", "Sell (Plan Gold)", [6])]


def test_a_program_reading_now_without_now_says_to_give_now(tmp_path: Path) -> None:
    """Without `--now` the report said "no column for: now (… use --map …)" and each row "or with `sop
    decide --now …`": the way to give it here is `--now`, which takes a datetime as `sop decide` does."""
    sop = tmp_path / "due.sop"
    sop.write_text("system TxDate: date\naction Open\naction Refuse\n"
                   "stage s { when days_between(TxDate, now) >= 31 -> do Refuse otherwise -> do Open }\n",
                   encoding="utf-8")
    data = tmp_path / "rows.csv"
    data.write_text("TxDate,decision\n2026-01-30,Open\n2026-01-29,Refuse\n", encoding="utf-8")
    args = ["validate", str(sop), "--data", str(data), "--expect", "Action=decision"]
    out = CliRunner().invoke(main, args).output
    assert "no column for" not in out and "sop decide" not in out
    assert "no value for `now`, the program's reference time (never the clock): give --now 2026-11-23T10:00" in out
    assert "line 2: missing value for `now` (needed at s): the program reads the current time" in out
    assert "give it with --now 2026-11-23T10:00 (or --map now=COLUMN)" in out
    good = CliRunner().invoke(main, [*args, "--now", "2026-03-01T10:00"])
    assert good.exit_code == 0 and "2/2 rows agree" in good.output
    assert validate(_load(sop.read_text()), read_rows(data), expect={"Action": "decision"},
                    now=dt.datetime(2026, 3, 1, 10, 0)).correct == 2


SUSPEND = """scenario suspend "Account suspension"

field Risk: Low | Medium | High
    "The risk tier."
system Amount: int[0..1000] unit "EUR"
    "The amount at stake."
system Strikes: int[0..10]
    "Earlier strikes."

let Big = Amount > 500 and Strikes >= 2
    "A big case."

action "Temporary Suspension" "Suspend the account for a while." [irreversible]
action Review "Send to review."
action Close "Close the report."

stage s1 "Triage" {
    match Risk {
        Low -> low
        Medium, High -> do "Temporary Suspension"
    }
}

stage low "Low risk" {
    when Big -> do Review
    when Strikes > 5 -> do "Temporary Suspension"
    otherwise -> do Close
}
"""


def _candidate_program(scenario: ir.Scenario, group_stage: str, kind: str, text: str) -> str:
    """The SOP with one more stage that uses a candidate's text where that kind of text goes."""
    stage = scenario.stages[group_stage]
    if kind == "match-value":
        body = f"match {show_expr(stage.subject)} {{\n        {text}\n        otherwise -> do Close\n    }}"
    elif kind == "arm-order":
        body = f"{text}\n    otherwise -> do Close"
    else:
        body = f"when {text} -> do Close\n    otherwise -> do Close"
    return SUSPEND + f"\nstage probe {{\n    {body}\n}}\n"


def test_every_printed_candidate_is_valid_sop_text() -> None:
    """`Medium -> low` instead of `Medium -> do Temporary Suspension`: the action name has a space and was
    printed bare, which is not `.sop` (it is written `do "Temporary Suspension"`). Every candidate's text
    is put where such text goes in a program and the program must load without errors."""
    scenario = _load(SUSPEND)
    rows = [{"Risk": "Medium", "Amount": 10, "Strikes": 0, "want": "Close"},
            {"Risk": "Low", "Amount": 600, "Strikes": 6, "want": "Temporary Suspension"},
            {"Risk": "Low", "Amount": 700, "Strikes": 1, "want": "Review"},
            {"Risk": "Low", "Amount": 10, "Strikes": 1, "want": "Close"},
            {"Risk": "High", "Amount": 10, "Strikes": 0, "want": "temporary suspension"}]
    report = validate(scenario, [{**r, "_line": i + 2} for i, r in enumerate(rows)], expect={"Action": "want"})
    candidates = [(g.stage, c) for g in report.groups for c in g.candidates]
    kinds = {c.kind for _, c in candidates}
    assert {"match-value", "arm-order", "threshold"} <= kinds, kinds
    shown = render_text(report)
    assert '`Medium -> low` instead of `Medium -> do "Temporary Suspension"`' in shown
    for stage, c in candidates:
        for text in (c.before, c.after):
            loaded = load_source(text=_candidate_program(scenario, stage, c.kind, text), name="probe.sop")
            errors = [d for d in loaded.diagnostics if d.is_error]
            assert errors == [], (c.kind, text, [d.message for d in errors])


def test_a_variable_without_a_column_gets_a_did_you_mean(tmp_path: Path) -> None:
    """`no column for: OutageFound` named no column although the data has `outage_detected`: columns are
    suggested by the folded names (case, `_`, spaces ignored) and shared words, never one already used."""
    scenario = _load("""
        system OutageFound: bool
        system Premium: bool
        system Region: North | South
        action Credit
        action Apologise
        stage s { when OutageFound or Premium -> do Credit otherwise -> do Apologise }
    """)
    data = tmp_path / "log.csv"
    data.write_text("outage_detected,premium member,regions,Region,decision\nyes,no,x,North,Credit\n",
                    encoding="utf-8")
    report = validate(scenario, read_rows(data), expect={"Action": "decision"})
    assert report.unmapped == ["OutageFound", "Premium"]
    assert report.suggest == {"OutageFound": ["outage_detected"], "Premium": ["premium member"]}
    text = render_text(report)
    assert "did you mean --map OutageFound=outage_detected?" in text
    assert "did you mean --map 'Premium=premium member'?" in text


def test_an_edit_found_for_several_groups_is_printed_once_with_its_groups() -> None:
    """`Strikes <= 2` at let Big explains the rows of two groups: it was printed in full under both; now
    it is printed once, naming the other group, and the other group refers to it."""
    scenario = _load(SUSPEND)
    rows = [{"Risk": "Low", "Amount": 700, "Strikes": 1, "want": "Review"},
            {"Risk": "Low", "Amount": 600, "Strikes": 6, "want": "Temporary Suspension"}]
    report = validate(scenario, [{**r, "_line": i + 2} for i, r in enumerate(rows)], expect={"Action": "want"})
    shared = [(n, c) for n, g in enumerate(report.groups, 1) for c in g.candidates if c.after == "Strikes <= 2"]
    assert [n for n, _ in shared] == [1, 2] and all(c.groups == [1, 2] for _, c in shared)
    text = render_text(report)
    assert text.count("`Strikes <= 2` instead of `Strikes >= 2`") == 1
    assert ("`Strikes <= 2` instead of `Strikes >= 2` at let Big explains 1/1; the same edit explains rows of "
            "group 2") in text
    assert "  - the edit of group 1 at let Big explains 1/1 here" in text
    assert "\n1. 1 row expected Review, decided Close: parting at stage low" in text


def test_lets_read_only_by_outputs_are_searched() -> None:
    """The voucher amount comes from `let Bonus = case { when Spent > 1000 -> 20 otherwise -> 5 }`, read
    only by the output assignment: the log pays 20 from 700 on. The let and the assignment are edit sites
    now (they were never tried: "no single edit of s explains these rows")."""
    scenario = _load("""
        system Tier: Gold | Silver
        system Spent: int[0..10000]
        let Bonus = case { when Spent > 1000 -> 20 otherwise -> 5 }
        output Amount: int = 0
        action Voucher
        action Nothing
        stage s { when Tier == Gold -> do Voucher { Amount = Bonus } otherwise -> do Nothing }
    """)
    spent = [100, 650, 720, 800, 950, 1200, 3000]
    rows = [{"Tier": "Gold", "Spent": n, "want": "Voucher", "amount": 20 if n > 700 else 5, "_line": i + 2}
            for i, n in enumerate(spent)]
    report = validate(scenario, rows, expect={"Action": "want", "Amount": "amount"})
    (group,) = report.groups
    assert (group.stage, group.rows) == ("s", [4, 5, 6])
    best = group.candidates[0]
    assert (best.where, best.after, best.fixes, best.breaks) == ("let Bonus", "Spent > 700", 3, 0)


ESCALATE = """
system Severity: int[0..10]
system EscalationTeam: Billing | Tech
action Resolve
action ToBilling
action ToTech
stage s1 { when Severity > 5 -> s2 otherwise -> do Resolve }
stage s2 { match EscalationTeam { Billing -> do ToBilling  Tech -> do ToTech } }
"""


def test_a_wrong_route_into_a_stage_whose_column_is_empty_is_still_explained(tmp_path: Path) -> None:
    """The log fills `EscalationTeam` only where a case was really escalated. The SOP escalates from
    severity 6 on, the log from 8: rows of severity 6 and 7 stopped at s2 for lack of `EscalationTeam`
    and were listed as "could not be decided" with nothing proposed. Decided as far as they go, no team
    leads from s2 to Resolve: they part at s1 and `Severity > 7` explains them. A row that lacks the team
    where it could decide (expected ToTech) stays a row that could not be decided."""
    data = tmp_path / "log.csv"
    lines = ["severity,escalationteam,decision"]
    lines += [f"{n},,Resolve" for n in (1, 3, 5, 6, 6, 7, 7)]
    lines += [f"{n},{t},To{t}" for n, t in ((8, "Billing"), (9, "Tech"), (10, "Tech"))]
    lines += ["9,,ToTech"]
    data.write_text("\n".join(lines) + "\n", encoding="utf-8")
    report = validate(_load(ESCALATE), read_rows(data), expect={"Action": "decision"})
    assert (report.correct, report.total) == (6, 11)
    assert [e["line"] for e in report.errors] == [12] and "EscalationTeam" in report.errors[0]["error"]
    (group,) = report.groups
    assert (group.stage, group.expected, group.decided, group.rows) == ("s1", "Resolve", "(needs EscalationTeam)",
                                                                         [5, 6, 7, 8])
    assert group.stopped == ["s2 (EscalationTeam)"]
    best = group.candidates[0]
    assert (best.after, best.fixes, best.breaks) == ("Severity > 7", 4, 0)
    assert report.confusion["Resolve"] == {"Resolve": 3, "(needs EscalationTeam)": 4}
    text = render_text(report)
    assert "1. 4 rows expected Resolve, decided (needs EscalationTeam): parting at stage s1" in text
    assert "the route stops at s2 (EscalationTeam)" in text
    assert "`Severity > 7` instead of `Severity > 5` at stage s1 explains 4/4" in text
    no_column = tmp_path / "short.csv"  # the log has no team column at all
    no_column.write_text("severity,decision\n1,Resolve\n6,Resolve\n7,Resolve\n", encoding="utf-8")
    short = validate(_load(ESCALATE), read_rows(no_column), expect={"Action": "decision"})
    assert short.unmapped == ["EscalationTeam"] and short.errors == []
    assert [(g.stage, g.rows, g.candidates[0].after) for g in short.groups] == [("s1", [3, 4], "Severity > 7")]


def test_a_missing_input_is_unknown_where_every_value_of_it_decides_alike() -> None:
    """`when Team == Tech and Severity > 5` cannot hold at severity 3 whatever the team is: the row is
    decided (it stopped as "missing value for `Team`" though no team changes its route); where the team
    does matter the row still stops, naming it. An edit is scored the same way, so such a row is not
    counted as broken by every edit."""
    scenario = _load("""
        system Severity: int[0..10]
        system Team: Billing | Tech
        let Urgent = not (Severity <= 5 or Team == Billing)
        action Resolve
        action ToTech
        action Hold
        stage s1 { when Team == Tech and Severity > 5 -> do ToTech  otherwise -> s2 }
        stage s2 { when Urgent -> do Hold  when Severity > 2 -> do Hold  otherwise -> do Resolve }
    """)
    rows = [{"Severity": 1, "want": "Resolve", "_line": 2},
            {"Severity": 4, "want": "Resolve", "_line": 3},
            {"Severity": 7, "want": "ToTech", "_line": 4},
            {"Severity": 7, "Team": "Tech", "want": "ToTech", "_line": 5}]
    report = validate(scenario, rows, expect={"Action": "want"})
    assert report.correct == 2
    assert [e["line"] for e in report.errors] == [4] and "missing value for `Team`" in report.errors[0]["error"]
    (group,) = report.groups
    assert (group.stage, group.decided, group.rows) == ("s2", "Hold", [3])
    best = group.candidates[0]
    assert (best.after, best.fixes, best.breaks) == ("Severity > 4", 1, 0)


def test_the_action_column_is_found_by_its_words() -> None:
    """The card dispute log has `Outcome` and `Transaction date`: "transaction" contains "action", so no
    one column was named like the action and `--expect` was required."""
    from sopgraph.authoring.validate import _action_like

    columns = ["Case ref", "Transaction date", "Outcome", "Credited"]
    assert _action_like(columns, set()) == "Outcome"
    assert _action_like(["actiontaken", "n"], set()) == "actiontaken"
    assert _action_like(["Final action", "FinalDecision"], set()) is None  # two: the user chooses
    result = CliRunner().invoke(main, ["validate", str(EX / "card_dispute.sop"), "--data",
                                       str(EX / "card_dispute_decisions.csv"), "--format", "json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["expect"]["Action"] == "Outcome"


def test_an_output_that_reads_a_missing_input_is_unknown_not_the_decision() -> None:
    """`do Voucher { Amount = Spent * 2 }` for a row without `Spent`: the action is decided whatever the
    amount, so a row that only expects the action agrees and one expecting another action disagrees (it
    failed as "missing value for `Spent`"); a row that expects the amount cannot be decided."""
    scenario = _load("""
        system Tier: Gold | Silver
        system Spent: int[0..100]
        output Amount: int = 0
        action Voucher
        action Nothing
        stage s { when Tier == Gold -> do Voucher { Amount = Spent * 2 } otherwise -> do Nothing }
    """)
    rows = [{"Tier": "Gold", "want": "Voucher", "_line": 2}, {"Tier": "Gold", "want": "Nothing", "_line": 3},
            {"Tier": "Silver", "want": "Nothing", "_line": 4}]
    report = validate(scenario, rows, expect={"Action": "want"})
    assert (report.correct, report.errors) == (2, [])
    (group,) = report.groups
    assert (group.expected, group.decided, group.rows) == ("Nothing", "Voucher", [3])
    assert group.candidates[0].after == "Tier != Gold"
    amounts = [{**r, "amount": 8} for r in rows[:1]]
    report = validate(scenario, amounts, expect={"Action": "want", "Amount": "amount"})
    assert report.correct == 0 and "missing value for `Spent`" in report.errors[0]["error"]


KLEENE = """
system A: bool
system B: bool
system C: Low | Mid | High
system N: int[0..3]
let X = A and not B
let Y = C == High or N > 1
action P
action Q
action R
action S
stage s1 { when X or Y -> s2  when B and N == 0 -> do P  otherwise -> s3 }
stage s2 { match C { Low -> do Q  Mid, High -> s3 } }
stage s3 { when not A and N >= 2 -> do R  when (B or C == Low) and N < 3 -> do S  otherwise -> do P }
"""
DOMAINS: dict[str, list[object]] = {"A": [False, True], "B": [False, True], "C": ["Low", "Mid", "High"],
                                    "N": [0, 1, 2, 3]}


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.fixed_dictionaries({k: st.one_of(st.none(), st.sampled_from(v)) for k, v in DOMAINS.items()}))
def test_a_row_decided_with_unknowns_is_decided_alike_by_every_value_of_them(values: dict[str, object]) -> None:
    """Soundness of taking a missing input as unknown: when a row with inputs left out is decided, every
    way of filling them in is decided the same by the engine (route and action)."""
    scenario = _load(KLEENE)
    given_values = {k: v for k, v in values.items() if v is not None}
    found = decide_unknown(scenario, given_values)
    if found.decision is None:
        assert found.stopped is not None and found.stopped.variable in set(DOMAINS) - set(given_values)
        return
    open_names = [k for k in DOMAINS if k not in given_values]
    for filled in itertools.product(*(DOMAINS[k] for k in open_names)):
        full = interpret(scenario, {**given_values, **dict(zip(open_names, filled, strict=True))})
        assert (full.path, full.finals["Action"]) == (found.decision.path, found.decision.finals["Action"])


def test_a_mistyped_map_names_the_column_or_variable_it_meant() -> None:
    scenario = _load("system OutageFound: bool\naction A\naction B\nstage s { when OutageFound -> do A otherwise -> do B }")
    rows = [{"outage_detected": "yes", "decision": "A", "_line": 2}]
    with pytest.raises(ValidateError, match=r"column `outage_detect` \(for OutageFound\) is not in the data "
                                            r"\(did you mean `outage_detected`\?\)"):
        validate(scenario, rows, expect={"Action": "decision"}, mapping={"OutageFound": "outage_detect"})
    with pytest.raises(ValidateError, match=r"`Outage` is not a field or system variable of the SOP "
                                            r"\(did you mean `OutageFound`\?\)"):
        validate(scenario, rows, expect={"Action": "decision"}, mapping={"Outage": "outage_detected"})


def test_a_row_left_with_an_unknown_output_names_that_output_s_input() -> None:
    scenario = _load("""
        system Severity: int[0..10]
        system Team: Billing | Tech
        system Spent: int[0..100]
        output Amount: int = 0
        action Hold
        action Voucher
        stage s1 { when Team == Tech and Severity > 5 -> do Hold  otherwise -> s2 }
        stage s2 { -> do Voucher { Amount = Spent * 2 } }
    """)
    rows = [{"Severity": 1, "want": "Voucher", "amount": 8, "_line": 2}]
    report = validate(scenario, rows, expect={"Action": "want", "Amount": "amount"})
    assert report.errors == [{"line": 2, "error": "missing value for `Spent` (needed for the outputs of s2)"}]
    assert validate(scenario, rows, expect={"Action": "want"}).correct == 1


def test_json_lines_break_at_newlines_only(tmp_path: Path) -> None:
    """A raw U+2028 or U+0085 inside a JSON string is no line break (it was: "invalid JSON")."""
    data = tmp_path / "rows.jsonl"
    data.write_text('{"N": 1, "note": "a\u2028b\u0085c"}\r\n{"N": 2}\n', encoding="utf-8")
    assert [(r["N"], r["_line"]) for r in read_rows(data)] == [(1, 1), (2, 2)]
    data.write_text('{"N": 1}\n{"N": 2} {"N": 3}\n', encoding="utf-8")
    with pytest.raises(ValidateError, match=r"rows.jsonl:2: unexpected text after the JSON object"):
        read_rows(data)  # the third object was dropped without a word


@pytest.mark.timeout(60)  # the number pattern backtracked for minutes on a long cell of spaces
def test_hostile_cells_are_row_errors_with_short_messages(tmp_path: Path) -> None:
    """A cell nested 100,000 deep (a RecursionError traceback) or 100,000 spaces and a letter in a
    numeric column (the number pattern backtracked without end) is a row error quoting the cell cut short."""
    scenario = _load("""
        system N: float
        system Looks: list of bool
        action A
        action B
        stage s { when N > 1 -> do A otherwise -> do B }
    """)
    deep = "[" * 100_000 + "]" * 100_000
    rows = [{"N": " " * 100_000 + "x", "want": "A", "_line": 2}, {"N": 2, "Looks": deep, "want": "A", "_line": 3}]
    report = validate(scenario, rows, expect={"Action": "want"})
    messages = [e["error"] for e in report.errors]
    assert [e["line"] for e in report.errors] == [2, 3]
    assert "is not a number" in messages[0] and "is not JSON" in messages[1]
    assert all(len(m) < 300 for m in messages), messages
    assert _lookup({"order": deep}, "order.n") is None
