"""Graph → pictures: Graphviz DOT (and SVG/PNG through the `dot` binary) and Mermaid.

The picture is derived from the compiled graph, so it shows exactly what the engine runs. Branches of a
stage into the same target are drawn as one edge per distinct output assignment (`edge_groups`): a
reader can tell which condition sets `Fee`; conditions sharing an edge read "A or B". Shapes say what a
node is (decision stage, plain stage, action leaf, start/end); colours of action leaves say how dangerous
they are (red: moves money or irreversible, amber: escalation, green: otherwise). A legend is drawn
above the DOT picture, and pictures wider than ~1400 px are scaled down to fit (`MAX_SIZE_IN`).

An optional `heat` map (node id or `(u, v)` edge → count) recolours the picture by frequency, e.g. for
`sop coverage`: covered items get a blue by count (blues, so heat never reads as "risky"), uncovered
items are drawn dashed grey and say "uncovered". Output is deterministic: nodes and edges come in
declaration order, no timestamps.
"""

from __future__ import annotations

import html
import math
import re
import shutil
import subprocess
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from sopgraph.errors import Error
from sopgraph.language import ir
from sopgraph.language.compile import ACTION_PREFIX, END, START, compile_graph

if TYPE_CHECKING:
    import networkx as nx  # the graphs come from `compile_graph`; importing the module needs no networkx

Format = Literal["dot", "svg", "png", "mmd"]
FORMATS: tuple[str, ...] = ("svg", "png", "dot", "mmd")
SUFFIXES: dict[str, str] = {".svg": "svg", ".png": "png", ".dot": "dot", ".gv": "dot", ".mmd": "mmd",
                            ".mermaid": "mmd"}
DOT_TIMEOUT_S = 60.0
INSTALL_HINT = "install graphviz: apt-get install -y graphviz"

# Heat is a count → colour scale of five classes (ColorBrewer Blues), kept clear of the red / amber / green
# that mean "risky / escalation / other action" in the plain picture (in a heat picture a leaf keeps its
# risk colour as its border).
NODE_HEAT = ("#eff3ff", "#bdd7e7", "#6baed6", "#3182bd", "#08519c")
EDGE_HEAT = ("#9ecae1", "#6baed6", "#4292c6", "#2171b5", "#084594")
UNCOVERED_COLOR = "#9e9e9e"
UNCOVERED_FONT = "#757575"

# Action leaves by risk. `risky` = moves_money or irreversible (see ir.Action.risky).
ACTION_STYLE = {
    "risky": {"fillcolor": "#f8d7da", "color": "#c62828"},
    "escalation": {"fillcolor": "#ffe8b3", "color": "#e08e00"},
    "safe": {"fillcolor": "#d7f0d8", "color": "#2e7d32"},
}
DECISION_FILL = "#dbe9f8"
DECISION_BORDER = "#1f5fa8"
# Helvetica metrics are what Graphviz measures text with; the CJK fonts draw Chinese labels.
FONT = "Helvetica,Arial,Liberation Sans,WenQuanYi Micro Hei,Noto Sans CJK SC,sans-serif"
LABEL_ATTRIBUTES = ("escalation", "moves_money", "irreversible")  # shown on the leaf; all are in the tooltip
# Largest drawing (inches, 72 pt each): wider pictures are scaled down to fit a 1400 px page or screen.
MAX_SIZE_IN = "14,60"
LABEL_WIDTH = 28  # wrap edge labels at about this many characters, on word boundaries


class RenderError(Error):
    """A picture could not be produced (no `dot` binary, `dot` failed or timed out)."""


HeatMap = Mapping[Any, int | float]


# ---------------------------------------------------------------------------------------------
# What to draw (shared by DOT and Mermaid)


def action_class(action: ir.Action | None) -> str:
    """`risky`, `escalation` or `safe`: the colour class of an action leaf."""
    if action is None:
        return "safe"
    if action.risky:
        return "risky"
    if "escalation" in action.attributes:
        return "escalation"
    return "safe"


def _wrap(text: str, width: int = LABEL_WIDTH) -> str:
    """Wrap at about `width` characters, preferring to break before `or`, then before `and` (the order in
    which they bind), so that each line of a condition is one readable clause."""
    lines: list[str] = []
    for para in text.split("\n"):
        if len(para) <= width:
            lines.append(para)
            continue
        pieces = [p for part in re.split(r" (?=or )", para)
                  for p in ([part] if len(part) <= width else re.split(r" (?=and )", part))]
        current = ""
        for piece in pieces:
            if current and len(current) + 1 + len(piece) > width:
                lines += textwrap.wrap(current, width, break_long_words=False, break_on_hyphens=False) or [""]
                current = piece
            else:
                current = f"{current} {piece}" if current else piece
        lines += textwrap.wrap(current, width, break_long_words=False, break_on_hyphens=False) or [""]
    return "\n".join(lines)


