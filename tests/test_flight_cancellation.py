"""examples/flight_cancellation.sop (dates against `now`, a list of segment records, an insurance record, a
weighted count, actions on the way): checks clean, decides the hand-derived vectors of its prose (both engine
forms), its paths' witnesses and synthesized cases decide along their paths, and the prompt explains the segments."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import sopgraph
from sopgraph.cli import main as cli
from sopgraph.logic import engine as engine_mod
from sopgraph.logic.checker import check_file
from sopgraph.logic.engine import Engine, interpret
from sopgraph.logic.paths import count_paths, iter_paths
from sopgraph.simulation.prompts import agent_system_prompt

ROOT = Path(__file__).resolve().parent.parent
SOP = ROOT / "examples" / "flight_cancellation.sop"
VECTORS = json.loads((ROOT / "examples" / "flight_cancellation.vectors.json").read_text())


@pytest.fixture(scope="module")
def scenario() -> sopgraph.ir.Scenario:
    return sopgraph.load(SOP)


def test_example_checks_clean() -> None:
    found = check_file(SOP).diagnostics
    assert [d for d in found if d.severity != "info"] == []


@pytest.mark.parametrize("vector", VECTORS, ids=[v["name"] for v in VECTORS])
def test_example_decides_the_hand_derived_vectors(scenario, vector: dict) -> None:
    saved = engine_mod._expanded_size
    engine_mod._expanded_size = lambda s: None  # the table-driven form too
    try:
        loop = Engine(scenario)
    finally:
        engine_mod._expanded_size = saved
    for decision in (interpret(scenario, vector["values"]), Engine(scenario).decide(vector["values"]),
                     loop.decide(vector["values"])):
        assert decision.path == vector["path"]
        assert decision.finals == vector["finals"]
        assert decision.actions == vector["actions"]


def test_every_path_is_covered_by_a_vector_and_witnesses_decide_along_their_path(scenario) -> None:
    paths = list(iter_paths(scenario))
    assert count_paths(scenario).feasible == len(paths) == 8
    def key(path: list[str], actions: list[dict]) -> tuple:
        return tuple(path), tuple(a["name"] for a in actions)

    covered = {key(v["path"], v["actions"]) for v in VECTORS}
    for info in paths:
        decision = interpret(scenario, info.witness)
        assert decision.path == info.stages and decision.finals == info.finals
        assert key(decision.path, decision.actions) in covered
        assert isinstance(info.witness["Segments"], list) and 1 <= len(info.witness["Segments"]) <= 6


def test_synth_cases_carry_segment_lists_and_decide_their_path(scenario) -> None:
    result = CliRunner().invoke(cli, ["synth", str(SOP), "-n", "16", "--seed", "1"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == 16 and {r["expected_path"][-1] for r in rows} >= {"request", "window", "refund", "hardship"}
    for row in rows:
        values = {**row.get("labels", {}), **row.get("truth", {}), **row["system"]}
        segments = row["system"]["Segments"]
        assert isinstance(segments, list) and all(set(s) == {"flown", "departs", "cabin"} for s in segments)
        decision = interpret(scenario, values)
        assert decision.path == row["expected_path"] and decision.finals == row["expected_finals"]


def test_prompt_explains_the_segment_list_and_the_insurance_record(scenario) -> None:
    text = agent_system_prompt(scenario, {})
    assert "- Segments — a list of 1 to 6 items, each a record Segment with: flown (true or false); " \
           "departs (a date and time" in text
    assert "cabin (one of: Economy, Premium, Business). The flight segments of the booking" in text
    assert "- Insurance — a record with: active (true or false); covers (one of: MedicalOnly, AnyReason)" in text
    assert ("if BookedAt is after now - 24 hours and every item s of Segments has: s.flown is false → carry out "
            "CancelBooking, then final action RefundFull (amount = Fare) (end)") in text
