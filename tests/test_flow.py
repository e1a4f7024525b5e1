"""Flow diagnostics (`sopgraph.logic.flow`): E301, W301, W303, W304, W305 on the contexts that reach stages."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from helpers import gen_sop
from hypothesis import given, settings
from hypothesis import strategies as st

from sopgraph.language import ir
from sopgraph.language.diagnostics import CODES
from sopgraph.language.parse import load_source
from sopgraph.logic.checker import check as sopgraph_check
from sopgraph.logic.engine import DecideError, Interpreter, interpret
from sopgraph.logic.flow import flow_diagnostics
from sopgraph.logic.paths import trace

ROOT = Path(__file__).resolve().parent.parent


gen = gen_sop()

HEAD = """
scenario flowtest "Flow test"
field Kind: A | B | C
field Mood: Calm | Angry
system Amount: int[0..1000]
system Score: float[0..1]
action Ok "ok"
action No "no"
action Other "other"
"""


def load(body: str) -> ir.Scenario:
    loaded = load_source(None, text=HEAD + body)
    assert loaded.scenario is not None, [d.message for d in loaded.diagnostics]
    return loaded.scenario


def by_code(diags: list) -> dict[str, list]:
    out: dict[str, list] = {}
    for d in diags:
        out.setdefault(d.code, []).append(d)
    return out


def assert_witnesses_verified(sc: ir.Scenario, diags: list) -> None:
    """Every witness is a full assignment, and the engine confirms what the diagnostic claims."""
    names = sorted(v.name for v in sc.variables.values() if v.role != "derived")
    for d in diags:
        assert d.code in CODES
        if d.code == "E301":
            assert sorted(d.witness) == names
            with pytest.raises(DecideError) as info:
                interpret(sc, d.witness)
            assert info.value.message.startswith("no branch")
        elif d.code == "W301":
            # only the variables the route reads (issue 9 item 6), and enough to follow it
            assert set(d.witness) <= set(names) and d.witness
            stages, _branches = trace(sc, d.witness)  # the path exists (the earlier branch wins)
            assert stages


def test_flow_reports_each_kind() -> None:
    sc = load("""
stage s1 "start" {
    match Kind {
        A -> s2
        B -> s3
        C -> s4
        A -> s2
    }
}
stage s2 "amount" {
    when Amount > 100 -> do Ok
    when Amount > 500 -> do No
    when Amount < 50 -> do No
}
stage s3 "b route" {
    when Kind == A -> do No
    when Mood == Calm -> do Ok
    when Amount > 10 and Amount < 5 -> do No
    otherwise -> do No
}
stage s4 "c route" {
    when Score >= 0.5 -> do Ok
    when Score < 0.5 -> do No
    otherwise -> do Ok
}
""")
    diags = flow_diagnostics(sc)
    codes = by_code(diags)
    assert sorted(codes) == ["E301", "W303", "W304", "W305"]
    (e301,) = codes["E301"]
    assert "`s2`" in e301.message and e301.span.line > 0
    assert 50 <= e301.witness["Amount"] <= 100 and e301.witness["Kind"] == "A"
    assert any("Amount in [50..100]" in n for n in e301.notes)
    (w305,) = codes["W305"]
    assert w305.witness == {"Kind": "A"}
    (w303,) = codes["W303"]
    assert "Kind == A" in w303.message and any("Kind = B" in n for n in w303.notes)
    w304 = sorted(d.message for d in codes["W304"])
    assert w304 == ["branch `Amount > 10 and Amount < 5 -> do No` of `s3` can never be taken",
                    "branch `Amount > 500 -> do No` of `s2` can never be taken",
                    "branch `otherwise -> do Ok` of `s4` can never be taken"]
    # the shadowed `Amount > 500` is W304, not also W301
    assert "W301" not in codes
    assert_witnesses_verified(sc, diags)


def test_w301_overlap_with_witness() -> None:
    sc = load("""