def edge_groups(data: Mapping[str, Any]) -> list[list[Mapping[str, Any]]]:
    """The branches of one (stage, target) pair grouped into the edges a picture draws.

    Branches that assign different outputs are different edges (so the picture says which condition sets
    `Fee`); branches that assign the same outputs share one edge whose conditions read "A or B". Groups
    come in the order of their first branch; an edge without branches (start → first stage) is one group.
    """
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for branch in sorted(data.get("branches") or [], key=lambda b: b.get("index", 0)):
        key = repr((sorted((branch.get("outputs") or {}).items()), branch.get("steps"), branch.get("limit")))
        groups.setdefault(key, []).append(branch)
    return list(groups.values()) or [[]]


def group_text(group: Sequence[Mapping[str, Any]], *, wrap: bool = True, numbered: bool = False) -> str:
    """One drawn edge's label: its conditions joined by "or" (each wrapped), then the outputs it assigns.
    `numbered`: each condition after its place in the stage's ladder (`2. PriorDisputes >= 5`), since in a
    `when` stage the first that holds decides and the layout does not keep their order."""
    guards = [(f"{int(b.get('index', 0)) + 1}. " if numbered and b.get("guard") not in (None, "", "otherwise") else "")
              + str(b.get("guard") or "") for b in group if b.get("guard")]
    lines = [(_wrap(g) if wrap else g) for g in guards]
    text = "\nor ".join(lines)
    steps = group[0].get("steps") if group else None
    if steps:  # actions carried out on the way, in order
        done = " → ".join(f"do {s}" for s in steps)
        text = f"{text}\n{_wrap(done) if wrap else done}" if text else (_wrap(done) if wrap else done)
    limit = group[0].get("limit") if group else None
    if limit is not None:
        text = f"{text}\n(loop: up to {limit}×)" if text else f"(loop: up to {limit}×)"
    outputs = group[0].get("outputs") if group else None
    if outputs:
        assigned = "[" + ", ".join(f"{k} = {v}" for k, v in outputs.items()) + "]"
        assigned = _wrap(assigned) if wrap else assigned
        text = f"{text}\n{assigned}" if text else assigned
    return text


def title_names_id(node: str, title: str) -> bool:
    """Whether a stage's title already says its id as a word (`approval` in "Supervisor approval";
    `late_fee` in "Late fee"): the label then shows the title alone, not "approval / Supervisor / approval"."""
    words = node.replace("_", " ").strip()
    return bool(words) and re.search(rf"(?<!\w){re.escape(words)}(?!\w)", title, re.IGNORECASE) is not None


def _node_label(node: str, data: Mapping[str, Any]) -> str:
    kind = data.get("kind")
    if kind == "decision":
        title = data.get("title") or ""
        width = 18 if _is_branching(data) else 28  # a diamond grows twice as fast as its text
        if title and title_names_id(node, title):
            label = _wrap(title, width)
        else:
            label = f"{node}\n{_wrap(title, width)}" if title else node
        if data.get("observe"):
            label += "\nobserve " + ", ".join(data["observe"])
        return label
    if kind == "action":
        attrs = [a for a in data.get("attributes") or [] if a in LABEL_ATTRIBUTES]
        name = data.get("action") or node[len(ACTION_PREFIX):]
        return f"{name}\n[{', '.join(attrs)}]" if attrs else name
    return str(data.get("label") or node)


def _node_tooltip(node: str, data: Mapping[str, Any]) -> str:
    kind = data.get("kind")
    if kind == "decision":
        parts = [f"{node}: {data.get('title') or ''}".rstrip(": ")]
        if data.get("text"):
            parts.append(str(data["text"]))
        if data.get("reads"):
            parts.append("reads: " + ", ".join(data["reads"]))
        return "\n".join(parts)
    if kind == "action":
        parts = [f"action {data.get('action')}"]
        if data.get("description"):
            parts.append(str(data["description"]))
        if data.get("attributes"):
            parts.append("attributes: " + ", ".join(data["attributes"]))
        return "\n".join(parts)
    return node


