"""Coverage of an SOP graph by test cases (expected paths) and by agents (paths actually traversed).

Why: a benchmark only tests the branches its cases exercise (SAGE's "comprehensive path coverage");
and what agents *actually* walk shows which parts of the procedure they never reach or skip.

Items:
- nodes: every decision stage and action leaf of the compiled graph (`start`/`end` are not items);
- edges: every graph edge between two items (edges out of `start` and into `end` are implied);
- paths: the feasible paths of the SOP, with the ids `sop paths` gives them (`paths.iter_paths`):
  one definition of a path everywhere, so `Paths 9/10` here means the ten paths `sop paths` lists.

A walk is a stage list plus its final Action, and optionally the id of the path it was meant to
take: for a case its `expected_path`, expected Action and `path_id`; for an agent its final turn's
`now_path` (start/end/action entries stripped), final Action and its case's `path_id`. Two paths can
share stages and Action (two branches of one stage into the same action); a walk that matches
several covers the intended one when it is among them, else the first. A walk with a step that is
not a graph edge, an unknown stage, no Action, or not starting at the entry is *invalid*: its valid
nodes and edges still count, the walk is counted as invalid (with the reason) and covers no path.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from sopgraph.evaluation.score import normalize_path, open_run
from sopgraph.language import ir
from sopgraph.language.compile import ACTION_PREFIX, END, START, action_node, compile_graph
from sopgraph.language.render import render
from sopgraph.logic.budget import CpuBudget, OutOfCpu, active
from sopgraph.logic.paths import count_paths, iter_paths

PATH_LIMIT = 200_000  # enumerate at most this many feasible paths (beyond: count only)


class CoverageSide(BaseModel):
    """Coverage by one source of walks."""
    source: Literal["cases", "agents"]
    walks: int = 0
    invalid_walks: int = 0
    nodes_total: int = 0
    nodes_covered: int = 0
    edges_total: int = 0
    edges_covered: int = 0
    paths_total: int = 0
    paths_covered: int = 0
    paths_exact: bool = True  # False when the path list was truncated at PATH_LIMIT
    node_counts: dict[str, int] = Field(default_factory=dict)
    edge_counts: dict[str, int] = Field(default_factory=dict)  # "u -> v" → count
    path_counts: dict[str, int] = Field(default_factory=dict)  # path id → count
    uncovered_nodes: list[str] = Field(default_factory=list)
    uncovered_edges: list[str] = Field(default_factory=list)
    infeasible_edges: list[str] = Field(default_factory=list)  # on no feasible path: nothing can cover them
    uncovered_paths: list[str] = Field(default_factory=list)  # "P07: step1 > step2 > step4 => ChangeOrder"
    invalid_examples: list[str] = Field(default_factory=list)

    @property
    def node_share(self) -> float | None:
        return self.nodes_covered / self.nodes_total if self.nodes_total else None

    @property
    def edge_share(self) -> float | None:
        return self.edges_covered / self.edges_total if self.edges_total else None

    @property
    def path_share(self) -> float | None:
        return self.paths_covered / self.paths_total if self.paths_total else None

    def heat(self) -> dict[Any, int]:
        """Counts keyed as `render.to_dot(heat=...)` expects: node ids and (u, v) edges."""
        heat: dict[Any, int] = dict(self.node_counts)
        for key, n in self.edge_counts.items():
            u, v = key.split(" -> ", 1)
            heat[(u, v)] = n
        return heat


class CoverageReport(BaseModel):
    scenario: str
    sop_hash: str
    expected: CoverageSide | None = None
    traversed: CoverageSide | None = None


def _edge_key(u: str, v: str) -> str:
    return f"{u} -> {v}"


def _normalize(path: Iterable[Any], scenario: ir.Scenario) -> list[str]:

    return list(normalize_path(path, scenario))


Walk = tuple[Sequence[str], str | None] | tuple[Sequence[str], str | None, str | None]


def feasible_paths(scenario: ir.Scenario, limit: int = PATH_LIMIT) -> tuple[dict[tuple, list[str]], bool]:
    """(stage ids, Action) → ids of the feasible paths with those stages and Action (in `sop paths`
    order), and exactness (False when more than `limit` paths exist, or a CPU budget made active by the
    caller ran out: `budget.active`)."""
    out: dict[tuple, list[str]] = {}
    exact = True
    try:
        for i, p in enumerate(iter_paths(scenario, witnesses=False)):
            if i >= limit:
                exact = False
                break
            out.setdefault((tuple(p.stages), p.action), []).append(p.id)
    except OutOfCpu:
        exact = False
    return out, exact


def _invalid_reason(scenario: ir.Scenario, stages: Sequence[str], action: str | None,
                    node_counts: dict[str, int], edge_counts: dict[str, int]) -> str | None:
    """Why a walk is not a walk of the graph (None when it is one)."""
    if not stages:
        return "no path reported"
    unknown = [n for n in stages if n not in node_counts]
    if unknown:
        return f"unknown stage `{unknown[0]}`"
    if stages[0] != scenario.start:
        return f"does not start at the entry stage `{scenario.start}`"
    if not action:
        return "no final action"
    if action_node(action) not in node_counts:
        return f"unknown action `{action}`"
    seq = [*stages, action_node(action)]
    for u, v in zip(seq, seq[1:], strict=False):
        if _edge_key(u, v) not in edge_counts:
            return f"no branch from `{u}` to `{v.removeprefix(ACTION_PREFIX)}`"
    return None


def _walk_text(stages: Sequence[str], action: str | None, reason: str) -> str:
    return f"{' > '.join(stages) or '(no path)'} => {action or '(no action)'}  [{reason}]"


def coverage_of(scenario: ir.Scenario, walks: Iterable[Walk],
                source: Literal["cases", "agents"], *, graph: Any = None,
                paths: tuple[dict[tuple, list[str]], bool] | None = None, max_listed: int = 200) -> CoverageSide:
    """Count nodes, edges and paths covered by `walks` = (stage ids, final Action | None[, path id])."""
    g = graph if graph is not None else compile_graph(scenario)
    path_ids, exact = paths if paths is not None else feasible_paths(scenario)
    nodes = [n for n in g.nodes if n not in (START, END)]
    edges = [(u, v) for u, v in g.edges if u != START and v != END]
    node_counts = dict.fromkeys(nodes, 0)
    edge_counts = {_edge_key(u, v): 0 for u, v in edges}
    path_counts: dict[str, int] = {}
    invalid: dict[str, int] = {}
    side = CoverageSide(source=source, paths_exact=exact)
    for walk in walks:
        side.walks += 1
        stages = _normalize(walk[0], scenario)
        action = walk[1]
        meant = walk[2] if len(walk) > 2 else None
        seq = list(stages) + ([action_node(action)] if action else [])
        seen_nodes: set[str] = set()
        for n in seq:
            if n in node_counts and n not in seen_nodes:
                node_counts[n] += 1
                seen_nodes.add(n)
        for u, v in zip(seq, seq[1:], strict=False):
            key = _edge_key(u, v)
            if key in edge_counts:
                edge_counts[key] += 1
        reason = _invalid_reason(scenario, stages, action, node_counts, edge_counts)
        if reason is not None:
            side.invalid_walks += 1
            text = _walk_text(stages, action, reason)
            invalid[text] = invalid.get(text, 0) + 1
            continue
        ids = path_ids.get((tuple(stages), action))
        if ids:
            pid = meant if meant in ids else ids[0]
            path_counts[pid] = path_counts.get(pid, 0) + 1
    side.invalid_examples = [f"{text} ×{n}" if n > 1 else text
                             for text, n in sorted(invalid.items(), key=lambda kv: -kv[1])[:10]]
    all_ids = [pid for ids in path_ids.values() for pid in ids]
    side.nodes_total = len(nodes)
    side.nodes_covered = sum(1 for n in nodes if node_counts[n] > 0)
    side.edges_total = len(edges)
    side.edges_covered = sum(1 for c in edge_counts.values() if c > 0)
    side.paths_total = len(all_ids) if exact else max(len(all_ids), _count_paths(scenario))
    side.paths_covered = len(path_counts)
    side.node_counts = node_counts
    side.edge_counts = edge_counts
    side.path_counts = dict(sorted(path_counts.items()))
    side.uncovered_nodes = [n for n in nodes if node_counts[n] == 0]
    feasible = _path_edges(path_ids) if exact else None
    side.uncovered_edges = [k for k, c in edge_counts.items() if c == 0 and (feasible is None or k in feasible)]
    side.infeasible_edges = [k for k, c in edge_counts.items() if c == 0 and feasible is not None and k not in feasible]
    uncovered = sorted((pid, key) for key, ids in path_ids.items() for pid in ids if pid not in path_counts)
    side.uncovered_paths = [f"{pid}: {' > '.join(key[0])} => {key[1]}" for pid, key in uncovered[:max_listed]]
    return side


def _path_edges(path_ids: dict[tuple, list[str]]) -> set[str]:
    """The edges some feasible path takes (an edge on none is a branch no input reaches: W303/W304)."""
    out: set[str] = set()
    for stages, action in path_ids:
        seq = [*stages, action_node(action)] if action else list(stages)
        out.update(_edge_key(u, v) for u, v in zip(seq, seq[1:], strict=False))
    return out


def _count_paths(scenario: ir.Scenario) -> int:

    return count_paths(scenario).feasible


def case_walks(cases: Iterable[Any]) -> list[Walk]:
    return [(list(c.expected_path), c.expected_finals.get("Action"), c.path_id) for c in cases]


def agent_walks(run: Any, case_ids: Iterable[str] | None = None) -> list[Walk]:
    """Final-turn (now_path, Action, the case's path id) of every done dialogue of a run store (of the
    cases `case_ids` only, when given). The path id is what credits a walk its own path when two paths
    share stages and Action: without it the report counted 8/10 paths where `sop coverage` counted 10/10."""
    walks: list[Walk] = []
    meant = {c.id: c.path_id for c in run.cases()}
    case_of = {d.id: d.case_id for d in run.dialogues(status="done")}
    wanted = set(case_ids) if case_ids is not None else None
    last: dict[str, dict] = {}
    for t in run.iter_turn_dicts(status="done"):
        last[t["dialogue_id"]] = t  # turns come ordered by (dialogue, index): the last one wins
    for did in sorted(last):
        if wanted is not None and case_of.get(did) not in wanted:
            continue
        out = last[did].get("output") or {}
        finals = out.get("finals")
        action = finals.get("Action") if isinstance(finals, dict) else None
        now_path = out.get("now_path")
        path = now_path if isinstance(now_path, list) else []
        walks.append((path, action if isinstance(action, str) else None, meant.get(case_of.get(did, ""))))
    return walks


def run_coverage(scenario: ir.Scenario, store: Any, *, graph: Any = None,
                 paths: tuple[dict[tuple, list[str]], bool] | None = None) -> tuple[CoverageSide, CoverageSide]:
    """(by the cases, by the agents) of one run store for one scenario: the one definition of a run's
    coverage, behind both `sop coverage --run` and the report's Coverage section (they disagreed, 15/21
    against 7/21 paths, while each built its own walks). The run's cases of this scenario count (all of
    them when none names it: a renamed or edited SOP), and the agents' final turns on those cases."""
    g = graph if graph is not None else compile_graph(scenario)
    known = paths if paths is not None else feasible_paths(scenario)
    run_cases = store.cases()
    cases = [c for c in run_cases if c.scenario == scenario.name] or run_cases
    expected = coverage_of(scenario, case_walks(cases), "cases", graph=g, paths=known)
    walks = agent_walks(store, case_ids=[c.id for c in cases] if len(cases) < len(run_cases) else None)
    return expected, coverage_of(scenario, walks, "agents", graph=g, paths=known)


