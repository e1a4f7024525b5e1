"""IR → graph. One builder owns `nx.DiGraph` construction; edges always point from a stage to
the stage or action its branch leads to (start → entry, stage → stage/action, action → end).

Several branches of one stage may lead to the same place (e.g. two credit tiers ending in the same
action); a DiGraph has one edge per pair, so the edge carries the ordered list of those branches.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import networkx as nx

from sopgraph.language import ir

START = "start"
END = "end"
ACTION_PREFIX = "action:"


def action_node(name: str) -> str:
    return ACTION_PREFIX + name


def reads(expr: Any) -> list[str]:
    """Variables an expression mentions, in first-seen order (a left-to-right depth-first walk).
    Iterative, with no nested function: a recursive closure is a reference cycle per call, which
    on a 100k-stage program left the cyclic collector 600k objects to find."""
    if type(expr) is ir.Var:
        return [expr.name]
    seen: dict[str, None] = {}
    stack = [expr]
    children = ir.children
    while stack:
        e = stack.pop()
        if isinstance(e, ir.Var):
            seen.setdefault(e.name, None)
            continue
        kids = children(e)
        if kids:
            stack.extend(reversed(kids))
    return list(seen)


def stage_reads(stage: ir.Stage) -> list[str]:
    names: dict[str, None] = {}
    for branch in stage.branches:
        if branch.guard is not None:
            for n in reads(branch.guard):
                names.setdefault(n, None)
    return list(names)


def compile_graph(scenario: ir.Scenario) -> nx.DiGraph:
    """Build the SOP graph. Assumes the scenario passed `check` (targets exist)."""
    return _build(scenario)


def topology(scenario: ir.Scenario) -> nx.DiGraph:
    """The nodes and edges of `compile_graph`, in the same order, without labels, spans or branch
    records. Why: the checker only walks the structure, and on a 100k-stage program the labelled
    graph costs seconds and hundreds of megabytes that `sop check` never reads."""
    g = nx.DiGraph()
    g.add_node(START)
    g.add_nodes_from(scenario.stages)
    step_only = set(scenario.step_actions)
    g.add_nodes_from(action_node(a.name) for a in scenario.actions.values() if a.name not in step_only)
    g.add_node(END)
    if scenario.start is not None and scenario.start in scenario.stages:
        g.add_edge(START, scenario.start)
    g.add_edges_from(_stage_edges(scenario, g))  # the nodes are all in: the same edges as one by one
    for action in scenario.actions.values():
        node = action_node(action.name)
        if g.in_degree(node):
            g.add_edge(node, END)
    return g


def _stage_edges(scenario: ir.Scenario, g: nx.DiGraph) -> Iterator[tuple[str, str]]:
    """Each branch's edge (stage, target node), in order, when the target is a node of `g`."""
    for stage in scenario.stages.values():
        sid = stage.id
        for branch in stage.branches:
            tgt = branch.target
            node = tgt.stage if tgt.kind == "stage" else action_node(tgt.action or "")
            if node in g:
                yield sid, node  # type: ignore[misc]


def _build(scenario: ir.Scenario) -> nx.DiGraph:
    g = nx.DiGraph(
        name=scenario.name,
        title=scenario.title,
        source_hash=scenario.source_hash,
        start=scenario.start,
        ir_version=ir.IR_VERSION,
    )
    g.add_node(START, kind="start", label="start")
    for stage in scenario.stages.values():
        g.add_node(
            stage.id,
            kind="decision",
            label=stage.title or stage.id,
            title=stage.title,
            text=stage.text,
            branching=len(stage.branches) > 1,
            classify=list(stage.classify),
            reads=stage_reads(stage),
            span=str(stage.span),
            origin=stage.origin,
        )
    step_only = set(scenario.step_actions)  # drawn on the edges that carry them out, not as leaves
    for action in scenario.actions.values():
        if action.name in step_only:
            continue
        g.add_node(
            action_node(action.name),
            kind="action",
            label=action.name,
            action=action.name,
            description=action.description,
            attributes=list(action.attributes),
            span=str(action.span),
        )
    for stage in scenario.stages.values():
        if stage.observe:
            g.nodes[stage.id]["observe"] = list(stage.observe)
    g.add_node(END, kind="end", label="end")
    if scenario.start is not None and scenario.start in scenario.stages:
        g.add_edge(START, scenario.start, branches=[], label="")
    for stage in scenario.stages.values():
        for index, branch in enumerate(stage.branches):
            tgt = branch.target
            node = tgt.stage if tgt.kind == "stage" else action_node(tgt.action or "")
            if node not in g:
                continue  # undefined target: reported by the checker, not drawn
            record = {
                "index": index,
                "guard": ir.branch_label(stage, branch),
                "outputs": {a.name: ir.show(a.value) for a in tgt.outputs},
                "span": str(branch.span),
            }
            if tgt.steps:
                record["steps"] = [ir.show_call(c.action, c.args) for c in tgt.steps]
            if branch.limit is not None:
                record["limit"] = branch.limit
            if g.has_edge(stage.id, node):
                g.edges[stage.id, node]["branches"].append(record)
            else:
                g.add_edge(stage.id, node, branches=[record])
    for _u, _v, data in g.edges(data=True):
        labels = [_edge_label(b) for b in data["branches"]]
        data["label"] = " | ".join(label for label in labels if label)
    for action in scenario.actions.values():
        node = action_node(action.name)
        if g.in_degree(node):
            g.add_edge(node, END, branches=[], label="")
    return g


def _edge_label(record: dict[str, Any]) -> str:
    """A branch's guard, then the actions it carries out on the way and its bound."""
    parts = [record["guard"]] if record["guard"] else []
    if record.get("steps"):
        parts.append("/ " + " -> ".join(record["steps"]))
    if record.get("limit") is not None:
        parts.append(f"(up to {record['limit']}x)")
    return " ".join(parts)


def graph_to_json(g: nx.DiGraph) -> str:
    """Deterministic node-link JSON (insertion order is declaration order; keys sorted)."""
    data = nx.node_link_data(g, edges="links")
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def graph_to_graphml(g: nx.DiGraph) -> str:
    """GraphML needs scalar attributes: lists and dicts are stored as JSON strings."""
    flat = nx.DiGraph()
    flat.graph.update({k: _scalar(v) for k, v in g.graph.items()})
    for n, d in g.nodes(data=True):
        flat.add_node(n, **{k: _scalar(v) for k, v in d.items()})
    for u, v, d in g.edges(data=True):
        flat.add_edge(u, v, **{k: _scalar(x) for k, x in d.items()})
    return "\n".join(nx.generate_graphml(flat, prettyprint=True)) + "\n"


def _scalar(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, (list, dict)):
        return json.dumps(value, sort_keys=True, ensure_ascii=False)
    return value
