"""Procedures unrolled: observed lists and records (each look is a whole list or record) work in
check, decide (both engine forms and the interpreter), paths and synthesis — never a traceback."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from test_engine import PROC_VALUES as _PROC_VALUES
from test_engine import _procedure as _random_procedure

import sopgraph
from sopgraph.cli import main as cli_main
from sopgraph.language import ir
from sopgraph.language.fmt import format_text
from sopgraph.logic import engine as engine_mod
from sopgraph.logic.checker import check
from sopgraph.logic.engine import DecideError, Engine, interpret
from sopgraph.logic.paths import count_paths, iter_paths
from sopgraph.logic.unroll import unroll
from sopgraph.simulation.agents import tool_schemas

OBSERVED_LIST = """
scenario obs "observed list"
type Fee = record { id: int[0..100], amount: float[0..1000] }
system Fees: list[..4] of Fee "The open fees, looked up anew at each check."
system Meta: record { n: int[0..9], ok: bool } "The account record, looked up anew."
action Refund "r"
action Done "d"
action Wait "w"
stage a {
    observe Fees, Meta
    when count(f in Fees where f.amount > 10) > 1 and Meta.ok -> do Wait -> b
    otherwise -> do Done
}
stage b {
    observe Fees
    when len(Fees) == 0 -> do Done
    otherwise -> do Refund(fee = sum(f.amount for f in Fees))
}
""".replace('action Refund "r"', 'action Refund(fee: float[0..4000]) "r"')


def _engines(scenario: ir.Scenario) -> list[Engine]:
    tree = Engine(scenario)
    saved = engine_mod._expanded_size
    engine_mod._expanded_size = lambda s: None  # the table-driven loop form
    try:
        loop = Engine(scenario)
    finally:
        engine_mod._expanded_size = saved
    return [tree, loop]


def _outcome(fn: Any, values: dict[str, Any]) -> Any:
    try:
        d = fn(values)
    except DecideError as exc:
        return exc.message
    return (list(d.path), dict(d.finals), list(d.actions))


def test_each_look_at_an_observed_list_is_its_own_list() -> None:
    s = sopgraph.load(text=OBSERVED_LIST)
    two = [{"id": 1, "amount": 20}, {"id": 2, "amount": 30}]
    values = {"Fees": [two, [{"id": 3, "amount": 5.5}]], "Meta": [{"n": 1, "ok": True}]}
    expected = (["a", "b"], {"Action": "Refund"},
                [{"name": "Wait", "args": {}}, {"name": "Refund", "args": {"fee": 5.5}}])
    assert _outcome(lambda v: interpret(s, v), values) == expected
    for eng in _engines(s):
        assert eng.mode in ("tree", "loop")  # compiled, not the interpreter fallback
        assert _outcome(eng.decide, values) == expected
    # the second look is read from the second list, the first look's list is not reused
    assert sopgraph.decide(s, {**values, "Fees": [two, []]}).finals == {"Action": "Done"}


def test_paths_and_synthesis_of_an_observed_list() -> None:
    s = sopgraph.load(text=OBSERVED_LIST)
    assert unroll(s).looks == {"Fees": 2, "Meta": 1}
    paths = list(iter_paths(s))
    assert [p.stages for p in paths] == [["a", "b"], ["a", "b"], ["a"]]
    assert count_paths(s).feasible == 3
    assert "len(Fees) == 0" in paths[0].constraints["where"]
    for p in paths:
        assert p.witness is not None
        assert len(p.witness["Fees"]) == len(p.stages)  # one list per look the path takes
        assert sopgraph.decide(s, p.witness).finals == p.witness_finals
    result = sopgraph.synthesize(s, 6, seed=1)
    for case in result.cases:
        assert sopgraph.decide(s, {**case.truth, **case.system}).path == case.expected_path


# ---------------------------------------------------------------------------------------------
# Property: generated procedures observing lists and records never crash a command

HEAD = [
    'type Item = record { amount: int[0..50], ok: bool }',
    'system Items: list[..2] of Item "items"',
    'system Box: record { level: int[0..5], open: bool } "box"',
    'system Tags: list[1..2] of Red | Blue "tags"',
    'system Flag: bool "flag"',
    'action Note "note"',
    'action Pay(amount: int[0..200]) "pay"',
    'action Go "go"',
]

GUARDS = [
    "len(Items) > 1", "any(i in Items where i.ok)", "count(i in Items where i.amount > 20) >= 1",
    "sum(i.amount for i in Items) > 40", "Box.open", "Box.level >= 3", "Red in Tags", "Blue not in Tags",
    "all(t in Tags where t == Red)", "Flag", "not Flag and Box.level == 0",
]
ARGS = ["0", "Box.level", "sum(i.amount for i in Items)", "len(Tags)"]


@st.composite
def _program(draw: Any) -> str:
    n = draw(st.integers(1, 3))
    lines = list(HEAD)

    def target(i: int) -> str:
        steps = "".join(draw(st.lists(st.sampled_from(
            ["do Note -> ", f"do Pay(amount = {draw(st.sampled_from(ARGS))}) -> "]), max_size=2)))
        leaf = draw(st.sampled_from(["do Go", f"do Pay(amount = {draw(st.sampled_from(ARGS))})"]))
        return steps + draw(st.sampled_from([f"s{j}" for j in range(i + 1, n)] + [leaf]))

    for i in range(n):
        observed = draw(st.lists(st.sampled_from(["Items", "Box", "Tags"]), unique=True, max_size=3))
        if i == 0:
            observed = sorted(set(observed) | {"Items", "Box", "Tags"})
        observe = f"observe {', '.join(observed)} " if observed else ""
        arms = [f"when {draw(st.sampled_from(GUARDS))} -> {target(i)}" for _ in range(draw(st.integers(1, 3)))]
        if i + 1 < n and draw(st.booleans()):
            arms.append(f"when {draw(st.sampled_from(GUARDS))} -> s{draw(st.integers(0, i))} up to 2 times")
        arms.append(f"otherwise -> {target(i)}")
        lines.append(f"stage s{i} {{ {observe}{' '.join(arms)} }}")
    return "\n".join(lines) + "\n"


_ITEM = st.fixed_dictionaries({"amount": st.integers(0, 50), "ok": st.booleans()})
_LOOK = {
    "Items": st.one_of(st.lists(_ITEM, max_size=3), st.lists(_ITEM, max_size=3), st.just([{"amount": 1}]),
                       st.just(3)),
    "Box": st.one_of(st.fixed_dictionaries({"level": st.integers(0, 5), "open": st.booleans()}), st.just([])),
    "Tags": st.one_of(st.lists(st.sampled_from(["Red", "Blue"]), min_size=1, max_size=3), st.just([])),
}
VALUES = st.fixed_dictionaries(
    {"Flag": st.booleans()},
    optional={name: st.lists(look, max_size=5) for name, look in _LOOK.items()})


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(_program(), st.lists(VALUES, min_size=1, max_size=6))
def test_no_command_crashes_on_observed_lists_and_records(text: str, rows: list[dict[str, Any]]) -> None:
    scenario = sopgraph.load(text=text, check=False)
    diagnostics = check(scenario)  # never raises: problems are diagnostics
    if any(d.is_error for d in diagnostics):
        return
    engines = _engines(scenario)
    for values in rows:
        expected = _outcome(lambda v: interpret(scenario, v), values)
        for eng in engines:
            assert _outcome(eng.decide, values) == expected, eng.mode
    count = count_paths(scenario)
    paths = list(iter_paths(scenario, limit=40))
    assert paths and count.feasible >= len(paths)
    for p in paths:
        if p.witness is not None:
            assert interpret(scenario, p.witness).path == p.stages


# ---------------------------------------------------------------------------------------------
# `affects`: actions change the world, looks see it

NO_SERVICE = (Path(__file__).resolve().parent.parent / "examples" / "no_service.sop").read_text(encoding="utf-8")
RESTART_AFFECTS = NO_SERVICE.replace(
    'action AskRestart "Ask the caller to restart the phone and wait until it has started."',
    'action AskRestart "Ask the caller to restart the phone and wait until it has started." affects ServiceRestored')
STILL = {"AccountSuspended": False, "AreaOutage": False, "SimDetected": True, "AirplaneMode": True,
         "Registered": "Home", "Mood": "Calm", "SimAgeYears": 1}


def test_a_look_with_nothing_done_since_the_last_sees_the_same_value() -> None:
    s = sopgraph.load(text=RESTART_AFFECTS)
    assert s.actions["AskRestart"].affects == ["ServiceRestored"]
    # switching airplane mode off affects nothing: `recheck` sees the first look again (false), so the
    # second value of the list is the look after the first restart
    values = {**STILL, "ServiceRestored": [False, True]}
    expected = (["account", "status", "recheck", "fix", "retest"], {"Action": "CloseFixed"},
                [{"name": "AskAirplaneOff", "args": {}}, {"name": "PushSettings", "args": {"profile": "Home"}},
                 {"name": "AskRestart", "args": {}}, {"name": "CloseFixed", "args": {}}])
    assert _outcome(lambda v: interpret(s, v), values) == expected
    for eng in _engines(s):
        assert _outcome(eng.decide, values) == expected
    # the session never asks for the look nothing could change
    session = sopgraph.start(s, STILL)
    asked = []
    for event in session:
        if isinstance(event, sopgraph.Need):
            asked.append((event.look, event.stage))
            session.provide(event.variable, event.look == 2)
    assert asked == [(1, "status"), (2, "retest")]
    # without `affects` every look is a new value, as before
    plain = sopgraph.load(text=NO_SERVICE)
    assert sopgraph.decide(plain, values).path == ["account", "status", "recheck"]


def test_only_physically_possible_look_sequences_are_paths() -> None:
    plain, held = sopgraph.load(text=NO_SERVICE), sopgraph.load(text=RESTART_AFFECTS)
    assert count_paths(plain).feasible == 14
    assert count_paths(held).feasible == 13  # `recheck` cannot see service back: nothing was done
    for p in iter_paths(held):
        assert p.witness is not None
        assert interpret(held, p.witness).path == p.stages
        assert len(p.witness["ServiceRestored"]) <= 1 + p.stages.count("retest")
    result = sopgraph.synthesize(held, 12, seed=2)
    for case in result.cases:
        values = {**case.truth, **case.system}
        assert sopgraph.decide(held, values).path == case.expected_path
        assert len(values["ServiceRestored"]) <= 1 + case.expected_path.count("retest")


@pytest.mark.parametrize("edit, code", [
    ("affects ServiceRestored", "affects ServiceRestord"),  # undefined: E101 with a did-you-mean
    ("affects ServiceRestored", "affects AirplaneMode"),     # never observed: E110
])
def test_affects_names_an_observed_variable(edit: str, code: str) -> None:
    diagnostics = check(sopgraph.load(text=RESTART_AFFECTS.replace(edit, code), check=False))
    errors = [d for d in diagnostics if d.is_error]
    assert len(errors) == 1
    if "Restord" in code:
        assert errors[0].code == "E101" and "did you mean `ServiceRestored`" in (errors[0].hint or "")
    else:
        assert errors[0].code == "E110" and "no stage observes" in errors[0].message
    assert errors[0].span.line == 58 and errors[0].span.col > 80  # points at the name in `affects`


@st.composite
def _held_procedure(draw: Any) -> str:
    """test_engine's random procedures with `affects` on some actions (Sig and Lvl held or not)."""
    text = draw(_random_procedure())
    for _action, decl in (("Note", 'action Note "note"'),
                         ("Ping", 'action Ping(k: int[0..1000], tag: A | B | C) "ping"')):
        names = draw(st.lists(st.sampled_from(["Sig", "Lvl"]), unique=True, max_size=2))
        if names:
            text = text.replace(decl, f"{decl} affects {', '.join(names)}")
    return text


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(_held_procedure(), st.lists(_PROC_VALUES, min_size=1, max_size=6))
def test_held_looks_mean_the_same_in_every_engine_form_and_in_paths(text: str, rows: list[dict[str, Any]]) -> None:
    scenario = sopgraph.load(text=text, check=False)
    engines = _engines(scenario)
    for values in rows:
        expected = _outcome(lambda v: interpret(scenario, v), values)
        for eng in engines:
            assert _outcome(eng.decide, values) == expected, eng.mode
        # a session is never asked for looks the run takes but does not read, so when a later look is
        # missing, its error counts the looks it was given, not the row's
        assert _unsized(_step_outcome(scenario, values)) == _unsized(expected)
    if any(d.is_error for d in check(scenario)):
        return
    for p in iter_paths(scenario, limit=30):
        if p.witness is not None:
            assert interpret(scenario, p.witness).path == p.stages


