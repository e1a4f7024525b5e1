"""Coverage of an SOP graph by test cases (expected paths) and by agents (paths actually traversed).

Why: a benchmark only tests the branches its cases exercise (SAGE's "comprehensive path coverage");
and what agents *actually* walk shows which parts of the procedure they never reach or skip.

Items:
- nodes: every decision stage and action leaf of the compiled graph (`start`/`end` are not items);
- edges: every graph edge between two items (edges out of `start` and into `end` are implied);
- paths: the feasible paths of the SOP (`paths.iter_paths`), identified by (stage ids, Action) —
  paths that differ only in which of several branches into the same leaf was taken count once.

A walk is a stage list plus its final Action: for a case its `expected_path` and expected Action,
for an agent its final turn's `now_path` (start/end/action entries stripped) and final Action. A
walk with a step that is not a graph edge, or an unknown stage, is *invalid*: its valid nodes and
edges still count, the walk is counted as invalid and never covers a path.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from sopgraph.evaluation.score import normalize_path, open_run
from sopgraph.language import ir
from sopgraph.language.compile import ACTION_PREFIX, END, START, action_node, compile_graph
from sopgraph.language.render import render
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


def feasible_paths(scenario: ir.Scenario, limit: int = PATH_LIMIT) -> tuple[dict[tuple, str], bool]:
    """(stage ids, Action) → path id for every feasible path (first id wins), and exactness."""
    out: dict[tuple, str] = {}
    exact = True
    for i, p in enumerate(iter_paths(scenario, witnesses=False)):
        if i >= limit:
            exact = False
            break
        out.setdefault((tuple(p.stages), p.action), p.id)
    return out, exact


def coverage_of(scenario: ir.Scenario, walks: Iterable[tuple[Sequence[str], str | None]],
                source: Literal["cases", "agents"], *, graph: Any = None,
                paths: tuple[dict[tuple, str], bool] | None = None, max_listed: int = 200) -> CoverageSide:
    """Count nodes, edges and paths covered by `walks` = (stage ids, final Action | None)."""
    g = graph if graph is not None else compile_graph(scenario)
    path_ids, exact = paths if paths is not None else feasible_paths(scenario)
    nodes = [n for n in g.nodes if n not in (START, END)]
    edges = [(u, v) for u, v in g.edges if u != START and v != END]
    node_counts = dict.fromkeys(nodes, 0)
    edge_counts = {_edge_key(u, v): 0 for u, v in edges}
    path_counts: dict[str, int] = {}
    side = CoverageSide(source=source, paths_exact=exact)
    for stages, action in walks:
        side.walks += 1
        stages = _normalize(stages, scenario)
        seq = list(stages) + ([action_node(action)] if action else [])
        valid = bool(stages) and stages[0] == scenario.start
        seen_nodes: set[str] = set()
        for n in seq:
            if n in node_counts:
                if n not in seen_nodes:
                    node_counts[n] += 1
                    seen_nodes.add(n)
            else:
                valid = False
        for u, v in zip(seq, seq[1:], strict=False):
            key = _edge_key(u, v)
            if key in edge_counts:
                edge_counts[key] += 1
            else:
                valid = False
        if not action:
            valid = False
        if not valid:
            side.invalid_walks += 1
            if len(side.invalid_examples) < 10:
                side.invalid_examples.append(" > ".join(stages) + f" => {action or '?'}")
            continue
        pid = path_ids.get((tuple(stages), action))
        if pid is not None:
            path_counts[pid] = path_counts.get(pid, 0) + 1
    side.nodes_total = len(nodes)
    side.nodes_covered = sum(1 for n in nodes if node_counts[n] > 0)
    side.edges_total = len(edges)
    side.edges_covered = sum(1 for c in edge_counts.values() if c > 0)
    side.paths_total = len(path_ids) if exact else max(len(path_ids), _count_paths(scenario))
    side.paths_covered = len(path_counts)
    side.node_counts = node_counts
    side.edge_counts = edge_counts
    side.path_counts = dict(sorted(path_counts.items()))
    side.uncovered_nodes = [n for n in nodes if node_counts[n] == 0]
    side.uncovered_edges = [k for k, c in edge_counts.items() if c == 0]
    uncovered = [(pid, key) for key, pid in path_ids.items() if pid not in path_counts]
    side.uncovered_paths = [f"{pid}: {' > '.join(key[0])} => {key[1]}" for pid, key in uncovered[:max_listed]]
    return side


def _count_paths(scenario: ir.Scenario) -> int:

    return count_paths(scenario).feasible


def case_walks(cases: Iterable[Any]) -> list[tuple[list[str], str | None]]:
    return [(list(c.expected_path), c.expected_finals.get("Action")) for c in cases]


def agent_walks(run: Any) -> list[tuple[list[str], str | None]]:
    """Final-turn (now_path, Action) of every done dialogue of a run store."""
    walks = []
    last: dict[str, dict] = {}
    for t in run.iter_turn_dicts(status="done"):
        last[t["dialogue_id"]] = t  # turns come ordered by (dialogue, index): the last one wins
    for did in sorted(last):
        out = last[did].get("output") or {}
        finals = out.get("finals")
        action = finals.get("Action") if isinstance(finals, dict) else None
        now_path = out.get("now_path")
        path = now_path if isinstance(now_path, list) else []
        walks.append((path, action if isinstance(action, str) else None))
    return walks


def coverage_report(scenario: ir.Scenario, *, cases: Sequence[Any] | None = None,
                    run_dir: str | Path | None = None) -> CoverageReport:
    """Coverage by cases (expected paths) and, for a run, by the agents' final-turn paths."""
    g = compile_graph(scenario)
    paths = feasible_paths(scenario)
    report = CoverageReport(scenario=scenario.name, sop_hash=scenario.source_hash)
    if run_dir is not None:
        store = open_run(run_dir)
        try:
            run_cases = store.cases()
            report.expected = coverage_of(scenario, case_walks(run_cases), "cases", graph=g, paths=paths)
            report.traversed = coverage_of(scenario, agent_walks(store), "agents", graph=g, paths=paths)
        finally:
            store.close()
    if cases is not None:
        report.expected = coverage_of(scenario, case_walks(cases), "cases", graph=g, paths=paths)
    return report


def render_coverage(scenario: ir.Scenario, side: CoverageSide, fmt: str = "svg") -> bytes:
    """The SOP graph coloured by how often each node and edge was covered (uncovered: plain)."""
    return render(scenario, fmt, heat=side.heat())


__all__ = ["ACTION_PREFIX", "CoverageReport", "CoverageSide", "coverage_of", "coverage_report",
           "render_coverage"]