def _is_branching(data: Mapping[str, Any]) -> bool:
    return bool(data.get("branching"))


class _Heat:
    """Counts for nodes and edges, and the colour class of each count."""

    def __init__(self, heat: HeatMap, graph: nx.DiGraph):
        self.nodes: dict[str, float] = {}
        self.edges: dict[tuple[str, str], float] = {}
        for key, value in heat.items():
            count = float(value or 0)
            if isinstance(key, tuple) and len(key) == 2:
                self.edges[(str(key[0]), str(key[1]))] = count
            else:
                self.nodes[str(key)] = count
        node_counts = [c for n, c in self.nodes.items() if n in graph and c > 0]
        edge_counts = [c for e, c in self.edges.items() if graph.has_edge(*e) and c > 0]
        self.node_max = max(node_counts, default=0.0)
        self.edge_max = max(edge_counts, default=0.0)

    def node(self, node: str, kind: str) -> float | None:
        """Count of a node; None for start/end when the map says nothing about them (not an item)."""
        if node in self.nodes:
            return self.nodes[node]
        if kind in ("start", "end"):
            return None
        return 0.0

    def edge(self, u: str, v: str) -> float | None:
        """Count of an edge. Edges out of start / into end inherit the entry / action count."""
        if (u, v) in self.edges:
            return self.edges[(u, v)]
        if u == START:
            return self.nodes.get(v, 0.0)
        if v == END:
            return self.nodes.get(u, 0.0)
        return 0.0

    @staticmethod
    def level(count: float, top: float) -> int:
        if top <= 0:
            return 0
        return min(4, max(0, math.ceil(count / top * 5) - 1))


def _fmt_count(count: float) -> str:
    return str(int(count)) if float(count).is_integer() else f"{count:.3g}"


def _coverage_summary(graph: nx.DiGraph, heat: _Heat) -> str:
    items = covered = 0
    for node, data in graph.nodes(data=True):
        count = heat.node(node, data.get("kind", ""))
        if count is None:
            continue
        items += 1
        covered += count > 0
    for u, v in graph.edges():
        if u == START or v == END:
            continue
        items += 1
        covered += (heat.edge(u, v) or 0) > 0
    return f"coverage: {covered} of {items} stages, actions and branches"


def _clusters(graph: nx.DiGraph) -> dict[str, list[str]]:
    """Stages inlined from the same `use` instance, grouped (declaration order)."""
    groups: dict[str, list[str]] = {}
    for node, data in graph.nodes(data=True):
        origin = data.get("origin")
        if data.get("kind") == "decision" and origin:
            groups.setdefault(str(origin), []).append(node)
    return groups


# ---------------------------------------------------------------------------------------------
# DOT


def dot_quote(text: str) -> str:
    """A DOT double-quoted string. Backslashes are doubled so that user text never turns into a
    Graphviz escape such as \\N; newlines become the centred line break `\\n`."""
    text = str(text).replace("\r\n", "\n").replace("\r", "\n")
    text = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{text}"'


def _attrs(attrs: Mapping[str, Any]) -> str:
    parts = []
    for key, value in attrs.items():
        if value is None:
            continue
        parts.append(f"{key}={dot_quote(str(value))}")
    return "[" + ", ".join(parts) + "]"


def _dot_node_attrs(node: str, data: Mapping[str, Any], actions: Mapping[str, ir.Action]) -> dict[str, Any]:
    kind = data.get("kind")
    attrs: dict[str, Any] = {"label": _node_label(node, data), "tooltip": _node_tooltip(node, data)}
    if kind == "start":
        attrs.update(shape="circle", style="filled", fillcolor="#424242", fontcolor="white",
                     width="0.6", fixedsize="true", fontsize="10")
    elif kind == "end":
        attrs.update(shape="doublecircle", style="filled", fillcolor="#424242", fontcolor="white",
                     width="0.5", fixedsize="true", fontsize="10")
    elif kind == "action":
        cls = action_class(actions.get(str(data.get("action"))))
        attrs.update(shape="box", style="rounded,filled", penwidth="1.6", **ACTION_STYLE[cls])
        attrs["class"] = f"action {cls}"
    elif _is_branching(data):
        attrs.update(shape="diamond", style="filled", fillcolor=DECISION_FILL, color=DECISION_BORDER,
                     penwidth="1.4", margin="0.02,0.02")
        attrs["class"] = "stage decision"
    else:
        attrs.update(shape="box", style="solid", color="#424242")
        attrs["class"] = "stage"
    return attrs


