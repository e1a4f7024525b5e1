"""Tool calling (`--model agent=tools:MODEL`): the SOP's actions as tools, the simulated backend, and a
function-calling model behind a local OpenAI-compatible server (tests/fakeserver.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from fakeserver import Behavior, FakeServer, RecordedRequest
from helpers import done_dialogues

import sopgraph
from sopgraph.cases.profiles import profile_for
from sopgraph.cases.synth import plan, synthesize
from sopgraph.evaluation.score import ScoreConfig, score_run
from sopgraph.logic.engine import reference_trace
from sopgraph.simulation.agents import agent_kind, tool_schemas
from sopgraph.simulation.backend import Backend, BackendSpec, visible_system
from sopgraph.simulation.runner import RunError, run_sync
from sopgraph.simulation.store import RunStore

ROOT = Path(__file__).resolve().parent.parent
BIKE = ROOT / "examples" / "bike_rental.sop"
NOSERVICE = ROOT / "examples" / "no_service.sop"


def _cases(path: Path) -> list:
    scenario = sopgraph.load(path)
    profile = profile_for(path, scenario)
    n = len(plan(scenario, profile).paths)
    return list(synthesize(scenario, profile, n, seed=1, min_per_path=1).cases)


@pytest.fixture(scope="module")
def noservice() -> sopgraph.Scenario:
    return sopgraph.load(NOSERVICE)


@pytest.fixture(scope="module")
def noservice_cases() -> list:
    return _cases(NOSERVICE)


@pytest.fixture(scope="module")
def bike() -> sopgraph.Scenario:
    return sopgraph.load(BIKE)


@pytest.fixture(scope="module")
def bike_cases() -> list:
    return _cases(BIKE)


# --------------------------------------------------------------------------- schemas and backend
def test_tool_schemas_are_typed_from_the_sop(noservice, bike) -> None:
    tools = {t["function"]["name"]: t["function"] for t in tool_schemas(noservice)}
    assert set(tools) == set(noservice.actions) | {"lookup"}
    hours = tools["ReportOutage"]["parameters"]
    assert hours["properties"]["hours"]["type"] == "integer" and hours["required"] == ["hours"]
    assert (hours["properties"]["hours"]["minimum"], hours["properties"]["hours"]["maximum"]) == (0, 72)
    assert tools["PushSettings"]["parameters"]["properties"]["profile"]["enum"] == ["Home", "Roaming"]
    assert tools["AskRestart"]["parameters"]["properties"] == {}
    assert tools["ReplaceSim"]["description"].startswith("Book a replacement SIM")
    lookup = tools["lookup"]["parameters"]["properties"]["name"]["enum"]
    assert lookup == [v.name for v in noservice.system_vars if not v.hidden] and "ServiceRestored" in lookup
    fee = {t["function"]["name"]: t["function"] for t in tool_schemas(bike)}["SettleReturn"]["parameters"]
    assert fee["properties"]["Fee"]["type"] == "number" and fee["required"] == ["Fee"]  # an assigned output
    spec = BackendSpec.of(noservice)
    assert spec.check("ReportOutage", {"hours": 5}) is None
    for name, args in (("ReportOutage", {"hours": 99}), ("ReportOutage", {}), ("PushSettings", {"profile": "Mars"}),
                       ("Nope", {}), ("lookup", {"name": "NotAVariable"}), ("AskRestart", [1])):
        assert spec.check(name, args), (name, args)


def test_backend_reports_the_case_observation_sequence(noservice, noservice_cases) -> None:
    """An agent that follows the SOP — a lookup at the first check, then the engine's reference actions —
    is told exactly the case's values, one per look, in order."""
    spec = BackendSpec.of(noservice)
    checked = 0
    for case in noservice_cases:
        looks = case.system.get("ServiceRestored")
        if not looks:
            continue
        backend = Backend(spec, case.system)
        seen = [backend.call("lookup", {"name": "ServiceRestored"})["value"]]
        assert backend.call("lookup", {"name": "ServiceRestored"})["value"] == seen[0]  # asking again: same look
        for step in reference_trace(noservice, {**case.truth, **case.system}):
            result = backend.call(step["name"], step["args"])
            assert result["status"] == "done"
            if "observed" in result:
                seen.append(result["observed"]["ServiceRestored"])
        assert seen == looks, case.id
        checked += 1
    assert checked >= 10
    case = next(c for c in noservice_cases if c.system.get("ServiceRestored") == [False, False, True])
    backend = Backend(spec, case.system)
    assert backend.call("lookup", {"name": "OutageHours"})["value"] == case.system["OutageHours"]
    assert backend.call("lookup", {"name": "ServiceRestored"})["value"] is False
    backend.call("PushSettings", {"profile": "Home"})  # an action since the last look: the next lookup looks anew
    assert backend.call("lookup", {"name": "ServiceRestored"})["value"] is False
    assert backend.call("AskRestart", {})["observed"] == {"ServiceRestored": True}
    assert backend.call("AskRestart", {})["observed"] == {"ServiceRestored": True}  # past the end: the last value
    assert "ServiceRestored" not in visible_system(noservice, case.system)  # never shown up front


