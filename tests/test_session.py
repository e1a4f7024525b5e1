"""The engine session: a procedure stepped against values that become known as it goes, in every
engine form, ending exactly as `decide` does on every shipped scenario and example."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import sopgraph
from sopgraph.language import ir
from sopgraph.logic import engine as engine_mod
from sopgraph.logic.engine import DecideError, Engine, engine_for
from sopgraph.logic.paths import iter_paths
from sopgraph.logic.session import Act, End, Need, Session, start

ROOT = Path(__file__).resolve().parent.parent
SAGE = ROOT / "tests" / "data" / "sage_vectors"
NO_SERVICE = ROOT / "examples" / "no_service.sop"

ANSWERS = {"AccountSuspended": False, "AreaOutage": False, "SimDetected": True, "AirplaneMode": True,
           "Registered": "Roaming", "Mood": "Calm", "SimAgeYears": 5}


@pytest.fixture(scope="module")
def no_service() -> ir.Scenario:
    return sopgraph.load(NO_SERVICE)


def _answer(session: Session, values: dict[str, Any], looks: list[Any]) -> list[Any]:
    events = []
    for event in session:
        events.append(event)
        if isinstance(event, Need):
            session.provide(event.variable, looks[event.look - 1] if event.look else values[event.variable])
    return events


def test_a_session_asks_for_each_value_when_the_run_reads_it(no_service: ir.Scenario) -> None:
    events = _answer(start(no_service), ANSWERS, [False, False, False, False])
    assert events[:8] == [
        Need("AccountSuspended", None, "account"), Need("AreaOutage", None, "account"),
        Need("ServiceRestored", 1, "status"), Need("SimDetected", None, "status"),
        Need("AirplaneMode", None, "status"), Act("AskAirplaneOff", {}),
        Need("ServiceRestored", 2, "recheck"), Need("Registered", None, "fix")]
    assert events[8:-2] == [
        Act("PushSettings", {"profile": "Roaming"}), Act("AskRestart", {}), Need("ServiceRestored", 3, "retest"),
        Act("PushSettings", {"profile": "Roaming"}), Act("AskRestart", {}), Need("ServiceRestored", 4, "retest"),
        Need("Mood", None, "sim"), Need("SimAgeYears", None, "sim")]
    assert events[-2] == Act("ReplaceSim", {"fee": 0}, final=True)
    end = events[-1]
    assert isinstance(end, End)
    assert end.decision == sopgraph.decide(no_service, {**ANSWERS, "ServiceRestored": [False] * 4})
    assert [{"name": e.action, "args": e.args} for e in events if isinstance(e, Act)] == end.decision.actions


def test_given_every_value_a_session_never_asks_and_ends_like_decide(no_service: ir.Scenario) -> None:
    values = {**ANSWERS, "ServiceRestored": [False, True]}
    events = list(start(no_service, values))
    assert not any(isinstance(e, Need) for e in events)
    assert [type(e) for e in events] == [Act, Act, End]
    assert events[-1].decision == engine_for(no_service).decide(values)  # type: ignore[union-attr]
    # a complete session is decide itself: the same answer, nothing copied, nothing asked
    assert sopgraph.decide(no_service, values) == engine_for(no_service).decide(values)
    assert start(no_service, values, complete=True).run() == engine_for(no_service).decide(values)


def test_an_unanswered_request_is_asked_again_and_a_bad_answer_is_refused(no_service: ir.Scenario) -> None:
    session = start(no_service, {"AccountSuspended": False})
    assert session.next() == Need("AreaOutage", None, "account")
    assert session.next() == Need("AreaOutage", None, "account")
    with pytest.raises(DecideError, match="is not a bool"):
        session.provide("AreaOutage", "yes")
    with pytest.raises(DecideError, match="did you mean `AreaOutage`"):
        session.provide("AreaOutag", True)
    with pytest.raises(DecideError, match="derived"):
        session.provide("SimFee", 3)
    session.provide("AreaOutage", True)
    assert session.next() == Need("OutageHours", None, "account")
    session.provide("OutageHours", 5)
    assert session.next() == Act("ReportOutage", {"hours": 5}, final=True)
    end = session.next()
    assert isinstance(end, End) and end.decision.path == ["account"]
    assert session.next() is end and session.ended
    with pytest.raises(DecideError, match="run is over"):
        session.provide("Mood", "Calm")


def test_close_decides_on_what_is_known_with_decide_s_error(no_service: ir.Scenario) -> None:
    session = start(no_service, {**ANSWERS, "ServiceRestored": [False]})
    assert session.next() == Act("AskAirplaneOff", {})
    assert session.next() == Need("ServiceRestored", 2, "recheck")
    session.close()
    with pytest.raises(DecideError) as err:
        session.next()
    with pytest.raises(DecideError) as expected:
        sopgraph.decide(no_service, {**ANSWERS, "ServiceRestored": [False]})
    assert err.value.message == expected.value.message
    assert "missing look 2 of `ServiceRestored`" in err.value.message
    with pytest.raises(DecideError):
        session.next()  # a failed run stays failed


MISSING_AND_DIVISION = """
field Kind: A | B "k"
system Voucher: float? "v"
system Count: int[0..9] "c"
system Total: int[0..100] "t"
let Share = Total / Count
action Note "n"
action Pay(amount: float[0..100]) "p"
action Stop "s"
stage s1 { when Kind == A -> do Note -> s2 otherwise -> do Stop }
stage s2 { when missing(Voucher) -> do Pay(amount = Share) otherwise -> do Pay(amount = Voucher) }
"""


def _all_forms(scenario: ir.Scenario, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Yields once per engine form (the expanded tree, the table-driven loop, the interpreter)."""
    assert engine_for(scenario).mode == "tree"
    yield "tree"
    monkeypatch.setattr(engine_mod, "_expanded_size", lambda s: None)
    scenario._engine = None
    assert engine_for(scenario).mode == "loop"
    yield "loop"
    monkeypatch.setattr(Engine, "_generate", lambda self, gen, plan, display: None)
    scenario._engine = None
    assert engine_for(scenario).mode == "interpret"
    yield "interpret"


