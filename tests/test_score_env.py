"""Scoring a run that had an environment (`--env`): a dialogue's pass (and pass^k), the escalation metrics, the
trace reference and journey coverage, and the expected Action of `sop compare`'s flips judge against the
environment's reference decision (the engine session stepped against a fresh environment), not the case's
recorded decision; without an environment the case's decision stands (docs/metrics.md §4)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

import sopgraph
from sopgraph.evaluation.score import ScoreConfig, compare, dialogue_metric_values, score_run
from sopgraph.records import Case
from sopgraph.simulation.runner import run_sync

ROOT = Path(__file__).resolve().parent.parent
NO_SERVICE = ROOT / "examples" / "no_service.sop"
sys.path.insert(0, str(ROOT))  # the example environment is imported as a module (examples/)
ENV = f"python:{__name__}:restart_fixes"
CASES: dict[str, Case] = {}


def restart_fixes(system: dict[str, Any], seed: int) -> Any:
    """The shipped phone (examples/no_service_env.py) whose stale settings one fix cycle clears, whatever
    the case's looks recorded: fresh settings and a restart bring the service back."""
    from examples.no_service_env import make

    return make({**system, "ServiceRestored": [False, True]}, seed)


def recorded(request: dict[str, Any]) -> dict[str, Any]:
    """An agent that carries out the case's recorded decision whatever the phone says."""
    case = CASES[request["dialogue_id"].split("#")[0]]
    calls = [{"name": a["name"], "arguments": dict(a.get("args") or {})} for a in case.expected_actions or ()]
    return {"reply": "Done.", "tool_calls": calls}


@pytest.fixture(scope="module")
def cases() -> list[Case]:
    """Two cases whose recorded decision is two failed fix cycles, then a SIM for the calm caller and a
    technician (an escalation, bucket must-escalate) for the upset one: on the phone above the first fix
    cycle brings the service back, so the environment's decision is CloseFixed."""
    from sopgraph.cases.profiles import profile_for
    from sopgraph.cases.synth import plan, synthesize

    scenario = sopgraph.load(NO_SERVICE)
    profile = profile_for(NO_SERVICE, scenario)
    found = synthesize(scenario, profile, len(plan(scenario, profile).paths), seed=3, min_per_path=1).cases
    picked = {}
    for c in found:
        s = c.system
        if s["ServiceRestored"] == [False, False, False] and not s["AirplaneMode"] and s["SimDetected"]:
            picked.setdefault(c.expected_finals["Action"], c)
    assert set(picked) == {"ReplaceSim", "TransHuman"}, picked
    assert picked["TransHuman"].bucket == "must-escalate"
    CASES.update({c.id: c for c in picked.values()})
    return [picked["ReplaceSim"], picked["TransHuman"]]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, cases) -> dict[str, Path]:
    scenario = sopgraph.load(NO_SERVICE)
    base = tmp_path_factory.mktemp("env-pass")
    out = {}
    for name, agent, env in (("oracle", "baseline/oracle-tools", ENV), ("recorded", f"python:{__name__}:recorded", ENV),
                             ("oracle-no-env", "baseline/oracle-tools", None)):
        summary = run_sync(scenario, cases, [f"agent={agent}"], str(base / name), progress=False, env=env)
        assert summary.infra_failures == 0
        out[name] = base / name
    return out


def _final_actions(run) -> list[str | None]:
    return [run.action_at(int(run.d_final_row[d])) for d in range(len(run.dialogues))]


def _group(run) -> dict[str, Any]:
    return next(g for g in run.summary().groups if g.by == ["model", "scenario"]).metrics


CFG = ScoreConfig(bootstrap=0)


