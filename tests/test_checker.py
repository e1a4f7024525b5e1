"""The static checker: each pass on small programs, the pass list, `check_file`, and `sop check`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import sopgraph
from sopgraph.cli import main
from sopgraph.language import ir
from sopgraph.language.compile import compile_graph
from sopgraph.language.diagnostics import CODES, Diagnostic, SopError, error
from sopgraph.language.parse import load_source
from sopgraph.logic.checker import (
    PASSES,
    Pass,
    check,
    check_declarations,
    check_file,
    check_structure,
    check_targets,
    check_types,
    check_unused,
    infer_types,
)

ROOT = Path(__file__).resolve().parent.parent
NO_FLOW = tuple(p for p in PASSES if p.name not in ("flow", "output ranges", "optional reads"))

HEAD = """
field EmotionTag: Calm | Discontent
field Intent: Enquiry | Change | Cancel
field Vip: bool
system Penalty: int[0..)
system Amount: float[0..1000]
action Help "help"
action Escalate "escalate" [escalation]
"""


def scenario(text: str, head: str = HEAD) -> ir.Scenario:
    loaded = load_source(None, text=head + text, name="t.sop")
    assert loaded.scenario is not None, [d.message for d in loaded.diagnostics]
    assert not loaded.diagnostics, [d.message for d in loaded.diagnostics]
    return loaded.scenario


def run(pass_fn, text: str, head: str = HEAD) -> list[Diagnostic]:
    s = scenario(text, head)
    return pass_fn(s, compile_graph(s))


def codes(diags: list[Diagnostic]) -> list[str]:
    return [d.code for d in diags]


def only(diags: list[Diagnostic], code: str) -> Diagnostic:
    found = [d for d in diags if d.code == code]
    assert len(found) == 1, [(d.code, d.message) for d in diags]
    return found[0]


# ---------------------------------------------------------------------------------------------
# Names


def test_undefined_variable_in_a_guard_with_did_you_mean() -> None:
    diags = run(check_types, "stage s { when Penalti > 0 -> do Help otherwise -> do Escalate }")
    d = only(diags, "E101")
    assert "undefined name `Penalti`" in d.message
    assert d.hint == "did you mean `Penalty`?"
    assert (d.span.line, d.span.col) == (9, 16)


def test_undefined_name_used_as_a_condition() -> None:
    d = only(run(check_types, "stage s { when Vipp -> do Help otherwise -> do Escalate }"), "E101")
    assert d.hint == "did you mean `Vip`?"


def test_enum_value_used_as_a_variable_gets_a_pointed_hint() -> None:
    d = only(run(check_types, "stage s { when Penalty == Calm -> do Help otherwise -> do Help }"), "E101")
    assert "`Calm` is a value of `EmotionTag`" in d.hint


def test_undefined_stage_action_output_attribute_and_field() -> None:
    text = """
output Plan: Basic | Premium = Basic
action Bad "b" [moves_mony]
stage s1 { classify EmotionTg, Penalty -> s2 }
stage s2 { match EmotionTag { Calm -> do Hlep { Pln = Basic } Discontent -> s3x } }
"""
    s = scenario(text)
    graph = compile_graph(s)
    targets = check_targets(s, graph)
    assert only(targets, "E103").message == "undefined stage `s3x`"
    assert only(targets, "E104").hint == "did you mean `Help`?"
    assert only(targets, "E107").hint == "did you mean `Plan`?"
    decls = check_declarations(s, graph)
    assert only(decls, "E106").hint == "did you mean `moves_money`?"
    assert only(decls, "E101").hint == "did you mean `EmotionTag`?"
    assert "system variable" in only(decls, "E108").message


def test_undefined_entry_stage() -> None:
    d = only(run(check_declarations, "start nowhere\nstage s { -> do Help }"), "E103")
    assert "entry stage `nowhere`" in d.message


def test_stage_named_where_an_action_was_meant() -> None:
    d = only(run(check_targets, "stage s { -> Help }"), "E103")
    assert d.hint == "`Help` is an action: write `do Help`"


def test_duplicates_inside_declarations_are_reported_once() -> None:
    text = """
