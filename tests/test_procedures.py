"""Procedures (issue 9): actions on the way, observations, bounded retries, reuse, and what every
tool derives from them (engine trace, paths, checker, prompt, schema, render, CLI)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import sopgraph
from sopgraph.cli import main as cli_main
from sopgraph.language import ir
from sopgraph.language.compile import compile_graph
from sopgraph.language.parse import load_source
from sopgraph.language.render import to_dot
from sopgraph.language.schema import agent_output_schema, validate
from sopgraph.logic import paths
from sopgraph.logic.checker import check
from sopgraph.logic.engine import DecideError, Engine, decide, interpret, reference_trace
from sopgraph.logic.unroll import unroll
from sopgraph.simulation.prompts import agent_sop_text, example_reply

ROOT = Path(__file__).resolve().parent.parent
NO_SERVICE = ROOT / "examples" / "no_service.sop"

RETRY = """
system Fixed: bool "whether it works now"
action Try(n: int[1..3], mode: Soft | Hard) "try a fix"
action Done "done" [ends_dialogue]
action Human "escalate" [escalation]
stage look "Look" {
    observe Fixed
    when Fixed -> do Done
    otherwise -> fix
}
stage fix "Fix" {
    -> do Try(n = 1, mode = Soft) -> look up to 2 times
    otherwise -> do Human
}
"""


def load(text: str) -> ir.Scenario:
    return sopgraph.load(text=text)


def codes(text: str) -> list[str]:
    loaded = load_source(text=text)
    assert loaded.scenario is not None, [d.message for d in loaded.diagnostics]
    return [d.code for d in check(loaded.scenario) if d.severity != "info"]


# -- language ---------------------------------------------------------------------------------

def test_steps_args_observe_and_bounds_parse_into_the_ir() -> None:
    s = load(RETRY)
    fix = s.stages["fix"]
    assert s.stages["look"].observe == ["Fixed"]
    first = fix.branches[0]
    assert first.limit == 2 and first.guard is None
    assert [c.action for c in first.target.steps] == ["Try"]
    assert [(a.name, ir.show(a.value)) for a in first.target.steps[0].args] == [("n", "1"), ("mode", "Soft")]
    assert first.target.stage == "look" and fix.branches[1].target.action == "Human"
    assert [p.name for p in s.actions["Try"].params] == ["n", "mode"]
    assert s.procedural and s.observed == ["Fixed"] and s.traced


def test_type_alias_is_shared_and_an_unknown_alias_is_e101() -> None:
    s = load('type Level = Low | Mid | High\nfield A: Level "a"\nsystem B: Level "b"\naction Go(l: Level) "g"\n'
             'stage s { when A == B -> do Go(l = A) otherwise -> do Go(l = Low) }')
    assert s.variables["A"].type.values == s.variables["B"].type.values == ["Low", "Mid", "High"]
    assert s.actions["Go"].params[0].type.values == ["Low", "Mid", "High"]
    loaded = load_source(text='field A: Levl "a"\naction Go "g"\nstage s { when A == X -> do Go otherwise -> do Go }')
    assert [d.code for d in loaded.diagnostics] == ["E101"]


def test_a_type_may_share_its_name_with_a_variable(tmp_path: Path) -> None:
    """Issue 29 item 15: types have their own namespace (`type Cabin = …` + `system Cabin: Cabin` was E102
    and then a misleading E101; from an include, "undefined type"); two types of one name stay E102."""
    body = ('system Cabin: Cabin "the cabin booked"\nfield Seat: Seat "seat"\naction A "a"\naction B "b"\n'
            'stage s { when Cabin == Economy and Seat.window -> do A otherwise -> do B }\n')
    types = 'type Cabin = Economy | Business\ntype Seat = record { window: bool, row: int[1..40] }\n'
    for text in (types + body, body + types):
        s = load(text)
        assert s.variables["Cabin"].type.values == ["Economy", "Business"]
        assert codes(text) == []
    (tmp_path / "types.sop").write_text(types, encoding="utf-8")
    (tmp_path / "main.sop").write_text('include "types.sop"\n' + body, encoding="utf-8")
    assert sopgraph.load(path=tmp_path / "main.sop").variables["Cabin"].type.alias == "Cabin"
    twice = load_source(text=types + 'type Cabin = First | Coach\n' + body)
    assert [(d.code, d.message.split(" at ")[0]) for d in twice.diagnostics] == [
        ("E102", "type `Cabin` is already declared")]


def test_contextual_words_stay_usable_as_names() -> None:
    s = load('field to: bool "t"\nfield type: bool "y"\nfield times: bool "z"\nfield up: bool "u"\n'
             'field else: bool "e"\naction Go "g"\n'
             'stage s { when to and type and times and up and else -> do Go otherwise -> do Go }')
    assert {"to", "type", "times", "up", "else"} <= set(s.variables)  # `else` is only a hint word


def test_a_subflow_uses_a_subflow_and_start_names_an_instance() -> None:
    s = load('''
field Ok: bool "ok"
field Vip: bool "vip"
action Go "g"
action Stop "s"
subflow inner(done) { stage a { when Ok -> done otherwise -> do Stop } }
subflow outer(next) {
    stage b { -> chk }
    use inner as chk(done -> c)
    stage c { when Vip -> next otherwise -> do Stop }
}
stage main { -> do Go }
use outer as gate(next -> main)
start gate
''')
    assert s.start == "gate.b"
    assert s.stages["gate.b"].branches[0].target.stage == "gate.chk.a"
    assert s.stages["gate.chk.a"].branches[0].target.stage == "gate.c"
    assert decide(s, {"Ok": True, "Vip": True}).path == ["gate.b", "gate.chk.a", "gate.c", "main"]


def test_a_subflow_using_itself_is_e105() -> None:
    loaded = load_source(text='action Go "g"\nsubflow f(x) { stage a { -> x } use f as again(x -> x) }\n'
                              'stage s { -> i }\nuse f as i(x -> do Go)')
    assert "E105" in [d.code for d in loaded.diagnostics]


# -- engine -----------------------------------------------------------------------------------

@pytest.mark.parametrize("looks, path, trace", [
    ([True], ["look"], ["Done"]),
    ([False, True], ["look", "fix", "look"], ["Try", "Done"]),
    ([False, False, True], ["look", "fix", "look", "fix", "look"], ["Try", "Try", "Done"]),
    ([False, False, False], ["look", "fix", "look", "fix", "look", "fix"], ["Try", "Try", "Human"]),
])
def test_each_look_is_a_new_value_and_the_retry_is_bounded(looks: list[bool], path: list[str],
                                                           trace: list[str]) -> None:
    s = load(RETRY)
    for got in (interpret(s, {"Fixed": looks}), Engine(s).decide({"Fixed": looks})):
        assert got.path == path
        assert [a["name"] for a in got.actions] == trace
        assert got.finals["Action"] == trace[-1]
    assert reference_trace(s, {"Fixed": looks})[0]["args"] in ({"n": 1, "mode": "Soft"}, {})


def test_action_arguments_are_evaluated_when_carried_out() -> None:
    s = load(NO_SERVICE.read_text())
    values = {"AccountSuspended": False, "AreaOutage": False, "SimDetected": True, "AirplaneMode": False,
              "Registered": "Roaming", "ServiceRestored": [False, False, True], "Mood": "Calm", "SimAgeYears": 1}
    d = decide(s, values)
    assert d.actions == [{"name": "PushSettings", "args": {"profile": "Roaming"}}, {"name": "AskRestart", "args": {}},
                         {"name": "PushSettings", "args": {"profile": "Roaming"}}, {"name": "AskRestart", "args": {}},
                         {"name": "CloseFixed", "args": {}}]
    values |= {"ServiceRestored": [False, False, False], "SimAgeYears": 5}
    assert decide(s, values).actions[-1] == {"name": "ReplaceSim", "args": {"fee": 0}}
    assert decide(s, {**values, "SimAgeYears": 2}).actions[-1] == {"name": "ReplaceSim", "args": {"fee": 10}}


@pytest.mark.parametrize("value, fragment", [
    (None, "missing value for `Fixed`"),
    (True, "is not a list"),
    ([], "missing look 1 of `Fixed`"),
    ([False], "missing look 2 of `Fixed`"),
    ([False, "yes"], "(look 2)"),
])
def test_bad_look_lists_are_precise_errors_in_both_engines(value: Any, fragment: str) -> None:
    s = load(RETRY)
    values = {} if value is None else {"Fixed": value}
    for fn in (lambda v: interpret(s, v), Engine(s).decide):
        with pytest.raises(DecideError) as info:
            fn(values)
        assert fragment in info.value.message


def test_sage_decisions_keep_their_shape() -> None:
    s = sopgraph.load(ROOT / "scenarios" / "telecom_package.sop")
    d = decide(s, {"ConsumptionType": "Cancel", "Penalty": 0})
    assert d.actions == [{"name": "ChangeOrder", "args": {}}]
    assert not s.traced and not s.procedural
    res = CliRunner().invoke(cli_main, ["decide", str(ROOT / "scenarios" / "telecom_package.sop"), "--values",
                                        '{"ConsumptionType": "Cancel", "Penalty": 0}'])
    assert "actions" not in json.loads(res.output)


def test_cli_decide_reports_the_action_trace_of_a_procedure() -> None:
    res = CliRunner().invoke(cli_main, ["decide", str(NO_SERVICE), "--values", json.dumps({
        "AccountSuspended": False, "AreaOutage": True, "OutageHours": 4})])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output) == {"path": ["account"], "finals": {"Action": "ReportOutage"},
                                      "actions": [{"name": "ReportOutage", "args": {"hours": 4}}]}


# -- checker ----------------------------------------------------------------------------------

def test_the_retry_program_is_clean() -> None:
    assert codes(RETRY) == []
    assert codes(NO_SERVICE.read_text()) == []


@pytest.mark.parametrize("edit, code", [
    (("do Try(n = 1, mode = Soft)", "do Tyr(n = 1, mode = Soft)"), "E104"),
    (("do Try(n = 1, mode = Soft)", "do Try(n = 1, mood = Soft)"), "E109"),
    (("do Try(n = 1, mode = Soft)", "do Try(n = 1)"), "E109"),
    (("do Try(n = 1, mode = Soft)", "do Try(n = 1, mode = Medium)"), "E204"),
    (("do Try(n = 1, mode = Soft)", "do Try(n = 7, mode = Soft)"), "E204"),
    (("observe Fixed", 'observe Mood\n    when Mood == Calm -> do Done'), "E110"),
    (("observe Fixed", "observe Fxed"), "E101"),
    (("up to 2 times", "up to 0 times"), "E112"),
    (("    -> do Try(n = 1, mode = Soft) -> look up to 2 times\n    otherwise -> do Human",
      "    -> do Try(n = 1, mode = Soft) -> look"), "E302"),
    (("    observe Fixed\n", ""), "E111"),
    (("    observe Fixed\n", "    when Kind == A -> do Done\n"), "E111"),
])
def test_procedure_mistakes_are_reported(edit: tuple[str, str], code: str) -> None:
    old, new = edit
    assert old in RETRY
    text = RETRY.replace(old, new) + 'field Mood: Calm | Upset "mood"\nsystem Kind: A | B "k"\n'
    if code == "E111":  # the look happens in `fix`, after `look` has already read the value
        text = text.replace('stage fix "Fix" {\n', 'stage fix "Fix" {\n    observe Fixed\n')
    assert code in codes(text)


def test_a_retry_that_observes_nothing_is_w307() -> None:
    """Without `observe Fixed` every round of the loop reads the same value: the retry never succeeds."""
    still = RETRY.replace("    observe Fixed\n", "")
    found = [d for d in check(load(still)) if d.code == "W307"]
    assert len(found) == 1 and "`look`" in found[0].message
    assert found[0].hint is not None and "`observe Fixed`" in found[0].hint
    assert found[0].span.line == RETRY.splitlines().index("    -> do Try(n = 1, mode = Soft) -> look up to 2 times")
    assert "W307" not in codes(RETRY)  # the look in the loop: clean
    # the look on another stage of the same loop counts too
    moved = still.replace('stage fix "Fix" {\n', 'stage fix "Fix" {\n    observe Fixed\n')
    assert "W307" not in codes(moved)


def test_an_overlap_hint_quotes_the_guard_as_written() -> None:
    """W301's hint in a procedure says `otherwise when Fixed`, not the analysis copy's `Fixed#1`."""
    text = RETRY.replace("    when Fixed -> do Done\n", "    when Kind == A -> do Human\n    when Fixed -> do Done\n")
    found = [d for d in check(load(text + 'system Kind: A | B "k"\n')) if d.code == "W301"]
    assert found and found[0].hint is not None
    assert "`otherwise when Fixed`" in found[0].hint and "#" not in found[0].hint


BACKSLASH_GUARDS = """
system Code: string "the code the caller reads out"
system Ok: bool "whether it works now"
action Fix "fix" [ends_dialogue]
action Done "done" [ends_dialogue]
action Give "give up" [escalation]
stage s "Check" {
    observe Ok
    when Ok -> do Done
    when Code matches "\\d+" -> do Fix -> s up to 2 times
    when Code == "\\\\1" -> do Fix -> s up to 2 times
    when Code == "\\\\g<0>" or Code == "x\\\\2`" -> do Give
    otherwise -> do Give
}
"""


def test_an_overlap_hint_takes_backslashes_in_guards_literally(tmp_path: Path) -> None:
    """Issue 29 item 1: W301's hint quotes a guard holding `\\d`, `\\1` or `\\g<0>` as written (it was used
    as a `re.sub` template: `re.error: bad escape \\d` crashed every command loading the file)."""
    scenario = load(BACKSLASH_GUARDS)
    found = [d for d in check(scenario) if d.code == "W301"]
    hints = [d.hint or "" for d in found]
    assert len(found) == 3, [d.message for d in found]
    for branch, hint in zip(scenario.stages["s"].branches[1:4], hints, strict=True):
        assert branch.guard is not None
        assert hint.endswith(f"write `otherwise when {ir.show(branch.guard)}` to say so")  # a backtick too
    assert "\\d+" in hints[0] and "\\1" in hints[1] and "\\g<0>" in hints[2]
    (tmp_path / "codes.sop").write_text(BACKSLASH_GUARDS, encoding="utf-8")
    result = CliRunner().invoke(cli_main, ["check", str(tmp_path / "codes.sop")])
    assert result.exit_code == 0 and result.exception is None, result.output
    assert "W301" in result.output and "Traceback" not in result.output


def test_spent_copies_do_not_make_branches_look_dead() -> None:
    # the bounded branch is spent on the last visit of `fix`: no W304 "never taken" for it
    assert "W304" not in codes(RETRY)
    dead = RETRY.replace("otherwise -> fix", "when Fixed -> fix\n    otherwise -> do Human")
    assert "W304" in codes(dead)  # really dead in every copy: still reported


def test_unused_checks_see_step_actions_and_argument_reads() -> None:
    text = RETRY.replace("do Try(n = 1, mode = Soft)", "do Try(n = 1, mode = Kind2)") + \
        'system Kind2: Soft | Hard "kind, read only as an argument"\n'
    assert codes(text) == []


def test_else_when_silences_an_intended_overlap_and_same_effect_arms_are_not_w301() -> None:
    base = 'field A: bool "a"\nfield B: bool "b"\naction X "x"\naction Y "y"\n'
    assert "W301" in codes(base + "stage s { when A -> do X when B -> do Y otherwise -> do Y }")
    assert "W301" not in codes(base + "stage s { when A -> do X otherwise when B -> do Y otherwise -> do Y }")
    assert "W301" not in codes(base + "stage s { when A -> do X when B -> do X otherwise -> do Y }")


def test_threshold_idiom_on_a_derived_sum_is_not_w301() -> None:
    text = ('system P: int[0..10] "p"\nsystem Q: int[0..10] "q"\nlet Total = P + Q\naction X "x"\naction Y "y"\n'
            'action Z "z"\nstage s { when Total > 15 -> do X when Total > 5 -> do Y otherwise -> do Z }')
    assert codes(text) == []


# -- paths, witnesses, unrolling --------------------------------------------------------------

def test_paths_of_a_procedure_carry_traces_and_look_sequences() -> None:
    s = load(RETRY)
    infos = list(paths.iter_paths(s))
    assert paths.count_paths(s).feasible == len(infos) == 4
    assert [p.actions for p in infos] == [["Done"], ["Try(n = 1, mode = Soft)", "Done"],
                                          ["Try(n = 1, mode = Soft)", "Try(n = 1, mode = Soft)", "Done"],
                                          ["Try(n = 1, mode = Soft)", "Try(n = 1, mode = Soft)", "Human"]]
    for info in infos:
        assert info.status == "feasible"
        looks = info.witness["Fixed"]
        assert len(looks) == info.stages.count("look")  # one value per look the path takes
        got = decide(s, info.witness)
        assert got.path == info.stages and got.finals == info.witness_finals
    again = paths.path_by_decisions(s, infos[2].stages, infos[2].branches)
    assert again is not None and again.id == infos[2].id
    assert {p.id for p in paths.sample_paths(s, 10, seed=3)} <= {p.id for p in infos}


def test_unrolled_form_names_each_look() -> None:
    u = unroll(load(RETRY))
    assert u.looks == {"Fixed": 3}
    assert {"Fixed#1", "Fixed#2", "Fixed#3"} <= set(u.scenario.variables) and "Fixed" not in u.scenario.variables
    assert set(u.origin.values()) == {"look", "fix"}
    assert u.lift(u.flatten({"Fixed": [False, True], "Kind": "A"})) == {"Fixed": [False, True], "Kind": "A"}


def test_loop_path_count_is_exact_for_nested_retries() -> None:
    # k independent two-way retries in sequence: 3 outcomes each (ok first, ok after retry, give up)
    k = 6
    lines = ['action Fix "f"', 'action Done "d"', 'action Give "g"']
    for i in range(k):
        nxt = f"c{i + 1}" if i + 1 < k else None
        lines.append(f'system S{i}: bool "s"')
        done = f"-> {nxt}" if nxt else "-> do Done"
        lines.append(f"stage c{i} {{ observe S{i} when S{i} {done} otherwise -> r{i} }}")
        lines.append(f"stage r{i} {{ -> do Fix -> c{i} up to 1 times otherwise -> do Give }}")
    s = load("\n".join(lines))
    # each check: ok at once, ok after one retry (continue), or give up (ends): paths = sum over stop points
    expected = 2 ** k + sum(2 ** i for i in range(k))
    assert paths.count_paths(s).feasible == expected
    assert sum(1 for _ in paths.iter_decisions(s)) == expected


# -- downstream -------------------------------------------------------------------------------

def test_prompt_tells_the_steps_checks_and_bounds() -> None:
    text = agent_sop_text(load(NO_SERVICE.read_text()))
    assert "Check again now: ServiceRestored" in text
    assert "carry out PushSettings (profile = Registered), then carry out AskRestart, then go to retest" in text
    assert "at most 2 times in this conversation" in text
    assert "- ReplaceSim(fee: an integer from 0 to 10)" in text or "- ReplaceSim(fee:" in text
    assert "`actions` lists every action you have carried out" in text


def test_agent_schema_accepts_the_reference_trace_and_rejects_bad_args() -> None:
    s = load(NO_SERVICE.read_text())
    schema = agent_output_schema(s)
    reply = example_reply(s)
    assert validate(schema, reply) == []
    assert reply["actions"] == decide(s, {v.name: None for v in []} or _example_values(s)).actions
    bad = {**reply, "actions": [{"name": "PushSettings", "args": {"profile": "Mars"}}]}
    assert validate(schema, bad)
    assert "PushSettings" not in schema["properties"]["finals"]["properties"]["Action"]["enum"]
    sage = agent_output_schema(sopgraph.load(ROOT / "scenarios" / "telecom_package.sop"))
    assert "actions" not in sage["properties"]


def _example_values(s: ir.Scenario) -> dict[str, Any]:
    from sopgraph.simulation.prompts import _example_value

    values: dict[str, Any] = {v.name: _example_value(v.type) for v in s.variables.values() if v.role != "derived"}
    for name in s.observed:
        values[name] = [values[name]] * 16
    return values


def test_render_draws_steps_in_order_and_loops_dashed() -> None:
    s = load(NO_SERVICE.read_text())
    dot = to_dot(s)
    assert "do PushSettings(profile = Registered) → do AskRestart" in dot
    assert "loop: up to 2×" in dot and 'style="dashed"' in dot
    graph = compile_graph(s)
    assert "action:PushSettings" not in graph  # step-only actions live on the edges
    assert graph.nodes["status"]["observe"] == ["ServiceRestored"]


def test_cli_paths_table_shows_the_action_trace() -> None:
    res = CliRunner().invoke(cli_main, ["paths", str(NO_SERVICE), "--limit", "3", "--format", "json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)
    assert all(r["actions"] for r in rows)
    table = CliRunner().invoke(cli_main, ["paths", str(NO_SERVICE), "--limit", "3"])
    assert "actions" in table.output


def test_synthesized_cases_carry_one_value_per_look_and_decide_as_expected() -> None:
    from sopgraph.cases.profiles import load_profile
    from sopgraph.cases.synth import synthesize

    s = load(NO_SERVICE.read_text())
    profile = load_profile(ROOT / "examples" / "no_service.profile.yaml", s)
    result = synthesize(s, profile, 30, seed=2)
    assert result.coverage.feasible_paths == paths.count_paths(s).feasible == 14
    assert len([k for k, v in result.coverage.per_path.items() if v]) == paths.count_paths(s).feasible
    for case in result.cases:
        looks = case.system["ServiceRestored"]
        assert isinstance(looks, list) and len(looks) == sum(
            1 for sid in case.expected_path if s.stages[sid].observe)  # one value per look the path takes
        got = decide(s, {**case.truth, **case.system})
        assert got.path == case.expected_path and got.finals == case.expected_finals
    again = synthesize(s, profile, 30, seed=2)
    assert again.lines == result.lines  # deterministic


def test_bare_do_decisions_and_generated_loop_form_agree() -> None:
    s = load('action N(k: int[0..9]) "n"\naction Go "g"\nsystem X: int[0..9] "x"\n'
             "stage a { do N(k = X) -> b }\nstage b { do Go }")
    assert decide(s, {"X": 3}).actions == [{"name": "N", "args": {"k": 3}}, {"name": "Go", "args": {}}]


def test_run_start_validation_takes_one_value_per_look() -> None:
    """A case for a procedure gives an observed variable as a list; each look is checked, a bare value
    is refused with a hint."""
    from sopgraph.cases.validate import case_problems
    from sopgraph.records import Case

    s = load(RETRY)
    good = Case.model_construct(id="c1", scenario=s.name, truth={}, system={"Fixed": [False, True]},
                                expected_path=["look", "fix", "look"], expected_finals={})
    assert case_problems(s, good) == []
    bare = good.model_copy(update={"system": {"Fixed": True}})
    assert any("is not a list" in p for p in case_problems(s, bare))
    wrong = good.model_copy(update={"system": {"Fixed": [False, "yes"]}})
    assert any("(look 2)" in p for p in case_problems(s, wrong))


VERIFY = """
field Vip: bool "v"
system Amount: int[0..1000] "a"
system IdentityOk: bool "whether the identity check passed"
action SendCode "send a code"
action Fail "fail" [ends_dialogue]
action Big "big"
action Small "small"
stage verify "Identity" {
    observe IdentityOk
    when IdentityOk -> pay
    when not IdentityOk -> do SendCode -> verify up to 2 times
    otherwise -> do Fail
}
stage pay "Pay" {
    when Vip -> do Big
    when Amount > 100 -> do Small
    otherwise -> do Big
}
"""


def test_examples_give_only_the_looks_their_path_takes() -> None:
    """The W301 example reaches `pay` after one look: `IdentityOk=[true]`, not the three looks the
    unrolled form has variables for (which read as if later looks mattered)."""
    sc = load_source(None, text=VERIFY).scenario
    assert sc is not None
    (w301,) = [d for d in check(sc) if d.code == "W301"]
    assert w301.witness["IdentityOk"] == [True]
    assert paths.used_looks(sc, {"IdentityOk": [False, True, False], "Vip": True}) == {
        "IdentityOk": [False, True], "Vip": True}
    assert paths.used_looks(sc, {"IdentityOk": [True, True]}, stages=[]) == {}  # a path that never looks


def test_the_customer_never_knows_the_looks_of_an_observed_variable() -> None:
    """The looks of an observed variable are the backend's news after each action: not among the facts the
    simulated customer knows (`user_facts`), with the shipped profile, with none, or for a hand-written
    case; a profile that says `user_knows: true` still gets them."""
    from sopgraph.cases.profiles import default_profile, load_profile
    from sopgraph.cases.synth import synthesize
    from sopgraph.cases.validate import complete_case

    s = load(NO_SERVICE.read_text())
    shipped = load_profile(ROOT / "examples" / "no_service.profile.yaml", s)
    for profile in (shipped, default_profile(s)):
        cases = synthesize(s, profile, 20, seed=1).cases
        assert cases and all("ServiceRestored" not in c.user_facts for c in cases)
        # the system facts the profile says a customer sees are still known (none without a profile)
        assert any(c.user_facts for c in cases) == (profile is shipped)
    told = shipped.model_copy(update={"user_knows": {**shipped.user_knows, "ServiceRestored": True}})
    cases = synthesize(s, told, 20, seed=1).cases
    assert any(c.user_facts.get("ServiceRestored") == c.system["ServiceRestored"] for c in cases)
    hand = complete_case(s, {"truth": cases[0].truth, "system": cases[0].system})
    assert "ServiceRestored" not in hand["user_facts"]
