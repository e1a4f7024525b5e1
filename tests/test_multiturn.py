"""Multi-turn offline dialogues (issue 10, item 4): the scripted user holds facts back until asked,
pushes and changes mood by intensity; floor agents ask for what the path's decisions need before acting,
so offline dialogues on a shipped scenario last several turns, deterministically."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import sopgraph
from sopgraph.cases.profiles import default_profile, profile_for
from sopgraph.cases.synth import synthesize
from sopgraph.records import AgentOutput
from sopgraph.simulation import providers
from sopgraph.simulation.dialogue import acts, scenario_context
from sopgraph.simulation.providers import STOP_TOKEN, held_back
from sopgraph.simulation.runner import run_sync
from sopgraph.simulation.store import RunStore

ROOT = Path(__file__).resolve().parent.parent
TELECOM = ROOT / "scenarios" / "telecom_package.sop"
FLOORS = ("oracle", "always-escalate", "always-comply", "random-path")


@pytest.fixture(scope="module")
def telecom() -> sopgraph.Scenario:
    return sopgraph.load(TELECOM)


@pytest.fixture(scope="module")
def cases(telecom) -> list:
    return list(synthesize(telecom, profile_for(TELECOM, telecom), 24, seed=5, min_per_path=1).cases)


def _ctx(telecom, case, role: str, turn: int) -> dict[str, Any]:
    info = scenario_context(telecom)
    if role == "user":
        info = {k: v for k, v in info.items() if k != "paths"}
    return {"role": role, "turn": turn, "case": case.model_dump(mode="json"), "scenario": info}


def _talk(telecom, case, agent_lines: list[str]) -> list[str]:
    """The scripted user's messages against a fixed sequence of agent messages (the real loop's history)."""
    history: list[dict[str, Any]] = [{"role": "system", "content": "sys"}, {"role": "user", "content": "open"}]
    said = []
    for turn in range(1, len(agent_lines) + 2):
        text = providers.respond("scripted/user", history, _ctx(telecom, case, "user", turn))
        said.append(text)
        if STOP_TOKEN in text or turn > len(agent_lines):
            break
        history += [{"role": "assistant", "content": text}, {"role": "user", "content": agent_lines[turn - 1]}]
    return said


def _ask(label: str) -> str:
    return f"Could you tell me your {label}?"


def test_user_holds_a_fact_back_until_asked_then_reveals_it(telecom, cases) -> None:
    case = next(c for c in cases if c.intensity == "zero")
    held = held_back(case.model_dump(mode="json"), _ctx(telecom, case, "user", 1))
    assert held and set(held) <= set(case.truth)
    name = held[0]
    label = providers._label(name)
    value = str(case.truth[name])
    said = _talk(telecom, case, ["How can I help?", "Anything else?", _ask(label)])
    # not told while the agent does not ask (it volunteers its account facts instead), told once asked
    assert not any(label in s for s in said[:3])
    assert label in said[3] and value in said[3] and said[3].startswith(("Sure, my", "Fine. My", label.capitalize()))
    assert " my " in f" {said[3].lower()}"  # first person
    # the held-back facts are drawn from the values the reference path's decisions need, seeded
    again = held_back(case.model_dump(mode="json"), _ctx(telecom, case, "user", 1))
    assert again == held


def test_account_facts_are_volunteered_one_per_turn(telecom, cases) -> None:
    case = next(c for c in cases if c.intensity == "zero" and c.user_facts)
    said = _talk(telecom, case, ["How can I help?"] * 6)
    told = [n for n in case.user_facts if any(providers._label(n) in s for s in said)]
    assert told == list(case.user_facts)
    assert said[-1].endswith(STOP_TOKEN)  # then nothing left to say: it leaves
    assert not any(providers._label(n) in s for n in case.truth for s in said)  # classification: only when asked


def test_strong_user_deflects_the_first_question_and_repeats_the_push(telecom, cases) -> None:
    case = next(c for c in cases if c.intensity == "strong" and c.unsafe_action)
    held = held_back(case.model_dump(mode="json"), _ctx(telecom, case, "user", 1))
    assert len(held) == 2  # strong users hold back more
    label = providers._label(held[0])
    said = _talk(telecom, case, [_ask(label), _ask(label), "Let me check.", "One moment."])
    act = providers._label(case.unsafe_action)
    assert all(act in s for s in said[:4])  # pushes on every turn...
    assert len({s[s.index(act) - 30:] for s in said[:4]}) == 4  # ...escalating, never the same line
    assert label not in said[1] and "Why does that matter" in said[1]  # first question deflected
    assert label in said[2] and str(case.truth[held[0]]) in said[2]  # asked again: answered
    assert "lose my patience" in said[2]  # mood worsens while the agent keeps asking


@pytest.mark.parametrize("agent", FLOORS)
def test_floor_agents_ask_before_acting(telecom, cases, agent) -> None:
    case = cases[0]
    history: list[dict[str, Any]] = [{"role": "system", "content": "sys"}, {"role": "user", "content": "Hi."}]
    asked: list[str] = []
    for turn in range(1, 12):
        reply = json.loads(providers.respond(f"baseline/{agent}", history, _ctx(telecom, case, "agent", turn)))
        out = AgentOutput.model_validate(reply)
        if acts(telecom, out):
            break
        # an asking turn: a question naming the value the next decision needs, the path stopped short
        assert out.now_path == ["step1"] and out.chat.endswith("?") or "still need" in out.chat
        name = next(n for n in telecom.stages["step1"].classify if providers._label(n) in out.chat)
        asked.append(name)
        history += [{"role": "assistant", "content": json.dumps(reply)},
                    {"role": "user", "content": f"My {providers._label(name)} is {case.truth[name]}."}]
    else:
        pytest.fail(f"{agent} never acted")
    assert asked == list(telecom.stages["step1"].classify)  # every value step1 classifies, in order, once each
    assert turn == len(asked) + 1


def test_a_floor_agent_stops_asking_after_two_tries(telecom, cases) -> None:
    case = cases[0]
    history: list[dict[str, Any]] = [{"role": "system", "content": "sys"}, {"role": "user", "content": "Hi."}]
    for turn in range(1, 20):
        reply = json.loads(providers.respond("baseline/oracle", history, _ctx(telecom, case, "agent", turn)))
        if acts(telecom, AgentOutput.model_validate(reply)):
            break
        history += [{"role": "assistant", "content": json.dumps(reply)}, {"role": "user", "content": "No idea."}]
    assert turn == 2 * len(telecom.stages["step1"].classify) + 1  # asks each value twice, then acts


def _dialogue_shape(out: Path) -> tuple[Counter, list[tuple]]:
    with RunStore.open(out) as store:
        lengths = Counter(d.turns for d in store.dialogues())
        rows = [(t.dialogue_id, t.index, t.user_text, t.agent_raw) for t in store.turns()]
    return lengths, rows


def test_offline_dialogues_last_three_to_eight_turns_deterministically(telecom, cases, tmp_path) -> None:
    for agent in ("oracle", "random-path"):
        run_sync(telecom, cases, [f"agent=baseline/{agent}"], str(tmp_path / agent), trials=1, progress=False,
                 judge_turns="final")
        lengths, rows = _dialogue_shape(tmp_path / agent)
        # 3-8 turns, varied (the oracle asks only for what the engine session reads: from 2)
        assert set(lengths) <= set(range(2 if agent == "oracle" else 3, 9)) and len(lengths) >= 3, lengths
        assert sum(n for k, n in lengths.items() if k >= 5) > 0  # the depth-5 table has data
        users = " ".join(r[2] for r in rows)
        assert "lose my patience" in users  # the mood moves: strong users grow impatient...
        assert "a little impatient" in users or "thanks for asking" in users  # ...and weak or upset ones too
    # same seed, same cases: the same dialogues, byte for byte
    run_sync(telecom, cases, ["agent=baseline/random-path"], str(tmp_path / "again"), trials=1, progress=False,
             judge_turns="final")
    assert _dialogue_shape(tmp_path / "again") == _dialogue_shape(tmp_path / "random-path")


def test_a_path_that_stops_short_does_not_act(telecom) -> None:
    out = AgentOutput(now_path=["step1", "step2"], finals={"Action": "ChangeOrder"})
    assert not acts(telecom, out)  # step2 leads to stages, not to ChangeOrder
    assert acts(telecom, out.model_copy(update={"now_path": ["step1", "step2", "step4"]}))
    assert not acts(telecom, out.model_copy(update={"now_path": []}))
    assert acts(telecom, out.model_copy(update={"now_path": [], "source": "tools"}))  # a tool call acts


def test_a_generated_intent_is_not_read_out(telecom) -> None:
    """A generated intent's description is the path's conditions and outcome ("— the SOP ends in
    ChangeOrder"): the scripted user opens with its request's facts instead of saying the answer."""
    generated = [c for c in synthesize(telecom, default_profile(telecom), 12, seed=3).cases if c.intent_generated]
    assert generated
    for case in generated:
        opening = _talk(telecom, case, [])[0]
        assert "the SOP ends in" not in opening and "(generated)" not in opening, opening
        told = [n for n in case.truth if providers._label(n) in opening.lower()]
        hidden = set(held_back(case.model_dump(mode="json"), _ctx(telecom, case, "user", 1)))
        assert not set(told) & hidden
    assert any(providers._label(n) in _talk(telecom, c, [])[0].lower() for c in generated for n in c.truth)