def _step_outcome(scenario: ir.Scenario, values: dict[str, Any]) -> Any:
    """The session's outcome, each look given when asked (only the looks the run takes are asked)."""
    start = {k: ([] if isinstance(v, list) else v) if k in ("Sig", "Lvl") else v for k, v in values.items()}
    session = sopgraph.start(scenario, start)
    acts: list[dict[str, Any]] = []
    try:
        for event in session:
            if isinstance(event, sopgraph.Need):
                seq = values.get(event.variable)
                if event.look is None or not isinstance(seq, list) or len(seq) < event.look:
                    session.close()  # not given: decide on what is known
                else:
                    try:
                        session.provide(event.variable, seq[event.look - 1])
                    except DecideError:  # refused as given: the run on the values as they are
                        return _outcome(lambda v: sopgraph.start(scenario, v).run(), values)
            elif isinstance(event, sopgraph.Act):
                acts.append({"name": event.action, "args": event.args})
            else:
                d = event.decision
                assert acts == d.actions
                return (list(d.path), dict(d.finals), list(d.actions))
    except DecideError as exc:
        return exc.message
    raise AssertionError("no end")  # pragma: no cover


def _unsized(outcome: Any) -> Any:
    return re.sub(r" \(the list has \d+ values?\)", "", outcome) if isinstance(outcome, str) else outcome