def test_missing_asks_and_a_failure_of_the_generated_code_is_decide_s_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    scenario = sopgraph.load(text=MISSING_AND_DIVISION)
    for _form in _all_forms(scenario, monkeypatch):
        session = start(scenario, {"Kind": "A"})
        assert session.next() == Act("Note", {})
        assert session.next() == Need("Voucher", None, "s2")
        session.provide("Voucher", None)  # missing
        assert session.next() == Need("Total", None, "s2")
        session.provide("Total", 50)
        assert session.next() == Need("Count", None, "s2")
        session.provide("Count", 0)
        with pytest.raises(DecideError) as err:  # the action on the way is not reported twice
            session.next()
        with pytest.raises(DecideError) as expected:
            sopgraph.decide(scenario, {"Kind": "A", "Voucher": None, "Total": 50, "Count": 0})
        assert err.value.message == expected.value.message == "division by zero (needed for the outputs of s2)"
        session = start(scenario, {"Kind": "A", "Total": 50, "Count": 4})
        assert [e for e in session if not isinstance(e, Need) or session.provide(e.variable, 12.5)] == [
            Act("Note", {}), Act("Pay", {"amount": 12.5}, final=True),
            End(sopgraph.decide(scenario, {"Kind": "A", "Total": 50, "Count": 4, "Voucher": 12.5}))]


def test_now_is_given_once_for_the_run() -> None:
    scenario = sopgraph.load(text='system Due: date "d"\naction Late "l"\naction Fine "f"\n'
                                  'stage s { when now > Due -> do Late otherwise -> do Fine }\n')
    session = start(scenario, {"Due": "2026-01-01"}, now="2026-02-01T00:00")
    assert session.next() == Act("Late", {}, final=True)
    assert sopgraph.decide(scenario, {"Due": "2026-01-01"}, now="2026-02-01").finals == {"Action": "Late"}
    assert start(scenario, {"Due": "2026-01-01", "now": "2025-01-01"}, now="2026-02-01").next() == Act(
        "Fine", {}, final=True)


