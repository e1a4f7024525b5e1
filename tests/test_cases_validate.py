"""`cases.validate.complete_case`: a hand-written case (id, truth, system) is completed with what the
SOP decides, and then checked and run like a synthesized one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import sopgraph
from sopgraph.cases.profiles import default_profile
from sopgraph.cases.synth import synthesize
from sopgraph.cases.validate import HAND_WRITTEN_INTENT, CaseFileError, complete_case
from sopgraph.cli import main
from sopgraph.records import Case
from sopgraph.simulation.runner import RunError, read_cases

ROOT = Path(__file__).resolve().parent.parent
TELECOM = ROOT / "scenarios" / "telecom_package.sop"


@pytest.fixture(scope="module")
def telecom() -> sopgraph.Scenario:
    return sopgraph.load(TELECOM)


def test_a_hand_written_case_gets_what_a_synthesized_one_records(telecom) -> None:
    synthesized = synthesize(telecom, default_profile(telecom), 12, seed=4).cases
    for case in synthesized:
        hand = complete_case(telecom, {"id": case.id, "truth": case.truth, "system": case.system,
                                       "intensity": case.intensity})
        done = Case.model_validate(hand)
        for key in ("scenario", "path_id", "expected_path", "expected_finals", "expected_actions",
                    "prohibited_actions", "bucket"):
            assert getattr(done, key) == getattr(case, key), key
        assert done.intent == HAND_WRITTEN_INTENT and done.persona.name == "calm_professional"
        assert done.user_facts == case.user_facts == {}  # no backend value is the customer's by default


def test_what_is_given_is_kept_and_a_wrong_persona_is_named(telecom) -> None:
    base = {"id": "x", "truth": {"ConsumptionType": "Cancel", "ApplicationTendency": "Agree",
                                 "ConsumptionProfile": "Data", "EmotionTag": "Calm"},
            "system": {"PackageStatus": "Contracted", "Penalty": 0}}
    given = complete_case(telecom, {**base, "expected_path": ["step1"], "intent": "mine", "persona": "impatient_busy"})
    assert given["expected_path"] == ["step1"] and given["intent"] == "mine"
    assert given["persona"]["name"] == "impatient_busy"
    with pytest.raises(CaseFileError, match="persona `nobody` is not in the library"):
        complete_case(telecom, {**base, "persona": "nobody"})
    undecidable = complete_case(telecom, {**base, "system": {"PackageStatus": "Contracted"}})
    assert "expected_path" not in undecidable  # the check then names the missing value
    assert complete_case(telecom, ["not", "a", "case"]) == ["not", "a", "case"]


def test_sop_run_takes_hand_written_cases(telecom, tmp_path: Path) -> None:
    cases = tmp_path / "hand.jsonl"
    rows = [{"id": "h1", "truth": {"ConsumptionType": "Cancel", "ApplicationTendency": "Agree",
                                   "ConsumptionProfile": "Data", "EmotionTag": "Discontent"},
             "system": {"PackageStatus": "Contracted", "Penalty": 200},
             "intent_description": "Wants to cancel and is angry about the fee."}]
    cases.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    with pytest.raises(RunError, match="invalid case at scenario"):
        read_cases(cases)  # without the scenario nothing is filled in
    (case,) = read_cases(cases, telecom)
    assert case.expected_finals == {"Action": "TransHuman"} and case.bucket == "must-escalate"
    out = tmp_path / "run"
    result = CliRunner().invoke(main, ["run", str(TELECOM), "--cases", str(cases), "--model", "agent=baseline/oracle",
                                       "-o", str(out)])
    assert result.exit_code == 0, result.output
    score = CliRunner().invoke(main, ["score", str(out), "--format", "json", "--bootstrap", "0"])
    groups = json.loads(score.output)["groups"]
    assert groups[0]["metrics"]["action"]["value"] == 1.0