def _apply_node_heat(attrs: dict[str, Any], count: float | None, heat: _Heat) -> None:
    if count is None:
        return
    if count <= 0:
        attrs["style"] = ",".join([s for s in str(attrs.get("style", "")).split(",")
                                   if s and s not in ("filled", "solid")] + ["dashed"])
        attrs.update(color=UNCOVERED_COLOR, fontcolor=UNCOVERED_FONT, fillcolor=None)
        attrs["label"] = f"{attrs['label']}\nuncovered"
        attrs["tooltip"] = f"{attrs['tooltip']}\nuncovered"
        attrs["class"] = f"{attrs.get('class', '')} uncovered".strip()
        return
    level = heat.level(count, heat.node_max)
    style = [s for s in str(attrs.get("style", "")).split(",") if s and s not in ("solid", "filled")]
    attrs["style"] = ",".join(style + ["filled"])
    attrs["fillcolor"] = NODE_HEAT[level]
    attrs["fontcolor"] = "white" if level >= 3 else "black"
    attrs["label"] = f"{attrs['label']}\n({_fmt_count(count)})"
    attrs["tooltip"] = f"{attrs['tooltip']}\ncount: {_fmt_count(count)}"
    attrs["class"] = f"{attrs.get('class', '')} heat{level}".strip()


def _apply_edge_heat(attrs: dict[str, Any], count: float | None, heat: _Heat) -> None:
    """Colour one drawn edge (or edge half) by its count; uncovered edges are dashed grey."""
    if count is None:
        return
    if count <= 0:
        attrs.update(style="dashed", color=UNCOVERED_COLOR)
        return
    level = heat.level(count, heat.edge_max)
    attrs["color"] = EDGE_HEAT[level]
    attrs["penwidth"] = f"{1 + level * 0.75:g}"


def _heat_note(count: float | None, shared: int) -> str:
    """What a heat picture adds to an edge label: the count (shared by parallel edges) or `uncovered`."""
    if count is None:
        return ""
    if count <= 0:
        return "uncovered"
    return f"({_fmt_count(count)}" + (f", shared by {shared} edges)" if shared > 1 else ")")


def _label_node_attrs(text: str, tooltip: str, count: float | None) -> dict[str, Any]:
    """A branch label drawn as a small borderless node on its edge, so no line ever crosses the text."""
    attrs: dict[str, Any] = {"label": text, "tooltip": tooltip, "shape": "plaintext", "fontsize": "9",
                             "margin": "0.04,0.03", "height": "0", "width": "0", "fontcolor": "#37474f",
                             "class": "branch"}
    if count is not None and count <= 0:
        attrs["fontcolor"] = UNCOVERED_FONT
        attrs["class"] = "branch uncovered"
    return attrs


def _html(text: str) -> str:
    return html.escape(str(text), quote=True).replace("\n", "<br/>")


def _legend_html(g: nx.DiGraph, scenario: ir.Scenario, hot: _Heat | None) -> str:
    """The key to the picture (shapes, risk colours, heat scale), as the cells of one row of an HTML-like
    label. A heat picture names the risk classes briefly (they are only borders there) to keep one row."""
    cell = '<td border="1" color="{border}" bgcolor="{fill}" style="{style}"><font color="{font}">{text}</font></td>'
    cells = ['<td><b>Legend</b></td>']
    kinds = {str(d.get("kind")) for _, d in g.nodes(data=True)}
    branching = any(_is_branching(d) for _, d in g.nodes(data=True) if d.get("kind") == "decision")
    if branching:
        fill = "white" if hot is not None else DECISION_FILL
        cells.append(cell.format(border=DECISION_BORDER, fill=fill, style="solid", font="black",
                                 text="&#9671; decision" + ("" if hot is not None else " stage")))
    if "decision" in kinds:
        cells.append(cell.format(border="#424242", fill="white", style="solid", font="black", text="stage"))
    present = {action_class(scenario.actions.get(str(d.get("action"))))
               for _, d in g.nodes(data=True) if d.get("kind") == "action"}
    names = {"risky": "risky action (money / irreversible)", "escalation": "escalation", "safe": "other action"}
    if hot is not None:
        names = {"risky": "risky", "escalation": "escalation", "safe": "other action"}
    for cls in ("risky", "escalation", "safe"):
        if cls in present:
            style = ACTION_STYLE[cls]
            fill = "white" if hot is not None else style["fillcolor"]
            cells.append(cell.format(border=style["color"], fill=fill, style="rounded", font="black",
                                     text=names[cls]))
    if hot is not None:
        cells.append("<td>visits: fewer</td>")
        for colour in NODE_HEAT:
            cells.append(f'<td border="1" color="#9e9e9e" bgcolor="{colour}" fixedsize="true" width="16" '
                         'height="12"> </td>')
        cells.append("<td>more</td>")
        cells.append(cell.format(border=UNCOVERED_COLOR, fill="white", style="dashed", font=UNCOVERED_FONT,
                                 text="uncovered"))
    return "".join(cells)


