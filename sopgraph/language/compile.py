"""IR → graph. One builder owns `nx.DiGraph` construction; edges always point from a stage to
the stage or action its branch leads to (start → entry, stage → stage/action, action → end).

Several branches of one stage may lead to the same place (e.g. two credit tiers ending in the same
action); a DiGraph has one edge per pair, so the edge carries the ordered list of those branches.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from sopgraph.language import ir

if TYPE_CHECKING:
    import networkx as nx

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


class Topology:
    """The nodes and edges of `compile_graph` without labels, spans or branch records, as plain dicts:
    `succ[node]` and `pred[node]` hold a node's successors and predecessors (keys, in the order the
    labelled graph holds them). Why not an `nx.DiGraph`: the checker only walks the structure, and on a
    100k-stage program networkx's per-node and per-edge dicts and views cost seconds. The checker's
    graph walks read only `succ`, `pred` and `in` (an `nx.DiGraph` offers them too). `topology` also
    records what its walk over the branches sees, so the checker's passes need not walk them again."""

    __slots__ = ("succ", "pred", "exits", "procedural", "calls")

    def __init__(self) -> None:
        self.succ: dict[str, dict[str, None]] = {}
        self.pred: dict[str, dict[str, None]] = {}
        self.exits: set[str] = set()  # stages with a branch that ends (an action) or leaves (an undefined stage)
        self.procedural = False  # some stage observes or some branch is bounded (`Scenario.procedural`)
        self.calls = False  # some branch carries out actions on the way or gives its action arguments

    def add_node(self, node: str) -> None:
        if node not in self.succ:
            self.succ[node] = {}
            self.pred[node] = {}

    def add_edge(self, u: str, v: str) -> None:
        """An edge (a node not yet added is added last, as networkx does)."""
        if u not in self.succ:
            self.add_node(u)
        if v not in self.succ:
            self.add_node(v)
        self.succ[u][v] = None
        self.pred[v][u] = None

    def __contains__(self, node: object) -> bool:
        return node in self.succ

    def __len__(self) -> int:
        return len(self.succ)

    def __iter__(self) -> Iterator[str]:
        return iter(self.succ)

    def has_edge(self, u: str, v: str) -> bool:
        return v in self.succ.get(u, ())

    @property
    def nodes(self) -> list[str]:
        return list(self.succ)

    def edges(self) -> list[tuple[str, str]]:
        """Every edge, in the labelled graph's order (by source node, then by when it was added)."""
        return [(u, v) for u, vs in self.succ.items() for v in vs]

    def successors(self, node: str) -> Iterator[str]:
        return iter(self.succ[node])

    def predecessors(self, node: str) -> Iterator[str]:
        return iter(self.pred[node])


def topology(scenario: ir.Scenario) -> Topology:
    """The structure of `compile_graph(scenario)`: the same nodes and edges in the same order (see
    `Topology`). One walk over the branches finds the edges and which actions are only carried out on
    the way (`Scenario.step_actions`, which are not nodes)."""
    stages, actions = scenario.stages, scenario.actions
    pairs: list[tuple[str, str]] = []  # (stage, target node) of every branch, in order
    steps: dict[str, None] = {}
    finals: set[str] = set()
    g = Topology()
    exits = g.exits
    for key, stage in stages.items():
        sid = stage.id
        if stage.observe:
            g.procedural = True
        for branch in stage.branches:
            if branch.limit is not None:
                g.procedural = True
            tgt = branch.target
            if tgt.steps or tgt.args:
                steps.update(dict.fromkeys(c.action for c in tgt.steps))
                g.calls = True
            if tgt.kind == "stage":
                pairs.append((sid, tgt.stage))  # type: ignore[arg-type] # a stage target names its stage
                if tgt.stage not in stages:
                    exits.add(key)
            else:
                if tgt.action:
                    finals.add(tgt.action)
                pairs.append((sid, ACTION_PREFIX + (tgt.action or "")))
                exits.add(key)
    step_only = {a for a in steps if a in actions and a not in finals}  # as `Scenario.step_actions`
    g.add_node(START)
    for sid in stages:
        g.add_node(sid)
    for action in actions.values():
        if action.name not in step_only:
            g.add_node(action_node(action.name))
    g.add_node(END)
    if scenario.start is not None and scenario.start in stages:
        g.add_edge(START, scenario.start)
    succ, pred = g.succ, g.pred
    for sid, node in pairs:
        if node in succ:  # an undefined target is reported by the checker, not drawn
            if sid in succ:
                succ[sid][node] = None  # `add_edge`, inline: 300k edges
                pred[node][sid] = None
            else:
                g.add_edge(sid, node)
    for action in actions.values():
        node = action_node(action.name)
        if g.pred.get(node):
            g.add_edge(node, END)
    return g


def _build(scenario: ir.Scenario) -> nx.DiGraph:
    import networkx as nx  # here: `sop check` and the other walks of `topology` never need it (start-up)

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
                record["steps"] = [ir.show_step(c) for c in tgt.steps]
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
    import networkx as nx

    data = nx.node_link_data(g, edges="links")
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def graph_to_graphml(g: nx.DiGraph) -> str:
    """GraphML needs scalar attributes: lists and dicts are stored as JSON strings."""
    import networkx as nx

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
