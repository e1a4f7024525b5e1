"""Judges: answer parsing, retries and unscored judges, the tie policy, agreement statistics."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from sopgraph.logic.checker import load
from sopgraph.records import CHAT_DIMENSIONS, AgentOutput, Case, Judgment, Persona, Turn
from sopgraph.simulation.judge import (
    Ensemble,
    Judge,
    JudgeRequest,
    LLMJudge,
    agreement,
    consensus,
    fleiss_kappa,
    parse_judge_reply,
    parse_judge_turns,
    select_turns,
)

TOY = (Path(__file__).parent / "data" / "toy_refunds.sop").read_text()
FIELDS = ["Want", "Angry", "Items"]
SCORES = dict.fromkeys(CHAT_DIMENSIONS, 6)


@pytest.fixture(scope="module")
def toy():
    return load(text=TOY)


def _case() -> Case:
    return Case(id="c1", scenario="toy", path_id="p", intent="refund", persona=Persona(name="p"),
                truth={"Want": "Money", "Angry": False, "Items": 2}, system={"Paid": True},
                expected_path=["s1", "s2", "s3"], expected_finals={"Action": "Refund"})


def _turns(n: int) -> list[Turn]:
    return [Turn(dialogue_id="c1#0", index=i, user_text=f"user {i}", agent_raw="{}",
                 output=AgentOutput(chat=f"agent {i}", finals={"Action": "Explain"})) for i in range(1, n + 1)]


def _request(toy, n: int = 2) -> JudgeRequest:
    return JudgeRequest(scenario=toy, case=_case(), dialogue_id="c1#0", turns=_turns(n), turn_index=n)


def _j(judge: str, labels: dict | None, scores: dict | None = None, turn: int = 1, did: str = "d") -> Judgment:
    return Judgment(dialogue_id=did, turn_index=turn, judge=judge, model=f"m-{judge}", labels=labels,
                    scores=scores)


# ----------------------------------------------------------------------------- turn selection

def test_judge_turns_parse_and_select():
    spec = parse_judge_turns("15, 1,final,5,10,5")
    assert spec == (1, 5, 10, 15, "final")
    assert select_turns(3, spec) == [1, 3]
    assert select_turns(5, spec) == [1, 5]
    assert select_turns(16, spec) == [1, 5, 10, 15, 16]
    assert select_turns(0, spec) == []
    assert select_turns(4, parse_judge_turns("all")) == [1, 2, 3, 4]
    assert select_turns(4, parse_judge_turns("2")) == [2]
    for bad in ("0", "x", ""):
        with pytest.raises(ValueError):
            parse_judge_turns(bad)


# ----------------------------------------------------------------------------- parsing

def test_parse_judge_reply_accepts_both_formats(toy):
    ours = {"labels": {"Want": "Money", "Angry": False, "Items": 3}, "scores": SCORES, "reasons": {"labels": "x"}}
    p = parse_judge_reply(toy, json.dumps(ours))
    assert not p.problems and p.labels == {"Want": "Money", "Angry": False, "Items": 3} and p.scores == SCORES
    sage = {"classification": {"Want": "money", "Angry": "true", "Items": "3"},
            "chat_quality_dimensions": {"linguistic_quality": 9, "anthropomorphism_emotion": 6,
                                        "content_utility": 3, "user_satisfaction": "6",
                                        "instruction_compliance": 9.0},
            "classification_reasoning": "because", "chat_quality_reasoning": "fine"}
    p = parse_judge_reply(toy, "Here you go:\n```json\n" + json.dumps(sage) + "\n```")
    assert not p.problems
    assert p.labels == {"Want": "Money", "Angry": True, "Items": 3}
    assert p.scores == {"linguistic": 9, "anthropomorphism": 6, "content_utility": 3, "satisfaction": 6,
                        "instruction": 9}
    assert p.reasons == {"labels": "because", "chat": "fine"}


def test_parse_judge_reply_problems(toy):
    p = parse_judge_reply(toy, "I think the user wants money.")
    assert p.fatal and p.labels is None
    p = parse_judge_reply(toy, json.dumps({"labels": {"Want": "Cash", "Angry": None, "Items": 11},
                                           "scores": {**SCORES, "linguistic": 7}}))
    assert not p.fatal and p.labels == {"Want": None, "Angry": None, "Items": None}
    assert p.scores is None
    assert any("Cash" in x for x in p.problems) and any("outside" in x for x in p.problems)
    assert any("not 3, 6 or 9" in x for x in p.problems)


# ----------------------------------------------------------------------------- consensus

def test_majority_and_tie_policy():
    js = [_j("j1", {"Want": "Money", "Angry": True, "Items": 1}, SCORES),
          _j("j2", {"Want": "Money", "Angry": False, "Items": 2}, {**SCORES, "linguistic": 9}),
          _j("j3", {"Want": "Info", "Angry": None, "Items": 3}, {**SCORES, "linguistic": 3})]
    c = consensus(FIELDS, js, judgment_set="s", dialogue_id="d", turn_index=1)
    assert c.labels == {"Want": "Money"}  # 2 of 3
    # Angry: 1-1 among the two that answered (j3 abstained) -> no consensus; Items 1-1-1 -> none
    assert c.no_consensus == ["Angry", "Items"]
    assert c.chat_scores["linguistic"] == 6.0 and c.chat_scores["instruction"] == 6.0
    assert c.judges_scored == 3


def test_unscored_judges_are_left_out_of_votes_and_scores():
    js = [_j("j1", {"Want": "Info", "Angry": True, "Items": 4}, {**SCORES, "satisfaction": 9}),
          _j("j2", None), _j("j3", {"Want": "Info", "Angry": False, "Items": 4}, None)]
    c = consensus(FIELDS, js, judgment_set="s", dialogue_id="d", turn_index=1)
    assert c.labels == {"Want": "Info", "Items": 4}
    assert c.no_consensus == ["Angry"]
    assert c.judges_scored == 1 and c.chat_scores["satisfaction"] == 9.0
    # one answering judge is a strict majority of one; none answering -> no consensus at all
    c1 = consensus(FIELDS, [_j("j1", {"Want": "Info", "Angry": True, "Items": 4}), _j("j2", None)],
                   judgment_set="s", dialogue_id="d", turn_index=1)
    assert c1.labels == {"Want": "Info", "Angry": True, "Items": 4}
    c0 = consensus(FIELDS, [_j("j1", None)], judgment_set="s", dialogue_id="d", turn_index=1)
    assert c0.labels == {} and c0.no_consensus == FIELDS and c0.chat_scores == {}


def test_a_field_no_answering_judge_labels_is_not_shown_yet():
    """Every judge that answered left Angry null: the conversation does not show it yet (not a split);
    with no judge answering at all there is nothing to read, so that stays no consensus."""
    js = [_j("j1", {"Want": "Info", "Angry": None, "Items": 4}), _j("j2", {"Want": "Info", "Angry": None}),
          _j("j3", None)]
    c = consensus(FIELDS, js, judgment_set="s", dialogue_id="d", turn_index=1)
    assert c.labels == {"Want": "Info", "Items": 4}
    assert c.unshown == ["Angry"] and c.no_consensus == []
    split = consensus(FIELDS, [_j("j1", {"Angry": True}), _j("j2", {"Angry": False}), _j("j3", {"Angry": None})],
                      judgment_set="s", dialogue_id="d", turn_index=1)
    assert split.no_consensus == ["Angry"] and split.unshown == ["Want", "Items"]
    c0 = consensus(FIELDS, [_j("j1", None)], judgment_set="s", dialogue_id="d", turn_index=1)
    assert c0.unshown == [] and c0.no_consensus == FIELDS


def test_votes_compare_numbers_by_value():
    js = [_j("a", {"Items": 2}), _j("b", {"Items": 2.0}), _j("c", {"Items": 3})]
    assert consensus(["Items"], js, judgment_set="s", dialogue_id="d", turn_index=1).labels == {"Items": 2}


# ----------------------------------------------------------------------------- the ensemble

class _Completion:
    def __init__(self, text: str):
        self.text = text
        self.model = "fake"
        self.cost = 0.0
        self.cost_known = True

        class U:
            prompt_tokens, completion_tokens, reasoning_tokens = 7, 3, 0

        self.usage = U()


class ScriptedGateway:
    """Answers each role from a list of texts (or exceptions), recording the messages it got."""

    def __init__(self, answers: dict[str, list]):
        self.answers = {k: list(v) for k, v in answers.items()}
        self.seen: dict[str, list] = {}

    async def complete(self, spec, messages, *, context=None):
        self.seen.setdefault(spec.role, []).append(list(messages))
        item = self.answers[spec.role].pop(0)
        if isinstance(item, Exception):
            raise item
        return _Completion(item)


def _specs():
    from sopgraph.simulation.gateway import ModelSpec

    return [ModelSpec(role=f"judge{i}", model=f"openai/j{i}") for i in (1, 2, 3)]


def test_ensemble_retries_malformed_then_unscored(toy):
    from sopgraph.simulation.gateway import InfraFailure

    good = json.dumps({"labels": {"Want": "Money", "Angry": False, "Items": 2}, "scores": SCORES, "reasons": {}})
    gw = ScriptedGateway({
        "judge1": ["not json", '{"labels": {"Want": "Money"', good],  # fixed on the third attempt
        "judge2": ["nope", "still nope", "never"],  # malformed three times -> unscored
        "judge3": [InfraFailure("judge3 openai/j3: rate_limit after 5 attempts", kind="rate_limit")],
    })
    ens = Ensemble([LLMJudge(s, gw, max_attempts=3) for s in _specs()])
    judgments, cons = asyncio.run(ens.judge_turn(_request(toy)))
    j1, j2, j3 = judgments
    assert j1.labels == {"Want": "Money", "Angry": False, "Items": 2} and j1.usage.calls == 3
    assert j2.labels is None and "malformed after 3 attempt(s)" in j2.unscored_reason and j2.raw == "never"
    assert j3.labels is None and j3.unscored_reason.startswith("infra failure")
    assert cons.labels == {"Want": "Money", "Angry": False, "Items": 2} and cons.judges_scored == 1
    # the retry quotes the problem back to the judge
    retry = gw.seen["judge1"][1]
    assert retry[-2] == {"role": "assistant", "content": "not json"}
    assert "could not be used" in retry[-1]["content"]
    # the judge's prompt shows the turn being rated and not the truth
    prompt = gw.seen["judge1"][0][0]["content"]
    assert "agent 2" in prompt and "Paid" in prompt


def test_a_crashing_judge_is_unscored(toy):
    class Boom:
        role, model = "judge1", "x"

        async def judge(self, request):
            raise RuntimeError("kaboom")

    class Fixed:
        def __init__(self, role, labels):
            self.role, self.model, self.labels = role, "y", labels

        async def judge(self, request):
            return Judgment(dialogue_id=request.dialogue_id, turn_index=request.turn_index, judge=self.role,
                            model=self.model, labels=self.labels, scores=SCORES)

    assert isinstance(Boom(), Judge)
    ens = Ensemble([Boom(), Fixed("judge2", {"Want": "Info", "Angry": True, "Items": 0}),
                    Fixed("judge3", {"Want": "Money", "Angry": True, "Items": 0})])
    judgments, cons = asyncio.run(ens.judge_turn(_request(toy)))
    assert judgments[0].labels is None and "kaboom" in judgments[0].unscored_reason
    assert cons.no_consensus == ["Want"] and cons.labels == {"Angry": True, "Items": 0}


def test_judge_dialogue_judges_selected_turns(toy):
    class Echo:
        def __init__(self, role):
            self.role, self.model = role, "m"

        async def judge(self, request):
            assert len(request.turns) == request.turn_index
            return Judgment(dialogue_id=request.dialogue_id, turn_index=request.turn_index, judge=self.role,
                            model="m", labels={"Want": "Info", "Angry": False, "Items": request.turn_index})

    ens = Ensemble([Echo(f"judge{i}") for i in (1, 2, 3)])
    judgments, cons = asyncio.run(ens.judge_dialogue(toy, _case(), "c1#0", _turns(6),
                                                     parse_judge_turns("1,5,10,15,final"), judgment_set="x"))
    assert [c.turn_index for c in cons] == [1, 5, 6]
    assert len(judgments) == 9 and {j.judgment_set for j in judgments} == {"x"}
    assert cons[2].labels["Items"] == 6


# ----------------------------------------------------------------------------- agreement

def test_fleiss_kappa_known_examples():
    # Fleiss (1971) / the standard worked example: 10 subjects, 14 raters, 5 categories -> 0.210
    table = [[0, 0, 0, 0, 14], [0, 2, 6, 4, 2], [0, 0, 3, 5, 6], [0, 3, 9, 2, 0], [2, 2, 8, 1, 1],
             [7, 7, 0, 0, 0], [3, 2, 6, 3, 0], [2, 5, 3, 2, 2], [6, 5, 2, 1, 0], [0, 2, 2, 3, 7]]
    assert fleiss_kappa(table) == pytest.approx(0.20993, abs=1e-5)
    assert fleiss_kappa([[3, 0], [0, 3], [3, 0]]) == pytest.approx(1.0)
    assert fleiss_kappa([[1, 1], [1, 1]]) == pytest.approx(-1.0)
    assert fleiss_kappa([[3, 0], [3, 0]]) is None  # chance agreement 1: undefined
    assert fleiss_kappa([]) is None
    with pytest.raises(ValueError):
        fleiss_kappa([[3, 0], [1, 1]])


def test_agreement_report():
    js = []
    # 3 turns; Want: perfect agreement with both categories used -> kappa 1
    for t, want in ((1, "Money"), (2, "Info"), (3, "Money")):
        for judge, score in (("judge1", 3), ("judge2", 6), ("judge3", 9)):
            js.append(Judgment(dialogue_id="d", turn_index=t, judge=judge,
                               model="openai/agent" if judge == "judge3" else f"m{judge}",
                               labels={"Want": want, "Angry": judge == "judge1", "Items": 1},
                               scores={**SCORES, "linguistic": score}))
    js.append(Judgment(dialogue_id="d", turn_index=4, judge="judge1", model="mjudge1", labels=None))
    ag = agreement(js, FIELDS, agent_model="openai/agent")
    assert ag.turns == 4 and ag.unscored == 1
    assert ag.fields["Want"].kappa == pytest.approx(1.0) and ag.fields["Want"].items == 3
    # Angry: always one True vs two False -> observed agreement 1/3, kappa -0.5
    assert ag.fields["Angry"].observed == pytest.approx(1 / 3, abs=1e-6)
    assert ag.fields["Angry"].kappa == pytest.approx(-0.5, abs=1e-6)
    assert ag.fields["Items"].kappa is None  # all identical: undefined
    lin = ag.dimensions["linguistic"]
    assert lin.items == 3 and lin.mean_range == 6 and lin.max_range == 6
    assert lin.mean_abs_dev == pytest.approx(2.0)  # |3-6|,|6-6|,|9-6| / 3
    assert ag.dimensions["satisfaction"].mean_abs_dev == 0
    assert ag.self_preference == ["judge3"]