field Mood: A | B | A
output Note: X | Y = X
action Twice "t" [escalation, escalation]
stage s { classify Vip, Vip -> do Twice { Note = X, Note = Y } }
"""
    diags = check(scenario(text), NO_FLOW)
    assert codes(diags).count("E102") == 2
    assert codes(diags).count("W403") == 2


def test_loader_duplicates_are_not_reported_again() -> None:
    result = check_file("d.sop", text=HEAD + 'action Help "again"\nstage s { -> do Help }\n')
    dup = [d for d in result.diagnostics if d.code == "E102"]
    assert len(dup) == 1 and "already declared" in dup[0].message


# ---------------------------------------------------------------------------------------------
# Types


def test_bare_value_not_in_the_compared_enum() -> None:
    d = only(run(check_types, "stage s { when EmotionTag == Angry -> do Escalate otherwise -> do Help }"),
             "E202")
    assert d.message == "`Angry` is not a value of `EmotionTag`"
    assert "`Calm`, `Discontent`" in d.hint
    d2 = only(run(check_types, "stage s { when EmotionTag == Discontnt -> do Escalate otherwise -> do Help }"),
              "E202")
    assert d2.hint.startswith("did you mean `Discontent`?")


def test_match_arm_value_not_in_the_enum_and_of_the_wrong_type() -> None:
    diags = run(check_types, "stage s { match Intent { Enquiry -> do Help Chnage -> do Help 3 -> do Help "
                             "Cancel -> do Escalate } }")
    assert only(diags, "E202").hint.startswith("did you mean `Change`?")
    assert "`3` is an integer, not a value of `Intent`" in only(diags, "E201").message


@pytest.mark.parametrize("guard, fragment", [
    ("EmotionTag > 3", "comparing an enum with an integer"),
    ("EmotionTag == 3", "comparing an enum with an integer"),
    ("EmotionTag < Calm", "enum values have no order"),
    ("Penalty + EmotionTag > 1", "addition on an enum"),
    ("Vip * 2 > 1", "multiplication on a bool"),
    ("Penalty and Vip", "`and` needs conditions"),
    ("EmotionTag or Vip", "`or` needs conditions"),
    ("not Penalty", "`not` of"),
    ("Vip < true", "bools have no order"),
    ("Penalty", "not a condition"),
    ("Vip == Penalty", "comparing a bool with an integer"),
    ("EmotionTag == Intent", "have no value in common"),
    ("count(Penalty, Vip) > 1", "`count` counts conditions"),
    ("min(Vip, 1) > 0", "`min` on a bool"),
    ('Vip == "yes"', 'the string "yes"'),
])
def test_type_errors(guard: str, fragment: str) -> None:
    diags = run(check_types, f"stage s {{ when {guard} -> do Help otherwise -> do Escalate }}")
    assert any(fragment in d.message for d in diags), [d.message for d in diags]
    assert all(d.code in ("E201", "E101") for d in diags)


@pytest.mark.parametrize(("guard", "start", "end"), [
    ("count(" + ", ".join(["Vip"] * 3000) + ") and Vip", "`and` needs conditions", "`count(Vip, Vip, Vip"),
    ("Vip == max(" + ", ".join(["Penalty"] * 3000) + ")", "comparing a bool with an integer", "Penalty, Penalty)`"),
    ('Vip == "' + "a\\\\" * 3000 + '"', "the string \"a\\\\a\\\\", "a\\\\\" is used"),
])
def test_a_huge_expression_is_quoted_short_in_its_message(guard: str, start: str, end: str) -> None:
    """The message quotes the start and the end of a huge expression (`…` between), on one line;
    the span still covers all of it."""
    diags = run(check_types, f"stage s {{ when {guard} -> do Help otherwise -> do Escalate }}")
    assert diags, guard[:50]
    for d in diags:
        assert len(d.message) < 250 and "\n" not in d.message and " … " in d.message, d.message
        assert len(d.hint or "") < 400
    assert any(start in d.message and end in d.message for d in diags), [d.message for d in diags]
    assert max(d.span.end_col - d.span.col for d in diags) > 5000


def test_well_typed_guards_are_clean() -> None:
    text = """
let Fee = Penalty * 0.5 + Amount
stage s {
    when EmotionTag == Calm and Intent in {Change, Cancel} -> do Help
    when Intent not in {Enquiry} or not Vip -> do Help
    when Fee >= 10 and count(Vip, EmotionTag != Calm) >= 1 -> do Help
    when max(Penalty, 3) - min(Amount, 2) < -1 -> do Help
    when "Calm" == EmotionTag -> do Help
    otherwise -> do Escalate
}
"""
    assert run(check_types, text) == []


def test_empty_and_inverted_ranges() -> None:
    head = 'system A: int[5..1]\nsystem B: float(1..1]\nsystem C: int(1..2)\nsystem D: int[1..1]\n' \
           'system E: float[0..0.5)\naction Help "h"\n'
    diags = run(check_declarations, "stage s { -> do Help }", head)
    assert codes(diags) == ["E203", "E203", "E203"]
    assert "inverted" in diags[0].message and "empty" in diags[1].message


def test_output_values_checked_against_the_output_type() -> None:
    text = """
let Label = case { when Vip -> PLAN_A otherwise -> PLAN_Z }
output Plan: PLAN_A | PLAN_B | none = nonee
output Refund: int[0..500] = 900
output Ok: bool = false
stage s {
    when Vip -> do Help { Plan = Label, Refund = Amount, Ok = Yes }
    otherwise -> do Help { Plan = PLAN_B, Refund = 2.5, Ok = 1 }
}
"""
    diags = run(check_types, text)
    messages = [d.message for d in diags]
    assert codes(diags).count("E204") == 6, messages
    assert "`nonee` is not a value of output `Plan`" in messages
    assert any("can be `PLAN_Z`" in m for m in messages)
    assert any("outside the range int[0..500]" in m for m in messages)
    assert only(diags, "E101").message.startswith("undefined name `Yes`")


def test_derived_variable_cycle() -> None:
    d = only(run(check_types, "let A = B + 1\nlet B = A * 2\nstage s { when A > 1 -> do Help otherwise -> do Help }"),
             "E205")
    assert d.message == "derived variable cycle: A -> B -> A"


def test_self_referencing_derived_variable() -> None:
    d = only(run(check_types, "let A = A + 1\nstage s { when A > 1 -> do Help otherwise -> do Help }"), "E205")
    assert d.message == "derived variable cycle: A -> A"


def test_a_derived_variable_named_like_the_value_it_compares_with_is_told_to_quote_it() -> None:
    """Issue 29 item 14: `let Discontent = EmotionTag == Discontent` reads itself because the value's name is
    the variable's; E205 says so where it is read, and how to write the value (as E201 does)."""
    text = "let Discontent = EmotionTag == Discontent\nstage s { when Discontent -> do Help otherwise -> do Help }"
    d = only(run(check_types, text), "E205")
    assert d.message == ("derived variable cycle: Discontent -> Discontent: `Discontent` here is the derived "
                         "variable, not the value of `EmotionTag`")
    assert d.span is not None and (d.span.line, d.span.col) == (9, 32)  # the read, not the declaration
    assert d.hint == ('`Discontent` is both a variable and a value of `EmotionTag`; rename one of them, or write '
                      'the value as "Discontent"')
    assert codes(run(check_types, text.replace("== Discontent", '== "Discontent"'))) == []
    # through another derived variable: the read that names a value is the one pointed at
    longer = run(check_types, "let Calm = Mood and Vip\nlet Mood = EmotionTag == Calm\n"
                              "stage s { when Calm -> do Help otherwise -> do Help }")
    d = only(longer, "E205")
    assert d.message.startswith("derived variable cycle: Calm -> Mood -> Calm: `Calm` here")
    assert d.span is not None and (d.span.line, d.span.col) == (10, 26)