# ---------------------------------------------------------------------------------------------
# `volatile`: a variable that changes on its own (every look may differ, whatever the actions)

VOLATILE = RESTART_AFFECTS.replace(
    'system ServiceRestored: bool\n', 'system ServiceRestored: bool volatile\n')
QUEUE = """
scenario q "queue"
system Busy: bool "The line is busy right now."
system Sig: bool "The phone has signal."
action Reset "r" affects Sig
action Wait "w"
action Done "d"
stage a { observe Busy, Sig when Busy -> do Wait -> b otherwise when not Sig -> do Reset -> b otherwise -> do Done }
stage b { observe Busy, Sig when Busy or not Sig -> do Done otherwise -> do Wait }
"""


def test_a_volatile_variable_sees_a_new_value_at_every_look() -> None:
    s = sopgraph.load(text=VOLATILE)
    assert s.variables["ServiceRestored"].volatile
    values = {**STILL, "ServiceRestored": [False, True]}
    # nothing was done before `recheck`, yet its look is a new one (the second value)
    expected = (["account", "status", "recheck"], {"Action": "CloseFixed"}, [
        {"name": "AskAirplaneOff", "args": {}}, {"name": "CloseFixed", "args": {}}])
    assert _outcome(lambda v: interpret(s, v), values) == expected
    for eng in _engines(s):
        assert _outcome(eng.decide, values) == expected
    assert count_paths(s).feasible == 14  # every look sequence again, as without `affects`
    session = sopgraph.start(s, STILL)
    asked = [e.look for e in session if isinstance(e, sopgraph.Need) and session.provide(e.variable, e.look == 2) is None]
    assert asked == [1, 2]