stage s1 "s1" {
    when Amount > 100 -> do Ok
    when Amount < 500 and Mood == Calm -> do No
    otherwise -> do Other
}
""")
    (d,) = flow_diagnostics(sc)
    assert d.code == "W301" and d.severity == "warning"
    assert 100 < d.witness["Amount"] < 500
    assert interpret(sc, d.witness).finals["Action"] == "Ok"
    assert Interpreter(sc, d.witness).eval(sc.stages["s1"].branches[1].guard) is True
    assert_witnesses_verified(sc, [d])


INDEPENDENT = """
scenario groups "Independent conditions"
type Channel = Online | Atm
type Txn = record { amount: float[0..), channel: Channel, disputed: bool }
field CardInHand: bool "c"
field Mood: Calm | Angry "m"
system Prior: int[0..20] "p"
system Amount: float[0..20000] "a"
system Reference: string "r"
system Booked: date "b"
system Recent: list[0..5] of Txn "t"
let Risk = count(2: not CardInHand, 1: Prior >= 3, 1: Amount > 1000, 1: any(t in Recent where t.channel == Atm and not t.disputed))
action Block "b"
action Human "h"
action Ask "a"
action Charge "c"
action Late "l"
stage window "w" {
    when days_between(Booked, now) > 120 -> do Late
    otherwise -> ref
}
stage ref "r" {
    when Reference matches "[A-Z]{2}[0-9]{6}" -> fraud
    otherwise -> do Ask
}
stage fraud "f" {
    when Risk >= 3 -> do Block
    when Mood == Angry and Risk >= 2 -> do Human
    otherwise -> do Charge
}
"""


def test_conditions_on_disjoint_inputs_are_decided_one_group_at_a_time() -> None:
    """A score over many inputs, a pattern on a text and a date window share no variable: each is
    decided alone and the examples combine. Searched together (and with the solver giving up on the
    pattern) the overlap below stayed undecided: I302 instead of W301."""
    loaded = load_source(None, text=INDEPENDENT)
    assert loaded.scenario is not None
    sc = loaded.scenario
    diags = sopgraph_check(sc)
    assert [d.code for d in diags] == ["W301"], [d.message for d in diags]
    w = diags[0].witness
    assert w["Mood"] == "Angry" and re.fullmatch("[A-Z]{2}[0-9]{6}", w["Reference"])
    assert isinstance(w["Recent"], list)  # the list whole, though the route reads only some of its fields
    assert trace(sc, w)[0] == ["window", "ref", "fraud"]
    assert interpret(sc, w).finals["Action"] == "Block"
    shown = diags[0].render()  # free text quoted (an enum value stays bare), a list as JSON
    assert f'Reference="{w["Reference"]}"' in shown and "Mood=Angry" in shown and "Recent=[" in shown


def test_w301_only_when_reachable_together() -> None:
    body = """
stage s1 "s1" {
    when Amount > 100 -> do Ok
    otherwise -> s2
}
stage s2 "s2" {
    when Mood == Calm -> do Ok
    when Amount > 150 or Mood == Angry -> do No
}
"""
    # In general both guards of s2 hold for Calm with Amount > 150, but s2 is only reached with
    # Amount <= 100, where they never overlap (and s2 is exhaustive there).
    assert flow_diagnostics(load(body)) == []
    reached_high = body.replace("when Amount > 100 -> do Ok", "when Amount > 900 -> do Ok")
    (d,) = flow_diagnostics(load(reached_high))
    assert d.code == "W301" and d.witness["Mood"] == "Calm" and 150 < d.witness["Amount"] <= 900


def test_e301_on_partial_match_and_exhaustive_context() -> None:
    sc = load("""