def test_inferred_types_are_stored_on_derived_variables() -> None:
    s = scenario("""
let Fee = Penalty * 2 + 10
let Ratio = Amount / 2
let Big = Fee > 100
let Signals = count(Vip, EmotionTag == Discontent, Big)
let Tier = case { when Vip -> Gold when Big -> Silver otherwise -> Bronze }
let Mood = case { when Vip -> EmotionTag otherwise -> Calm }
let Bonus = case { when Vip -> Penalty otherwise -> 0.5 }
let Either = min(Penalty, 3)
stage s { when Signals > 1 and Tier == Gold and Mood == Calm and Bonus > Ratio and Either > 0 -> do Help
          otherwise -> do Help }
""")
    assert infer_types(s) == []
    t = {v.name: v.type for v in s.derived}
    assert isinstance(t["Fee"], ir.NumType) and t["Fee"].kind == "int" and t["Fee"].lo == 10 and t["Fee"].hi is None
    assert isinstance(t["Ratio"], ir.NumType) and t["Ratio"].kind == "float"
    assert isinstance(t["Big"], ir.BoolType)
    assert isinstance(t["Signals"], ir.NumType) and (t["Signals"].kind, t["Signals"].lo, t["Signals"].hi) == (
        "int", 0, 3)
    assert isinstance(t["Tier"], ir.EnumType) and t["Tier"].values == ["Gold", "Silver", "Bronze"]
    assert isinstance(t["Mood"], ir.EnumType) and t["Mood"].values == ["Calm", "Discontent"]
    assert isinstance(t["Bonus"], ir.NumType) and t["Bonus"].kind == "float"
    assert (t["Either"].kind, t["Either"].lo, t["Either"].hi) == ("int", 0, 3)
    # the stored types are usable by later checks: comparing Tier with a value outside it fails
    bad = scenario("let Tier = case { when Vip -> Gold otherwise -> Bronze }\n"
                   "stage s { when Tier == Silver -> do Help otherwise -> do Help }")
    assert only(check(bad, NO_FLOW), "E202").message == "`Silver` is not a value of `Tier`"


def test_case_arms_of_different_types() -> None:
    diags = run(check_types, "let X = case { when Vip -> 1 otherwise -> true }\n"
                             "stage s { when X -> do Help otherwise -> do Help }")
    assert "different types" in only(diags, "E201").message


def test_untypeable_derived_variable_stores_none() -> None:
    s = scenario("let Bad = EmotionTag + 1\nstage s { when Bad > 1 -> do Help otherwise -> do Help }")
    infer_types(s)
    assert s.variables["Bad"].type is None


# ---------------------------------------------------------------------------------------------
# Structure


def test_cycle_is_printed_as_a_readable_path() -> None:
    text = """
stage step1 { -> step3 }
stage step3 { when Vip -> do Help otherwise -> step5 }
stage step5 { when EmotionTag == Calm -> step3 otherwise -> do Escalate }
"""
    d = only(run(check_structure, text), "E302")
    assert d.message == "cycle in the stage graph: step3 -> step5 -> step3"
    assert d.span.line == 12  # the branch that closes the loop


def test_cycle_ruled_out_by_contradictory_guards_is_not_an_error() -> None:
    text = """
stage step1 { match Intent { Change -> step4 Cancel -> step8 Enquiry -> do Help } }
stage step4 { when Intent == Change -> step6 otherwise -> do Help }
stage step6 { when Vip -> step8 otherwise -> do Help }
stage step8 { when Intent == Cancel -> step4 otherwise -> do Escalate }
"""
    assert run(check_structure, text) == []


def test_cycle_ruled_out_only_by_an_earlier_branch_is_recognised() -> None:
    # step5 -> step3 needs `not Vip` (the first branch did not fire); step3 -> step5 needs Vip.
    text = """
stage step3 { when Vip -> step5 otherwise -> do Help }
stage step5 { when Vip -> do Escalate otherwise -> step3 }
"""
    assert run(check_structure, text) == []


