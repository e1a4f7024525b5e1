"""Trace scores against the engine's full action trace (issue 9 item 7, issue 10 item 2).

The reference trace is every action the procedure carries out along the case's path, with its
arguments (`Decision.actions`), not only the final one: an agent that skips the fixes mid-flow loses
recall, one that does them in another order loses `order`, wrong arguments fail the tau2 pass.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sopgraph
from sopgraph.cases.validate import case_problems
from sopgraph.evaluation.score import ScoreConfig, score_records
from sopgraph.evaluation.traces import case_reference_trace, sage_trace, trace_scores
from sopgraph.logic.engine import decide
from sopgraph.records import CHAT_DIMENSIONS, AgentOutput, Case, Consensus, Dialogue, Persona, Turn

ROOT = Path(__file__).resolve().parents[1]

# airplane mode on, nothing helps twice: the caller is calm, so the SIM is replaced (free: 5 years old)
TRUTH = {"Mood": "Calm"}
SYSTEM = {"AccountSuspended": False, "AreaOutage": False, "OutageHours": 0, "AirplaneMode": True,
          "SimDetected": True, "SimAgeYears": 5, "Registered": "Roaming",
          "ServiceRestored": [False, False, False, False]}
FULL = [{"name": "AskAirplaneOff", "args": {}}, {"name": "PushSettings", "args": {"profile": "Roaming"}},
        {"name": "AskRestart", "args": {}}, {"name": "PushSettings", "args": {"profile": "Roaming"}},
        {"name": "AskRestart", "args": {}}, {"name": "ReplaceSim", "args": {"fee": 0}}]


@pytest.fixture(scope="module")
def noservice() -> sopgraph.Scenario:
    return sopgraph.load(ROOT / "examples" / "no_service.sop")


@pytest.fixture(scope="module")
def telecom() -> sopgraph.Scenario:
    return sopgraph.load(ROOT / "scenarios" / "telecom_package.sop")


def make_case(scenario: sopgraph.Scenario, truth: dict, system: dict, cid: str = "c1") -> Case:
    d = decide(scenario, {**truth, **system})
    return Case(id=cid, scenario=scenario.name, path_id="P", intent="i", persona=Persona(name="p"), truth=truth,
                system=system, expected_path=d.path, expected_finals=d.finals, expected_actions=d.actions,
                sop_hash=scenario.source_hash)


def tool_turn(did: str, index: int, calls: list[dict[str, Any]]) -> Turn:
    finals = {"Action": calls[-1]["name"], **calls[-1]["args"]} if calls else {}
    out = AgentOutput(finals=finals, chat="ok", source="tools", tool_calls=calls)
    return Turn(dialogue_id=did, index=index, user_text="u", agent_raw="{}", output=out)


def sage_turn(did: str, index: int, labels: dict, path: list[str], finals: dict, actions: list | None = None
              ) -> Turn:
    out = AgentOutput(classification_output=labels, now_path=path, finals=finals, chat="ok",
                      actions=actions or [])
    return Turn(dialogue_id=did, index=index, user_text="u", agent_raw="{}", output=out)


def cons(did: str, index: int, labels: dict) -> Consensus:
    return Consensus(dialogue_id=did, turn_index=index, labels=labels, chat_scores=dict.fromkeys(CHAT_DIMENSIONS, 6),
                     judges_scored=3)


def dialogue_traces(scenario: sopgraph.Scenario, case: Case, agents: dict[str, list[Turn]],
                    consensus: dict[str, dict] | None = None, config: ScoreConfig | None = None
                    ) -> dict[str, dict[str, float]]:
    """Trace scores per agent model, one dialogue each (turns given with the dialogue id `MODEL`)."""
    dls = [Dialogue(id=m, case_id=case.id, models={"agent": m}, status="done") for m in agents]
    turns = [t for ts in agents.values() for t in ts]
    labels = consensus or {}
    cs = [cons(t.dialogue_id, t.index, labels.get(t.dialogue_id, case.truth)) for t in turns]
    run = score_records(scenario, [case], dls, turns, cs, config=config)
    return {m: {k: float(v[run.dialogue_index(m)]) for k, v in run.d_trace.items()} for m in agents}


def test_the_reference_is_the_engines_whole_trace(noservice) -> None:
    case = make_case(noservice, TRUTH, SYSTEM)
    assert case.expected_actions == FULL  # the engine's trace: the fixes mid-flow, then the final action
    assert case_reference_trace(noservice, case) == FULL
    # a case written before `expected_actions` existed reads, and gets the same reference
    old = Case.model_validate({k: v for k, v in case.model_dump(mode="json").items() if k != "expected_actions"})
    assert old.expected_actions is None and case_problems(noservice, old) == []
    assert case_reference_trace(noservice, old) == FULL


def test_case_validation_re_decides_the_action_trace(noservice) -> None:
    case = make_case(noservice, TRUTH, SYSTEM)
    assert case_problems(noservice, case) == []
    wrong = case.model_copy(update={"expected_actions": FULL[:1] + FULL[3:]})
    problems = case_problems(noservice, wrong)
    assert len(problems) == 1 and problems[0].startswith("expected_actions AskAirplaneOff, PushSettings(profile=")
    assert "re-synthesize" in problems[0]


def test_only_the_final_action_loses_recall_wrong_order_loses_order_wrong_args_fail_tau2(noservice) -> None:
    case = make_case(noservice, TRUTH, SYSTEM)
    roaming_as_home = [dict(c, args={"profile": "Home"}) if c["name"] == "PushSettings" else c for c in FULL]
    swapped = [FULL[0], FULL[2], FULL[1], FULL[4], FULL[3], FULL[5]]  # restart before the settings push
    got = dialogue_traces(noservice, case, {
        "full": [tool_turn("full", 1, FULL[:3]), tool_turn("full", 2, FULL[3:])],
        "final-only": [tool_turn("final-only", 1, FULL[-1:])],
        "wrong-order": [tool_turn("wrong-order", 1, swapped)],
        "wrong-args": [tool_turn("wrong-args", 1, roaming_as_home)],
        "once": [tool_turn("once", 1, [FULL[0], FULL[1], FULL[2], FULL[5]])],  # one fix round instead of two
    })
    full = got["full"]
    assert (full["trace_precision"], full["trace_recall"], full["trace_order"], full["tau2_pass"]) == (1, 1, 1, 1)
    only = got["final-only"]
    assert only["trace_recall"] == pytest.approx(1 / 6) and only["trace_precision"] == 1.0
    assert only["trace_order"] == pytest.approx(1 / 6) and only["tau2_pass"] == 0.0
    order = got["wrong-order"]
    assert order["trace_recall"] == 1.0 and order["trace_order"] == pytest.approx(5 / 6)  # LCS drops one
    args = got["wrong-args"]
    assert args["trace_recall"] == 1.0 and args["trace_order"] == 1.0 and args["tau2_pass"] == 0.0
    once = got["once"]  # an action required twice needs two calls
    assert once["trace_recall"] == pytest.approx(4 / 6) and once["tau2_pass"] == 0.0


def test_a_sage_reply_reports_its_actions(noservice) -> None:
    case = make_case(noservice, TRUTH, SYSTEM)
    finals = dict(case.expected_finals)
    got = dialogue_traces(noservice, case, {
        "reports": [sage_turn("reports", 1, TRUTH, case.expected_path, finals, FULL)],
        "steps-only": [sage_turn("steps-only", 1, TRUTH, case.expected_path, finals, FULL[:-1])],
        "silent": [sage_turn("silent", 1, TRUTH, case.expected_path, finals)],
    })
    assert got["reports"]["trace_recall"] == 1.0 and got["reports"]["tau2_pass"] == 1.0
    # the final action comes from `finals`, but without the `fee` argument the reply did not report
    assert got["steps-only"]["trace_recall"] == 1.0 and got["steps-only"]["tau2_pass"] == 0.0
    assert got["silent"]["trace_recall"] == pytest.approx(1 / 6) and got["silent"]["tau2_pass"] == 0.0
    assert sage_trace({"finals": finals, "actions": FULL[:-1]}, {}) == [*FULL[:-1], {"name": "ReplaceSim", "args": {}}]


def test_consensus_reference_follows_the_judged_labels(noservice) -> None:
    """Under `pass_reference=consensus` the reference is the engine's trace for the final turn's consensus
    labels (as the reference path is): judges reading the caller as upset make TransHuman the reference."""
    case = make_case(noservice, TRUTH, SYSTEM)
    upset = [*FULL[:-1], {"name": "TransHuman", "args": {}}]
    agents = {"a": [tool_turn("a", 1, upset)], "b": [tool_turn("b", 1, FULL)]}
    by_case = dialogue_traces(noservice, case, agents, {"a": {"Mood": "Upset"}, "b": {"Mood": "Upset"}})
    by_cons = dialogue_traces(noservice, case, agents, {"a": {"Mood": "Upset"}, "b": {"Mood": "Upset"}},
                              ScoreConfig(pass_reference="consensus"))
    assert by_case["a"]["tau2_pass"] == 0.0 and by_case["b"]["tau2_pass"] == 1.0
    assert by_cons["a"]["tau2_pass"] == 1.0 and by_cons["b"]["tau2_pass"] == 0.0


def test_sage_scenarios_keep_one_action(telecom) -> None:
    truth = {"ConsumptionType": "Cancel", "ApplicationTendency": "Agree", "ConsumptionProfile": "Data",
             "EmotionTag": "Calm"}
    case = make_case(telecom, truth, {"PackageStatus": "Contracted", "Penalty": 0})
    assert case_reference_trace(telecom, case) == [{"name": "ChangeOrder", "args": {}}]
    p, r, o, ok = trace_scores([{"name": "ChangeOrder", "args": {}}], case_reference_trace(telecom, case), set(),
                               lambda a, b: a == b)
    assert (p, r, o, ok) == (1.0, 1.0, 1.0, True)
    got = dialogue_traces(telecom, case, {"m": [sage_turn("m", 1, truth, case.expected_path,
                                                          dict(case.expected_finals))]})
    assert got["m"]["tau2_pass"] == 1.0 and got["m"]["journey_coverage"] == 1.0
    assert not math.isnan(got["m"]["trace_order"])


def test_a_tool_agents_turns_before_it_acts_are_pending(telecom) -> None:
    """A tool agent states no decision while it asks: those turns are not scored on path, action, finals
    and logic (they scored 0, so a tool agent that asks first, as it should, lost half its action score);
    its final turn always is, so one that never acts scores 0 there."""
    truth = {"ConsumptionType": "Cancel", "ApplicationTendency": "Agree", "ConsumptionProfile": "Data",
             "EmotionTag": "Calm"}
    case = make_case(telecom, truth, {"PackageStatus": "Contracted", "Penalty": 0})
    final = [{"name": "ChangeOrder", "args": {}}]
    turns = {"asks-then-acts": [tool_turn("asks-then-acts", 1, []), tool_turn("asks-then-acts", 2, final)],
             "never-acts": [tool_turn("never-acts", 1, []), tool_turn("never-acts", 2, [])]}
    dls = [Dialogue(id=m, case_id=case.id, models={"agent": m}, status="done") for m in turns]
    all_turns = [t for ts in turns.values() for t in ts]
    run = score_records(telecom, [case], dls, all_turns, [cons(t.dialogue_id, t.index, truth) for t in all_turns])
    assert run.counts["pending_turns"] == 2  # the first turn of each; never the final one
    for model, want in (("asks-then-acts", 1.0), ("never-acts", 0.0)):
        rows = [i for i in range(len(run.t_dlg)) if run.t_dlg[i] == run.dialogue_index(model)]
        scored = [float(run.t_act[i]) for i in rows if not math.isnan(run.t_act[i])]
        assert scored == [want], (model, scored)
        assert math.isnan(run.t_path[rows[0]]) and math.isnan(run.t_logic[rows[0]])


def test_a_tool_agents_final_turn_is_the_last_that_answered(telecom) -> None:
    """A tool agent that called its final action and then only talked (the action did not end the dialogue,
    the customer went on): its answer is that call, not the closing chat after it (which scored 0 as a
    final turn with no action: a ceiling failed every such dialogue)."""
    truth = {"ConsumptionType": "Cancel", "ApplicationTendency": "Agree", "ConsumptionProfile": "Data",
             "EmotionTag": "Calm"}
    case = make_case(telecom, truth, {"PackageStatus": "Contracted", "Penalty": 0})
    turns = [tool_turn("acts-then-talks", 1, [{"name": "ChangeOrder", "args": {}}]),
             tool_turn("acts-then-talks", 2, []), tool_turn("acts-then-talks", 3, [])]
    dls = [Dialogue(id="acts-then-talks", case_id=case.id, models={"agent": "m"}, status="done")]
    run = score_records(telecom, [case], dls, turns, [cons(t.dialogue_id, t.index, truth) for t in turns])
    assert run.t_final.tolist() == [True, False, False] and run.counts["pending_turns"] == 2
    assert run.d_pass.tolist() == [True] and run.d_final_right.tolist() == [True]
    g = run.summary().groups[0]
    assert g.metrics["action"].value == 1.0 and g.metrics["action"].n == 1


def test_the_oracle_reports_the_procedures_actions_end_to_end(noservice, tmp_path: Path) -> None:
    """Through the runner: the oracle's replies on a procedure report the case's trace (a ceiling: every
    trace score 1); always-escalate, which skips the fixes, loses recall on the cases that need them."""
    from sopgraph.cases.profiles import profile_for
    from sopgraph.cases.synth import synthesize
    from sopgraph.evaluation.score import score_run
    from sopgraph.simulation.runner import run_sync

    sop = ROOT / "examples" / "no_service.sop"
    cases = synthesize(noservice, profile_for(sop, noservice), 12, seed=5, min_per_path=0).cases
    assert all(c.expected_actions for c in cases) and any(len(c.expected_actions or []) > 2 for c in cases)
    got = {}
    for agent in ("oracle", "always-escalate"):
        run_sync(noservice, list(cases), [f"agent=baseline/{agent}"], str(tmp_path / agent), trials=1,
                 progress=False, judge_turns="final")
        group = score_run(tmp_path / agent).summary().groups[0]
        got[agent] = {k: group.metrics[k].value for k in ("trace_recall", "trace_order", "tau2_pass")}
    assert got["oracle"] == {"trace_recall": 1.0, "trace_order": 1.0, "tau2_pass": 1.0}
    assert got["always-escalate"]["trace_recall"] < 0.5 and got["always-escalate"]["tau2_pass"] < 0.5


def test_a_built_in_agent_acts_through_tool_calls_offline(noservice, telecom, tmp_path: Path) -> None:
    """Issue 10 mode b offline: `baseline/oracle-tools` answers through the litellm built-in path with
    OpenAI-style tool calls, the simulated backend runs them, and its trace is the reference (a ceiling)."""
    from sopgraph.cases.profiles import profile_for
    from sopgraph.cases.synth import synthesize
    from sopgraph.evaluation.score import score_run
    from sopgraph.simulation.agents import agent_kind
    from sopgraph.simulation.runner import run_sync
    from sopgraph.simulation.store import RunStore

    assert agent_kind("baseline/oracle-tools") == agent_kind("tools:baseline/oracle-tools") == "tools"
    for scenario, sop, n in ((noservice, ROOT / "examples" / "no_service.sop", 10),
                             (telecom, ROOT / "scenarios" / "telecom_package.sop", 12)):
        cases = synthesize(scenario, profile_for(sop, scenario), n, seed=3, min_per_path=0).cases
        out = tmp_path / scenario.name
        run_sync(scenario, list(cases), ["agent=baseline/oracle-tools"], str(out), trials=1, progress=False,
                 judge_turns="final")
        with RunStore.open(out) as store:
            turns = store.turns()
        by_case = {c.id: c for c in cases}
        acted = [t for t in turns if t.output is not None and t.output.tool_calls]
        assert {t.dialogue_id for t in acted} == {f"{c.id}#0" for c in cases}  # every dialogue acted
        called: dict[str, list[str]] = {}
        for t in sorted(acted, key=lambda t: (t.dialogue_id, t.index)):
            called.setdefault(t.dialogue_id, []).extend(c["name"] for c in t.output.tool_calls)
            assert t.output.source == "tools" and not t.format_error
        for did, names in called.items():  # the calls are the case's reference trace, in order
            assert names == [a["name"] for a in by_case[did.split("#")[0]].expected_actions or []], did
        assert max(t.index for t in turns) >= 2  # it asked first
        group = score_run(out).summary().groups[0]
        assert {k: group.metrics[k].value for k in ("trace_recall", "trace_order", "tau2_pass", "pass_rate")} == {
            "trace_recall": 1.0, "trace_order": 1.0, "tau2_pass": 1.0, "pass_rate": 1.0}


def test_a_risky_step_of_the_reference_is_never_prohibited() -> None:
    """Cases synthesized before mid-flow steps were exempted list them as prohibited: the tau2 pass
    still holds for the agent that takes exactly the reference's steps."""
    ref = [{"name": "BlockCard", "args": {}}, {"name": "Reissue", "args": {}}]
    same = lambda a, b: a == b  # noqa: E731
    assert trace_scores(ref, ref, frozenset({"BlockCard", "Dispute"}), same)[3] is True
    assert trace_scores([*ref, {"name": "Dispute", "args": {}}], ref, frozenset({"BlockCard", "Dispute"}), same)[3] is False


