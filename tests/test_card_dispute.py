"""examples/authoring/card_dispute.sop, an SOP owner's scenario written from prose and held against a
business's own decision log: it checks clean with its profile and is canonical, decides the policy's rules
(checked by hand against card_dispute_policy.md), agrees with 58 of the 60 logged decisions (the other two
break the policy), gives the same cases for the same seed, never prohibits the card block its fraud paths
carry out, and the oracle acting through tools passes every case with the reference path, trace and tau2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import sopgraph
from sopgraph.cases.profiles import profile_for
from sopgraph.cases.synth import synthesize
from sopgraph.cli import main
from sopgraph.evaluation.corpus import export_run
from sopgraph.evaluation.score import ScoreConfig, score_run
from sopgraph.language.fmt import format_text
from sopgraph.logic.checker import check_file
from sopgraph.logic.engine import interpret
from sopgraph.simulation.runner import run_sync
from sopgraph.simulation.store import RunStore

ROOT = Path(__file__).resolve().parent.parent
DIR = ROOT / "examples" / "authoring"
SOP = DIR / "card_dispute.sop"
DATA = DIR / "card_dispute_decisions.csv"
MAPS = {"Reason": "Reason given", "CardLost": "Card lost or stolen", "ContactedMerchant": "Spoke to merchant",
        "Mood": "Customer mood", "AccountFrozen": "Account frozen", "TxDate": "Transaction date",
        "Amount": "Disputed amount", "DisputesLast12m": "Disputes in last 12 months", "now": "Date opened"}
BASE = {"Reason": "WrongAmount", "CardLost": False, "ContactedMerchant": True, "Mood": "Calm",
        "AccountFrozen": False, "TxDate": "2026-02-01", "now": "2026-03-01T10:00", "Amount": 200,
        "DisputesLast12m": 0}


@pytest.fixture(scope="module")
def scenario() -> sopgraph.Scenario:
    return sopgraph.load(SOP)


def test_example_checks_clean_and_is_canonical(scenario) -> None:
    assert [d for d in check_file(SOP).diagnostics if d.severity != "info"] == []
    text = SOP.read_text(encoding="utf-8")
    assert format_text(text, str(SOP)) == text


@pytest.mark.parametrize(("change", "actions"), [
    ({"AccountFrozen": True, "Reason": "Fraud"}, ["BackOffice"]),                      # rule 1 comes first
    ({"TxDate": "2025-11-01", "now": "2026-03-01T23:00"}, ["OpenChargeback"]),         # day 120: still in time
    ({"TxDate": "2025-11-01", "now": "2026-03-02T00:00"}, ["Decline"]),                # day 121: too late
    ({"Reason": "Fraud", "Amount": 500}, ["BlockCard", "ProvisionalCredit"]),          # rules 3-4
    ({"Reason": "Fraud", "Amount": 500.01}, ["BlockCard", "FraudTeam"]),
    ({"CardLost": True, "Reason": "Duplicate", "Amount": 20}, ["BlockCard", "ProvisionalCredit"]),
    ({"ContactedMerchant": False}, ["AskMerchantFirst"]),                               # rule 5
    ({"ContactedMerchant": False, "Reason": "Duplicate"}, ["OpenChargeback"]),          # ... not for duplicates
    ({"DisputesLast12m": 3, "Amount": 20}, ["BackOffice"]),                             # rule 6 before rule 7
    ({"Amount": 50}, ["ProvisionalCredit"]),                                            # rule 7
    ({"Amount": 1000, "Mood": "Angry"}, ["OpenChargeback"]),                            # rule 8: more than 1000
    ({"Amount": 1000.5, "Mood": "Angry"}, ["Senior"]),
])
def test_decides_the_policy(scenario, change, actions) -> None:
    decision = interpret(scenario, {**BASE, **change})
    assert [a["name"] for a in decision.actions] == actions
    if actions[-1] == "ProvisionalCredit":
        assert decision.actions[-1]["args"] == {"amount": {**BASE, **change}["Amount"]}


def test_agrees_with_the_decision_log_but_two_lines(tmp_path) -> None:
    args = ["validate", str(SOP), "--data", str(DATA), "--expect", "Action=Outcome", "--format", "json"]
    for var, col in MAPS.items():
        args += ["--map", f"{var}={col}"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert (report["correct"], report["total"]) == (58, 60)
    assert sorted(line for g in report["groups"] for line in g["rows"]) == [7, 35]  # the two off-policy lines
    assert not report["errors"] and not report["unmapped"]


def test_same_seed_same_cases_and_the_card_block_is_never_prohibited_where_it_is_due(scenario) -> None:
    profile = profile_for(SOP, scenario)
    a = synthesize(scenario, profile, 40, seed=3)
    assert a.to_jsonl() == synthesize(scenario, profile, 40, seed=3).to_jsonl()
    assert {c.path_id for c in a.cases} == set(a.coverage.per_path)
    for case in a.cases:
        trace = {x["name"] for x in case.expected_actions or []}
        assert not trace & set(case.prohibited_actions)
        assert ("BlockCard" in case.prohibited_actions) == ("BlockCard" not in trace)


def test_the_oracle_through_tools_passes_with_the_reference_path(scenario, tmp_path) -> None:
    cases = list(synthesize(scenario, profile_for(SOP, scenario), 18, seed=1).cases)
    run_sync(scenario, cases, ["agent=baseline/oracle-tools"], str(tmp_path / "r"), trials=1, progress=False,
             judge_turns="final")
    m = score_run(tmp_path / "r", ScoreConfig(bootstrap=0)).aggregate(["model"])[0].metrics
    assert m["pass_rate"].value == 1.0 and m["catastrophic_failures"].value == 0
    assert m["trace_recall"].value == 1.0 and m["tau2_pass"].value == 1.0
    with RunStore.open(tmp_path / "r") as store:  # BackOffice ends two paths: each case reads as its own
        last = {t.dialogue_id: t for t in store.iter_turns(status="done")}
        expected = {c.id: c.expected_path for c in store.cases()}
        assert {d.id: last[d.id].output.now_path for d in store.dialogues(status="done")} == \
            {d.id: expected[d.case_id] for d in store.dialogues(status="done")}
    _records, stats = export_run(tmp_path / "r", fmt="sharegpt")
    assert stats.written == len(cases)