def test_cycle_ruled_out_by_numeric_guards_uses_the_constraint_domain() -> None:
    text = """
stage s1 { when Penalty > 5 -> s2 otherwise -> do Help }
stage s2 { when Penalty < 3 -> s1 otherwise -> do Escalate }
"""
    assert run(check_structure, text) == []
    walkable = run(check_structure, text.replace("Penalty < 3", "Penalty < 30"))
    assert only(walkable, "E302").message == "cycle in the stage graph: s1 -> s2 -> s1"


def test_loop_without_exit() -> None:
    diags = run(check_structure, "stage a { -> b }\nstage b { -> c }\nstage c { -> b }")
    assert only(diags, "E302").message == "cycle in the stage graph: b -> c -> b"
    assert "cannot reach an end" in only(diags, "E303").message


def test_self_loop() -> None:
    assert only(run(check_structure, "stage a { when Vip -> a otherwise -> do Help }"), "E302").message == \
        "cycle in the stage graph: a -> a"


def test_no_stages() -> None:
    d = only(run(check_structure, ""), "E304")
    assert "no stages" in d.message


def test_unreachable_stages() -> None:
    diags = run(check_structure, "stage a { -> do Help }\nstage b { -> c }\nstage c { -> do Help }")
    assert codes(diags) == ["W302", "W302"]
    assert "`b` is unreachable from the entry `a`" in diags[0].message


def test_a_typo_in_a_target_does_not_cascade_into_cannot_end() -> None:
    diags = check(scenario("stage a { -> b }\nstage b { -> cc }\nstage c { -> do Help }"), NO_FLOW)
    assert "E303" not in codes(diags) and "E103" in codes(diags)


# ---------------------------------------------------------------------------------------------
# Unused declarations


def test_unused_declarations_are_warnings() -> None:
    text = """
let Spare = Penalty * 2
output Note: A | B
output Tag: X | Y = X
action Never "n"
stage s { classify EmotionTag match Intent { Enquiry, Change -> do Help Cancel -> do Escalate } }
"""
    diags = run(check_unused, text)
    assert all(d.severity == "warning" and d.code == "W401" for d in diags)
    named = sorted(d.message.split("`")[1] for d in diags)
    # EmotionTag is classified, Penalty feeds Spare, Tag has a default: all count as used.
    assert named == ["Amount", "Never", "Note", "Spare", "Vip"]


def test_declarations_of_an_included_file_are_not_reported_unused(tmp_path: Path) -> None:
    """Issue 29 item 17: a shared include declares more than one program reads; W401 is about the main
    file's own declarations (checked alone, the shared file is still told)."""
    (tmp_path / "common").mkdir()
    shared = tmp_path / "common" / "shared.sop"
    shared.write_text('field Verified: bool "v"\nsystem Locked: bool "l"\nlet Risky = Locked and not Verified\n'
                      'output Team: Ops | Sales "t"\naction AskId "a"\naction Human "h" [escalation]\n',
                      encoding="utf-8")
    main = tmp_path / "main.sop"
    main.write_text('include "common/shared.sop"\nfield Mine: bool "m"\nsystem Spare: bool "s"\n'
                    'action Unused "u"\nstage s { when Locked -> do Human otherwise -> do AskId }\n', encoding="utf-8")
    found = [d for d in sopgraph.check(sopgraph.load(path=main)) if d.code == "W401"]
    assert sorted((d.message, d.span.file if d.span else "") for d in found) == [
        ("action `Unused` is never used", str(main)), ("field `Mine` is never used", str(main)),
        ("system variable `Spare` is never used", str(main))]
    alone_scenario = load_source(shared).scenario
    assert alone_scenario is not None
    alone = [d.message for d in check_unused(alone_scenario, compile_graph(alone_scenario))]
    assert "derived variable `Risky` is never used" in alone and "output `Team` is never assigned and has no default" \
        in alone


def test_missing_descriptions_are_warnings() -> None:
    from sopgraph.logic.checker import check_descriptions

    diags = run(check_descriptions, "stage s { -> do Help }",
                'field Mood: A | B\nsystem Level: int "the level"\naction Help\naction Other "o"\n')
    assert [(d.code, d.severity, d.message) for d in diags] == [
        ("W402", "warning", "field `Mood` has no description"),
        ("W402", "warning", "action `Help` has no description"),
    ]


# ---------------------------------------------------------------------------------------------
# The pass list


def test_passes_are_ordered_named_and_easy_to_extend() -> None:
    names = [p.name for p in PASSES]
    assert names == ["declarations", "targets", "types", "scalars", "structure", "unused", "descriptions", "procedures",
                     "flow", "output ranges", "optional reads"]
    s = scenario("stage s { -> do Help }")

    def extra(sc: ir.Scenario, graph) -> list[Diagnostic]:
        return [error("E999", f"{len(graph)} nodes", sc.span)]

    diags = check(s, PASSES + (Pass("extra", extra),))
    assert "E999" in codes(diags)


def test_blocked_pass_is_skipped_after_errors() -> None:
    calls: list[str] = []

    def late(sc: ir.Scenario, graph) -> list[Diagnostic]:
        calls.append("late")
        return []

    bad = scenario("stage s { when Nope -> do Help otherwise -> do Help }")
    check(bad, NO_FLOW + (Pass("late", late, blocked_by=("E1",)),))
    assert calls == []
    good = scenario("stage s { when Vip -> do Help otherwise -> do Help }")
    check(good, NO_FLOW + (Pass("late", late, blocked_by=("E1",)),))
    assert calls == ["late"]