# -- procedures stepped against the world the agent's calls changed (online reference) ------------------------

def _same(a: Any, b: Any) -> bool:
    return a == b


def test_the_online_reference_follows_what_the_agents_calls_did_to_the_world(noservice) -> None:
    """Airplane mode was all that blocked service: the case's trace is AskAirplaneOff, CloseFixed. An agent
    that pushes settings first leaves airplane mode on, so the phone (the shipped environment) still has no
    service at the re-check, and the procedure's next steps are the fix cycle — not the precomputed trace."""
    from sopgraph.evaluation.traces import Divergence, step_session
    from sopgraph.simulation.backend import BackendSpec
    from sopgraph.simulation.environment import EnvBackend, EnvSpec

    system = {**SYSTEM, "Registered": "Home", "ServiceRestored": [False, True]}
    case = make_case(noservice, TRUTH, system)
    assert [a["name"] for a in case.expected_actions or ()] == ["AskAirplaneOff", "CloseFixed"]
    env = EnvSpec.load("python:examples.no_service_env:make", noservice)
    world = EnvBackend.with_env(BackendSpec.of(noservice), case, env.for_case(case))
    agent = [{"name": "PushSettings", "args": {"profile": "Home"}}, {"name": "PushSettings", "args": {"profile": "Home"}}]
    steps, divergence = step_session(noservice, TRUTH, world, agent, _same)
    assert steps == [{"name": "AskAirplaneOff", "args": {}}, {"name": "PushSettings", "args": {"profile": "Home"}},
                     {"name": "AskRestart", "args": {}}, {"name": "PushSettings", "args": {"profile": "Home"}},
                     {"name": "AskRestart", "args": {}}, {"name": "ReplaceSim", "args": {"fee": 0}}]
    assert divergence == Divergence(1, {"name": "AskAirplaneOff", "args": {}}, agent[0])
    assert divergence.describe() == "step 1: expected AskAirplaneOff(), done PushSettings(profile='Home')"