stage s1 "s1" {
    match Kind {
        A -> s2
        B -> do Ok
    }
}
stage s2 "s2" {
    when Kind == A and Amount > 3 -> do Ok
    when Kind == A and Amount <= 3 -> do No
}
""")
    (d,) = flow_diagnostics(sc)  # s2 is exhaustive for what reaches it; s1 misses C
    assert d.code == "E301" and d.witness["Kind"] == "C"
    assert_witnesses_verified(sc, [d])


def test_six_scenarios_have_no_flow_errors() -> None:
    for f in sorted((ROOT / "scenarios").glob("*.sop")):
        loaded = load_source(f)
        assert loaded.scenario is not None
        diags = flow_diagnostics(loaded.scenario)
        assert not [d for d in diags if d.is_error], [d.render(loaded.sources) for d in diags]
        assert_witnesses_verified(loaded.scenario, diags)


def test_cycles_and_budget_terminate() -> None:
    sc = load("""
stage s1 "s1" { when Amount > 5 -> s2 otherwise -> s3 }
stage s2 "s2" { when Amount > 7 -> s3 otherwise -> do Ok }
stage s3 "s3" { when Amount > 9 -> s1 when Amount > 100 -> do No otherwise -> do Ok }
""")
    diags = flow_diagnostics(sc)
    assert_witnesses_verified(sc, diags)
    big = load_source(None, text=gen.generate(100, kind="mixed", seed=0)).scenario
    t0 = time.perf_counter()
    limited = flow_diagnostics(big, budget=50)
    assert time.perf_counter() - t0 < 30
    assert not [d for d in limited if d.code in ("W303", "W304")]  # incomplete: no "never" claims


def test_defensive_on_broken_ir() -> None:
    sc = load("""