def test_diagnostics_are_sorted_deduplicated_and_stable() -> None:
    s = scenario("stage s { match Mood { A -> do Help B -> do Help } }\nstage t { -> zz }")
    first = check(s, NO_FLOW)
    assert first == check(s, NO_FLOW)
    keys = [(d.span.file, d.span.line, d.span.col) for d in first]
    assert keys == sorted(keys)
    assert len({(d.code, d.message, d.span) for d in first}) == len(first)
    assert codes(first).count("E101") == 1  # the undefined subject is reported once, not per arm


def test_every_code_used_is_registered() -> None:
    import re

    package = ROOT / "sopgraph"
    used = {code: str(path.relative_to(package)) for path in sorted(package.rglob("*.py"))
            for code in re.findall(r'"([EWI]\d{3})"', path.read_text(encoding="utf-8"))}
    assert len(used) > 40  # the scan sees the checker, parser, flow, profile and procedure codes
    assert set(used) <= set(CODES), {c: f for c, f in used.items() if c not in CODES}


# ---------------------------------------------------------------------------------------------
# Flow integration (sopgraph.logic.flow is built separately; a stand-in module tests the wiring)


@pytest.fixture
def fake_flow(monkeypatch: pytest.MonkeyPatch):
    calls: list[str] = []

    def flow_diagnostics(sc: ir.Scenario, **_budget: object) -> list[Diagnostic]:
        calls.append(sc.name)
        return [Diagnostic(code="W301", severity="warning", message="overlap", span=sc.span,
                           witness={"Vip": True})]

    monkeypatch.setattr("sopgraph.logic.checker.flow_diagnostics", flow_diagnostics)
    return calls


def test_flow_runs_when_names_and_types_are_clean(fake_flow: list[str]) -> None:
    diags = check(scenario("stage s { when Vip -> do Help otherwise -> do Help }"))
    assert fake_flow and "W301" in codes(diags)


@pytest.mark.parametrize("text", [
    "stage s { when Nope -> do Help otherwise -> do Help }",
    "stage s { when EmotionTag > 1 -> do Help otherwise -> do Help }",
    "stage s { -> t }\nstage t { -> s }",
])
def test_flow_is_skipped_when_names_types_or_structure_are_broken(fake_flow: list[str], text: str) -> None:
    check(scenario(text))
    assert fake_flow == []


def test_real_flow_analysis_is_integrated() -> None:
    s = scenario("stage s { when Penalty > 5 -> do Help when Penalty > 0 -> do Escalate }")
    e301 = only(check(s), "E301")
    assert e301.witness is not None and e301.witness["Penalty"] == 0
    # with a type error elsewhere, flow findings are held back (they would be consequences)
    broken = scenario("stage s { when Penalty > 5 -> do Help when Penalty > Calm -> do Escalate }")
    assert "E301" not in codes(check(broken))


def test_cli_json_carries_flow_witnesses(tmp_path: Path) -> None:
    f = tmp_path / "flow.sop"
    f.write_text(HEAD + "stage s { when Penalty > 5 -> do Help when Penalty > 0 -> do Escalate }\n")
    res = CliRunner().invoke(main, ["check", "--format", "json", str(f)])
    assert res.exit_code == 1
    record = next(r for r in json.loads(res.output) if r["code"] == "E301")
    assert record["witness"]["Penalty"] == 0


# ---------------------------------------------------------------------------------------------
# Entry points: load(), check_file(), the six scenarios


def test_load_raises_on_check_errors_and_keeps_warnings_out_of_the_way() -> None:
    with pytest.raises(SopError) as info:
        sopgraph.load(text=HEAD + "stage s { when EmotionTag == Angry -> do Help otherwise -> do Help }")
    assert [d.code for d in info.value.diagnostics] == ["E202"]
    s = sopgraph.load(text=HEAD + "stage s { -> do Help }")  # only W401 warnings
    assert s.stages["s"].branches[0].target.action == "Help"


def test_check_file_skips_static_checks_after_loader_errors(tmp_path: Path) -> None:
    f = tmp_path / "x.sop"
    f.write_text(HEAD + "use missing as m()\nstage s { -> m }\n")
    result = check_file(f)
    assert codes(result.diagnostics) == ["E105"]
    assert result.errors == 1 and result.sources


SCENARIOS = sorted((ROOT / "scenarios").glob("*.sop"))


@pytest.mark.skipif(not SCENARIOS, reason="scenarios/*.sop not written yet")
@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_the_scenarios_have_no_errors(path: Path) -> None:
    result = check_file(path)
    assert result.errors == 0, "\n".join(d.render(result.sources) for d in result.diagnostics)


# ---------------------------------------------------------------------------------------------
# The command line


def test_cli_malformed_file_prints_location_caret_and_hint(tmp_path: Path) -> None:
    f = tmp_path / "bad.sop"
    f.write_text('field Mood: Calm | Angry\naction Help "h"\nstage s {\n    match Mood {\n        Calm do Help\n'
                 '        Angry -> do Help\n    }\n}\n')
    result = CliRunner().invoke(main, ["check", str(f)])
    assert result.exit_code == 1
    out = result.output
    assert f"{f}:5:14: error[E001]: missing `->` before `do`" in out
    assert "   5 |         Calm do Help" in out
    caret = out.splitlines()[out.splitlines().index("   5 |         Calm do Help") + 1]
    assert caret.strip() == "^^" and caret.index("^") == len("   5 |         Calm ")
    assert "= hint:" in out
    assert "Traceback" not in out
    assert isinstance(result.exception, SystemExit)
    assert out.rstrip().endswith("1 error, 0 warnings (failed)")


