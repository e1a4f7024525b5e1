"""Coverage of the SOP graph by cases and by agents' traversed paths; the coverage command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import floor_run

import sopgraph
from sopgraph.cli import main
from sopgraph.evaluation.coverage import (
    case_walks,
    coverage_of,
    coverage_report,
    feasible_paths,
    render_coverage,
)
from sopgraph.logic.engine import decide
from sopgraph.records import Case, Persona

ROOT = Path(__file__).resolve().parent.parent
TELECOM = ROOT / "scenarios" / "telecom_package.sop"


@pytest.fixture(scope="module")
def telecom() -> sopgraph.Scenario:
    return sopgraph.load(TELECOM)


def _case(scenario, cid: str, truth: dict, system: dict) -> Case:
    d = decide(scenario, {**truth, **system})
    return Case(id=cid, scenario=scenario.name, path_id="P", intent="i", persona=Persona(name="p"), truth=truth,
                system=system, expected_path=d.path, expected_finals=d.finals)


def test_feasible_paths_of_telecom(telecom) -> None:
    paths, exact = feasible_paths(telecom)
    assert exact and len(paths) == 12
    assert paths[(("step1", "step2", "step5"), "ChangeOrder")] == ["P10"]


def test_coverage_counts_the_paths_sop_paths_lists() -> None:
    """gym_membership has paths that share stages and Action (two branches of one stage into the same
    action): `sop paths` lists 10, and coverage must count 10, crediting each case its own path."""
    from sopgraph.logic.paths import count_paths, iter_paths

    gym = sopgraph.load(ROOT / "examples" / "gym_membership.sop")
    infos = list(iter_paths(gym))
    assert count_paths(gym).feasible == len(infos) == 10
    groups: dict[tuple, list] = {}
    for p in infos:
        groups.setdefault((tuple(p.stages), p.action), []).append(p)
    twins = next(g for g in groups.values() if len(g) > 1)
    cases = [Case(id=p.id, scenario=gym.name, path_id=p.id, intent="i", persona=Persona(name="p"), truth={},
                  system={}, expected_path=p.stages, expected_finals={"Action": p.action}) for p in infos]
    side = coverage_of(gym, case_walks(cases), "cases")
    assert (side.paths_covered, side.paths_total) == (10, 10)
    assert side.path_counts == {p.id: 1 for p in infos}
    one = coverage_of(gym, case_walks(cases[:1]), "cases")
    assert one.paths_total == 10 and len(one.uncovered_paths) == 9
    # a walk without the id of the path it meant credits the first of the twins
    agents = coverage_of(gym, [(twins[-1].stages, twins[-1].action)], "agents")
    assert agents.path_counts == {twins[0].id: 1}


def test_coverage_by_cases(telecom) -> None:
    cancel = {"ConsumptionType": "Cancel", "ApplicationTendency": "Agree", "ConsumptionProfile": "Data",
              "EmotionTag": "Discontent"}
    cases = [_case(telecom, "a", cancel, {"PackageStatus": "Contracted", "Penalty": 0}),
             _case(telecom, "b", cancel, {"PackageStatus": "Contracted", "Penalty": 9}),
             _case(telecom, "c", cancel, {"PackageStatus": "NoContract", "Penalty": 9})]
    side = coverage_of(telecom, case_walks(cases), "cases")
    assert side.walks == 3 and side.invalid_walks == 0
    # step1, step2, step5, step7, ChangeOrder, TransHuman of 7 stages + 3 actions
    assert (side.nodes_covered, side.nodes_total) == (6, 10)
    assert side.node_counts["step5"] == 3 and side.node_counts["action:TransHuman"] == 2
    assert side.edge_counts["step2 -> step5"] == 3
    assert side.edge_counts["step5 -> action:ChangeOrder"] == 1
    assert "step2 -> step3" in side.uncovered_edges
    assert (side.paths_covered, side.paths_total) == (2, 12)  # a → P10; b and c → P12
    assert side.path_counts == {"P10": 1, "P12": 2}
    assert any(p.startswith("P01:") for p in side.uncovered_paths)
    assert "step3" in side.uncovered_nodes and "action:GoodBye" in side.uncovered_nodes


def test_agent_walks_invalid_and_normalised(telecom) -> None:
    walks = [
        (["start", "step1", "step2", "step5", "end"], "ChangeOrder"),  # normalised, valid: P10
        (["step1", "step3"], "GoodBye"),  # step1 -> step3 is not an edge
        (["step1", "step2", "nowhere"], "GoodBye"),  # unknown stage
        (["step1", "step2", "step5"], None),  # no action
        (["step2", "step5"], "ChangeOrder"),  # does not start at the entry stage
    ]
    side = coverage_of(telecom, walks, "agents")
    assert side.walks == 5 and side.invalid_walks == 4
    assert side.path_counts == {"P10": 1}
    assert side.node_counts["step3"] == 1  # valid parts of invalid walks still count
    assert sorted(side.invalid_examples) == sorted([
        "step1 > step3 => GoodBye  [no branch from `step1` to `step3`]",
        "step1 > step2 > nowhere => GoodBye  [unknown stage `nowhere`]",
        "step1 > step2 > step5 => (no action)  [no final action]",
        "step2 > step5 => ChangeOrder  [does not start at the entry stage `step1`]",
    ])
    empty = coverage_of(telecom, [([], None), ([], None)], "agents")
    assert empty.invalid_examples == ["(no path) => (no action)  [no path reported] ×2"]
    assert "=> ?" not in " ".join(side.invalid_examples + empty.invalid_examples)


def test_heat_renders_uncovered_plainly(telecom) -> None:
    side = coverage_of(telecom, [(["step1", "step2", "step5"], "ChangeOrder")], "agents")
    heat = side.heat()
    assert heat["step5"] == 1 and heat[("step2", "step5")] == 1 and heat[("step2", "step3")] == 0
    dot = render_coverage(telecom, side, "dot").decode()
    assert "uncovered" in dot
    svg = render_coverage(telecom, side, "svg").decode()
    assert "<svg" in svg


_floor_run = floor_run


def test_coverage_report_from_a_run_and_cli(tmp_path_factory, tmp_path, telecom) -> None:
    run = _floor_run(tmp_path_factory, "baseline/always-escalate")
    report = coverage_report(telecom, run_dir=run)
    assert report.expected is not None and report.traversed is not None
    assert report.expected.walks >= 12  # synth adds cases until every feasible path has one
    # always-escalate reports one path ending in TransHuman: it never reaches ChangeOrder or GoodBye
    assert report.traversed.node_counts["action:ChangeOrder"] == 0
    assert report.traversed.paths_covered == 1
    res = CliRunner().invoke(main, ["coverage", str(TELECOM), "--run", str(run), "--render", "svg",
                                    "-o", str(tmp_path / "cov.svg")])
    assert res.exit_code == 0, res.output
    assert "uncovered paths" in res.output and "agents" in res.output
    assert (tmp_path / "cov.svg").read_text().lstrip().startswith("<?xml")
    res = CliRunner().invoke(main, ["coverage", str(TELECOM), "--run", str(run), "--format", "json"])
    data = json.loads(res.output)
    assert data["traversed"]["paths_total"] == 12
    cases = tmp_path_factory.getbasetemp() / "floor_runs" / "cases.jsonl"
    res = CliRunner().invoke(main, ["coverage", str(TELECOM), "--cases", str(cases), "--format", "json"])
    assert res.exit_code == 0, res.output
    expected = json.loads(res.output)["expected"]
    # synthesis gives every feasible path at least one case, so the cases cover all 12
    assert expected["paths_covered"] == expected["paths_total"] == 12
    assert expected["walks"] == sum(1 for line in cases.read_text().splitlines() if line.strip())


def test_coverage_cli_errors(tmp_path) -> None:
    res = CliRunner().invoke(main, ["coverage", str(TELECOM)])
    assert res.exit_code == 1 and "exactly one of" in res.output
    res = CliRunner().invoke(main, ["coverage", str(TELECOM), "--run", str(tmp_path)])
    assert res.exit_code == 1 and "not a run directory" in res.output
    res = CliRunner().invoke(main, ["coverage", str(TELECOM), "--cases", str(tmp_path / "x.jsonl"),
                                    "--render", "svg"])
    assert res.exit_code == 1 and "-o" in res.output


def test_edges_no_input_takes_are_listed_apart() -> None:
    """A branch on no feasible path (W303) cannot be covered: it is not an 'uncovered edge' to chase."""
    sc = sopgraph.load(text='field Big: bool "b"\nsystem N: int[0..10] "n"\naction A "a"\naction B "b"\n'
                            "stage s1 { when N > 5 -> s2\n otherwise -> do B }\n"
                            "stage s2 { when N > 3 -> do A\n otherwise -> do B }\n", check=False)
    side = coverage_of(sc, [(["s1", "s2"], "A"), (["s1"], "B")], "cases")
    assert side.infeasible_edges == ["s2 -> action:B"]
    assert side.uncovered_edges == [] and side.edges_covered == side.edges_total - 1


def test_a_walk_that_loops_counts_each_stage_once_and_each_edge_per_pass() -> None:
    """A node's count is the number of walks that reach it (a retry loop does not count a stage twice);
    an edge's count is the number of times walks take it."""
    scenario = sopgraph.load(ROOT / "examples" / "no_service.sop")
    d = decide(scenario, {"Mood": "Calm", "AccountSuspended": False, "AreaOutage": False,
                          "ServiceRestored": [False, False, False], "SimDetected": True, "AirplaneMode": False,
                          "Registered": "Home", "SimAgeYears": 5})
    assert d.path.count("fix") == 3 and d.path.count("retest") == 2
    side = coverage_of(scenario, [(d.path, d.finals["Action"]), (d.path, d.finals["Action"])], "agents")
    assert side.invalid_walks == 0
    assert side.node_counts["fix"] == 2 and side.node_counts["retest"] == 2 and side.node_counts["account"] == 2
    assert sum(count for key, count in side.edge_counts.items() if "fix" in key and "retest" in key) >= 4