def test_first_divergence_names_the_step_the_expected_call_and_what_was_done(noservice) -> None:
    from sopgraph.evaluation.traces import Divergence, step_scores, step_session
    from sopgraph.simulation.backend import Backend, BackendSpec

    case = make_case(noservice, TRUTH, SYSTEM)
    spec = BackendSpec.of(noservice)

    def run(agent: list[dict[str, Any]]) -> tuple[list, Divergence | None]:
        return step_session(noservice, TRUTH, Backend.for_case(spec, case), agent, _same)

    assert run(FULL) == (FULL, None)
    wrong_arg = [FULL[0], {"name": "PushSettings", "args": {"profile": "Home"}}, *FULL[2:]]
    assert run(wrong_arg)[1] == Divergence(2, FULL[1], wrong_arg[1])
    stops = FULL[:3]
    assert run(stops)[1] == Divergence(4, FULL[3], None)
    extra = [*FULL, {"name": "TransHuman", "args": {}}]
    steps, div = run(extra)
    assert steps == FULL and div == Divergence(7, None, extra[6])
    s = step_scores(wrong_arg, FULL, run(wrong_arg)[1], _same)
    assert (s.recall, s.precision, s.order) == (5 / 6, 5 / 6, 5 / 6)
    skipped = [FULL[0], *FULL[2:]]  # PushSettings skipped: every later step lands one position early
    s = step_scores(skipped, run(skipped)[0], run(skipped)[1], _same)
    assert run(skipped)[1] == Divergence(2, FULL[1], FULL[2]) and s.precision == 1.0 and s.recall < 1.0


