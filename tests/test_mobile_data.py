"""examples/mobile_data.sop (a ~20-decision mobile-data troubleshooting procedure with nested re-checks,
`affects`, a `volatile` signal, bounded retries and a subflow used seven times): it checks clean with its
profile, `sop paths --count` counts only the look sequences that can happen (917, against 2,213 when
every look is a new value), and every synthesized case, stepped through the session one value at a
time, reaches its expected path and actions."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import sopgraph
from sopgraph.cli import main
from sopgraph.logic.checker import check_file
from sopgraph.logic.paths import count_paths, iter_paths

ROOT = Path(__file__).resolve().parent.parent
SOP = ROOT / "examples" / "mobile_data.sop"
TEXT = SOP.read_text(encoding="utf-8")
PLAIN = re.sub(r"\n    affects [^\n]*| affects [A-Za-z, ]+(?=\n)| volatile(?=\n)", "", TEXT)
SETTINGS = {"Mood": "Calm", "LineBarred": False, "AreaOutage": False, "OutageHours": 0, "PlanType": "Postpaid",
            "DataLeftMb": 4000, "Abroad": False, "SimDetected": True, "SimAgeYears": 5}


@pytest.fixture(scope="module")
def scenario() -> sopgraph.Scenario:
    return sopgraph.load(SOP)


def test_example_and_profile_check_clean(scenario) -> None:
    assert [d for d in check_file(SOP).diagnostics if d.severity != "info"] == []
    decisions = sum(len(st.branches) > 1 for st in scenario.stages.values())
    assert decisions >= 18
    plain = sopgraph.load(text=PLAIN)
    assert not any(a.affects for a in plain.actions.values()) and not any(v.volatile for v in plain.variables.values())
    assert any(a.affects for a in scenario.actions.values()) and scenario.variables["SignalBars"].volatile


def test_paths_count_only_looks_that_can_happen(scenario) -> None:
    plain = sopgraph.load(text=PLAIN)
    assert count_paths(scenario).feasible == 917
    assert count_paths(plain).feasible == 2213
    out = CliRunner().invoke(main, ["paths", "--count", str(SOP)])
    assert out.exit_code == 0 and out.output.startswith("917 feasible paths")
    # without `volatile`, the signal looked at again after moving to the window is the first look
    held_signal = sopgraph.load(text=TEXT.replace(" volatile\n", "\n"), check=False)
    assert count_paths(held_signal).feasible == 341
    for p in iter_paths(scenario, limit=200):
        assert p.witness is not None
        assert sopgraph.decide(scenario, p.witness).path == p.stages


def _stepped(scenario: sopgraph.Scenario, values: dict[str, Any]) -> tuple[sopgraph.Decision, list[dict[str, Any]]]:
    """The case run through the session one value at a time: each field or system value when asked,
    each look of an observed variable from its list when asked (never a look the case does not hold)."""
    observed = set(scenario.observed)
    session = sopgraph.start(scenario)
    acts: list[dict[str, Any]] = []
    for event in session:
        if isinstance(event, sopgraph.Need):
            value = values[event.variable]
            if event.variable in observed:
                assert event.look is not None and event.look <= len(value), (event, value)
                value = value[event.look - 1]
            session.provide(event.variable, value)
        elif isinstance(event, sopgraph.Act):
            acts.append({"name": event.action, "args": event.args})
        else:
            return event.decision, acts
    raise AssertionError("the session ended without End")


def test_synthesized_cases_replay_through_the_session(scenario) -> None:
    result = sopgraph.synthesize(scenario, 60, seed=1)
    assert len({c.path_id for c in result.cases}) >= 12
    for case in result.cases:
        values = {**case.truth, **case.system}
        decision, acts = _stepped(scenario, values)
        assert decision.path == case.expected_path, case.id
        assert decision.finals == case.expected_finals
        assert acts == case.expected_actions == decision.actions
    held = [c for c in result.cases if c.expected_path.count("switches_again") and "switches" in c.expected_path]
    for case in held:
        assert len(case.system["AirplaneMode"]) <= 1 + sum(a["name"] == "AskAirplaneOff" for a in case.expected_actions)


def test_a_switch_nothing_was_done_to_is_not_looked_at_again(scenario) -> None:
    # airplane mode was off at the first check and nothing touched it: the re-check after the restart
    # sees the same look, so the list holds one value and a second would never be read
    values = {**SETTINGS, "AirplaneMode": [False], "DataEnabled": [False, True], "RoamingEnabled": [True],
              "ApnCorrect": [True], "NetworkMode": ["Auto"], "SignalBars": [4], "DataWorking": [False, False, False, True]}
    decision = sopgraph.decide(scenario, values)
    assert decision.path == ["account", "first_test", "switches", "after_data.test", "roaming", "apn", "mode",
                             "signal", "restart", "after_restart", "switches_again", "restart", "after_restart"]
    assert [a["name"] for a in decision.actions] == ["AskDataOn", "AskRestart", "AskRestart", "CloseFixed"]
    _, acts = _stepped(scenario, values)
    assert acts == decision.actions