def test_cli_semantic_errors_and_json(tmp_path: Path) -> None:
    f = tmp_path / "sem.sop"
    f.write_text(HEAD + "stage s { when EmotionTag == Angry -> do Help otherwise -> do Help }\n")
    text = CliRunner().invoke(main, ["check", str(f)])
    assert text.exit_code == 1 and "error[E202]: `Angry` is not a value of `EmotionTag`" in text.output
    res = CliRunner().invoke(main, ["check", "--format", "json", str(f)])
    assert res.exit_code == 1
    records = json.loads(res.output)
    e202 = next(r for r in records if r["code"] == "E202")
    assert set(e202) >= {"code", "severity", "message", "file", "line", "col", "end_line", "end_col", "hint",
                         "witness"}
    assert (e202["file"], e202["line"], e202["col"], e202["end_col"]) == (str(f), 9, 30, 35)
    assert e202["severity"] == "error" and e202["witness"] is None


def test_cli_warnings_exit_zero_unless_strict(tmp_path: Path) -> None:
    f = tmp_path / "warn.sop"
    f.write_text(HEAD + "stage s { -> do Help }\n")
    ok = CliRunner().invoke(main, ["check", str(f)])
    assert ok.exit_code == 0 and "warning[W401]" in ok.output and "0 errors" in ok.output
    strict = CliRunner().invoke(main, ["check", "--strict", str(f)])
    assert strict.exit_code == 1


def test_cli_several_files(tmp_path: Path) -> None:
    good = tmp_path / "good.sop"
    good.write_text('field V: bool "v"\naction A "a"\naction B "b"\nstage s { when V -> do A otherwise -> do B }\n')
    bad = tmp_path / "bad.sop"
    bad.write_text("stage s {")
    missing = tmp_path / "missing.sop"
    res = CliRunner().invoke(main, ["check", str(good), str(bad), str(missing)])
    assert res.exit_code == 1
    assert f"{bad}:1:9: error[E002]" in res.output and "error[E003]" in res.output
    assert res.output.rstrip().endswith("3 files: 2 errors, 0 warnings (failed)")
    only_good = CliRunner().invoke(main, ["check", "--format", "json", str(good)])
    assert only_good.exit_code == 0 and json.loads(only_good.output) == []


# ---------------------------------------------------------------------------------------------
# Output ranges (E204 for assignments that some values drive outside the declared range)

FEE_HEAD = """
field Reason: Sick | Other "why"
system NightlyRate: int[0..) "rate"
system Nights: int[1..10] "nights"
output Fee: float[0..) "fee"
output Share: float[0..1] = 0 "share"
action PartialRefund "part" [moves_money]
action FullRefund "all" [moves_money]
"""


@pytest.mark.parametrize("assign, out", [
    ("Fee = NightlyRate - 500", "Fee"),
    ("Share = Nights / 5", "Share"),
    ("Fee = case { when Nights > 8 -> 0 - NightlyRate otherwise -> NightlyRate }", "Fee"),
])
def test_an_assignment_that_can_leave_its_range_is_reported_with_a_verified_witness(assign: str, out: str) -> None:
    s = sopgraph.load(text=FEE_HEAD + "stage s1 { match Reason { Sick -> do FullRefund\n"
                      f"  Other -> do PartialRefund {{ {assign} }} }} }}", check=False)
    e204 = only(check(s), "E204")
    assert f"of output `{out}`" in e204.message and e204.witness is not None
    assert e204.span is not None and e204.span.line == 10
    with pytest.raises(sopgraph.DecideError) as refused:  # the witness really is refused by the engine
        sopgraph.decide(s, e204.witness)
    assert refused.value.output == out
    assert any("the engine computes" in n for n in e204.notes)


@pytest.mark.parametrize("assign", [
    "Fee = max(0, NightlyRate - 500)",
    "Fee = NightlyRate * Nights",
    "Share = Nights / 10",
])
def test_assignments_that_stay_in_range_are_clean(assign: str) -> None:
    s = sopgraph.load(text=FEE_HEAD + "stage s1 { match Reason { Sick -> do FullRefund\n"
                      f"  Other -> do PartialRefund {{ {assign} }} }} }}", check=False)
    assert "E204" not in codes(check(s))


def test_a_guard_that_rules_out_the_bad_values_keeps_the_assignment_clean() -> None:
    guarded = "stage s1 { when NightlyRate >= 500 -> do PartialRefund { Fee = NightlyRate - 500 }\n" \
              "  otherwise -> do FullRefund }"
    assert "E204" not in codes(check(sopgraph.load(text=FEE_HEAD + guarded, check=False)))
    unguarded = guarded.replace(">= 500", ">= 400")
    e204 = only(check(sopgraph.load(text=FEE_HEAD + unguarded, check=False)), "E204")
    assert e204.witness is not None and 400 <= e204.witness["NightlyRate"] < 500