stage s1 "s1" { when Amount > 5 -> s9 otherwise -> s2 }
stage s2 "s2" { when Nope > 3 -> do Ok otherwise -> do No }
""")
    flow_diagnostics(sc)  # undefined stage and variable: no exception
    sc2 = sc.model_copy(update={"start": "missing"})
    assert flow_diagnostics(sc2) == []
    loaded = load_source(None, text=HEAD + 'let X = Y + 1\nlet Y = X + 1\nstage s1 "s" { when X > 1 -> do Ok otherwise -> do No }\n')
    assert loaded.scenario is not None
    flow_diagnostics(loaded.scenario)  # derived cycle: no exception


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(["mixed", "chain", "diamond"]), st.integers(5, 40), st.integers(0, 1000))
def test_generated_sops_never_crash_and_witnesses_verify(kind: str, stages: int, seed: int) -> None:
    sc = load_source(None, text=gen.generate(stages, kind=kind, seed=seed)).scenario
    assert sc is not None
    diags = flow_diagnostics(sc)
    assert_witnesses_verified(sc, diags)
    assert not [d for d in diags if d.code == "E301"]  # the generator writes exhaustive branchings


def test_ordered_thresholds_on_one_variable_are_not_overlaps() -> None:
    """`when Amount > 500 … when Amount > 100 …` is the threshold idiom (first match wins), not W301;
    the same overlap across two variables is reported."""
    idiom = load('stage s { when Amount > 500 -> do Ok when Amount > 100 -> do No otherwise -> do Other }')
    assert "W301" not in by_code(flow_diagnostics(idiom))
    mixed = load('stage s { when Amount > 500 -> do Ok when Mood == Angry -> do No otherwise -> do Other }')
    assert "W301" in by_code(flow_diagnostics(mixed))


def test_a_special_case_written_first_is_not_an_overlap() -> None:
    """`when Mood == Angry and Amount > 500` before `when Mood == Angry`: the earlier guard implies the
    later one, the usual way to write the special case first (it was W301); a partial overlap still is."""
    first = load('stage s { when Mood == Angry and Amount > 500 -> do Ok when Mood == Angry -> do No '
                 'otherwise -> do Other }')
    assert "W301" not in by_code(flow_diagnostics(first))
    # implied only where the stage is reached: `t` is entered with Amount > 500 only
    reached = load('stage s { when Amount > 500 -> t otherwise -> do Other }\n'
                   'stage t { when Mood == Angry and Amount > 100 -> do Ok when Mood == Angry -> do No '
                   'otherwise -> do Other }')
    assert "W301" not in by_code(flow_diagnostics(reached))
    partial = load('stage s { when Mood == Angry and Amount > 500 -> do Ok when Kind == A -> do No '
                   'otherwise -> do Other }')
    assert "W301" in by_code(flow_diagnostics(partial))


def test_arms_doing_the_same_action_with_the_same_arguments_are_not_overlaps() -> None:
    """Issue 29 item 18: four arms `-> do Cancel(ref = Amount)` warned three times (each argument's span
    made the targets differ); the same call with other arguments or outputs still overlaps, and the note
    then tells the two apart instead of reading "takes `do Cancel`, never `do Cancel`"."""
    head = 'action Cancel(ref: int[0..1000], how: Soft | Hard) "cancel"\noutput Why: X | Y = X\n'
    arm = "-> do Cancel(ref = Amount + 1 - 1, how = Soft) { Why = Y }"
    same = load(head + f"stage s {{ when Kind == A {arm} when Mood == Angry {arm} when Score > 0.5 {arm} "
                       f"when Amount > 10 {arm} otherwise -> do Other }}")
    assert "W301" not in by_code(flow_diagnostics(same))
    for other in ("-> do Cancel(ref = Amount + 1 - 1, how = Hard) { Why = Y }",
                  "-> do Cancel(ref = Amount - 1 + 1, how = Soft) { Why = Y }",
                  "-> do Cancel(ref = Amount + 1 - 1, how = Soft) { Why = X }"):
        sc = load(head + f"stage s {{ when Kind == A {arm} when Mood == Angry {other} otherwise -> do Other }}")
        (d,) = by_code(flow_diagnostics(sc))["W301"]
        written = other.removeprefix("-> ")
        assert d.notes[-1] == ("for these values the engine takes `Kind == A -> do Cancel(ref = Amount + 1 - 1, "
                               f"how = Soft) {{ Why = Y }}`, never `{written}`")
        assert_witnesses_verified(sc, [d])


def test_flow_is_skipped_with_a_note_on_programs_too_large_to_analyse() -> None:
    sc = load_source(None, text=gen.generate(4000, kind="diamond", seed=3)).scenario
    assert sc is not None
    diags = flow_diagnostics(sc)
    assert [d.code for d in diags] == ["I301"] and diags[0].severity == "info"


MISSING_THEN_READ = """
scenario s "s"
field Hardship: bool "h"
system PriorPlans: int[0..5] "p"
system LastPayment: date? "last payment"
action Refuse "r"
action Human "h" [escalation]
action Plan "p"
let DaysSince = days_between(LastPayment, now)
stage plan "Payment plan" {
    when PriorPlans >= 3 -> do Refuse
    otherwise when missing(LastPayment) -> do Human
    when DaysSince > 90 and not Hardship -> do Refuse
    otherwise -> do Plan
}
"""


def test_a_read_of_a_value_known_missing_is_empty_not_undecided() -> None:
    """Whether `DaysSince > 90` overlaps the earlier `missing(LastPayment)`: with the value missing
    the engine refuses the read, so no values take both. The search could not show it (`now` has
    unbounded candidates) and the solver does not model absence: this was an I302 at the scenario's
    name ("2 feasibility questions stayed undecided")."""
    diags = sopgraph_check(load_source(None, text=MISSING_THEN_READ).scenario)
    assert [d.code for d in diags] == [], [d.message for d in diags]


def test_strict_reads_skip_what_evaluation_may_skip() -> None:
    from sopgraph.logic.domain import strict_reads

    sc = load_source(None, text=MISSING_THEN_READ).scenario
    assert sc is not None
    guards = [b.guard for b in sc.stages["plan"].branches]
    assert strict_reads(sc, guards[0]) == {"PriorPlans"}
    assert strict_reads(sc, guards[1]) == frozenset()  # `missing(X)` reads no value
    assert strict_reads(sc, guards[2]) == {"LastPayment", "now"}  # `not Hardship` may be skipped


UNDECIDED = """
scenario s "s"
system Ref: string "a reference"
system Code: string "a code"
action A "a"
action B "b"
stage first "first" {
    -> second
}
stage second "second" {
    when Ref matches "(?>ab)c" -> do A
    otherwise -> do B
}
"""


def test_i302_names_the_open_question_and_where_it_arose() -> None:
    """An undecided feasibility question (a pattern the example generator cannot build, which the solver
    does not model) is reported at the stage where it arose, with its condition, instead of at the
    scenario's name with the conditions kept whole for another reason."""
    diags = sopgraph_check(load_source(None, text=UNDECIDED).scenario)
    (note,) = [d for d in diags if d.code == "I302"]
    assert note.span.line == 10, note.span  # `stage second`
    assert any('undecided: `Ref matches "(?>ab)c"`' in n for n in note.notes), note.notes