def test_a_tool_agents_steps_on_the_way_are_not_its_answer(noservice) -> None:
    """A turn whose calls are only steps (AskAirplaneOff, PushSettings, AskRestart) is pending, not a wrong
    Action; the turn that calls an action the procedure can end in is scored on it."""
    case = make_case(noservice, TRUTH, SYSTEM)
    turns = [tool_turn("a", 1, FULL[:3]), tool_turn("a", 2, FULL[3:])]
    run = score_records(noservice, [case], [Dialogue(id="a", case_id=case.id, models={"agent": "a"}, status="done")],
                        turns, [cons("a", t.index, TRUTH) for t in turns])
    assert run.counts["pending_turns"] == 1
    assert math.isnan(run.t_act[0]) and run.t_act[1] == 1.0
    assert run.d_trace["steps_followed"][0] == 1.0 and run.d_trace["step_recall"][0] == 1.0
    assert math.isnan(run.d_trace["end_state"][0])  # no environment: no end state


_CALLS = [{"name": "AskAirplaneOff", "args": {}}, {"name": "PushSettings", "args": {"profile": "Home"}},
          {"name": "PushSettings", "args": {"profile": "Roaming"}}, {"name": "AskRestart", "args": {}},
          {"name": "ReplaceSim", "args": {"fee": 0}}, {"name": "ReplaceSim", "args": {"fee": 10}},
          {"name": "TransHuman", "args": {}}, {"name": "CloseFixed", "args": {}}]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(picks=st.lists(st.integers(0, len(_CALLS) - 1), max_size=9),
       looks=st.lists(st.booleans(), min_size=5, max_size=5), airplane=st.booleans())