def _graph_label(title: str, summary: str, legend: str, ordered: bool = False) -> str:
    rows = [f'<tr><td align="left"><font point-size="15">{_html(title)}</font></td></tr>']
    if summary:
        rows.append(f'<tr><td align="left"><font point-size="11">{_html(summary)}</font></td></tr>')
    rows.append('<tr><td align="left"><font point-size="10"><table border="0" cellspacing="3" cellpadding="2">'
                f"<tr>{legend}</tr></table></font></td></tr>")
    note = ("Text on a line: the condition of that branch (&quot;or&quot;: any of several branches);"
            '<br align="left"/>[X = v]: the output that branch sets.')
    if ordered:
        note += '<br align="left"/>1., 2., …: the order a stage checks its conditions in (the first that holds decides).'
    if summary:
        note += " Heat: a leaf keeps its risk colour as its border."
    rows.append(f'<tr><td align="left"><font point-size="10">{note}<br align="left"/></font></td></tr>')
    return '<<table border="0" cellspacing="0" cellpadding="1">' + "".join(rows) + "</table>>"


def to_dot(scenario: ir.Scenario, graph: nx.DiGraph | None = None, *, heat: HeatMap | None = None) -> str:
    """The scenario's graph as Graphviz DOT text.

    Branch conditions are drawn as small label nodes on their edges (a line never strikes its own label,
    and labels take part in the layout instead of being pushed aside); one drawn edge per group of
    `edge_groups`. The title and a legend are an HTML-like graph label above the picture.

    Args:
        scenario: the loaded scenario (actions' attributes pick the colours of action leaves).
        graph: its compiled graph (compiled here when omitted).
        heat: optional counts keyed by node id (`"step3"`, `"action:GoodBye"`) and by `(u, v)` edge;
            items missing from the map (or with count 0) are drawn as uncovered. Start/end and the edges
            touching them are only marked when the map mentions them (or their neighbour).
    """
    g = graph if graph is not None else compile_graph(scenario)
    hot = _Heat(heat, g) if heat is not None else None
    ordered = ordered_stages(scenario)
    title = scenario.name + (f" — {scenario.title}" if scenario.title else "")
    summary = _coverage_summary(g, hot) if hot is not None else ""
    lines = [
        f"digraph {dot_quote(scenario.name)} {{",
        "  " + " ".join(f"{k}={dot_quote(v)};" for k, v in (
            ("rankdir", "TB"), ("newrank", "true"), ("nodesep", "0.22"), ("ranksep", "0.28"),
            ("size", MAX_SIZE_IN),
            ("fontname", FONT), ("labelloc", "t"), ("labeljust", "l"))),
        f"  label={_graph_label(title, summary, _legend_html(g, scenario, hot), bool(ordered))};",
        f'  node [fontname="{FONT}", fontsize="11"];',
        f'  edge [fontname="{FONT}", fontsize="9", color="#555555", arrowsize="0.7"];',
    ]
    clusters = _clusters(g)
    member_of = {n: origin for origin, members in clusters.items() for n in members}
    cluster_lines: dict[str, list[str]] = {origin: [] for origin in clusters}

    def place(node_line: str, *nodes: str) -> None:
        """Put a node line in the cluster all of `nodes` belong to, else at top level."""
        origins = {member_of.get(n) for n in nodes}
        origin = origins.pop() if len(origins) == 1 else None
        if origin is not None:
            cluster_lines[origin].append("  " + node_line)
        else:
            lines.append(node_line)

    for node, data in g.nodes(data=True):
        attrs = _dot_node_attrs(node, data, scenario.actions)
        if hot is not None:
            _apply_node_heat(attrs, hot.node(node, str(data.get("kind"))), hot)
        place(f"  {dot_quote(node)} {_attrs(attrs)};", node)
    edge_lines: list[str] = []
    loops = back_edges(g)
    for u, v, data in g.edges(data=True):
        count = hot.edge(u, v) if hot is not None else None
        groups = edge_groups(data)
        numbered = u in ordered
        for k, group in enumerate(groups):
            text = group_text(group, numbered=numbered)
            full = group_text(group, wrap=False, numbered=numbered)
            tooltip = f"{u} -> {v}" + ("\n" + full if full else "")
            note = _heat_note(count, len(groups))
            eattrs: dict[str, Any] = {"tooltip": tooltip}
            if u == START or v == END:
                eattrs["color"] = "#9e9e9e"
            back = (u, v) in loops and u != v
            if (u, v) in loops:
                eattrs["style"] = "dashed"  # a loop back: dashed, and laid out as the flow it returns to
            if hot is not None:
                _apply_edge_heat(eattrs, count, hot)
                if count is not None:
                    eattrs["tooltip"] = f"{tooltip}\n" + (f"count: {_fmt_count(count)}" if count > 0 else "uncovered")
            if not text and not (note and u != START and v != END):
                if back:  # written v -> u with the arrow at v: the layout keeps v above u, the line points up
                    edge_lines.append(f"  {dot_quote(v)} -> {dot_quote(u)} {_attrs({**eattrs, 'dir': 'back'})};")
                else:
                    edge_lines.append(f"  {dot_quote(u)} -> {dot_quote(v)} {_attrs(eattrs)};")
                continue
            label_id = f"{u} -> {v}" + (f" #{k + 1}" if len(groups) > 1 else "")
            text = f"{text}\n{note}" if text and note else (text or note)
            place(f"  {dot_quote(label_id)} {_attrs(_label_node_attrs(text, eattrs['tooltip'], count))};", u, v)
            if back:  # its label sits between the two stages, beside the forward flow
                edge_lines.append(f"  {dot_quote(v)} -> {dot_quote(label_id)} {_attrs({**eattrs, 'dir': 'back'})};")
                edge_lines.append(f"  {dot_quote(label_id)} -> {dot_quote(u)} {_attrs({**eattrs, 'dir': 'none'})};")
                continue
            edge_lines.append(f"  {dot_quote(u)} -> {dot_quote(label_id)} {_attrs({**eattrs, 'arrowhead': 'none'})};")
            edge_lines.append(f"  {dot_quote(label_id)} -> {dot_quote(v)} {_attrs(eattrs)};")
    for i, origin in enumerate(clusters):
        lines.append(f"  subgraph {dot_quote(f'cluster_{i}_{origin}')} {{")
        lines.append(f'    label={dot_quote(f"use {origin}")}; style="rounded,dashed"; color="#9e9e9e";'
                     f' fontsize="10";')
        lines += cluster_lines[origin]
        lines.append("  }")
    lines += edge_lines
    lines.append("}")
    return "\n".join(lines) + "\n"