def test_i302_says_at_which_stage_a_bound_or_an_open_question_was_met() -> None:
    """Issue 31: an exploration bound gave I302 at the scenario's name with no stage; it is located at the
    stage where the bound was met and names it, and an undecided question's stage is named too."""
    sc = load('stage first "first" { match Kind { A -> second B -> third otherwise -> do Ok } }\n'
              'stage second "second" { when Mood == Angry -> third otherwise -> do No }\n'
              'stage third "third" { when Amount > 10 -> do Ok otherwise -> do No }\n')
    (note,) = [d for d in flow_diagnostics(sc, budget=1) if d.code == "I302"]
    assert note.span is not None and note.span.line == 11, note.span  # `stage second`
    assert note.message == ("flow analysis incomplete: the exploration reached its bound on states or region size "
                            "at stage `second`; never-taken branches (W303/W304) were not checked")
    (open_,) = [d for d in sopgraph_check(load_source(None, text=UNDECIDED).scenario) if d.code == "I302"]
    assert "stayed undecided, the first at stage `second` (" in open_.message


def test_w303_on_a_field_tested_again_says_it_keeps_its_value() -> None:
    """Ask for a reference, then test it again: the field has one value for the whole conversation, so the
    second test can only go one way; the hint says so (and not for a system value tested twice)."""
    from sopgraph.logic.checker import check_file

    def w303(text: str) -> str:
        (d,) = [d for d in check_file("t.sop", text=text).diagnostics if d.code == "W303"]
        return d.hint or ""

    field = w303('field Ref: string? "r"\naction Ask "a"\naction Human "h"\naction Go "g"\n'
                 'stage s { when missing(Ref) -> do Ask -> t\n otherwise -> do Go }\n'
                 'stage t { when missing(Ref) -> do Human\n otherwise -> do Go }\n')
    assert "`Ref` keeps one value for the whole conversation" in field and "`observe`" in field
    system = w303('system Late: bool "l"\naction Ask "a"\naction Human "h"\naction Go "g"\n'
                  'stage s { when Late -> do Ask -> t\n otherwise -> do Go }\n'
                  'stage t { when Late -> do Human\n otherwise -> do Go }\n')
    assert "keeps one value" not in system


def test_the_flow_checks_see_only_looks_that_can_happen() -> None:
    # `recheck` looks at ServiceRestored after switching airplane mode off, which affects nothing: with
    # `affects` on the restart only, its look is the first one again and its `when ServiceRestored` arm
    # is dead (W303); marked `volatile`, the variable may change by itself and the arm lives
    from test_unroll import RESTART_AFFECTS, VOLATILE

    def check(text: str) -> list:
        loaded = load_source(text=text, name="n.sop")
        assert loaded.scenario is not None
        return sopgraph_check(loaded.scenario)

    held = [d for d in check(RESTART_AFFECTS) if d.code in ("W303", "W304")]
    assert [(d.code, d.span.line) for d in held] == [("W303", 84)]
    assert "recheck" in held[0].message
    assert not [d for d in check(VOLATILE) if d.code in ("W303", "W304")]