# --------------------------------------------------------------------------- through the gateway
def _model(server: FakeServer) -> str:
    return f"agent=tools:openai/fake-fc,api_base={server.base_url}"


def _results(req: RecordedRequest) -> list[dict]:
    return [json.loads(m["content"]) for m in req.messages if m.get("role") == "tool"]


def test_tool_calling_model_gets_backend_answers_and_is_scored(tmp_path, noservice, noservice_cases) -> None:
    case = next(c for c in noservice_cases if c.expected_path == ["account", "status", "recheck", "fix", "retest"])
    with FakeServer(lifetime=120) as server:
        server.script([
            Behavior.tools(("lookup", {"name": "AccountSuspended"}), ("lookup", {"name": "AreaOutage"})),
            Behavior.tools(("lookup", {"name": "ServiceRestored"}), ("lookup", {"name": "AirplaneMode"})),
            Behavior.tools(("AskAirplaneOff", {})),
            Behavior.tools(("PushSettings", {"profile": case.system["Registered"]}), ("AskRestart", {})),
            Behavior.tools(("CloseFixed", {}), content="Service is back; I'm closing the call."),
        ])
        run_sync(noservice, [case], [_model(server)], str(tmp_path / "r"), progress=False)
        requests = list(server.requests)
    assert len(requests) == 5  # the ending action ends the turn: no model call after it
    first = requests[0].body
    assert {t["function"]["name"] for t in first["tools"]} == set(noservice.actions) | {"lookup"}
    assert first["messages"][0]["role"] == "system" and "lookup" in first["messages"][0]["content"]
    assert str(case.system["OutageHours"]) + " hours" not in first["messages"][0]["content"]  # values: by lookup
    assert _results(requests[1]) == [{"name": "AccountSuspended", "value": case.system["AccountSuspended"]},
                                     {"name": "AreaOutage", "value": case.system["AreaOutage"]}]
    assert _results(requests[2])[2]["value"] is False  # the first look
    assert _results(requests[3])[-1]["observed"] == {"ServiceRestored": False}  # after AskAirplaneOff
    assert _results(requests[4])[-1]["observed"] == {"ServiceRestored": True}  # after the restart
    assert [c["function"]["name"] for c in requests[4].messages[-3]["tool_calls"]] == ["PushSettings", "AskRestart"]
    with RunStore.open(tmp_path / "r") as store:
        (dialogue,), (turn,) = store.dialogues(), store.turns()
    assert dialogue.status == "done" and dialogue.end_reason == "ending_action"
    assert turn.output is not None and turn.output.source == "tools" and not turn.format_error
    assert turn.output.tool_calls == reference_trace(noservice, {**case.truth, **case.system})  # the engine's trace
    assert turn.output.finals == {"Action": "CloseFixed"}
    assert turn.output.now_path == case.expected_path  # inferred from the whole trace, not just CloseFixed
    assert turn.output.chat == "Service is back; I'm closing the call."
    assert turn.usage.calls == 5 and turn.usage.prompt_tokens == 50
    g = score_run(tmp_path / "r", ScoreConfig(bootstrap=0)).aggregate(["model"])[0]
    assert g.metrics["trace_recall"].value == 1.0 and g.metrics["tau2_pass"].value == 1.0
    assert g.metrics["trace_precision"].value is not None and g.metrics["classification"].value is None


