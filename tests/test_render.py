"""The renderer: DOT shapes/labels/escaping, heat colouring, Mermaid, SVG through `dot`, the CLI."""

from __future__ import annotations

import colorsys
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

import sopgraph
from sopgraph.cli import main
from sopgraph.language import render as R
from sopgraph.language.compile import compile_graph

ROOT = Path(__file__).resolve().parent.parent
TELECOM = ROOT / "scenarios" / "telecom_package.sop"
HAS_DOT = shutil.which("dot") is not None

# Two branches into one action, a string action name with `+`, quotes and <> in texts, a computed output.
TRICKY = '''
scenario tricky "Tricky \\"labels\\" <here>"
field Kind: A | B | C "the kind"
field Angry: bool
system Amount: float[0..1000] unit "EUR" money
let Fee = Amount * 0.1 + 5
output Charge: float = 0 "what is charged"
action "Comfort+Compensation" "Say \\"sorry\\" & pay <something>" [moves_money]
action Hand "to a human" [escalation]
action Done "done"
stage s1 "Intro \\"quoted\\"" { -> s2 }
stage s2 "Route" {
    when Kind == A and Amount > 100 -> do "Comfort+Compensation" { Charge = Fee }
    when Kind == B -> do Hand
    when Angry -> do Hand
    otherwise -> do Done
}
'''


@pytest.fixture(scope="module")
def telecom():
    return sopgraph.load(TELECOM)


@pytest.fixture(scope="module")
def tricky():
    return sopgraph.load(text=TRICKY)


def node_attrs(dot: str, node: str) -> str:
    match = re.search(rf'^\s*"{re.escape(node)}" \[(.*)\];$', dot, re.M)
    assert match, f"node {node} not in DOT"
    return match.group(1)


def edge_attrs(dot: str, u: str, v: str) -> str:
    match = re.search(rf'^\s*"{re.escape(u)}" -> "{re.escape(v)}" \[(.*)\];$', dot, re.M)
    assert match, f"edge {u} -> {v} not in DOT"
    return match.group(1)


def drawn_edges(dot: str, u: str, v: str) -> list[tuple[str, str]]:
    """Each drawn u → v edge as (label text, attributes of its arrow into v). A labelled edge runs through
    a label node named "u -> v" (or "u -> v #k" when the pair has several drawn edges)."""
    out = []
    direct = re.search(rf'^\s*"{re.escape(u)}" -> "{re.escape(v)}" \[(.*)\];$', dot, re.M)
    if direct:
        out.append(("", direct.group(1)))
    for m in re.finditer(rf'^\s*"({re.escape(u)} -> {re.escape(v)}(?: #\d+)?)" \[(.*)\];$', dot, re.M):
        label = re.search(r'label="((?:[^"\\]|\\.)*)"', m.group(2))
        assert label and 'shape="plaintext"' in m.group(2)
        out.append((label.group(1), edge_attrs(dot, m.group(1), v)))
        assert "arrowhead=\"none\"" in edge_attrs(dot, u, m.group(1))
    return out


def label_of(dot: str, u: str, v: str) -> str:
    edges = drawn_edges(dot, u, v)
    assert len(edges) == 1, edges
    return edges[0][0]


def test_dot_shapes_distinguish_decisions_actions_and_terminals(telecom):
    dot = R.to_dot(telecom)
    assert dot.startswith('digraph "telecom_package" {') and dot.rstrip().endswith("}")
    assert 'rankdir="TB"' in dot
    assert 'shape="diamond"' in node_attrs(dot, "step2")  # branching stage
    assert 'label="step2\\nCaller\'s intention"' in node_attrs(dot, "step2")
    assert 'shape="box", style="solid"' in node_attrs(dot, "step1")  # non-branching stage
    assert 'shape="circle"' in node_attrs(dot, "start")
    assert 'shape="doublecircle"' in node_attrs(dot, "end")
    change = node_attrs(dot, "action:ChangeOrder")
    assert 'style="rounded,filled"' in change and R.ACTION_STYLE["risky"]["color"] in change
    assert R.ACTION_STYLE["escalation"]["color"] in node_attrs(dot, "action:TransHuman")
    assert R.ACTION_STYLE["safe"]["color"] in node_attrs(dot, "action:GoodBye")
    # the attribute badge names the risk, the tooltip has the description
    assert "[moves_money, irreversible]" in change and "Carry out the requested plan" in change