def test_any_call_sequence_gets_bounded_step_scores_and_diverges_iff_it_left_the_steps(
        noservice, picks, looks, airplane) -> None:
    """Whatever an agent calls (none, too few, too many, wrong arguments), on the scripted backend and on
    the phone: the scores stay in [0, 1], the divergence is the first position where call and step differ,
    and there is none exactly when the calls are the steps."""
    from sopgraph.evaluation.traces import fits, step_scores, step_session
    from sopgraph.simulation.backend import Backend, BackendSpec
    from sopgraph.simulation.environment import EnvBackend, EnvSpec

    case = make_case(noservice, TRUTH, {**SYSTEM, "AirplaneMode": airplane, "ServiceRestored": looks})
    spec = BackendSpec.of(noservice)
    env = EnvSpec.load("python:examples.no_service_env:make", noservice)
    agent = [_CALLS[i] for i in picks]
    for world in (Backend.for_case(spec, case), EnvBackend.with_env(spec, case, env.for_case(case))):
        steps, div = step_session(noservice, TRUTH, world, agent, _same)
        s = step_scores(agent, steps, div, _same)
        assert steps and 0 <= s.recall <= 1 and 0 <= s.order <= s.recall + 1e-9
        assert not agent or 0 <= s.precision <= 1
        first = next((k for k in range(max(len(agent), len(steps)))
                      if k >= len(agent) or k >= len(steps) or not fits(agent[k], steps[k], _same)), None)
        if first is None:
            assert div is None and s.recall == s.order == 1.0
        else:
            assert div is not None and div.step == first + 1
            assert div.expected == (steps[first] if first < len(steps) else None)
            assert div.done == (agent[first] if first < len(agent) else None)