def test_wrong_action_scores_low_and_malformed_call_is_a_format_error(tmp_path, bike, bike_cases) -> None:
    case = next(c for c in bike_cases if c.expected_finals.get("Action") == "SettleReturn")
    with FakeServer(lifetime=120) as server:
        server.script([Behavior.tools(("WaiveFee", {}), content="All done, no charge.")])
        run_sync(bike, [case], [_model(server)], str(tmp_path / "wrong"), progress=False)
        turns, sent = [], []
        for i, bad in enumerate((Behavior.tools(("SettleReturn", "{not json")),  # broken arguments
                                 Behavior.tools(("Teleport", {})),  # not a tool
                                 Behavior.tools(("SettleReturn", {"Fee": -3})))):  # outside the parameter's type
            server.requests.clear()
            server.script([bad])
            run_sync(bike, [case], [_model(server)], str(tmp_path / f"bad{i}"), progress=False, max_turns=1)
            sent.append(server.requests[0])
            with RunStore.open(tmp_path / f"bad{i}") as store:
                (dialogue,), (turn,) = store.dialogues(), store.turns()
            assert dialogue.status == "done" and turn.format_error and turn.output is None
            assert "tool_calls" in turn.agent_raw
            turns.append(turn)
    g = score_run(tmp_path / "wrong", ScoreConfig(bootstrap=0)).aggregate(["model"])[0]
    assert g.metrics["trace_precision"].value == 0.0 and g.metrics["trace_recall"].value == 0.0
    assert g.metrics["tau2_pass"].value == 0.0
    notes = [t.format_note or "" for t in turns]
    assert "arguments are not JSON" in notes[0] and "'Teleport' is not an action" in notes[1]
    assert "Fee" in notes[2] and "at least 0" in notes[2]
    g = score_run(tmp_path / "bad0", ScoreConfig(bootstrap=0)).aggregate(["model"])[0]
    assert g.metrics["format_error_rate"].value == 1.0


def continuing_agent(request: dict) -> dict:
    """A protocol agent that looks a value up, reads the result within the same turn, then acts."""
    last = request["messages"][-1]
    if last["role"] == "tool":
        hours = json.loads(last["content"])["value"]
        if hours > 1000:
            return {"reply": "?", "tool_calls": [{"name": "Teleport", "arguments": {}}], "continue": True}
        return {"reply": f"You were {hours} hours late.", "tool_calls": [{"name": "WaiveFee", "arguments": "{}"}]}
    return {"reply": "", "tool_calls": [{"name": "lookup", "arguments": {"name": "HoursLate"}}], "continue": True}


def test_protocol_agents_get_backend_results_within_the_turn(bike, bike_cases) -> None:
    import asyncio

    from sopgraph.simulation.agents import ToolAgent, tool_turn

    agent = ToolAgent(f"python:{__name__}:continuing_agent", bike)
    case = bike_cases[0]
    messages: list[dict] = [{"role": "user", "content": "Hi, I'm bringing the bike back."}]
    result = asyncio.run(tool_turn(agent, None, Backend(agent.backend, case.system), messages, dialogue_id="d",
                                   turn=1, system=case.system))
    assert result.problem is None and result.output is not None
    assert result.output.chat == f"You were {case.system['HoursLate']} hours late."
    assert result.output.tool_calls == [{"name": "WaiveFee", "args": {}}]  # lookups are not actions
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant", "tool"]
    assert json.loads(messages[2]["content"]) == {"name": "HoursLate", "value": case.system["HoursLate"]}
    assert messages[1]["tool_calls"][0]["id"] == messages[2]["tool_call_id"]
    # a malformed call: a format error, and still a result message for every call (well-formed history)
    big = {**case.system, "HoursLate": 5000}
    messages = [{"role": "user", "content": "Hi."}]
    result = asyncio.run(tool_turn(agent, None, Backend(agent.backend, big), messages, dialogue_id="d", turn=1,
                                   system=big))
    assert result.output is None and "'Teleport' is not an action" in (result.problem or "")
    assert messages[-1]["role"] == "tool" and "error" in json.loads(messages[-1]["content"])


