"""`sop leaderboard` (score.leaderboard and its CLI renderers) with procedure-step scores: the step metrics of
`sop score` (same names, same scales) in the table, JSON and CSV, only when some run's agent acted through
tools; a board of SAGE-mode runs only grows no step columns."""

from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import sopgraph
from sopgraph.cli import main
from sopgraph.cli.scorecmd import _STEP_COLUMNS
from sopgraph.evaluation.score import LEADERBOARD_STEP_METRICS, ScoreConfig, leaderboard, score_run
from sopgraph.simulation.runner import run_sync

ROOT = Path(__file__).resolve().parent.parent
NO_SERVICE = ROOT / "examples" / "no_service.sop"
ENV = "python:examples.no_service_env:make"
sys.path.insert(0, str(ROOT))  # the example environment is imported as a module (examples/)
STEPS = ("step_recall", "step_precision", "step_order", "steps_followed", "first_divergence", "end_state")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """Runs on the no-service procedure: the tool oracle against the shipped environment (step scores, end
    state) and the SAGE-mode oracle (no step scores), over the same synthesized cases."""
    from sopgraph.cases.profiles import profile_for
    from sopgraph.cases.synth import synthesize

    scenario = sopgraph.load(NO_SERVICE)
    cases = list(synthesize(scenario, profile_for(NO_SERVICE, scenario), 6, seed=5).cases)
    base = tmp_path_factory.mktemp("board")
    out = {}
    for name, agent, env in (("tools", "baseline/oracle-tools", ENV), ("sage", "baseline/oracle", None)):
        summary = run_sync(scenario, cases, [f"agent={agent}"], str(base / name), progress=False, env=env)
        assert summary.infra_failures == 0
        out[name] = base / name
    return out


def _board(args: list[str]) -> Any:
    res = CliRunner().invoke(main, ["leaderboard", *args, "--bootstrap", "0"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    return res.output


def test_the_board_names_the_step_metrics_as_sop_score_does(runs) -> None:
    assert LEADERBOARD_STEP_METRICS == STEPS
    cfg = ScoreConfig(bootstrap=0)
    group = next(g for g in score_run(runs["tools"], cfg).summary().groups if g.by == ["model", "scenario"])
    board = leaderboard([runs["tools"], runs["sage"]], cfg)
    rows = {r.model: r for r in board.rows}
    tools, sage = rows["baseline/oracle-tools"].metrics, rows["baseline/oracle"].metrics
    for k in STEPS:  # the same value and n as `sop score`'s model × scenario group (one run: its CI)
        assert tools[k] == group.metrics[k], k
    assert tools["steps_followed"].value == tools["end_state"].value == tools["step_recall"].value == 1.0
    assert tools["end_state"].n == group.dialogues > 0
    assert tools["first_divergence"].value is None  # nobody left the procedure
    assert all(k not in sage or sage[k].value is None for k in STEPS)  # a SAGE agent has no steps


def test_repeated_runs_give_the_median_of_the_step_metrics(runs) -> None:
    rows = json.loads(_board([str(runs["tools"]), str(runs["tools"]), "--format", "json"]))["rows"]
    assert rows[0]["spread"] == "range"
    m = rows[0]["metrics"]
    assert m["step_recall"]["value"] == m["end_state"]["value"] == 1.0 and m["step_recall"]["n"] == 2


def test_every_format_shows_the_steps_and_a_sage_only_board_none(runs) -> None:
    both = [str(runs["tools"]), str(runs["sage"])]
    text = _board(both)
    table = text[text.index("procedure steps against the online reference"):]
    headers = {cell.strip() for line in table.splitlines() if line.startswith("┃")
               for cell in line.strip("┃").split("┃")}
    assert set(_STEP_COLUMNS) <= headers
    tools_line = next(line for line in table.splitlines() if "baseline/oracle-tools" in line)
    assert tools_line.count("100.0") == 5  # recall, precision, order, followed, end state (1st div.: –)
    rows = json.loads(_board([*both, "--format", "json"]))["rows"]
    tools = next(r for r in rows if r["model"] == "baseline/oracle-tools")
    assert {k: tools["metrics"][k]["value"] for k in STEPS} == {**dict.fromkeys(STEPS, 1.0), "first_divergence": None}
    lines = list(csv.DictReader(io.StringIO(_board([*both, "--format", "csv"]))))
    header = set(lines[0])
    assert {*STEPS, *(f"{k}_lo" for k in STEPS), *(f"{k}_hi" for k in STEPS)} <= header
    assert next(r for r in lines if r["model"] == "baseline/oracle-tools")["end_state"] == "1.0"
    # SAGE-mode runs only: no step table, no step keys, no step columns
    sage = str(runs["sage"])
    assert "procedure steps" not in _board([sage])
    assert not set(STEPS) & set(json.loads(_board([sage, "--format", "json"]))["rows"][0]["metrics"])
    assert not set(STEPS) & set(_board([sage, "--format", "csv"]).splitlines()[0].split(","))