def back_edges(graph: nx.DiGraph) -> set[tuple[str, str]]:
    """The edges that close a loop: a depth-first walk from `start` in the graph's own order (branch
    order), an edge into a node still on the walk. Only these are drawn as loop edges (dashed, not
    pulling the layout): the bound of a loop (`up to 2 times`) may sit on its forward step
    (`fix -> retest`, with `retest -> fix` closing the loop), which was drawn as a dashed edge going up."""
    state: dict[str, int] = {}  # 1: on the walk, 2: done
    back: set[tuple[str, str]] = set()
    roots = [START] + [n for n in graph.nodes if n != START] if START in graph else list(graph.nodes)
    for root in roots:
        if root in state:
            continue
        state[root] = 1
        walk = [(root, iter(graph.successors(root)))]
        while walk:
            node, successors = walk[-1]
            nxt = next(successors, None)
            if nxt is None:
                state[node] = 2
                walk.pop()
            elif state.get(nxt) == 1:
                back.add((node, nxt))
            elif nxt not in state:
                state[nxt] = 1
                walk.append((nxt, iter(graph.successors(nxt))))
    return back


def ordered_stages(scenario: ir.Scenario) -> set[str]:
    """The `when` stages with two or more conditions (their order decides), found once per picture:
    asked per edge, a stage of thousands of arms was walked once per arm."""
    return {sid for sid, stage in scenario.stages.items()
            if stage.kind == "when" and sum(1 for b in stage.branches if b.guard is not None) >= 2}


def dot_binary() -> str | None:
    """Path of Graphviz `dot`, or None when it is not installed."""
    return shutil.which("dot")