def test_with_affects_a_variable_nothing_changes_keeps_its_first_look() -> None:
    s = sopgraph.load(text=QUEUE, check=False)
    # `Busy` is affected by nothing and not volatile: `b` sees the first look again (W308 says so)
    values = {"Busy": [True, False], "Sig": [True, True]}
    assert sopgraph.decide(s, values).finals == {"Action": "Done"}
    assert unroll(s).looks == {"Busy": 1, "Sig": 2}
    warn = [d for d in check(s) if d.code == "W308"]
    assert len(warn) == 1 and "`Busy`" in warn[0].message and warn[0].span.line == 9
    assert "volatile" in (warn[0].hint or "")
    busy = sopgraph.load(text=QUEUE.replace('system Busy: bool', 'system Busy: bool volatile'), check=False)
    assert sopgraph.decide(busy, values).finals == {"Action": "Wait"}
    assert not [d for d in check(busy) if d.code == "W308"]
    assert count_paths(busy).feasible > count_paths(s).feasible
    for p in iter_paths(s):
        assert p.witness is not None and interpret(s, p.witness).path == p.stages
        assert len(p.witness["Busy"]) == 1


def test_volatile_on_a_variable_no_stage_observes_is_e110() -> None:
    text = QUEUE.replace('system Busy: bool "The line is busy right now."',
                         'system Busy: bool "The line is busy right now."\nfield Mood: Calm | Upset volatile "m"')
    errors = [d for d in check(sopgraph.load(text=text, check=False)) if d.is_error]
    assert [e.code for e in errors] == ["E110"] and "`Mood` is marked `volatile`" in errors[0].message
    assert errors[0].span.line == 4