@pytest.mark.parametrize("extra, stages", [
    # a list declared anywhere (even unused by the leaf) used to hide every E204: lists are lowered
    ('system Items: list[0..3] of int[0..10] "items"\n',
     "stage s1 { when len(Items) > 1 -> do PartialRefund { Fee = NightlyRate - 500 }\n otherwise -> do FullRefund }"),
    # a procedure: an observation and a bounded retry before the leaf
    ('system Paid: bool "paid"\naction Remind "remind"\n',
     "stage s1 { -> do Remind -> s2 }\n"
     "stage s2 { observe Paid\n when Paid -> do PartialRefund { Fee = NightlyRate - 500 }\n"
     " when not Paid -> s1 up to 2 times\n otherwise -> do FullRefund }"),
])
def test_output_ranges_are_checked_in_procedures_and_with_lists(extra: str, stages: str) -> None:
    s = sopgraph.load(text=FEE_HEAD + extra + stages, check=False)
    e204 = only(check(s), "E204")
    assert "of output `Fee`" in e204.message and e204.witness is not None
    text = FEE_HEAD + extra + stages
    assert e204.span is not None and e204.span.line == text[:text.index("NightlyRate - 500")].count("\n") + 1
    with pytest.raises(sopgraph.DecideError) as refused:  # the lifted witness is refused by the engine
        sopgraph.decide(s, e204.witness)
    assert refused.value.output == "Fee"
    clamped = sopgraph.load(text=FEE_HEAD + extra + stages.replace("NightlyRate - 500", "max(0, NightlyRate - 500)"),
                            check=False)
    assert "E204" not in codes(check(clamped))


def test_cli_reports_the_profile_beside_the_file_under_its_own_name(tmp_path: Path) -> None:
    sop = tmp_path / "desk.sop"
    sop.write_text('scenario desk "Desk" "d"\nfield V: bool "v"\naction A "a"\naction B "b"\n'
                   "stage s { when V -> do A otherwise -> do B }\n")
    prof = tmp_path / "desk.profile.yaml"
    prof.write_text("scenario: desk\nintents:\n  a: {description: x, requires: {Vee: true}}\n")
    res = CliRunner().invoke(main, ["check", str(sop)])
    assert res.exit_code == 1
    assert f"{prof}:3:" in res.output and "error[E604]" in res.output  # blamed on the profile, not the .sop
    assert res.output.rstrip().splitlines()[-2:] == [
        f"{sop}: 0 errors, 0 warnings (ok)", f"{prof}: 1 error, 0 warnings (failed)"]
    skipped = CliRunner().invoke(main, ["check", "--no-profile", str(sop)])
    assert skipped.exit_code == 0 and skipped.output.strip() == f"{sop}: 0 errors, 0 warnings (ok)"
    two = CliRunner().invoke(main, ["check", str(sop), str(sop)])
    assert two.output.rstrip().splitlines()[-2:] == ["2 files: 0 errors, 0 warnings (ok)",
                                                     "2 profiles: 2 errors, 0 warnings (failed)"]
    assert "profile beside" in CliRunner().invoke(main, ["check", "--help"]).output


SHORTCUT_PROGRAMS = [
    'field A: Yes | No\nfield F: bool\nsystem N: int[0..9]\nsystem X: float[0..1]\naction Go "g"\n'
    'let D = N + 1\n'
    'stage s "S" {\n  match A {\n    Yes -> t\n    Maybe -> t\n    "No" -> t\n  }\n}\n'
    'stage t "T" {\n  match F {\n    true -> u\n    1 -> u\n  }\n}\n'
    'stage u "U" {\n  when N < 3 -> v\n  when X >= 0.5 -> v\n  when D > 2 -> v\n  when A > 1 -> v\n'
    '  when F == 2 -> v\n  when F -> v\n  when A -> v\n  when N -> v\n  otherwise -> do Go\n}\n'
    'stage v "V" {\n  match N {\n    1 -> do Go\n    otherwise -> do Go\n  }\n}\n',
    'type T = Yes | No\nfield A: T\nfield B: Missing\naction Go "g"\n'
    'stage s "S" {\n  match B {\n    Yes -> do Go\n    true -> do Go\n  }\n}\n',
]


@pytest.mark.parametrize("text", SHORTCUT_PROGRAMS
                         + [p.read_text(encoding="utf-8") for p in sorted(ROOT.glob("scenarios/*.sop"))])
