"""Reads of optional values (`sopgraph.logic.optcheck`): W306 when some feasible path reads an optional value
while it is missing (a verified example), nothing when every path is guarded, I303 when the budget runs out."""

from __future__ import annotations

from pathlib import Path

import pytest

from sopgraph.language import ir
from sopgraph.language.parse import load_source
from sopgraph.logic import optcheck
from sopgraph.logic.checker import check
from sopgraph.logic.engine import DecideError, run
from sopgraph.logic.optcheck import optional_read_diagnostics
from sopgraph.logic.paths import iter_paths

ROOT = Path(__file__).resolve().parent.parent

HEAD = """scenario opt "Optional values"
field Want: Refund | Other "What the caller wants."
system Voucher: float? "Value of a voucher on file, if any."
system Fee: float[0..) "The fee."
system Code: string? "A promotion code, if any."
action Pay(amount: float) "Pay."
action Stop "Stop."
"""


def scenario(body: str) -> ir.Scenario:
    loaded = load_source(None, text=HEAD + body, name="t.sop")
    assert loaded.scenario is not None, [d.message for d in loaded.diagnostics]
    return loaded.scenario


def w306(body: str) -> list:
    diags = optional_read_diagnostics(scenario(body))
    assert all(d.code in ("W306", "I303") for d in diags)
    assert not [d for d in diags if d.code == "I303"], [d.message for d in diags]
    return [d for d in diags if d.code == "W306"]


def test_every_path_guarded_gives_no_warning() -> None:
    body = """
stage s1 "first" {
    when Want == Other -> do Stop
    otherwise -> s2
}
stage s2 "second" {
    when missing(Voucher) -> do Pay(amount = Fee)
    when Voucher > 10 -> do Pay(amount = Voucher)
    otherwise -> s3
}
stage s3 "third" {
    when missing(Code) or Code == "VIP" -> do Stop
    when Voucher > Fee -> do Stop
    otherwise -> do Pay(amount = Fee)
}
"""
    assert w306(body) == []


def test_unguarded_read_is_located_and_its_example_is_refused_by_the_engine() -> None:
    body = """
stage s1 "first" {
    when Want == Other -> do Stop
    when Voucher > 10 -> do Pay(amount = Voucher)
    otherwise -> do Pay(amount = Fee)
}
"""
    (d,) = w306(body)
    assert d.severity == "warning"
    assert (d.span.line, d.span.col) == (11, 10)  # the `Voucher` of the second guard
    assert "`Voucher` is optional and may be read while it is missing" in d.message
    assert "missing(Voucher)" in (d.hint or "")
    assert d.witness["Voucher"] is None and d.witness["Want"] == "Refund"
    with pytest.raises(DecideError, match="`Voucher` is missing"):
        run(scenario(body), d.witness)


def test_partially_guarded_reports_only_the_unguarded_path() -> None:
    body = """
stage s1 "first" {
    when Want == Other -> s3
    otherwise -> s2
}
stage s2 "second" {
    when missing(Voucher) -> do Pay(amount = Fee)
    otherwise -> s3
}
stage s3 "third" {
    when Fee > 5 and Voucher > Fee -> do Stop
    otherwise -> do Pay(amount = Voucher)
}
"""
    found = w306(body)
    assert [(d.span.line, d.span.col) for d in found] == [(18, 22), (19, 34)]
    for d in found:
        assert d.witness["Want"] == "Other"  # only the path around the test reaches s3 with it missing
        assert d.notes == ["reached via s1 -> s3"]
    assert found[0].witness["Fee"] > 5  # `and` stops before the read when Fee <= 5
    assert "output" not in found[1].message and "argument `amount` of `do Pay`" in found[1].message


def test_short_circuit_case_and_derived_variables() -> None:
    guarded = """
let Credit = case { when missing(Voucher) -> 0 otherwise -> Voucher }
stage s1 "first" {
    when Credit > Fee -> do Stop
    otherwise -> do Pay(amount = Fee - Credit)
}
"""
    assert w306(guarded) == []
    unguarded = """
let Credit = Voucher * 2
stage s1 "first" {
    when Want == Other -> do Stop
    when Credit > Fee -> do Stop
    otherwise -> do Pay(amount = Fee)
}
"""
    (d,) = w306(unguarded)
    assert (d.span.line, d.span.col) == (12, 10)  # the derived variable that reads it


def test_defaults_are_never_missing() -> None:
    text = HEAD.replace("system Voucher: float?", "system Voucher: float = 0") + """
stage s1 "first" { when Voucher > Fee -> do Stop  otherwise -> do Pay(amount = Voucher) }
"""
    loaded = load_source(None, text=text, name="t.sop")
    assert loaded.scenario is not None
    assert optional_read_diagnostics(loaded.scenario) == []