# ---------------------------------------------------------------------------------------------
# Property: for-each steps, positions, list and record arguments over observed lists, in every command

DATA_HEAD = [
    'type Item = record { amount: int[0..50], ok: bool }',
    'system Items: list[..3] of Item "items"',
    'system Box: record { level: int[0..5], open: bool } "box"',
    'system Tags: list[1..2] of Red | Blue "tags"',
    'system Flag: bool "flag"',
    'action Note "note"',
    'action Pay(amount: int[0..50]) "pay"',
    'action Keep(items: list[..3] of Item, box: record { level: int[0..5], open: bool }) "keep"',
    'action Tag(tag: Red | Blue) "tag"',
    'action Go "go"',
]
DATA_GUARDS = [*GUARDS, "len(Items) > 0 and first(Items).ok", "last(Tags) == Red", "Tags[0] == Blue",
               "len(Items) >= 2 and Items[1].amount > 10", "any(i in Items where i.ok) and last(Items).amount > 5"]
DATA_STEPS = [
    "do Note -> ", "for i in Items where i.ok do Pay(amount = i.amount) -> ", "for i in Items do Pay(amount = 0) -> ",
    "do Keep(items = Items, box = Box) -> ", "for t in Tags do Tag(tag = t) -> ", "do Tag(tag = first(Tags)) -> ",
    "do Pay(amount = last(Items).amount) -> ",
]


@st.composite
def _data_program(draw: Any) -> str:
    n = draw(st.integers(1, 3))
    lines = list(DATA_HEAD)
    if draw(st.booleans()):
        lines[5] = 'action Note "note" affects Items'
    if draw(st.booleans()):
        lines[2] = 'system Box: record { level: int[0..5], open: bool } volatile "box"'

    def target(i: int) -> str:
        steps = "".join(draw(st.lists(st.sampled_from(DATA_STEPS), max_size=2)))
        leaf = draw(st.sampled_from(["do Go", "do Pay(amount = Box.level)", "do Keep(items = Items, box = Box)"]))
        return steps + draw(st.sampled_from([f"s{j}" for j in range(i + 1, n)] + [leaf]))

    for i in range(n):
        observed = draw(st.lists(st.sampled_from(["Items", "Box", "Tags"]), unique=True, max_size=3))
        if i == 0:
            observed = ["Items", "Box", "Tags"]
        observe = f"observe {', '.join(observed)} " if observed else ""
        arms = [f"when {draw(st.sampled_from(DATA_GUARDS))} -> {target(i)}" for _ in range(draw(st.integers(1, 2)))]
        if i + 1 < n and draw(st.booleans()):
            arms.append(f"when {draw(st.sampled_from(DATA_GUARDS))} -> s{draw(st.integers(0, i))} up to 2 times")
        arms.append(f"otherwise -> {target(i)}")
        lines.append(f"stage s{i} {{ {observe}{' '.join(arms)} }}")
    return "\n".join(lines) + "\n"