def test_branch_edges_and_labels(telecom, tricky):
    dot = R.to_dot(telecom)
    assert label_of(dot, "step6", "action:GoodBye") == "Reject, Hesitate"
    assert label_of(dot, "step5", "action:ChangeOrder") == "Penalty == 0"
    assert label_of(dot, "step5", "step7") == "otherwise"
    assert drawn_edges(dot, "step1", "step2") == [("", edge_attrs(dot, "step1", "step2"))]  # unconditional
    assert "label=" not in edge_attrs(dot, "step1", "step2")
    assert len(re.findall(r'^\s*"step5" -> ', dot, re.M)) == 2
    # two branches into the same action with the same outputs: one edge, conditions joined by "or"
    tdot = R.to_dot(tricky)
    assert label_of(tdot, "s2", "action:Hand") == "2. Kind == B\\nor 3. Angry"  # numbered: the order decides
    # an assigned output is shown on the edge, under its condition
    assert label_of(tdot, "s2", "action:Comfort+Compensation") == "1. Kind == A\\nand Amount > 100\\n[Charge = Fee]"


BRANCHES = """
scenario fees
field Tier: Gold | Silver | Bronze
system Rate: float[0..500] unit "EUR" money
output Fee: float[0..) = 0 "the fee charged"
action Charge "charge the fee" [moves_money]
stage s1 "Fee" {
    match Tier {
        Gold -> do Charge
        Silver -> do Charge { Fee = Rate }
        Bronze -> do Charge { Fee = Rate }
    }
}
"""


def test_branches_with_different_outputs_are_separate_edges():
    scenario = sopgraph.load(text=BRANCHES)
    dot = R.to_dot(scenario)
    edges = drawn_edges(dot, "s1", "action:Charge")
    assert [label for label, _ in edges] == ["Gold", "Silver\\nor Bronze\\n[Fee = Rate]"]
    assert '"s1 -> action:Charge #1"' in dot and '"s1 -> action:Charge #2"' in dot
    mmd = R.to_mermaid(scenario)
    assert 's_s1 -->|"Gold"| a_Charge' in mmd
    assert 's_s1 -->|"Silver<br/>or Bronze<br/>#91;Fee = Rate#93;"| a_Charge' in mmd
    # with heat, both drawn edges say that the count is for the stage → action pair
    hot = R.to_dot(scenario, heat={"s1": 4, "action:Charge": 4, ("s1", "action:Charge"): 4})
    assert all("(4, shared by 2 edges)" in label for label, _ in drawn_edges(hot, "s1", "action:Charge"))


def test_labels_are_nodes_so_no_line_strikes_a_label(telecom):
    for path in sorted((ROOT / "scenarios").glob("*.sop")):
        dot = R.to_dot(sopgraph.load(path))
        edge_lines = [line for line in dot.splitlines() if re.match(r'^\s*"[^"]*" -> "[^"]*" \[', line)]
        assert edge_lines and not [line for line in edge_lines if re.search(r"\b(x?label)=", line)], path.name
    # the airline edge once struck through by its own line is a label node between step3 and step4
    airline = R.to_dot(sopgraph.load(ROOT / "scenarios" / "airline_refund.sop"))
    assert label_of(airline, "step3", "step4") == "Airline, Weather"


