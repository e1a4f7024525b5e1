"""The dialogue loop: reply parsing (the format-error rule), termination, what each side sees."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from sopgraph.logic.checker import load
from sopgraph.records import Case, Persona
from sopgraph.simulation.dialogue import (
    DialogueSetup,
    SimState,
    extract_json_object,
    parse_agent_reply,
    scenario_context,
    simulate_dialogue,
    split_stop,
)
from sopgraph.simulation.gateway import InfraFailure, ModelSpec

TOY = (Path(__file__).parent / "data" / "toy_refunds.sop").read_text()


@pytest.fixture(scope="module")
def toy():
    return load(text=TOY)


def reply(action: str = "Explain", chat: str = "hello", **extra) -> dict:
    return {"classification_output": {"Want": "Money", "Angry": False, "Items": 2}, "cot": "c",
            "now_path": ["s1", "s2", "s3"], "finals": {"Action": action}, "chat": chat, **extra}


# ----------------------------------------------------------------------------- parsing

def test_strict_json_is_not_flagged(toy):
    out, err, note = parse_agent_reply(toy, "  " + json.dumps(reply()) + "\n")
    assert not err and note is None and out.finals == {"Action": "Explain"} and out.chat == "hello"


@pytest.mark.parametrize("text, note", [
    ("Sure!\n```json\n" + json.dumps(reply()) + "\n```\nAnything else?", "extracted from a fenced code block"),
    ("```\n" + json.dumps(reply()) + "\n```", "extracted from a fenced code block"),
    ("Here is my answer: " + json.dumps(reply()) + " -- hope it helps {not json}", "extracted from surrounding text"),
    ("{oops} then " + json.dumps(reply()), "extracted from surrounding text"),
])
def test_lenient_extraction_is_flagged_not_an_error(toy, text, note):
    out, err, got = parse_agent_reply(toy, text)
    assert not err and got == note and out.finals["Action"] == "Explain"


@pytest.mark.parametrize("text, why", [
    ("I will refund you now.", "not valid JSON"),
    ("", "empty reply"),
    (json.dumps(reply())[:60], "not valid JSON"),  # truncated
    ("[1, 2]", "not an object"),
    (json.dumps(reply(action="Fly")), "schema violation"),
    (json.dumps({**reply(), "classification_output": {"Want": "Money"}}), "schema violation"),
    (json.dumps(reply(extra_key=1)), "unexpected key"),
    ("```json\n" + json.dumps(reply(action="Fly")) + "\n```", "extracted from a fenced code block: schema"),
])
def test_format_errors(toy, text, why):
    out, err, note = parse_agent_reply(toy, text)
    assert out is None and err and why in note


def test_extract_is_bounded_on_adversarial_text():
    obj, how, error = extract_json_object("{" * 100000)
    assert obj is None and how is None and error


def test_split_stop():
    assert split_stop("Thanks, bye.\n###STOP###") == ("Thanks, bye.", True)
    assert split_stop(" hi ") == ("hi", False)


def test_scenario_context(toy):
    info = scenario_context(toy)
    assert info["fields"] == {"Want": ["Money", "Info"], "Angry": [True, False], "Items": []}
    assert info["escalation_actions"] == ["Human"] and info["ending_actions"] == ["Refund"]


# ----------------------------------------------------------------------------- the loop

class _C:
    def __init__(self, text, model):
        self.text, self.model, self.cost, self.cost_known, self.latency = text, model, 0.01, True, 0.2

        class U:
            prompt_tokens, completion_tokens, reasoning_tokens = 5, 2, 0

        self.usage = U()


class FakeGateway:
    """Replies from per-role scripts; records every call's messages and context."""

    def __init__(self, agent: list, user: list):
        self.script = {"agent": list(agent), "user": list(user)}
        self.calls: list[tuple[str, list, dict]] = []

    async def complete(self, spec, messages, *, context=None):
        self.calls.append((spec.role, [dict(m) for m in messages], dict(context or {})))
        item = self.script[spec.role].pop(0)
        if isinstance(item, Exception):
            raise item
        return _C(item if isinstance(item, str) else json.dumps(item), spec.model)


AGENT = ModelSpec(role="agent", model="openai/agent")
USER = ModelSpec(role="user", model="openai/user")


def _setup(toy, schema=None) -> DialogueSetup:
    case = Case(id="c1", scenario="toy", path_id="p", intent="refund", persona=Persona(name="p"),
                truth={"Want": "Money", "Angry": False, "Items": 2}, system={"Paid": True},
                expected_path=["s1", "s2", "s3"], expected_finals={"Action": "Refund"})
    return DialogueSetup(scenario=toy, case=case, dialogue_id="c1#0", trial=0, agent_system="AGENT SYS",
                         user_system="USER SYS", scenario_info=scenario_context(toy), response_schema=schema,
                         sop_hash=toy.source_hash, tool_version="t")


