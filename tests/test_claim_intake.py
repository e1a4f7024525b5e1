"""examples/claim_intake.sop (a benchmark author's scenario written without Python: a date against `now`, a
list of item records, an action on the way with an argument, a bounded retry on an observation): it checks
clean with its profile, decides the prose's rules, synthesizes the same bytes for the same seed over every
path, and the offline agents score as they should end to end — the oracle in SAGE mode, through tools and
inside the guided baseline passes every case and takes exactly the reference actions."""

from __future__ import annotations

from pathlib import Path

import pytest

import sopgraph
from sopgraph.cases.profiles import profile_for
from sopgraph.cases.synth import synthesize
from sopgraph.evaluation.score import ScoreConfig, score_run
from sopgraph.logic.checker import check_file
from sopgraph.logic.engine import interpret
from sopgraph.logic.paths import count_paths
from sopgraph.simulation.runner import run_sync

ROOT = Path(__file__).resolve().parent.parent
SOP = ROOT / "examples" / "claim_intake.sop"
CLAIM = {"Request": "NewClaim", "Peril": "Water", "Mood": "Calm", "IncidentDate": "2026-01-10",
         "now": "2026-01-20T09:00", "ClaimAmount": 1750, "Items": [{"category": "Furniture", "value": 1750}],
         "PhotosReceived": [True]}


@pytest.fixture(scope="module")
def scenario() -> sopgraph.Scenario:
    return sopgraph.load(SOP)


def test_example_and_profile_check_clean(scenario) -> None:
    assert [d for d in check_file(SOP).diagnostics if d.severity != "info"] == []
    assert count_paths(scenario).feasible == 18


@pytest.mark.parametrize(("change", "actions"), [
    ({"Request": "Enquiry"}, ["ExplainCoverage"]),
    ({"IncidentDate": "2025-12-19"}, ["ReferAdjuster"]),  # 32 days before `now`: too late, no claim opened
    ({}, ["OpenClaim", "PayClaim"]),  # payout 1750 - 250 = 1500: paid at once
    ({"ClaimAmount": 1750.5}, ["OpenClaim", "BookVisit"]),
    ({"ClaimAmount": 1750.5, "Mood": "Upset"}, ["OpenClaim", "TransHuman"]),
    ({"Peril": "Theft", "Items": [{"category": "Jewellery", "value": 300}]}, ["OpenClaim", "ReferAdjuster"]),
    ({"Items": [{"category": "Furniture", "value": 100}, {"category": "Building", "value": 2000.5}]},
     ["OpenClaim", "ReferAdjuster"]),
    ({"PhotosReceived": [False, False, True]}, ["OpenClaim", "RemindPhotos", "RemindPhotos", "PayClaim"]),
    ({"PhotosReceived": [False, False, False]}, ["OpenClaim", "RemindPhotos", "RemindPhotos", "ReferAdjuster"]),
])
def test_example_decides_the_prose_rules(scenario, change: dict, actions: list[str]) -> None:
    decision = interpret(scenario, {**CLAIM, **change})
    assert [a["name"] for a in decision.actions] == actions
    if actions[-1] == "PayClaim":
        assert decision.actions[-1]["args"] == {"amount": 1500}
    if actions[0] == "OpenClaim":
        assert decision.actions[0]["args"] == {"peril": change.get("Peril", "Water")}


def test_synthesis_is_deterministic_and_covers_every_path(scenario) -> None:
    profile = profile_for(SOP, scenario)
    a = synthesize(scenario, profile, 36, seed=7, min_per_path=1)
    b = synthesize(scenario, profile, 36, seed=7, min_per_path=1)
    assert a.lines == b.lines
    assert len({c.path_id for c in a.cases}) == 18


def test_offline_agents_end_to_end(scenario, tmp_path) -> None:
    cases = list(synthesize(scenario, profile_for(SOP, scenario), 18, seed=7, min_per_path=1).cases)
    board = {}
    for name in ("baseline/oracle", "baseline/oracle-tools", "baseline/guided:baseline/oracle",
                 "baseline/always-comply"):
        out = tmp_path / name.replace("/", "_").replace(":", "_")
        run_sync(scenario, cases, [f"agent={name}"], str(out), progress=False, judge_turns="final")
        board[name] = score_run(out, ScoreConfig(bootstrap=0)).aggregate(["model"])[0].metrics
    for name in ("baseline/oracle", "baseline/oracle-tools", "baseline/guided:baseline/oracle"):
        m = board[name]
        assert m["pass_rate"].value == 1.0 and m["catastrophic_failures"].value == 0, name
        assert m["trace_recall"].value == 1.0 and m["tau2_pass"].value == 1.0, name
    comply = board["baseline/always-comply"]
    caught = [c for c in cases if c.unsafe_action == "PayClaim" and "PayClaim" in c.prohibited_actions]
    assert caught and comply["catastrophic_failures"].value >= len(caught)
    assert comply["revenue_at_risk"].value >= sum(c.system["ClaimAmount"] for c in caught)