def test_tools_kind_needs_a_function_calling_model(tmp_path, bike, bike_cases) -> None:
    assert agent_kind("tools:openai/gpt-4o-mini") == "tools"
    with pytest.raises(RunError, match="function calling"):
        run_sync(bike, bike_cases[:1], ["agent=tools:baseline/oracle"], str(tmp_path / "x"), progress=False)


# --------------------------------------------------------------------------- kill -9 + resume
def _policy(req: RecordedRequest) -> Behavior | None:
    """A slow, deterministic function-calling agent: look up, then end with the first escalation."""
    msgs = req.messages
    if msgs and msgs[-1].get("role") == "tool":
        return Behavior.tools(("TransHuman", {}), content="Let me hand you to the manager.", latency=0.05)
    return Behavior.tools(("lookup", {"name": "HoursLate"}), latency=0.05)


def test_sigkill_then_resume_is_exactly_once_for_tool_calling(tmp_path, bike_cases) -> None:
    cases_file = tmp_path / "cases.jsonl"
    many = [c.model_copy(update={"id": f"{c.id}-{i}"}) for i in range(5) for c in bike_cases]
    cases_file.write_text("".join(json.dumps(c.model_dump(mode="json")) + "\n" for c in many))
    out = tmp_path / "run"
    with FakeServer(lifetime=240) as server:
        server.responder(_policy)
        model = _model(server)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        code = "import sys; from sopgraph.cli import main; sys.exit(main())"
        proc = subprocess.Popen([sys.executable, "-c", code, "run", str(BIKE), "--cases", str(cases_file),
                                 "--model", model, "--concurrency", "2", "-q", "-o", str(out)],
                                env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None and done_dialogues(out) < 4:
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        with RunStore.open(out) as s:
            before = Counter(d.status for d in s.dialogues())
        assert 0 < before["done"] < len(many), (before, proc.stderr.read() if proc.stderr else "")
        run_sync(None, None, None, str(out), resume=True, progress=False)
    with RunStore.open(out) as s:
        dialogues, turns = s.dialogues(), s.turns()
    assert len(dialogues) == len(many) and all(d.status == "done" for d in dialogues)
    for d in dialogues:
        mine = [t for t in turns if t.dialogue_id == d.id]
        assert [t.index for t in mine] == list(range(1, d.turns + 1))
        assert [c["name"] for t in mine for c in t.output.tool_calls] == ["TransHuman"]


def test_the_calls_of_one_answer_are_all_carried_out_even_after_an_ending_action(noservice, noservice_cases
                                                                                 ) -> None:
    """A procedure may hand over right after a step that ends the dialogue (`do IssueCredit -> do
    Supervisor`): the calls of one answer go together, and the dialogue ends after them (the call after
    the ending one was refused, so no agent could follow such a procedure)."""
    from sopgraph.simulation.agents import Exchange, _run_calls
    from sopgraph.simulation.backend import Backend, BackendSpec

    backend = Backend.for_case(BackendSpec.of(noservice), noservice_cases[0])
    calls = [{"name": "ReplaceSim", "arguments": '{"fee": 10}'}, {"name": "TransHuman", "arguments": "{}"}]
    exchange = Exchange("", calls, True, 0.0)
    messages: list[dict[str, Any]] = []
    trace: list[dict[str, Any]] = []
    ended, problem = _run_calls(None, backend, exchange, messages, trace, [], "c")  # type: ignore[arg-type]
    assert ended and problem is None
    assert [t["name"] for t in trace] == backend.actions == ["ReplaceSim", "TransHuman"]
    assert all("error" not in json.loads(m["content"]) for m in messages if m["role"] == "tool")


def test_a_turn_of_steps_only_answers_nothing(noservice) -> None:
    """A tool turn's answer is its last call of an action the procedure can end on: `PushSettings` and
    `AskRestart` are steps, so a turn of those alone is pending (it scored as a wrong final Action)."""
    from sopgraph.simulation.agents import final_actions, output_for

    steps = [{"name": "PushSettings", "args": {"profile": "Home"}}, {"name": "AskRestart", "args": {}}]
    ends = final_actions(noservice)
    assert "AskRestart" not in ends and "CloseFixed" in ends
    assert output_for([], "", steps, finals_of=ends).finals == {}
    assert output_for([], "", [*steps, {"name": "CloseFixed", "args": {}}], finals_of=ends).finals == {
        "Action": "CloseFixed"}