def _run(gw, setup, **kw):
    stored = []
    result = asyncio.run(simulate_dialogue(gw, AGENT, USER, setup, on_turn=lambda t, rows: stored.append((t, rows)),
                                           **kw))
    return result, stored


def test_ending_action_ends_and_format_error_text_reaches_the_user(toy):
    gw = FakeGateway(agent=["Let me think...", reply("Refund", "Refund done")], user=["I want money", "please"])
    result, stored = _run(gw, _setup(toy))
    assert result.end_reason == "ending_action" and len(result.turns) == 2
    t1, t2 = result.turns
    assert t1.format_error and t1.output is None and t1.agent_raw == "Let me think..."
    assert not t2.format_error and t2.output.finals["Action"] == "Refund"
    # the user saw the raw text of the broken turn; the agent's history holds its raw replies
    roles = [c[0] for c in gw.calls]
    assert roles == ["user", "agent", "user", "agent"]
    user_call_2 = gw.calls[2][1]
    assert user_call_2[0] == {"role": "system", "content": "USER SYS"}
    assert user_call_2[-1] == {"role": "user", "content": "Let me think..."}
    assert user_call_2[-2] == {"role": "assistant", "content": "I want money"}
    agent_call_2 = gw.calls[3][1]
    assert [m["role"] for m in agent_call_2] == ["system", "user", "assistant", "user"]
    assert agent_call_2[2]["content"] == "Let me think..." and agent_call_2[3]["content"] == "please"
    # contexts: role, 1-based turn, case, no path list for the user
    assert gw.calls[1][2]["role"] == "agent" and gw.calls[1][2]["turn"] == 1 and gw.calls[3][2]["turn"] == 2
    assert gw.calls[2][2]["role"] == "user" and "paths" not in gw.calls[2][2]["scenario"]
    assert gw.calls[0][2]["case"]["id"] == "c1" and gw.calls[0][2]["trial"] == 0
    # each stored turn carries the agent and user usage of that turn
    assert [t.index for t, _ in stored] == [1, 2]
    assert sorted(r["role"] for r in stored[0][1]) == ["agent", "user"]
    assert t1.usage.prompt_tokens == 5 and t1.latency_s == 0.2 and t1.sop_hash == toy.source_hash


def test_non_ending_action_continues_until_user_stops(toy):
    gw = FakeGateway(agent=[reply("Explain", "Policy is X")], user=["Why?", "Ok thanks.\n###STOP###"])
    result, stored = _run(gw, _setup(toy))
    assert result.end_reason == "user_stop" and len(result.turns) == 1
    assert result.closing_user_text == "Ok thanks."
    assert gw.calls[-1][1][-1] == {"role": "user", "content": "Policy is X"}  # the user saw the chat only


def test_user_stop_in_the_opening_means_no_turns(toy):
    result, stored = _run(FakeGateway(agent=[], user=["###STOP###"]), _setup(toy))
    assert result.end_reason == "user_stop" and result.turns == [] and stored == []


def test_max_turns(toy):
    gw = FakeGateway(agent=[reply("Explain")] * 3, user=["a", "b", "c"])
    result, _ = _run(gw, _setup(toy), max_turns=3)
    assert result.end_reason == "max_turns" and [t.index for t in result.turns] == [1, 2, 3]


def test_escalation_ends(toy):
    result, _ = _run(FakeGateway(agent=[reply("Human")], user=["a"]), _setup(toy))
    assert result.end_reason == "ending_action"


def test_structured_passes_the_schema(toy):
    schema = {"type": "object"}
    gw = FakeGateway(agent=[reply("Refund")], user=["a"])
    _run(gw, _setup(toy, schema=schema))
    ctx = gw.calls[1][2]
    assert ctx["response_schema"] == schema and ctx["response_schema_name"] == "agent_output"
    assert "response_schema" not in gw.calls[0][2]


def test_infra_failure_propagates_with_spent_usage(toy):
    boom = InfraFailure("user openai/user: server_error after 5 attempts", kind="server_error")
    gw = FakeGateway(agent=[reply("Explain"), boom], user=["a", "b"])
    state = SimState()
    with pytest.raises(InfraFailure):
        asyncio.run(simulate_dialogue(gw, AGENT, USER, _setup(toy), state=state))
    assert len(state.turns) == 1 and [r["role"] for r in state.pending_usage] == ["user"]
