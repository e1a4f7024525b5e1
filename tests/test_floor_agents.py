"""Every floor agent answers in the scenario's schema on every shipped and example scenario.

Why: a floor agent that replies `"Fee": null` is scored as a format error, which under-counts its
catastrophic failures and revenue at risk (issue: floor agents must fill every output the way the
engine would for the path they chose)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

import sopgraph
from sopgraph.cases.profiles import profile_for
from sopgraph.cases.synth import plan, synthesize
from sopgraph.simulation.dialogue import scenario_context
from sopgraph.simulation.runner import run_sync
from sopgraph.simulation.store import RunStore

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = sorted((ROOT / "scenarios").glob("*.sop")) + sorted(
    p for p in (ROOT / "examples").rglob("*.sop") if "common" not in p.parts)
FLOORS = ("oracle", "always-escalate", "always-comply", "random-path")


@pytest.mark.parametrize("sop", SCENARIOS, ids=lambda p: p.stem)
def test_floor_agents_make_no_format_error(sop: Path, tmp_path: Path) -> None:
    scenario = sopgraph.load(sop)
    profile = profile_for(sop, scenario)
    every_path = max(8, len(plan(scenario, profile).paths))  # -n is exact: enough for one case per path
    cases = synthesize(scenario, profile, every_path, seed=1, min_per_path=1).cases
    assert cases, sop
    for agent in FLOORS:
        out = tmp_path / agent
        run_sync(scenario, list(cases), [f"agent=baseline/{agent}"], str(out), trials=1, progress=False,
                 judge_turns="final")
        with RunStore.open(out) as store:
            turns = store.turns()
            bad = [(t.dialogue_id, t.index, t.format_note) for t in turns if t.format_error]
            assert store.summary()["turns"] > 0
            by_case = {c.id: c for c in cases}
            ways = Counter((tuple(p["stages"]), p["finals"]["Action"]) for p in scenario_context(scenario)["paths"])
            for t in turns:  # on the reference path, the outputs are the engine's, computed ones included
                case = by_case[t.dialogue_id.split("#")[0]]
                if t.output is not None and t.output.now_path == case.expected_path and \
                        t.output.finals.get("Action") == case.expected_finals.get("Action") and \
                        ways[(tuple(case.expected_path), case.expected_finals.get("Action"))] == 1:
                    assert t.output.finals == case.expected_finals, (agent, t.dialogue_id)
        assert not bad, f"{agent} on {sop.name}: {bad[:3]}"