def test_pass_follows_the_environment_not_the_recorded_decision(runs, cases) -> None:
    oracle, rec = score_run(runs["oracle"], CFG), score_run(runs["recorded"], CFG)
    assert _final_actions(oracle) == ["CloseFixed", "CloseFixed"]  # the phone came back after one fix cycle
    assert [c.expected_finals["Action"] for c in cases] == ["ReplaceSim", "TransHuman"]
    assert oracle.d_pass.tolist() == [True, True] and oracle.d_final_right.tolist() == [True, True]
    assert [oracle.expected_action(d) for d in range(2)] == ["CloseFixed", "CloseFixed"]
    assert _group(oracle)["pass_rate"].value == 1.0 and oracle.summary().groups[0].pass_k[0].value == 1.0
    # doing what the case recorded, on a phone that was already fixed, is not the procedure's outcome
    assert _final_actions(rec) == ["ReplaceSim", "TransHuman"]
    assert rec.d_pass.tolist() == [False, False]
    values = dialogue_metric_values(oracle)
    assert values["journey_coverage"].tolist() == [1.0, 1.0]  # the environment's path, not the recorded one
    assert values["tau2_pass"].tolist() == [1.0, 1.0] and values["end_state"].tolist() == [1.0, 1.0]
    # the same cases without an environment: the scripted backend plays the case's looks, its decision stands
    plain = score_run(runs["oracle-no-env"], CFG)
    assert _final_actions(plain) == ["ReplaceSim", "TransHuman"] and plain.d_pass.tolist() == [True, True]
    assert [plain.expected_action(d) for d in range(2)] == ["ReplaceSim", "TransHuman"]
    assert _group(plain)["escalation_accuracy"].value == 1.0 and _group(plain)["escalation_accuracy"].n == 1


def test_escalation_metrics_follow_the_environment(runs) -> None:
    """The upset caller's recorded decision escalates; on the phone nothing needs escalating any more."""
    oracle, rec = _group(score_run(runs["oracle"], CFG)), _group(score_run(runs["recorded"], CFG))
    assert oracle["escalation_accuracy"].n == 0  # no dialogue must be escalated
    assert oracle["resolution_rate"].value == 1.0 and oracle["resolution_rate"].n == 1
    assert oracle["over_escalation"].value == 0.0
    assert rec["over_escalation"].value == 1.0 and rec["over_escalation"].n == 1  # transferred a fixed phone
    assert rec["resolution_rate"].value == 0.0


def test_consensus_reference_is_stepped_against_the_environment_too(runs) -> None:
    cfg = ScoreConfig(bootstrap=0, pass_reference="consensus")
    oracle, rec = score_run(runs["oracle"], cfg), score_run(runs["recorded"], cfg)
    assert oracle.counts["judged_turns"] > 0
    assert oracle.d_pass.tolist() == [True, True] and rec.d_pass.tolist() == [False, False]
    assert dialogue_metric_values(oracle)["tau2_pass"].tolist() == [1.0, 1.0]


def test_compare_names_the_environments_expected_action(runs) -> None:
    result = compare(score_run(runs["recorded"], CFG), score_run(runs["oracle"], CFG))
    assert result.b_only == 2
    assert [(f.a_final_action, f.b_final_action, f.expected_action) for f in result.flipped] == [
        ("ReplaceSim", "CloseFixed", "CloseFixed"), ("TransHuman", "CloseFixed", "CloseFixed")]


def test_every_turn_is_scored_against_the_environment(runs) -> None:
    """The per-turn reference (path, Action, finals, logic) is the session stepped against a fresh phone on the
    judges' labels: the oracle following the phone is right on every turn, the agent replaying the
    recorded decision is wrong on its answer."""
    oracle, rec = _group(score_run(runs["oracle"], CFG)), _group(score_run(runs["recorded"], CFG))
    for name in ("path", "action", "finals", "logic"):
        assert oracle[name].value == 1.0 and oracle[name].n > 0, name
    assert rec["action"].value == 0.0
    plain = _group(score_run(runs["oracle-no-env"], CFG))
    assert all(plain[name].value == 1.0 for name in ("path", "action", "finals", "logic"))