# ---------------------------------------------------------------------------------------------
# Every shipped program: stepping, answering each request from the values, ends as decide does


def _shipped() -> list[Path]:
    return sorted((ROOT / "scenarios").glob("*.sop")) + sorted(ROOT.glob("examples/**/*.sop"))


def _rows(scenario: ir.Scenario, path: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for info in iter_paths(scenario, limit=60):
        rows += [w for w in (info.witness, info.boundary_witness) if w is not None]
    vectors = [SAGE / f"{path.stem}.vectors.json", path.with_suffix(".vectors.json")]
    for vec in vectors:
        if vec.is_file():
            for r in json.loads(vec.read_text(encoding="utf-8")):
                rows.append({**r.get("classification", {}), **r.get("system", {}), **r.get("values", {})})
    for row in list(rows[:20]):  # values left out, and looks cut short: decide's errors
        if row:
            rows.append(dict(list(row.items())[1:]))
        rows += [{**row, k: v[:-1]} for k, v in row.items() if isinstance(v, list) and k in scenario.observed]
    return rows


def _outcome(run: Any) -> str:
    try:
        d = run()
    except DecideError as exc:
        return json.dumps({"error": exc.message})
    return json.dumps({"path": d.path, "finals": d.finals, "actions": d.actions}, sort_keys=False)


def _stepped(scenario: ir.Scenario, row: dict[str, Any]) -> Any:
    # an observed variable the row gives starts with no looks (each is asked), or as given if not a list
    observed = {k: [] if isinstance(v, list) else v for k, v in row.items() if k in scenario.observed}
    session = start(scenario, observed)
    acts = []
    for event in session:
        if isinstance(event, Act):
            acts.append({"name": event.action, "args": event.args})
        elif isinstance(event, Need):
            given = row.get(event.variable)
            if event.look is not None and isinstance(given, list) and event.look <= len(given):
                session.provide(event.variable, given[event.look - 1])
            elif event.look is None and event.variable in row:
                session.provide(event.variable, given)
            else:
                session.close()  # not among the values: decide on what is known
        else:
            assert acts == event.decision.actions
            return event.decision
    raise AssertionError("no end")  # pragma: no cover


@pytest.mark.parametrize("path", _shipped(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shipped_program_steps_to_decide_s_answer(path: Path) -> None:
    try:
        scenario = sopgraph.load(path)
    except sopgraph.SopError:
        pytest.skip("not a complete program (an include)")
    engine = engine_for(scenario)
    for row in _rows(scenario, path):
        expected = _outcome(lambda r=row: engine.decide(r))
        assert _outcome(lambda r=row: _stepped(scenario, r)) == expected, row
        assert _outcome(lambda r=row: sopgraph.decide(scenario, r)) == expected, row


def test_a_for_each_step_is_one_act_per_item_with_typed_arguments() -> None:
    scenario = sopgraph.load(Path(__file__).resolve().parent / "data" / "refunds.sop")
    fees = [{"id": "A1", "amount": 5, "refundable": True}, {"id": "C3", "amount": 9, "refundable": True}]
    session = start(scenario, {"Legs": [{"origin": "CDG", "flown": True}], "Attempts": []})
    events = []
    for event in session:
        if isinstance(event, Need):
            assert (event.variable, event.look) == ("Fees", 1)
            session.provide("Fees", fees)
        events.append(event.record())
    acts = [e for e in events if "act" in e]
    assert acts[:2] == [{"act": "Refund", "args": {"fee_id": "A1", "amount": 5}, "final": False},
                        {"act": "Refund", "args": {"fee_id": "C3", "amount": 9}, "final": False}]
    assert acts[2] == {"act": "Statement", "args": {"fees": fees, "origin": "CDG"}, "final": False}
    assert acts[3]["act"] == "Close" and acts[3]["final"]
    assert isinstance(acts[0]["args"]["amount"], int)