def test_legend_and_title(telecom):
    dot = R.to_dot(telecom)
    label = re.search(r"^  label=<(.*)>;$", dot, re.M)
    assert label, "the graph label is an HTML-like table"
    text = label.group(1)
    assert "telecom_package — " in text and "<b>Legend</b>" in text
    for key in ("decision stage", "risky action", "escalation", "other action", "[X = v]"):
        assert key in text, key
    assert R.ACTION_STYLE["risky"]["fillcolor"] in text and R.DECISION_FILL in text
    hot = re.search(r"^  label=<(.*)>;$", R.to_dot(telecom, heat={"step1": 1}), re.M).group(1)
    assert all(colour in hot for colour in R.NODE_HEAT) and "uncovered" in hot and "coverage: " in hot
    # user text in the title is escaped for the HTML-like label
    odd = sopgraph.load(text='scenario odd "a <b> & c"\naction A "a"\nstage s "s" { -> do A }\n')
    assert "a &lt;b&gt; &amp; c" in R.to_dot(odd)


def _hue(colour: str) -> float:
    r, g, b = (int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5))
    return colorsys.rgb_to_hsv(r, g, b)[0] * 360


def test_heat_palette_does_not_look_like_risk():
    for colour in R.NODE_HEAT[1:] + R.EDGE_HEAT:  # the lightest class is near-white
        assert 190 <= _hue(colour) <= 230, colour  # blues
    risk = [R.ACTION_STYLE[c]["color"] for c in ("risky", "escalation", "safe")]
    assert all(not 190 <= _hue(c) <= 230 for c in risk)
    assert not set(R.NODE_HEAT) & {v for style in R.ACTION_STYLE.values() for v in style.values()}


@pytest.mark.skipif(not HAS_DOT, reason="graphviz dot not installed")
def test_every_shipped_graph_fits_1400_px():
    for path in sorted((ROOT / "scenarios").glob("*.sop")) + sorted((ROOT / "examples").glob("*.sop")):
        svg = R.render(sopgraph.load(path), "svg").decode()
        width_pt = float(re.search(r'<svg width="([\d.]+)pt"', svg).group(1))
        assert width_pt * 4 / 3 <= 1400, (path.name, width_pt)
        assert "Legend" in svg


def test_dot_escaping(tricky):
    dot = R.to_dot(tricky)
    assert '"action:Comfort+Compensation" [label="Comfort+Compensation\\n[moves_money]"' in dot
    assert 'Say \\"sorry\\" & pay <something>' in dot
    assert 'label="s1\\nIntro \\"quoted\\""' in dot
    assert R.dot_quote('a\\N "b"\nc') == '"a\\\\N \\"b\\"\\nc"'  # no accidental \N escape
    # every quote inside a label is escaped: the quote count per line is even
    for line in dot.splitlines():
        assert line.replace('\\"', "").count('"') % 2 == 0, line


@pytest.mark.skipif(not HAS_DOT, reason="graphviz dot not installed")
def test_dot_accepts_tricky_labels(tricky):
    svg = R.run_dot(R.to_dot(tricky), "svg").decode()
    assert "<svg" in svg and "Comfort+Compensation" in svg and "&lt;something&gt;" in svg


def test_deterministic_bytes(telecom):
    again = sopgraph.load(TELECOM)
    assert R.to_dot(telecom) == R.to_dot(again)
    assert R.to_mermaid(telecom) == R.to_mermaid(again)
    heat = {"step1": 3, ("step1", "step2"): 3}
    assert R.to_dot(telecom, heat=heat) == R.to_dot(again, heat=dict(reversed(list(heat.items()))))
    assert re.search(r"\d{4}-\d\d-\d\d", R.to_dot(telecom)) is None  # no timestamps