def test_procedures_are_checked_on_their_unrolled_form() -> None:
    bad = """
system Restored: bool "Whether service is back."
action Reset "Reset."
stage s1 "check" {
    observe Restored
    when Restored -> do Stop
    when missing(Voucher) -> do Reset -> s1 up to 2 times
    otherwise -> do Pay(amount = Voucher)
}
"""
    (d,) = w306(bad)  # once the retry is spent, `otherwise` reads the missing voucher
    assert "`s1`" in d.message and d.notes == ["reached via s1 -> s1 -> s1"]
    assert d.witness["Restored"] == [False, False, False] and d.witness["Voucher"] is None
    good = bad.replace("    otherwise -> do Pay", "    when missing(Voucher) -> do Stop\n    otherwise -> do Pay")
    assert w306(good) == []


def test_checker_reports_w306_through_sop_check() -> None:
    s = scenario("""
stage s1 "first" { when Voucher > Fee -> do Stop  otherwise -> do Pay(amount = Fee) }
""")
    assert "W306" in [d.code for d in check(s)]


def test_budget_gives_i303_never_a_silent_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(optcheck, "MAX_STATES", 0)
    diags = optional_read_diagnostics(scenario("""
stage s1 "first" { when Voucher > Fee -> do Stop  otherwise -> do Pay(amount = Fee) }
"""))
    assert [d.code for d in diags] == ["I303"]
    assert "work budget" in diags[0].message


def test_i303_points_at_the_undecided_read_and_names_its_variable_and_branch() -> None:
    """Issue 31: I303 pointed at the scenario's name and named nothing. A read the analysis cannot settle
    (a pattern the solver does not model) is located at the read, named with its stage and branch (the
    source's stage, not a copy of a procedure's), and a budget stop at the stage where it stopped."""
    body = ('system Ref: string "r"\nsystem Ok: bool "o"\n'
            'stage first "first" { -> second }\n'
            'stage second "second" {\n'
            '    observe Ok\n'
            '    when Ok -> do Stop\n'
            '    when Ref matches "(?>ab)c" and not missing(Voucher) -> do Stop\n'
            '    when Ref matches "(?>ab)c" and Voucher > 10 -> do Pay(amount = 1) -> second up to 1 times\n'
            '    otherwise -> do Stop\n'
            '}\n')
    (d,) = [d for d in check(scenario(body)) if d.code == "I303"]
    assert d.span is not None and (d.span.line, d.span.col) == (15, 36)  # `Voucher` in `Voucher > 10`
    assert d.message == ("optional-value analysis incomplete: 1 read(s) of optional values stayed undecided (no "
                         "example the engine refuses was found, and no proof that none exists)")
    assert d.notes == ["undecided: `Voucher` in branch 3 of `second` (its condition)"]