def run_dot(dot_text: str, fmt: Literal["svg", "png"], *, timeout: float = DOT_TIMEOUT_S) -> bytes:
    """Lay out DOT text with the `dot` binary. Raises RenderError with an actionable message."""
    binary = dot_binary()
    if binary is None:
        raise RenderError(f"graphviz `dot` was not found on PATH; {INSTALL_HINT}")
    try:
        proc = subprocess.run([binary, f"-T{fmt}"], input=dot_text.encode("utf-8"), capture_output=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise RenderError(f"graphviz `dot` did not finish within {timeout:g} s") from None
    except OSError as exc:
        raise RenderError(f"cannot run graphviz `dot` ({exc.strerror or exc}); {INSTALL_HINT}") from None
    if proc.returncode != 0:
        msg = proc.stderr.decode("utf-8", "replace").strip() or f"exit status {proc.returncode}"
        raise RenderError(f"graphviz `dot` failed: {msg}")
    return proc.stdout


# ---------------------------------------------------------------------------------------------
# Mermaid


_MERMAID_ENTITIES = {"#": "#35;", '"': "#quot;", "<": "#lt;", ">": "#gt;", "&": "#amp;", "`": "#96;",
                     "|": "#124;", "{": "#123;", "}": "#125;", "[": "#91;", "]": "#93;"}


def mermaid_text(text: str) -> str:
    """Text safe inside a quoted Mermaid label: special characters as entity codes, newlines as <br/>."""
    text = str(text).replace("\r\n", "\n").replace("\r", "\n")
    out = "".join(_MERMAID_ENTITIES.get(ch, ch) for ch in text)
    return out.replace("\n", "<br/>")


def _mermaid_ids(graph: nx.DiGraph) -> dict[str, str]:
    """Node ids Mermaid accepts (letters, digits, `_`; never the keyword `end`), unique and stable."""
    ids: dict[str, str] = {}
    used: set[str] = set()
    for node, data in graph.nodes(data=True):
        kind = data.get("kind")
        if kind == "start":
            base = "sop_start"
        elif kind == "end":
            base = "sop_end"
        elif kind == "action":
            base = "a_" + re.sub(r"[^A-Za-z0-9_]", "_", node[len(ACTION_PREFIX):])
        else:
            base = "s_" + re.sub(r"[^A-Za-z0-9_]", "_", node)
        candidate, n = base, 2
        while candidate in used:
            candidate, n = f"{base}_{n}", n + 1
        used.add(candidate)
        ids[node] = candidate
    return ids


def to_mermaid(scenario: ir.Scenario, graph: nx.DiGraph | None = None, *,
               heat: HeatMap | None = None) -> str:
    """The scenario's graph as a Mermaid flowchart (same content and heat rules as `to_dot`)."""
    g = graph if graph is not None else compile_graph(scenario)
    hot = _Heat(heat, g) if heat is not None else None
    ids = _mermaid_ids(g)
    title = scenario.name + (f" — {scenario.title}" if scenario.title else "")
    lines = ["---", f"title: {_yaml_str(title)}", "---", "flowchart TB"]
    lines += [
        f"  classDef decision fill:{DECISION_FILL},stroke:{DECISION_BORDER},stroke-width:1.4px",
        "  classDef stage fill:#ffffff,stroke:#424242",
        "  classDef terminal fill:#424242,stroke:#424242,color:#ffffff",
    ]
    for cls, style in ACTION_STYLE.items():
        lines.append(f"  classDef {cls} fill:{style['fillcolor']},stroke:{style['color']},stroke-width:1.6px")
    if hot is not None:
        for level, colour in enumerate(NODE_HEAT):
            font = "#ffffff" if level >= 3 else "#000000"
            lines.append(f"  classDef heat{level} fill:{colour},color:{font}")
        lines.append(f"  classDef uncovered fill:#ffffff,stroke:{UNCOVERED_COLOR},color:{UNCOVERED_FONT},"
                     "stroke-dasharray:5 5")
    clusters = _clusters(g)
    clustered = {n for members in clusters.values() for n in members}
    classes: list[tuple[str, str]] = []

    def node_line(node: str, data: Mapping[str, Any], indent: str = "  ") -> str:
        kind = data.get("kind")
        label = _node_label(node, data)
        if kind == "action":
            cls = action_class(scenario.actions.get(str(data.get("action"))))
        elif kind == "decision":
            cls = "decision" if _is_branching(data) else "stage"
        else:
            cls = "terminal"
        if hot is not None:
            count = hot.node(node, str(kind))
            if count is not None and count <= 0:
                label += "\nuncovered"
                cls = "uncovered"
            elif count is not None:
                label += f"\n({_fmt_count(count)})"
                cls = f"heat{hot.level(count, hot.node_max)}"
        classes.append((ids[node], cls))
        text = mermaid_text(label)
        nid = ids[node]
        if kind == "start":
            return f'{indent}{nid}(("{text}"))'
        if kind == "end":
            return f'{indent}{nid}((("{text}")))'
        if kind == "action":
            return f'{indent}{nid}("{text}")'
        if _is_branching(data):
            return f'{indent}{nid}{{"{text}"}}'
        return f'{indent}{nid}["{text}"]'

    for node, data in g.nodes(data=True):
        if node not in clustered:
            lines.append(node_line(node, data))
    for i, (origin, members) in enumerate(clusters.items()):
        sid = f"sf_{i}_" + re.sub(r"[^A-Za-z0-9_]", "_", origin)
        lines.append(f'  subgraph {sid} ["{mermaid_text("use " + origin)}"]')
        for node in members:
            lines.append(node_line(node, g.nodes[node], "    "))
        lines.append("  end")
    link_styles: list[str] = []
    index = 0
    ordered = ordered_stages(scenario)
    for u, v, data in g.edges(data=True):
        groups = edge_groups(data)
        for group in groups:
            label = group_text(group, numbered=u in ordered)
            if hot is not None:
                count = hot.edge(u, v)
                note = _heat_note(count, len(groups))
                if note:
                    label = f"{label}\n{note}" if label else note
                if count is not None and count <= 0:
                    link_styles.append(f"  linkStyle {index} stroke:{UNCOVERED_COLOR},stroke-dasharray:5 5")
                elif count is not None:
                    level = hot.level(count, hot.edge_max)
                    link_styles.append(f"  linkStyle {index} stroke:{EDGE_HEAT[level]},"
                                       f"stroke-width:{1 + level * 0.75:g}px")
            arrow = f'-->|"{mermaid_text(label)}"|' if label else "-->"
            lines.append(f"  {ids[u]} {arrow} {ids[v]}")
            index += 1
    lines += link_styles
    for nid, cls in classes:
        lines.append(f"  class {nid} {cls}")
    return "\n".join(lines) + "\n"


_TITLE_MARKUP = {"<": "\u2039", ">": "\u203a", "&": "\uff06"}  # lookalikes: no tag or entity survives


def _yaml_str(text: str) -> str:
    """The front-matter title as a one-line double-quoted YAML string. Mermaid shows it outside the
    label sanitiser and a `.mmd` is often pasted into pages, so markup characters become harmless
    lookalikes (`<script>` -> `‹script›`) and control characters become spaces."""
    text = "".join(" " if (ord(ch) < 32 or ord(ch) == 127) else _TITLE_MARKUP.get(ch, ch) for ch in text)
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


# ---------------------------------------------------------------------------------------------
# Front door


def format_for(out: str | Path | None, explicit: str | None = None) -> str:
    """The output format: `explicit` if given, else from the file suffix, else DOT."""
    if explicit:
        if explicit not in FORMATS:
            raise RenderError(f"unknown format `{explicit}` (choose from {', '.join(FORMATS)})")
        return explicit
    if out is None:
        return "dot"
    suffix = Path(out).suffix.lower()
    if suffix not in SUFFIXES:
        raise RenderError(f"cannot tell the format from `{Path(out).name}`: use a .svg, .png, .dot or .mmd "
                          "file name, or --format")
    return SUFFIXES[suffix]


def render(scenario: ir.Scenario, fmt: str, *, graph: nx.DiGraph | None = None,
           heat: HeatMap | None = None, timeout: float = DOT_TIMEOUT_S) -> bytes:
    """The picture in one of FORMATS, as bytes (UTF-8 text for dot/mmd/svg)."""
    g = graph if graph is not None else compile_graph(scenario)
    if fmt == "mmd":
        return to_mermaid(scenario, g, heat=heat).encode("utf-8")
    dot_text = to_dot(scenario, g, heat=heat)
    if fmt == "dot":
        return dot_text.encode("utf-8")
    if fmt == "svg":
        return run_dot(dot_text, "svg", timeout=timeout)
    if fmt == "png":
        return run_dot(dot_text, "png", timeout=timeout)
    raise RenderError(f"unknown format `{fmt}` (choose from {', '.join(FORMATS)})")