@pytest.mark.skipif(not HAS_DOT, reason="graphviz dot not installed")
def test_svg_and_png_via_dot(telecom):
    svg = R.render(telecom, "svg")
    assert svg.startswith(b"<?xml") and b"<svg" in svg and b"step7" in svg
    assert R.render(telecom, "svg") == svg  # deterministic
    png = R.render(telecom, "png")
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_missing_dot_is_a_clear_error(telecom, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(R.RenderError, match="apt-get install -y graphviz"):
        R.render(telecom, "svg")
    assert R.render(telecom, "dot").startswith(b"digraph")  # DOT and Mermaid need no binary
    assert R.render(telecom, "mmd").startswith(b"---")
    res = CliRunner().invoke(main, ["render", str(TELECOM), "-o", "/tmp/never-written.svg"])
    assert res.exit_code == 1
    assert "install graphviz: apt-get install -y graphviz" in res.output
    assert "Traceback" not in res.output


def test_dot_timeout_and_failure_are_render_errors(telecom, monkeypatch):
    monkeypatch.setattr(R, "dot_binary", lambda: "/usr/bin/dot")

    def slow(*a, **k):
        raise subprocess.TimeoutExpired(cmd="dot", timeout=0.1)

    monkeypatch.setattr(R.subprocess, "run", slow)
    with pytest.raises(R.RenderError, match="did not finish"):
        R.run_dot("digraph {}", "svg", timeout=0.1)

    def broken(*a, **k):
        return subprocess.CompletedProcess(a, 1, b"", b"syntax error in line 1")

    monkeypatch.setattr(R.subprocess, "run", broken)
    with pytest.raises(R.RenderError, match="syntax error in line 1"):
        R.run_dot("digraph {", "svg")


# ---------------------------------------------------------------------------------------------
# Heat


def test_heat_colours_counts_and_marks_uncovered(telecom):
    heat = {"step1": 10, "step2": 10, "step3": 2, "action:GoodBye": 2,
            ("step1", "step2"): 10, ("step2", "step3"): 2}
    dot = R.to_dot(telecom, heat=heat)
    hot = node_attrs(dot, "step1")
    assert f'fillcolor="{R.NODE_HEAT[4]}"' in hot and "(10)" in hot and "count: 10" in hot
    assert f'fillcolor="{R.NODE_HEAT[0]}"' in node_attrs(dot, "step3")  # 2/10 -> lowest class
    cold = node_attrs(dot, "step7")
    assert "dashed" in cold and R.UNCOVERED_COLOR in cold and "uncovered" in cold
    assert "filled" not in cold.split('style="')[1].split('"')[0]
    assert "uncovered" in node_attrs(dot, "action:TransHuman")
    assert "uncovered" not in node_attrs(dot, "action:GoodBye")
    [(label, e)] = drawn_edges(dot, "step1", "step2")  # unconditional: the label node carries the count
    assert f'color="{R.EDGE_HEAT[4]}"' in e and 'penwidth="4"' in e and "count: 10" in e and label == "(10)"
    assert label_of(dot, "step2", "step3") == "Enquiry\\n(2)"
    [(label, unc)] = drawn_edges(dot, "step2", "step4")
    assert 'style="dashed"' in unc and label == "Change\\nuncovered"
    # start/end are not items unless the map says so; edges touching them follow their neighbour
    assert "uncovered" not in node_attrs(dot, "start") and "uncovered" not in node_attrs(dot, "end")
    assert "count: 10" in edge_attrs(dot, "start", "step1")
    assert "uncovered" in edge_attrs(dot, "action:TransHuman", "end")
    assert "coverage: 6 of 23" in dot


def test_heat_level_scale():
    assert [R._Heat.level(c, 10) for c in (0.1, 2, 2.1, 5, 10)] == [0, 0, 1, 2, 4]
    assert R._Heat.level(3, 0) == 0


def test_heat_all_zero_marks_everything(telecom):
    dot = R.to_dot(telecom, heat={})
    for stage in telecom.stages:
        assert "uncovered" in node_attrs(dot, stage)
    assert "coverage: 0 of 23" in dot


# ---------------------------------------------------------------------------------------------
# Mermaid

MERMAID_LINE = re.compile(
    r'^(---|title: ".*"|flowchart TB'
    r"|  classDef \w+ [\w#:.,\- ]+"
    r'|\s+\w+(\(\(".*"\)\)|\(\(\("[^"]*"\)\)\)|\("[^"]*"\)|\{"[^"]*"\}|\["[^"]*"\])'
    r'|\s+\w+ -->(\|"[^"]*"\|)? \w+'
    r"|  linkStyle \d+ [\w#:.,\- ]+"
    r'|  subgraph \w+ \["[^"]*"\]|  end'
    r"|  class \w+ \w+)$")


def test_mermaid_structure(telecom, tricky):
    for scenario in (telecom, tricky):
        text = R.to_mermaid(scenario, heat={"s1": 1} if scenario is tricky else None)
        lines = text.splitlines()
        assert lines[:4] == ["---", lines[1], "---", "flowchart TB"]
        for line in lines:
            assert MERMAID_LINE.match(line), line
        ids = re.findall(r"^\s+(\w+)[(\[{]", text, re.M)
        assert "end" not in ids and len(ids) == len(set(ids))
    text = R.to_mermaid(telecom)
    assert 's_step2{"step2<br/>Caller\'s intention"}' in text
    assert 's_step1["step1<br/>Field classification"]' in text
    assert 's_step6 -->|"Reject, Hesitate"| a_GoodBye' in text
    assert "class a_ChangeOrder risky" in text and "class a_TransHuman escalation" in text


def test_mermaid_escaping(tricky):
    text = R.to_mermaid(tricky)
    assert 'a_Comfort_Compensation("Comfort+Compensation<br/>#91;moves_money#93;")' in text
    assert 'Intro #quot;quoted#quot;' in text
    assert 's2 -->|"2. Kind == B<br/>or 3. Angry"| a_Hand' in text  # a when ladder: numbered
    assert 'Amount #gt; 100' in text
    assert R.mermaid_text('<a href="x">#1|{}</a>') == "#lt;a href=#quot;x#quot;#gt;#35;1#124;#123;#125;#lt;/a#gt;"


def test_mermaid_user_text_carries_no_markup() -> None:
    hostile = sopgraph.load(text=(
        'scenario x "<script>alert(1)</script> & \\"more\\"" "d"\n'
        'field K: A | B "<b>kind</b>"\n'
        'action "<img src=x onerror=alert(1)>" "<i>do</i>"\naction Y "y"\n'
        'stage s1 "<em>title</em>" { "<script>text</script>"\n'
        '  match K { A -> do "<img src=x onerror=alert(1)>" B -> do Y } }\n'))
    text = R.to_mermaid(hostile)
    front = text.split("---")[1]
    assert front == '\ntitle: "x — \u2039script\u203aalert(1)\u2039/script\u203a \uff06 \\"more\\""\n'
    without_breaks = text.replace("<br/>", "")
    assert "<" not in without_breaks and ">" not in without_breaks.replace("-->", "").replace("==>", "")


def test_mermaid_heat(telecom):
    text = R.to_mermaid(telecom, heat={"step1": 4, ("step1", "step2"): 4})
    assert "class s_step1 heat4" in text and "class s_step7 uncovered" in text
    assert 's_step2 -->|"Enquiry<br/>uncovered"| s_step3' in text
    assert re.search(r"linkStyle 1 stroke:#084594", text)


def test_subflow_instances_are_clustered():
    text = '''
scenario sub
field X: A | B
field Y: A | B
action Ok "ok"
action No "no"
subflow check(pass, fail) {
    stage c1 "Check X" { match X { A -> pass  B -> fail } }
}
stage s1 "Start" { -> first }
use check as first(pass -> second, fail -> do No)
use check as second(pass -> do Ok, fail -> do No)
'''
    scenario = sopgraph.load(text=text)
    dot = R.to_dot(scenario)
    assert 'subgraph "cluster_0_first"' in dot and 'subgraph "cluster_1_second"' in dot
    assert label_of(dot, "first.c1", "second.c1") == "A"
    mmd = R.to_mermaid(scenario)
    assert 'subgraph sf_0_first ["use first"]' in mmd and "s_first_c1" in mmd


def test_format_for():
    assert R.format_for("g.svg") == "svg" and R.format_for("g.PNG") == "png"
    assert R.format_for("g.gv") == "dot" and R.format_for("g.mmd") == "mmd"
    assert R.format_for(None) == "dot" and R.format_for("g.txt", "mmd") == "mmd"
    with pytest.raises(R.RenderError, match="cannot tell the format"):
        R.format_for("g.txt")


# ---------------------------------------------------------------------------------------------
# CLI


def test_cli_render_formats(tmp_path, telecom):
    runner = CliRunner()
    for suffix in (".dot", ".mmd") + ((".svg", ".png") if HAS_DOT else ()):
        out = tmp_path / f"g{suffix}"
        res = runner.invoke(main, ["render", str(TELECOM), "-o", str(out)])
        assert res.exit_code == 0, res.output
        first = out.read_bytes()
        runner.invoke(main, ["render", str(TELECOM), "-o", str(out)])
        assert out.read_bytes() == first
    assert (tmp_path / "g.dot").read_text() == R.to_dot(telecom)
    res = runner.invoke(main, ["render", str(TELECOM), "--format", "mmd"])
    assert res.exit_code == 0 and "flowchart TB" in res.output
    res = runner.invoke(main, ["render", str(TELECOM), "--format", "png"])
    assert res.exit_code == 1 and "-o OUT.png" in res.output
    res = runner.invoke(main, ["render", str(TELECOM), "-o", str(tmp_path / "g.txt")])
    assert res.exit_code == 1 and "cannot tell the format" in res.output
    # `sop compile --format dot` uses the same renderer
    res = runner.invoke(main, ["compile", str(TELECOM), "--format", "dot"])
    assert res.output == R.to_dot(telecom, compile_graph(telecom))


def test_cli_render_heat(tmp_path):
    heat = tmp_path / "heat.json"
    heat.write_text('{"nodes": {"step1": 2}, "edges": [["step1", "step2", 2]]}')
    res = CliRunner().invoke(main, ["render", str(TELECOM), "--heat", str(heat)])
    assert res.exit_code == 0, res.output
    assert "uncovered" in res.output and "(2)" in res.output
    heat.write_text('{"edges": [["step1", "step2"]]}')
    res = CliRunner().invoke(main, ["render", str(TELECOM), "--heat", str(heat)])
    assert res.exit_code == 1 and "[from, to, count]" in res.output


def test_a_when_ladder_numbers_its_conditions_a_match_does_not() -> None:
    """In a `when` stage the first condition that holds decides, and the layout does not keep the order:
    each condition is drawn after its place (`2. Days > 30`); a `match` (exclusive values) is not numbered."""
    from sopgraph.language.render import to_dot

    sc = sopgraph.load(text='system Pending: bool "p"\nsystem Days: int[0..400] "d"\nfield R: A | B "r"\n'
                            'action X "x"\naction Y "y"\naction Z "z"\n'
                            'stage s { match R { A -> t\n B -> do Z } }\n'
                            'stage t { when Pending -> do X\n when Days > 30 -> do Y\n otherwise -> do Z }\n')
    dot = to_dot(sc)
    assert 'label="1. Pending"' in dot and 'label="2. Days > 30"' in dot
    assert 'label="A"' in dot and 'label="otherwise"' in dot and "3. otherwise" not in dot  # bare: a match value, otherwise
    assert "the order a stage checks its conditions in" in dot
    plain = to_dot(sopgraph.load(text='field R: A | B "r"\naction X "x"\naction Z "z"\n'
                                      'stage s { match R { A -> do X\n B -> do Z } }\n'))
    assert "the order a stage checks" not in plain


NO_SERVICE = ROOT / "examples" / "no_service.sop"


def _svg_node_y(svg: str, node: str) -> float:
    """The centre height of a node in Graphviz SVG (y grows downwards)."""
    group = re.search(rf'<g id="[^"]*" class="node[^"]*">\s*<title>{re.escape(node)}</title>(.*?)</g>', svg, re.S)
    assert group, node
    ys = [float(y) for y in re.findall(r"[\d.-]+,([\d.-]+)", group.group(1))] or \
        [float(y) for y in re.findall(r'cy="([\d.-]+)"', group.group(1))]
    return sum(ys) / len(ys)


def _svg_edges(svg: str) -> dict[str, str]:
    """Edge title (`u->v`, with `&#45;&gt;` read back) -> the edge group's SVG."""
    out = {}
    for m in re.finditer(r'<g id="[^"]*" class="edge[^"]*">\s*<title>(.*?)</title>(.*?)</g>\s*(?=<g|</g>|<!--)', svg, re.S):
        out[m.group(1).replace("&#45;", "-").replace("&gt;", ">")] = m.group(2)
    return out


def test_only_the_edge_that_closes_a_loop_is_drawn_as_a_loop() -> None:
    """no_service bounds its loop on the forward step (`fix -> retest up to 2 times`; `retest -> fix` closes
    it): that step was drawn as a dashed edge going up (retest above fix). Now the closing edge is the dashed
    one, drawn upwards from retest to fix, and the forward step is solid and goes down."""
    scenario = sopgraph.load(NO_SERVICE)
    g = compile_graph(scenario)
    assert R.back_edges(g) == {("retest", "fix")}
    dot = R.to_dot(scenario)
    forward = [attrs for _, attrs in drawn_edges(dot, "fix", "retest")]
    assert forward and all("dashed" not in a and "constraint" not in a for a in forward)
    assert "dashed" not in edge_attrs(dot, "fix", "fix -> retest")
    # the loop back is written v -> u with the arrow at v (dir=back), dashed, its label between the two
    assert 'dir="back"' in edge_attrs(dot, "fix", "retest -> fix") and "dashed" in edge_attrs(dot, "fix", "retest -> fix")
    assert 'dir="none"' in edge_attrs(dot, "retest -> fix", "retest")
    if R.dot_binary() is None:
        pytest.skip("graphviz `dot` not installed")
    svg = R.render(scenario, "svg").decode("utf-8")
    assert _svg_node_y(svg, "fix") < _svg_node_y(svg, "retest"), "the forward step goes down"
    edges = _svg_edges(svg)
    assert "stroke-dasharray" not in edges["fix->fix -> retest"] + edges["fix -> retest->retest"]
    assert "stroke-dasharray" in edges["fix->retest -> fix"]


def test_a_self_loop_and_a_plain_graph_have_the_loops_they_have() -> None:
    g = compile_graph(sopgraph.load(ROOT / "tests" / "data" / "lost_card_lists.sop"))
    assert R.back_edges(g) == {("verify", "verify")}
    assert R.back_edges(compile_graph(sopgraph.load(ROOT / "examples" / "claim_intake.sop"))) == {("remind", "photos")}
    assert R.back_edges(compile_graph(sopgraph.load(TELECOM))) == set()


def test_a_title_that_names_the_stage_is_not_repeated() -> None:
    """`stage approval "Supervisor approval"` rendered as "approval / Supervisor / approval"."""
    scenario = sopgraph.load(text='field Amount: int "a"\naction Approve "a"\naction Refuse "r"\n'
                                  'stage approval "Supervisor approval" { when Amount > 100 -> do Refuse\n'
                                  '  otherwise -> late_fee }\n'
                                  'stage late_fee "Late fee waiver" { when Amount > 5 -> do Refuse\n otherwise -> do Approve }\n'
                                  'stage other "Something else" { -> do Approve }\n')
    dot = R.to_dot(scenario)
    assert 'label="Supervisor\\napproval"' in node_attrs(dot, "approval")
    assert 'label="Late fee waiver"' in node_attrs(dot, "late_fee")
    assert R.title_names_id("late_fee", "Late fee waiver") and not R.title_names_id("fee", "Feedback")
    assert not R.title_names_id("approval", "Disapproval") and R.title_names_id("s1", "S1: check")
    assert '  s_approval{"Supervisor<br/>approval"}' in R.to_mermaid(scenario).splitlines()  # the same in Mermaid