def coverage_report(scenario: ir.Scenario, *, cases: Sequence[Any] | None = None,
                    run_dir: str | Path | None = None, cpu_budget: CpuBudget | None = None) -> CoverageReport:
    """Coverage by cases (expected paths) and, for a run, by the agents' final-turn paths. The feasible
    paths are listed and counted within `cpu_budget` (past it, path totals are lower bounds)."""
    g = compile_graph(scenario)
    with active(cpu_budget) if cpu_budget is not None else nullcontext():
        return _report(scenario, g, cases, run_dir)


def _report(scenario: ir.Scenario, g: Any, cases: Sequence[Any] | None, run_dir: str | Path | None) -> CoverageReport:
    paths = feasible_paths(scenario)
    report = CoverageReport(scenario=scenario.name, sop_hash=scenario.source_hash)
    if run_dir is not None:
        store = open_run(run_dir)
        try:
            report.expected, report.traversed = run_coverage(scenario, store, graph=g, paths=paths)
        finally:
            store.close()
    if cases is not None:
        report.expected = coverage_of(scenario, case_walks(cases), "cases", graph=g, paths=paths)
    return report


def render_coverage(scenario: ir.Scenario, side: CoverageSide, fmt: str = "svg") -> bytes:
    """The SOP graph coloured by how often each node and edge was covered (uncovered: plain)."""
    return render(scenario, fmt, heat=side.heat())


__all__ = ["ACTION_PREFIX", "CoverageReport", "CoverageSide", "coverage_of", "coverage_report",
           "render_coverage", "run_coverage"]
