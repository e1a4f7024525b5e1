"""The oracles are ceilings: `baseline/oracle` and `baseline/oracle-tools` score 100 on every metric on
every shipped scenario and example (issue 30 item 5).

Why: an agent at 100 is the proof that a metric measures the SOP and nothing else; a "ceiling" at 90 on a
procedure made every other number unreadable (the oracle jumped to the ending action without asking). The
oracles know the case truth but act through the agent's channels: they ask the customer, look system values
up and read their tool results, stepping the engine session (simulation/providers.py).

The metrics are read from the registry, so one added later is covered at once: each must be at its best
(100 for `higher`, 0 for `lower`) or not apply (no unit to average, never a 0 standing in for "n/a").
Left out, with the reason: `better = neither` (lengths, token counts: not scores) and what the scripted
judge's fixed chat score decides (`chat` and what derives from it: the judge gives 6/9 on purpose,
providers.SCRIPTED_CHAT_SCORE). `path` and `logic` of the SAGE oracle are checked on its final turn: on the
turns where it still asks, its `now_path` stops where it is (a reply whose path reaches the Action takes it,
dialogue.acts), while SAGE's per-turn reference is the path of the whole truth the judge labels.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import sopgraph
from sopgraph.cases.profiles import profile_for
from sopgraph.cases.synth import plan, synthesize
from sopgraph.evaluation.metrics import MetricDef, registered
from sopgraph.evaluation.score import GroupScore, ScoreConfig, score_run
from sopgraph.records import Case
from sopgraph.simulation.runner import run_sync

ROOT = Path(__file__).resolve().parent.parent
SOPS = sorted((ROOT / "scenarios").glob("*.sop")) + sorted(
    p for p in (ROOT / "examples").rglob("*.sop") if "common" not in p.parts)  # common/: included, not run
ORACLES = ("baseline/oracle", "baseline/oracle-tools")
CASES_PER_FILE = 5
CHAT_JUDGED = frozenset({"chat", "overall", "overall_turn"})
"""Decided by the scripted judge's fixed chat score, not by the agent."""
SAGE_FINAL_TURN = frozenset({"path", "logic"})
"""Checked on the SAGE oracle's final turn (see the module docstring)."""


def pick_cases(cases: list[Case], k: int) -> list[Case]:
    """Up to `k` cases covering the shapes of the paths: the shortest (ends early), the longest (loops,
    subflows), one through a loop if any, then one per final Action, then the rest in order."""
    chosen: list[Case] = []

    def add(case: Case | None) -> None:
        if case is not None and case not in chosen and len(chosen) < k:
            chosen.append(case)

    add(min(cases, key=lambda c: len(c.expected_path)))
    add(max(cases, key=lambda c: len(c.expected_path)))
    add(next((c for c in cases if len(set(c.expected_path)) < len(c.expected_path)), None))
    seen = {c.expected_finals.get("Action") for c in chosen}
    for case in cases:
        if case.expected_finals.get("Action") not in seen:
            seen.add(case.expected_finals.get("Action"))
            add(case)
    for case in cases:
        add(case)
    return chosen


@pytest.fixture(scope="module", params=SOPS, ids=lambda p: str(p.relative_to(ROOT).with_suffix("")))
def procedure(request: pytest.FixtureRequest) -> tuple[object, list[Case]]:
    sop: Path = request.param
    scenario = sopgraph.load(sop)
    profile = profile_for(sop, scenario)
    every_path = len(plan(scenario, profile).paths)
    cases = synthesize(scenario, profile, max(every_path, CASES_PER_FILE), seed=3, min_per_path=1).cases
    return scenario, pick_cases(list(cases), CASES_PER_FILE)


def _off_ceiling(metric: MetricDef, group: GroupScore) -> str | None:
    """Why `metric` is not at its best in `group` (None: it is, or it does not apply)."""
    m = group.metrics.get(metric.name)
    if m is None or m.value is None:  # a derived metric counts the units of another (`n_from`)
        return None if m is None or m.n == 0 or not metric.base else f"{metric.name}: no value over {m.n} units"
    if m.n == 0 and metric.base:
        return f"{metric.name}: {m.value} over no unit (n/a must be reported as no value)"
    best = 1.0 if metric.better == "higher" else 0.0
    return None if abs(m.value - best) < 1e-9 else f"{metric.name} = {m.value:.4g} (n={m.n})"


@pytest.mark.parametrize("agent", ORACLES)
def test_oracles_score_100_on_every_metric(procedure: tuple[object, list[Case]], agent: str, tmp_path: Path
                                           ) -> None:
    scenario, cases = procedure
    out = tmp_path / "run"
    run_sync(scenario, cases, [f"agent={agent}"], str(out), trials=1, progress=False)
    run = score_run(out, ScoreConfig(bootstrap=0))
    assert run.counts["done"] == len(cases) and run.counts["format_errors"] == 0, run.counts
    assert run.counts["judged_turns"] > 0
    overall = next(g for g in run.aggregate(["model"]))
    final = next(g for g in run.aggregate(["depth"]) if g.key["depth"] == "final")
    sage = agent == "baseline/oracle"
    off = []
    for metric in registered():
        if metric.better == "neither" or metric.name in CHAT_JUDGED:
            continue
        why = _off_ceiling(metric, final if sage and metric.name in SAGE_FINAL_TURN else overall)
        if why is not None:
            off.append(why)
    # these always apply (a tool agent reports no labels: its classification is the judges' alone, n/a)
    for name in ("classification", "action", "finals", "trace_recall", "tau2_pass")[0 if sage else 1:]:
        assert overall.metrics[name].n > 0, name
    assert not off, f"{agent} is not a ceiling: {off}"