def test_type_shortcuts_report_what_inference_reports(text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The typer's shortcuts for the commonest shapes (`_Typer.plainly_bool`, `_plain_members`) only skip
    work that finds nothing: with them off, every program gets the same diagnostics."""
    from sopgraph.logic import checker

    def diagnostics() -> list[Diagnostic]:
        loaded = load_source(text=text, name="t.sop")
        assert loaded.scenario is not None
        return checker.check_types(loaded.scenario, compile_graph(loaded.scenario))

    with_shortcuts = diagnostics()
    monkeypatch.setattr(checker._Typer, "plainly_bool", lambda self, e: False)
    monkeypatch.setattr(checker, "_plain_members", lambda st, values: False)
    assert diagnostics() == with_shortcuts


def test_type_shortcuts_are_taken_on_plain_guards() -> None:
    from sopgraph.logic import checker
    loaded = load_source(text=SHORTCUT_PROGRAMS[0], name="t.sop")
    assert loaded.scenario is not None
    typer = checker._typer(loaded.scenario)
    stages = loaded.scenario.stages
    taken = [typer.plainly_bool(b.guard) for b in stages["u"].branches if b.guard is not None]
    assert taken == [True, True, False, False, False, True, False, False]
    st = loaded.scenario.variables["A"].type
    assert [checker._plain_members(st, b.values) for b in stages["s"].branches] == [True, False, True]


def test_check_file_loads_inside_the_given_context(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`loading` wraps the loading only (the CLI's collector policy): entered once, before the passes."""
    from contextlib import contextmanager

    import sopgraph.logic.checker as checker_module

    events: list[str] = []

    @contextmanager
    def loading():  # type: ignore[no-untyped-def]
        events.append("enter")
        yield
        events.append("exit")

    def recording_load(*args, **kwargs):  # type: ignore[no-untyped-def]
        events.append("load")
        return load_source(*args, **kwargs)

    path = tmp_path / "t.sop"
    path.write_text(HEAD + "stage s { -> do Help }\n")
    plain = check_file(path)
    monkeypatch.setattr(checker_module, "load_source", recording_load)
    result = check_file(path, loading=loading)
    assert events == ["enter", "load", "exit"]
    assert result.diagnostics == plain.diagnostics and plain.diagnostics


def test_check_gathers_the_expressions_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The depth check and the scalar pass share one expression list (a 100k-stage program: ~0.3 s each)."""
    import sopgraph.logic.checker as checker_module

    calls: list[int] = []
    real = checker_module._expressions

    def counting(scenario):  # type: ignore[no-untyped-def]
        calls.append(1)
        return real(scenario)

    scenario = load_source("t.sop", text=HEAD + "stage s { when EmotionTag == Angry -> do Help\n"
                                                 "  otherwise -> do Help }\n").scenario
    expected = checker_module.check(scenario)
    monkeypatch.setattr(checker_module, "_expressions", counting)
    assert checker_module.check(scenario) == expected
    assert len(calls) == 1
    checker_module.check(scenario, passes=checker_module.CHEAP_PASSES)
    assert len(calls) == 2


def test_an_action_named_as_a_stage_is_one_error_not_also_unused() -> None:
    """`-> Refund` for an action: E103 says "write `do Refund`"; W401 "action never used" beside it was noise."""
    found = check_file("t.sop", text='field Vip: bool "v"\naction Refund "r"\naction No "n"\n'
                                     'stage s { when Vip -> Refund\n otherwise -> do No }\n').diagnostics
    assert [d.code for d in found] == ["E103"]
    assert "do Refund" in (found[0].hint or "")


# ---------------------------------------------------------------------------------------------
# For-each steps, list positions, list and record arguments (docs/language.md §5.5, §6.5, §7)

REFUNDS_TEXT = (Path(__file__).resolve().parent / "data" / "refunds.sop").read_text(encoding="utf-8")


def _diags(text: str) -> list[Any]:
    return [d for d in check(sopgraph.load(text=text, check=False)) if d.severity != "info"]


def test_for_each_positions_and_data_arguments_check_clean() -> None:
    assert _diags(REFUNDS_TEXT) == []


@pytest.mark.parametrize(("edit", "code", "fragment"), [
    (("origin = Legs[0].origin", "origin = Legs[4].origin"), "E213", "`Legs[4]` is past the end: `Legs` holds at most 4 items"),
    (("len(Attempts) > 0 and last(Attempts) > 3", "last(Attempts) > 3"), "W309", "`last(Attempts)` may be past the end: `Attempts` may be empty"),
    (("amount = f.amount", "amount = f.nope"), "E101", "`f` has no field `nope`"),
    (("fees = Fees,", "fees = Legs,"), "E201", "`Legs` is a list: it has no field `id`"),
    (("for f in Fees where f.refundable", "for f in Legs where f.refundable"), "E101", "`f` has no field `refundable`"),
    (("for f in Fees where f.refundable", "for f in Fees where f.amount"), "E201", "needs a condition"),
    (("for f in Fees where f.refundable", "for f in len(Fees) where f"), "E201", "needs a list"),
    (("first(Legs).origin", "first(Legs, Legs).origin"), "E201", "`first` takes 1 argument, not 2"),
])
def test_data_steps_and_positions_are_checked_where_written(edit: tuple[str, str], code: str, fragment: str) -> None:
    text = REFUNDS_TEXT.replace(*edit)
    assert text != REFUNDS_TEXT
    found = [d for d in _diags(text) if d.code == code]
    assert found and fragment in found[0].message, [d.message for d in _diags(text)]
    line = text[:text.index(edit[1])].count("\n") + 1
    assert found[0].span is not None and found[0].span.line == line


def test_a_length_test_in_the_same_condition_or_arm_guards_a_position() -> None:
    guarded = REFUNDS_TEXT.replace("otherwise when len(Attempts) > 0 and last(Attempts) > 3 -> do Retry",
                                   "otherwise when len(Attempts) >= 2 and Attempts[1] > 3 -> do Retry")
    assert not [d for d in _diags(guarded) if d.code == "W309"]
    short = guarded.replace("len(Attempts) >= 2", "len(Attempts) >= 1")
    assert [d.code for d in _diags(short) if d.code == "W309"] == ["W309"]
    case = REFUNDS_TEXT.replace('system Attempts', 'let Slow = case { when len(Attempts) > 0 -> last(Attempts) otherwise -> 0 }\n'
                                'system Attempts').replace("last(Attempts) > 3", "Slow > 3")
    assert not [d for d in _diags(case) if d.code == "W309"]