def test_report_and_cli_give_the_same_coverage_of_a_run(tmp_path: Path) -> None:
    """One definition, one number: a run made offline by a built-in agent (gym_membership has paths that
    share stages and Action), then `sop coverage --run` and `sop report` on it. The report said 8/10 paths
    where the command said 10/10 (it credited twin paths to the first of them)."""
    import re
    from html import unescape

    gym = ROOT / "examples" / "gym_membership.sop"
    runner = CliRunner()
    cases = tmp_path / "cases.jsonl"
    res = runner.invoke(main, ["synth", str(gym), "-n", "20", "--seed", "3", "--min-per-path", "1", "-q",
                               "-o", str(cases)])
    assert res.exit_code == 0, res.output
    run = tmp_path / "run"
    res = runner.invoke(main, ["run", str(gym), "--cases", str(cases), "--model", "agent=baseline/oracle", "--quiet",
                               "-o", str(run)])
    assert res.exit_code == 0, res.output
    res = runner.invoke(main, ["coverage", str(gym), "--run", str(run), "--format", "json"])
    assert res.exit_code == 0, res.output
    cli = json.loads(res.output)
    html_out = tmp_path / "report.html"
    res = runner.invoke(main, ["report", str(run), "-o", str(html_out)])
    assert res.exit_code == 0, res.output
    text = unescape(html_out.read_text(encoding="utf-8"))
    agents = cli["traversed"]
    said = re.search(r"agents reached (\d+)/(\d+) stages and actions, (\d+)/(\d+) branches, (\d+)/(\d+) paths", text)
    assert said, "the report's coverage summary"
    assert [int(x) for x in said.groups()] == [agents["nodes_covered"], agents["nodes_total"], agents["edges_covered"],
                                               agents["edges_total"], agents["paths_covered"], agents["paths_total"]]
    assert (agents["paths_covered"], agents["paths_total"]) == (10, 10)  # the oracle walks every case's own path
    rows = re.findall(r"<td class='l'>(\S+)</td><td class='l'>gym_membership</td><td class='l'>(cases|agents)</td>"
                      r"<td>(\d+)</td><td>(\d+)</td><td>(\d+/\d+)</td><td>(\d+/\d+)</td><td>(\d+/\d+)</td>", text)
    table = {side: (int(w), int(i), n, e, p) for _, side, w, i, n, e, p in rows}
    for side, data in (("cases", cli["expected"]), ("agents", agents)):
        assert table[side] == (data["walks"], data["invalid_walks"], f"{data['nodes_covered']}/{data['nodes_total']}",
                               f"{data['edges_covered']}/{data['edges_total']}",
                               f"{data['paths_covered']}/{data['paths_total']}"), side