def _invoke(args: list[str], stdin: str | None = None) -> Any:
    result = CliRunner().invoke(cli_main, args, input=stdin)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"sop {' '.join(args[:1])} raised {result.exception!r}:\n{result.output[-2000:]}") \
            from result.exception
    assert "Traceback" not in result.output
    return result


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), database=None, derandomize=True,
          phases=[Phase.explicit, Phase.generate])  # a failure shrinks for minutes: it is printed as found
@given(_data_program(), st.lists(VALUES, min_size=1, max_size=3))
def test_no_command_crashes_on_for_each_steps_positions_and_data_arguments(
        tmp_path_factory: Any, text: str, rows: list[dict[str, Any]]) -> None:
    path = tmp_path_factory.mktemp("data") / "p.sop"
    path.write_text(text, encoding="utf-8")
    checked = _invoke(["check", str(path)])
    assert checked.exit_code in (0, 1)
    scenario = sopgraph.load(text=text, check=False)
    clean = not any(d.is_error for d in check(scenario))
    assert (checked.exit_code == 0) == clean, checked.output
    for values in rows:
        _invoke(["decide", str(path), "--values", json.dumps(values)])
        _invoke(["step", str(path), "--values", json.dumps(values)], stdin="")
    for args in (["paths", "--count"], ["paths"], ["synth", "-n", "4", "--seed", "1"], ["render", "--format", "dot"],
                 ["render", "--format", "mmd"], ["schema", "agent-output"], ["prompt"], ["compile"]):
        _invoke([*args, str(path)])
    if not clean:
        return
    formatted = format_text(text)
    assert format_text(formatted) == formatted
    assert sopgraph.load(text=formatted).model_dump(exclude={"span"}) is not None
    assert tool_schemas(scenario)
    engines = _engines(scenario)
    for values in rows:
        expected = _outcome(lambda v: interpret(scenario, v), values)
        for eng in engines:
            assert _outcome(eng.decide, values) == expected, eng.mode
        if not isinstance(expected, str):  # the session, stepped from nothing, reports the same actions
            session = sopgraph.start(scenario)
            acts = []
            for event in session:
                if isinstance(event, sopgraph.Need):
                    value = values.get(event.variable)
                    if event.look is not None:
                        value = value[event.look - 1] if isinstance(value, list) and event.look <= len(value) else None
                    session.provide(event.variable, value)
                elif isinstance(event, sopgraph.Act):
                    acts.append({"name": event.action, "args": event.args})
            assert acts == expected[2]
    for p in iter_paths(scenario, limit=30):
        if p.witness is not None:
            assert interpret(scenario, p.witness).path == p.stages
    for case in sopgraph.synthesize(scenario, 4, seed=2).cases:
        d = sopgraph.decide(scenario, {**case.truth, **case.system})
        assert (d.path, d.actions) == (case.expected_path, case.expected_actions)


def test_a_look_is_named_after_the_item_or_field_read_of_it() -> None:
    """Diagnostics and path constraints on an unrolled procedure name a look in the source's terms: the
    analysis form's `Fees#2[0].refundable` is `Fees[0].refundable (look 2)` (it read `Fees (look 2)[0]…`), and a
    variable looked at once needs no look at all."""
    from sopgraph.logic.paths import _look_text
    from sopgraph.logic.procheck import _source_ids

    text = "`Fees#2[0].refundable` and Fees#1.len and Fixed#1"
    assert _source_ids(text, {}, {"Fees": 2, "Fixed": 1}) == (
        "`Fees[0].refundable (look 2)` and Fees.len (look 1) and Fixed")
    assert _look_text("Fees#2[1].amount > 3 and Fixed#1", {"Fees": 2, "Fixed": 1}) == (
        "Fees[1].amount (look 2) > 3 and Fixed")