def test_a_route_whose_region_splits_at_every_stage_stays_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A condition that would cut a box into many pieces (list membership over the looks) is kept on it as one
    literal the solver decides (`Space.split`), so the whole-route regions stay small: the analysis ends,
    complete, with the overlaps and the never-taken `all(t in Tags where t == Red)` after `Red in Tags` failed.
    Before, the regions multiplied at every stage until the bound on region size stopped it (I302)."""
    from helpers import SPLITTING_ROUTES, box_counter

    from sopgraph import load
    from sopgraph.logic import domain
    from sopgraph.logic.flow import FlowWork
    from sopgraph.logic.lower import analysis_form

    counted, stats = box_counter(200_000)
    monkeypatch.setattr(domain.Space, "constrain_region", counted)
    flat = analysis_form(load(text=SPLITTING_ROUTES, check=False)).scenario
    work = FlowWork()
    found = flow_diagnostics(flat, work=work)
    assert not [d for d in found if d.code == "I302"]
    assert any(d.code == "W301" for d in found)
    never = [d.message for d in found if d.code == "W304"]
    assert any("== Red and (len(Tags" in m and "do Go" in m for m in never)
    assert stats["boxes"] < 20_000 and not work.out_of_time


def test_past_its_cpu_budget_the_flow_analysis_says_where_and_on_what() -> None:
    from helpers import SPLITTING_ROUTES

    from sopgraph import load
    from sopgraph.logic.flow import FlowWork
    from sopgraph.logic.lower import analysis_form

    flat = analysis_form(load(text=SPLITTING_ROUTES, check=False)).scenario
    work = FlowWork()
    found = flow_diagnostics(flat, work=work, cpu_budget=0.0)
    (note,) = [d for d in found if d.code == "I302"]
    assert work.out_of_time
    assert "CPU budget (0 s of CPU) at stage `s0`" in note.message
    assert "while exploring which values reach each stage" in note.message
    assert note.span is not None and note.span.line == 9  # the stage, not the file's header


def test_sop_check_takes_a_cpu_budget_and_says_where_it_stopped() -> None:
    from click.testing import CliRunner

    from sopgraph.cli import main

    sop = Path(__file__).resolve().parent.parent / "examples" / "bike_rental.sop"
    result = CliRunner().invoke(main, ["check", "--cpu-budget", "0", str(sop)])
    assert result.exit_code == 0, result.output
    assert "info[I302]: flow analysis incomplete: the analysis reached its CPU budget (0 s of CPU) at stage " \
           "`step1` while exploring which values reach each stage" in result.output
    assert "I302" not in CliRunner().invoke(main, ["check", str(sop)]).output  # the default budget is ample


def test_a_huge_guard_is_quoted_short_in_the_flow_warnings() -> None:
    """W301 and W303 quote the guards they are about; a guard thousands of characters long is clipped (its start
    and end on one line), the span still points at it."""
    from sopgraph.logic.checker import check_file

    big = " or ".join(f"N == {k}" for k in range(600))
    text = ("scenario h \"H\"\nsystem N: int[0..1000] \"n\"\naction A \"a\"\naction B \"b\"\n"
            f"stage s {{ when N >= 0 -> do A  when {big} -> do B  otherwise -> do A }}\n")
    found = [d for d in check_file("h.sop", text=text).diagnostics if d.code in ("W301", "W303", "W304")]
    assert found
    for d in found:
        assert len(d.message) < 400 and all(len(n) < 400 for n in d.notes) and len(d.hint or "") < 400, d.code
        assert " … " in d.message + "".join(d.notes)
