"""The compiler: graph shape, node kinds, edge guards, determinism of every output format."""

from __future__ import annotations

import json
from pathlib import Path

import networkx as nx
import pytest

import sopgraph
from sopgraph.language.compile import (
    END,
    START,
    action_node,
    compile_graph,
    graph_to_graphml,
    graph_to_json,
    topology,
)
from sopgraph.language.parse import load_source

SCENARIOS = sorted((Path(__file__).parent.parent / "scenarios").glob("*.sop"))


@pytest.fixture(scope="module")
def telecom():
    return sopgraph.load(Path(__file__).parent.parent / "scenarios" / "telecom_package.sop")


def test_node_kinds_and_structure(telecom):
    g = compile_graph(telecom)
    kinds = nx.get_node_attributes(g, "kind")
    assert kinds[START] == "start" and kinds[END] == "end"
    assert {kinds[s] for s in telecom.stages} == {"decision"}
    assert {kinds[action_node(a)] for a in telecom.actions} == {"action"}
    assert list(g.successors(START)) == [telecom.start]
    # every action reached by a leaf flows to end; stage text and titles travel on the nodes
    for action in telecom.actions:
        assert list(g.successors(action_node(action))) == [END]
    assert g.nodes["step5"]["text"]
    assert nx.is_directed_acyclic_graph(g)


def test_edges_carry_guards(telecom):
    g = compile_graph(telecom)
    edge = g.edges["step2", "step3"]
    assert edge["label"] == "Enquiry"
    assert edge["branches"][0]["index"] == 0
    # two branches into one target share one edge with both labels
    labels = {(u, v): d["label"] for u, v, d in g.edges(data=True)}
    assert any(" | " in lab or lab for lab in labels.values())


def test_outputs_deterministic(telecom):
    g1, g2 = compile_graph(telecom), compile_graph(sopgraph.load(
        Path(__file__).parent.parent / "scenarios" / "telecom_package.sop"))
    assert graph_to_json(g1) == graph_to_json(g2)
    assert graph_to_graphml(g1) == graph_to_graphml(g2)
    data = json.loads(graph_to_json(g1))
    assert data["graph"]["name"] == "telecom_package"
    assert [n["id"] for n in data["nodes"]][0] == START


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_every_scenario_compiles_to_a_graph_reaching_end(path):
    """Stages are reachable and can finish. (Airline reuses step4/step8 in two routes, so its stage graph has
    a cycle that no values can follow; the checker and the path enumerator reason about that, not the graph.)"""
    scenario = sopgraph.load(path)
    g = compile_graph(scenario)
    for stage in scenario.stages:
        assert nx.has_path(g, START, stage)
        assert nx.has_path(g, stage, END)


EXAMPLES = sorted((Path(__file__).parent.parent / "examples").rglob("*.sop"))


@pytest.mark.parametrize("path", SCENARIOS + EXAMPLES, ids=lambda p: p.stem)
def test_topology_has_the_graphs_nodes_and_edges_in_order(path):
    """The checker walks `topology` instead of the labelled graph: same nodes, same edges, same order
    (the order decides which cycle or unreachable stage is reported first)."""
    loaded = load_source(path)
    if loaded.scenario is None:
        pytest.skip("does not load")
    g, t = compile_graph(loaded.scenario), topology(loaded.scenario)
    assert list(t.nodes) == list(g.nodes)
    assert t.edges() == list(g.edges)
    assert {n: list(t.succ[n]) for n in t.nodes} == {n: list(g.succ[n]) for n in g.nodes}
    assert {n: list(t.pred[n]) for n in t.nodes} == {n: list(g.pred[n]) for n in g.nodes}
    assert all(n in t for n in g.nodes) and "nowhere" not in t and len(t) == len(g) and list(t) == list(g)
    assert all(t.has_edge(u, v) for u, v in g.edges) and not t.has_edge("nowhere", "end")
    sc = loaded.scenario  # what the walk records for the checker
    assert t.procedural == sc.procedural
    assert t.calls == any(b.target.steps or b.target.args for st in sc.stages.values() for b in st.branches)
    assert t.exits == {sid for sid, st in sc.stages.items() for b in st.branches
                       if b.target.kind == "action" or b.target.stage not in sc.stages}


def test_graphml_roundtrips_through_networkx(telecom, tmp_path):
    out = tmp_path / "g.graphml"
    out.write_text(graph_to_graphml(compile_graph(telecom)))
    back = nx.read_graphml(out)
    assert set(back.nodes) == set(compile_graph(telecom).nodes)


def test_subflows_and_includes_are_inlined(tmp_path):
    (tmp_path / "common.sop").write_text(
        'field Verified: bool "identity verified"\n'
        'action Escalate "hand over" [escalation]\n'
        "subflow identity(ok, fail) {\n"
        '  stage check "Check identity" { when Verified -> ok otherwise -> fail }\n'
        "}\n"
    )
    (tmp_path / "main.sop").write_text(
        'include "common.sop"\n'
        'scenario demo "Demo"\n'
        'action Done "done" [ends_dialogue]\n'
        'stage s1 "Start" { -> kyc }\n'
        "use identity as kyc(ok -> s2, fail -> do Escalate)\n"
        'stage s2 "Finish" { -> do Done }\n'
    )
    scenario = sopgraph.load(tmp_path / "main.sop")
    assert list(scenario.stages) == ["s1", "s2", "kyc.check"]
    g = compile_graph(scenario)
    assert g.has_edge("s1", "kyc.check") and g.has_edge("kyc.check", "s2")
    assert g.has_edge("kyc.check", action_node("Escalate"))
    assert sopgraph.decide(scenario, {"Verified": True}).path == ["s1", "kyc.check", "s2"]
    assert sopgraph.decide(scenario, {"Verified": False}).finals == {"Action": "Escalate"}