def test_a_read_too_large_to_analyse_is_named_and_pointed_at(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(optcheck, "MAX_NODES", 3)
    diags = optional_read_diagnostics(scenario("""
stage s1 "first" { when Want == Refund -> s2  otherwise -> do Stop }
stage s2 "second" { when Want == Refund and Fee > 1 and Voucher > Fee -> do Stop  otherwise -> do Stop }
"""))
    (d,) = [d for d in diags if d.code == "I303"]
    assert d.message.endswith("1 condition(s) were too large to analyse for reads of optional values")
    assert d.notes == ["too large: `Voucher` in branch 1 of `s2` (its condition)"]
    assert d.span is not None and (d.span.line, d.span.col) == (10, 26)


def test_a_budget_stop_of_i303_is_located_at_its_stage(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(optcheck, "STEP_BUDGET", 3)
    diags = optional_read_diagnostics(scenario("""
stage s1 "first" { when Want == Refund -> s2  otherwise -> do Stop }
stage s2 "second" { when Voucher > Fee -> do Stop  otherwise -> do Pay(amount = Fee) }
"""))
    (d,) = [d for d in diags if d.code == "I303"]
    assert d.message.endswith("operations) at stage `s2`") and d.span is not None and d.span.line == 10


SHIPPED = sorted([*ROOT.glob("examples/**/*.sop"), *ROOT.glob("scenarios/*.sop")])


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_programs_have_no_unguarded_optional_reads(path: Path) -> None:
    loaded = load_source(path)
    if loaded.scenario is None:  # include-only fragments (examples/common)
        return
    assert [d.code for d in optional_read_diagnostics(loaded.scenario)] == []


STRUCTURED = """scenario optl "Optional list and record"
system Segs: list[0..4] of date? "Flight segments, if any."
system M: record { lat: int[0..100], ok: bool }? "Line metrics, if measured."
system N: int[0..4]? "A small count, if known."
system Tier: Gold | Basic? "Loyalty tier, if any."
action A "a" [ends_dialogue]
action B "b" [ends_dialogue]
"""


def structured(body: str) -> ir.Scenario:
    loaded = load_source(None, text=STRUCTURED + body, name="t.sop")
    assert loaded.scenario is not None, [d.message for d in loaded.diagnostics]
    return loaded.scenario


@pytest.mark.parametrize("name", ["N", "Tier"])
def test_missing_test_on_a_finite_optional_is_a_real_branch(name: str) -> None:
    # small finite domains are split into points; "missing" has no point, so the test must stay a literal
    s = structured(f"stage s \"s\" {{\n  when missing({name}) -> do A\n  otherwise -> do B\n}}\n")
    assert not [d for d in check(s) if d.code == "W304"], [d.message for d in check(s)]
    paths = list(iter_paths(s))
    assert [p.action for p in paths] == ["A", "B"]
    missing_path = paths[0]
    assert missing_path.witness is not None and missing_path.witness[name] is None
    assert run(s, missing_path.witness)[0].finals["Action"] == "A"


def test_optional_list_and_record_reads_are_checked() -> None:
    unguarded = structured('stage s "s" {\n  when len(Segs) > 2 -> do A\n  otherwise -> t\n}\n'
                           'stage t "t" {\n  when M.ok -> do A\n  otherwise -> do B\n}\n')
    found = optional_read_diagnostics(unguarded)
    assert sorted(d.message.split("`")[1] for d in found if d.code == "W306") == ["M", "Segs"]
    assert not [d for d in found if d.code == "I303"]
    for d in found:  # the example leaves the structure out, and the engine refuses it there
        with pytest.raises(DecideError, match="is missing: it is optional"):
            run(unguarded, d.witness)
    guarded = structured('stage s "s" {\n  when missing(Segs) or missing(M) -> do B\n'
                         '  when len(Segs) > 2 -> do A\n  otherwise -> t\n}\n'
                         'stage t "t" {\n  when M.ok -> do A\n  otherwise -> do B\n}\n')
    assert optional_read_diagnostics(guarded) == []


def test_optional_list_paths_and_witnesses_in_source_terms() -> None:
    s = structured('stage s "s" {\n  when missing(Segs) -> do B\n  when len(Segs) > 2 -> do A\n'
                   '  otherwise -> do B\n}\n')
    paths = list(iter_paths(s))
    assert [p.action for p in paths] == ["B", "A", "B"]
    assert paths[0].constraints["where"] == "missing(Segs)"
    assert paths[0].witness is not None and paths[0].witness["Segs"] is None
    assert len(paths[1].witness["Segs"]) >= 3 and isinstance(paths[2].witness["Segs"], list)
    for p in paths:
        assert run(s, p.witness)[0].finals["Action"] == p.action


def _walked(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The stages whose children are asked for from now on (a spy on `RegionGraph.children`)."""
    from sopgraph.logic.pathgraph import RegionGraph

    asked: list[str] = []
    real = RegionGraph.children

    def children(self: RegionGraph, si: int, region: tuple) -> tuple:
        asked.append(self.ids[si])
        return real(self, si, region)

    monkeypatch.setattr(RegionGraph, "children", children)
    return asked


def test_a_stage_whose_branches_all_end_in_actions_is_not_split_into_children(monkeypatch) -> None:
    """The walk only needs the children of a stage to go on to other stages: on a list of order lines the
    pass spent half its time deciding which branches of the last stage were feasible, and used none of it
    (docs/performance.md). The reads there are still checked, each under its own condition."""
    asked = _walked(monkeypatch)
    body = """
stage s1 "first" {
    when Want == Other -> do Stop
    otherwise -> s2
}
stage s2 "second" {
    when Voucher > 10 -> do Pay(amount = Voucher)
    otherwise -> do Stop
}
"""
    (warning,) = w306(body)
    assert "Voucher" in warning.message
    assert asked == ["s1"]


def test_stages_after_the_last_read_of_an_optional_value_are_not_walked(monkeypatch) -> None:
    """A stage from which no read of an optional value lies ahead needs no walking: on generated order SOPs the
    pass split every stage of programs that read their optional coupon only in the first stage, or nowhere."""
    asked = _walked(monkeypatch)
    body = """
stage s1 "first" {
    when Want == Other -> s2
    otherwise -> s3
}
stage s2 "second" {
    when Voucher > 10 -> do Pay(amount = Voucher)
    otherwise -> s3
}
stage s3 "third" {
    when Fee > 5 -> s4
    otherwise -> do Stop
}
stage s4 "fourth" {
    when Fee > 50 -> do Stop
    otherwise -> do Pay(amount = Fee)
}
"""
    (warning,) = w306(body)
    assert "Voucher" in warning.message
    assert asked == ["s1"]
